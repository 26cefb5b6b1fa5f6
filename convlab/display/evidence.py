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

from ..gpu import runtime
from ..gpu._errors import ProfileUnavailable
from ..measuring import profile, results
from ..measuring.bench import strict_fp32
from ..measuring.cards import ROWS, STALL_REASONS, TORCH_METRICS, card_value, stall_metric
from ..measuring.sass import SASS_DIR, SassUnavailable
from ..measuring.sass import sass as disassemble


def _on_gpu() -> bool:
    return runtime.backend() == "cuda"


def _missing(kind: str, name: str, where: str) -> None:
    print(f"no committed {kind} {where}/{name} yet: a GPU run of this notebook measures and stores it")


def card(name: str, fn, *args, **kwargs):
    """cl.profile(fn, *args, name=name, **kwargs) on a GPU (a KernelProfile per kernel the call
    launches); elsewhere the card a GPU run committed under name, or None."""
    if _on_gpu():
        return _measured(profile.profile, fn, *args, name=name, **kwargs)
    return _committed(name)


def torch_strict(fn, *args, **kwargs):
    """fn(*args, **kwargs) as the book times torch: strict fp32 (TF32 off), cudnn.benchmark on."""
    with strict_fp32(benchmark=True):
        return fn(*args, **kwargs)


def torch_card(name: str, fn, *args, **kwargs):
    """cl.profile_torch of torch_strict(fn, ...) on a GPU: the cuDNN/cuBLAS kernels torch's call ran
    (after a warm-up call that lets cudnn.benchmark choose); elsewhere the committed card, or None."""
    if _on_gpu():
        return _measured(profile.profile_torch, torch_strict, fn, *args, name=name, **kwargs)
    return _committed(name, torch=True)


def torch_best_row(chapter: str, workload: str, pass_: str = "forward", dtype: str = "fp32"):
    """The committed "torch best" row of a chapter's results for one layer (a pandas Series: its
    layout, GPU time and the kernels it ran, `torch_kernels`), or None."""
    df = results.load(chapter, quiet=True)
    if df is None:
        return None
    rows = df[(df["workload"] == workload) & (df["kind"] == "torch best") & (df["pass"] == pass_)
              & (df["dtype"] == dtype)]
    return None if rows.empty else rows.iloc[0]


def torch_best_card(name: str, chapter: str, workload: str, x, w, **kwargs):
    """The card of the call "torch best" timed on one layer: torch.nn.functional.conv2d as the book
    times torch (strict fp32, cudnn.benchmark on, so cuDNN chooses the algorithm it chose when it was
    timed) on x and w in the layout of the chapter's committed torch best row. Without a GPU, the
    committed card. Compare what it ran with what was timed with timed_kernel()."""
    import torch

    row = torch_best_row(chapter, workload)
    if row is not None and row["layout"] == "channels_last" and x is not None:
        x, w = (t.contiguous(memory_format=torch.channels_last) for t in (x, w))
    return torch_card(name, torch.nn.functional.conv2d, x, w, **kwargs)


def _short(kernel_name: str) -> str:
    """A kernel's name without its template arguments and parameters: 'DSE::regular_fft_pad'."""
    name = kernel_name.split("(")[0].split("<")[0].strip()
    return name.split()[-1] if name else kernel_name


def timed_kernel(card, row) -> dict | None:
    """What torch best's committed row ran (`row`: torch_best_row) against what the card profiled:
    {"timed": the row's kernels, "profiled": the card's kernels (short names), "same": whether the card
    profiled the kernels that were timed, "card_us": the card's longest kernel's duration, "timed_ms":
    the row's GPU time}; None without a card or a row."""
    if card is None or row is None or not card.kernels:
        return None
    timed = [_short(k) for k in str(row["torch_kernels"]).split(" | ") if k.strip()]
    profiled = [_short(k.name) for k in card.kernels]
    longest = kernel(card)
    return {"timed": list(dict.fromkeys(timed)), "profiled": list(dict.fromkeys(profiled)),
            "same": bool(timed) and set(profiled) <= set(timed),
            "card_us": longest.value("gpu__time_duration.sum") if longest else None, "timed_ms": float(row["ms"])}


def describe_timed_kernel(match: dict | None) -> str | None:
    """timed_kernel() in words, for the prose."""
    if match is None:
        return None
    brief = lambda k: k if len(k) <= 40 else k[:38] + "…"  # noqa: E731 - cuDNN's names run to 100 characters
    ran = ", ".join(f"`{brief(k)}`" for k in match["profiled"])
    if match["same"]:
        return (f"the kernels torch best ran when it was timed: {ran}, whose longest took "
                f"{match['card_us']:,.0f} µs under the profiler against {match['timed_ms']:.2f} ms timed")
    timed = ", ".join(f"`{brief(k)}`" for k in match["timed"])
    return (f"{ran}, which is not what torch best ran when it was timed ({timed}, "
            f"{match['timed_ms']:.2f} ms): this card is of another algorithm than the timed call's")


def _measured(how, *args, **kwargs):
    # where ncu is missing or refused, cl.profile falls back to the committed card; before the
    # first one is committed that is an error, which here is one line and no card
    try:
        return how(*args, **kwargs)
    except ProfileUnavailable as e:
        print(e)
        return None


def _committed(name: str, torch: bool = False):
    c = profile.committed(name)
    if c is None:
        _missing("profile", f"{name}.csv", profile.PROFILES_DIR)
        return None
    if torch:
        c.rows = [r for r in ROWS if r[1] in TORCH_METRICS]
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
        return disassemble(path, defines, name=name)
    except SassUnavailable as e:
        print(f"no SASS here ({str(e).split(';')[0]}) and no committed {SASS_DIR}/{name}.sass yet: "
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


def describe_issue(card, part: str | None = None, what: str = "Its card") -> str:
    """One sentence from a kernel's card on what its time went to: issue slots, DRAM, and per
    warp-wide FFMA (or HMMA) the instructions and shared loads it issued; "" without a card (a
    page that quotes it says nothing until a GPU run has measured it)."""
    k = kernel(card, part)
    if k is None:
        return ""
    issue = k.value("smsp__issue_active.avg.pct_of_peak_sustained_active")
    dram = k.value("dram__throughput.avg.pct_of_peak_sustained_elapsed")
    inst = k.value("smsp__inst_executed.sum")
    ffma = k.value("smsp__sass_thread_inst_executed_op_ffma_pred_on.sum")
    lds = k.value("smsp__inst_executed_op_shared_ld.sum")
    parts = []
    if issue is not None and dram is not None:
        parts.append(f"the schedulers issued an instruction in {issue:.0f}% of the cycles and DRAM ran at "
                     f"{dram:.0f}% of its peak")
    if inst and ffma:
        per = inst / (ffma / 32)
        lds_part = f", {lds / (ffma / 32):.2f} of them shared-memory loads" if lds is not None else ""
        parts.append(f"for each warp-wide FFMA it issued {per:.1f} instructions{lds_part}")
    if not parts:
        return ""
    return f"{what} ({card.source.split(':')[0]}): " + "; ".join(parts) + "."


def stalls(card, part: str | None = None, n: int = 3) -> list:
    """The kernel's n largest warp stalls as (reason, warps stalled per issued instruction), largest
    first; [] without a card."""
    k = kernel(card, part)
    if k is None:
        return []
    vals = [(r, k.value(stall_metric(r))) for r in STALL_REASONS if r != "selected"]
    return sorted(((r, v) for r, v in vals if isinstance(v, (int, float)) and v > 0), key=lambda rv: -rv[1])[:n]


def stall(card, part: str | None, reason: str):
    """Warps stalled for one reason per issued instruction, or None."""
    k = kernel(card, part)
    v = None if k is None else k.value(stall_metric(reason))
    return v if isinstance(v, (int, float)) else None
