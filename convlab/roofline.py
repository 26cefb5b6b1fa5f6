"""The roofline floor: the least time a kernel can take on a GPU, from its FLOPs and bytes.

On a GPU we measure two rates once (and cache them per GPU and torch version):
- memory: device-to-device copy bandwidth, counting the bytes read and the bytes written;
- compute: fp32 GEMM rate, torch.matmul with TF32 off (what cuDNN could reach in strict fp32).
floor_ms = max(bytes / bandwidth, flops / rate). It is a floor, not a prediction: a kernel at
100% of it moves the least data at the copy rate, or does the FLOPs at the GEMM rate.

Without a GPU (the emulator) the napkin math uses REFERENCE_H200, the rates measured once for
the course's reference H200 (torch 2.11), labelled as such.
"""
from __future__ import annotations

import datetime as _dt
import json
from dataclasses import asdict, dataclass

from . import book


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

_measured: Roofline | None = None


def _cache_file():
    return book.repo_root() / ".convlab-cache" / "roofline.json"


def measure(force: bool = False, copy_mib: int = 1024, gemm_n: int = 8192) -> Roofline:
    """Measure this GPU's copy bandwidth and fp32 GEMM rate (a few seconds, once; then cached)."""
    global _measured
    import torch

    import convlab as cl
    from .baselines import strict_fp32

    dev = cl.device()
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
    copy = cl.bench(lambda: dst.copy_(src), reps=10, warmup=2)
    bandwidth = 2 * src.numel() * 4 / (copy.ms * 1e-3)
    del src, dst

    a = torch.randn(gemm_n, gemm_n, device="cuda")
    b = torch.randn(gemm_n, gemm_n, device="cuda")
    c = torch.empty_like(a)
    with strict_fp32():
        gemm = cl.bench(lambda: torch.matmul(a, b, out=c), reps=10, warmup=2)
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


def current() -> Roofline:
    """This GPU's measured roofline on the GPU backend; the H200 reference on the emulator."""
    import convlab as cl

    return measure() if cl.device().backend == "cuda" else REFERENCE_H200


def floor_ms(flops: float, nbytes: float, roof: Roofline | None = None) -> float:
    return (roof or current()).floor_ms(flops, nbytes)
