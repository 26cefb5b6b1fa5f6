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
- gemm_config(M): the register-tiled GEMM's block tile for M output maps, the one rule chapter 5's
  pick, chapter 8's dX and the benchmarks use.
- pick(shape) / conv2d_best: which of these (and which tunables) a layer shape gets.
"""
from __future__ import annotations

from ..gpu._limits import SHARED_DEFAULT_MAX
from ..measuring import workloads
from ..measuring.workloads import Workload
from . import Impl, ceil_div, conv2d_shapes, output
from ._kernels import Launch, batch_chunks, remember

IMPLICIT_GEMM_FILE = "kernels/05_fused/conv2d_implicit_gemm.cu"
IMPLICIT_GEMM_REG_FILE = "kernels/05_fused/conv2d_implicit_gemm_reg.cu"
DIRECT_COARSE_FILE = "kernels/05_fused/conv2d_direct_coarse.cu"
DIRECT_REGTILE_FILE = "kernels/05_fused/conv2d_direct_regtile.cu"

CONSTANT_FLOATS = 16384     # 64 KB of __constant__ memory

_plans: dict = {}


# ---- step 1: implicit GEMM, one output per thread -------------------------------------------------

def conv2d_implicit_gemm(x, w, y=None, *, stride: int = 1, padding: int = 0, TILE: int | None = None,
                         KSIZE: int | None = None):
    """TILE×TILE outputs per block (default 16); KSIZE=K compiles K in, KSIZE=0 (default) reads it at run time."""
    def build():
        B, C, M, H, W, K, Ho, Wo = conv2d_shapes(x, w, stride, padding)
        if KSIZE_ not in (0, K):
            raise ValueError(f"KSIZE={KSIZE_} but the mask is {K}×{K}: pass KSIZE={K} (compile-time K) or 0 (run time)")
        grid_xy = (ceil_div(Ho * Wo, TILE_), ceil_div(M, TILE_))
        launches = [(b0, b1, Launch(IMPLICIT_GEMM_FILE, "conv2d_implicit_gemm", {"TILE": TILE_, "KSIZE": KSIZE_},
                                    (b1 - b0, C, M, H, W, K, padding, stride), grid=(*grid_xy, b1 - b0),
                                    block=(TILE_, TILE_, 1)))
                    for b0, b1 in batch_chunks(B)]        # the batch is on gridDim.z
        return (B, M, Ho, Wo), launches

    TILE_, KSIZE_ = int(TILE or 16), int(KSIZE or 0)
    shape, launches = remember(_plans, ("igemm", x.shape, w.shape, stride, padding, TILE_, KSIZE_), build)
    y = output(y, shape, x)
    if len(launches) == 1:
        launches[0][2](x, w, y)
    else:
        for b0, b1, launch in launches:
            launch(x[b0:b1], w, y[b0:b1])
    return y


# ---- step 2: register-tiled implicit GEMM ----------------------------------------------------------

def reg_threads(BM: int = 64, BN: int = 128, TM: int = 8, TN: int = 8) -> int:
    return (BM // TM) * (BN // TN)


def gemm_config(M: int) -> dict:
    """The block tile of conv2d_implicit_gemm_reg for M output maps, from what bounds it (checked on
    an H200, 2026-11-22): 8x8 outputs per thread, BK=16 (half the barriers of BK=8; 1-3% faster on
    resnet and days100), the block tile as tall as the maps allow: BM=128 for M >= 128 (days100
    0.154 ms; BM=64 wastes nothing there but re-reads the input twice), BM=64 below (resnet
    0.48 ms), and BM=32 with 4x8 per thread for M <= 32, where a 64-map tile would be half empty
    (chapter 8's dX of days100: 32 maps out)."""
    if M <= 32:
        return {"BM": 32, "BN": 128, "BK": 16, "TM": 4, "TN": 8}
    if M < 128:
        return {"BM": 64, "BN": 128, "BK": 16, "TM": 8, "TN": 8}
    return {"BM": 128, "BN": 128, "BK": 16, "TM": 8, "TN": 8}


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
    if smem > SHARED_DEFAULT_MAX:
        raise ValueError(f"tile BM={BM} BN={BN} BK={BK} needs {smem:,} bytes of shared memory, over 48 KB")


def conv2d_implicit_gemm_reg(x, w, y=None, *, stride: int = 1, padding: int = 0, BM: int | None = None,
                             BN: int | None = None, BK: int | None = None, TM: int | None = None,
                             TN: int | None = None):
    """Tunables left out come from gemm_config(M)."""
    shape, launch = _reg_plan(x, w, stride, padding, BM, BN, BK, TM, TN)
    y = output(y, shape, x)
    launch(x, w, y)
    return y


def _reg_plan(x, w, stride, padding, BM=None, BN=None, BK=None, TM=None, TN=None):
    """(output shape, Launch) of conv2d_implicit_gemm_reg, worked out once per shape and tunables."""
    def build():
        B, C, M, H, W, K, Ho, Wo = conv2d_shapes(x, w, stride, padding)
        cfg = gemm_config(M)
        t = {k: int(v or cfg[k]) for k, v in (("BM", BM), ("BN", BN), ("BK", BK), ("TM", TM), ("TN", TN))}
        check_reg_tunables(**t)
        N = B * Ho * Wo
        return (B, M, Ho, Wo), Launch(IMPLICIT_GEMM_REG_FILE, "conv2d_implicit_gemm_reg", {**t, "KSIZE": K},
                                      (B, C, M, H, W, padding, stride), grid=(ceil_div(N, t["BN"]), ceil_div(M, t["BM"]), 1),
                                      block=(reg_threads(t["BM"], t["BN"], t["TM"], t["TN"]), 1, 1))

    return remember(_plans, ("reg", x.shape, w.shape, stride, padding, BM, BN, BK, TM, TN), build)


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


def conv2d_direct_coarse(x, w, y=None, *, stride: int = 1, padding: int = 0, ROWS: int | None = None,
                         BLOCK: int | None = None):
    """ROWS default direct_rows(M, C, K); BLOCK 256."""
    def build():
        B, C, M, H, W, K, Ho, Wo = conv2d_shapes(x, w, stride, padding)
        if M * C * K * K > CONSTANT_FLOATS:
            raise ValueError(f"the mask has {M * C * K * K:,} floats, over the {CONSTANT_FLOATS:,} of constant memory")
        rows = int(ROWS or direct_rows(M, C, K))
        block = int(BLOCK or 256)
        threads = B * ceil_div(Ho, rows) * Wo
        return (B, M, Ho, Wo), Launch(DIRECT_COARSE_FILE, "conv2d_direct_coarse",
                                      {"M_OUT": M, "C_IN": C, "KSIZE": K, "STRIDE": stride, "ROWS": rows, "BLOCK": block},
                                      (B, H, W, padding), grid=(ceil_div(threads, block), 1, 1), block=(block, 1, 1))

    shape, launch = remember(_plans, ("coarse", x.shape, w.shape, stride, padding, ROWS, BLOCK), build)
    y = output(y, shape, x)
    launch.with_mask(w, x, y)
    return y


# ---- step 4: register-tiled direct convolution, mask in shared memory --------------------------------

def regtile_config(M: int, C: int, K: int) -> dict:
    """Default micro-tile for conv2d_direct_regtile, from an H200 sweep of MT, ROWS and BLOCK on the
    three small-channel layers (2026-11-22; chapter 5 sweeps ROWS x BLOCK on fa17):
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
    return C * K * K * MT * 4 <= SHARED_DEFAULT_MAX


def conv2d_direct_regtile(x, w, y=None, *, stride: int = 1, padding: int = 0, MT: int | None = None,
                          ROWS: int | None = None, BLOCK: int | None = None):
    """Tunables left out come from regtile_config(M, C, K)."""
    shape, launch = _regtile_plan(x, w, stride, padding, MT, ROWS, BLOCK)
    y = output(y, shape, x)
    launch(x, w, y)
    return y


def _regtile_plan(x, w, stride, padding, MT=None, ROWS=None, BLOCK=None):
    """(output shape, Launch) of conv2d_direct_regtile, worked out once per shape and tunables."""
    def build():
        B, C, M, H, W, K, Ho, Wo = conv2d_shapes(x, w, stride, padding)
        cfg = regtile_config(M, C, K)
        mt, rows, block = int(MT or cfg["MT"]), int(ROWS or cfg["ROWS"]), int(BLOCK or cfg["BLOCK"])
        if mt % 4:
            raise ValueError(f"MT={mt}: must be a multiple of 4")
        if not regtile_fits(M, C, K, mt):
            raise ValueError(f"the mask slice C·K²·MT = {C * K * K * mt:,} floats does not fit in 48 KB of shared memory")
        threads = B * ceil_div(Ho, rows) * Wo
        return (B, M, Ho, Wo), Launch(DIRECT_REGTILE_FILE, "conv2d_direct_regtile",
                                      {"M_OUT": M, "C_IN": C, "KSIZE": K, "STRIDE": stride, "MT": mt, "ROWS": rows,
                                       "BLOCK": block},
                                      (B, H, W, padding), grid=(ceil_div(threads, block), ceil_div(M, mt), 1),
                                      block=(block, 1, 1))

    return remember(_plans, ("regtile", x.shape, w.shape, stride, padding, MT, ROWS, BLOCK), build)


# ---- the implementations and the dispatcher ----------------------------------------------------------

IMPLICIT_GEMM = Impl("implicit GEMM", conv2d_implicit_gemm, config=lambda s: {"TILE": 16, "KSIZE": 0}, key="igemm")
IMPLICIT_GEMM_REG = Impl("implicit GEMM, register-tiled", conv2d_implicit_gemm_reg, config=lambda s: gemm_config(s.M), key="igemm_reg")
DIRECT_COARSE = Impl("direct, coarsened (mask in constant)", conv2d_direct_coarse,
                     applies=lambda s: direct_fits(s.M, s.C, s.K),
                     config=lambda s: {"ROWS": direct_rows(s.M, s.C, s.K), "BLOCK": 256}, key="direct_coarse")
DIRECT_REGTILE = Impl("direct, register-tiled (mask in shared)", conv2d_direct_regtile,
                      applies=lambda s: regtile_fits(s.M, s.C, s.K), config=lambda s: regtile_config(s.M, s.C, s.K), key="direct_regtile")
#: The chapter's implementations, by the name the figures use.
IMPLEMENTATIONS = (IMPLICIT_GEMM, IMPLICIT_GEMM_REG, DIRECT_COARSE, DIRECT_REGTILE)


def pick(shape: Workload) -> Impl:
    """The kernel a layer shape gets: the course's "several kernels for several layer sizes". Two
    rules, from what limits each layer, checked on an H200 (2026-11-22):

    - A short reduction (C·K² ≤ 256) and few maps (M ≤ 64), and the block's mask slice fits in
      shared memory: conv2d_direct_regtile. These layers (lenet_c1 C·K² = 49, lenet_c3 196, fa17
      25) waste most of a GEMM's tile: it pads M to BM and the 25- to 196-long reduction to its BK
      steps (lenet_c1: 10% of its multiply-adds useful). The direct kernel loads each input value
      once into a register for MT maps x ROWS rows and reads the mask as 16-byte broadcasts; its
      limit is instruction issue, not DRAM (chapter 5's cards). Measured: lenet_c1 0.95 ms direct
      vs 12.5 ms GEMM, lenet_c3 2.08 vs 6.69 ms, fa17 0.62 vs 1.10 ms.
    - Otherwise (resnet: C·K² = 576, days100: 288, M = 64–128): conv2d_implicit_gemm_reg,
      compute-bound, with gemm_config's tile.

    best = pick(shape); best(x, w) runs it with best.config(shape)'s tunables."""
    if isinstance(shape, str):
        shape = workloads.get(shape)
    if shape.C * shape.K * shape.K <= 256 and shape.M <= 64 and DIRECT_REGTILE.applies(shape):
        return DIRECT_REGTILE
    return IMPLICIT_GEMM_REG


_best: dict = {}
_PLAN_OF = {"direct_regtile": _regtile_plan, "igemm_reg": _reg_plan}      # by the Impl.key pick() gives


def plan(impl: Impl, x, w, stride: int, padding: int, **tunables) -> tuple:
    """(y's shape, the Launch) of a kernel pick() gives, for tensors of x's and w's shapes (meta
    tensors will do): the launch conv2d_best keeps per shape, for a caller that keeps its own
    (chapter 8's dX through this forward)."""
    return _PLAN_OF[impl.key](x, w, stride, padding, **tunables)


def conv2d_best(x, w, y=None, *, stride: int = 1, padding: int = 0):
    """The kernel pick() chooses for this shape, launched with its tunables (the same launch as
    pick(shape)(x, w, ...), kept per shape: one lookup per call)."""
    key = (x.shape, w.shape, stride, padding)
    hit = _best.get(key)
    if hit is None:
        shape = Workload.of(x, w, stride=stride, padding=padding)
        impl = pick(shape)
        hit = _best[key] = plan(impl, x, w, stride, padding, **impl.config(shape))
    out_shape, launch = hit
    y = output(y, out_shape, x)
    launch(x, w, y)
    return y
