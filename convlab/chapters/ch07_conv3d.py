"""Chapter 7, 3D convolution with thread coarsening (book/07_conv3d.ipynb, kernels/07_conv3d/,
convlab.ops.conv3d): its figure of conv3d_coarse's rolling window, its exercise's checks (a 3D
kernel against fp64, then its counters) and answer.

    from convlab.chapters import ch07_conv3d as ch7
    fig = ch7.conv3d_window()
    fig = book.figure_on_emulator(ch7.tiled_load_lanes)   # conv3d_tiled's lanes per load trip, traced
    ch7.check_conv3d(launch, K)                                    # launch(x, w, y), single channel
    ch7.check_conv3d_counters(launch, K, ch7.check_targets("07"))
"""
from __future__ import annotations

from functools import partial

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.patches import Rectangle

import convlab as cl

from ..display import plots
from ..display.diagrams import FONT, PALETTE, draw_grid, light, new_figure
from ..measuring import workloads
from ..ops import conv3d
from ..teach import checks
from ..teach.checks import Case, run_cases
from ..teach.verdict import Verdict
from .ch02_naive import Targets, check_counters, kept_targets

ANSWERS = {
    "07.extra": ("extra planes per block", lambda: 4 / 36),
}

check_answer = partial(checks.check_answer, ANSWERS)

#: Exercise 7.1's targets on COUNTER_VOLUME, chapter 7's conv3d_coarse with TX=1, TY=1, BY=4, ZC=4:
#: 3.98 sectors per load request (coalesced rows of a plane), no bank conflicts.
TARGETS = {"07": {"sectors per load request": 3.98, "shared bank conflicts": 0}}


def check_targets(key: str = "07") -> Targets:
    """Exercise 7.1's counter targets."""
    return kept_targets(key, TARGETS[key])


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
        cells[oz, oz:oz + KZ - 1] = light(PALETTE[0])
        cells[oz, oz + KZ - 1] = PALETTE[0]
    fig, ax = new_figure(height=4.6)
    draw_grid(ax, cells, lw=0.3)
    ax.set_xticks(range(0, planes, 4))
    ax.set_yticks(range(0, ZC, 4))
    ax.tick_params(labelbottom=True, labelleft=True, labelsize=FONT)
    ax.set_xlabel("input plane read (one per step)", fontsize=FONT)
    ax.set_ylabel("output plane of the block", fontsize=FONT)
    per_output = planes / ZC
    ax.set_title(f"{workload}: K={KZ}, ZC={ZC} outputs per block: {planes} planes read, {per_output:.2f} per output "
                 f"(naive: {KZ})", fontsize=FONT + 1)
    ax.legend(handles=[Rectangle((0, 0), 1, 1, color=light(PALETTE[0])), Rectangle((0, 0), 1, 1, color=PALETTE[0])],
              labels=["accumulating in a register", "complete: stored, window rolls"], loc="upper center",
              bbox_to_anchor=(0.5, -0.12), ncol=2, fontsize=FONT, frameon=False)
    fig.convlab_data = {"workload": workload, "config": cfg, "held": held, "planes_read": planes,
                        "planes_per_output": per_output, "naive_planes_per_output": KZ,
                        "window": int(held.sum(axis=0).max()), "accumulators": KZ * cfg["TX"] * cfg["TY"]}
    return fig


def tiled_load_lanes():
    """Figure: conv3d_tiled on a volume as wide as the challenge's (W = 128: four blocks along x,
    the last at the edge), one block high and deep, traced on the emulator (every access of two
    blocks): for each warp, the lanes active in each trip of the tile's load loop and in the
    output's store. What to see: inside the volume every trip's warps load with all 32 lanes; at
    the edge along x part of them are off. convlab_data: lanes {blockIdx.x: (16 warps, 5 trips +
    the store)}, columns."""
    x, w = cl.randn(8, 8, 128), cl.randn(5, 5, 5)
    acc = cl.trace(conv3d.conv3d_tiled, x, w, blocks=[(0, 0, 0), (3, 0, 0)]).accesses
    glob = acc[acc["space"] == "global"]
    fig, axes = plt.subplots(1, 2, figsize=(plots.PAGE_WIDTH_IN, 3.9), sharey=True,
                             layout="constrained")
    # no request, lanes off, 32 lanes
    colours = ListedColormap(["white", "#f4a259", "#b8d8be"])
    data = {}
    for ax, bx in zip(axes, (0, 3)):
        blk = glob[glob["bx"] == bx]
        lanes = np.zeros((16, 6), int)
        reads = blk[blk["access"] == "read"].groupby(["warp", "request"])["lane"].nunique()
        for warp, per_trip in reads.groupby(level=0):
            lanes[warp, :len(per_trip)] = per_trip.to_numpy()
        stores = blk[blk["access"] == "write"].groupby("warp")["lane"].nunique()
        lanes[:, 5] = stores.reindex(range(16), fill_value=0).to_numpy()
        kind = np.where(lanes == 0, 0, np.where(lanes < 32, 1, 2))
        ax.imshow(kind, cmap=colours, vmin=0, vmax=2, aspect="auto")
        for (r, c), v in np.ndenumerate(lanes):
            if v:
                ax.text(c, r, str(v), ha="center", va="center", fontsize=8)
        ax.axvline(4.5, color="black", lw=1.5)
        ax.set_xticks(range(6), ["1", "2", "3", "4", "5", "store"], fontsize=9)
        ax.set_xlabel("load loop trip (global loads)  |  output store", fontsize=9)
        ax.set_title(f"blockIdx.x = {bx}" + (" (inside the volume)" if bx == 0 else " (the edge along x)"),
                     fontsize=10)
        data[bx] = lanes
    axes[0].set_yticks(range(16), [f"warp {w}" for w in range(16)], fontsize=8)
    fig.convlab_data = {
        "lanes": data,
        "columns": ["trip 1", "trip 2", "trip 3", "trip 4", "trip 5", "store"]}
    return fig


#: Volumes (D, H, W, why) for a 3D kernel of blocks of 32 columns, BY rows and ZC planes: no
#: multiple of any block along each axis, a single output plane, fewer planes than ZC.
VOLUMES = [(3, 3, 3, "the smallest: one output"),
           (9, 13, 37, "no multiple of 32, BY or ZC"),
           (6, 8, 40, "fewer planes than two blocks; columns over two warps"),
           (11, 6, 10, "a short last plane block"),
           (3, 20, 70, "D = K: one output plane")]


def check_conv3d(launch, K: int, volumes=None, *, name: str = "your kernel", tol: float = 1e-5) -> Verdict:
    """launch(x, w, y) runs a single-channel 3D convolution (valid, stride 1) of x (D, H, W) with
    the mask w (K, K, K) into y, which starts as NaN; checked on `volumes` ((D, H, W, why), VOLUMES
    by default) against the fp64 reference within tol, the challenge's tolerance."""

    volumes = VOLUMES if volumes is None else volumes

    def cases():
        for D, H, W, why in volumes:
            x, w = cl.randn(D, H, W), cl.randn(K, K, K)
            y = cl.empty(D - K + 1, H - K + 1, W - K + 1)
            conv = lambda ww, x=x: cl.ref.conv3d(x, ww)  # noqa: E731
            mistakes = [
                ("the mask is flipped: that is convolution, but the course computes cross-correlation, "
                 "x[z+kz][y+ky][x+kx] * k[kz][ky][kx]", lambda w=w, conv=conv: conv(w.flip(0, 1, 2))),
                ("the mask's planes are in the wrong order: output plane oz takes input plane iz with mask "
                 "plane kz = iz - oz; in the window acc[j] (output plane iz - (KS-1) + j) that is plane "
                 "KS-1-j, not j", lambda w=w, conv=conv: conv(w.flip(0))),
                ("the mask's row and column are swapped: k[kz][kx][ky] where k[kz][ky][kx] belongs",
                 lambda w=w, conv=conv: conv(w.transpose(1, 2))),
            ]
            yield Case(f"{D}×{H}×{W}", why, lambda x=x, w=w, y=y: launch(x, w, y), y, cl.ref.conv3d(x, w),
                        mistakes=mistakes, bound={"rtol": tol, "atol": tol})

    return run_cases(launch, cases(), name=name, labels="zyx",
                      passed=f"matches the fp64 reference within {tol:g} on all {len(volumes)} volumes")


#: The volume (D, H, W) check_conv3d_counters profiles a 3D kernel on: two row blocks, three warps
#: of columns, three plane blocks.
COUNTER_VOLUME = (12, 20, 70)


def check_conv3d_counters(launch, K: int, targets: dict, *, volume=COUNTER_VOLUME,
                          name: str = "your kernel") -> Verdict:
    """check_counters for a 3D kernel launch(x, w, y) (as check_conv3d takes it) on `volume`."""

    D, H, W = volume
    x, w = cl.randn(D, H, W), cl.randn(K, K, K)
    y = cl.empty(D - K + 1, H - K + 1, W - K + 1)
    return check_counters(lambda: launch(x, w, y), targets, result=lambda: (y, cl.ref.conv3d(x, w)),
                          macs=y.numel() * K ** 3, name=name)
