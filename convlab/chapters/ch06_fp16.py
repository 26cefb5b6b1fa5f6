"""Chapter 6, FP16 (book/06_fp16.ipynb, kernels/06_fp16/, convlab.ops.fp16): its figure of WMMA's
16×16×16 fragments over the implicit GEMM, and its exercises' answers.

    from convlab.chapters import ch06_fp16 as ch6
    fig = ch6.wmma_tiles(("lenet_c1", "resnet"))     # the fragments, and the share of useful multiply-adds
"""
from __future__ import annotations

from functools import partial

import matplotlib.pyplot as plt
import numpy as np

from ..display.diagrams import FONT, GREY, PALETTE, WIDTH, draw_grid
from ..measuring import workloads
from ..ops import ceil_div, fp16
from ..teach import checks

ANSWERS = {
    "06_half2.hfma2": ("HFMA2 instructions for lenet_c3", lambda: 10000 * 34 * 34 * 8 * 196),
    "06_wmma_loop.from_global": ("layers whose A fragments can come from global memory",
                                 lambda: ["days100", "resnet"]),
}

check_answer = partial(checks.check_answer, ANSWERS)


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
            draw_grid(ax, colors, lw=0.3)
            ax.set_title({"A": "A (16×16)", "B": "B (16×16)", "C": "C += A·B (float)"}[name], fontsize=FONT + 1)
            ax.set_xlabel(xlab, fontsize=FONT)
            ax.set_ylabel(ylab, fontsize=FONT)
    fig.convlab_data = {g["workload"]: g for g in geos}
    return fig
