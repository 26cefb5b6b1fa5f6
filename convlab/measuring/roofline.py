"""The roofline floor: the least time a kernel can take on a GPU, from its FLOPs and bytes.

On a GPU we measure two rates once (and cache them per GPU and torch version):
- memory: device-to-device copy bandwidth, counting the bytes read and the bytes written;
- compute: fp32 GEMM rate, torch.matmul with TF32 off (what cuDNN could reach in strict fp32);
  for fp16 rows the fp16 GEMM rate, torch.matmul in half on the tensor cores (measure_fp16).
floor_ms = max(bytes / bandwidth, flops / rate). It is a floor, not a prediction: a kernel at
100% of it moves the least data at the copy rate, or does the FLOPs at the GEMM rate.

Without a GPU (the emulator) the napkin math uses REFERENCE_H200 (REFERENCE_H200_FP16 for fp16),
the rates measured once for the course's reference H200 (torch 2.11), labelled as such.
"""
from __future__ import annotations

import datetime as _dt
import json
from dataclasses import asdict, dataclass

from ..gpu._paths import repo_root
from ..gpu.runtime import device
from .bench import bench, strict_fp32


@dataclass(frozen=True)
class Roofline:
    gpu: str
    bandwidth: float  # bytes/s, device-to-device copy, read + write counted
    flop_rate: float  # fp32 FLOP/s, GEMM with TF32 off
    source: str = ""

    def floor_ms(self, flops: float, nbytes: float) -> float:
        return 1e3 * max(nbytes / self.bandwidth, flops / self.flop_rate)

    def bound(self, flops: float, nbytes: float) -> str:
        """'memory' or 'compute': which of the two limits sets the floor."""
        return "memory" if nbytes / self.bandwidth >= flops / self.flop_rate else "compute"

    @property
    def ridge(self) -> float:
        """FLOPs per byte where the two limits meet: below it a kernel is memory-bound."""
        return self.flop_rate / self.bandwidth

    def __str__(self) -> str:
        return (f"{self.gpu}: copy {self.bandwidth / 1e12:.2f} TB/s, fp32 GEMM "
                f"{self.flop_rate / 1e12:.1f} TFLOP/s ({self.source})")


REFERENCE_H200 = Roofline(
    gpu="NVIDIA H200",
    bandwidth=4.19e12,
    flop_rate=51e12,
    source="reference: measured once on an H200, torch 2.11, strict fp32",
)

# fp16 rows: half bytes at the same copy bandwidth, FLOPs at the fp16 tensor-core rate (torch.matmul
# on half 8192x8192 matrices, cuBLAS), the rate chapter 6 measured on the reference H200
# (book/data/06_fp16.csv, column fp16_tc_tflops: 770 TFLOP/s; NVIDIA's H200 datasheet gives 989
# TFLOP/s dense fp16 with fp32 accumulation).
REFERENCE_H200_FP16 = Roofline(
    gpu="NVIDIA H200",
    bandwidth=REFERENCE_H200.bandwidth,
    flop_rate=770e12,
    source="reference fp16: measured once on an H200, torch 2.11, torch.matmul in half (tensor cores)",
)

_measured: Roofline | None = None
_measured_fp16: Roofline | None = None


def _cache_file():
    return repo_root() / ".convlab-cache" / "roofline.json"


def measure(force: bool = False, copy_mib: int = 1024, gemm_n: int = 8192) -> Roofline:
    """Measure this GPU's copy bandwidth and fp32 GEMM rate (a few seconds, once; then cached)."""
    global _measured
    import torch

    dev = device()
    if dev.backend != "cuda":
        raise RuntimeError("roofline.measure() needs the GPU backend; use REFERENCE_H200 for napkin math")
    key = f"{dev.name} | torch {torch.__version__}"
    if _measured is not None and not force:
        return _measured
    cache = _cache_file()
    if cache.is_file() and not force:
        try:
            saved = json.loads(cache.read_text())
            if key in saved:
                _measured = Roofline(**saved[key])
                return _measured
        except (ValueError, TypeError):
            pass  # a broken cache is measured again

    n = copy_mib * 2**20 // 4
    src = torch.empty(n, dtype=torch.float32, device="cuda").normal_()
    dst = torch.empty_like(src)
    copy = bench(lambda: dst.copy_(src), reps=10, warmup=2)
    bandwidth = 2 * src.numel() * 4 / (copy.ms * 1e-3)
    del src, dst

    a = torch.randn(gemm_n, gemm_n, device="cuda")
    b = torch.randn(gemm_n, gemm_n, device="cuda")
    c = torch.empty_like(a)
    with strict_fp32():
        gemm = bench(lambda: torch.matmul(a, b, out=c), reps=10, warmup=2)
    flop_rate = 2 * gemm_n**3 / (gemm.ms * 1e-3)
    del a, b, c
    torch.cuda.empty_cache()

    _measured = Roofline(dev.name, bandwidth, flop_rate,
                         source=f"measured on this GPU {_dt.date.today().isoformat()}, torch {torch.__version__}")
    try:
        cache.parent.mkdir(exist_ok=True)
        saved = json.loads(cache.read_text()) if cache.is_file() else {}
        saved[key] = asdict(_measured)
        cache.write_text(json.dumps(saved, indent=1))
    except (OSError, ValueError):
        pass  # caching is a convenience only
    return _measured


def measure_fp16(gemm_n: int = 8192) -> Roofline:
    """This GPU's fp16 roofline: measure()'s copy bandwidth and the fp16 tensor-core rate,
    torch.matmul on half gemm_n x gemm_n matrices (cuBLAS); measured once per process."""
    global _measured_fp16
    import dataclasses

    import torch

    if _measured_fp16 is None:
        base = measure()
        a = torch.randn(gemm_n, gemm_n, device="cuda", dtype=torch.float16)
        b = torch.randn(gemm_n, gemm_n, device="cuda", dtype=torch.float16)
        c = torch.empty_like(a)
        gemm = bench(lambda: torch.matmul(a, b, out=c), reps=10, warmup=2)
        del a, b, c
        torch.cuda.empty_cache()
        _measured_fp16 = dataclasses.replace(base, flop_rate=2 * gemm_n**3 / (gemm.ms * 1e-3),
                                             source=f"{base.source}; fp16: torch.matmul in half, tensor cores")
    return _measured_fp16


def current(dtype: str = "fp32") -> Roofline:
    """This GPU's measured roofline on the GPU backend, the H200 reference on the emulator; for
    dtype "fp16" the fp16 one (FLOPs at the tensor-core rate)."""
    if dtype not in ("fp32", "fp16"):
        raise ValueError(f"no roofline for dtype {dtype!r}: fp32 or fp16")
    if device().backend != "cuda":
        return REFERENCE_H200_FP16 if dtype == "fp16" else REFERENCE_H200
    return measure_fp16() if dtype == "fp16" else measure()


def floor_ms(flops: float, nbytes: float, roof: Roofline | None = None) -> float:
    return (roof or current()).floor_ms(flops, nbytes)
