"""What our kernels are compared with: torch at its best on each layer.

"torch best" is the faster of two configurations, each timed in a fresh process of its own
(convlab.measuring.torch_baseline): cudnn.benchmark on from the first call (cuDNN times its algorithms and
keeps the fastest), TF32 off (strict fp32, the arithmetic our kernels do), and the tensors in NCHW
or in channels_last. Both stay in the data as rows, with the kernels torch ran named. The rows of
one GPU run are kept in book/data/torch.csv, so every chapter compares with the same numbers.

Also a plain wall-clock timer for chapter 1, whose contenders run on the CPU.
"""
from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass, field

from ..gpu._paths import repo_root
from . import results
from .bench import spread, strict_fp32, wall_clock_ms  # noqa: F401 - strict_fp32: the chapters' baselines.strict_fp32
from .results import versions      # chapter 8 also reads it as baselines.versions

TORCH_BEST = "torch best"
LAYOUTS = {"nchw": "torch (NCHW)", "channels_last": "torch (channels_last)"}
TORCH_CACHE = "torch"       # book/data/torch.csv
SPEC_FIELDS = ("B", "C", "M", "H", "W", "K", "stride", "padding", "D", "Kw", "stride_w", "padding_w", "dilation",
               "dilation_w", "groups")


def _spec(wl, op: str, dtype: str, layout: str, reps: int) -> dict:
    shape = {k: getattr(wl, k) for k in SPEC_FIELDS}
    return {"op": op, "dtype": dtype, "layout": layout, "shape": shape, "reps": reps}


def measure_torch(wl, op: str = "conv2d", dtype: str = "fp32", layout: str = "nchw", reps: int = 20) -> list:
    """Time torch on one layer in a fresh process (python -m convlab.measuring.torch_baseline): a list of
    {"pass", "ms", "p25", "p75", "caller_ms", "wall_ms", "kernels"}, one per pass."""
    import json
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(repo_root()), os.environ.get("PYTHONPATH", "")]))
    spec = json.dumps(_spec(wl, op, dtype, layout, reps))
    done = subprocess.run([sys.executable, "-m", "convlab.measuring.torch_baseline", spec], capture_output=True, text=True,
                          env=env, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"timing torch on {wl.name} ({op}, {dtype}, {layout}) failed:\n{done.stderr[-2000:]}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def torch_op(wl, pass_: str) -> str:
    """Which torch_baseline op gives a pass: forward of a 2D or 3D layer, or a training step."""
    if pass_ == "forward":
        return "conv2d" if wl.D is None else "conv3d"
    return "conv2d_train"


def torch_rows(wl, pass_: str = "forward", dtype: str = "fp32", *, roof=None, refresh: bool = False) -> list:
    """Result rows for torch on one layer and pass: one per layout, then "torch best", the faster.
    Read from book/data/torch.csv when this GPU and torch version measured them there; otherwise
    measured now (a fresh process per layout) and added to it."""
    mine = _cached_or_measured(wl, pass_, dtype, LAYOUTS, torch_op(wl, pass_), roof, refresh)
    return mine + [best_of(mine)]


def _cached_or_measured(wl, pass_, dtype, layouts: dict, op: str, roof, refresh) -> list:
    """The rows of layouts (layout -> impl name) for one layer, pass and dtype: from the cache, or
    measured by `op` and added to it."""
    import pandas as pd

    meta = {"gpu": results.device_label(), **versions()}
    cached = results.load(TORCH_CACHE)
    if cached is not None and not refresh:
        hit = cached[(cached["workload"] == wl.name) & (cached["shape"] == wl.shape_text)
                     & (cached["pass"] == pass_) & (cached["dtype"] == dtype) & (cached["kind"] == "torch")
                     & cached["impl"].isin(list(layouts.values()))]
        for k, v in meta.items():
            hit = hit[hit[k].astype(str) == str(v)]
        if len(hit) == len(layouts):
            return hit.to_dict("records")
    rows = []
    for layout, impl in layouts.items():
        for m in measure_torch(wl, op, dtype, layout):
            r = results.row(wl, impl, results.Measured(m["ms"], m["p25"], m["p75"], m["caller_ms"], m["wall_ms"]),
                            kind="torch", pass_=m["pass"], dtype=dtype, layout=layout, roof=roof,
                            torch_kernels=" | ".join(m["kernels"]))
            rows.append(r)
    if results.may_save():
        keep = cached if cached is not None else results.frame([])
        fresh = results.frame(rows)
        new_keys = set(zip(fresh["workload"], fresh["pass"], fresh["dtype"], fresh["impl"]))
        keep = keep[[k not in new_keys for k in zip(keep["workload"], keep["pass"], keep["dtype"], keep["impl"])]]
        results.save(pd.concat([keep, fresh], ignore_index=True), TORCH_CACHE, quiet=True)
    return [r for r in rows if r["pass"] == pass_]


def best_of(rows: list) -> dict:
    """The "torch best" row: the fastest torch configuration by GPU time, under its own name."""
    best = dict(min(rows, key=lambda r: r["ms"]))
    best["kind"], best["impl"], best["key"] = "torch best", TORCH_BEST, results.key_of(TORCH_BEST)
    return best



# The algorithm a cuDNN/cuBLAS kernel's name shows, most telling first: an FFT row also runs a
# (complex) GEMM, a Winograd row a GEMM of the transformed tiles. wgrad_alg0 is cuDNN's
# CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0: sums of matrix products without forming the matrix, added
# with atomics (its manual).
_ALGORITHMS = (("fft", "FFT"), ("winograd", "Winograd"), ("implicit_gemm", "implicit GEMM"),
               ("wgrad_alg0", "implicit GEMM, atomics (wgrad_alg0)"), ("direct", "direct"))


def kernel_base_name(kernel: str) -> str:
    """A kernel's name as a profiler prints it, without 'void', template arguments and parameters,
    namespaces kept (`cudnn::winograd_nonfused::winogradWgradData4x4`). An anonymous namespace goes
    first: its '(' is not the parameter list's."""
    name = kernel.strip().removeprefix("void ").replace("(anonymous namespace)::", "")
    return name.split("<")[0].split("(")[0].strip()


def kernel_short_name(kernel: str) -> str:
    """kernel_base_name, with cuDNN's long xmma names cut after 'implicit_gemm'
    (sm80_xmma_fprop_implicit_gemm)."""
    name = kernel_base_name(kernel)
    cut = name.find("implicit_gemm")
    return name[:cut + len("implicit_gemm")] if cut >= 0 else name


def torch_algorithm(torch_kernels: str) -> tuple[str, str]:
    """(algorithm, kernel) for a torch row's `torch_kernels` (its kernels' names joined by ' | '):
    the first of FFT, Winograd, implicit GEMM, direct whose mark a kernel's name carries, and that
    kernel's short name; ('other', first kernel) when none does, ('', '') for no kernels (or NaN). FFT and
    Winograd do fewer multiply-adds than a direct convolution, so the direct count's roofline floor
    does not bound them."""
    text = torch_kernels if isinstance(torch_kernels, str) else ""      # a CSV's empty cell reads as NaN
    names = [kernel_short_name(k) for k in text.split(" | ") if k.strip()]
    for mark, algorithm in _ALGORITHMS:
        for name in names:
            if mark in name.lower():
                return algorithm, name
    return ("other", names[0]) if names else ("", "")

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
    time.sleep(settle_s)
    samples = wall_clock_ms(fn, reps, warmup)
    median, p25, p75 = spread(samples)
    return CpuTiming(ms=median, p25=p25, p75=p75, min=min(samples), max=max(samples), samples=samples,
                     label="CPU wall time")
