"""Chapter 8 launchers: the backward pass of a convolution layer (kernels/08_backprop/), and a
torch.autograd.Function that trains with the course's own kernels.

dE/dX (the input gradient), fn(dy, w, x_shape, dx=None, *, stride, pad, **tunables) -> dx
(x_shape: x or its shape; with stride > 1 several input sizes give one output size):
- conv2d_input_grad_scatter: the course's pseudo-code, one thread per dy element, atomicAdd into
  every dx element it came from (dx zeroed first). Any stride and padding.
- conv2d_input_grad_gather: a transposed convolution with the flipped mask, one thread per
  CT channels x ROWS rows of a dx column, no atomics. Any stride (row/column phases) and padding.
- conv2d_input_grad_forward: stride 1 only: flip and transpose the mask (mask_flip.cu), then run
  chapter 5's best forward kernel on dy with padding K-1-pad. For the many-channel layers.
- conv2d_input_grad_best / pick_input_grad: which of these a layer shape gets.

dE/dW (the weight gradient), fn(x, dy, w_shape, dw=None, *, stride, pad, **tunables) -> dw
(w_shape: w or its shape; only the shape is read):
- conv2d_weight_grad_atomic: the course's pseudo-code, one thread per dy element, atomicAdd into
  all C*K*K weights of its map (dw zeroed first). Any stride and padding.
- conv2d_weight_grad_direct: sums in registers over many pixels per thread, then warp shuffles and
  shared memory per block, then per-block partial sums added by a second pass (reduce_partials.cu,
  deterministic) or, final="atomic", atomicAdded by each block. For small C*K*K (lenet_c1, fa17).
- conv2d_weight_grad_gemm: split-K implicit GEMM, dW = dY . U^T over the batch's pixels, partial
  sums per split, then the same second pass (or final="atomic"). For the many-channel layers.
- conv2d_weight_grad_best / pick_weight_grad.

Conv2dFunction (autograd) and CourseConv2d (an nn.Module like nn.Conv2d): forward with
convlab.ops.fused.conv2d_best, backward with the two *_best launchers; the bias, if any, is added
and reduced with torch (the course's kernels have none). CPU tensors on the emulator, CUDA tensors
on a GPU: whatever device the active backend puts tensors on.
"""
from __future__ import annotations

import math

import torch

from . import GRID_X_LIMIT, GRID_YZ_LIMIT, INT32_MAX, ceil_div, out_size
from ._kernels import module, output, padding

DX_SCATTER_FILE = "kernels/08_backprop/conv2d_dx_scatter.cu"
DX_GATHER_FILE = "kernels/08_backprop/conv2d_dx_gather.cu"
DW_ATOMIC_FILE = "kernels/08_backprop/conv2d_dw_atomic.cu"
DW_DIRECT_FILE = "kernels/08_backprop/conv2d_dw_direct.cu"
DW_GEMM_FILE = "kernels/08_backprop/conv2d_dw_gemm.cu"
REDUCE_FILE = "kernels/08_backprop/reduce_partials.cu"
FLIP_FILE = "kernels/08_backprop/mask_flip.cu"

MAX_SHARED = 48 * 1024          # bytes of shared memory a block may use without opting in
FINALS = ("partials", "atomic")


# ---- shapes ------------------------------------------------------------------------------------

def _shape_of(t_or_shape):
    return tuple(int(s) for s in (t_or_shape.shape if isinstance(t_or_shape, torch.Tensor) else t_or_shape))


def grad_shapes(x_shape, w_shape, dy_shape, stride: int = 1, pad: int = 0):
    """(B, C, M, H, W, K, Ho, Wo), checking that x, w and dy belong to one convolution."""
    x_shape, w_shape, dy_shape = _shape_of(x_shape), _shape_of(w_shape), _shape_of(dy_shape)
    if len(x_shape) != 4 or len(w_shape) != 4 or len(dy_shape) != 4:
        raise ValueError(f"expected x (B,C,H,W), w (M,C,K,K), dy (B,M,Ho,Wo); got {x_shape}, {w_shape}, {dy_shape}")
    B, C, H, W = x_shape
    M, Cw, K, K2 = w_shape
    if Cw != C or K2 != K:
        raise ValueError(f"w {w_shape} does not fit x {x_shape}: need (M, {C}, K, K)")
    if stride < 1 or pad < 0:
        raise ValueError(f"stride {stride} and pad {pad}: need stride >= 1, pad >= 0")
    Ho, Wo = out_size(H, K, stride, pad), out_size(W, K, stride, pad)
    if Ho < 1 or Wo < 1:
        raise ValueError(f"no output: input {H}x{W}, K={K}, stride {stride}, pad {pad}")
    if dy_shape != (B, M, Ho, Wo):
        raise ValueError(f"dy has shape {dy_shape}, but x {x_shape}, w {w_shape}, stride {stride}, pad {pad} "
                         f"give y the shape {(B, M, Ho, Wo)}")
    for name, n in (("x", B * C * H * W), ("dy", B * M * Ho * Wo)):
        if n > INT32_MAX // 2:
            raise ValueError(f"{name} has {n:,} elements: too many for int indices")
    return B, C, M, H, W, K, Ho, Wo


def _check_in(t, name):
    if not isinstance(t, torch.Tensor) or t.dtype != torch.float32:
        raise TypeError(f"{name} must be a float32 tensor (the course's kernels are fp32), got "
                        f"{getattr(t, 'dtype', type(t).__name__)}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (NCHW); call .contiguous() first")


def _sms() -> int:
    """SMs on a GPU; on the emulator its OS threads (only sets how many blocks a grid-stride kernel gets)."""
    import convlab as cl
    return max(1, int(cl.device().threads))


def _workspace(n: int, like: torch.Tensor) -> torch.Tensor:
    """Scratch for partial sums. On the emulator poisoned with NaN, so a partial never written shows
    in the result; on a GPU uninitialised (every slot is written before it is read)."""
    import convlab as cl
    if cl.backend() == "emu":
        return torch.full((n,), float("nan"), dtype=torch.float32, device=like.device)
    return torch.empty(n, dtype=torch.float32, device=like.device)


def reduce_partials(partial, out, nparts: int, n: int, PARTS_Y: int | None = None):
    """out[i] = sum over j < nparts of partial[j*n + i], in a fixed order (kernels/08_backprop/reduce_partials.cu).
    PARTS_Y rows are read at once: 32 (blocks of 1,024 threads) for many rows, 8 for a few."""
    PARTS_Y = int(PARTS_Y or (32 if nparts >= 256 else 8))
    kern = module(REDUCE_FILE, {"PARTS_Y": PARTS_Y}).kernel("reduce_partials")
    kern(partial, out, nparts, n, grid=(ceil_div(n, 32), 1, 1), block=(32, PARTS_Y, 1))
    return out


# ---- dE/dX -------------------------------------------------------------------------------------

def conv2d_input_grad_scatter(dy, w, x_shape, dx=None, *, stride: int = 1, pad: int = 0,
                              padding: int | None = None, BLOCK: int = 256):
    """dx by scatter with atomics (kernels/08_backprop/conv2d_dx_scatter.cu); zeroes dx first."""
    pad = _pad(pad, padding)
    _check_in(dy, "dy")
    _check_in(w, "w")
    B, C, M, H, W, K, Ho, Wo = grad_shapes(x_shape, w, dy, stride, pad)
    dx = output(dx, (B, C, H, W))
    dx.zero_()
    kern = module(DX_SCATTER_FILE, {"BLOCK": BLOCK}).kernel("conv2d_dx_scatter")
    blocks = min(ceil_div(B * M * Ho * Wo, BLOCK), GRID_X_LIMIT)
    kern(dy, w, dx, B, C, M, H, W, K, pad, stride, grid=(blocks, 1, 1), block=(BLOCK, 1, 1))
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
    `-Xptxas -v` and the SASS instruction counts), not yet from a GPU sweep (benchmarks/
    conv_backward.py --sweep does that):
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


def conv2d_input_grad_gather(dy, w, x_shape, dx=None, *, stride: int = 1, pad: int = 0,
                             padding: int | None = None, CT: int | None = None, MV: int | None = None,
                             ROWS: int | None = None, BLOCK: int | None = None, MIN_BLOCKS: int | None = None,
                             mchunk: int | None = None):
    """dx by gather, no atomics (kernels/08_backprop/conv2d_dx_gather.cu). mchunk: maps whose mask
    slice shared memory holds at once (default: as many as fit in 48 KB)."""
    pad = _pad(pad, padding)
    _check_in(dy, "dy")
    _check_in(w, "w")
    B, C, M, H, W, K, Ho, Wo = grad_shapes(x_shape, w, dy, stride, pad)
    cfg = gather_config(C, M, K, stride, H)
    CT, MV = int(CT or cfg["CT"]), int(MV or cfg["MV"])
    ROWS, BLOCK = int(ROWS or cfg["ROWS"]), int(BLOCK or cfg["BLOCK"])
    MIN_BLOCKS = int(MIN_BLOCKS or cfg["MIN_BLOCKS"])
    KS = ceil_div(K, stride)
    KP = KS * stride
    per_group = KP * KP * MV * CT * 4                   # bytes of mask per group of MV maps
    fit = MAX_SHARED // per_group * MV
    if fit < MV:
        raise ValueError(f"one group of MV={MV} maps x CT={CT} channels of a {K}x{K} mask needs {per_group:,} bytes "
                         "of shared memory, over 48 KB: lower CT or MV")
    mchunk = min(ceil_div(M, MV) * MV, fit) if mchunk is None else int(mchunk)
    if mchunk % MV or mchunk < MV or mchunk * KP * KP * CT * 4 > MAX_SHARED:
        raise ValueError(f"mchunk={mchunk}: must be a multiple of MV={MV} whose mask slice fits in 48 KB")
    dx = output(dx, (B, C, H, W))
    strips = ceil_div(ceil_div(H, stride), ROWS)
    threads = B * stride * strips * W
    if threads > INT32_MAX // 2:
        raise ValueError(f"{threads:,} threads: too many for int indices")
    grid = (ceil_div(threads, BLOCK), ceil_div(C, CT), 1)
    defines = {"KSIZE": K, "STRIDE": stride, "CT": CT, "MV": MV, "ROWS": ROWS, "BLOCK": BLOCK, "MIN_BLOCKS": MIN_BLOCKS}
    kern = module(DX_GATHER_FILE, defines).kernel("conv2d_dx_gather")
    kern(dy, w, dx, B, C, M, H, W, pad, mchunk, grid=grid, block=(BLOCK, 1, 1), shared=mchunk * KP * KP * CT * 4)
    return dx


def flip_transpose(w, wt=None):
    """wt[c][m][ky][kx] = w[m][c][K-1-ky][K-1-kx] (kernels/08_backprop/mask_flip.cu)."""
    _check_in(w, "w")
    M, C, K, _ = (int(s) for s in w.shape)
    wt = output(wt, (C, M, K, K))
    n = M * C * K * K
    module(FLIP_FILE).kernel("mask_flip_transpose")(w, wt, M, C, K, grid=(ceil_div(n, 256), 1, 1), block=(256, 1, 1))
    return wt


def conv2d_input_grad_forward(dy, w, x_shape, dx=None, *, stride: int = 1, pad: int = 0,
                              padding: int | None = None):
    """dx as a forward convolution: chapter 5's pick for the transposed layer (M channels in, C maps
    out) on dy with the flipped, transposed mask and padding K-1-pad; a 32-map GEMM tile when C <= 32.
    Stride 1 and pad <= K-1 only."""
    from . import fused

    pad = _pad(pad, padding)
    _check_in(dy, "dy")
    _check_in(w, "w")
    B, C, M, H, W, K, Ho, Wo = grad_shapes(x_shape, w, dy, stride, pad)
    if stride != 1:
        raise ValueError("conv2d_input_grad_forward needs stride 1 (with stride s the transposed convolution "
                         "would need dy spread out with s-1 zeros between pixels): use the gather kernel")
    if pad > K - 1:
        raise ValueError(f"pad {pad} > K-1 = {K - 1}: the forward would need negative padding; use the gather kernel")
    dx = output(dx, (B, C, H, W))
    wt = flip_transpose(w)
    _, fn, tunables = fused.pick({"B": B, "C": M, "M": C, "H": Ho, "W": Wo, "K": K, "stride": 1, "pad": K - 1 - pad})
    if fn is fused.conv2d_implicit_gemm_reg and C <= 32:
        # C maps out: a 64-map tile would be half empty (days100: 32); 32 x 128 with 4 x 8 per thread.
        tunables = {"BM": 32, "BN": 128, "BK": 16, "TM": 4, "TN": 8}
    return fn(dy, wt, dx, stride=1, pad=K - 1 - pad, **tunables)


def pick_input_grad(B: int, C: int, M: int, H: int, W: int, K: int, stride: int = 1, pad: int = 0) -> tuple:
    """(name, launcher, tunables) for dE/dX of a layer shape.

    - Many input channels (C >= 32: resnet, days100), stride 1, pad <= K-1: the flipped mask
      through chapter 5's forward (it picks the register-tiled implicit GEMM there: the transposed
      convolution has M channels in and C maps out, a GEMM of C x M*K*K x B*H*W).
    - Otherwise the gather kernel, with gather_config(): few channels (lenet_c1, lenet_c3, fa17),
      any stride.
    The scatter kernel is never the pick: its atomics cost more than the gather's loads."""
    if stride == 1 and pad <= K - 1 and C >= 32:
        return "forward of the flipped mask (chapter 5 best)", conv2d_input_grad_forward, {}
    return "gather (transposed convolution)", conv2d_input_grad_gather, gather_config(C, M, K, stride, H)


def conv2d_input_grad_best(dy, w, x_shape, dx=None, *, stride: int = 1, pad: int = 0, padding: int | None = None):
    pad = _pad(pad, padding)
    B, C, H, W = _shape_of(x_shape)
    M, _, K, _ = _shape_of(w)
    _, fn, tunables = pick_input_grad(B, C, M, H, W, K, stride, pad)
    return fn(dy, w, x_shape, dx, stride=stride, pad=pad, **tunables)


# ---- dE/dW -------------------------------------------------------------------------------------

def conv2d_weight_grad_atomic(x, dy, w_shape, dw=None, *, stride: int = 1, pad: int = 0,
                              padding: int | None = None, BLOCK: int = 256):
    """dw with one atomicAdd per product (kernels/08_backprop/conv2d_dw_atomic.cu); zeroes dw first."""
    pad = _pad(pad, padding)
    _check_in(x, "x")
    _check_in(dy, "dy")
    B, C, M, H, W, K, Ho, Wo = grad_shapes(x, w_shape, dy, stride, pad)
    dw = output(dw, (M, C, K, K))
    dw.zero_()
    kern = module(DW_ATOMIC_FILE, {"BLOCK": BLOCK}).kernel("conv2d_dw_atomic")
    blocks = min(ceil_div(B * M * Ho * Wo, BLOCK), GRID_X_LIMIT)
    kern(x, dy, dw, B, C, M, H, W, K, pad, stride, grid=(blocks, 1, 1), block=(BLOCK, 1, 1))
    return dw


def direct_dw_config(C: int, M: int, K: int, stride: int = 1, Ho: int | None = None) -> dict:
    """Default tunables of conv2d_dw_direct: MT maps per thread so that the MT*K*K accumulators
    stay near 100 (K=7: 2, K=5: 4, K=3: 11), ROWS 4, and __launch_bounds__ for 3 blocks of 128 per
    SM (168 registers: no spills at these sizes with nvcc 13, sm_90)."""
    MT = max(1, min(M, 100 // (K * K)))
    rows = 4 if Ho is None else _best_rows(Ho, 4, K - 1)
    return {"MT": MT, "ROWS": rows, "BLOCK": 128, "MIN_BLOCKS": 3}


def direct_dw_fits(C: int, M: int, K: int) -> bool:
    """The small-channel rule: at most 64 taps per map (lenet_c1: 49, fa17: 25)."""
    return C * K * K <= 64


def conv2d_weight_grad_direct(x, dy, w_shape, dw=None, *, stride: int = 1, pad: int = 0,
                              padding: int | None = None, MT: int | None = None, ROWS: int | None = None,
                              BLOCK: int | None = None, MIN_BLOCKS: int | None = None,
                              chunks: int | None = None, final: str = "partials"):
    """dw by reduction (kernels/08_backprop/conv2d_dw_direct.cu). final="partials": per-block sums,
    then reduce_partials (deterministic); final="atomic": each block atomicAdds its sums into dw."""
    pad = _pad(pad, padding)
    _check_in(x, "x")
    _check_in(dy, "dy")
    if final not in FINALS:
        raise ValueError(f"final must be one of {FINALS}, got {final!r}")
    B, C, M, H, W, K, Ho, Wo = grad_shapes(x, w_shape, dy, stride, pad)
    cfg = direct_dw_config(C, M, K, stride, Ho)
    MT, ROWS = int(MT or cfg["MT"]), int(ROWS or cfg["ROWS"])
    BLOCK, MIN_BLOCKS = int(BLOCK or cfg["BLOCK"]), int(MIN_BLOCKS or cfg["MIN_BLOCKS"])
    if BLOCK % 32 or BLOCK > 1024:
        raise ValueError(f"BLOCK={BLOCK}: a multiple of 32, at most 1024 (the block sum uses whole warps)")
    if (BLOCK // 32) * MT * K * K * 4 > MAX_SHARED:
        raise ValueError(f"MT={MT}, K={K}, BLOCK={BLOCK}: the per-warp sums need more than 48 KB of shared memory")
    dw = output(dw, (M, C, K, K))
    pairs = ceil_div(M, MT) * C
    tasks = B * ceil_div(Ho, ROWS) * Wo
    if chunks is None:   # about 4 waves of resident blocks in all, at least one task per thread
        chunks = max(1, min(ceil_div(tasks, BLOCK), ceil_div(4 * _sms() * MIN_BLOCKS, pairs)))
    chunks = int(chunks)
    if chunks * pairs > GRID_X_LIMIT:
        raise ValueError(f"{chunks} chunks x {pairs} (map group, channel) pairs: over the grid's x limit")
    defines = {"KSIZE": K, "STRIDE": stride, "MT": MT, "ROWS": ROWS, "BLOCK": BLOCK, "MIN_BLOCKS": MIN_BLOCKS,
               "FINAL_ATOMIC": int(final == "atomic")}
    kern = module(DW_DIRECT_FILE, defines).kernel("conv2d_dw_direct")
    n = M * C * K * K
    if final == "atomic":
        dw.zero_()
        kern(x, dy, dw, B, C, M, H, W, pad, chunks, grid=(chunks * pairs, 1, 1), block=(BLOCK, 1, 1))
    else:
        partial = _workspace(chunks * n, dy)
        kern(x, dy, partial, B, C, M, H, W, pad, chunks, grid=(chunks * pairs, 1, 1), block=(BLOCK, 1, 1))
        reduce_partials(partial, dw, chunks, n)
    return dw


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
    if smem > MAX_SHARED:
        raise ValueError(f"tile BM={BM} BN={BN} BK={BK} needs {smem:,} bytes of shared memory, over 48 KB")


def conv2d_weight_grad_gemm(x, dy, w_shape, dw=None, *, stride: int = 1, pad: int = 0,
                            padding: int | None = None, BM: int | None = None, BN: int | None = None,
                            BK: int | None = None, TM: int | None = None, TN: int | None = None,
                            splits: int | None = None, final: str = "partials"):
    """dw by split-K implicit GEMM (kernels/08_backprop/conv2d_dw_gemm.cu), then reduce_partials
    (final="partials", deterministic) or block atomics (final="atomic")."""
    pad = _pad(pad, padding)
    _check_in(x, "x")
    _check_in(dy, "dy")
    if final not in FINALS:
        raise ValueError(f"final must be one of {FINALS}, got {final!r}")
    B, C, M, H, W, K, Ho, Wo = grad_shapes(x, w_shape, dy, stride, pad)
    cfg = gemm_dw_config(C, M, K)
    BM, BN, BK = int(BM or cfg["BM"]), int(BN or cfg["BN"]), int(BK or cfg["BK"])
    TM, TN = int(TM or cfg["TM"]), int(TN or cfg["TN"])
    check_gemm_dw_tunables(BM, BN, BK, TM, TN)
    dw = output(dw, (M, C, K, K))
    N, KD = B * Ho * Wo, C * K * K
    nthreads = (BM // TM) * (BN // TN)
    tiles = ceil_div(KD, BN) * ceil_div(M, BM)
    if splits is None:   # about 2 x 2,048 resident threads per SM in all, at least 16 steps per split
        splits = min(ceil_div(2 * 2048 * _sms() // nthreads, tiles), ceil_div(N, 16 * BK))
    splits = max(1, min(int(splits), ceil_div(N, BK), GRID_YZ_LIMIT))
    n_per = ceil_div(ceil_div(N, splits), BK) * BK
    splits = ceil_div(N, n_per)
    if ceil_div(M, BM) > GRID_YZ_LIMIT:
        raise ValueError(f"M={M}: too many map tiles for the grid's y limit")
    defines = {"BM": BM, "BN": BN, "BK": BK, "TM": TM, "TN": TN, "KSIZE": K, "FINAL_ATOMIC": int(final == "atomic")}
    kern = module(DW_GEMM_FILE, defines).kernel("conv2d_dw_gemm")
    grid = (ceil_div(KD, BN), ceil_div(M, BM), splits)
    n = M * KD
    if final == "atomic":
        dw.zero_()
        kern(x, dy, dw, B, C, M, H, W, pad, stride, n_per, grid=grid, block=(nthreads, 1, 1))
    else:
        partial = _workspace(splits * n, dy)
        kern(x, dy, partial, B, C, M, H, W, pad, stride, n_per, grid=grid, block=(nthreads, 1, 1))
        reduce_partials(partial, dw, splits, n)
    return dw


def pick_weight_grad(B: int, C: int, M: int, H: int, W: int, K: int, stride: int = 1, pad: int = 0) -> tuple:
    """(name, launcher, tunables) for dE/dW of a layer shape.

    - At most 64 taps per map (C*K*K <= 64: lenet_c1 49, fa17 25): the direct reduction. Each
      thread reuses every input value for MT maps x K rows of taps from registers; a GEMM would
      pad the 4 x 49 product (lenet_c1) to its tiles and stage everything through shared memory.
    - Otherwise (lenet_c3: 16 x 196, resnet: 64 x 576, days100: 128 x 288): the split-K GEMM.
    Both end with the deterministic second pass. The atomic kernel is never the pick."""
    Ho = out_size(H, K, stride, pad)
    if direct_dw_fits(C, M, K):
        return "direct reduction (registers, shared, second pass)", conv2d_weight_grad_direct, \
            direct_dw_config(C, M, K, stride, Ho)
    return "split-K implicit GEMM (second pass)", conv2d_weight_grad_gemm, gemm_dw_config(C, M, K)


def conv2d_weight_grad_best(x, dy, w_shape, dw=None, *, stride: int = 1, pad: int = 0, padding: int | None = None):
    pad = _pad(pad, padding)
    B, C, H, W = _shape_of(x)
    M, _, K, _ = _shape_of(w_shape)
    _, fn, tunables = pick_weight_grad(B, C, M, H, W, K, stride, pad)
    return fn(x, dy, w_shape, dw, stride=stride, pad=pad, **tunables)


def _pad(pad, padding_alias):
    return padding(pad, padding_alias)


#: The chapter's implementations by the name the figures use (default tunables).
INPUT_GRAD = {
    "dX scatter (atomics)": conv2d_input_grad_scatter,
    "dX gather (transposed conv)": conv2d_input_grad_gather,
    "dX forward of flipped mask": conv2d_input_grad_forward,
}
WEIGHT_GRAD = {
    "dW atomics (per product)": conv2d_weight_grad_atomic,
    "dW direct (second pass)": conv2d_weight_grad_direct,
    "dW direct (block atomics)": lambda *a, **k: conv2d_weight_grad_direct(*a, final="atomic", **k),
    "dW GEMM (second pass)": conv2d_weight_grad_gemm,
    "dW GEMM (block atomics)": lambda *a, **k: conv2d_weight_grad_gemm(*a, final="atomic", **k),
}


# ---- autograd ----------------------------------------------------------------------------------

class Conv2dFunction(torch.autograd.Function):
    """y = conv2d(x, w) + bias with the course's kernels: forward by convlab.ops.fused.conv2d_best,
    backward by conv2d_input_grad_best and conv2d_weight_grad_best. float32, NCHW.

        y = Conv2dFunction.apply(x, w, bias, stride, pad)      # bias may be None
    """

    @staticmethod
    def forward(ctx, x, w, bias=None, stride: int = 1, pad: int = 0):
        from . import fused

        stride, pad = int(stride), int(pad)
        x, w = x.contiguous(), w.contiguous()
        _check_in(x, "x")
        _check_in(w, "w")
        y = fused.conv2d_best(x, w, stride=stride, pad=pad)
        if bias is not None:
            y.add_(bias.view(1, -1, 1, 1))
        ctx.save_for_backward(x, w)
        ctx.stride, ctx.pad, ctx.has_bias = stride, pad, bias is not None
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
            dx = conv2d_input_grad_best(dy, w, x.shape, stride=ctx.stride, pad=ctx.pad)
        if ctx.needs_input_grad[1]:
            dw = conv2d_weight_grad_best(x, dy, w.shape, stride=ctx.stride, pad=ctx.pad)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = dy.sum(dim=(0, 2, 3))
        return dx, dw, db, None, None


def conv2d(x, w, bias=None, stride: int = 1, padding: int = 0):
    """Like torch.nn.functional.conv2d (square masks, int stride and padding), with the course's kernels."""
    return Conv2dFunction.apply(x, w, bias, stride, padding)


class CourseConv2d(torch.nn.Module):
    """nn.Conv2d's interface and initialisation (square kernel, int stride and padding, no groups
    or dilation) on the course's kernels. Parameters are named weight and bias, like nn.Conv2d's,
    so state dicts move between the two."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1,
                 padding: int = 0, bias: bool = True, device=None, dtype=None):
        super().__init__()
        if not isinstance(kernel_size, int) or not isinstance(stride, int) or not isinstance(padding, int):
            raise TypeError("CourseConv2d takes int kernel_size, stride and padding (square masks only)")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        kw = {"device": device, "dtype": dtype or torch.float32}
        self.weight = torch.nn.Parameter(torch.empty(out_channels, in_channels, kernel_size, kernel_size, **kw))
        self.bias = torch.nn.Parameter(torch.empty(out_channels, **kw)) if bias else None
        self.reset_parameters()

    def reset_parameters(self):
        """As nn.Conv2d does it (the same calls, so the same random numbers for the same seed)."""
        torch.nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in = self.in_channels * self.kernel_size * self.kernel_size
            bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
            torch.nn.init.uniform_(self.bias, -bound, bound)

    @classmethod
    def from_torch(cls, conv: torch.nn.Conv2d) -> "CourseConv2d":
        """A CourseConv2d with a copy of an nn.Conv2d's weights."""
        k, s, p = conv.kernel_size, conv.stride, conv.padding
        if k[0] != k[1] or s[0] != s[1] or isinstance(p, str) or p[0] != p[1] or conv.groups != 1 \
                or conv.dilation != (1, 1):
            raise ValueError(f"{conv}: only square kernels, equal int stride/padding, no groups or dilation")
        m = cls(conv.in_channels, conv.out_channels, k[0], s[0], p[0], bias=conv.bias is not None,
                device=conv.weight.device)
        with torch.no_grad():
            m.weight.copy_(conv.weight)
            if conv.bias is not None:
                m.bias.copy_(conv.bias)
        return m

    def forward(self, x):
        return Conv2dFunction.apply(x, self.weight, self.bias, self.stride, self.padding)

    def extra_repr(self):
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, bias={self.bias is not None}")
