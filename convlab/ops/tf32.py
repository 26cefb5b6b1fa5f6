"""Chapter 12 launchers: fp32 convolution on the tensor cores with TF32 operands
(kernels/12_tf32/), in two precisions:

- products=1, TF32: each operand rounded to TF32 (10 mantissa bits, cvt.rna), one tensor-core
  product per multiply-add: about 2^-11 relative error per product;
- products=3, 3xTF32: each operand split, a = a_hi + a_lo (both TF32), and
  a*b ~ a_lo*b_hi + a_hi*b_lo + a_hi*b_hi: fp32's accuracy at three products per multiply-add.

Both kernels promote: each k-step's (mma.sync) or stage's (wgmma) tensor-core sum, which rounds
toward zero, is added to the accumulator by an fp32 add rounded to nearest.

- conv2d_tf32_mma(x, w, y=None, *, stride=1, padding=0, dilation=1, groups=1, bias=None, products=3,
  **tunables): mma.sync m16n8k8 (sm_80 and newer), the split made in registers as the fragments
  arrive (kernels/12_tf32/conv2d_tf32_mma.cu). Any stride, padding and dilation; groups 1.
- conv2d_wgmma_tf32(x, w, y=None, *, stride=1, padding=0, dilation=1, groups=1, bias=None,
  products=3, **tunables): wgmma m64nNk8 fed by the copy engine (an H100/H200), the operands
  rounded or split once per element in the pass that lays them out
  (kernels/12_tf32/conv2d_wgmma_tf32.cu). Stride 1, dilation 1, groups 1, any padding.
- x, w, bias float32; x NCHW or channels_last. y: float32 NCHW (B, M, Ho, Wo), as torch's.
  Both kernels read NHWC with the channels padded with zeros to a multiple of 4: x and the mask
  are laid out so in each call (kernels/12_tf32/tf32_prep.cu, in the call's time; a channels_last
  x with C % 4 == 0 is read as it is by the mma.sync kernel).
- tf32_mma_config(shape), tf32_wgmma_config(shape, sms=None): the tiles a layer gets.
- round_tf32(t), split_tf32(t): the TF32 rounding and the split, in torch, bit for bit as
  cvt.rna.tf32.f32 and the kernels make them (for the chapter, the exercise and tests).
- tf32_tolerance(n, products, adds): the error bound derived for a reduction of n terms;
  check_tf32(y, ref, shape, impl): cl.check with it, for the kernel impl on that layer.
- TF32_MMA, TF32X3_MMA, TF32_WGMMA, TF32X3_WGMMA: the Impl records (op "conv2d", dtypes fp32,
  precision "tf32" or "3xtf32": not kernels of the fp32 rule; results at TF32's accuracy, or
  3xTF32's, are what a caller asks for by torch's precision switches or the drop-in's precision=,
  and convlab.ops.dispatch's PRECISION_RULES run them then).
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from ..gpu import runtime
from ..gpu.check import check
from ..gpu._limits import GRID_YZ_MAX, INT32_MAX
from ..measuring.workloads import Workload
from . import Impl, ceil_div, output
from .fp16 import TOL_LAMBDA, U32
from ._kernels import Launch, batch_chunks, module_ref, remember, sm_count
from .shapes import check_tensors, layer
from .wgmma import SHARED_OPTIN_MAX, box_shape

#: What a float32 convolution may be computed in: the drop-in's precision= and dispatch.fp32_precision
PRECISIONS = ("fp32", "tf32", "3xtf32")
MMA_FILE = "kernels/12_tf32/conv2d_tf32_mma.cu"
WGMMA_FILE = "kernels/12_tf32/conv2d_wgmma_tf32.cu"
PREP_FILE = "kernels/12_tf32/tf32_prep.cu"
MMA_TUNABLES = ("BM", "BN", "WARPS_M", "WARPS_N", "STAGES")
WGMMA_TUNABLES = ("BN", "MAPS", "STAGES", "SPLITS", "BW", "BH", "BI")
BK = 32                          # floats per K step: one tap, 32 channels
WGMMA_BLOCK = (384, 1, 1)        # a producer warpgroup and two consumers
MAX_SPLITS = 16
MAX_STAGES = 8
# The split-K estimate's machine (an H100/H200 SXM, datasheet figures): only the ratio of a step's
# tensor-core time to the partial sums' memory time matters for the choice.
SM_TF32_FLOPS = 495e12 / 132     # dense TF32 per SM
DRAM_BYTES_S = 3.0e12
FILL_STEPS = 4                   # a unit's fixed cost in steps: the ring's fill and drain, the epilogue


def round_tf32(t: torch.Tensor) -> torch.Tensor:
    """float32 t rounded to TF32 as cvt.rna.tf32.f32 rounds on an H200 (to nearest, ties away from
    zero; the low 13 bits zero; an infinity or NaN keeps its top 19 bits), as float32."""
    u = t.detach().float().contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF   # the bits, unsigned
    r = (u + 0x1000) & 0xFFFFE000
    special = (u & 0x7F800000) == 0x7F800000
    r = torch.where(special, u & 0xFFFFE000, r)
    r = torch.where(r >= 1 << 31, r - (1 << 32), r)
    return r.to(torch.int32).view(torch.float32).reshape(t.shape)


def split_tf32(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(hi, lo) of float32 t as the kernels split it: hi = round_tf32(t), lo = round_tf32(t - hi)
    (t - hi is exact in float32)."""
    hi = round_tf32(t)
    return hi, round_tf32(t.float() - hi)


U_TF32 = 2.0 ** -11       # unit roundoff of TF32 (11 significant bits, round to nearest)
U_SPLIT = 2.0 ** -22      # |a - a_hi - a_lo| <= U_SPLIT |a|; |a_lo b_lo| <= U_SPLIT |a b|


def tf32_tolerance(n: int, products: int, adds: int | None = None, lam: float = TOL_LAMBDA) -> tuple[float, float]:
    """(rtol, atol_rms): a result y passes when |y - ref| <= atol_rms·RMS(ref) + rtol·|ref|, ref the
    fp64 reference of the float32 inputs. Derived as fp16.fp16_tolerance derives its bound, for
    zero-mean random data, relative to R = RMS(ref) = sqrt(n)·RMS(term), n the reduction's length
    (C·Kh·Kw), adds the fp32 adds that promote the tensor cores' partial sums (default n/8):

    - products=1: rounding x and w to TF32: each term gets a relative error δx + δw, |δ| <= u =
      2^-11 (uniform: std u/sqrt(3) each); n independent terms: std u·sqrt(2/3)·R. This is
      about 2^-11 relative per product, growing like sqrt(n) against a single term.
    - products=3: x = hi + lo leaves |δ| <= 2^-22 (std 2^-22/sqrt(3)), and the dropped lo·lo is
      below 2^-22 |x w| (std 2^-22/3): std 2^-22·sqrt(2/3 + 1/9)·R.
    - the tensor cores' adds: a step's terms truncated to 2^-25 of its largest (std 2^-25·R per
      product added, for up to 3 products a term), its sums rounded toward zero (up to 3 per
      step, 2^-23 of the step's sum, of the sign of that sum: random across steps):
      std sqrt(3·(2^-25)² + 3·(2^-23)²)·R.
    - the promotions: `adds` fp32 adds rounded to nearest of partial sums ~ sqrt(j/adds)·R:
      std u32·R·sqrt((adds+1)/6); and a large output's drifting partial sums, as for fp16's
      float sums: rtol += lam·u32·sqrt(adds)/3.

    atol_rms = lam·sqrt(sum of the variances)/R; lam (fp16.TOL_LAMBDA) covers the tails."""
    if products not in (1, 3):
        raise ValueError(f"products={products!r}: 1 (TF32) or 3 (3xTF32)")
    adds = max(1, -(-n // 8) if adds is None else adds)
    var = (2.0 / 3.0) * U_TF32 ** 2 if products == 1 else (2.0 / 3.0 + 1.0 / 9.0) * U_SPLIT ** 2
    var += 3 * (2.0 ** -25) ** 2 + 3 * (2.0 ** -23) ** 2 + U32 ** 2 * (adds + 1) / 6.0
    return U32 + lam * U32 * adds ** 0.5 / 3.0, lam * var ** 0.5


def check_tf32(y, ref, shape: Workload, impl: "Impl", name: str = "y", raise_on_error: bool = True):
    """cl.check of y, impl's result on the layer `shape` (one of this module's records), against
    ref with tf32_tolerance's bound for that kernel: its products, and its promotions (mma.sync one
    per 8 channels of each tap, wgmma one per 32: the channels padded to 32 a step)."""
    steps = shape.K * shape.Kw * ceil_div(shape.C // shape.groups, BK)
    products = {TF32_MMA.key: 1, TF32_WGMMA.key: 1, TF32X3_MMA.key: 3, TF32X3_WGMMA.key: 3}[impl.key]
    adds = steps * (BK // 8 if impl.key in (TF32_MMA.key, TF32X3_MMA.key) else 1)
    rtol, atol_rms = tf32_tolerance(shape.reduction, products, adds)
    r = ref.detach().double().cpu()
    rms = float(r.pow(2).mean().sqrt()) if r.numel() else 1.0
    return check(y, r, rtol=rtol, atol=atol_rms * max(rms, 1e-30), name=name, raise_on_error=raise_on_error)


def _layer(x, w, bias, stride, padding, dilation, groups, who: str) -> Workload:
    check_tensors(("fp32",), layout=None, x=x, w=w, bias=bias)
    if x.dim() != 4 or w.dim() != 4:
        raise ValueError(f"{who}: expected x (B, C, H, W) and w (M, C, Kh, Kw), got {tuple(x.shape)} and "
                         f"{tuple(w.shape)}")
    if bias is not None and tuple(bias.shape) != (w.shape[0],):
        raise ValueError(f"{who}: bias has shape {tuple(bias.shape)}, expected ({w.shape[0]},)")
    s = layer(tuple(x.shape), tuple(w.shape), stride, padding, dilation, groups)
    if s.groups != 1:
        raise ValueError(f"{who}: groups={s.groups}; it takes one group")
    if not s.symmetric:
        raise ValueError(f"{who}: padding more at the end than at the start ('same' with an even mask); pass "
                         "the padding as ints")
    C4 = ceil_div(s.C, 4) * 4
    if max(s.B * s.H * s.W * C4, s.M * s.K * s.Kw * C4, s.B * s.M * s.Ho * s.Wo) > INT32_MAX:
        raise ValueError(f"{who}: a tensor over 2^31 elements")
    return s


# ---- the layout pass ------------------------------------------------------------------------

def _prep_launches(shape: tuple, strides: tuple, mode: int) -> list:
    """nhwc_tf32's launches for a (N, C, P) tensor of those element strides (chunks of at most
    GRID_YZ_MAX images, each launched on its own slice)."""
    N, C, P = shape
    C4 = ceil_div(C, 4) * 4
    return [(b0, b1, Launch(PREP_FILE, "nhwc_tf32", {"MODE": mode}, (C, P, C4, strides[0], strides[1], strides[2]),
                            grid=(ceil_div(P, 32), ceil_div(C4, 32), b1 - b0), block=(32, 8, 1)))
            for b0, b1 in batch_chunks(N, GRID_YZ_MAX)]


def nhwc(t: torch.Tensor, mode: int) -> tuple:
    """(hi, lo) (lo None unless mode 2) of t (B, C, H, W), NCHW or channels_last: (B, H, W, C4)
    float32, C4 = C rounded up to 4 with zero channels; mode 0 the values, 1 rounded to TF32, 2
    split (tf32_prep.cu). For a mask (M, C, Kh, Kw): (M, Kh, Kw, C4)."""
    B, C, H, W = (int(v) for v in t.shape)
    P = H * W
    if t.is_contiguous():
        src, strides = t, (C * P, P, 1)
    elif t.permute(0, 2, 3, 1).is_contiguous():
        src, strides = t.permute(0, 2, 3, 1), (P * C, 1, C)
    else:
        src, strides = t.contiguous(), (C * P, P, 1)
    C4 = ceil_div(C, 4) * 4
    hi = torch.empty((B, H, W, C4), dtype=torch.float32, device=t.device)
    lo = torch.empty_like(hi) if mode == 2 else None
    key = ((B, C, P), strides, mode)
    for b0, b1, launch in remember(_prep_plans, key, lambda: _prep_launches(*key)):
        launch(src[b0:b1], hi[b0:b1], (hi if lo is None else lo)[b0:b1])
    return hi, lo


_prep_plans: dict = {}


# ---- mma.sync --------------------------------------------------------------------------------

def tf32_mma_config(shape: Workload) -> dict:
    """A tile of 128 maps (64 where the layer has at most 64) by 128 pixels, warps of 64 x 32,
    three stages (32 KB each at 128 x 128)."""
    if shape.M <= 64:
        return dict(BM=64, BN=128, WARPS_M=1, WARPS_N=4, STAGES=3)
    return dict(BM=128, BN=128, WARPS_M=2, WARPS_N=4, STAGES=3)


def check_mma_tunables(BM: int, BN: int, WARPS_M: int, WARPS_N: int, STAGES: int) -> None:
    """The kernel's static_asserts and its shared memory, as a Python error before compiling."""
    threads = 32 * WARPS_M * WARPS_N
    rows = threads // 8
    ok = (BM % WARPS_M == 0 and BN % WARPS_N == 0 and (BM // WARPS_M) % 16 == 0 and (BN // WARPS_N) % 16 == 0
          and threads <= 1024 and rows % 8 == 0 and BM % rows == 0 and BN % rows == 0 and STAGES >= 2)
    if not ok:
        raise ValueError(f"conv2d_tf32_mma tile BM={BM} BN={BN} WARPS_M={WARPS_M} WARPS_N={WARPS_N} "
                         f"STAGES={STAGES}: warp tiles must be multiples of 16 x 16, BM and BN multiples of "
                         f"the {rows} rows a pass of 16-byte copies fills, STAGES >= 2")
    if mma_shared_bytes(BM, BN, STAGES) > SHARED_OPTIN_MAX:
        raise ValueError(f"conv2d_tf32_mma tile BM={BM} BN={BN} STAGES={STAGES}: "
                         f"{mma_shared_bytes(BM, BN, STAGES):,} bytes of shared memory, over {SHARED_OPTIN_MAX:,}")


def mma_shared_bytes(BM: int, BN: int, STAGES: int, **_) -> int:
    return STAGES * (BM + BN) * BK * 4


class _MmaPlan(NamedTuple):
    out_shape: tuple
    main: Launch


def _mma_plan(s: Workload, products: int, tunables: dict) -> _MmaPlan:
    bad = [k for k in tunables if k not in MMA_TUNABLES]
    if bad:
        raise TypeError(f"conv2d_tf32_mma got unknown tunables {bad}; it takes {', '.join(MMA_TUNABLES)}")
    t = {**tf32_mma_config(s), **{k: int(v) for k, v in tunables.items() if v is not None}}
    check_mma_tunables(**t)
    P = s.B * s.Ho * s.Wo
    C4 = ceil_div(s.C, 4) * 4
    grid = (ceil_div(P, t["BN"]), ceil_div(s.M, t["BM"]), 1)
    if grid[1] > GRID_YZ_MAX:
        raise ValueError(f"conv2d_tf32_mma: {s.M} maps make {grid[1]} map tiles, over gridDim.y's {GRID_YZ_MAX}")
    main = Launch(MMA_FILE, "conv2d_tf32_mma", {**t, "PRODUCTS": products},
                  (s.B, s.H, s.W, C4, s.M, s.K, s.Kw, s.Ho, s.Wo, s.stride, s.stride_w, s.padding, s.padding_w,
                   s.dilation, s.dilation_w),
                  grid=grid, block=(32 * t["WARPS_M"] * t["WARPS_N"], 1, 1), shared=mma_shared_bytes(**t),
                  max_shared=SHARED_OPTIN_MAX)
    return _MmaPlan((s.B, s.M, s.Ho, s.Wo), main)


_mma_plans: dict = {}


def conv2d_tf32_mma(x, w, y=None, *, stride=1, padding=0, dilation=1, groups=1, bias=None, products=3, **tunables):
    """y = conv2d(x, w, bias) in float32 on mma.sync's tensor cores with TF32 operands, products=1
    (TF32) or 3 (3xTF32); see the module's docstring."""
    if products not in (1, 3):
        raise ValueError(f"products={products!r}: 1 (TF32) or 3 (3xTF32)")
    key = (tuple(x.shape), tuple(w.shape), stride, padding, dilation, groups, products,
           tuple(sorted(tunables.items())))
    plan = remember(_mma_plans, key, lambda: _mma_plan(
        _layer(x, w, bias, stride, padding, dilation, groups, "conv2d_tf32_mma"), products, tunables),
        (stride, padding, dilation, groups))
    check_tensors(("fp32",), layout=None, x=x, w=w, bias=bias)
    y = output(y, plan.out_shape, x)
    xn = x.permute(0, 2, 3, 1)
    if not (x.shape[1] % 4 == 0 and xn.is_contiguous() and xn.data_ptr() % 16 == 0):
        xn = nhwc(x, 0)[0]
    wn = nhwc(w, 0)[0]
    plan.main(xn, wn, wn if bias is None else bias.contiguous(), y, int(bias is not None))
    return y


def mma_runs_here() -> bool:
    """mma.sync with TF32 operands and cp.async need sm_80 (the emulator runs them)."""
    dev = runtime.device()
    return dev.backend != "cuda" or tuple(dev.cc) >= (8, 0)


def mma_applies(s: Workload) -> bool:
    return (getattr(s, "D", None) is None and s.groups == 1 and s.symmetric and mma_runs_here()
            and max(s.B * s.H * s.W * ceil_div(s.C, 4) * 4, s.B * s.M * s.Ho * s.Wo) <= INT32_MAX)


# ---- wgmma -----------------------------------------------------------------------------------

def wgmma_shared_bytes(BN: int, MAPS: int, STAGES: int, products: int = 3, **_) -> int:
    """A stage's boxes (MAPS maps and the tile's pixels, 128 bytes a row; both parts with 3xTF32)
    times STAGES, and 1 KB to align the ring to 1024 bytes."""
    pix = BN if MAPS == 128 else 2 * BN
    return STAGES * (MAPS + pix) * BK * 4 * (2 if products == 3 else 1) + 1024


def _deepest(BN: int, MAPS: int, products: int) -> int:
    return max([s for s in range(2, MAX_STAGES + 1)
                if wgmma_shared_bytes(BN, MAPS, s, products) + 16 * s <= SHARED_OPTIN_MAX], default=2)


def split_time(shape: Workload, tiles: int, steps: int, splits: int, sms: int, products: int, maps: int,
               pix: int) -> float:
    """Estimated seconds with the steps of each of `tiles` tiles cut in `splits` shares: the SM with
    the most units, each its share of steps plus FILL_STEPS, at the tensor cores' peak; plus the
    partial sums written and read again."""
    per = ceil_div(steps, splits)
    step_s = 2 * maps * pix * BK * products / SM_TF32_FLOPS
    t = ceil_div(tiles * splits, sms) * (per + FILL_STEPS) * step_s
    if splits > 1:
        t += 2 * splits * 4 * shape.B * shape.M * shape.Ho * shape.Wo / DRAM_BYTES_S
    return t


def tf32_wgmma_config(shape: Workload, sms: int | None = None, products: int = 3) -> dict:
    """128 pixels a warpgroup; 128 maps a tile (a warpgroup each), or 64 shared (each warpgroup its
    own 128 pixels) for a layer of at most 64 maps; the box by chapter 11's box_shape; the deepest
    ring that fits; SPLITS by split_time, so the units fill the SMs' last round."""
    sms = sms or sm_count()
    MAPS = 64 if shape.M <= 64 else 128
    BN = 128
    pix = BN if MAPS == 128 else 2 * BN
    BW, BH, BI = box_shape(shape.Ho, shape.Wo, shape.B, pix)
    tiles = (ceil_div(shape.Wo, BW) * ceil_div(shape.Ho, BH) * ceil_div(shape.B, BI) * ceil_div(shape.M, MAPS))
    steps = shape.K * shape.Kw * ceil_div(ceil_div(shape.C, 4) * 4, BK)
    splits = min(range(1, min(MAX_SPLITS, steps) + 1),
                 key=lambda n: split_time(shape, tiles, steps, n, sms, products, MAPS, pix))
    return dict(BN=BN, MAPS=MAPS, STAGES=_deepest(BN, MAPS, products), SPLITS=splits, BW=BW, BH=BH, BI=BI)


class _WgmmaPlan(NamedTuple):
    out_shape: tuple
    defines: dict
    x_box: tuple                  # the x maps' box, outermost first (BI, BH, BW, 32)
    w_box: tuple                  # the mask maps' (MAPS, 1, 1, 32)
    scalars: tuple
    grid: tuple
    shared: int
    splits: int
    reduce: Launch | None


def _wgmma_plan(s: Workload, products: int, tunables: dict) -> _WgmmaPlan:
    bad = [k for k in tunables if k not in WGMMA_TUNABLES]
    if bad:
        raise TypeError(f"conv2d_wgmma_tf32 got unknown tunables {bad}; it takes {', '.join(WGMMA_TUNABLES)}")
    why = wgmma_refuses(s)
    if why:
        raise ValueError(f"conv2d_wgmma_tf32: {why}")
    t = {**tf32_wgmma_config(s, products=products), **{k: int(v) for k, v in tunables.items() if v is not None}}
    if "STAGES" not in tunables:
        t["STAGES"] = _deepest(t["BN"], t["MAPS"], products)
    BN, MAPS, BW, BH, BI = t["BN"], t["MAPS"], t["BW"], t["BH"], t["BI"]
    pix = BN if MAPS == 128 else 2 * BN
    if (BN not in (64, 128) or MAPS not in (64, 128) or not 2 <= t["STAGES"] <= MAX_STAGES or min(BW, BH, BI) < 1
            or BW * BH * BI > pix or t["SPLITS"] < 1):
        raise ValueError(f"conv2d_wgmma_tf32 tunables {t}: BN 64 or 128, MAPS 64 or 128, STAGES 2..{MAX_STAGES}, "
                         f"BW*BH*BI <= {pix} pixels a tile, SPLITS >= 1")
    smem = wgmma_shared_bytes(BN, MAPS, t["STAGES"], products)
    if smem + 16 * t["STAGES"] > SHARED_OPTIN_MAX:
        raise ValueError(f"conv2d_wgmma_tf32 tunables {t}: {smem:,} bytes of shared memory, over {SHARED_OPTIN_MAX:,}")
    C4 = ceil_div(s.C, 4) * 4
    steps = s.K * s.Kw * ceil_div(C4, BK)
    per = ceil_div(steps, min(t["SPLITS"], steps))
    splits = ceil_div(steps, per)                 # every share non-empty
    tiles = ceil_div(s.Wo, BW) * ceil_div(s.Ho, BH) * ceil_div(s.B, BI) * ceil_div(s.M, MAPS)
    total = s.B * s.M * s.Ho * s.Wo
    if splits * total > INT32_MAX * 4:
        raise ValueError(f"conv2d_wgmma_tf32: {splits} partial outputs of {total:,} floats; pass a smaller SPLITS")
    reduce = None
    if splits > 1:
        reduce = Launch(PREP_FILE, "tf32_splitk_reduce", {}, (total, s.M, s.Ho * s.Wo, splits),
                        grid=(min(ceil_div(total, 256), 8 * sm_count()), 1, 1), block=(256, 1, 1))
    scalars = (s.B, C4, s.M, s.Ho, s.Wo, s.K, s.Kw, s.padding, s.padding_w, BW, BH, BI, BW * BH * BI * BK * 4,
               splits)
    return _WgmmaPlan((s.B, s.M, s.Ho, s.Wo), {"BN": BN, "MAPS": MAPS, "STAGES": t["STAGES"], "PRODUCTS": products},
                      (BI, BH, BW, BK), (MAPS, 1, 1, BK), scalars, (min(tiles * splits, sm_count()), 1, 1), smem,
                      splits, reduce)


_wgmma_plans: dict = {}


def wgmma_refuses(s: Workload) -> str | None:
    """Why the wgmma kernel cannot take the layer (None: it can)."""
    if getattr(s, "D", None) is not None:
        return "a 3D layer"
    if (s.stride, s.stride_w, s.dilation, s.dilation_w, s.groups) != (1, 1, 1, 1, 1):
        return (f"stride {(s.stride, s.stride_w)}, dilation {(s.dilation, s.dilation_w)}, groups {s.groups}: it "
                "takes stride 1, dilation 1, one group")
    if not s.symmetric:
        return "padding more at the end than at the start"
    if max(s.B * s.H * s.W * ceil_div(s.C, 4) * 4, s.B * s.M * s.Ho * s.Wo) > INT32_MAX:
        return "a tensor over 2^31 elements"
    return None


def conv2d_wgmma_tf32(x, w, y=None, *, stride=1, padding=0, dilation=1, groups=1, bias=None, products=3,
                      **tunables):
    """y = conv2d(x, w, bias) in float32 on Hopper's wgmma with TF32 operands, products=1 (TF32) or
    3 (3xTF32); see the module's docstring."""
    if products not in (1, 3):
        raise ValueError(f"products={products!r}: 1 (TF32) or 3 (3xTF32)")
    key = (tuple(x.shape), tuple(w.shape), stride, padding, dilation, groups, products,
           tuple(sorted(tunables.items())))
    plan = remember(_wgmma_plans, key, lambda: _wgmma_plan(
        _layer(x, w, bias, stride, padding, dilation, groups, "conv2d_wgmma_tf32"), products, tunables),
        (stride, padding, dilation, groups))
    check_tensors(("fp32",), layout=None, x=x, w=w, bias=bias)
    y = output(y, plan.out_shape, x)
    mode = 2 if products == 3 else 1
    x_hi, x_lo = nhwc(x, mode)
    w_hi, w_lo = nhwc(w, mode)
    maps = [runtime.tensor_map(t, box) for t, box in ((x_hi, plan.x_box), (x_lo if x_lo is not None else x_hi,
            plan.x_box), (w_hi, plan.w_box), (w_lo if w_lo is not None else w_hi, plan.w_box))]
    out = y if plan.splits == 1 else torch.empty((plan.splits, *plan.out_shape), dtype=torch.float32, device=x.device)
    b = w_hi if bias is None else bias.contiguous()
    kernel = module_ref(WGMMA_FILE, plan.defines).get().kernel("conv2d_wgmma_tf32")
    kernel(out, b, *maps, int(bias is not None), *plan.scalars, grid=plan.grid, block=WGMMA_BLOCK,
           shared=plan.shared, max_shared=SHARED_OPTIN_MAX)
    if plan.reduce is not None:
        plan.reduce(out, b, y, int(bias is not None))
    return y


def wgmma_runs_here() -> bool:
    """wgmma needs an sm_90 GPU (H100, H200); the emulator runs it too."""
    dev = runtime.device()
    return dev.backend != "cuda" or tuple(dev.cc) == (9, 0)


# ---- the records -----------------------------------------------------------------------------

#: What a route reads (convlab.ops.dispatch): float32, y returned NCHW, the bias in the epilogue; the
#: dispatcher runs them only where dispatch.fp32_precision() asks for their precision
#: (dispatch.PRECISION_RULES). The mma.sync kernel reads a channels_last x as it lies (an NCHW one
#: the route converts); the wgmma kernel's layout pass reads either (it rounds or splits every element).
_RECORD = dict(op="conv2d", any_layer=True, dtypes=("fp32",), out_layout="nchw", bias=True, accumulation="float")
_MMA = dict(applies=mma_applies, config=tf32_mma_config, layouts=("channels_last",), **_RECORD)
_WGMMA = dict(applies=lambda s: wgmma_refuses(s) is None and wgmma_runs_here(), layouts=("nchw", "channels_last"),
              **_RECORD)
TF32_MMA = Impl("mma.sync TF32 implicit GEMM", functools.partial(conv2d_tf32_mma, products=1), key="tf32_mma",
                precision="tf32", **_MMA)
TF32X3_MMA = Impl("mma.sync 3xTF32 implicit GEMM", functools.partial(conv2d_tf32_mma, products=3), key="tf32x3_mma",
                  precision="3xtf32", **_MMA)
TF32_WGMMA = Impl("wgmma TF32 implicit GEMM", functools.partial(conv2d_wgmma_tf32, products=1), key="tf32_wgmma",
                  config=lambda s: tf32_wgmma_config(s, products=1), precision="tf32", **_WGMMA)
TF32X3_WGMMA = Impl("wgmma 3xTF32 implicit GEMM", functools.partial(conv2d_wgmma_tf32, products=3),
                    key="tf32x3_wgmma", config=lambda s: tf32_wgmma_config(s, products=3), precision="3xtf32",
                    **_WGMMA)
IMPLEMENTATIONS: tuple[Impl, ...] = (TF32_MMA, TF32X3_MMA, TF32_WGMMA, TF32X3_WGMMA)
