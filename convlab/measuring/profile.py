"""Profile cards: Nsight Compute's metrics for one call, on a GPU; the same memory counters from the
emulator, for a machine without one.

    card = cl.profile(conv, x, w, y, 2, 3, 8, 32, 32, 5, grid=g, block=b)   # a kernel and its arguments
    card = cl.profile(cl.ops.naive.conv2d_naive_z, x, w, name="ch2_naive_z") # a launcher call
    card = cl.profile_torch(torch.nn.functional.conv2d, x, w, name="ch2_torch")

On a GPU the call runs again in a subprocess under `ncu --clock-control none` (the GPU's clocks are
never changed): once to warm up (compile, load), then once between cudaProfilerStart/Stop, so only
the kernels of that one call are profiled. The card lists each kernel with ncu's metric names, so
every number can be looked up in Nsight Compute's metrics reference. With name=..., the CSV that ncu
wrote is kept in book/data/profiles/NAME.csv; where ncu is missing or may not read the counters,
one line says so and the card shows that committed result instead.

On the emulator, cl.profile runs the call in this process and counts every warp's global and
shared-memory requests, 32-byte sectors, bank conflicts (wavefronts), atomics and barriers under
the same metric names; timing, throughput and occupancy are the GPU's alone. A request is one
access in the source executed by a warp's lanes in one iteration of its loops (convlab/gpu/emu/profile.cpp). With name=..., ncu's
committed numbers stand beside the emulator's. The shared-memory instruction rows count, on the
emulator, each warp that makes the access with at least one lane; ncu counts every warp that
issues the instruction, and where nvcc turns a short `if` into a predicated instruction
(`@!P0 STS`), warps whose lanes are all predicated off issue it too (with no wavefront).
"""
from __future__ import annotations

import datetime as _dt
from pathlib import Path

from ..gpu import runtime
from ..gpu._errors import ProfileUnavailable
from ..gpu._paths import path as workbook_path
from . import ncu
from .cards import NCU_METRICS, ROWS, TORCH_METRICS, ProfileCard
from .emu_counters import emu_profiling

__all__ = ["profile", "profile_torch", "committed", "PROFILES_DIR", "PRECISION_FP32", "PRECISION_FP16", "PRECISION_INT",
           "call_precision", "stored_precision"]

PROFILES_DIR = "book/data/profiles"


def _profiles_dir() -> Path:
    return workbook_path(PROFILES_DIR)


# What a card's call ran in, written as a "# precision: ..." line of its stored CSV. The worker
# turns TF32 off, so fp32 inputs run in strict fp32 (TF32 never touches our own kernels' FFMAs).
PRECISION_FP32 = "fp32 strict (TF32 off)"


PRECISION_FP16 = "fp16"


PRECISION_INT = "integers only (no floating point)"


_PRECISION_TAG = "# precision:"


def call_precision(args, kwargs) -> str:
    """The precision a call runs in, from its floating-point tensors: fp16 when any is half."""
    import torch
    dtypes = {v.dtype for v in [*args, *kwargs.values()] if isinstance(v, torch.Tensor) and v.is_floating_point()}
    if not dtypes:
        return PRECISION_INT
    return PRECISION_FP16 if dtypes & {torch.float16, torch.bfloat16} else PRECISION_FP32


def stored_precision(text: str) -> str:
    """The precision a stored card's "# precision: ..." line names, or "" when it names none."""
    for ln in text.splitlines():
        if not ln.startswith("#"):
            break
        if ln.startswith(_PRECISION_TAG):
            return ln[len(_PRECISION_TAG):].strip()
    return ""


def committed(name: str) -> "ProfileCard | None":
    """The card a GPU run stored as book/data/profiles/NAME.csv, or None when there is none."""
    p = _profiles_dir() / f"{name}.csv"
    if not p.exists():
        return None
    text = p.read_text()
    first = text.splitlines()[0] if text else ""
    source = first[1:].strip() if first.startswith("#") else f"ncu, committed in {PROFILES_DIR}/{name}.csv"
    return ProfileCard(ncu.parse_ncu_csv(text), source, precision=stored_precision(text))


def _store(name: str, csv_text: str, what: str, precision: str) -> str:
    d = _profiles_dir()
    d.mkdir(parents=True, exist_ok=True)
    day = _dt.date.today().isoformat()
    source = f"ncu on {ncu.device_name()}, {day}: {what}"
    body = "\n".join(ln for ln in csv_text.splitlines() if ln.startswith('"'))
    (d / f"{name}.csv").write_text(f"# {source}\n{_PRECISION_TAG} {precision}\n{body}\n")
    return source


def _describe(fn, args) -> str:
    if isinstance(fn, runtime.Kernel):
        return f"{fn.module.path.name}:{fn.name}"
    name = getattr(fn, "name", None) or getattr(fn, "__qualname__", None) or repr(fn)
    shapes = ", ".join("x".join(str(s) for s in a.shape) for a in args if hasattr(a, "shape"))
    return f"{name}({shapes})"


def _fallback(name, why: str) -> ProfileCard:
    card = committed(name) if name else None
    if card is None:
        where = (f"no committed result {PROFILES_DIR}/{name}.csv either" if name else
                 "pass name=... to fall back to a result a GPU run committed")
        raise ProfileUnavailable(f"no profile here: {why}; {where}.")
    print(f"cl.profile: {why}; showing the committed result ({card.source}).")
    return card


def profile(fn, *args, name: str | None = None, metrics=None, **kwargs) -> ProfileCard:
    """Profile one call: fn(*args, **kwargs), where fn is a Kernel (its launch keywords grid=,
    block=, shared= among kwargs) or a launcher. On a GPU: ncu's metrics for every kernel the call
    launches, measured in a subprocess (the tensors here are left as they are), stored as
    book/data/profiles/NAME.csv when name is given. On the emulator: the call runs here and its
    memory counters are taken, with ncu's committed numbers beside them when name is given."""
    if runtime.backend() == "emu":
        # counting makes a launch several times slower: give it ten times the usual time limit
        limit = runtime.default_timeout()
        runtime.set_timeout(10 * limit)
        try:
            with emu_profiling() as launches:
                fn(*args, **kwargs)
        finally:
            runtime.set_timeout(limit)
        ref = committed(name) if name else None
        return ProfileCard(launches, "emulator counters (memory requests, sectors, bank conflicts; no timing)",
                           reference=ref)
    csv_text, why = ncu.run_ncu(ncu.job(fn, args, kwargs), metrics or NCU_METRICS)
    if why:
        return _fallback(name, why)
    what, precision = _describe(fn, args), call_precision(args, kwargs)
    source = _store(name, csv_text, what, precision) if name else f"ncu on {ncu.device_name()}: {what}"
    return ProfileCard(ncu.parse_ncu_csv(csv_text), source, precision=precision)


def profile_torch(fn, *args, name: str | None = None, **kwargs) -> ProfileCard:
    """torch's own call under ncu, e.g. profile_torch(torch.nn.functional.conv2d, x, w, padding=1):
    which cuDNN or cuBLAS kernels ran, how long each took and how busy it kept the GPU. Without a
    GPU, the result a GPU run committed under name."""
    if runtime.backend() == "emu":
        return _fallback(name, "no GPU here, so torch runs its CPU code and has no cuDNN kernels to profile")
    csv_text, why = ncu.run_ncu(ncu.job(fn, args, kwargs), TORCH_METRICS)
    if why:
        return _fallback(name, why)
    what, precision = _describe(fn, args), call_precision(args, kwargs)
    source = _store(name, csv_text, what, precision) if name else f"ncu on {ncu.device_name()}: {what}"
    return ProfileCard(ncu.parse_ncu_csv(csv_text), source, rows=[r for r in ROWS if r[1] in TORCH_METRICS], precision=precision)
