"""The evidence behind the chapters' claims about what limits a kernel: profile cards and SASS that a
GPU run takes and commits, shown from the committed files everywhere else.

    card = evidence.card("ch5_regtile_fa17", REGTILE, x, w)        # cl.profile on a GPU, else committed
    evidence.value(card, "regtile", "launch__registers_per_thread")  # one number, None without a card
    s = evidence.sass("ch5_coarse_lenet_c3", fused.DIRECT_COARSE_FILE, defines)
    evidence.mask_reads(s.function())                                # how __constant__ data reaches FFMA

A chapter's cell calls these unconditionally: on a GPU with ncu the card is measured and stored in
book/data/profiles/NAME.csv; elsewhere the committed card is shown, and where none is committed
yet, one line says so and the functions return None (the prose then shows a dash).
"""
from __future__ import annotations

import importlib

from . import runtime
from .bench import strict_fp32
from .profile import card_value

# the modules (cl.profile and cl.sass are the functions of the same names)
_P = importlib.import_module("convlab.profile")
_S = importlib.import_module("convlab.sass")


def _on_gpu() -> bool:
    return runtime.backend() == "cuda"


def _missing(kind: str, name: str, where: str) -> None:
    print(f"no committed {kind} {where}/{name} yet: a GPU run of this notebook measures and stores it")


def card(name: str, fn, *args, **kwargs):
    """cl.profile(fn, *args, name=name, **kwargs) on a GPU (a KernelProfile per kernel the call
    launches); elsewhere the card a GPU run committed under name, or None."""
    if _on_gpu():
        return _measured(_P.profile, fn, *args, name=name, **kwargs)
    return _committed(name)


def torch_strict(fn, *args, **kwargs):
    """fn(*args, **kwargs) as the book times torch: strict fp32 (TF32 off), cudnn.benchmark on."""
    with strict_fp32(benchmark=True):
        return fn(*args, **kwargs)


def torch_card(name: str, fn, *args, **kwargs):
    """cl.profile_torch of torch_strict(fn, ...) on a GPU: the cuDNN/cuBLAS kernels torch's call ran
    (after a warm-up call that lets cudnn.benchmark choose); elsewhere the committed card, or None."""
    if _on_gpu():
        return _measured(_P.profile_torch, torch_strict, fn, *args, name=name, **kwargs)
    return _committed(name, torch=True)


def _measured(how, *args, **kwargs):
    # where ncu is missing or refused, cl.profile falls back to the committed card; before the
    # first one is committed that is an error, which here is one line and no card
    try:
        return how(*args, **kwargs)
    except _P.ProfileUnavailable as e:
        print(e)
        return None


def _committed(name: str, torch: bool = False):
    c = _P.committed(name)
    if c is None:
        _missing("profile", f"{name}.csv", _P.PROFILES_DIR)
        return None
    if torch:
        c.rows = [r for r in _P.ROWS if r[1] in _P.TORCH_METRICS]
    return c


def kernel(card, part: str | None = None):
    """The card's kernel whose name contains `part` (the first kernel without it), or None. torch's
    calls launch several kernels: None for part picks the longest."""
    if card is None or not card.kernels:
        return None
    if part is None:
        return max(card.kernels, key=lambda k: k.value("gpu__time_duration.sum") or 0)
    try:
        return card.kernel(part)
    except KeyError:
        return None


def value(card, part: str | None, metric: str):
    """One metric of one kernel (see kernel()); None where there is no card, kernel or value."""
    k = kernel(card, part)
    v = None if k is None else k.value(metric)
    return v if isinstance(v, (int, float, str)) else None


def sass(name: str, path, defines: dict | None = None):
    """cl.sass(path, defines, name=name): compiled and disassembled where nvcc and cuobjdump are,
    else the SASS a GPU machine committed (book/data/sass/NAME.sass); None when there is neither."""
    try:
        return _S.sass(path, defines, name=name)
    except _S.SassUnavailable as e:
        print(f"no SASS here ({str(e).split(';')[0]}) and no committed {_S.SASS_DIR}/{name}.sass yet: "
              "a run on a machine with the CUDA toolkit stores it")
        return None


def mask_reads(code) -> dict:
    """How data in the user's __constant__ bank (c[0x3][...] on sm_90, a mask) reaches the FFMAs of
    `code` (a list of SASS instructions): as an FFMA operand itself, or loaded first, into uniform
    registers (ULDC, one value for the whole warp) or into ordinary registers (LDC)."""
    ffma = [i for i in code if i.base == "FFMA"]
    return {"FFMA": len(ffma),
            "FFMA with a c[0x3] operand": sum(i.constant_bank for i in ffma),
            "ULDC from c[0x3]": sum(i.base == "ULDC" and i.constant_bank for i in code),
            "LDC from c[0x3]": sum(i.base == "LDC" and i.constant_bank for i in code)}


def describe_mask_reads(counts: dict | None) -> str | None:
    """mask_reads() in words, for the prose: which of the two code generations the SASS shows."""
    if not counts or not counts["FFMA"]:
        return None
    n, direct = counts["FFMA"], counts["FFMA with a c[0x3] operand"]
    loads = [f"{counts[k]:,} {k.split()[0]} {into}" for k, into in (("ULDC from c[0x3]", "(into uniform registers)"),
                                                                  ("LDC from c[0x3]", "(into registers)")) if counts[k]]
    loaded = " and ".join(loads)
    if direct == n:
        return f"every one of its {n:,} FFMAs takes its mask value from the constant bank as an operand: no load"
    head = ("none of its" if direct == 0 else f"{direct:,} of its") + f" {n:,} FFMAs read the mask from the constant bank directly"
    return head + (f"; {loaded} load the mask values first" if loads else "")


# The rows the chapters compare kernels on: what bounds each one.
SUMMARY = [("duration (us)", "gpu__time_duration.sum"),
           ("issue slots busy (%)", "smsp__issue_active.avg.pct_of_peak_sustained_active"),
           ("DRAM throughput (% of peak)", "dram__throughput.avg.pct_of_peak_sustained_elapsed"),
           ("SM throughput (% of peak)", "sm__throughput.avg.pct_of_peak_sustained_elapsed"),
           ("tensor pipe busy (%)", "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"),
           ("registers per thread", "launch__registers_per_thread"),
           ("theoretical occupancy (%)", "sm__maximum_warps_per_active_cycle_pct"),
           ("achieved occupancy (%)", "sm__warps_active.avg.pct_of_peak_sustained_active"),
           ("occupancy limited by", "launch__occupancy_limit_*"),
           ("DRAM bytes read", "dram__bytes_read.sum"),
           ("DRAM bytes written", "dram__bytes_write.sum"),
           ("top warp stalls (cycles per issue)", "smsp__average_warps_issue_stalled_*_per_issue_active.ratio")]


def table(columns: dict, rows=SUMMARY):
    """One column per entry label -> (card, kernel name part or None), one row per (what, metric)
    that some column has; None when no column has a card."""
    import pandas as pd

    cols = {label: [value(c, part, m) for _, m in rows] for label, (c, part) in columns.items() if c is not None}
    if not cols:
        return None
    keep = [i for i in range(len(rows)) if any(v[i] is not None for v in cols.values())]
    index = pd.MultiIndex.from_tuples([rows[i] for i in keep], names=["what", "ncu metric"])
    return pd.DataFrame({k: [card_value(v[i]) for i in keep] for k, v in cols.items()}, index=index)
