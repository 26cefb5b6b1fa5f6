"""Chapter 2, the naive kernel (book/02_naive.ipynb, kernels/02_naive/, convlab.ops.naive): its
three grids drawn, the memory counters its exercises (and the later chapters') are graded on, and
exercise 2.2's timing harness graded on a simulated GPU.

    from convlab.chapters import ch02_naive as ch2
    fig = ch2.grid_maps()                       # which block computes each output, for each grid
    ch2.check_counters(launch, ch2.check_targets("02"), shape=ch2.FLAT_SHAPE)   # correct, then counters
    ch2.check_timing(time_it)                   # exercise 2.2: a harness against the simulated GPU

check_counters is correct first, then the emulator's memory counters against targets {quantity:
most allowed} (COUNTERS: sectors per request, bank conflicts, bytes and shared loads per
multiply-add, atomics, constant addresses per request), with the line to look at; a chapter's
check_targets gives its exercises' targets (kept_targets, or measured_targets from the chapter's
own kernel) and what the kernel is timed against on a GPU (compare_on_gpu).
"""
from __future__ import annotations

import math
from functools import partial

import numpy as np

import convlab as cl

from ..display.diagrams import FONT, by_index, draw_grid, new_figure
from ..gpu._limits import GRID_YZ_MAX
from ..gpu._paths import path
from ..measuring import simgpu, workloads
from ..measuring.baselines import torch_algorithm
from ..measuring.cards import ATOMICS, EMU_CONSTANT_ADDRESSES, EMU_CONSTANT_REQUESTS
from ..measuring.workloads import Workload
from ..ops import naive
from ..programs.measure import call, inputs
from ..teach import checks
from ..teach.checks import Shape, describe_error, fault_text, nothing_text, say, unfinished
from ..teach.verdict import NOTHING, Verdict, verdict

ANSWERS = {
    "02.too_big_for_z": ("the z map's failures", lambda: ["lenet_c3", "fa17"]),
    "02_timing.quartiles": ("the true statements about the quartiles", lambda: ["a", "c", "d"]),
}

check_answer = partial(checks.check_answer, ANSWERS)

#: The shape check_counters runs a conv2d kernel on: a few warps of rows wider than one, padding.
COUNTER_SHAPE = Shape(1, 2, 4, 24, 40, 5, pad=2, why="the counters' shape")
#: Exercise 2.1's: 32 maps, so that a warp whose lanes run over maps instead of columns shows in its sectors.
FLAT_SHAPE = Shape(1, 2, 32, 24, 40, 5, 1, 2, why="the counters' shape")


# The patched store: each output receives the linear index of the block and of the thread that wrote it.
_WHO = "(float)((blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z)) * 1024 " \
       "+ threadIdx.x + blockDim.x * threadIdx.y)"


def _who_kernels():
    """conv2d_naive.cu with every output store replaced by the writer's (block, thread) index."""
    src = path(naive.KERNEL_FILE).read_text()
    store = "y[((b * M + m) * Ho + h) * Wo + w] = acc;"
    if src.count(store) != 2 or src.count("y[i] = acc;") != 1:
        raise RuntimeError(f"{naive.KERNEL_FILE}: the output stores changed; update convlab.chapters.ch02_naive")
    src = src.replace(store, f"y[((b * M + m) * Ho + h) * Wo + w] = {_WHO};").replace("y[i] = acc;", f"y[i] = {_WHO};")
    return cl.load_source(src, name="conv2d_naive_who")


def grid_map_data(B: int = 2, M: int = 2, Ho: int = 6, Wo: int = 6, block=(4, 4), flat_block: int = 32) -> dict:
    """For each of chapter 2's maps ("z", "flat", "textbook"): the grid and block its launcher gives,
    and (block, thread) arrays of shape (B, M, Ho, Wo): which block (linear index) and which thread
    of it wrote each output, read back from the kernel itself run with its stores patched."""
    import torch
    mod = _who_kernels()
    x, w = cl.zeros(B, 1, Ho, Wo), cl.zeros(M, 1, 1, 1)      # C=1, K=1: the output is the input's size
    launches = {"z": naive.grid_z(B, M, Ho, Wo, block), "flat": naive.grid_flat(B * M * Ho * Wo, flat_block),
                "textbook": naive.grid_textbook(B, M, Ho, Wo, block)}
    out = {}
    for name, (grid, blk) in launches.items():
        y = cl.empty(B, M, Ho, Wo)
        mod.kernel(f"conv2d_naive_{name}")(x, w, y, B, 1, M, Ho, Wo, 1, 0, 1, grid=grid, block=blk)
        v = y.cpu().to(torch.int64).numpy()
        out[name] = {"grid": grid, "block": blk, "block_id": v // 1024, "thread": v % 1024}
    return out


def grid_maps(B: int = 2, M: int = 2, Ho: int = 6, Wo: int = 6, block=(4, 4), flat_block: int = 32,
              limit_workload: str = "fa17"):
    """Figure: chapter 2's three grids on a small layer (B images × M maps of Ho×Wo outputs), one row
    per map, one panel per (image b, map m); each output is coloured and numbered by the block that
    computes it. What to see: grid z gives each (b, m) pair its own blocks (z = b·M + m) and tiles
    each map in 2-D blocks, ragged at the edges; the flat grid runs through the outputs in memory
    order, so one block spans maps and images; the textbook's grid puts b on x, m on y and the
    tiles on z. The z map cannot launch on `limit_workload` (B·M over 65,535 blocks on z)."""
    data = grid_map_data(B, M, Ho, Wo, block, flat_block)
    shape = workloads.get(limit_workload)
    z_blocks = naive.grid_z(shape.B, shape.M, shape.Ho, shape.Wo)[0][2]
    fig, axes = new_figure(3, B * M, height=6.4)
    titles = {"z": f"grid z: ({', '.join(map(str, data['z']['grid']))}), block {block[0]}×{block[1]}",
              "flat": f"flat: {data['flat']['grid'][0]} blocks of {flat_block}",
              "textbook": f"textbook: ({', '.join(map(str, data['textbook']['grid']))}), block {block[0]}×{block[1]}"}
    for row, name in enumerate(("z", "flat", "textbook")):
        ids = data[name]["block_id"]
        for b in range(B):
            for m in range(M):
                ax = axes[row, b * M + m]
                draw_grid(ax, by_index(ids[b, m]), ids[b, m].astype(str), title=f"b={b}, m={m}")
        axes[row, 0].text(-0.08, 0.5, titles[name], transform=axes[row, 0].transAxes, rotation=90,
                          ha="right", va="center", fontsize=FONT)
    fig.suptitle("Which block computes each output (number = block index)", fontsize=FONT + 2)
    fig.text(0.5, -0.02, f"{limit_workload}: grid z would need B·M = {shape.B:,}·{shape.M} = {z_blocks:,} blocks "
             f"on z, over the limit of {GRID_YZ_MAX:,}: the launch fails.", ha="center", va="top", fontsize=FONT)
    fig.convlab_data = {**data, "limit": {"workload": limit_workload, "z_blocks": z_blocks, "max": GRID_YZ_MAX}}
    return fig


def multiply_adds(shape: Workload) -> int:
    return shape.B * shape.M * shape.Ho * shape.Wo * shape.C * shape.K * shape.K


#: What check_counters grades, from one kernel's emulator counters (k.metrics) and the
#: multiply-adds of the launch: (its value, its unit for the verdict). "shared loads per
#: multiply-add" needs k.trace, a trace of every block of the launch (cl.trace): shared_values.
def quantity(what: str, k, macs: int | None) -> float | None:
    m = k.metrics
    if what == "sectors per load request":
        return k.sectors_per_request("ld")
    if what == "sectors per store request":
        return k.sectors_per_request("st")
    if what == "shared bank conflicts":
        return (m["l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"]
                + m["l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"])
    if what == "global load bytes per multiply-add":
        return 32 * m["l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"] / macs if macs else None
    if what == "shared loads per multiply-add":      # the values each thread loads (shared_values)
        if getattr(k, "trace", None) is None:
            raise ValueError("shared loads per multiply-add are counted from a trace of every block of the launch "
                             "(cl.trace(..., blocks=every block)): k.trace")
        return len(shared_values(k.trace)) / macs if macs else None
    if what == "global atomics":                     # warp instructions, as ncu counts them

        return k.value(ATOMICS)
    if what == "constant addresses per request":     # each served in turn by the constant cache

        requests = m.get(EMU_CONSTANT_REQUESTS, 0)
        return m[EMU_CONSTANT_ADDRESSES] / requests if requests else None
    raise ValueError(f"check_counters grades {', '.join(COUNTERS)}; not {what!r}")


COUNTERS = ("sectors per load request", "sectors per store request", "shared bank conflicts",
            "global load bytes per multiply-add", "shared loads per multiply-add", "global atomics",
            "constant addresses per request")


#: The accesses of card.lines() behind each quantity: the line named under a missed target is one of them.
_ACCESSES = {"sectors per load request": ("global load",), "global load bytes per multiply-add": ("global load",),
             "sectors per store request": ("global store",), "shared bank conflicts": ("shared load", "shared store"),
             "global atomics": ("global atomic",)}


def shared_values(trace):
    """The shared-memory values a traced launch's threads load, as compiled code loads them: each
    4-byte word once per thread and barrier interval. A word the thread read before in the same
    interval is still in a register (nvcc keeps it there: no other thread may write it before the
    next barrier, and the thread's own stores it forwards), and the width of the load instructions
    is the compiler's (it merges a float4's worth of neighbouring floats into one load where it can
    prove the alignment), so neither a float4 written as four floats nor a value read again inside
    a loop is counted twice (checked against nvcc's PTX in tests/test_exercise_mutants.py). Where
    nvcc keeps two reads apart (each under its own condition) this counts one. trace: cl.trace of
    every block. A DataFrame, one row per (block, thread, interval, word), with the source line of
    its first read ("line")."""
    import pandas as pd

    a = trace.accesses
    r = a[(a.space == "shared") & (a.access == "read")]
    words = np.maximum(r.bytes.to_numpy() // 4, 1)
    rows = np.repeat(np.arange(len(r)), words)
    within = np.arange(len(rows)) - np.repeat(np.cumsum(words) - words, words)
    df = pd.DataFrame({c: r[c].to_numpy()[rows] for c in ("bx", "by", "bz", "thread", "phase", "line")})
    df["word"] = (r.addr.to_numpy().astype(np.uint64)[rows] >> np.uint64(2)) + within.astype(np.uint64)
    return df.drop_duplicates(["bx", "by", "bz", "thread", "phase", "word"]).reset_index(drop=True)


def _every_block(grid: str) -> list:
    """Every block of a launch's grid, as a KernelProfile gives it ("(5, 1, 1)")."""
    gx, gy, gz = (int(v) for v in grid.strip("()").split(","))
    return [(bx, by, bz) for bz in range(gz) for by in range(gy) for bx in range(gx)]


def traced_profile(call, card):
    """The last kernel of a profiled call, run again with every block traced: a KernelProfile with
    its trace (the quantities counted from accesses)."""
    k = card.kernels[-1]
    return cl.trace(call, blocks=_every_block(k.grid), launch=len(card.kernels) - 1).profile


def _costliest_line(card, missed=(), traced=None) -> str:
    """The source line a student looks at first: under a missed target, the line that makes most
    of that quantity (the most shared values loaded, the most sectors of a global load, the most
    bank conflicts); otherwise the line whose accesses move the most sectors or wavefronts."""
    if "shared loads per multiply-add" in missed and traced is not None:
        per_line = shared_values(traced.trace).groupby("line").size()
        if len(per_line):
            line = per_line.idxmax()
            return (f"\n  the line that loads the most from shared memory: {line} ({per_line[line]:,} values, each "
                    f"counted once per thread and barrier interval)")
    try:
        df = card.lines(len(card.kernels) - 1).reset_index()
    except Exception:  # noqa: BLE001 (no lines on this card: nothing to add)
        return ""
    kinds = {kind for q in missed for kind in _ACCESSES.get(q, ())}
    if kinds:
        df = df[df.access.isin(kinds)]
    best, text = -1.0, ""
    for _, row in df.iterrows():
        if "shared bank conflicts" in missed:
            n = row.get("bank conflicts")
            if n is not None and not (isinstance(n, float) and math.isnan(n)) and float(n) > best:
                best, text = float(n), f"{row['source line']} ({row['access']}: {float(n):,.0f} bank conflicts)"
            continue
        for unit in ("sectors", "wavefronts"):
            per = row.get(f"{unit} per request")
            if per is not None and not (isinstance(per, float) and math.isnan(per)):
                moved = float(per) * float(row["requests"])
                if moved > best:
                    best, text = moved, f"{row['source line']} ({row['access']}: {moved:,.0f} {unit})"
    return f"\n  the line that moves the most: {text}" if text else ""


def check_counters(launch, targets: dict, *, shape: Workload | None = None, result=None,
                   macs: int | None = None, name: str = "your kernel") -> Verdict:
    """Correct first, then the emulator's memory counters against targets {quantity: most allowed}
    (quantities: COUNTERS). With shape, launch(x, w, y, stride, pad) is a conv2d launch, run once
    on that shape under cl.profile and its output held to the fp64 reference; without, launch()
    takes no arguments, result() -> (got, expected) says whether its output is right and macs
    (its multiply-adds) is what the "per multiply-add" quantities divide by. Prints
    e.g. "✓ correct; 4 sectors per load request (target ≤ 4.5); ..." and the line to look at
    (under a missed target, the line that makes most of that quantity).

    What is counted is what the GPU would do with the kernel as nvcc compiles it, so that a
    target never punishes what the compiler does for the student: global memory in the sectors and
    requests the emulator's warps make (nvcc keeps a global load where the code has it); shared
    loads as the values each thread loads (shared_values: a word once per thread and barrier
    interval, whatever the width of the loads, since nvcc keeps a value already loaded in a
    register and merges neighbouring floats into vector loads). Targets made by check_targets for
    another shape than this one (a Targets with derive) are made again for this shape."""
    if getattr(targets, "derive", None) is not None and shape is not None and cl.backend() == "emu" \
            and dims(shape) != dims(targets.shape):
        targets = targets.derive(shape)
    for what in targets:
        if what not in COUNTERS:
            raise ValueError(f"check_counters grades {', '.join(COUNTERS)}; not {what!r}")
    if cl.backend() != "emu":
        verdict_ = say(False, "the counters are graded on the emulator: run this notebook with "
                               "CONVLAB_BACKEND=emu (on a GPU, cl.profile gives ncu's counters to read yourself)")
        if shape is not None:
            compare_on_gpu(launch, targets, name=name)
        return verdict_
    if shape is not None:
        x, w = cl.randn(shape.B, shape.C, shape.H, shape.W), cl.randn(shape.M, shape.C, shape.K, shape.K)
        y = cl.empty(shape.B, shape.M, shape.Ho, shape.Wo)
        call = lambda: launch(x, w, y, shape.stride, shape.padding)  # noqa: E731
        macs = multiply_adds(shape)
    else:
        call = launch
    try:
        card = cl.profile(call)
    except Exception as e:  # noqa: BLE001 (a check must never stop the notebook)
        text = fault_text(launch, describe_error(e))
        return say(False, text if text.startswith("not done") else f"✗ {text}")
    if shape is not None:
        ok, text = verdict(y, cl.ref.conv2d(x, w, stride=shape.stride, padding=shape.padding),
                           inputs=(x, w, shape.stride, shape.padding))
    else:
        try:
            got, want = result()
        except Exception as e:  # noqa: BLE001
            return say(False, f"✗ {describe_error(e)}")
        ok, text = verdict(got, want, labels="ijk")
    if not ok:
        if text.startswith(NOTHING):
            text = nothing_text(launch, text, out_index=2 if shape is not None else None)
            return say(False, text)
        return say(False, f"✗ {name}{f' on {shape}' if shape else ''}: {text}")
    if not card.kernels:
        return say(False, f"✗ {name} launched no kernel")
    k, traced = card.kernels[-1], None
    if "shared loads per multiply-add" in targets:
        try:
            traced = traced_profile(call, card)
        except Exception as e:  # noqa: BLE001 (a check must never stop the notebook)
            return say(False, f"✗ {describe_error(e)}")
    parts, missed = [], []
    for what, most in targets.items():
        got = quantity(what, traced if what == "shared loads per multiply-add" else k, macs)
        if got is None:
            parts.append(f"no {what} (the kernel makes no such access)")
            continue
        good = got <= most + 1e-9
        if not good:
            missed.append(what)
        shown = f"{got:,.0f}" if float(got).is_integer() else f"{got:.3g}"
        parts.append(f"{shown} {what} (target {'≤ ' if most else ''}{most:g}){'' if good else ' ✗'}")
    lead = "✓ correct" if not missed else "✗ correct, but not within the targets"
    source = f"\n  the targets: {targets.source}" if getattr(targets, "source", "") else ""
    verdict_ = say(not missed, f"{lead}: {name}: " + "; ".join(parts) + source
                    + _costliest_line(card, missed, traced))
    if shape is not None:
        compare_on_gpu(launch, targets, name=name)
    return verdict_


def torch_best_row(workload: str) -> dict | None:
    """book/data/torch.csv's fastest fp32 forward row of a layer (either layout), or None."""
    import csv

    data = path("book/data/torch.csv")
    if not data.is_file():
        return None
    with open(data, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["workload"] == workload and r["pass"] == "forward"
                and r["dtype"] == "fp32" and r["kind"] == "torch"]
    return min(rows, key=lambda r: float(r["ms"])) if rows else None


def side_by_side(wl, device: str, chapter: str, yours, theirs, torch_row: dict | None) -> str:
    """The three GPU times of check_counters's comparison as lines of text: your kernel, the
    chapter's (each a cl.bench Timing), torch best from book/data/torch.csv (its GPU and kernel named)."""

    lines = [f"  on {device}, {wl.name} ({wl.shape_text}), GPU time (median of 20, IQR):"]

    def line(who, ms, p25, p75, note=""):
        lines.append(f"    {who:<22}{ms:>9.4g} ms ({p25:.4g}–{p75:.4g}){note}")
    line("your kernel", yours.ms, yours.p25, yours.p75, f", {yours.ms / theirs.ms:.2f}× the chapter's")
    line("the chapter's kernel", theirs.ms, theirs.p25, theirs.p75, f": {chapter}")
    if torch_row is None:
        lines.append("    torch best            (not in book/data/torch.csv)")
    else:
        algorithm, kernel = torch_algorithm(torch_row["torch_kernels"])
        where = "" if torch_row["gpu"] == device else f", measured on {torch_row['gpu']}, not this GPU"
        line("torch best", float(torch_row["ms"]), float(torch_row["p25"]), float(torch_row["p75"]),
             f": {torch_row['impl']}, {algorithm} ({kernel}){where}")
    return "\n".join(lines)


def compare_on_gpu(launch, targets, *, name: str = "your kernel") -> None:
    """On a GPU: launch(x, w, y, stride, pad) timed with cl.bench on the exercise's course layer
    beside the chapter's own kernel and torch best (targets.compare: (workload, the chapter's Impl),
    set by the chapter's check_targets); on the emulator, one line saying so. Prints; never raises."""
    import torch



    found = getattr(targets, "compare", None)
    if found is None:
        return
    wl, impl = workloads.get(found[0]), found[1]
    if cl.backend() == "emu":
        print(f"  (timing {name} against the chapter's kernel and torch best on {wl.name} needs a GPU)")
        return
    try:
        t = inputs(wl, "forward")
        y = cl.empty(*wl.y_shape)
        ours = cl.bench(lambda: launch(t["x"], t["w"], y, wl.stride, wl.padding))
        chapter = call(impl, wl, t, impl.config(wl))
        want = chapter()
        theirs = cl.bench(chapter)
    except Exception as e:  # noqa: BLE001 (a check must never stop the notebook)
        print(f"  timing on {wl.name}: {describe_error(e)}")
        return
    if not torch.allclose(y, want, rtol=1e-3, atol=1e-3 * float(want.abs().max())):
        print(f"  on {wl.name} your kernel's output differs from the chapter's kernel's: not timed")
        return
    print(side_by_side(wl, cl.device().name, impl.name, ours, theirs, torch_best_row(wl.name)))


class Targets(dict):
    """An exercise's counter targets {quantity: most allowed}, and the exercise's key. Targets
    measured from a kernel also say where they come from (source, printed under the verdict), on
    which shape, and derive(shape) makes them again for another shape. compare: (workload name,
    the chapter's Impl) that check_counters times the exercise's kernel against on a GPU, or None."""
    key: str | None = None
    source: str = ""
    shape: Workload | None = None
    derive = None
    compare: tuple | None = None


def kept_targets(key: str, values: dict, compare: tuple | None = None) -> Targets:
    """Targets a chapter's module keeps (its TARGETS[key]), with the exercise's key."""
    t = Targets(values)
    t.key, t.compare = key, compare
    return t


def measured_targets(key: str, derive, shape: Workload, defaults: dict, tunables: dict,
                     compare: tuple | None = None) -> Targets:
    """The targets of an exercise whose targets come from a kernel: derive(shape, **tunables)
    measured now on the emulator on `shape`, with the tunables given (the exercise notebook's own,
    `defaults`, for those left out), and made again by check_counters for another shape. On a GPU
    they hold no numbers (the counters are graded on the emulator) but still name the exercise."""
    unknown = sorted(set(tunables) - set(defaults))
    if unknown:
        raise TypeError(f"the targets of {key!r} take the tunables {', '.join(defaults) or 'none'}; not "
                        f"{', '.join(unknown)}")
    values = {k: int(v) for k, v in {**defaults, **tunables}.items()}

    def make(s):
        t = derive(s, **values)
        t.key, t.shape, t.derive, t.compare = key, s, make, compare
        return t
    if cl.backend() == "emu":
        return make(shape)
    targets = Targets()
    targets.key, targets.derive, targets.compare = key, make, compare
    return targets


def dims(shape) -> tuple | None:
    return None if shape is None else (shape.B, shape.C, shape.M, shape.H, shape.W, shape.K, shape.stride,
                                       shape.padding, shape.dilation, shape.groups)


def round_up(v: float, digits: int = 3) -> float:
    """v rounded up to `digits` significant digits: a target a kernel as good as v meets."""
    if v <= 0:
        return v
    e = math.floor(math.log10(v)) - digits + 1
    return round(math.ceil(v / 10 ** e - 1e-9) * 10 ** e, max(-e, 0))


def round_sig(v: float, digits: int = 3) -> float:
    return float(f"{v:.{digits}g}")


def conv_counters(run, shape: Workload, quantities) -> dict:
    """The quantities of the last kernel run(x, w, y, stride=, padding=) launches on shape, counted
    on the emulator as check_counters counts them."""
    x, w = cl.randn(shape.B, shape.C, shape.H, shape.W), cl.randn(shape.M, shape.C, shape.K, shape.K)
    y = cl.empty(shape.B, shape.M, shape.Ho, shape.Wo)
    call = lambda: run(x, w, y, stride=shape.stride, padding=shape.padding)  # noqa: E731
    card = cl.profile(call)
    traced = traced_profile(call, card) if "shared loads per multiply-add" in quantities else None
    return {q: quantity(q, traced if q == "shared loads per multiply-add" else card.kernels[-1], multiply_adds(shape))
            for q in quantities}


def _flat_targets(shape: Workload) -> Targets:
    """Exercise 2.1: sectors per load and per store request halfway (on a log scale: the geometric
    mean) between chapter 2's flat kernel, coalesced, and the same sum with a warp's lanes down a
    column of the output, uncoalesced (chapter 2's conv2d_naive_z in blocks of 1 × 32), both
    measured on the shape: a coalesced kernel that does a little more or less than the chapter's
    (taps clamped to the image, another loop order) passes, one whose lanes are not consecutive
    output columns fails, with the margin of the factor between the two."""
    quantities = ("sectors per load request", "sectors per store request")
    chapter = conv_counters(naive.conv2d_naive_flat, shape, quantities)
    column = conv_counters(lambda *a, **kw: naive.conv2d_naive_z(*a, block=(1, 32), **kw), shape, quantities)
    t = Targets({q: round_sig(math.sqrt(chapter[q] * column[q])) for q in quantities})
    t.source = ("halfway between chapter 2's conv2d_naive_flat, coalesced ("
                + ", ".join(f"{round_sig(chapter[q])}" for q in quantities)
                + "), and a warp's lanes down a column of the output, uncoalesced (conv2d_naive_z in blocks of "
                  "1 × 32: " + ", ".join(f"{round_sig(column[q])}" for q in quantities)
                + ") on the same shape, for loads and stores")
    return t


def check_targets(key: str = "02") -> Targets:
    """Exercise 2.1's counter targets (_flat_targets), measured now on the emulator on FLAT_SHAPE
    and made again by check_counters for another shape."""
    return measured_targets(key, {"02": _flat_targets}[key], FLAT_SHAPE, {}, {},
                            compare=("lenet_c1", naive.NAIVE_FLAT))


#: Fewer timed runs than this say no spread: a quartile of 5 numbers is about one of them.
TIMING_RUNS = 10


def _timed(log) -> tuple[list, list]:
    """From a simulated GPU's log: the samples a harness read (elapsed_time's, and the host clock's
    differences around a call of fn) and, for each, the launches inside it."""
    samples = [(ms, [L for L in log.launches if a <= L.start_ms - L.other_ms and L.end_ms <= b + 1e-9])
               for a, b, ms in log.elapsed]
    for c0, c1 in zip(log.clock, log.clock[1:]):
        inside = [L for L in log.launches if c0 <= L.begin_ms and L.host_ms <= c1]
        if inside:
            samples.append((c1 - c0, inside))
    return [ms for ms, _ in samples], [ls for _, ls in samples]


def check_timing(time_it, *, seed: int | None = None) -> Verdict:
    """time_it(fn, gpu) -> (median ms, 25th, 75th percentile): a timing harness, graded on a
    simulated GPU (convlab.measuring.simgpu.SimGPU) whose kernel's cold-cache time is known, and named by its
    mistake: a host clock read without synchronize, events read before they completed, the first
    (compiling) call timed, too few runs, the flush timed with the kernel, a hot L2, the mean, a
    "median" that is no middle run (named: the fastest, the slowest, the first or last, a
    quartile), wrong quartiles. On a GPU it is then compared with cl.bench on chapter 2's flat
    naive kernel (lenet_c1)."""
    import random
    import statistics


    rng = random.Random(seed)
    true_ms = round(rng.uniform(0.4, 1.6), 3)
    gpu = simgpu.SimGPU(ms=true_ms, seed=rng.randrange(1 << 30))
    kernel = gpu.kernel()
    try:
        result = time_it(kernel, gpu)
    except simgpu.NotReady as e:
        stub = unfinished(time_it)
        return stub if stub is not None else say(False, (
            f"✗ events recorded but not waited for: {e}. An event completes when the GPU reaches it, "
            f"after the kernel; the host gets there first, since a launch returns at once"))
    except Exception as e:  # noqa: BLE001 (a check must never stop the notebook)
        text = fault_text(time_it, describe_error(e))
        return say(False, text if text.startswith("not done") else f"✗ {text}")
    if result is None or (isinstance(result, (tuple, list)) and None in result):
        stub = unfinished(time_it)
        return stub if stub is not None else say(
            False, f"✗ time_it returned {result!r}: does it end with `return median, p25, p75`, each a number?")
    try:
        ms, p25, p75 = (float(v) for v in result)
    except (TypeError, ValueError):
        return say(False, f"✗ time_it returns the median and the quartiles, (ms, p25, p75); it returned "
                           f"{type(result).__name__} {result!r:.60}")
    log = gpu.log
    if not log.launches:
        return say(False, "✗ time_it never called fn: nothing was launched")
    samples, inside = _timed(log)
    if not samples:
        return say(False, "✗ no run of fn was timed: read the clock, or record events, before and after fn()")
    timed = [L for ls in inside for L in ls]
    # the host's clock read when fn() returns, before the GPU ran the kernel
    early = [L for c0, c1 in zip(log.clock, log.clock[1:]) for L in log.launches
             if c0 <= L.begin_ms and L.host_ms <= c1 < L.end_ms]
    if early and not log.elapsed:
        short = statistics.median(samples)
        return say(False, (
            f"✗ the host's clock times only the launch: {short:.3g} ms, while the kernel takes about "
            f"{true_ms:g} ms. fn() queues the kernel and returns at once; the GPU runs it later. Wait for "
            f"it (gpu.synchronize()) before reading the clock, or time it on the GPU with events"))
    if any(L.compiled for L in timed):
        return say(False, (
            f"✗ no warm-up: the first call of fn was timed, and it compiles the kernel "
            f"({simgpu.COMPILE_MS:g} ms here, before the GPU even starts). Call fn once (or a few times) "
            f"before the timed runs"))
    if len(samples) < TIMING_RUNS:
        per = f" ({len(timed)} calls in one interval: their mean, with no spread)" if len(timed) > len(samples) else ""
        return say(False, (
            f"✗ {len(samples)} timed run{'s' if len(samples) != 1 else ''}{per}: too few to say a spread. With "
            f"a few runs, one slowed by other work moves the median and the quartiles are each about one "
            f"run; the course takes 20"))
    # a flush (a buffer as large as L2 zeroed) between the start event and the kernel
    flushed = [(a, b) for a, b, _ in log.elapsed for z0, _, n in log.zeroed if n >= gpu.L2_BYTES and a <= z0 < b]
    if len(flushed) > len(samples) / 2:
        return say(False, (
            f"✗ the L2 flush is inside the timed interval: {len(flushed)} of your {len(samples)} runs time the "
            f"flush too (zeroing {2 * gpu.L2_BYTES >> 20} MB), then the kernel. Flush before recording the start "
            f"event"))
    hot = sum(L.hot for L in timed)
    if hot > len(timed) / 2:
        return say(False, (
            f"✗ a hot-cache time: {hot} of the {len(timed)} timed runs found their data still in L2 from the "
            f"run before ({ms:.3g} ms against a cold {true_ms:g} ms). A layer runs once per step, after other "
            f"layers have filled L2 with theirs: flush L2 before each run (gpu.flush_l2(), or zero a buffer "
            f"of at least gpu.L2_BYTES)"))
    median, mean = statistics.median(samples), statistics.mean(samples)
    qs, n = sorted(samples), len(samples)
    # a median has at most half the runs on either side of it (statistics.median, or the lower or
    # upper middle run); anything else is named by what it is
    below, above = sum(x < ms - 1e-12 for x in qs), sum(x > ms + 1e-12 for x in qs)
    named = next((text for value, text in (
        (qs[0], f"the fastest of your {n} runs (min(times))"), (qs[-1], f"the slowest of your {n} runs (max(times))"),
        (samples[0], f"the first of your {n} runs"), (samples[-1], f"the last of your {n} runs"),
        (p25, "your p25, the first quartile"), (p75, "your p75, the third quartile"),
        *zip(statistics.quantiles(samples, n=4)[::2], ("the first quartile of your runs (statistics.quantiles(times, "
                                                       "n=4) gives [p25, median, p75], in that order)",
                                                       "the third quartile of your runs (statistics.quantiles(times, "
                                                       "n=4) gives [p25, median, p75], in that order)")))
        if math.isclose(ms, value, rel_tol=1e-9, abs_tol=1e-12)), None)
    middle = 2 * below <= n and 2 * above <= n
    if not middle and named is None and abs(ms - mean) < abs(ms - median) and abs(mean - median) > 0.05 * median:
        slow = sum(L.other_ms > 0 for L in timed)
        return say(False, (
            f"✗ {ms:.3g} ms is the mean of your {len(samples)} runs: {slow} of them waited behind other work "
            f"on the GPU and pull the mean up; the median ({median:.3g} ms) is what a run takes, whatever a "
            f"few outliers do (statistics.median)"))
    if not middle:
        what = named or f"no middle value of your {n} runs: {below} of them are faster, {above} slower"
        return say(False, (
            f"✗ the median you return, {ms:.3g} ms, is {what}, not their median ({median:.3g} ms): the "
            f"median is the middle of the sorted times, half the runs faster and half slower "
            f"(statistics.median(times), or the middle value of statistics.quantiles(times, n=4))"))

    def rank(v):
        return sum(x <= v + 1e-12 for x in qs) / len(qs)
    if not (0.1 <= rank(p25) <= 0.4 and 0.6 <= rank(p75) <= 0.9 and p25 <= ms <= p75):
        return say(False, (
            f"✗ the quartiles: p25 = {p25:.3g} and p75 = {p75:.3g} ms should cut off the fastest and the "
            f"slowest quarter of your runs (statistics.quantiles(times, n=4) gives [p25, median, p75]); "
            f"{rank(p25):.0%} of the runs are at most p25, {rank(p75):.0%} at most p75"))
    if abs(ms - true_ms) > 0.05 * true_ms:
        return say(False, f"✗ time_it gives {ms:.3g} ms, but the simulated kernel takes {true_ms:g} ms cold")
    ok = say(True, (
        f"✓ correct: on the simulated GPU time_it gives {ms:.3g} ms (IQR {p25:.3g}–{p75:.3g}) for a kernel "
        f"whose cold-cache time is {true_ms:g} ms"))
    return _timing_on_gpu(time_it) if ok else ok


def _timing_on_gpu(time_it) -> Verdict:
    """On a GPU: time_it and cl.bench on chapter 2's flat naive kernel on lenet_c1, side by side."""


    if cl.backend() == "emu":
        return say(True, "  (on the emulator: comparing time_it with cl.bench on the chapter's kernel needs a GPU)")
    wl = workloads.get("lenet_c1")
    x, w = cl.randn(*wl.x_shape), cl.randn(*wl.w_shape)
    y = cl.empty(*wl.y_shape)
    run = lambda: naive.conv2d_naive_flat(x, w, y)  # noqa: E731
    try:
        ms, p25, p75 = (float(v) for v in time_it(run, simgpu.cuda()))
    except Exception as e:  # noqa: BLE001 (a check must never stop the notebook)
        return say(False, f"✗ on {cl.device().name}: {describe_error(e)}")
    ref = cl.bench(run)
    agree = p25 <= ref.p75 and ref.p25 <= p75 or abs(ms - ref.ms) <= 0.05 * ref.ms
    return say(agree, (
        f"  on {cl.device().name}, chapter 2's flat naive kernel on lenet_c1: time_it {ms:.4g} ms "
        f"(IQR {p25:.4g}–{p75:.4g}), cl.bench {ref.ms:.4g} ms (IQR {ref.p25:.4g}–{ref.p75:.4g})"
        + ("" if agree else ": they disagree by more than their spreads; what does cl.bench do that time_it "
                            "does not (convlab/measuring/bench.py)?")))
