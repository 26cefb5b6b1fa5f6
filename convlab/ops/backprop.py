"""Chapter 8 launchers: the backward pass of a convolution layer (kernels/08_backprop/), and a
torch.autograd.Function that trains with the course's own kernels.

dE/dX (the input gradient), f(dy, w, dx=None, *, stride=1, padding=0, input_size=(H, W), **tunables)
-> dx. input_size may be left out for stride 1 (it follows from dy); with stride > 1 several input
sizes give one output size, so it is needed then.
- conv2d_input_grad_scatter: the course's pseudo-code, one thread per dy element, atomicAdd into
  every dx element it came from (dx zeroed first). Any stride and padding.
- conv2d_input_grad_gather: a transposed convolution with the flipped mask, one thread per
  CT channels x ROWS rows of a dx column, no atomics. Any stride (row/column phases) and padding.
- conv2d_input_grad_forward: stride 1 only: flip and transpose the mask (mask_flip.cu), then run
  chapter 5's pick for the transposed layer on dy with padding K-1-padding. For many channels.
- pick_input_grad(shape) / conv2d_input_grad_best: which of these a layer shape gets.

dE/dW (the weight gradient), f(x, dy, dw=None, *, stride=1, padding=0, kernel_size=K, **tunables)
-> dw. kernel_size likewise may be left out for stride 1.
- conv2d_weight_grad_atomic: the course's pseudo-code, one thread per dy element, atomicAdd into
  all C*K*K weights of its map (dw zeroed first). Any stride and padding.
- conv2d_weight_grad_direct: sums in registers over many pixels per thread, then warp shuffles and
  shared memory per block, then per-block partial sums added by a second pass (reduce_partials.cu,
  deterministic) or, final="atomic", atomicAdded by each block. For small C*K*K (lenet_c1, fa17).
- conv2d_weight_grad_gemm: split-K implicit GEMM, dW = dY . U^T over the batch's pixels, partial
  sums per split, then the same second pass (or final="atomic"). For the many-channel layers.
- pick_weight_grad(shape) / conv2d_weight_grad_best.

Conv2dFunction (autograd): forward with convlab.ops.fused.conv2d_best, backward with the two
*_best launchers; the bias, if any, is added and reduced with torch (the course's kernels have
none). float32, plain layers: the drop-in for every layer torch takes is convlab.ops.dropin
(conv2d, Conv2d), which runs the layers these kernels take on them. CPU tensors on the emulator,
CUDA tensors on a GPU: whatever device the active backend puts tensors on.
"""
from __future__ import annotations

import functools

import torch

from ..gpu._limits import GRID_X_MAX, GRID_YZ_MAX, INT32_MAX, SHARED_DEFAULT_MAX
from ..measuring.workloads import Workload
from . import Impl, ceil_div, fused, new_output, out_size, output
from ._kernels import Launch, remember, sm_count
from .shapes import check_tensors, conv2d_shapes, dims

DX_SCATTER_FILE = "kernels/08_backprop/conv2d_dx_scatter.cu"
DX_GATHER_FILE = "kernels/08_backprop/conv2d_dx_gather.cu"
DW_ATOMIC_FILE = "kernels/08_backprop/conv2d_dw_atomic.cu"
DW_DIRECT_FILE = "kernels/08_backprop/conv2d_dw_direct.cu"
DW_GEMM_FILE = "kernels/08_backprop/conv2d_dw_gemm.cu"
REDUCE_FILE = "kernels/08_backprop/reduce_partials.cu"
FLIP_FILE = "kernels/08_backprop/mask_flip.cu"

FINALS = ("partials", "atomic")

#: the row chapter 8 measures Conv2dFunction by (forward, dX and dW through autograd), and its key
AUTOGRAD = "ours: autograd (Conv2dFunction)"
AUTOGRAD_KEY = "autograd"

_plans: dict = {}


# ---- shapes ------------------------------------------------------------------------------------

def _x_shape(dy, w, stride, padding, input_size):
    """x's shape for a dX launcher: (B from dy, C from w, input_size), which stride 1 implies."""
    B, M, Ho, Wo = dims(dy)
    C, K = int(w.shape[1]), int(w.shape[2])
    if input_size is None:
        if stride != 1:
            raise ValueError(f"with stride {stride} several input sizes give dy's {Ho}x{Wo}: pass input_size=(H, W)")
        input_size = (Ho - 1 + K - 2 * padding, Wo - 1 + K - 2 * padding)
    H, W = (int(v) for v in input_size)
    return (B, C, H, W)


def _w_shape(x, dy, stride, padding, kernel_size):
    """w's shape for a dW launcher: (M from dy, C from x, kernel_size), which stride 1 implies."""
    B, C, H, W = dims(x)
    M, Ho = int(dy.shape[1]), int(dy.shape[2])
    if kernel_size is None:
        if stride != 1:
            raise ValueError(f"with stride {stride} several mask sizes give dy's {Ho} rows: pass kernel_size=K")
        kernel_size = H + 2 * padding - Ho + 1
    K = int(kernel_size)
    return (M, C, K, K)


def reduce_partials(partial, out, nparts: int, n: int, PARTS_Y: int | None = None):
    """out[i] = sum over j < nparts of partial[j*n + i], in a fixed order (kernels/08_backprop/reduce_partials.cu).
    PARTS_Y rows are read at once: 32 (blocks of 1,024 threads) for many rows, 8 for a few."""
    _reduce_plan(nparts, n, PARTS_Y)(partial, out)
    return out


def _reduce_plan(nparts: int, n: int, PARTS_Y: int | None = None) -> Launch:
    parts_y = int(PARTS_Y or (32 if nparts >= 256 else 8))
    return remember(_plans, ("reduce", nparts, n, parts_y), lambda: Launch(
        REDUCE_FILE, "reduce_partials", {"PARTS_Y": parts_y}, (nparts, n), grid=(ceil_div(n, 32),), block=(32, parts_y)))


# ---- dE/dX -------------------------------------------------------------------------------------

def conv2d_input_grad_scatter(dy, w, dx=None, *, stride: int = 1, padding: int = 0, input_size=None,
                              BLOCK: int | None = None):
    """dx by scatter with atomics (kernels/08_backprop/conv2d_dx_scatter.cu); zeroes dx first."""
    def build():
        B, C, M, H, W, K, Ho, Wo = conv2d_shapes(x_shape, w, stride, padding, dy=dy)
        blocks = min(ceil_div(B * M * Ho * Wo, block), GRID_X_MAX)
        return Launch(DX_SCATTER_FILE, "conv2d_dx_scatter", {"BLOCK": block}, (B, C, M, H, W, K, padding, stride),
                      grid=(blocks,), block=(block,))

    check_tensors(("fp32",), dy=dy, w=w)
    x_shape = _x_shape(dy, w, stride, padding, input_size)
    block = int(BLOCK or 256)
    launch = remember(_plans, ("dx_scatter", dy.shape, w.shape, stride, padding, x_shape, block), build)
    dx = output(dx, x_shape, dy, name="dx")
    dx.zero_()
    launch(dy, w, dx)
    return dx


def _best_rows(n: int, target: int, halo: int) -> int:
    """Rows per thread near `target` that waste the least: minimises strips * (rows + halo), the
    loads of one column, over target/2 .. target (ties: more rows)."""
    best = None
    for r in range(max(1, target // 2), target + 1):
        cost = ceil_div(n, r) * (r + halo)
        if best is None or cost <= best[0]:
            best = (cost, r)
    return best[1]


def gather_config(C: int, M: int, K: int, stride: int = 1, H: int | None = None) -> dict:
    """Default tunables of conv2d_dx_gather, chosen from what ptxas reports (nvcc 13, sm_90,
    `-Xptxas -v` and the SASS instruction counts), not from a GPU sweep:
    - CT (dx channels per thread): C=1 -> 1, C=2 -> 2, C<=4 -> 4, more -> 8. MV (maps per mask
      load) makes that load 16 bytes where it costs no registers (C=2: 2 maps x 2 channels), else 1.
      (C=1 with MV=4: ptxas hoists all 4 maps' dy columns and spills.)
    - ROWS: C=1: 16 rows (the dy loads per FMA fall with more rows: lenet_c1 per map 154 loads for
      735 FMAs at 15 rows, 105 for 392 at 8); C=2 and C<=4: 4; more: 2 (CT*ROWS = 8-16
      accumulators); then adjusted to waste the fewest rows of H (lenet_c1: 86 rows = 6 strips of 15).
    - MIN_BLOCKS (__launch_bounds__): the registers it allows without spilling: C=1 3 (168
      registers), C=2 5 (96), else 4 (128)."""
    if C == 1:
        CT, MV, rows, mb = 1, 1, 16, 3
    elif C == 2:
        CT, MV, rows, mb = 2, 2, 4, 5
    elif C <= 4:
        CT, MV, rows, mb = 4, 1, 4, 4
    else:
        CT, MV, rows, mb = 8, 1, 2, 4
    KS = ceil_div(K, stride)
    if H is not None:
        rows = _best_rows(ceil_div(H, stride), rows, KS - 1)
    return {"CT": CT, "MV": MV, "ROWS": rows, "BLOCK": 128, "MIN_BLOCKS": mb}


def conv2d_input_grad_gather(dy, w, dx=None, *, stride: int = 1, padding: int = 0, input_size=None,
                             CT: int | None = None, MV: int | None = None, ROWS: int | None = None,
                             BLOCK: int | None = None, MIN_BLOCKS: int | None = None, mchunk: int | None = None):
    """dx by gather, no atomics (kernels/08_backprop/conv2d_dx_gather.cu). Tunables left out come from
    gather_config; mchunk: maps whose mask slice shared memory holds at once (default: as many as fit
    in 48 KB)."""
    check_tensors(("fp32",), dy=dy, w=w)
    x_shape = _x_shape(dy, w, stride, padding, input_size)
    launch = _gather_plan(dy, w, stride, padding, x_shape, CT, MV, ROWS, BLOCK, MIN_BLOCKS, mchunk)
    dx = output(dx, x_shape, dy, name="dx")
    launch(dy, w, dx)
    return dx


def _gather_plan(dy, w, stride, padding, x_shape, CT=None, MV=None, ROWS=None, BLOCK=None, MIN_BLOCKS=None,
                 mchunk=None) -> Launch:
    """The Launch of conv2d_dx_gather, worked out once per shape and tunables."""
    def build():
        B, C, M, H, W, K, Ho, Wo = conv2d_shapes(x_shape, w, stride, padding, dy=dy)
        cfg = gather_config(C, M, K, stride, H)
        ct, mv = int(CT or cfg["CT"]), int(MV or cfg["MV"])
        rows, block = int(ROWS or cfg["ROWS"]), int(BLOCK or cfg["BLOCK"])
        min_blocks = int(MIN_BLOCKS or cfg["MIN_BLOCKS"])
        KS = ceil_div(K, stride)
        KP = KS * stride
        per_group = KP * KP * mv * ct * 4                   # bytes of mask per group of MV maps
        fit = SHARED_DEFAULT_MAX // per_group * mv
        if fit < mv:
            raise ValueError(f"one group of MV={mv} maps x CT={ct} channels of a {K}x{K} mask needs {per_group:,} "
                             "bytes of shared memory, over 48 KB: lower CT or MV")
        chunk = min(ceil_div(M, mv) * mv, fit) if mchunk is None else int(mchunk)
        if chunk % mv or chunk < mv or chunk * KP * KP * ct * 4 > SHARED_DEFAULT_MAX:
            raise ValueError(f"mchunk={chunk}: must be a multiple of MV={mv} whose mask slice fits in 48 KB")
        strips = ceil_div(ceil_div(H, stride), rows)
        threads = B * stride * strips * W
        if threads > INT32_MAX // 2:
            raise ValueError(f"{threads:,} threads: too many for int indices")
        defines = {"KSIZE": K, "STRIDE": stride, "CT": ct, "MV": mv, "ROWS": rows, "BLOCK": block,
                   "MIN_BLOCKS": min_blocks}
        return Launch(DX_GATHER_FILE, "conv2d_dx_gather", defines, (B, C, M, H, W, padding, chunk),
                      grid=(ceil_div(threads, block), ceil_div(C, ct), 1), block=(block,),
                      shared=chunk * KP * KP * ct * 4)

    return remember(_plans, ("dx_gather", dy.shape, w.shape, stride, padding, x_shape, CT, MV, ROWS, BLOCK,
                             MIN_BLOCKS, mchunk), build)


def flip_transpose(w, wt=None):
    """wt[c][m][ky][kx] = w[m][c][K-1-ky][K-1-kx] (kernels/08_backprop/mask_flip.cu)."""
    check_tensors(("fp32",), w=w)
    M, C, K, _ = (int(s) for s in w.shape)
    wt = output(wt, (C, M, K, K), w, name="wt")
    _flip_plan(w)(w, wt)
    return wt


def _flip_plan(w) -> Launch:
    M, C, K, _ = (int(s) for s in w.shape)
    return remember(_plans, ("flip", w.shape), lambda: Launch(
        FLIP_FILE, "mask_flip_transpose", None, (M, C, K), grid=(ceil_div(M * C * K * K, 256),), block=(256,)))


def conv2d_input_grad_forward(dy, w, dx=None, *, stride: int = 1, padding: int = 0, input_size=None):
    """dx as a forward convolution: chapter 5's pick for the transposed layer (M channels in, C maps
    out, so fused.gemm_config(C)'s tile for a GEMM) on dy with the flipped, transposed mask and
    padding K-1-padding. Stride 1 and padding <= K-1 only."""
    check_tensors(("fp32",), dy=dy, w=w)
    x_shape = _x_shape(dy, w, stride, padding, input_size)
    impl, tunables, pad_t = _forward_plan(dy, w, stride, padding, x_shape)
    dx = output(dx, x_shape, dy, name="dx")
    return impl(dy, flip_transpose(w), dx, stride=1, padding=pad_t, **tunables)


def _forward_plan(dy, w, stride, padding, x_shape):
    """(chapter 5's pick() for the transposed layer, its tunables, the padding), once per shape."""
    def build():
        B, C, M, H, W, K, Ho, Wo = conv2d_shapes(x_shape, w, stride, padding, dy=dy)
        if stride != 1:
            raise ValueError("conv2d_input_grad_forward needs stride 1 (with stride s the transposed convolution "
                             "would need dy spread out with s-1 zeros between pixels): use the gather kernel")
        if padding > K - 1:
            raise ValueError(f"padding {padding} > K-1 = {K - 1}: the forward would need negative padding; use the "
                             "gather kernel")
        shape = Workload("", B=B, C=M, M=C, H=Ho, W=Wo, K=K, stride=1, padding=K - 1 - padding)
        impl = fused.pick(shape)
        return impl, impl.config(shape), K - 1 - padding

    return remember(_plans, ("dx_forward", dy.shape, w.shape, stride, padding, x_shape), build)


# ---- dE/dW -------------------------------------------------------------------------------------

def conv2d_weight_grad_atomic(x, dy, dw=None, *, stride: int = 1, padding: int = 0, kernel_size=None,
                              BLOCK: int | None = None):
    """dw with one atomicAdd per product (kernels/08_backprop/conv2d_dw_atomic.cu); zeroes dw first."""
    def build():
        B, C, M, H, W, K, Ho, Wo = conv2d_shapes(x, w_shape, stride, padding, dy=dy)
        blocks = min(ceil_div(B * M * Ho * Wo, block), GRID_X_MAX)
        return Launch(DW_ATOMIC_FILE, "conv2d_dw_atomic", {"BLOCK": block}, (B, C, M, H, W, K, padding, stride),
                      grid=(blocks,), block=(block,))

    check_tensors(("fp32",), x=x, dy=dy)
    w_shape = _w_shape(x, dy, stride, padding, kernel_size)
    block = int(BLOCK or 256)
    launch = remember(_plans, ("dw_atomic", x.shape, dy.shape, stride, padding, w_shape, block), build)
    dw = output(dw, w_shape, x, name="dw")
    dw.zero_()
    launch(x, dy, dw)
    return dw


def direct_dw_config(C: int, M: int, K: int, stride: int = 1, Ho: int | None = None) -> dict:
    """Default tunables of conv2d_dw_direct: MT maps per thread so that the MT*K*K accumulators
    stay near 100 (K=7: 2, K=5: 4, K=3: 11), ROWS 4, and __launch_bounds__ for 3 blocks of 128 per
    SM (168 registers: no spills at these sizes with nvcc 13, sm_90)."""
    MT = max(1, min(M, 100 // (K * K)))
    rows = 4 if Ho is None else _best_rows(Ho, 4, K - 1)
    return {"MT": MT, "ROWS": rows, "BLOCK": 128, "MIN_BLOCKS": 3}


def direct_dw_chunks(tasks: int, pairs: int, block: int, min_blocks: int, sms: int) -> int:
    """conv2d_dw_direct's chunks of tasks (blocks per (map group, channel) pair, so partial sums per
    weight): about 4 waves of resident blocks in all, at least one task per thread. One chunk, so no
    second pass, where that leaves each thread at most 4 tasks: on small layers one launch fewer
    cost less than the GPU time it gives up (benchmarks/backward_launches.py, 4 -> 8 maps)."""
    if tasks <= 4 * block:
        return 1
    return max(1, min(ceil_div(tasks, block), ceil_div(4 * sms * min_blocks, pairs)))


def direct_dw_fits(C: int, M: int, K: int) -> bool:
    """The small-channel rule: at most 64 taps per map (lenet_c1: 49, fa17: 25)."""
    return C * K * K <= 64


def _second_pass(launch, n, nparts, reduce, a, b, dw, final):
    """Run a reduction kernel straight into dw (final="atomic", or a single part: its partial sums
    are dw) or into partial sums, then add those with `reduce` (a reduce_partials Launch)."""
    if final == "atomic":
        dw.zero_()
        launch(a, b, dw)
    elif nparts == 1:
        launch(a, b, dw)
    else:
        partial = new_output((nparts * n,), dw)        # NaN under cl.debug and on the emulator
        launch(a, b, partial)
        reduce(partial, dw)
    return dw


def conv2d_weight_grad_direct(x, dy, dw=None, *, stride: int = 1, padding: int = 0, kernel_size=None,
                              MT: int | None = None, ROWS: int | None = None, BLOCK: int | None = None,
                              MIN_BLOCKS: int | None = None, chunks: int | None = None, final: str | None = None):
    """dw by reduction (kernels/08_backprop/conv2d_dw_direct.cu). final="partials" (default): per-block
    sums, then reduce_partials (deterministic); final="atomic": each block atomicAdds its sums into dw.
    Tunables left out come from direct_dw_config; chunks: about 4 waves of resident blocks."""
    check_tensors(("fp32",), x=x, dy=dy)
    final_ = final or "partials"
    if final_ not in FINALS:
        raise ValueError(f"final must be one of {FINALS}, got {final!r}")
    w_shape = _w_shape(x, dy, stride, padding, kernel_size)
    n, n_chunks, launch, reduce = _direct_dw_plan(x, dy, stride, padding, w_shape, MT, ROWS, BLOCK, MIN_BLOCKS,
                                                  chunks, final_)
    dw = output(dw, w_shape, x, name="dw")
    return _second_pass(launch, n, n_chunks, reduce, x, dy, dw, final_)


def _direct_dw_plan(x, dy, stride, padding, w_shape, MT=None, ROWS=None, BLOCK=None, MIN_BLOCKS=None, chunks=None,
                    final_="partials"):
    """(dw's elements, chunks, the Launch, its reduce_partials Launch) of conv2d_dw_direct, once per shape."""
    def build():
        B, C, M, H, W, K, Ho, Wo = conv2d_shapes(x, w_shape, stride, padding, dy=dy)
        cfg = direct_dw_config(C, M, K, stride, Ho)
        mt, rows = int(MT or cfg["MT"]), int(ROWS or cfg["ROWS"])
        block, min_blocks = int(BLOCK or cfg["BLOCK"]), int(MIN_BLOCKS or cfg["MIN_BLOCKS"])
        if block % 32 or block > 1024:
            raise ValueError(f"BLOCK={block}: a multiple of 32, at most 1024 (the block sum uses whole warps)")
        if (block // 32) * mt * K * K * 4 > SHARED_DEFAULT_MAX:
            raise ValueError(f"MT={mt}, K={K}, BLOCK={block}: the per-warp sums need more than 48 KB of shared memory")
        pairs = ceil_div(M, mt) * C
        tasks = B * ceil_div(Ho, rows) * Wo
        n_chunks = int(chunks or direct_dw_chunks(tasks, pairs, block, min_blocks, sm_count()))
        if n_chunks * pairs > GRID_X_MAX:
            raise ValueError(f"{n_chunks} chunks x {pairs} (map group, channel) pairs: over the grid's x limit")
        defines = {"KSIZE": K, "STRIDE": stride, "MT": mt, "ROWS": rows, "BLOCK": block, "MIN_BLOCKS": min_blocks,
                   "FINAL_ATOMIC": int(final_ == "atomic")}
        n = M * C * K * K
        return n, n_chunks, Launch(DW_DIRECT_FILE, "conv2d_dw_direct", defines, (B, C, M, H, W, padding, n_chunks),
                                   grid=(n_chunks * pairs,), block=(block,)), _reduce_plan(n_chunks, n)

    return remember(_plans, ("dw_direct", x.shape, dy.shape, stride, padding, w_shape, MT, ROWS, BLOCK, MIN_BLOCKS,
                             chunks, final_), build)


def gemm_dw_config(C: int, M: int, K: int) -> dict:
    """Default tiles of conv2d_dw_gemm: the block as tall as the maps need (16, 32, 64 or 128 maps,
    micro-tile 4 or 8 rows), 64 taps wide (32 when C*K*K <= 32) with 4 per thread, 16 pixels per
    step. 64-256 threads, at most 128 registers (nvcc 13, sm_90, no spills)."""
    if M <= 16:
        BM, TM = 16, 4
    elif M <= 32:
        BM, TM = 32, 4
    elif M <= 64:
        BM, TM = 64, 8
    else:
        BM, TM = 128, 8
    BN = 32 if C * K * K <= 32 else 64
    return {"BM": BM, "BN": BN, "BK": 16, "TM": TM, "TN": 4}


def check_gemm_dw_tunables(BM: int, BN: int, BK: int, TM: int, TN: int) -> None:
    """The kernel's static_asserts, as a Python error before compiling."""
    nt = (BM // TM) * (BN // TN) if TM and TN else 0
    ok = (TM % 4 == 0 and TN % 4 == 0 and BM % TM == 0 and BN % TN == 0 and 0 < nt <= 1024
          and nt % BK == 0 and BM % (nt // BK) == 0 and BN % (nt // BK) == 0)
    if not ok:
        raise ValueError(f"tile BM={BM} BN={BN} BK={BK} TM={TM} TN={TN} ({nt} threads) does not split evenly: "
                         "TM, TN multiples of 4 dividing BM, BN; threads a multiple of BK; BM and BN multiples "
                         "of threads/BK; at most 1024 threads")
    smem = 4 * 2 * BK * ((BM + 4) + (BN + 4))
    if smem > SHARED_DEFAULT_MAX:
        raise ValueError(f"tile BM={BM} BN={BN} BK={BK} needs {smem:,} bytes of shared memory, over 48 KB")


def conv2d_weight_grad_gemm(x, dy, dw=None, *, stride: int = 1, padding: int = 0, kernel_size=None,
                            BM: int | None = None, BN: int | None = None, BK: int | None = None,
                            TM: int | None = None, TN: int | None = None, splits: int | None = None,
                            final: str | None = None):
    """dw by split-K implicit GEMM (kernels/08_backprop/conv2d_dw_gemm.cu), then reduce_partials
    (final="partials", the default: deterministic) or block atomics (final="atomic"). Tiles left out
    come from gemm_dw_config; splits: about 2 x 2,048 resident threads per SM in all."""
    check_tensors(("fp32",), x=x, dy=dy)
    final_ = final or "partials"
    if final_ not in FINALS:
        raise ValueError(f"final must be one of {FINALS}, got {final!r}")
    w_shape = _w_shape(x, dy, stride, padding, kernel_size)
    n, n_splits, launch, reduce = _gemm_dw_plan(x, dy, stride, padding, w_shape, BM, BN, BK, TM, TN, splits, final_)
    dw = output(dw, w_shape, x, name="dw")
    return _second_pass(launch, n, n_splits, reduce, x, dy, dw, final_)


def _gemm_dw_plan(x, dy, stride, padding, w_shape, BM=None, BN=None, BK=None, TM=None, TN=None, splits=None,
                  final_="partials"):
    """(dw's elements, splits, the Launch, its reduce_partials Launch) of conv2d_dw_gemm, once per shape."""
    def build():
        B, C, M, H, W, K, Ho, Wo = conv2d_shapes(x, w_shape, stride, padding, dy=dy)
        cfg = gemm_dw_config(C, M, K)
        t = {k: int(v or cfg[k]) for k, v in (("BM", BM), ("BN", BN), ("BK", BK), ("TM", TM), ("TN", TN))}
        check_gemm_dw_tunables(**t)
        N, KD = B * Ho * Wo, C * K * K
        nthreads = (t["BM"] // t["TM"]) * (t["BN"] // t["TN"])
        tiles = ceil_div(KD, t["BN"]) * ceil_div(M, t["BM"])
        n_splits = splits
        if n_splits is None:   # about 2 x 2,048 resident threads per SM in all, at least 16 steps per split
            n_splits = min(ceil_div(2 * 2048 * sm_count() // nthreads, tiles), ceil_div(N, 16 * t["BK"]))
        n_splits = max(1, min(int(n_splits), ceil_div(N, t["BK"]), GRID_YZ_MAX))
        n_per = ceil_div(ceil_div(N, n_splits), t["BK"]) * t["BK"]
        n_splits = ceil_div(N, n_per)
        defines = {**t, "KSIZE": K, "FINAL_ATOMIC": int(final_ == "atomic")}
        launch = Launch(DW_GEMM_FILE, "conv2d_dw_gemm", defines, (B, C, M, H, W, padding, stride, n_per),
                        grid=(ceil_div(KD, t["BN"]), ceil_div(M, t["BM"]), n_splits), block=(nthreads,))
        return M * KD, n_splits, launch, _reduce_plan(n_splits, M * KD)

    return remember(_plans, ("dw_gemm", x.shape, dy.shape, stride, padding, w_shape, BM, BN, BK, TM, TN, splits,
                             final_), build)


# ---- the implementations and the picks -----------------------------------------------------------

DX_SCATTER = Impl("dX scatter (atomics)", conv2d_input_grad_scatter, op="conv2d_dx", config=lambda s: {"BLOCK": 256}, key="dx_scatter")
DX_GATHER = Impl("dX gather (transposed conv)", conv2d_input_grad_gather, op="conv2d_dx",
                 config=lambda s: gather_config(s.C, s.M, s.K, s.stride, s.H), key="dx_gather")
DX_FORWARD = Impl("dX forward of flipped mask", conv2d_input_grad_forward, op="conv2d_dx",
                  applies=lambda s: s.stride == 1 and s.padding <= s.K - 1, key="dx_forward")
DW_ATOMIC = Impl("dW atomics (per product)", conv2d_weight_grad_atomic, op="conv2d_dw", config=lambda s: {"BLOCK": 256}, key="dw_atomic")
DW_DIRECT = Impl("dW direct (second pass)", conv2d_weight_grad_direct, op="conv2d_dw",
                 config=lambda s: direct_dw_config(s.C, s.M, s.K, s.stride, s.Ho), key="dw_direct")
DW_DIRECT_ATOMIC = Impl("dW direct (block atomics)", functools.partial(conv2d_weight_grad_direct, final="atomic"),
                        op="conv2d_dw", config=lambda s: direct_dw_config(s.C, s.M, s.K, s.stride, s.Ho), key="dw_direct_atomic")
DW_GEMM = Impl("dW GEMM (second pass)", conv2d_weight_grad_gemm, op="conv2d_dw",
               config=lambda s: gemm_dw_config(s.C, s.M, s.K), key="dw_gemm")
DW_GEMM_ATOMIC = Impl("dW GEMM (block atomics)", functools.partial(conv2d_weight_grad_gemm, final="atomic"),
                      op="conv2d_dw", config=lambda s: gemm_dw_config(s.C, s.M, s.K), key="dw_gemm_atomic")
#: The chapter's implementations, by the name the figures use: dX (op "conv2d_dx"), then dW ("conv2d_dw").
IMPLEMENTATIONS = (DX_SCATTER, DX_GATHER, DX_FORWARD, DW_ATOMIC, DW_DIRECT, DW_DIRECT_ATOMIC, DW_GEMM, DW_GEMM_ATOMIC)


def pick_input_grad(shape: Workload) -> Impl:
    """The dE/dX kernel a layer shape gets.

    - Many input channels (C >= 32: resnet, days100), stride 1, padding <= K-1: the flipped mask
      through chapter 5's forward (its pick takes the register-tiled implicit GEMM there: the
      transposed convolution has M channels in and C maps out, a GEMM of C x M*K*K x B*H*W).
    - Otherwise the gather kernel, with gather_config(): few channels (lenet_c1, lenet_c3, fa17),
      any stride.
    The scatter kernel is never the pick: its atomics cost more than the gather's loads."""
    return DX_FORWARD if shape.C >= 32 and DX_FORWARD.applies(shape) else DX_GATHER


def pick_weight_grad(shape: Workload) -> Impl:
    """The dE/dW kernel a layer shape gets.

    - At most 64 taps per map (C*K*K <= 64: lenet_c1 49, fa17 25): the direct reduction. Each
      thread reuses every input value for MT maps x K rows of taps from registers; a GEMM would
      pad the 4 x 49 product (lenet_c1) to its tiles and stage everything through shared memory.
    - Otherwise (lenet_c3: 16 x 196, resnet: 64 x 576, days100: 128 x 288): the split-K GEMM.
    Both end with the deterministic second pass. The atomic kernel is never the pick."""
    return DW_DIRECT if direct_dw_fits(shape.C, shape.M, shape.K) else DW_GEMM


_best: dict = {}


def conv2d_input_grad_best(dy, w, dx=None, *, stride: int = 1, padding: int = 0, input_size=None):
    """pick_input_grad()'s kernel for this shape, launched with its tunables (the same launches as
    pick_input_grad(shape)(dy, w, ...), kept per shape: one lookup per call)."""
    check_tensors(("fp32",), dy=dy, w=w)
    key = ("dx", dy.shape, w.shape, stride, padding, input_size)
    hit = _best.get(key)
    if hit is None:
        hit = _best[key] = _input_grad_best_plan(dy, w, stride, padding, input_size)
    x_shape, launch, flip, wt_shape = hit
    dx = output(dx, x_shape, dy, name="dx")
    if flip is None:
        launch(dy, w, dx)
    else:                   # the forward of the flipped, transposed mask
        wt = new_output(wt_shape, w)
        flip(w, wt)
        launch(dy, wt, dx)
    return dx


def _input_grad_best_plan(dy, w, stride, padding, input_size):
    """(dx's shape, the convolution's Launch, the mask flip's Launch or None, the flipped mask's shape)."""
    x_shape = _x_shape(dy, w, stride, padding, input_size)
    B, C, H, W = x_shape
    M, K = int(w.shape[0]), int(w.shape[2])
    shape = Workload("", B=B, C=C, M=M, H=H, W=W, K=K, stride=stride, padding=padding)
    impl = pick_input_grad(shape)
    if impl is DX_GATHER:
        return x_shape, _gather_plan(dy, w, stride, padding, x_shape, **impl.config(shape)), None, None
    impl, tunables, pad_t = _forward_plan(dy, w, stride, padding, x_shape)
    wt = torch.empty((C, M, K, K), device="meta")         # only its shape is read
    _, launch = fused.plan(impl, dy, wt, 1, pad_t, **tunables)
    return x_shape, launch, _flip_plan(w), (C, M, K, K)


def conv2d_weight_grad_best(x, dy, dw=None, *, stride: int = 1, padding: int = 0, kernel_size=None):
    """pick_weight_grad()'s kernel for this shape, launched with its tunables (the same launches as
    pick_weight_grad(shape)(x, dy, ...), kept per shape: one lookup per call)."""
    check_tensors(("fp32",), x=x, dy=dy)
    key = ("dw", x.shape, dy.shape, stride, padding, kernel_size)
    hit = _best.get(key)
    if hit is None:
        w_shape = M, C, K, _ = _w_shape(x, dy, stride, padding, kernel_size)
        B, _, H, W = dims(x)
        shape = Workload("", B=B, C=C, M=M, H=H, W=W, K=K, stride=stride, padding=padding)
        plan = _direct_dw_plan if pick_weight_grad(shape) is DW_DIRECT else _gemm_dw_plan
        hit = _best[key] = (w_shape, *plan(x, dy, stride, padding, w_shape, **pick_weight_grad(shape).config(shape)))
    w_shape, n, nparts, launch, reduce = hit
    return _second_pass(launch, n, nparts, reduce, x, dy, output(dw, w_shape, x, name="dw"), "partials")


# ---- autograd ----------------------------------------------------------------------------------

class Conv2dFunction(torch.autograd.Function):
    """y = conv2d(x, w) + bias with the course's kernels: forward by convlab.ops.fused.conv2d_best,
    backward by conv2d_input_grad_best and conv2d_weight_grad_best. float32, NCHW.

        y = Conv2dFunction.apply(x, w, bias, stride, padding)      # bias may be None
    """

    @staticmethod
    def forward(ctx, x, w, bias=None, stride: int = 1, padding: int = 0):
        stride, padding = int(stride), int(padding)
        x, w = x.contiguous(), w.contiguous()
        check_tensors(("fp32",), x=x, w=w)
        y = fused.conv2d_best(x, w, stride=stride, padding=padding)
        if bias is not None:
            y.add_(bias.view(1, -1, 1, 1))
        ctx.save_for_backward(x, w)
        ctx.stride, ctx.padding, ctx.has_bias = stride, padding, bias is not None
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        dy = dy.contiguous()
        if dy.dtype != torch.float32:
            dy = dy.float()
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = conv2d_input_grad_best(dy, w, stride=ctx.stride, padding=ctx.padding, input_size=x.shape[2:])
        if ctx.needs_input_grad[1]:
            dw = conv2d_weight_grad_best(x, dy, stride=ctx.stride, padding=ctx.padding, kernel_size=w.shape[2])
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = dy.sum(dim=(0, 2, 3))
        return dx, dw, db, None, None
