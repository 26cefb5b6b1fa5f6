"""The course's mapping diagrams: which thread, block, register or kernel touches what.

Each function returns a matplotlib Figure whose numbers come from the code that launches the
kernel (the launchers' grid functions and config functions in convlab.ops, the kernels' own
index arithmetic) or from running a tiny kernel, so a diagram cannot disagree with the code. The
data each figure draws is attached to it as ``fig.convlab_data`` (a dict), which the tests check.

- grid_maps: chapter 2's three thread-to-output maps (run on the backend), and grid z's limit;
- im2col_matrix, im2col_gemm_tiles: chapter 4's unrolled matrix (run on the backend) and the
  tiled GEMM's wasted multiply-adds on a few-map layer;
- implicit_gemm_tiles, direct_regtile_outputs: chapter 5's block, warp and thread tiles;
- wmma_tiles: chapter 6's 16×16×16 WMMA fragments over the implicit GEMM, and the share of their
  multiply-adds that is useful on a layer;
- mma_fragments, ldmatrix_lanes: chapters 6 and 9, which lane holds which element of mma.sync
  m16n8k16's operands, and which lane gives and gets each row of ldmatrix (run);
- conv3d_window: chapter 7's rolling window of outputs along z;
- dx_gather_scatter, dw_reduction: chapter 8's transposed convolution and weight-gradient sum;
- groups_dilation: chapter 9's grouped weights and dilated taps;
- fused_epilogue: chapter 10's conv + bias + activation + pool in one kernel against three;
- network_timeline: chapter 10's whole network, op after op, as a profiler's timeline.

No figure measures a time; network_timeline draws the measured times it is given.
"""
from __future__ import annotations

from pathlib import Path

# Before any kernel is loaded (see convlab.plots): matplotlib's extension fails to import after the
# emulator's runtime library is loaded with RTLD_GLOBAL.
import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns
from matplotlib.patches import Rectangle

import convlab as cl

from . import workloads
from ._limits import GRID_YZ_MAX
from .ops import backprop, ceil_div, conv3d, fp16, fused, igemm, im2col, layers, naive

ROOT = Path(__file__).resolve().parent.parent
WIDTH = 7.5          # inches: ~780 px at 110 dpi
FONT = 9
PALETTE = sns.color_palette("colorblind")
GREY = (0.85, 0.85, 0.85)


def _figure(nrows=1, ncols=1, height=3.4, **kw):
    fig, axes = plt.subplots(nrows, ncols, figsize=(WIDTH, height), dpi=110, layout="constrained", **kw)
    return fig, axes


def _grid(ax, colors, labels=None, *, fontsize=FONT, title=None, lw=0.5):
    """Draw a 2-D array of RGB colours as cells (row 0 at the top), with optional text per cell."""
    colors = np.asarray(colors, float)
    rows, cols = colors.shape[:2]
    ax.imshow(colors, interpolation="nearest", aspect="equal")
    ax.set_xticks(np.arange(-0.5, cols, 1), minor=True)
    ax.set_yticks(np.arange(-0.5, rows, 1), minor=True)
    ax.grid(which="minor", color="white", lw=lw)
    ax.tick_params(which="both", length=0, labelbottom=False, labelleft=False)
    ax.set_xticks([])
    ax.set_yticks([])
    if labels is not None:
        for (r, c), s in np.ndenumerate(labels):
            if s != "":
                ax.text(c, r, s, ha="center", va="center", fontsize=fontsize)
    if title:
        ax.set_title(title, fontsize=FONT + 1)


def _outline(ax, r0, c0, h, w, color="black", lw=2.0):
    ax.add_patch(Rectangle((c0 - 0.5, r0 - 0.5), w, h, fill=False, ec=color, lw=lw, zorder=3))


def _by_index(ids, palette=PALETTE, empty=GREY):
    """Colours for an integer array: palette[id % len], empty where id < 0."""
    ids = np.asarray(ids)
    out = np.empty(ids.shape + (3,))
    for idx, v in np.ndenumerate(ids):
        out[idx] = empty if v < 0 else palette[int(v) % len(palette)]
    return out


def _light(c, f=0.55):
    return tuple(1 - f * (1 - np.asarray(c)))


# ---- chapter 2: the naive kernel's three grids -------------------------------------------------

# The patched store: each output receives the linear index of the block and of the thread that wrote it.
_WHO = "(float)((blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z)) * 1024 " \
       "+ threadIdx.x + blockDim.x * threadIdx.y)"


def _who_kernels():
    """conv2d_naive.cu with every output store replaced by the writer's (block, thread) index."""
    src = (ROOT / naive.KERNEL_FILE).read_text()
    store = "y[((b * M + m) * Ho + h) * Wo + w] = acc;"
    if src.count(store) != 2 or src.count("y[i] = acc;") != 1:
        raise RuntimeError(f"{naive.KERNEL_FILE}: the output stores changed; update convlab.diagrams")
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
    fig, axes = _figure(3, B * M, height=6.4)
    titles = {"z": f"grid z: ({', '.join(map(str, data['z']['grid']))}), block {block[0]}×{block[1]}",
              "flat": f"flat: {data['flat']['grid'][0]} blocks of {flat_block}",
              "textbook": f"textbook: ({', '.join(map(str, data['textbook']['grid']))}), block {block[0]}×{block[1]}"}
    for row, name in enumerate(("z", "flat", "textbook")):
        ids = data[name]["block_id"]
        for b in range(B):
            for m in range(M):
                ax = axes[row, b * M + m]
                _grid(ax, _by_index(ids[b, m]), ids[b, m].astype(str), title=f"b={b}, m={m}")
        axes[row, 0].text(-0.08, 0.5, titles[name], transform=axes[row, 0].transAxes, rotation=90,
                          ha="right", va="center", fontsize=FONT)
    fig.suptitle("Which block computes each output (number = block index)", fontsize=FONT + 2)
    fig.text(0.5, -0.02, f"{limit_workload}: grid z would need B·M = {shape.B:,}·{shape.M} = {z_blocks:,} blocks "
             f"on z, over the limit of {GRID_YZ_MAX:,}: the launch fails.", ha="center", va="top", fontsize=FONT)
    fig.convlab_data = {**data, "limit": {"workload": limit_workload, "z_blocks": z_blocks, "max": GRID_YZ_MAX}}
    return fig


# ---- chapter 4: im2col -------------------------------------------------------------------------

def im2col_matrix(H: int = 5, W: int = 5, K: int = 3, column: int = 4):
    """Figure: a one-channel H×W input whose pixels are numbered 1..H·W, beside the unrolled matrix U
    (K·K rows, Ho·Wo columns) that chapter 4's im2col kernel writes from it (run on the backend).
    What to see: column `column` of U is the K×K window under output pixel `column` (row-major),
    read row by row; neighbouring columns repeat most of the same pixels, so U is about K² times
    the input."""
    import torch
    x = cl.to_device(torch.arange(1, H * W + 1, dtype=torch.float32).reshape(1, 1, H, W))
    U = im2col.unroll(x, K)[0].cpu().numpy().astype(int)
    Wo = W - K + 1
    oy, ox = divmod(column, Wo)
    fig, (a, b) = _figure(1, 2, height=3.3, gridspec_kw={"width_ratios": [H + 1, U.shape[1]]})
    xin = np.arange(1, H * W + 1).reshape(H, W)
    win = np.zeros((H, W), bool)
    win[oy:oy + K, ox:ox + K] = True
    _grid(a, [[PALETTE[1] if win[r, c] else GREY for c in range(W)] for r in range(H)], xin.astype(str),
          title=f"input {H}×{W}")
    col = np.zeros(U.shape, bool)
    col[:, column] = True
    _grid(b, [[PALETTE[1] if col[r, c] else GREY for c in range(U.shape[1])] for r in range(U.shape[0])],
          U.astype(str), title=f"U: {U.shape[0]} rows (C·K·K) × {U.shape[1]} columns (Ho·Wo)")
    b.set_xticks(range(U.shape[1]))
    b.tick_params(labelbottom=True, labelsize=FONT)
    b.set_xlabel("output pixel (column of U)", fontsize=FONT)
    fig.suptitle(f"im2col: output pixel {column}'s {K}×{K} window becomes column {column} of U", fontsize=FONT + 2)
    fig.convlab_data = {"x": xin, "U": U, "column": column, "window": (oy, ox, K)}
    return fig


def im2col_gemm_geometry(workload: str = "lenet_c1") -> dict:
    """The tiled GEMM W (M × C·K·K) · U (C·K·K × Ho·Wo) as chapter 4's launcher runs it: TILE from the
    launcher's config; each TILE×TILE block of outputs covers TILE maps and walks the reduction in
    steps of TILE, multiplying zeros where M or C·K·K fall short of whole tiles (Ho·Wo is taken as
    whole tiles: the waste there is at most one ragged tile per image)."""
    s = workloads.get(workload)
    tile = im2col.IM2COL_GEMM.config(s)["TILE"]
    KD = s.C * s.K * s.K
    rows, depth = ceil_div(s.M, tile) * tile, ceil_div(KD, tile) * tile
    useful = s.M * KD / (rows * depth)
    return {"workload": workload, "tile": tile, "M": s.M, "KD": KD, "padded": (rows, depth),
            "steps": depth // tile, "useful_fraction": useful, "waste": 1 / useful}


def im2col_gemm_tiles(workload: str = "lenet_c1"):
    """Figure: the weights W (M rows, C·K·K columns) as one block of chapter 4's tiled GEMM sees them:
    TILE rows of maps and the reduction in steps of TILE, for `workload`. What to see: on lenet_c1
    only M=4 of 16 rows and 49 of 64 reduction steps hold data; the block does every multiply-add
    of the 16×64 area anyway, so only (4·49)/(16·64) = 19% of them are useful: 5.2× the work."""
    g = im2col_gemm_geometry(workload)
    rows, depth = g["padded"]
    cells = np.empty((rows, depth, 3))
    cells[:] = GREY
    cells[:g["M"], :g["KD"]] = PALETTE[0]
    fig, ax = _figure(height=2.6)
    _grid(ax, cells, lw=0.3)
    for t in range(g["steps"]):
        _outline(ax, 0, t * g["tile"], g["tile"], g["tile"], lw=1.5)
        ax.text(t * g["tile"] + g["tile"] / 2 - 0.5, rows + 0.6, f"step {t}", ha="center", va="top", fontsize=FONT)
    ax.set_ylim(rows + 2.5, -0.5)
    ax.set_ylabel(f"{g['tile']} rows: maps", fontsize=FONT)
    ax.set_xlabel(f"the reduction, C·K·K = {g['KD']}, in steps of {g['tile']}", fontsize=FONT)
    ax.set_title(f"{workload}: W is {g['M']}×{g['KD']}; the GEMM's {g['tile']}×{g['tile']} tiles cover {rows}×{depth}: "
                 f"{g['useful_fraction']:.0%} useful ({g['waste']:.1f}× the work)", fontsize=FONT + 1)
    ax.legend(handles=[Rectangle((0, 0), 1, 1, color=PALETTE[0]), Rectangle((0, 0), 1, 1, color=GREY)],
              labels=["weights (useful)", "zeros (padding of the tile)"], loc="upper center",
              bbox_to_anchor=(0.5, -0.18), ncol=2, fontsize=FONT, frameon=False)
    fig.convlab_data = g
    return fig


# ---- chapter 5: implicit GEMM and direct register tiles -----------------------------------------

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
    colors = np.array([[_light(PALETTE[(t // 32) % len(PALETTE)]) for t in row] for row in owner])
    mine = owner == thread
    colors[mine] = PALETTE[(thread // 32) % len(PALETTE)]
    fig, ax = _figure(height=3.2 if BM <= 64 else 5.0)
    _grid(ax, colors, lw=0)
    for (r, c) in zip(*np.nonzero(mine)):
        if r % 4 == 0 and c % 4 == 0:         # the kernel's 4×4 groups (float4 loads and stores)
            _outline(ax, r, c, 4, 4, lw=1.2)
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
    fig, ax = _figure(height=3.4)
    _grid(ax, _by_index(warp, empty=(1, 1, 1)), lw=0)
    for k in range(warp.max() + 1):         # label each warp in the first strip it reaches
        r, c = np.nonzero(warp == k)
        first = r < r.min() + cfg["ROWS"]
        ax.text(c[first].mean(), r[first].mean(), f"warp {k}", ha="center", va="center", fontsize=FONT)
    _outline(ax, 0, 0, cfg["ROWS"], 1, color="white", lw=2)
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


# ---- chapter 6: WMMA's 16x16x16 fragments over the implicit GEMM ---------------------------------

def wmma_geometry(workload: str = "lenet_c1") -> dict:
    """The 16×16×16 tiles of the WMMA kernel chapter 6's pick() runs on `workload`, from the
    launchers' configs: which rows and columns of one mma_sync's A, B and C fragments hold data
    (the first fragment of a tile), and over the whole layer the multiply-adds the tensor cores do
    against the useful ones (M·C·K² per output).
    - conv2d_wmma (implicit GEMM): A = 16 maps × 16 of the reduction C·K², B = 16 of the reduction
      × 16 pixels, C = 16 maps × 16 pixels; the grid covers ceil(M/BM)·BM maps, ceil(N/BN)·BN
      pixels and the reduction in steps of BK.
    - conv2d_wmma_smallc: A = 16 outputs × 16 columns (tap kx, channel: K·CP used, CP = C rounded
      up to 1, 2, 4 or 8), B = those 16 columns × 16 maps, C = 16 outputs × 16 maps; per output
      position (ceil(BAND·RP/QT)·QT positions per band, RP ≥ W + 2·padding, only Wo of each row
      kept) 16 maps per group × K rows × JC·16 columns."""
    s = workloads.get(workload)
    impl = fp16.pick(s)
    useful = s.B * s.Ho * s.Wo * s.M * s.C * s.K * s.K
    a, b, c = (np.zeros((16, 16), bool) for _ in range(3))
    if impl is fp16.WMMA_SMALLC:
        cfg = fp16.smallc_config(s.C, s.K, s.H, s.W, s.padding)
        cp = fp16._cp(s.C)
        nph, jc = 8 // cp, ceil_div(s.K * cp, 16)
        qt = 16 * nph
        bands = ceil_div(s.Ho, cfg["BAND"])
        positions = bands * ceil_div(cfg["BAND"] * cfg["RP"], qt) * qt
        issued = s.B * positions * ceil_div(s.M, 16) * 16 * s.K * jc * 16
        cols = np.array([(j % cp < s.C) and (j // cp < s.K) for j in range(16)])
        maps = np.arange(16) < min(16, s.M)
        a[:, cols] = True
        b[np.ix_(cols, maps)] = True
        c[:, maps] = True
        axes = (("outputs", "tap kx × channel"), ("tap kx × channel", "maps"), ("outputs", "maps"))
        extra = {"RP": cfg["RP"], "CP": cp, "JC": jc, "positions_per_image": positions}
    else:
        cfg = fp16.wmma_config(s.M, s.C, s.K)
        KD, N = s.C * s.K * s.K, s.B * s.Ho * s.Wo
        issued = (ceil_div(s.M, cfg["BM"]) * cfg["BM"]) * (ceil_div(KD, cfg["BK"]) * cfg["BK"]) * \
                 (ceil_div(N, cfg["BN"]) * cfg["BN"])
        rows, depth = np.arange(16) < min(16, s.M), np.arange(16) < min(16, KD)
        a[np.ix_(rows, depth)] = True
        b[depth, :] = True
        c[rows, :] = True
        axes = (("maps", "reduction (C·K²)"), ("reduction (C·K²)", "pixels"), ("maps", "pixels"))
        extra = {}
    return {"workload": workload, "kernel": impl.name, "config": cfg, "A": a, "B": b, "C": c, "axes": axes,
            "issued": issued, "useful": useful, "useful_fraction": useful / issued, **extra}


def wmma_tiles(workloads_=("lenet_c1", "resnet")):
    """Figure: for each workload, one mma_sync of the WMMA kernel chapter 6's pick() runs on it: its
    16×16 A and B fragments and the 16×16 accumulator C, cells that hold data coloured, zero padding
    grey; the title gives the share of all the layer's tensor-core multiply-adds that is useful.
    What to see: on lenet_c1 (C=1, M=4, K=7) only 7 of A's 16 columns and 4 of the 16 maps hold
    data, and with the rows' padding about 9% of the multiply-adds are useful; resnet fills every
    fragment."""
    geos = [wmma_geometry(w) for w in workloads_]
    fig = plt.figure(figsize=(WIDTH, 2.7 * len(geos)), dpi=110, layout="constrained")
    for sub, g in zip(np.atleast_1d(fig.subfigures(len(geos), 1)), geos):
        sub.suptitle(f"{g['workload']}, {g['kernel']}: {g['useful_fraction']:.0%} of the tensor cores' "
                     "multiply-adds are useful", fontsize=FONT + 1)
        for ax, name, (ylab, xlab) in zip(sub.subplots(1, 3), "ABC", g["axes"]):
            colors = np.empty((16, 16, 3))
            colors[:] = GREY
            colors[g[name]] = PALETTE[{"A": 0, "B": 1, "C": 2}[name]]
            _grid(ax, colors, lw=0.3)
            ax.set_title({"A": "A (16×16)", "B": "B (16×16)", "C": "C += A·B (float)"}[name], fontsize=FONT + 1)
            ax.set_xlabel(xlab, fontsize=FONT)
            ax.set_ylabel(ylab, fontsize=FONT)
    fig.convlab_data = {g["workload"]: g for g in geos}
    return fig


# ---- chapters 6 and 9: mma.sync fragments --------------------------------------------------------

FRAGMENTS_FILE = "kernels/09_general/mma_fragments.cu"


def mma_fragment_maps() -> dict:
    """Which element of the m16n8k16 operands each lane holds, found by running
    kernels/09_general/mma_fragments.cu on the backend: A (16×16) loaded by ldmatrix_x4 and B (16×8,
    k-major) by ldmatrix_x2_trans as the course's kernels load them, each element's code (row·cols
    + col) in its 16 bits; then C/D from mma.sync itself: A = identity and B = the codes, so D = B
    arrives in D's layout. Returns {"A": (32, 8, 2), "B": (32, 4, 2), "D": (32, 4, 2)} arrays of
    (row, col) per lane and element (element e is register e//2, its low half first)."""
    import torch
    mod = cl.load(FRAGMENTS_FILE)

    def ldmatrix(rows, variant):
        out = cl.to_device(torch.full((32, 4), -1, dtype=torch.int32))
        mod.ldmatrix_lanes(cl.to_device(torch.from_numpy(rows.astype(np.uint16).view(np.int16))),
                           cl.to_device(torch.arange(32, dtype=torch.int32)), out, variant, grid=1, block=32)
        return out.cpu().numpy().view(np.uint32)

    def halves(regs, n):
        return np.stack([regs[:, :n] & 0xFFFF, regs[:, :n] >> 16], axis=-1).reshape(32, 2 * n)

    # A: lane l passes row l % 16, columns 8·(l / 16) .. +7 (matrices 0..3 = the four 8×8 quarters)
    a_code = np.arange(256).reshape(16, 16)
    rows = np.stack([a_code[l % 16, 8 * (l // 16):8 * (l // 16) + 8] for l in range(32)])
    a = halves(ldmatrix(rows, 2), 4)
    # B (k × n, row-major k-major): lanes 0..15 pass rows k = 0..15; .trans gives the column-major fragments
    b_code = np.arange(128).reshape(16, 8)
    rows = np.concatenate([b_code, np.zeros((16, 8), int)])
    b = halves(ldmatrix(rows, 4), 2)

    def place(regs_map, values):
        """Registers per lane holding values[code] as fp16 where regs_map (32, e) puts each code."""
        h = values.astype(np.float16).view(np.uint16).astype(np.uint32)[regs_map]
        return (h[:, 0::2] | (h[:, 1::2] << 16)).astype(np.uint32)

    ra = place(a, np.eye(16).reshape(-1))
    rb = place(b, np.arange(128, dtype=float))
    d = cl.to_device(torch.zeros((32, 4), dtype=torch.float32))
    mod.mma_lanes(cl.to_device(torch.from_numpy(ra.view(np.int32))), cl.to_device(torch.from_numpy(rb.view(np.int32))),
                  cl.to_device(torch.zeros((32, 4), dtype=torch.float32)), d, 0, grid=1, block=32)
    dcode = d.cpu().numpy().round().astype(int)
    return {"A": np.stack(divmod(a, 16), -1), "B": np.stack(divmod(b, 8), -1), "D": np.stack(divmod(dcode, 8), -1)}


def mma_fragments():
    """Figure: the three operands of mma.sync.m16n8k16 (A 16×16, B 16×8, C/D 16×8), each element
    labelled with the lane that holds it and coloured by the lane's group (lane / 4), as the
    emulator's mma_fragments.cu reports them (the same layout the GPU tests check against). What to
    see: a group of four lanes shares a row of A and of C/D (and rows g and g+8), its lanes taking
    consecutive pairs of columns; in B the roles turn: a group holds a column. WMMA's 16×16×16
    fragments have no documented layout (the emulator keeps each lane a whole copy), which is why
    the course's chapter 9 kernels move to mma.sync."""
    maps = mma_fragment_maps()
    fig, axes = _figure(1, 3, height=3.7, gridspec_kw={"width_ratios": [16, 8, 8]})
    for ax, name, shape, title in zip(axes, ("A", "B", "D"), ((16, 16), (16, 8), (16, 8)),
                                      ("A (16×16, row × k)", "B (16×8, k × col)", "C and D (16×8)")):
        lane = -np.ones(shape, int)
        for l in range(32):
            for r, c in maps[name][l]:
                lane[r, c] = l
        _grid(ax, _by_index(lane // 4, [_light(c, 0.6) for c in sns.color_palette("colorblind", 8)]), lane.astype(str),
              title=title,
              fontsize=FONT)
    fig.suptitle("mma.sync m16n8k16: the lane that holds each element (colour: lane / 4)", fontsize=FONT + 2)
    fig.convlab_data = maps
    return fig


def ldmatrix_lanes():
    """Figure: ldmatrix as the course's mma kernels use it, from the same run as mma_fragments. Left,
    ldmatrix.x4 loading A (16×16 halves in shared memory): lane l gives the address of one 8-half
    row (row l % 16, the left half for l < 16, the right half otherwise; the tick labels), each
    8×8 quarter is one of the four matrices (colour), and each element is labelled with the lane
    that receives it. Right, ldmatrix.x2.trans loading B (16×8, k-major): lanes 0–15 give the row
    addresses, and .trans hands each lane a column pair instead of a row pair. What to see: the
    lane that names an address is not the lane that gets its data; every lane receives two
    neighbouring halves of one row (x4) or of one column (.trans) per matrix, which is exactly
    the fragment mma.sync expects."""
    maps = mma_fragment_maps()
    fig, (a, b) = _figure(1, 2, height=4.2, gridspec_kw={"width_ratios": [16, 8]})
    recv = -np.ones((16, 16), int)
    for l in range(32):
        for r, c in maps["A"][l]:
            recv[r, c] = l
    quarter = (np.arange(16)[:, None] // 8) + 2 * (np.arange(16)[None, :] // 8)
    _grid(a, [[_light(PALETTE[q], 0.6) for q in row] for row in quarter], recv.astype(str),
          title="ldmatrix.x4: A, four 8×8 matrices")
    a.set_yticks(range(16), [f"{r}" for r in range(16)], fontsize=FONT)
    a.tick_params(labelleft=True)
    a.set_ylabel("address from lane (left half)", fontsize=FONT)
    right = a.secondary_yaxis("right")
    right.set_yticks(range(16), [f"{r + 16}" for r in range(16)], fontsize=FONT)
    right.set_ylabel("(right half)", fontsize=FONT)
    recv = -np.ones((16, 8), int)
    for l in range(32):
        for r, c in maps["B"][l]:
            recv[r, c] = l
    _grid(b, [[_light(PALETTE[r // 8], 0.6) for _ in range(8)] for r in range(16)], recv.astype(str),
          title="ldmatrix.x2.trans: B (k × n)")
    b.set_yticks(range(16), [f"{k}" for k in range(16)], fontsize=FONT)
    b.tick_params(labelleft=True)
    b.set_ylabel("address from lane", fontsize=FONT)
    fig.suptitle("ldmatrix: the lane that receives each element (cell text)", fontsize=FONT + 2)
    fig.convlab_data = maps
    return fig


# ---- chapter 7: the rolling window of conv3d_coarse ----------------------------------------------

def conv3d_window(workload: str = "conv3d"):
    """Figure: one thread of chapter 7's coarse 3D kernel walking down z, with the ZC output planes per
    block that coarse_config picks for `workload`: a row per output plane of the block, a column
    per input plane read; a cell is marked where the plane feeds that output (the KZ accumulators
    held at that time, for each of the thread's TX·TY output columns) and dark where the output is
    complete and stored. What to see: each input
    plane is read once and feeds KZ outputs at once; the window of KZ registers rolls one plane per
    step; a block reads ZC+KZ−1 planes for ZC outputs, against KZ planes per output plane naively."""
    s = workloads.get(workload)
    cfg = conv3d.coarse_config(s.D, s.H, s.W, s.K, s.K, s.K)
    ZC, KZ = cfg["ZC"], s.K
    planes = ZC + KZ - 1
    cells = np.empty((ZC, planes, 3))
    cells[:] = (1, 1, 1)
    held = np.zeros((ZC, planes), bool)
    for oz in range(ZC):
        held[oz, oz:oz + KZ] = True
        cells[oz, oz:oz + KZ - 1] = _light(PALETTE[0])
        cells[oz, oz + KZ - 1] = PALETTE[0]
    fig, ax = _figure(height=4.6)
    _grid(ax, cells, lw=0.3)
    ax.set_xticks(range(0, planes, 4))
    ax.set_yticks(range(0, ZC, 4))
    ax.tick_params(labelbottom=True, labelleft=True, labelsize=FONT)
    ax.set_xlabel("input plane read (one per step)", fontsize=FONT)
    ax.set_ylabel("output plane of the block", fontsize=FONT)
    per_output = planes / ZC
    ax.set_title(f"{workload}: K={KZ}, ZC={ZC} outputs per block: {planes} planes read, {per_output:.2f} per output "
                 f"(naive: {KZ})", fontsize=FONT + 1)
    ax.legend(handles=[Rectangle((0, 0), 1, 1, color=_light(PALETTE[0])), Rectangle((0, 0), 1, 1, color=PALETTE[0])],
              labels=["accumulating in a register", "complete: stored, window rolls"], loc="upper center",
              bbox_to_anchor=(0.5, -0.12), ncol=2, fontsize=FONT, frameon=False)
    fig.convlab_data = {"workload": workload, "config": cfg, "held": held, "planes_read": planes,
                        "planes_per_output": per_output, "naive_planes_per_output": KZ,
                        "window": int(held.sum(axis=0).max()), "accumulators": KZ * cfg["TX"] * cfg["TY"]}
    return fig


# ---- chapter 8: the backward pass -----------------------------------------------------------------

def dx_geometry(H: int = 6, W: int = 6, K: int = 3, stride: int = 1, padding: int = 0, at=(2, 3), source=(1, 1)) -> dict:
    """The transposed convolution's index sets: gather[(iy, ix)] = [(oy, ox, ky, kx)] (the dy cells
    dx[iy][ix] sums, with the tap of the unflipped mask each is multiplied by: the flipped mask's
    (K-1-ky, K-1-kx)), scatter[(oy, ox)] = [(iy, ix, ky, kx)] and writers[iy, ix] = how many dy cells
    add into that dx cell (the collisions the scatter kernel resolves with atomicAdd)."""
    Ho, Wo = (H + 2 * padding - K) // stride + 1, (W + 2 * padding - K) // stride + 1
    gather, scatter = {}, {}
    writers = np.zeros((H, W), int)
    for oy in range(Ho):
        for ox in range(Wo):
            for ky in range(K):
                for kx in range(K):
                    iy, ix = oy * stride + ky - padding, ox * stride + kx - padding
                    if 0 <= iy < H and 0 <= ix < W:
                        gather.setdefault((iy, ix), []).append((oy, ox, ky, kx))
                        scatter.setdefault((oy, ox), []).append((iy, ix, ky, kx))
                        writers[iy, ix] += 1
    return {"H": H, "W": W, "Ho": Ho, "Wo": Wo, "K": K, "stride": stride, "padding": padding, "at": at,
            "source": source, "gather": gather, "scatter": scatter, "writers": writers}


def dx_gather_scatter(H: int = 6, W: int = 6, K: int = 3, stride: int = 1, padding: int = 0, at=(2, 3), source=(1, 1)):
    """Figure: dE/dX two ways (conv2d_dx_gather.cu and conv2d_dx_scatter.cu). Left, gather: the dy
    cells that dx cell `at` sums, each labelled with the tap of the flipped mask it is multiplied
    by. Middle, scatter: the dx cells dy cell `source` adds into (the mask's taps). Right: how many
    dy cells add into each dx cell. What to see: the gather thread reads a K×K window of dy and
    writes one dx value; the scatter thread writes K² dx values, and up to K² threads write the same
    dx cell, hence atomicAdd (and a result whose float rounding depends on their order)."""
    g = dx_geometry(H, W, K, stride, padding, at, source)
    Ho, Wo = g["Ho"], g["Wo"]
    fig, axes = _figure(1, 3, height=3.0, gridspec_kw={"width_ratios": [Wo, W, W]})
    cells = np.empty((Ho, Wo, 3))
    cells[:] = GREY
    labels = np.full((Ho, Wo), "", object)
    for oy, ox, ky, kx in g["gather"].get(tuple(at), []):
        cells[oy, ox] = _light(PALETTE[0])
        labels[oy, ox] = f"{K - 1 - ky},{K - 1 - kx}"
    _grid(axes[0], cells, labels, title=f"gather into dx{tuple(at)}:\ndy cells × flipped mask")
    cells = np.empty((H, W, 3))
    cells[:] = GREY
    labels = np.full((H, W), "", object)
    for iy, ix, ky, kx in g["scatter"].get(tuple(source), []):
        cells[iy, ix] = _light(PALETTE[1])
        labels[iy, ix] = f"{ky},{kx}"
    _grid(axes[1], cells, labels, title=f"scatter from dy{tuple(source)}:\ndx cells × mask")
    n = g["writers"]
    _grid(axes[2], [[_light(PALETTE[2], 0.25 + 0.75 * v / n.max()) for v in row] for row in n], n.astype(str),
          title="dy cells adding into\neach dx cell (atomics)")
    fig.suptitle(f"dE/dX, K={K}, stride {stride}: dy is {Ho}×{Wo}, dx {H}×{W}; labels: the tap (row, column) each cell is multiplied by",
                 fontsize=FONT + 1)
    fig.convlab_data = g
    return fig


def dw_levels(workload: str = "lenet_c1", sms: int = 132) -> dict:
    """How many partial sums each weight of dE/dW has at each level of conv2d_dw_direct.cu, with
    the tunables direct_dw_config and the launcher's chunking give for `workload` on a GPU of `sms`
    SMs (132: an H100 or H200): B·Ho·Wo products, one sum per thread, per warp (shuffles), per
    block (shared memory: the partials), and one after reduce_partials. The atomic kernel instead
    sends all B·Ho·Wo products to one address each."""
    s = workloads.get(workload)
    cfg = backprop.direct_dw_config(s.C, s.M, s.K, s.stride, s.Ho)
    pairs = ceil_div(s.M, cfg["MT"]) * s.C
    tasks = s.B * ceil_div(s.Ho, cfg["ROWS"]) * s.Wo
    chunks = backprop.direct_dw_chunks(tasks, pairs, cfg["BLOCK"], cfg["MIN_BLOCKS"], sms)
    threads = chunks * cfg["BLOCK"]
    levels = [("products (B·Ho·Wo):\nconv2d_dw_atomic's atomics", s.B * s.Ho * s.Wo), ("thread sums (registers)", min(threads, tasks)),
              ("warp sums (shuffles)", ceil_div(min(threads, tasks), 32)), ("block partials", chunks),
              ("dW (reduce_partials)", 1)]
    return {"workload": workload, "config": cfg, "chunks": chunks, "blocks": chunks * pairs, "tasks": tasks,
            "levels": levels, "atomics_per_weight_atomic_kernel": s.B * s.Ho * s.Wo}


def dw_reduction(workload: str = "lenet_c1", sms: int = 132):
    """Figure: the sum behind one dE/dW weight, level by level, in conv2d_dw_direct.cu for `workload`
    (log scale: partial sums left per weight). What to see: B·Ho·Wo products (64 million on
    lenet_c1) shrink to one sum per thread in registers, one per warp by shuffles, one per block in
    shared memory: 792 block partials on lenet_c1 with 132 SMs, which a second pass adds in a fixed
    order; the atomic kernel sends every one of the products to the same address instead."""
    d = dw_levels(workload, sms)
    names, values = zip(*d["levels"])
    fig, ax = _figure(height=2.9)
    y = np.arange(len(names))[::-1]
    ax.barh(y, values, color=PALETTE[0])
    ax.set_xscale("log")
    ax.set_yticks(y, names, fontsize=FONT)
    ax.tick_params(labelsize=FONT)
    for yy, v in zip(y, values):
        ax.text(v * 1.15, yy, f"{v:,}", va="center", fontsize=FONT)
    ax.set_xlim(0.5, max(values) * 40)
    ax.set_xlabel("partial sums per weight", fontsize=FONT)
    cfg = d["config"]
    ax.set_title(f"{workload} dW: MT={cfg['MT']}, ROWS={cfg['ROWS']}, {d['chunks']} chunks × {d['blocks'] // d['chunks']} "
                 f"(map group, channel) pairs, {cfg['BLOCK']} threads per block ({sms} SMs)", fontsize=FONT)
    fig.convlab_data = d
    return fig


# ---- chapter 9: groups and dilation ---------------------------------------------------------------

def groups_dilation(grouped: str = "resnext_g32_56", dilated: str = "deeplab_d2_28"):
    """Figure: left, which input channels each output map of the grouped layer `grouped` reads (the
    weight matrix M × C is block-diagonal: M/g maps read C/g channels each); right, one output's
    taps over the input for the dilated layer `dilated` (K×K taps spread d apart over a window of
    d·(K−1)+1). What to see: a grouped convolution is g independent small convolutions (g times
    fewer multiply-adds); dilation widens the window without adding taps."""
    gs, ds = workloads.get(grouped), workloads.get(dilated)
    g = gs.groups
    reads = np.zeros((gs.M, gs.C), bool)
    for m in range(gs.M):
        k = m // (gs.M // g)
        reads[m, k * (gs.C // g):(k + 1) * (gs.C // g)] = True
    span = ds.dilation * (ds.K - 1) + 1
    n = span + 2
    taps = np.zeros((n, n), bool)
    for ky in range(ds.K):
        for kx in range(ds.K):
            taps[1 + ky * ds.dilation, 1 + kx * ds.dilation] = True
    fig, (a, b) = _figure(1, 2, height=3.6)
    a.imshow(np.where(reads[..., None], np.asarray(PALETTE[0]), np.ones(3)), interpolation="nearest")
    a.set_xlabel("input channel", fontsize=FONT)
    a.set_ylabel("output map", fontsize=FONT)
    a.tick_params(labelsize=FONT)
    a.set_title(f"{grouped}: groups={g}, {gs.C // g} channels per map", fontsize=FONT + 1)
    cells = np.empty((n, n, 3))
    cells[:] = GREY
    cells[1:1 + span, 1:1 + span] = _light(PALETTE[1], 0.3)
    cells[taps] = PALETTE[1]
    labels = np.full((n, n), "", object)
    for i, (r, c) in enumerate(zip(*np.nonzero(taps))):
        labels[r, c] = f"{i // ds.K},{i % ds.K}"
    _grid(b, cells, labels, title=f"{dilated}: K={ds.K}, dilation {ds.dilation}: window {span}×{span}")
    fig.convlab_data = {"grouped": grouped, "groups": g, "reads": reads, "dilated": dilated, "taps": taps, "span": span}
    return fig


# ---- chapter 10: the fused epilogue ---------------------------------------------------------------

def epilogue_bytes(workload: str = "lenet_c1") -> dict:
    """Global-memory bytes of the layer's forward stage (input, conv output, pooled output; masks and
    bias left out), per kernel: unfused = conv, bias_act, pool2x2 (three kernels, the conv output
    written and read back twice); fused = conv2d_bias_act_pool (input read, pooled output written)."""
    s = workloads.get(workload)
    xb = 4 * s.B * s.C * s.H * s.W
    yb = 4 * s.B * s.M * s.Ho * s.Wo
    pb = 4 * s.B * s.M * layers.pooled_size(s.Ho, "max") * layers.pooled_size(s.Wo, "max")
    unfused = [("conv", xb, yb), ("bias + act", yb, yb), ("pool 2×2", yb, pb)]
    fused_ = [("conv + bias + act + pool", xb, pb)]
    return {"workload": workload, "unfused": unfused, "fused": fused_,
            "unfused_total": sum(r + w for _, r, w in unfused), "fused_total": xb + pb}


def fused_epilogue(workload: str = "lenet_c1"):
    """Figure: left, what one thread of conv2d_bias_act_pool.cu computes for `workload`: the
    (K+1)×(K+1) input window per channel under the 2×2 conv outputs that one pooled output needs,
    all in registers; right, the global-memory traffic of the stage fused and as three kernels.
    What to see: fused, the conv outputs never leave registers (bias, activation and pooling happen
    there) and one value in four is written; unfused, the conv output is written, read, written
    again and read once more."""
    s = workloads.get(workload)
    d = epilogue_bytes(workload)
    fig, (a, b) = _figure(1, 2, height=3.4, gridspec_kw={"width_ratios": [1.3, 1]})
    n = s.K + 1
    uses = np.zeros((n, n), int)              # how many of the 2×2 conv outputs read each input
    for dy in (0, 1):
        for dx in (0, 1):
            uses[dy:dy + s.K, dx:dx + s.K] += 1
    shades = {1: _light(PALETTE[0], 0.3), 2: _light(PALETTE[0], 0.6), 4: PALETTE[0]}
    for (r, c), u in np.ndenumerate(uses):
        a.add_patch(Rectangle((c, n - 1 - r), 1, 1, fc=shades[u], ec="white", lw=0.5))
    stages = [(n + 1.5, 2, PALETTE[2], "conv:\n2×2 sums"), (n + 5, 2, PALETTE[4], "+ bias,\nact"),
              (n + 8.5, 1, PALETTE[3], "pool:\n1 written")]
    for x0, k, color, label in stages:
        for r in range(k):
            for c in range(k):
                a.add_patch(Rectangle((x0 + c, n / 2 - k / 2 + r), 1, 1, fc=color, ec="white", lw=1))
        a.text(x0 + k / 2, n / 2 - 1.6, label, ha="center", va="top", fontsize=FONT)
    for x0, x1 in ((n + 0.2, n + 1.3), (n + 3.7, n + 4.8), (n + 7.2, n + 8.3)):
        a.annotate("", (x1, n / 2), (x0, n / 2), arrowprops={"arrowstyle": "->", "lw": 1.2})
    a.text(n / 2, -0.4, f"input window {n}×{n} per channel\n(darker: read by more outputs)", ha="center", va="top",
           fontsize=FONT)
    a.text(n + 5.5, n / 2 + 2.2, "registers", ha="center", fontsize=FONT, style="italic")
    a.set_xlim(-0.3, n + 10)
    a.set_ylim(-2.6, n + 0.3)
    a.set_aspect("equal")
    a.axis("off")
    a.set_title("one thread of the fused kernel", fontsize=FONT + 1)
    rows = [("fused", d["fused"])] + [("unfused", d["unfused"])]
    labels, reads, writes = [], [], []
    for kind, stages in rows:
        for name, r, w in stages:
            labels.append(f"{name}" if kind == "fused" else f"{name} (separate)")
            reads.append(r / 2**20)
            writes.append(w / 2**20)
    y = np.arange(len(labels))[::-1]
    b.barh(y, reads, color=PALETTE[0], label="read")
    b.barh(y, writes, left=reads, color=PALETTE[3], label="written")
    b.set_yticks(y, labels, fontsize=FONT)
    b.tick_params(labelsize=FONT)
    b.set_xlabel("MiB of global memory", fontsize=FONT)
    b.set_title(f"{workload}: {d['fused_total'] / 2**20:,.0f} MiB fused, {d['unfused_total'] / 2**20:,.0f} MiB unfused",
                fontsize=FONT + 1)
    b.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2, fontsize=FONT, frameon=False)
    fig.convlab_data = d
    return fig


def timeline_spans(lanes: dict) -> list[dict]:
    """The spans network_timeline draws: each lane's ops one after another from 0 ms (a forward pass
    runs its kernels in order on one stream), as dicts of lane, op, kind, start and end (ms)."""
    spans = []
    for lane, ops in lanes.items():
        t = 0.0
        for op, kind, ms in ops:
            if not ms >= 0:
                raise ValueError(f"{lane}: {op} has no time ({ms!r})")
            spans.append({"lane": lane, "op": op, "kind": kind, "start": t, "end": t + ms})
            t += ms
    return spans


TIMELINE_KINDS = {"copy": PALETTE[0], "conv stage": PALETTE[1], "fully-connected": PALETTE[2], "other": GREY}


def network_timeline(lanes: dict | None = None, *, title: str = ""):
    """Figure: a profiler's timeline (as Nsight Systems draws one) of a whole network's forward pass,
    one row per contender, its ops back to back in the order they run, each bar as long as the op's
    measured time (lanes: {row label: [(op, kind, ms), ...]}, kind one of TIMELINE_KINDS; title: the
    GPU and where the times come from). What to see: which op the time goes to; an op too short to
    label is named below the row. Without lanes: a two-op example."""
    lanes = lanes or {"example": [("copy in", "copy", 1.0), ("conv", "conv stage", 2.0)]}
    spans = timeline_spans(lanes)
    end = max(s["end"] for s in spans)
    names = list(lanes)
    fig, ax = _figure(height=0.9 + 0.85 * len(names))
    for s in spans:
        y = len(names) - 1 - names.index(s["lane"])
        width = s["end"] - s["start"]
        ax.barh(y, width, left=s["start"], height=0.5, color=TIMELINE_KINDS[s["kind"]], edgecolor="white", lw=0.8)
        label = f"{s['op']}\n{width:.2f} ms" if width >= 0.09 * end else ""
        if label:
            ax.text(s["start"] + width / 2, y, label, ha="center", va="center", fontsize=FONT - 1)
    # ops too short for their label: named under the row, in order
    for lane in names:
        y = len(names) - 1 - names.index(lane)
        small = [s for s in spans if s["lane"] == lane and s["end"] - s["start"] < 0.09 * end]
        if small:
            ax.text(small[0]["start"], y - 0.3, ", ".join(f"{s['op']} {s['end'] - s['start']:.2f} ms" for s in small),
                    ha="left" if small[0]["start"] < 0.6 * end else "right", va="top", fontsize=FONT - 1)
    ax.set_yticks(range(len(names)), names[::-1], fontsize=FONT)
    ax.set_xlim(0, end * 1.01)
    ax.set_ylim(-0.85, len(names) - 0.5)
    ax.set_xlabel("ms from the start of the pass", fontsize=FONT)
    ax.tick_params(labelsize=FONT)
    ax.spines[["top", "right"]].set_visible(False)
    used = [k for k in TIMELINE_KINDS if any(s["kind"] == k for s in spans)]
    ax.legend(handles=[Rectangle((0, 0), 1, 1, color=TIMELINE_KINDS[k]) for k in used], labels=used,
              loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=len(used), fontsize=FONT, frameon=False)
    if title:
        fig.suptitle(title, fontsize=FONT)
    fig.convlab_data = {"spans": spans, "end_ms": end}
    return fig
