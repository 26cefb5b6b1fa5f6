"""Chapter 9 launcher: the fp32 implicit GEMM (kernels/09_general/conv2d_igemm_f32.cu), warp-tiled,
split-K, a plain-GEMM path for 1x1 layers; float32 FFMA, no tensor cores. It takes every 2D layer
torch's conv2d takes (groups, dilation, non-square masks, a stride and padding per axis), forward,
dX and dW; depthwise layers (groups == C) run too but are left to their own kernels (applies()).

stride, padding and dilation: an int or a (height, width) pair, as torch takes them.

- conv2d_igemm_f32(x, w, y=None, *, stride=1, padding=0, dilation=1, groups=1, bias=None, **tunables) -> y
  x (B, C, H, W) and w (M, C/groups, Kh, Kw) float32, NCHW, contiguous; bias (M,) or None. A grouped
  layer is `groups` GEMMs of M/groups maps, reduction (C/groups)*Kh*Kw, the group on gridDim.y.
  Tunables: BM, BN, BK (block tile), WM, WN (warp tile), SPLIT (splits of the reduction),
  MIN_BLOCKS (__launch_bounds__). Those left out come from igemm_config(shape).
- conv2d_igemm_f32_dx(dy, w, dx=None, *, stride=1, padding=0, input_size=None, dilation=1, groups=1,
  **tunables) -> dx
  dE/dX as a sum over stride phases: dx's pixels (ry + sh*i, rx + sw*j) of phase (ry, rx) get only
  the taps whose stride lands on them, so each phase is a stride-1 convolution of dy by those taps,
  flipped and transposed per group (C/groups maps of M/groups channels), with its own padding and a
  dilation d/gcd(s, d); stride 1 is one phase, the whole mask and padding d*(K-1)-p. input_size
  (H, W): needed where a stride leaves rows over; None: the smallest input that gives dy. Tunables
  from igemm_config(dx_workload(shape)), one set for every phase.
- conv2d_igemm_f32_dw(x, dy, dw=None, *, stride=1, padding=0, kernel_size=None, dilation=1, groups=1,
  **tunables) -> dw
  dE/dW as the same kernel's convolution over the batch, per group: x read as x^T (its channels are
  the images, its images the channels, by strides: no copy), dy as the mask (M/groups maps of B
  channels, Ho x Wo taps), the layer's stride as the taps' dilation and its dilation as the stride,
  written straight into dw; the reduction (B*Ho*Wo) is long and the output small, so igemm_config
  splits it. kernel_size: needed where a stride or dilation leaves it ambiguous. Tunables from
  igemm_config(dw_workload(shape)).
- igemm_config(shape, sms=None): the tile and split for a layer (a Workload).
- igemm_mode(shape, BK): which of the kernel's three loaders a layer gets (0 general, 1 one filter
  tap per step, 2 plain GEMM for 1x1 stride 1 unpadded).
- kmajor(w, order, flip=False, *, groups=1, phase=None): the mask as Wt[g][k][m], as the kernel reads
  it, made by igemm_mask_kmajor on every call (a copy kept per tensor would miss changes made through
  w.data); dw_mask(dy, order, groups=1): the same for dW's convolution, whose mask is dy.
"""
from __future__ import annotations

from math import gcd

import torch

from ..gpu._limits import GRID_YZ_MAX, INT32_MAX, SHARED_DEFAULT_MAX
from ..measuring.workloads import Workload, pair
from . import Impl, ceil_div, new_output, output
from ._kernels import Launch, remember, sm_count
from .shapes import check_tensors, layer

FILE = "kernels/09_general/conv2d_igemm_f32.cu"
TM = TN = 8            # the micro-tile: 64 accumulators, 16 shared loads per 64 FFMAs
KD_ALIGN = 32          # the transposed mask's rows are padded to a multiple of this (BK divides it)
MAX_SPLIT = 256        # dW: a reduction of B*Ho*Wo onto a few tiles of output
INDEX_MAX = INT32_MAX // 2   # the kernels index with int; headroom for the grid stride

# The split-K cost model's machine (an H200; on a GPU the SM count comes from the device). Only the
# ratio of arithmetic to memory time matters for the choice, so the peak figures suffice.
SMS = 132
SM_FLOPS = 2 * 128 * 1.98e9     # fp32 FFMA per SM per clock x 2 x boost clock
DRAM_BYTES_S = 4.0e12           # sustained HBM bandwidth
REGS_PER_THREAD = 128           # what an 8x8 micro-tile needs: bounds the blocks per SM
THIN_REGS = 176                 # ptxas -v (sm_90): the one-warp 16x128 tile, uncapped (capped at 128 it spills)
FULL_RATE_WARPS = 16            # resident warps per SM at which the FFMA pipes stay busy
MAX_BLOCKS_PER_SM = 32          # H100/H200: the one-warp tile of thin groups meets this first

# Measured choices that override the rule below for a layer, keyed by (B, C, M, H, W, K, stride,
# padding) of a plain layer: what benchmarks/f32_layers.py prints as "TUNED" after timing every
# candidate on a GPU.
TUNED: dict = {}

_plans: dict = {}


def threads(BM: int, BN: int, WM: int, WN: int) -> int:
    return (BM // WM) * (BN // WN) * 32


def _mode(C: int, KH: int, KW: int, stride: tuple, padding: tuple, same_plane: bool, BK: int) -> int:
    """The loader of one GEMM: C channels per group, a KH x KW mask; same_plane: its output grid is
    its input plane (a 1x1 stride-1 unpadded convolution's is)."""
    if KH == KW == 1 and stride == (1, 1) and padding == (0, 0) and same_plane:
        return 2
    return 1 if C % BK == 0 else 0


def igemm_mode(shape: Workload, BK: int) -> int:
    """2: 1x1, stride 1, no padding (a plain GEMM); 1: C/groups a multiple of BK (one filter tap per
    step); 0: any other layer (the 7x7 stem's C = 3)."""
    return _mode(shape.C // shape.groups, shape.K, shape.Kw, (shape.stride, shape.stride_w),
                 (shape.padding, shape.padding_w), True, BK)


def _gemm_dims(shape: Workload) -> tuple[int, int, int, int]:
    """(groups, maps per group, pixels B*Ho*Wo, reduction (C/groups)*Kh*Kw) of a layer's GEMM."""
    return shape.groups, shape.M // shape.groups, shape.B * shape.Ho * shape.Wo, shape.reduction


def _blocks_per_sm(nthreads: int, BM: int, BN: int, BK: int) -> int:
    smem = 4 * 2 * BK * (BM + BN)
    regs = THIN_REGS if nthreads == 32 else REGS_PER_THREAD
    return max(1, min(65536 // (regs * nthreads), 2048 // nthreads, MAX_BLOCKS_PER_SM,
                      228 * 1024 // (smem + 1024)))


def split_time(shape: Workload, cfg: dict, split: int, sms: int) -> float:
    """Estimated seconds for a split: the busiest SM's blocks x the arithmetic of each, at the rate
    its resident warps sustain, plus the partial sums written and read again (2 x split outputs)."""
    BM, BN, BK = cfg["BM"], cfg["BN"], cfg["BK"]
    G, Mg, N, KD = _gemm_dims(shape)
    steps = ceil_div(KD, BK)
    per = ceil_div(steps, split)
    blocks = G * ceil_div(Mg, BM) * ceil_div(N, BN) * ceil_div(steps, per)
    nthreads = threads(BM, BN, cfg["WM"], cfg["WN"])
    per_sm = ceil_div(blocks, sms)
    warps = min(per_sm, _blocks_per_sm(nthreads, BM, BN, BK)) * nthreads // 32
    rate = SM_FLOPS * min(1.0, warps / FULL_RATE_WARPS)
    t = per_sm * 2 * BM * BN * BK * per / rate
    if split > 1:
        t += 2 * split * 4 * G * Mg * N / DRAM_BYTES_S
    return t


#: Layers of more than 64 maps (per group) with at least MANY_PIXELS outputs (B·Ho·Wo) take a 128-map x
#: 64-pixel tile; DEEP_K: the reduction ((C/groups)·Kh·Kw) from which that tile steps 16 deep. From
#: benchmarks/f32_layers.py on an H200 (benchmarks/results/f32_layers_NVIDIA_H200.csv, every candidate
#: on each layer): on the 3x3 layers of 28x28 and 14x14 maps, the 1x1 1024->256 and the VGG layer the
#: 128x64 tile was the fastest, ahead of 128x128 (twice the blocks of 128 threads, a fuller last
#: wave); BK=16 was faster on the 3x3 reductions of 2304, BK=8 on the 1x1 of 1024. With fewer pixels
#: (7x7 maps) the 128x128 tile split deep was faster: half the partial sums written per split.
MANY_PIXELS = 4096
DEEP_K = 2048


def _best_split(shape: Workload, cfg: dict, sms: int) -> int:
    G, Mg, N, KD = _gemm_dims(shape)
    steps = ceil_div(KD, cfg["BK"])
    fits = max(1, INDEX_MAX // max(1, G * Mg * N))            # partial sums the int indices reach
    splits = [s for s in range(1, min(MAX_SPLIT, fits) + 1) if steps // s >= 4] or [1]
    return min(splits, key=lambda s: split_time(shape, cfg, s, sms))


def igemm_config(shape: Workload, sms: int | None = None) -> dict:
    """The tunables for a layer. The tile: BM as many maps as a group has, up to 128 (128, 64, 32 or
    16), warp tiles of 32 maps x 64 pixels, BK 8 (the 128x128 tile's 64 accumulators, prefetch
    registers and addresses fit the 128 registers two blocks per SM allow; BK 16 spills); 128
    pixels (BN), or 64 for groups of more than 64 maps and MANY_PIXELS outputs (BK 16 from DEEP_K).
    Groups of 16 maps or fewer (ResNeXt's 4, a grouped layer's 8 or 16) get one warp of 16 maps x
    128 pixels: a 32-map tile would leave half its rows or more idle, and the group's GEMMs are
    many, so the blocks fill the SMs anyway.
    The split: the one split_time() estimates fastest, so a layer with few pixels (7x7, 14x14),
    whose tile grid leaves SMs idle or half a wave short, gets its reduction cut in parts; for the
    128x64 tile half that (the estimate overrates its split: the measured best was half).
    A plain layer in TUNED gets the measured choice instead."""
    if shape.plain:
        tuned = TUNED.get((shape.B, shape.C, shape.M, shape.H, shape.W, shape.K, shape.stride, shape.padding))
        if tuned is not None:
            return dict(tuned)
    sms = sms or sm_count()
    _, Mg, N, KD = _gemm_dims(shape)
    if Mg > 64 and N >= MANY_PIXELS:
        cfg = {"BM": 128, "BN": 64, "BK": 16 if KD >= DEEP_K else 8, "WM": 32, "WN": 64, "MIN_BLOCKS": 1}
        cfg["SPLIT"] = max(1, _best_split(shape, cfg, sms) // 2)
        return cfg
    if Mg <= 16:
        cfg = {"BM": 16, "BN": 128, "BK": 8, "WM": 16, "WN": 128, "MIN_BLOCKS": 1}
    else:
        BM = 128 if Mg > 64 else 64 if Mg > 32 else 32
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

_mask_plans: dict = {}      # (w's shape, order, flip, groups, phase) -> (Wt's shape, its Launch)


def kmajor(w: torch.Tensor, order: int, flip: bool = False, *, groups: int = 1,
           phase: tuple | None = None) -> torch.Tensor:
    """Wt[g][k][m] (groups x KDp x Mp) of the convolution by w (M, C/groups, Kh, Kw), per group g:
    k = c*Kh*Kw + ky*Kw + kx (order 0) or (ky*Kw + kx)*C + c (order 1), Mp = the group's maps rounded
    up to 4 columns, KD rounded up to 32 rows, zeros in the padding. flip=True: of dE/dX's
    convolution instead (C/groups maps of M/groups channels per group, the taps flipped); phase =
    (Kh', Kw', ky0, ty, kx0, tx): only the taps of one stride phase, forward taps ky0 + i*ty and
    kx0 + j*tx (None: the whole mask). Made on every call: a copy kept per weight tensor would miss
    changes made through w.data (torch.autograd.gradcheck's perturbations, for one), which leave
    w._version as it was."""
    key = (tuple(w.shape), order, flip, groups, phase)
    plan = _mask_plans.get(key)
    if plan is None:
        Mw, Cg, Khf, Kwf = (int(v) for v in w.shape)
        M, C = Mw // groups, Cg                          # maps and channels per group
        if flip:
            M, C = C, M
        Kh, Kw, ky0, ty, kx0, tx = phase or (Khf, Kwf, 0, 1, 0, 1)
        Mp, KDp = ceil_div(M, 4) * 4, ceil_div(C * Kh * Kw, KD_ALIGN) * KD_ALIGN
        plan = _mask_plans[key] = ((groups * KDp, Mp), Launch(
            FILE, "igemm_mask_kmajor", {}, (M, C, Mp, KDp, order, int(flip), Kh, Kw, groups, Khf, Kwf, ky0, ty, kx0, tx),
            grid=(min(ceil_div(groups * KDp * Mp, 256), 4096), 1, 1), block=(256, 1, 1)))
    shape, launch = plan
    wt = torch.empty(shape, dtype=w.dtype, device=w.device)
    launch(w, wt)
    return wt


def dw_mask(dy: torch.Tensor, order: int, groups: int = 1) -> torch.Tensor:
    """The K-major mask of conv2d_igemm_f32_dw's convolution, whose mask is dy with images and
    maps swapped (per group, M/groups maps of B channels, Ho x Wo taps): Wt[g][tap*B + b][m]
    (order 1) or Wt[g][b*Ho*Wo + tap][m] (order 0) = dy[b][g*M/groups + m][tap], padded as kmajor
    pads. One torch copy of dy into a view of Wt (dy changes every call: nothing is kept)."""
    B, M, Ho, Wo = (int(v) for v in dy.shape)
    Mg = M // groups
    KD, Mp = B * Ho * Wo, ceil_div(Mg, 4) * 4
    KDp = ceil_div(KD, KD_ALIGN) * KD_ALIGN
    wt = torch.empty(groups, KDp, Mp, dtype=dy.dtype, device=dy.device)
    wt[:, KD:].zero_()
    wt[:, :, Mg:].zero_()
    d = dy.view(B, groups, Mg, Ho, Wo)
    if order == 1:
        wt[:, :KD, :Mg].view(groups, Ho, Wo, B, Mg).copy_(d.permute(1, 3, 4, 0, 2))
    else:
        wt[:, :KD, :Mg].view(groups, B, Ho, Wo, Mg).copy_(d.permute(1, 0, 3, 4, 2))
    return wt.view(groups * KDp, Mp)


# ---- the launches -------------------------------------------------------------------------------

TUNABLES = ("BM", "BN", "BK", "WM", "WN", "SPLIT", "MIN_BLOCKS")


def _tiles(cfg: dict, tunables: dict) -> dict:
    """The tunables passed, the rest from cfg; a block tile passed without a warp tile gets 32x64
    warps (16x128 where 32x64 does not divide it), not the warps of cfg's own block tile."""
    if (tunables["BM"] or tunables["BN"]) and not (tunables["WM"] or tunables["WN"]):
        BM, BN = tunables["BM"] or cfg["BM"], tunables["BN"] or cfg["BN"]
        cfg = dict(cfg, **({"WM": 32, "WN": 64} if BM % 32 == 0 and BN % 64 == 0 else {"WM": 16, "WN": 128}))
    t = {k: int(tunables[k] or cfg[k]) for k in TUNABLES}
    check_tunables(t["BM"], t["BN"], t["BK"], t["WM"], t["WN"])
    return t


def _split(t: dict, steps: int, total: int, explicit: bool) -> int:
    """The splits of a reduction of `steps` steps, each non-empty, and that their partial sums
    (split x total) fit int indices: a chosen SPLIT is cut to fit, a SPLIT passed is refused."""
    per = ceil_div(steps, max(1, min(t["SPLIT"], steps)))
    split = ceil_div(steps, per)
    if split > 1 and split * total > INDEX_MAX:
        if explicit:
            raise ValueError(f"SPLIT={split}: {split} partial outputs of {total:,} floats are too many "
                             "for int indices; pass a smaller SPLIT")
        split = max(1, INDEX_MAX // total)
    return split


def _gemm(t: dict, mode: int, *, G, B, C, M, H, W, Ho, Wo, pad, stride, dil, x_strides, out_strides, out_total,
          split, vec4=0, placed=None) -> Launch:
    """One launch of conv2d_igemm_f32: `G` GEMMs of M maps (Ho x Wo pixels of B images, a reduction of
    C channels x the KH x KW taps in t) over x of H x W planes with the given strides; placed =
    (oW, oy0, ox0, osy, osx) writes pixel (py, px) to (oy0 + osy*py, ox0 + osx*px) (OUT_STRIDED)."""
    if G > GRID_YZ_MAX:
        raise ValueError(f"groups={G}: more than {GRID_YZ_MAX:,} groups do not fit gridDim.y")
    defines = {k: t[k] for k in ("BM", "BN", "BK", "WM", "WN", "MIN_BLOCKS", "KH", "KW")}
    defines.update(MODE=mode, VEC4=vec4, OUT_STRIDED=int(placed is not None))
    return Launch(FILE, "conv2d_igemm_f32", defines,
                  (B, C, M, H, W, Ho, Wo, *pad, *stride, *dil, ceil_div(M, 4) * 4, *x_strides, *out_strides,
                   out_total, *(placed or (Wo, 0, 0, 1, 1))),
                  grid=(ceil_div(M, t["BM"]) * ceil_div(B * Ho * Wo, t["BN"]), G, split),
                  block=(threads(t["BM"], t["BN"], t["WM"], t["WN"]), 1, 1))


def _reduce(split: int, total: int, M: int, P: int) -> Launch:
    return Launch(FILE, "igemm_splitk_reduce", {}, (split, total, M, P),
                  grid=(min(ceil_div(total, 256), 8 * SMS), 1, 1), block=(256, 1, 1))


def _hashable(v):
    """An int, None or a sequence (a list, torch.Size) as a plan's key: the sequence as a tuple."""
    return v if v is None or type(v) is int else tuple(int(e) for e in v)


def _fits(*sizes: int) -> bool:
    return all(n <= INDEX_MAX for n in sizes)


def _check_size(**sizes: int) -> None:
    for name, n in sizes.items():
        if n > INDEX_MAX:
            raise ValueError(f"{name} has {n:,} elements: too many for int indices")


def _forward_plan(x, w_shape, stride, padding, dilation, groups, aligned, tunables, natural_order=False):
    def build():
        shape = layer(tuple(x.shape), w_shape, stride, padding, dilation, groups)
        B, C, M, H, W, Ho, Wo, G = shape.B, shape.C, shape.M, shape.H, shape.W, shape.Ho, shape.Wo, groups
        Cg, Mg, P = C // G, M // G, Ho * Wo
        _check_size(x=B * C * H * W, y=B * M * P)
        t = _tiles(igemm_config(shape), tunables)
        t.update(KH=shape.K, KW=shape.Kw)
        mode = 0 if natural_order else igemm_mode(shape, t["BK"])
        split = _split(t, ceil_div(shape.reduction, t["BK"]), B * M * P, tunables["SPLIT"] is not None)
        vec = int(P % 4 == 0)                            # 4 pixels of a group in one image
        gemm = _gemm(t, mode, G=G, B=B, C=Cg, M=Mg, H=H, W=W, Ho=Ho, Wo=Wo, pad=(shape.padding, shape.padding_w),
                     stride=(shape.stride, shape.stride_w), dil=(shape.dilation, shape.dilation_w),
                     x_strides=(C * H * W, H * W, Cg * H * W), out_strides=(M * P, P, Mg * P), out_total=B * M * P,
                     split=split, vec4=int(mode == 2 and vec and aligned))
        reduce = _reduce(split, B * M * P, M, P) if split > 1 else None
        return (B, M, Ho, Wo), mode, split, vec, gemm, reduce

    key = (x.shape, w_shape, _hashable(stride), _hashable(padding), _hashable(dilation), groups, aligned,
           tuple(tunables[k] for k in TUNABLES), natural_order)
    return remember(_plans, key, build)


def conv2d_igemm_f32(x, w, y=None, *, stride=1, padding=0, dilation=1, groups: int = 1, bias=None,
                     BM: int | None = None, BN: int | None = None, BK: int | None = None, WM: int | None = None,
                     WN: int | None = None, SPLIT: int | None = None, MIN_BLOCKS: int | None = None,
                     natural_order: bool = False):
    """y = conv2d(x, w, bias, stride, padding, dilation, groups): float32, NCHW. Tunables left out
    come from igemm_config(shape). natural_order=True switches the kernel's loaders off (MODE 0:
    each element's (c, ky, kx) by divisions, on any layer) where igemm_mode would give the
    tap-per-step loader or the plain GEMM: what those loaders buy, measured on their own
    (benchmarks/igemm_ablation.py)."""
    check_tensors(("fp32",), x=x, w=w, bias=bias)
    if bias is not None and tuple(bias.shape) != (int(w.shape[0]),):
        raise ValueError(f"bias has shape {tuple(bias.shape)}, expected ({int(w.shape[0])},)")
    tunables = dict(BM=BM, BN=BN, BK=BK, WM=WM, WN=WN, SPLIT=SPLIT, MIN_BLOCKS=MIN_BLOCKS)
    shape, mode, split, vec, gemm, reduce = _forward_plan(x, tuple(w.shape), stride, padding, dilation, groups,
                                                          x.data_ptr() % 16 == 0, tunables, natural_order)
    y = output(y, shape, x)
    wt = kmajor(w, 1 if mode == 1 else 0, groups=groups)
    has_bias = int(bias is not None)
    b = bias if has_bias else wt                  # has_bias=0: the slot is never read
    if reduce is None:
        gemm(x, wt, b, y, has_bias, int(vec and y.data_ptr() % 16 == 0))
    else:                                         # partial sums, then their sum and the bias
        part = new_output((split, *shape), x)
        gemm(x, wt, b, part, 0, vec)
        reduce(part, b, y, has_bias)
    return y


# ---- dE/dX: a sum over stride phases -------------------------------------------------------------

def _phase(r: int, s: int, p: int, d: int, K: int, n: int) -> tuple:
    """Phase r of one axis of a layer (stride s, padding p, dilation d, K taps, input n long):
    (positions r, r+s, ... below n, taps that reach them, the first's index k0, the step between
    them, their dilation in dy, the stride-1 convolution's padding). Input position r + s*i takes
    tap k where s divides r + p - k*d, from dy row i + (r + p - k*d)/s: taps k0, k0 + T, ... with
    T = s/gcd(s, d), whose dy rows are d/gcd(s, d) apart."""
    count = max(0, ceil_div(n - r, s))
    k0 = next((k for k in range(K) if (r + p - k * d) % s == 0), None)
    if k0 is None or count == 0:
        return count, 0, 0, 1, 1, 0
    step, dil = s // gcd(s, d), d // gcd(s, d)
    taps = ceil_div(K - k0, step)
    return count, taps, k0, step, dil, (taps - 1) * dil - (r + p - k0 * d) // s


def _dx_layer(dy_shape, w_shape, stride, padding, dilation, groups, input_size) -> Workload:
    """The forward layer whose dE/dX this is: dy (B, M, Ho, Wo), w (M, C/groups, Kh, Kw)."""
    if len(dy_shape) != 4 or len(w_shape) != 4 or int(dy_shape[1]) != int(w_shape[0]):
        raise ValueError(f"dy {tuple(dy_shape)} does not fit w {tuple(w_shape)}: need (B, {int(w_shape[0])}, Ho, Wo)")
    B, M, Ho, Wo = (int(v) for v in dy_shape)
    Kh, Kw = int(w_shape[2]), int(w_shape[3])
    s, p, d = pair(stride), pair(padding), pair(dilation)
    smallest = ((Ho - 1) * s[0] + d[0] * (Kh - 1) + 1 - 2 * p[0], (Wo - 1) * s[1] + d[1] * (Kw - 1) + 1 - 2 * p[1])
    H, W = smallest if input_size is None else (int(v) for v in input_size)
    shape = layer((B, int(w_shape[1]) * groups, H, W), tuple(w_shape), s, p, d, groups)
    if (shape.Ho, shape.Wo) != (Ho, Wo):
        raise ValueError(f"input_size {input_size}: an input of {H}x{W} gives a {shape.Ho}x{shape.Wo} output, "
                         f"not dy's {Ho}x{Wo} (stride {s}, padding {p}, dilation {d}, mask {Kh}x{Kw})")
    return shape


def _phases(shape: Workload) -> list:
    """(ry, rx, row phase, column phase) of dE/dX's stride phases that have positions (_phase)."""
    rows = [_phase(r, shape.stride, shape.padding, shape.dilation, shape.K, shape.H) for r in range(shape.stride)]
    cols = [_phase(r, shape.stride_w, shape.padding_w, shape.dilation_w, shape.Kw, shape.W)
            for r in range(shape.stride_w)]
    return [(ry, rx, a, b) for ry, a in enumerate(rows) for rx, b in enumerate(cols) if a[0] and b[0]]


def dx_workload(shape: Workload) -> Workload:
    """The convolution conv2d_igemm_f32_dx runs for a layer's dE/dX (its largest stride phase): at
    stride 1 the convolution of dy by the flipped mask, padding d*(K-1)-p; else phase (0, 0), as
    a convolution of a dy padded beforehand (its pixels and reduction are what the tiles see)."""
    G = shape.groups
    if shape.stride == shape.stride_w == 1:
        q = (shape.dilation * (shape.K - 1) - shape.padding, shape.dilation_w * (shape.Kw - 1) - shape.padding_w)
        if min(q) >= 0:
            return Workload(shape.name, shape.B, shape.M, shape.C, shape.Ho, shape.Wo, (shape.K, shape.Kw), 1, q,
                            dilation=(shape.dilation, shape.dilation_w), groups=G)
    _, _, a, b = max(_phases(shape), key=lambda ph: ph[2][0] * ph[3][0] * max(1, ph[2][1] * ph[3][1]))
    Kh, Kw = max(1, a[1]), max(1, b[1])
    return Workload(shape.name, shape.B, shape.M, shape.C, a[0] + a[4] * (Kh - 1), b[0] + b[4] * (Kw - 1), (Kh, Kw),
                    1, 0, dilation=(a[4], b[4]), groups=G)


def _dx_plan(dy, w_shape, stride, padding, dilation, groups, input_size, aligned, tunables):
    def build():
        shape = _dx_layer(tuple(dy.shape), w_shape, stride, padding, dilation, groups, input_size)
        B, C, M, H, W, Ho, Wo, G = shape.B, shape.C, shape.M, shape.H, shape.W, shape.Ho, shape.Wo, groups
        Cg, Mg = C // G, M // G
        _check_size(dx=B * C * H * W, dy=B * M * Ho * Wo)
        t = _tiles(igemm_config(dx_workload(shape)), tunables)
        phases = _phases(shape)
        live = [ph for ph in phases if ph[2][1] and ph[3][1]]
        steps = max([ceil_div(Mg * a[1] * b[1], t["BK"]) for _, _, a, b in live] or [1])
        split = _split(t, steps, B * C * H * W, tunables["SPLIT"] is not None)
        whole = shape.stride == shape.stride_w == 1       # one phase: all of dx, the plain epilogue
        launches, empty = [], []
        for ry, rx, a, b in phases:
            if not (a[1] and b[1]):                       # no tap reaches these positions: zeros
                empty.append((ry, rx))
                continue
            (Hp, Kh, ky0, ty, dh, qh), (Wp, Kw, kx0, tx, dw, qw) = a, b
            tp = dict(t, KH=Kh, KW=Kw)
            mode = _mode(Mg, Kh, Kw, (1, 1), (qh, qw), (Hp, Wp) == (Ho, Wo), t["BK"])
            gemm = _gemm(tp, mode, G=G, B=B, C=Mg, M=Cg, H=Ho, W=Wo, Ho=Hp, Wo=Wp, pad=(qh, qw), stride=(1, 1),
                         dil=(dh, dw), x_strides=(M * Ho * Wo, Ho * Wo, Mg * Ho * Wo),
                         out_strides=(C * H * W, H * W, Cg * H * W), out_total=B * C * H * W, split=split,
                         vec4=int(mode == 2 and (Ho * Wo) % 4 == 0 and aligned),
                         placed=None if whole else (W, ry, rx, shape.stride, shape.stride_w))
            launches.append((mode, (Kh, Kw, ky0, ty, kx0, tx), gemm))
        reduce = _reduce(split, B * C * H * W, C, H * W) if split > 1 else None
        vec = int(whole and (H * W) % 4 == 0)
        return (B, C, H, W), split, vec, launches, empty, reduce

    key = (dy.shape, w_shape, _hashable(stride), _hashable(padding), _hashable(dilation), groups,
           _hashable(input_size), aligned,
           tuple(tunables[k] for k in TUNABLES))
    return remember(_plans, ("dx", *key), build)


def conv2d_igemm_f32_dx(dy, w, dx=None, *, stride=1, padding=0, input_size=None, dilation=1, groups: int = 1,
                        BM: int | None = None, BN: int | None = None, BK: int | None = None, WM: int | None = None,
                        WN: int | None = None, SPLIT: int | None = None, MIN_BLOCKS: int | None = None):
    """dE/dX of the layer conv2d(x, w, stride, padding, dilation, groups) with x of input_size
    (None: the smallest input that gives dy): one stride-1 implicit GEMM per stride phase of dx, on
    dy with the phase's taps of the mask flipped and transposed per group. Tunables left out come
    from igemm_config(dx_workload(shape)), the same for every phase."""
    check_tensors(("fp32",), dy=dy, w=w)
    tunables = dict(BM=BM, BN=BN, BK=BK, WM=WM, WN=WN, SPLIT=SPLIT, MIN_BLOCKS=MIN_BLOCKS)
    shape, split, vec, launches, empty, reduce = _dx_plan(dy, tuple(w.shape), stride, padding, dilation, groups,
                                                          input_size, dy.data_ptr() % 16 == 0, tunables)
    dx = output(dx, shape, dy, name="dx")
    target = dx if reduce is None else new_output((split, *shape), dy)
    for mode, phase, gemm in launches:
        wt = kmajor(w, 1 if mode == 1 else 0, flip=True, groups=groups, phase=phase)
        gemm(dy, wt, wt, target, 0, int(vec and target.data_ptr() % 16 == 0))
    if reduce is not None:
        reduce(target, dx, dx, 0)
    s = pair(stride)
    for ry, rx in empty:
        dx[:, :, ry::s[0], rx::s[1]].zero_()
    return dx


# ---- dE/dW: the same kernel over the batch, per group ---------------------------------------------

def _dw_layer(x_shape, dy_shape, stride, padding, dilation, groups, kernel_size) -> Workload:
    """The forward layer whose dE/dW this is: x (B, C, H, W), dy (B, M, Ho, Wo)."""
    if len(x_shape) != 4 or len(dy_shape) != 4 or int(dy_shape[0]) != int(x_shape[0]):
        raise ValueError(f"x {tuple(x_shape)} and dy {tuple(dy_shape)}: need (B, C, H, W) and (B, M, Ho, Wo)")
    B, C, H, W = (int(v) for v in x_shape)
    M, Ho, Wo = (int(v) for v in dy_shape[1:])
    s, p, d = pair(stride), pair(padding), pair(dilation)
    if kernel_size is None:                 # the largest mask that gives dy; refused if not the only one
        K = tuple((n + 2 * p_ - 1 - (o - 1) * s_) // d_ + 1 for n, o, s_, p_, d_ in zip((H, W), (Ho, Wo), s, p, d))
        if any(Workload._out(n, k - 1, s_, p_, d_) == o for n, k, o, s_, p_, d_ in zip((H, W), K, (Ho, Wo), s, p, d)
               if k > 1):
            raise ValueError(f"x {tuple(x_shape)}, dy {tuple(dy_shape)}, stride {s}, padding {p}, dilation {d}: "
                             "more than one mask size gives dy; pass kernel_size")
    else:
        K = pair(kernel_size)
    if min(K) < 1:
        raise ValueError(f"x {tuple(x_shape)}, dy {tuple(dy_shape)}, padding {p}: no mask of kernel_size "
                         f"{kernel_size} maps the one to the other")
    shape = layer(x_shape, (M, C // max(1, groups), *K), s, p, d, groups)
    if (shape.Ho, shape.Wo) != (Ho, Wo):
        raise ValueError(f"x {tuple(x_shape)}, dy {tuple(dy_shape)}: a {K[0]}x{K[1]} mask (kernel_size "
                         f"{kernel_size}) gives a {shape.Ho}x{shape.Wo} output, not dy's")
    return shape


def dw_workload(shape: Workload) -> Workload:
    """The convolution conv2d_igemm_f32_dw runs for a layer's dE/dW, per group: C/groups images of B
    channels (x's channels and images swapped), M/groups maps, Ho x Wo taps (dy) at the layer's
    stride as their dilation and the layer's dilation as its stride. Its output grid can exceed the
    mask by the rows a stride leaves over; the launcher computes Kh x Kw of it."""
    return Workload(shape.name, shape.C // shape.groups, shape.B * shape.groups, shape.M, shape.H, shape.W,
                    (shape.Ho, shape.Wo), (shape.dilation, shape.dilation_w), (shape.padding, shape.padding_w),
                    dilation=(shape.stride, shape.stride_w), groups=shape.groups)


def _dw_plan(x, dy_shape, stride, padding, dilation, groups, kernel_size, aligned, tunables):
    def build():
        shape = _dw_layer(tuple(x.shape), dy_shape, stride, padding, dilation, groups, kernel_size)
        B, C, M, H, W, Ho, Wo, G = shape.B, shape.C, shape.M, shape.H, shape.W, shape.Ho, shape.Wo, groups
        Kh, Kw, Cg, Mg = shape.K, shape.Kw, C // G, M // G
        P = Kh * Kw
        _check_size(x=B * C * H * W, dy=B * M * Ho * Wo)
        t = _tiles(igemm_config(dw_workload(shape)), tunables)
        t.update(KH=Ho, KW=Wo)
        st, pd = (shape.dilation, shape.dilation_w), (shape.padding, shape.padding_w)
        mode = _mode(B, Ho, Wo, st, pd, (Kh, Kw) == (H, W), t["BK"])
        split = _split(t, ceil_div(B * Ho * Wo, t["BK"]), M * Cg * P, tunables["SPLIT"] is not None)
        vec = int(P % 4 == 0)
        gemm = _gemm(t, mode, G=G, B=Cg, C=B, M=Mg, H=H, W=W, Ho=Kh, Wo=Kw, pad=pd, stride=st,
                     dil=(shape.stride, shape.stride_w), x_strides=(H * W, C * H * W, Cg * H * W),
                     out_strides=(P, Cg * P, Mg * Cg * P), out_total=M * Cg * P, split=split,
                     vec4=int(mode == 2 and vec and aligned))
        reduce = _reduce(split, M * Cg * P, M, P) if split > 1 else None
        return (M, Cg, Kh, Kw), mode, split, vec, gemm, reduce

    key = (x.shape, dy_shape, _hashable(stride), _hashable(padding), _hashable(dilation), groups,
           _hashable(kernel_size), aligned,
           tuple(tunables[k] for k in TUNABLES))
    return remember(_plans, ("dw", *key), build)


def conv2d_igemm_f32_dw(x, dy, dw=None, *, stride=1, padding=0, kernel_size=None, dilation=1, groups: int = 1,
                        BM: int | None = None, BN: int | None = None, BK: int | None = None, WM: int | None = None,
                        WN: int | None = None, SPLIT: int | None = None, MIN_BLOCKS: int | None = None):
    """dE/dW of conv2d(x, w, stride, padding, dilation, groups), per group g, as a GEMM over the batch:
    dw[m][c][ky][kx] = sum over b, oy, ox of dy[b][m][oy][ox] * x[b][c][oy*sh + ky*dh - ph][ox*sw + kx*dw - pw],
    which is the same kernel's convolution of x read as x^T (C/groups images of B channels, by
    strides) by dy (M/groups maps of B channels, Ho x Wo taps; dw_mask), with stride (dh, dw) and
    dilation (sh, sw), written into dw (M, C/groups, Kh, Kw). The reduction (B*Ho*Wo) is long and the
    output small, so igemm_config splits it. Tunables left out come from igemm_config(dw_workload(shape))."""
    check_tensors(("fp32",), x=x, dy=dy)
    tunables = dict(BM=BM, BN=BN, BK=BK, WM=WM, WN=WN, SPLIT=SPLIT, MIN_BLOCKS=MIN_BLOCKS)
    shape, mode, split, vec, gemm, reduce = _dw_plan(x, tuple(dy.shape), stride, padding, dilation, groups,
                                                     kernel_size, x.data_ptr() % 16 == 0, tunables)
    dw = output(dw, shape, x, name="dw")
    wt = dw_mask(dy, 1 if mode == 1 else 0, groups)
    if reduce is None:
        gemm(x, wt, wt, dw, 0, int(vec and dw.data_ptr() % 16 == 0))
    else:
        part = new_output((split, *shape), x)
        gemm(x, wt, wt, part, 0, vec)
        reduce(part, wt, dw, 0)
    return dw


# ---- the implementation -------------------------------------------------------------------------

def _takes(s: Workload) -> bool:
    """A 2D layer, not depthwise (groups == C > 1: its own kernels), its tensors within int indices and
    its groups within gridDim.y."""
    return (s.D is None and s.family != "depthwise" and s.groups <= GRID_YZ_MAX and s.Ho >= 1 and s.Wo >= 1
            and _fits(s.B * s.C * s.H * s.W, s.B * s.M * s.Ho * s.Wo))


IGEMM_F32 = Impl("implicit GEMM fp32, warp-tiled", conv2d_igemm_f32, applies=_takes, config=igemm_config,
                 any_layer=True, key="igemm_f32", bias=True)
IGEMM_F32_DX = Impl("implicit GEMM fp32 dX, flipped mask", conv2d_igemm_f32_dx, op="conv2d_dx", applies=_takes,
                    config=lambda s: igemm_config(dx_workload(s)), any_layer=True, key="igemm_f32_dx")
IGEMM_F32_DW = Impl("implicit GEMM fp32 dW, over the batch", conv2d_igemm_f32_dw, op="conv2d_dw", applies=_takes,
                    config=lambda s: igemm_config(dw_workload(s)), any_layer=True, key="igemm_f32_dw")
#: The module's implementations, by the name the figures use.
IMPLEMENTATIONS = (IGEMM_F32, IGEMM_F32_DX, IGEMM_F32_DW)


def pick(shape: Workload) -> Impl:
    """One kernel takes every 2D layer; igemm_config(shape) tunes it to the layer."""
    return IGEMM_F32
