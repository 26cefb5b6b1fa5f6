"""What our kernels are compared with: torch's own convolution, at its defaults and tuned.

- "torch default": torch.nn.functional.conv2d as shipped (cuDNN picks an algorithm by heuristics);
- "torch tuned": the same with torch.backends.cudnn.benchmark = True (cuDNN times its algorithms
  on the first call of each shape and keeps the fastest; the warm-up of cl.bench absorbs that).
Both in strict fp32: TF32 off for cuDNN and for matmul, so every contender does the same arithmetic.

Also a plain wall-clock timer for chapter 1, whose contenders run on the CPU.
"""
from __future__ import annotations

import contextlib
import os
import platform
import time
from dataclasses import dataclass, field

IMPL_TORCH_DEFAULT = "torch default"
IMPL_TORCH_TUNED = "torch tuned"


@contextlib.contextmanager
def strict_fp32():
    """TF32 off for cuDNN convolutions and for matmul inside the block; the old settings after."""
    import torch

    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    saved = (cudnn.allow_tf32, matmul.allow_tf32)
    try:
        cudnn.allow_tf32 = False
        matmul.allow_tf32 = False
        yield
    finally:
        cudnn.allow_tf32, matmul.allow_tf32 = saved


@contextlib.contextmanager
def cudnn_benchmark(on: bool):
    import torch

    saved = torch.backends.cudnn.benchmark
    try:
        torch.backends.cudnn.benchmark = on
        yield
    finally:
        torch.backends.cudnn.benchmark = saved


def tf32_setting() -> str:
    """How the timings here were taken: always strict fp32 (the figure says so)."""
    return "TF32 off"


def versions() -> dict:
    """torch and cuDNN versions, as written on figures and in book/data."""
    import torch

    cudnn = "n/a"
    if torch.backends.cudnn.is_available():
        v = torch.backends.cudnn.version()  # e.g. 91900 for 9.19.0
        if v:
            cudnn = f"{v // 10000}.{v % 10000 // 100}.{v % 100}"
    return {"torch": torch.__version__, "cudnn": cudnn}


def torch_conv(x, w, stride: int = 1, pad: int = 0):
    """A zero-argument callable running torch's convolution on x, w (2D or 3D by w's rank)."""
    import torch.nn.functional as F

    conv = F.conv2d if w.dim() == 4 else F.conv3d
    return lambda: conv(x, w, stride=stride, padding=pad)


def time_torch(x, w, stride: int = 1, pad: int = 0, *, tuned: bool, reps: int = 20, warmup: int = 3):
    """cl.bench of torch's convolution, strict fp32, with cudnn.benchmark off (default) or on (tuned)."""
    import convlab as cl

    fn = torch_conv(x, w, stride, pad)
    with strict_fp32(), cudnn_benchmark(tuned):
        return cl.bench(fn, reps=reps, warmup=warmup)


# ---- chapter 1: timings on the CPU ------------------------------------------------------------

@dataclass
class CpuTiming:
    """Wall-clock timing of a CPU function (the fields results.row reads, like cl.bench's Timing)."""

    ms: float
    p25: float
    p75: float
    min: float
    max: float
    samples: list = field(default_factory=list)
    label: str = ""
    is_gpu: bool = False

    def __str__(self) -> str:
        return f"{self.ms:.3f} ms (p25 {self.p25:.3f}, p75 {self.p75:.3f}, n={len(self.samples)}) {self.label}"


def cpu_name() -> str:
    """The CPU model, e.g. 'AMD EPYC 9654 96-Core Processor', for the figure's label."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def cpu_label() -> str:
    import torch

    return f"CPU: {cpu_name()} ({os.cpu_count()} cores visible, torch uses {torch.get_num_threads()} threads)"


def time_cpu(fn, reps: int = 5, warmup: int = 1, settle_s: float = 0.3) -> CpuTiming:
    """Median wall time of fn() over reps calls after warmup calls; quartiles as the spread.

    It first waits settle_s: the BLAS threads of whatever ran before (numpy's OpenBLAS) keep
    spinning for a while after their last call and would steal the cores from torch's threads
    (seen here: torch 20x slower right after numpy on 2 cores)."""
    from .bench import spread, wall_clock_ms

    time.sleep(settle_s)
    samples = wall_clock_ms(fn, reps, warmup)
    median, p25, p75 = spread(samples)
    return CpuTiming(ms=median, p25=p25, p75=p75, min=min(samples), max=max(samples), samples=samples,
                     label="CPU wall time")
