"""Chapter 4, im2col and a tiled GEMM (book/04_im2col.ipynb, kernels/04_im2col/, convlab.ops.im2col):
its figures (the unrolled matrix, the GEMM's tiles on a few-map layer), its exercise's check of
the unroll and its answer.

    from convlab.chapters import ch04_im2col as ch4
    fig = ch4.im2col_matrix()            # the input unrolled into U, one column per output
    ch4.check_unroll(unroll)             # exercise 4.1: unroll(x, K, stride, pad) -> U
"""
from __future__ import annotations

from functools import partial

import numpy as np
from matplotlib.patches import Rectangle

import convlab as cl

from ..display.diagrams import FONT, GREY, PALETTE, draw_grid, new_figure, outline
from ..measuring import workloads
from ..ops import ceil_div, im2col
from ..teach import checks
from ..teach.checks import AWKWARD_SHAPES, checked_launch, describe_error, fault_text, nothing_text, say
from ..teach.verdict import NOTHING, Verdict, verdict

ANSWERS = {
    "04.u_bytes": ("bytes of U for lenet_c1", lambda: 12_544_000_000),
}

check_answer = partial(checks.check_answer, ANSWERS)


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
    fig, (a, b) = new_figure(1, 2, height=3.3, gridspec_kw={"width_ratios": [H + 1, U.shape[1]]})
    xin = np.arange(1, H * W + 1).reshape(H, W)
    win = np.zeros((H, W), bool)
    win[oy:oy + K, ox:ox + K] = True
    draw_grid(a, [[PALETTE[1] if win[r, c] else GREY for c in range(W)] for r in range(H)], xin.astype(str),
          title=f"input {H}×{W}")
    col = np.zeros(U.shape, bool)
    col[:, column] = True
    draw_grid(b, [[PALETTE[1] if col[r, c] else GREY for c in range(U.shape[1])] for r in range(U.shape[0])],
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
    fig, ax = new_figure(height=2.6)
    draw_grid(ax, cells, lw=0.3)
    for t in range(g["steps"]):
        outline(ax, 0, t * g["tile"], g["tile"], g["tile"], lw=1.5)
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


def check_unroll(unroll) -> Verdict:
    """unroll(x, K, stride, pad) returns im2col's U (B, C*K*K, Ho*Wo); checked against torch's
    unfold on the awkward shapes. A wrong entry is named by its row (c, ky, kx) and column
    (oy, ox) of U, with the input pixel that belongs there."""
    import torch
    import torch.nn.functional as F


    for i, s in enumerate(AWKWARD_SHAPES):
        x = cl.randn(s.B, s.C, s.H, s.W)
        want = F.unfold(x.cpu().double(), s.K, padding=s.padding, stride=s.stride)
        try:
            got = checked_launch(lambda x=x, s=s: unroll(x, s.K, s.stride, s.padding))
        except Exception as e:  # noqa: BLE001 (a check must never stop the notebook)
            text = fault_text(unroll, describe_error(e))
            return say(False, text if text.startswith("not done") else f"✗ {s}: {text}")
        ok, text = verdict(got, want, labels="brp")
        if ok:
            continue
        if text.startswith(NOTHING):
            return say(False, nothing_text(unroll, text, out_index=None))
        if text.startswith("wrong shape"):
            return say(False, f"✗ {s}: {text}")
        b, r, p = (int(v) for v in (~torch.isclose(got.cpu().double(), want, rtol=1e-6, atol=1e-6)).nonzero()[0])
        c, ky, kx = r // (s.K * s.K), r % (s.K * s.K) // s.K, r % s.K
        oy, ox = p // s.Wo, p % s.Wo
        iy, ix = oy * s.stride - s.padding + ky, ox * s.stride - s.padding + kx
        where = f"x[{b}][{c}][{iy}][{ix}]" if 0 <= iy < s.H and 0 <= ix < s.W else \
            f"0 (pixel ({iy}, {ix}) is in the padding)"
        before = f"\n  ({i} shape{'s' if i > 1 else ''} before it passed)" if i else ""
        return say(False, f"✗ {s} ({s.note}): U[{b}][row {r} = (c={c}, ky={ky}, kx={kx})][column {p} = "
                           f"(oy={oy}, ox={ox})] should be {where} = {want[b, r, p].item():.6g}, got "
                           f"{got[b, r, p].item():.6g}\n  ({text}){before}")
    return say(True, f"✓ correct: U matches torch's unfold on all {len(AWKWARD_SHAPES)} shapes "
                      f"(awkward sizes, C=1, B=1, odd and even K, stride 2, padding)")
