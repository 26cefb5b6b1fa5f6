"""Chapter 5, fusion and tuning (book/05_fused.ipynb, kernels/05_fused/, convlab.ops.fused): its
figures (the implicit GEMM's block, warp and thread tiles, the direct register-tiled kernel's
outputs), its exercises' targets (measured from the chapter's own kernels at the student's
tunables) and answers, and exercise 5.4's check of a dispatcher rule.

    from convlab.chapters import ch05_fused as ch5
    fig = ch5.implicit_gemm_tiles("resnet")
    ch5.check_targets("05_direct_regtile", MT=8, ROWS=2, BLOCK=128)   # on ch5.counter_shape(key)
    ch5.check_pick(pick, times, layers, device=gpu)
"""
from __future__ import annotations

from functools import partial

import numpy as np

from ..display.diagrams import FONT, PALETTE, by_index, draw_grid, light, new_figure, outline
from ..measuring import workloads
from ..measuring.workloads import Workload
from ..ops import ceil_div, fused, igemm
from ..teach import checks
from ..teach.checks import Shape, describe_error, say, todo_left
from ..teach.verdict import Verdict
from .ch02_naive import COUNTER_SHAPE, Targets, conv_counters, measured_targets, multiply_adds, round_up


def _direct_reuse(name: str) -> float:
    wl = workloads.get(name)
    cfg = fused.regtile_config(wl.M, wl.C, wl.K)
    return wl.K * cfg["MT"] * cfg["ROWS"] / ((cfg["ROWS"] - 1) * wl.stride + wl.K)


ANSWERS = {
    "05_implicit_gemm.saved": ("bytes saved on fa17", lambda: 2 * 4 * 10000 * 25 * 24 * 24),
    "05_register_tiles.saved": ("shared loads saved per multiply-add", lambda: 1.625),
    # lenet_c3 with chapter 5's tunables: K * MT * ROWS multiply-adds per (c, kx) from
    # (ROWS - 1) * stride + K loads of x
    "05_direct_regtile.reuse": ("multiply-adds per global load on lenet_c3", lambda: _direct_reuse("lenet_c3")),
}

check_answer = partial(checks.check_answer, ANSWERS)

#: The tunables of the exercises whose counter targets are measured at the student's own: the
#: exercise notebook's defaults.
TUNABLES = {
    "05_direct_regtile": {"MT": 4, "ROWS": 3, "BLOCK": 64},
    "05_register_tiles": {"BM": 32, "BN": 64, "BK": 8, "TM": 4, "TN": 8},
}

#: The shapes the exercises' kernels are profiled on: 32 maps (one BM tile), 16 x 16 pixels (four
#: BN tiles), depth C K^2 = 72 (nine BK steps) for the register tiles; ch2.COUNTER_SHAPE for the rest.
COUNTER_SHAPES = {
    "05_direct_regtile": COUNTER_SHAPE,
    "05_register_tiles": Shape(1, 8, 32, 16, 16, 3, 1, 1, why="the counters' shape"),
}


def counter_shape(key: str) -> Workload:
    """The shape exercise `key`'s kernel is profiled on."""
    return COUNTER_SHAPES[key]


def implicit_gemm_owner(BM: int, BN: int, TM: int, TN: int) -> np.ndarray:
    """owner[m, n]: the thread of conv2d_implicit_gemm_reg.cu's block that computes row m, column n
    of its BM×BN tile, by the kernel's store: thread (tm, tn) = (tid / (BN/TN), tid % (BN/TN)) owns
    rows (i/4)·(BM/TM)·4 + tm·4 + i%4 and columns g·(BN/TN)·4 + tn·4 + j (groups of 4, for float4)."""
    owner = -np.ones((BM, BN), int)
    for tid in range(fused.reg_threads(BM, BN, TM, TN)):
        tm, tn = divmod(tid, BN // TN)
        for i in range(TM):
            m = (i // 4) * (BM // TM) * 4 + tm * 4 + i % 4
            for g in range(TN // 4):
                for j in range(4):
                    owner[m, g * (BN // TN) * 4 + tn * 4 + j] = tid
    return owner


def igemm_f32_owner(BM: int, BN: int, WM: int, WN: int, TM: int = 8, TN: int = 8) -> np.ndarray:
    """owner[m, n]: the thread of chapter 9's conv2d_igemm_f32.cu block that computes row m, column n
    of its BM×BN tile, by the kernel's store: warp (tid/32) owns the WM×WN piece at
    ((warp / (BN/WN))·WM, (warp % (BN/WN))·WN); its lane (lm, ln) = (lane / (WN/TN), lane % (WN/TN))
    owns rows wm + (i/4)·(WM/TM)·4 + lm·4 + i%4 and columns wn + g·(WN/TN)·4 + ln·4 + j."""
    owner = -np.ones((BM, BN), int)
    for tid in range(igemm.threads(BM, BN, WM, WN)):
        warp, lane = divmod(tid, 32)
        wm, wn = (warp // (BN // WN)) * WM, (warp % (BN // WN)) * WN
        lm, ln = divmod(lane, WN // TN)
        for i in range(TM):
            m = wm + (i // 4) * (WM // TM) * 4 + lm * 4 + i % 4
            for g in range(TN // 4):
                for j in range(4):
                    owner[m, wn + g * (WN // TN) * 4 + ln * 4 + j] = tid
    return owner


def implicit_gemm_tiles(workload: str = "resnet", thread: int = 0, kernel: str = "reg", sms: int = 132):
    """Figure: one block tile (BM maps × BN pixels) of chapter 5's register-tiled implicit GEMM, with
    the tile sizes gemm_config picks for `workload`; cells coloured by warp, one thread's TM×TN
    outputs outlined. What to see: each thread owns TM×TN outputs, not contiguous but in 4×4
    groups BN/TN·4 columns and BM/TM·4 rows apart (so a quarter-warp's float4 reads are 128
    contiguous bytes); a warp covers two rows of threads; the grid tiles the GEMM
    (M × B·Ho·Wo, reduced over C·K·K in steps of BK). kernel="f32": chapter 9's conv2d_igemm_f32
    with igemm_config's tile for a GPU of `sms` SMs (132: H100, H200): each warp owns a compact
    WM×WN warp tile, its lanes' 8×8 micro-tiles spread over it the same way."""
    s = workloads.get(workload)
    if kernel == "reg":
        cfg = fused.gemm_config(s.M)
        BM, BN, BK, TM, TN = (cfg[k] for k in ("BM", "BN", "BK", "TM", "TN"))
        owner = implicit_gemm_owner(BM, BN, TM, TN)
    elif kernel == "f32":
        cfg = {**igemm.igemm_config(s, sms), "TM": igemm.TM, "TN": igemm.TN}
        BM, BN, BK, TM, TN = (cfg[k] for k in ("BM", "BN", "BK", "TM", "TN"))
        owner = igemm_f32_owner(BM, BN, cfg["WM"], cfg["WN"], TM, TN)
    else:
        raise ValueError(f"kernel={kernel!r}: 'reg' (chapter 5) or 'f32' (chapter 9)")
    nthreads = int(owner.max()) + 1
    N, KD = s.B * s.Ho * s.Wo, s.C * s.K * s.K
    grid = (ceil_div(N, BN), ceil_div(s.M, BM), cfg.get("SPLIT", 1))      # z: chapter 9's split reduction
    colors = np.array([[light(PALETTE[(t // 32) % len(PALETTE)]) for t in row] for row in owner])
    mine = owner == thread
    colors[mine] = PALETTE[(thread // 32) % len(PALETTE)]
    fig, ax = new_figure(height=3.2 if BM <= 64 else 5.0)
    draw_grid(ax, colors, lw=0)
    for (r, c) in zip(*np.nonzero(mine)):
        if r % 4 == 0 and c % 4 == 0:         # the kernel's 4×4 groups (float4 loads and stores)
            outline(ax, r, c, 4, 4, lw=1.2)
    ax.set_xticks(np.arange(0, BN + 1, 16) - 0.5, np.arange(0, BN + 1, 16))
    ax.set_yticks(np.arange(0, BM + 1, 16) - 0.5, np.arange(0, BM + 1, 16))
    ax.tick_params(labelbottom=True, labelleft=True, labelsize=FONT)
    ax.set_xlabel(f"output pixel within the tile (BN = {BN})", fontsize=FONT)
    ax.set_ylabel(f"map (BM = {BM})", fontsize=FONT)
    nwarps = nthreads // 32
    name = "conv2d_implicit_gemm_reg" if kernel == "reg" else "conv2d_igemm_f32"
    ax.set_title(f"{name}, {workload}: block tile {BM}×{BN}, {nwarps} warps (colours), thread {thread}'s {TM}×{TN} outputs dark\n"
                 f"grid {grid[0]:,}×{grid[1]}×{grid[2]} blocks over M={s.M} × B·Ho·Wo={N:,}; C·K·K={KD} in steps of BK={BK}",
                 fontsize=FONT + 1)
    fig.convlab_data = {"workload": workload, "kernel": kernel, "config": cfg, "owner": owner, "grid": grid,
                        "N": N, "KD": KD, "threads": nthreads}
    return fig


def direct_regtile_thread(workload: str = "lenet_c1") -> dict:
    """Per output (h, w) of image 0, the thread of conv2d_direct_regtile.cu that computes it, by the
    kernel's indexing: thread t = blockIdx.x·BLOCK + threadIdx.x takes column t % Wo and the strip
    of ROWS rows (t / Wo) % ceil(Ho/ROWS), for MT maps (blockIdx.y picks the group)."""
    s = workloads.get(workload)
    cfg = fused.regtile_config(s.M, s.C, s.K)
    rows = cfg["ROWS"]
    strips = ceil_div(s.Ho, rows)
    thread = -np.ones((s.Ho, s.Wo), int)
    for t in range(strips * s.Wo):                      # image 0's threads
        ox, strip = t % s.Wo, t // s.Wo
        thread[strip * rows:min(s.Ho, (strip + 1) * rows), ox] = t
    return {"workload": workload, "config": cfg, "thread": thread, "accumulators": cfg["MT"] * rows}


def direct_regtile_outputs(workload: str = "lenet_c1", blocks: int = 2):
    """Figure: one output map of image 0 for `workload`, each output coloured by the warp of chapter
    5's register-tiled direct kernel that computes it (the first `blocks` blocks; MT, ROWS, BLOCK
    from regtile_config), thread 0's outputs outlined. What to see: a thread computes ROWS rows of
    one column, for MT maps at once (MT·ROWS accumulators); the 32 lanes of a warp are 32
    consecutive columns, so its loads and stores coalesce, and a warp wraps to the next strip of
    rows where a row ends."""
    d = direct_regtile_thread(workload)
    cfg, thread = d["config"], d["thread"]
    warp = np.where((thread >= 0) & (thread < blocks * cfg["BLOCK"]), thread // 32, -1)
    last = int(np.nonzero((warp >= 0).any(axis=1))[0].max())
    warp = warp[:min(warp.shape[0], last + 1 + cfg["ROWS"])]       # the rows the blocks reach, and one strip more
    fig, ax = new_figure(height=3.4)
    draw_grid(ax, by_index(warp, empty=(1, 1, 1)), lw=0)
    for k in range(warp.max() + 1):         # label each warp in the first strip it reaches
        r, c = np.nonzero(warp == k)
        first = r < r.min() + cfg["ROWS"]
        ax.text(c[first].mean(), r[first].mean(), f"warp {k}", ha="center", va="center", fontsize=FONT)
    outline(ax, 0, 0, cfg["ROWS"], 1, color="white", lw=2)
    ticks = np.arange(0, thread.shape[1] + 1, 16)
    ax.set_xticks(ticks - 0.5, ticks)
    ticks = np.arange(0, warp.shape[0] + 1, cfg["ROWS"])
    ax.set_yticks(ticks - 0.5, ticks)
    ax.tick_params(labelbottom=True, labelleft=True, labelsize=FONT)
    ax.set_xlabel("output column", fontsize=FONT)
    ax.set_ylabel("output row", fontsize=FONT)
    ax.set_title(f"{workload}: the first {blocks} blocks of {cfg['BLOCK']} threads, by warp (colour); a thread: ROWS={cfg['ROWS']} "
                 f"rows × 1 column\n× MT={cfg['MT']} maps = {d['accumulators']} accumulators (thread 0 outlined)",
                 fontsize=FONT + 1)
    fig.convlab_data = d
    return fig


def _direct_regtile_targets(shape: Workload, MT: int, ROWS: int, BLOCK: int) -> Targets:
    """Exercise 5.3: chapter 5's conv2d_direct_regtile with the same MT, ROWS and BLOCK on the shape."""
    quantities = ("shared loads per multiply-add", "global load bytes per multiply-add")
    got = conv_counters(lambda x, w, y, **kw: fused.conv2d_direct_regtile(x, w, y, MT=MT, ROWS=ROWS, BLOCK=BLOCK,
                                                                             **kw), shape, quantities)
    t = Targets({q: round_up(v) for q, v in got.items()})
    t.source = f"chapter 5's conv2d_direct_regtile with MT={MT}, ROWS={ROWS}, BLOCK={BLOCK} on the same shape"
    return t


def _register_tile_targets(shape: Workload, BM: int, BN: int, BK: int, TM: int, TN: int) -> Targets:
    """Exercise 5.2: the shared values the exercise's loop loads with these tunables, per
    multiply-add of the shape: each thread's TM + TN values of a step kk feed its TM·TN
    multiply-adds, over every block of (BM/TM)·(BN/TN) threads and every step of BK."""
    N, KD = shape.B * shape.Ho * shape.Wo, shape.C * shape.K * shape.K
    blocks = -(-N // BN) * -(-shape.M // BM)
    threads, steps = (BM // TM) * (BN // TN), -(-KD // BK)
    t = Targets({"shared loads per multiply-add": round_up(blocks * threads * steps * BK * (TM + TN) / multiply_adds(shape))})
    t.source = (f"the micro-tile's loop with BM={BM}, BN={BN}, BK={BK}, TM={TM}, TN={TN}: each thread's "
                f"TM + TN = {TM + TN} values per step kk for TM·TN = {TM * TN} multiply-adds, on {blocks} "
                f"block{'s' if blocks > 1 else ''} of {threads} threads and {steps} steps of BK on the same shape")
    return t


def check_targets(key: str, **tunables) -> Targets:
    """The counter targets of exercise 5.2 ("05_register_tiles": timed on a GPU against the chapter's
    register-tiled implicit GEMM on resnet) or 5.3 ("05_direct_regtile"), measured now on the
    emulator on counter_shape(key) at the tunables given (check_targets("05_direct_regtile", MT=8,
    ROWS=2, BLOCK=128); the exercise's own, TUNABLES, for those left out) and made again by
    check_counters for another shape."""
    derive = {"05_direct_regtile": _direct_regtile_targets, "05_register_tiles": _register_tile_targets}[key]
    compare = ("resnet", fused.IMPLICIT_GEMM_REG) if key == "05_register_tiles" else None
    return measured_targets(key, derive, counter_shape(key), TUNABLES[key], tunables, compare)


def _layer_text(shape) -> str:
    return (f"C={shape.C}, K={shape.K}, M={shape.M}, {shape.Ho}×{shape.Wo} output pixels per image, "
            f"B={shape.B}")


def check_pick(pick, times: dict, layers: dict, *, device: str) -> Verdict:
    """A dispatcher rule against measured times. pick(shape) returns the name of a kernel (or an Impl);
    times[layer][kernel] is the time (ms) measured on `device` of each kernel that took that layer;
    layers[layer] is the layer's shape (a Workload). Says on which layers the rule picks a slower
    kernel than the fastest measured, and how much slower."""
    kernels = list(dict.fromkeys(k for ms in times.values() for k in ms))
    slower, total, best_total = [], 0.0, 0.0
    for layer, shape in layers.items():
        measured = times[layer]
        try:
            choice = pick(shape)
        except Exception as e:  # noqa: BLE001 (a check must never stop the notebook)
            return say(False, f"✗ {layer}: {describe_error(e)}")
        if choice is None:
            todo = todo_left(pick)
            return say(False, f"not done yet: {todo} is still there" if todo else
                               f"✗ your rule returned None for {layer}: does every path end in `return` a kernel's name?")
        choice = getattr(choice, "name", choice)
        if choice not in kernels:
            return say(False, f"✗ {layer}: your rule returned {choice!r}, which is none of the kernels: "
                               + ", ".join(repr(k) for k in kernels))
        if choice not in measured:
            return say(False, f"✗ {layer} ({_layer_text(shape)}): your rule picks {choice!r}, which does not "
                               f"take this layer (it was not measured on it); the kernels that do: "
                               + ", ".join(repr(k) for k in measured))
        best = min(measured, key=measured.get)
        total, best_total = total + measured[choice], best_total + measured[best]
        if measured[choice] > measured[best]:
            slower.append(f"{layer} ({_layer_text(shape)}): your rule picks {choice!r}, "
                          f"{measured[choice]:.4g} ms; {best!r} takes {measured[best]:.4g} ms, "
                          f"{measured[choice] / measured[best]:.2f}× faster")
    if slower:
        return say(False, f"✗ on {len(slower)} of {len(layers)} layers your rule picks a slower kernel than the "
                           f"fastest measured on {device}:\n  " + "\n  ".join(slower)
                           + f"\n  all {len(layers)} layers: {total:.4g} ms with your rule, {best_total:.4g} ms "
                             f"with the fastest kernel of each")
    return say(True, f"✓ correct: your rule picks the fastest kernel measured on {device} on all "
                      f"{len(layers)} layers ({best_total:.4g} ms in all)")
