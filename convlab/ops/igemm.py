"""Chapter 9 launcher: the fp32 implicit GEMM (kernels/09_general/conv2d_igemm_f32.cu), warp-tiled,
split-K, a plain-GEMM path for 1x1 layers; float32 FFMA, no tensor cores.

- conv2d_igemm_f32(x, w, y=None, *, stride=1, padding=0, bias=None, **tunables) -> y
  x (B, C, H, W) and w (M, C, K, K) float32, NCHW, contiguous; bias (M,) or None.
  Tunables: BM, BN, BK (block tile), WM, WN (warp tile), SPLIT (splits of the reduction),
  MIN_BLOCKS (__launch_bounds__). Those left out come from igemm_config(shape).
- conv2d_igemm_f32_dx(dy, w, dx=None, *, stride=1, padding=0, input_size=None, **tunables) -> dx
  dE/dX of a stride-1 layer (padding <= K-1): the same kernel on dy, with the mask flipped and
  transposed (C maps of M channels) and padding K-1-padding; its tunables from
  igemm_config(dx_workload(shape)).
- conv2d_igemm_f32_dw(x, dy, dw=None, *, stride=1, padding=0, kernel_size=None, **tunables) -> dw
  dE/dW of a stride-1 layer with square dy planes: the same kernel over the batch (x and dy with
  images and channels swapped), split-K; its tunables from igemm_config(dw_workload(shape)).
- igemm_config(shape, sms=None): the tile and split for a layer (a Workload).
- igemm_mode(shape, BK): which of the kernel's three loaders a layer gets (0 general, 1 one filter
  tap per step, 2 plain GEMM for 1x1 stride 1 unpadded).
- kmajor(w, order, flip=False): the mask as Wt[k][m], as the kernel reads it, made by
  igemm_mask_kmajor on every call (a copy kept per tensor would miss changes made through w.data);
  dw_mask(dy, order): the same for dW's convolution, whose mask is dy.
"""
from __future__ import annotations


import torch

from .._limits import INT32_MAX, SHARED_DEFAULT_MAX
from ..workloads import Workload
from . import Impl, ceil_div, conv2d_shapes, new_output, output
from ._kernels import Launch, remember, sm_count

FILE = "kernels/09_general/conv2d_igemm_f32.cu"
TM = TN = 8            # the micro-tile: 64 accumulators, 16 shared loads per 64 FFMAs
KD_ALIGN = 32          # the transposed mask's rows are padded to a multiple of this (BK divides it)
MAX_SPLIT = 256        # dW: a reduction of B*Ho*Wo onto a few tiles of output

# The split-K cost model's machine (an H200; on a GPU the SM count comes from the device). Only the
# ratio of arithmetic to memory time matters for the choice, so the peak figures suffice.
SMS = 132
SM_FLOPS = 2 * 128 * 1.98e9     # fp32 FFMA per SM per clock x 2 x boost clock
DRAM_BYTES_S = 4.0e12           # sustained HBM bandwidth
REGS_PER_THREAD = 128           # what an 8x8 micro-tile needs: bounds the blocks per SM
FULL_RATE_WARPS = 16            # resident warps per SM at which the FFMA pipes stay busy

# Measured choices that override the rule below for a layer, keyed by (B, C, M, H, W, K, stride,
# padding): what benchmarks/f32_layers.py prints as "TUNED" after timing every candidate on a GPU.
TUNED: dict = {}

_plans: dict = {}


def threads(BM: int, BN: int, WM: int, WN: int) -> int:
    return (BM // WM) * (BN // WN) * 32


def igemm_mode(shape: Workload, BK: int) -> int:
    """2: 1x1, stride 1, no padding (a plain GEMM); 1: C a multiple of BK (one filter tap per
    step); 0: any other layer (the 7x7 stem's C = 3)."""
    if shape.K == 1 and shape.stride == 1 and shape.padding == 0:
        return 2
    return 1 if shape.C % BK == 0 else 0


def _blocks_per_sm(nthreads: int, BM: int, BN: int, BK: int) -> int:
    smem = 4 * 2 * BK * (BM + BN)
    return max(1, min(65536 // (REGS_PER_THREAD * nthreads), 2048 // nthreads, 228 * 1024 // (smem + 1024)))


def split_time(shape: Workload, cfg: dict, split: int, sms: int) -> float:
    """Estimated seconds for a split: the busiest SM's blocks x the arithmetic of each, at the rate
    its resident warps sustain, plus the partial sums written and read again (2 x split outputs)."""
    BM, BN, BK = cfg["BM"], cfg["BN"], cfg["BK"]
    N, KD = shape.B * shape.Ho * shape.Wo, shape.C * shape.K * shape.K
    steps = ceil_div(KD, BK)
    per = ceil_div(steps, split)
    blocks = ceil_div(shape.M, BM) * ceil_div(N, BN) * ceil_div(steps, per)
    nthreads = threads(BM, BN, cfg["WM"], cfg["WN"])
    per_sm = ceil_div(blocks, sms)
    warps = min(per_sm, _blocks_per_sm(nthreads, BM, BN, BK)) * nthreads // 32
    rate = SM_FLOPS * min(1.0, warps / FULL_RATE_WARPS)
    t = per_sm * 2 * BM * BN * BK * per / rate
    if split > 1:
        t += 2 * split * 4 * shape.M * N / DRAM_BYTES_S
    return t


#: Layers of more than 64 maps with at least MANY_PIXELS outputs (B·Ho·Wo) take a 128-map x 64-pixel
#: tile; DEEP_K: the reduction (C·K²) from which that tile steps 16 deep. From benchmarks/f32_layers.py
#: on an H200 (benchmarks/results/f32_layers_NVIDIA_H200.csv, every candidate on each layer): on the
#: 3x3 layers of 28x28 and 14x14 maps, the 1x1 1024->256 and the VGG layer the 128x64 tile was the
#: fastest, ahead of 128x128 (twice the blocks of 128 threads, a fuller last wave); BK=16 was faster
#: on the 3x3 reductions of 2304, BK=8 on the 1x1 of 1024. With fewer pixels (7x7 maps) the
#: 128x128 tile split deep was faster: half the partial sums written per split.
MANY_PIXELS = 4096
DEEP_K = 2048


def _best_split(shape: Workload, cfg: dict, sms: int) -> int:
    steps = ceil_div(shape.C * shape.K * shape.K, cfg["BK"])
    splits = [s for s in range(1, MAX_SPLIT + 1) if steps // s >= 4] or [1]
    return min(splits, key=lambda s: split_time(shape, cfg, s, sms))


def igemm_config(shape: Workload, sms: int | None = None) -> dict:
    """The tunables for a layer. The tile: BM as many maps as the layer has, up to 128 (128, 64 or
    32), warp tiles of 32 maps x 64 pixels, BK 8 (the 128x128 tile's 64 accumulators, prefetch
    registers and addresses fit the 128 registers two blocks per SM allow; BK 16 spills); 128
    pixels (BN), or 64 for layers of more than 64 maps and MANY_PIXELS outputs (BK 16 from DEEP_K).
    The split: the one split_time() estimates fastest, so a layer with few pixels (7x7, 14x14),
    whose tile grid leaves SMs idle or half a wave short, gets its reduction cut in parts; for the
    128x64 tile half that (the estimate overrates its split: the measured best was half).
    A layer in TUNED gets the measured choice instead."""
    tuned = TUNED.get((shape.B, shape.C, shape.M, shape.H, shape.W, shape.K, shape.stride, shape.padding))
    if tuned is not None:
        return dict(tuned)
    sms = sms or sm_count()
    if shape.M > 64 and shape.B * shape.Ho * shape.Wo >= MANY_PIXELS:
        cfg = {"BM": 128, "BN": 64, "BK": 16 if shape.C * shape.K * shape.K >= DEEP_K else 8, "WM": 32, "WN": 64,
               "MIN_BLOCKS": 1}
        cfg["SPLIT"] = max(1, _best_split(shape, cfg, sms) // 2)
        return cfg
    BM = 128 if shape.M > 64 else 64 if shape.M > 32 else 32
    cfg = {"BM": BM, "BN": 128, "BK": 8, "WM": 32, "WN": 64}
    cfg["MIN_BLOCKS"] = 2 if threads(BM, 128, 32, 64) == 256 else 1
    cfg["SPLIT"] = _best_split(shape, cfg, sms)
    return cfg


def check_tunables(BM: int, BN: int, BK: int, WM: int, WN: int) -> None:
    """The kernel's static_asserts, as a Python error before compiling (and for sweeps to skip)."""
    n = threads(BM, BN, WM, WN) if WM and WN and BM % WM == 0 and BN % WN == 0 else 0
    ok = (n and (WM // TM) * (WN // TN) == 32 and WM % TM == 0 and WN % TN == 0 and BK in (4, 8, 16, 32)
          and n <= 1024 and n % (BM // 4) == 0 and (BK * BM // 4) % n == 0
          and n % (BN // 4) == 0 and (BK * BN // 4) % n == 0
          and ((n % BN == 0 and BK % (n // BN) == 0) if n >= BN else BN % n == 0))
    if not ok:
        raise ValueError(f"tile BM={BM} BN={BN} BK={BK}, warp tile WM={WM} WN={WN} does not split evenly: "
                         f"need (WM/{TM})*(WN/{TN}) == 32 lanes, WM | BM, WN | BN, BK in 4, 8, 16, 32, and the "
                         "BKxBM and BKxBN tiles divisible into float4s over the threads (e.g. 128x128x8 with 32x64)")
    smem = 4 * 2 * BK * (BM + BN)
    if smem > SHARED_DEFAULT_MAX:
        raise ValueError(f"tile BM={BM} BN={BN} BK={BK} needs {smem:,} bytes of shared memory, over 48 KB")


# ---- the mask, K-major --------------------------------------------------------------------------

_mask_plans: dict = {}      # (w's shape, order, flip) -> (Wt's shape, its Launch)


def kmajor(w: torch.Tensor, order: int, flip: bool = False) -> torch.Tensor:
    """Wt[k][m] of the convolution by w (M, C, K, K): k = c*K*K + ky*K + kx (order 0) or
    (ky*K + kx)*C + c (order 1), Mp = M rounded up to 4 columns, KD rounded up to 32 rows, zeros in
    the padding. flip=True: of the stride-1 dE/dX convolution instead (C maps of M channels, the
    taps flipped). Made on every call: a copy kept per weight tensor would miss changes made through
    w.data (torch.autograd.gradcheck's perturbations, for one), which leave w._version as it was."""
    key = (tuple(w.shape), order, flip)
    plan = _mask_plans.get(key)
    if plan is None:
        M, C, K = int(w.shape[0]), int(w.shape[1]), int(w.shape[2])
        if flip:
            M, C = C, M
        Mp, KDp = ceil_div(M, 4) * 4, ceil_div(C * K * K, KD_ALIGN) * KD_ALIGN
        plan = _mask_plans[key] = ((KDp, Mp), Launch(FILE, "igemm_mask_kmajor", {"KSIZE": K}, (M, C, Mp, KDp, order, int(flip)),
                                                     grid=(min(ceil_div(KDp * Mp, 256), 4096), 1, 1), block=(256, 1, 1)))
    shape, launch = plan
    wt = torch.empty(shape, dtype=w.dtype, device=w.device)
    launch(w, wt)
    return wt


def dw_mask(dy: torch.Tensor, order: int) -> torch.Tensor:
    """The K-major mask of conv2d_igemm_f32_dw's convolution, whose mask is dy with images and
    maps swapped (M maps of B channels, Ho x Wo taps): Wt[(tap*B + b)][m] (order 1) or
    Wt[(b*Ho*Wo + tap)][m] (order 0) = dy[b][m][tap], padded as kmajor pads. One torch copy of dy
    into a view of Wt (dy changes every call: nothing is kept)."""
    B, M, Ho, Wo = (int(v) for v in dy.shape)
    KD, Mp = B * Ho * Wo, ceil_div(M, 4) * 4
    wt = torch.empty(ceil_div(KD, KD_ALIGN) * KD_ALIGN, Mp, dtype=dy.dtype, device=dy.device)
    wt[KD:].zero_()
    wt[:, M:].zero_()
    if order == 1:
        wt[:KD, :M].view(Ho, Wo, B, M).copy_(dy.permute(2, 3, 0, 1))
    else:
        wt[:KD, :M].view(B, Ho, Wo, M).copy_(dy.permute(0, 2, 3, 1))
    return wt


# ---- the launcher -------------------------------------------------------------------------------

TUNABLES = ("BM", "BN", "BK", "WM", "WN", "SPLIT", "MIN_BLOCKS")


def _plan(x, w_shape, stride, padding, aligned, tunables):
    def build():
        B, C, M, H, W, K, Ho, Wo = conv2d_shapes(x, torch.empty(w_shape, device="meta"), stride, padding)
        shape = Workload("", B, C, M, H, W, K, stride, padding)
        cfg = igemm_config(shape)
        t = {k: int(tunables[k] or cfg[k]) for k in TUNABLES}
        check_tunables(t["BM"], t["BN"], t["BK"], t["WM"], t["WN"])
        mode = igemm_mode(shape, t["BK"])
        P, N, KD = Ho * Wo, B * Ho * Wo, C * K * K
        steps = ceil_div(KD, t["BK"])
        per = ceil_div(steps, max(1, min(t["SPLIT"], steps)))
        split = ceil_div(steps, per)                     # every split non-empty
        if split * B * M * P > INT32_MAX // 2:
            raise ValueError(f"SPLIT={split}: {split} partial outputs of {B * M * P:,} floats are too many "
                             "for int indices; pass a smaller SPLIT")
        vec = int(P % 4 == 0)                            # 4 pixels of a group in one image
        defines = {k: t[k] for k in ("BM", "BN", "BK", "WM", "WN", "MIN_BLOCKS")}
        defines.update(KSIZE=K, MODE=mode, VEC4=int(mode == 2 and vec and aligned))
        nthreads = threads(t["BM"], t["BN"], t["WM"], t["WN"])
        gemm = Launch(FILE, "conv2d_igemm_f32", defines,
                      (B, C, M, H, W, Ho, Wo, padding, stride, ceil_div(M, 4) * 4),
                      grid=(ceil_div(M, t["BM"]) * ceil_div(N, t["BN"]), 1, split), block=(nthreads, 1, 1))
        reduce = None
        if split > 1:
            reduce = Launch(FILE, "igemm_splitk_reduce", defines, (split, B * M * P, M, P),
                            grid=(min(ceil_div(B * M * P, 256), 8 * SMS), 1, 1), block=(256, 1, 1))
        return (B, M, Ho, Wo), mode, split, vec, gemm, reduce

    key = (x.shape, w_shape, stride, padding, aligned, tuple(tunables[k] for k in TUNABLES))
    return remember(_plans, key, build)


def conv2d_igemm_f32(x, w, y=None, *, stride: int = 1, padding: int = 0, bias=None, BM: int | None = None,
                     BN: int | None = None, BK: int | None = None, WM: int | None = None, WN: int | None = None,
                     SPLIT: int | None = None, MIN_BLOCKS: int | None = None):
    """y = conv2d(x, w, bias): float32, NCHW. Tunables left out come from igemm_config(shape)."""
    _check_f32(x=x, w=w, bias=bias)
    if bias is not None and tuple(bias.shape) != (int(w.shape[0]),):
        raise ValueError(f"bias has shape {tuple(bias.shape)}, expected ({int(w.shape[0])},)")
    tunables = dict(BM=BM, BN=BN, BK=BK, WM=WM, WN=WN, SPLIT=SPLIT, MIN_BLOCKS=MIN_BLOCKS)
    return _run(x, lambda order: kmajor(w, order), tuple(w.shape), y, stride, padding, bias, tunables)


def conv2d_igemm_f32_dx(dy, w, dx=None, *, stride: int = 1, padding: int = 0, input_size=None,
                        BM: int | None = None, BN: int | None = None, BK: int | None = None, WM: int | None = None,
                        WN: int | None = None, SPLIT: int | None = None, MIN_BLOCKS: int | None = None):
    """dE/dX of a stride-1 layer: the same kernel on dy with the flipped, transposed mask
    (C maps of M channels) and padding K-1-padding (chapter 8's transposed convolution).
    Tunables left out come from igemm_config(dx_workload(shape))."""
    _check_f32(dy=dy, w=w)
    M, C, K = int(w.shape[0]), int(w.shape[1]), int(w.shape[2])
    if stride != 1:
        raise ValueError(f"stride {stride}: conv2d_igemm_f32_dx takes stride 1 only; for a strided layer use "
                         "convlab.ops.general.conv2d_general_dx")
    if not 0 <= padding <= K - 1:
        raise ValueError(f"padding {padding} with K={K}: dX as a convolution needs padding <= K-1")
    size = (int(dy.shape[2]) + K - 1 - 2 * padding, int(dy.shape[3]) + K - 1 - 2 * padding)
    if input_size is not None and tuple(input_size) != size:
        raise ValueError(f"input_size {tuple(input_size)}: at stride 1 dy {tuple(dy.shape)} comes from an input of "
                         f"{size}; leave input_size out")
    if dy.dim() != 4 or int(dy.shape[1]) != M:
        raise ValueError(f"dy {tuple(dy.shape)} does not fit w {tuple(w.shape)}: need (B, {M}, Ho, Wo)")
    tunables = dict(BM=BM, BN=BN, BK=BK, WM=WM, WN=WN, SPLIT=SPLIT, MIN_BLOCKS=MIN_BLOCKS)
    return _run(dy, lambda order: kmajor(w, order, flip=True), (C, M, K, K), dx, 1, K - 1 - padding, None,
                tunables, name="dx")


def conv2d_igemm_f32_dw(x, dy, dw=None, *, stride: int = 1, padding: int = 0, kernel_size=None,
                        BM: int | None = None, BN: int | None = None, BK: int | None = None, WM: int | None = None,
                        WN: int | None = None, SPLIT: int | None = None, MIN_BLOCKS: int | None = None):
    """dE/dW of a stride-1 layer whose dy planes are square, as a GEMM over the batch:
    dw[m][c][ky][kx] = sum over b, oy, ox of dy[b][m][oy][ox] * x[b][c][oy+ky-p][ox+kx-p], which is
    the same kernel's convolution of x with images and channels swapped (C images of B channels) by
    dy likewise (M maps of B channels, Ho x Wo taps; dw_mask), giving (C, M, K, K). The swaps are
    torch copies; the reduction (B*Ho*Wo) is long and the output small, so igemm_config splits it.
    Tunables left out come from igemm_config(dw_workload(shape))."""
    _check_f32(x=x, dy=dy)
    if x.dim() != 4 or dy.dim() != 4 or int(dy.shape[0]) != int(x.shape[0]):
        raise ValueError(f"x {tuple(x.shape)} and dy {tuple(dy.shape)}: need (B, C, H, W) and (B, M, Ho, Wo)")
    B, C, H, W = (int(v) for v in x.shape)
    M, Ho, Wo = (int(v) for v in dy.shape[1:])
    if stride != 1:
        raise ValueError(f"stride {stride}: conv2d_igemm_f32_dw takes stride 1 only; for a strided layer use "
                         "convlab.ops.general.conv2d_general_dw")
    if Ho != Wo:
        raise ValueError(f"dy planes {Ho}x{Wo}: conv2d_igemm_f32_dw needs square ones (they are its mask)")
    K = H + 2 * padding - Ho + 1
    if K < 1 or W + 2 * padding - Wo + 1 != K or kernel_size not in (None, K, (K, K), [K, K]):
        raise ValueError(f"x {tuple(x.shape)}, dy {tuple(dy.shape)}, padding {padding}: no square mask of the "
                         f"given kernel_size {kernel_size} maps the one to the other at stride 1")
    dw = output(dw, (M, C, K, K), x, name="dw")
    tunables = dict(BM=BM, BN=BN, BK=BK, WM=WM, WN=WN, SPLIT=SPLIT, MIN_BLOCKS=MIN_BLOCKS)
    xt = x.transpose(0, 1).contiguous()
    out = _run(xt, lambda order: dw_mask(dy, order), (M, B, Ho, Wo), None, 1, padding, None, tunables)
    dw.copy_(out.transpose(0, 1))
    return dw


def dw_workload(shape: Workload) -> Workload:
    """The convolution conv2d_igemm_f32_dw runs for a stride-1 layer's dE/dW."""
    return Workload(shape.name, shape.C, shape.B, shape.M, shape.H, shape.W, shape.Ho, 1, shape.padding)


def dx_workload(shape: Workload) -> Workload:
    """The convolution conv2d_igemm_f32_dx runs for a stride-1 layer's dE/dX."""
    return Workload(shape.name, shape.B, shape.M, shape.C, shape.Ho, shape.Wo, shape.K, 1,
                    shape.K - 1 - shape.padding)


def _check_f32(**tensors) -> None:
    for name, t in tensors.items():
        if t is None:
            continue
        if t.dtype != torch.float32:
            raise ValueError(f"{name} is {t.dtype}: conv2d_igemm_f32 takes float32 (convert with .float())")
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous NCHW: pass {name}.contiguous()")


def _run(x, mask_of, w_shape, y, stride, padding, bias, tunables, name="y"):
    """The convolution of x by a mask of shape w_shape, whose K-major form mask_of(order) gives."""
    shape, mode, split, vec, gemm, reduce = _plan(x, w_shape, stride, padding, x.data_ptr() % 16 == 0, tunables)
    y = output(y, shape, x, name=name)
    wt = mask_of(1 if mode == 1 else 0)
    has_bias = int(bias is not None)
    b = bias if has_bias else wt                  # has_bias=0: the slot is never read
    if reduce is None:
        gemm(x, wt, b, y, has_bias, int(vec and y.data_ptr() % 16 == 0))
    else:                                         # partial sums, then their sum and the bias
        part = new_output((split, *shape), x)
        gemm(x, wt, b, part, 0, vec)
        reduce(part, b, y, has_bias)
    return y


# ---- the implementation -------------------------------------------------------------------------

IGEMM_F32 = Impl("implicit GEMM fp32, warp-tiled", conv2d_igemm_f32, applies=lambda s: s.D is None,
                 config=igemm_config, key="igemm_f32")
IGEMM_F32_DX = Impl("implicit GEMM fp32 dX, flipped mask", conv2d_igemm_f32_dx, op="conv2d_dx",
                    applies=lambda s: s.D is None and s.stride == 1 and s.padding <= s.K - 1,
                    config=lambda s: igemm_config(dx_workload(s)), key="igemm_f32_dx")
IGEMM_F32_DW = Impl("implicit GEMM fp32 dW, over the batch", conv2d_igemm_f32_dw, op="conv2d_dw",
                    applies=lambda s: s.D is None and s.stride == 1 and s.Ho == s.Wo,
                    config=lambda s: igemm_config(dw_workload(s)), key="igemm_f32_dw")
#: The module's implementations, by the name the figures use.
IMPLEMENTATIONS = (IGEMM_F32, IGEMM_F32_DX, IGEMM_F32_DW)


def pick(shape: Workload) -> Impl:
    """One kernel takes every 2D layer; igemm_config(shape) tunes it to the layer."""
    return IGEMM_F32
