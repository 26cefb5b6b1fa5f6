"""Chapter 5 launchers: fusion and tuning (kernels/05_fused/), and a dispatcher.

- conv2d_implicit_gemm: chapter 4's tiled GEMM with the unroll folded into its tile loads;
  KSIZE=K fixes K at compile time (KSIZE=0: K at run time). Grid (⌈P/TILE⌉, ⌈M/TILE⌉, B).
- conv2d_implicit_gemm_reg: register-tiled implicit GEMM over the whole batch (N = B·Ho·Wo
  columns): block tile BM×BN, reduction step BK, micro-tile TM×TN per thread. 1-D/2-D grid, no
  batch limit. For the many-channel layers (resnet, days100).
- conv2d_direct_coarse: a direct convolution, every thread computing all M maps of ROWS output
  rows of one column, with M, C, K, stride compiled in and the mask in __constant__ memory as
  FFMA operands. For the small-channel layers (lenet_c1, lenet_c3, fa17). 1-D grid.
- conv2d_direct_regtile: the direct convolution again, with the mask in shared memory (read as
  16-byte broadcasts) and a register micro-tile of MT maps × ROWS rows per thread; the kernel
  pick() uses for the small-channel layers. Grid (⌈B·⌈Ho/ROWS⌉·Wo/BLOCK⌉, ⌈M/MT⌉).
- pick(workload) / conv2d_best: which of these (and which tunables) a layer shape gets.
"""
from __future__ import annotations

from . import GRID_X_LIMIT, ceil_div, conv2d_shapes
from ._kernels import batch_chunks, module, output, padding, set_mask

IMPLICIT_GEMM_FILE = "kernels/05_fused/conv2d_implicit_gemm.cu"
IMPLICIT_GEMM_REG_FILE = "kernels/05_fused/conv2d_implicit_gemm_reg.cu"
DIRECT_COARSE_FILE = "kernels/05_fused/conv2d_direct_coarse.cu"
DIRECT_REGTILE_FILE = "kernels/05_fused/conv2d_direct_regtile.cu"

CONSTANT_FLOATS = 16384     # 64 KB of __constant__ memory


def _pad(pad, padding_alias):
    return padding(pad, padding_alias)


# ---- step 1: implicit GEMM, one output per thread -------------------------------------------------

def conv2d_implicit_gemm(x, w, y=None, *, stride: int = 1, pad: int = 0, padding: int | None = None,
                         TILE: int = 16, KSIZE: int = 0):
    pad_ = _pad(pad, padding)
    B, C, M, H, W, K, Ho, Wo = conv2d_shapes(x, w, stride, pad_)
    if KSIZE not in (0, K):
        raise ValueError(f"KSIZE={KSIZE} but the mask is {K}×{K}: pass KSIZE={K} (compile-time K) or 0 (run time)")
    y = output(y, (B, M, Ho, Wo))
    kern = module(IMPLICIT_GEMM_FILE, {"TILE": TILE, "KSIZE": KSIZE}).kernel("conv2d_implicit_gemm")
    grid_xy = (ceil_div(Ho * Wo, TILE), ceil_div(M, TILE))
    for b0, b1 in batch_chunks(B):                  # the batch is on gridDim.z
        xs, ys = (x, y) if (b0, b1) == (0, B) else (x[b0:b1], y[b0:b1])
        kern(xs, w, ys, b1 - b0, C, M, H, W, K, pad_, stride, grid=(*grid_xy, b1 - b0), block=(TILE, TILE, 1))
    return y


# ---- step 2: register-tiled implicit GEMM ----------------------------------------------------------

def reg_threads(BM: int = 64, BN: int = 128, TM: int = 8, TN: int = 8) -> int:
    return (BM // TM) * (BN // TN)


def check_reg_tunables(BM: int, BN: int, BK: int, TM: int, TN: int) -> None:
    """The kernel's static_asserts, as a Python error before compiling (and for sweeps to skip)."""
    threads = reg_threads(BM, BN, TM, TN)
    ok = (TM % 4 == 0 and TN % 4 == 0 and BM % TM == 0 and BN % TN == 0 and threads <= 1024
          and (BM * BK) % threads == 0
          and ((threads % BN == 0 and BK % (threads // BN) == 0) if threads >= BN else BN % threads == 0))
    if not ok:
        raise ValueError(f"tile BM={BM} BN={BN} BK={BK} TM={TM} TN={TN} ({threads} threads) does not split "
                         "evenly: TM, TN multiples of 4 dividing BM, BN; BM·BK and the BN×BK tile divisible "
                         "over the threads; at most 1024 threads")
    smem = 4 * 2 * BK * ((BM + 4) + BN)
    if smem > 48 * 1024:
        raise ValueError(f"tile BM={BM} BN={BN} BK={BK} needs {smem:,} bytes of shared memory, over 48 KB")


def conv2d_implicit_gemm_reg(x, w, y=None, *, stride: int = 1, pad: int = 0, padding: int | None = None,
                             BM: int = 64, BN: int = 128, BK: int = 8, TM: int = 8, TN: int = 8):
    pad_ = _pad(pad, padding)
    B, C, M, H, W, K, Ho, Wo = conv2d_shapes(x, w, stride, pad_)
    check_reg_tunables(BM, BN, BK, TM, TN)
    y = output(y, (B, M, Ho, Wo))
    N = B * Ho * Wo
    grid = (ceil_div(N, BN), ceil_div(M, BM), 1)
    if grid[0] > GRID_X_LIMIT or grid[1] > 65_535:
        raise ValueError(f"grid {grid} over the limits")
    defines = {"BM": BM, "BN": BN, "BK": BK, "TM": TM, "TN": TN, "KSIZE": K}
    kern = module(IMPLICIT_GEMM_REG_FILE, defines).kernel("conv2d_implicit_gemm_reg")
    kern(x, w, y, B, C, M, H, W, pad_, stride, grid=grid, block=(reg_threads(BM, BN, TM, TN), 1, 1))
    return y


# ---- step 3: thread-coarsened direct convolution, mask as constant operands ------------------------

def direct_rows(M: int, C: int, K: int) -> int:
    """Output rows per thread for conv2d_direct_coarse: the most (up to 8) that keep the accumulators
    (M·ROWS) within 32 registers and the unrolled body (M·C·K²·ROWS FFMAs) within 4,096 instructions
    (64 KB of code)."""
    for rows in (8, 4, 2):
        if M * rows <= 32 and M * C * K * K * rows <= 4096:
            return rows
    return 1


def direct_fits(M: int, C: int, K: int) -> bool:
    """Whether conv2d_direct_coarse can take the layer: the mask fits in constant memory and the
    fully unrolled body (M·C·K² FFMAs for one row) stays near the instruction cache's size."""
    return M * C * K * K <= min(CONSTANT_FLOATS, 4096) and M <= 64


def conv2d_direct_coarse(x, w, y=None, *, stride: int = 1, pad: int = 0, padding: int | None = None,
                         ROWS: int | None = None, BLOCK: int = 256):
    pad_ = _pad(pad, padding)
    B, C, M, H, W, K, Ho, Wo = conv2d_shapes(x, w, stride, pad_)
    if M * C * K * K > CONSTANT_FLOATS:
        raise ValueError(f"the mask has {M * C * K * K:,} floats, over the {CONSTANT_FLOATS:,} of constant memory")
    rows = direct_rows(M, C, K) if ROWS is None else int(ROWS)
    y = output(y, (B, M, Ho, Wo))
    mod = module(DIRECT_COARSE_FILE, {"M_OUT": M, "C_IN": C, "KSIZE": K, "STRIDE": stride,
                                      "ROWS": rows, "BLOCK": BLOCK})
    set_mask(mod, w)
    threads = B * ceil_div(Ho, rows) * Wo
    mod.kernel("conv2d_direct_coarse")(x, y, B, H, W, pad_, grid=(ceil_div(threads, BLOCK), 1, 1),
                                       block=(BLOCK, 1, 1))
    return y


# ---- step 4: register-tiled direct convolution, mask in shared memory --------------------------------

def regtile_config(M: int, C: int, K: int) -> dict:
    """Default micro-tile for conv2d_direct_regtile, from the H200 sweep (benchmarks/conv2d_forward.py
    --sweep, 2026-11-22):
    - MT: the fewest map groups with at most 32 maps each (each group re-reads the input), MT the
      group size rounded up to 4: lenet_c1 4, lenet_c3 16, fa17 2 x 28 (56 slots for 50 maps beat
      1 x 52: 52 maps per thread need ~140 registers);
    - ROWS: the fewest rows that give MT·ROWS ≥ 32 accumulators, enough independent FFMAs per mask
      load (lenet_c1 8, lenet_c3 2, fa17 2); more rows cost registers and occupancy;
    - BLOCK 128: these threads use 80–110 registers, and 128-thread blocks fill the register file
      at least as well as 256 (best or within 4% on all three layers)."""
    groups = -(-M // 32)
    MT = -(-(-(-M // groups)) // 4) * 4
    rows = 1
    while MT * rows < 32 and rows < 8:
        rows *= 2
    return {"MT": MT, "ROWS": rows, "BLOCK": 128}


def regtile_fits(M: int, C: int, K: int, MT: int | None = None) -> bool:
    """The block's mask slice (C·K²·MT floats) fits in 48 KB of shared memory."""
    MT = MT or regtile_config(M, C, K)["MT"]
    return C * K * K * MT * 4 <= 48 * 1024


def conv2d_direct_regtile(x, w, y=None, *, stride: int = 1, pad: int = 0, padding: int | None = None,
                          MT: int | None = None, ROWS: int | None = None, BLOCK: int | None = None):
    pad_ = _pad(pad, padding)
    B, C, M, H, W, K, Ho, Wo = conv2d_shapes(x, w, stride, pad_)
    cfg = regtile_config(M, C, K)
    MT = int(MT or cfg["MT"])
    rows = int(ROWS or cfg["ROWS"])
    BLOCK = int(BLOCK or cfg["BLOCK"])
    if MT % 4:
        raise ValueError(f"MT={MT}: must be a multiple of 4")
    if not regtile_fits(M, C, K, MT):
        raise ValueError(f"the mask slice C·K²·MT = {C * K * K * MT:,} floats does not fit in 48 KB of shared memory")
    y = output(y, (B, M, Ho, Wo))
    mod = module(DIRECT_REGTILE_FILE, {"M_OUT": M, "C_IN": C, "KSIZE": K, "STRIDE": stride, "MT": MT,
                                       "ROWS": rows, "BLOCK": BLOCK})
    threads = B * ceil_div(Ho, rows) * Wo
    grid = (ceil_div(threads, BLOCK), ceil_div(M, MT), 1)
    mod.kernel("conv2d_direct_regtile")(x, w, y, B, H, W, pad_, grid=grid, block=(BLOCK, 1, 1))
    return y


# ---- the dispatcher ----------------------------------------------------------------------------------

def _shape_of(workload):
    """(B, C, M, H, W, K, stride, pad) from a convlab.workloads.Workload, a name, or a dict."""
    if isinstance(workload, str):
        from convlab import workloads
        workload = workloads.get(workload)
    get = (lambda k, d=None: workload.get(k, d)) if isinstance(workload, dict) else \
        (lambda k, d=None: getattr(workload, k, d))
    pad = get("pad", get("padding", 0))
    return (int(get("B")), int(get("C")), int(get("M")), int(get("H")), int(get("W")), int(get("K")),
            int(get("stride", 1)), int(pad))


def pick(workload) -> tuple:
    """(name, launcher, tunables) for a layer shape: the course's "several kernels for several layer
    sizes". Two rules, from what limits each layer, checked on an H200 (2026-11-22):

    - A short reduction (C·K² ≤ 256) and few maps (M ≤ 64), and the block's mask slice fits in
      shared memory: conv2d_direct_regtile. These layers (lenet_c1 C·K² = 49, lenet_c3 196, fa17
      25) are bound by writing the output and by the FFMAs themselves. The direct kernel loads each
      input value once into a register for MT maps x ROWS rows and reads the mask as 16-byte
      broadcasts; a GEMM pads M to its tile, pads the 25- or 49-long reduction to its BK steps, and
      re-loads every input pixel K² times into its tiles (measured: fa17 0.61 ms direct vs 1.07 ms
      GEMM, lenet_c3 2.1 vs 9.5 ms).
    - Otherwise (resnet: C·K² = 576, days100: 288, M = 64–128): conv2d_implicit_gemm_reg, compute-
      bound, 8x8 outputs per thread, BK=16 (half the barriers of BK=8; 1–3% faster on both), the
      block tile as tall as the maps allow: BM=64, BN=128 for M < 128 (resnet 0.48 ms), BM=128,
      BN=128 for M ≥ 128 (days100 0.154 ms; BM=64 wastes nothing there but re-reads the input
      twice).
    """
    B, C, M, H, W, K, stride, pad = _shape_of(workload)
    if C * K * K <= 256 and M <= 64 and regtile_fits(M, C, K):
        return "direct, register-tiled (mask in shared)", conv2d_direct_regtile, regtile_config(M, C, K)
    if M >= 128:
        return "implicit GEMM, register-tiled", conv2d_implicit_gemm_reg, {"BM": 128, "BN": 128, "BK": 16, "TM": 8, "TN": 8}
    return "implicit GEMM, register-tiled", conv2d_implicit_gemm_reg, {"BM": 64, "BN": 128, "BK": 16, "TM": 8, "TN": 8}


def conv2d_best(x, w, y=None, *, stride: int = 1, pad: int = 0, padding: int | None = None):
    """The kernel pick() chooses for this shape, launched."""
    pad_ = _pad(pad, padding)
    B, C, H, W = (int(s) for s in x.shape)
    M, K = int(w.shape[0]), int(w.shape[2])
    _, fn, tunables = pick({"B": B, "C": C, "M": M, "H": H, "W": W, "K": K, "stride": stride, "pad": pad_})
    return fn(x, w, y, stride=stride, pad=pad_, **tunables)


#: The chapter's implementations by the name the figures use (default tunables; the direct kernel
#: only for layers where direct_fits()).
IMPLEMENTATIONS = {
    "implicit GEMM": conv2d_implicit_gemm,
    "implicit GEMM, register-tiled": conv2d_implicit_gemm_reg,
    "direct, coarsened (mask in constant)": conv2d_direct_coarse,
    "direct, register-tiled (mask in shared)": conv2d_direct_regtile,
}
