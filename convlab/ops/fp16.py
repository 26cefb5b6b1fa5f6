"""Chapter 6 launchers: FP16, half2 and tensor cores (kernels/06_fp16/), and a dispatcher.

Every convolution here takes half tensors (x (B,C,H,W), w (M,C,K,K), torch.float16 on the
backend's device) and returns a half output; the conversions from and to float32 are kernels of
their own, so their cost is counted where it is paid:

- to_half / to_float: float32 <-> float16, 4 values a thread (rounding to nearest even, like
  torch's .half()). mask_to_tap_major: the half mask reordered (M,K,K,C) for conv2d_wmma.
- conv2d_half: chapter 5's register-tiled direct convolution in half (accumulation in half).
- conv2d_half2: the same with explicit half2 pairs of maps, two results per HFMA2.
- conv2d_wmma: chapter 5's implicit GEMM on tensor cores (WMMA 16x16x16, half inputs, float
  accumulation), tap-major reduction; any C, K, padding and stride, compiled per layer shape.
  For resnet-like layers.
- conv2d_wmma_smallc: tensor cores for 1–8 input channels without im2col: the input tile in shared
  memory, channels innermost, read as the A matrix with a leading dimension of 8 halves. Stride 1.
  For lenet_c3.
- conv2d_fp16: float32 in, float32 out: to_half, a convolution above, to_float (the whole cost).
- pick(shape) / conv2d_fp16_best: which kernel and tunables a layer gets (tensor cores); HALF2 is
  the chapter's best without them.
- fp16_tolerance / check_fp16: the error bound the tests use, from the precision and C·K².
"""
from __future__ import annotations

import math

import torch

from ..gpu.check import check
from ..gpu._limits import SHARED_DEFAULT_MAX
from ..measuring import workloads
from ..measuring.workloads import Workload
from . import Impl, ceil_div, conv2d_shapes, new_output, output
from ._kernels import Launch, remember
from .shapes import check_tensors

CONVERT_FILE = "kernels/06_fp16/convert_fp16.cu"
HALF_FILE = "kernels/06_fp16/conv2d_half.cu"
HALF2_FILE = "kernels/06_fp16/conv2d_half2.cu"
WMMA_FILE = "kernels/06_fp16/conv2d_wmma.cu"
SMALLC_FILE = "kernels/06_fp16/conv2d_wmma_smallc.cu"

U16 = 2.0 ** -11          # unit roundoff of fp16 (11 significant bits, round to nearest)
U32 = 2.0 ** -24          # ... of fp32
CONVERT_BLOCK = 256

_plans: dict = {}


# ---- tensors -------------------------------------------------------------------------------------

def _half_out(y, shape, like):
    if y is not None:
        if y.dtype != torch.float16:
            raise TypeError(f"y must be float16, got {y.dtype}")
        if not _aligned16(y):
            raise ValueError("y must start 16-byte aligned (the kernels store half2 pairs): pass a fresh tensor")
    return output(y, shape, like, torch.float16)


def _scratch(shape, like, dtype=torch.float16):
    """An internal buffer that a kernel overwrites completely: torch.empty on like's device (a NaN
    fill would be one more kernel, inside every timing)."""
    return torch.empty(shape, dtype=dtype, device=like.device)


def _aligned16(t) -> bool:
    return t.is_meta or t.data_ptr() % 16 == 0


def _convert(name, src, dst):
    n = src.numel()
    if n == 0:
        return dst
    if n > 2**31 - 1:
        raise ValueError(f"{n:,} values: too many for int indices")
    if not (src.is_contiguous() and dst.is_contiguous() and _aligned16(src) and _aligned16(dst)):
        raise ValueError("to_half/to_float need contiguous, 16-byte aligned tensors (use .contiguous() or .clone())")
    launch = remember(_plans, (name, n), lambda: Launch(
        CONVERT_FILE, name, {"BLOCK": CONVERT_BLOCK}, (n,), grid=(ceil_div(n // 4 + n % 4, CONVERT_BLOCK),),
        block=(CONVERT_BLOCK,)))
    launch(src, dst)
    return dst


def to_half(x, out=None):
    """float32 -> float16 on the device, round to nearest even (bit for bit x.half())."""
    if x.dtype != torch.float32:
        raise TypeError(f"to_half takes float32, got {x.dtype}")
    out = new_output(x.shape, x, torch.float16) if out is None else out
    if out.dtype != torch.float16 or out.shape != x.shape:
        raise ValueError(f"out must be float16 of shape {tuple(x.shape)}")
    return _convert("float_to_half", x, out)


def to_float(xh, out=None):
    """float16 -> float32 on the device (exact)."""
    check_tensors(("fp16",), layout=None, xh=xh)
    out = new_output(xh.shape, xh, torch.float32) if out is None else out
    if out.dtype != torch.float32 or out.shape != xh.shape:
        raise ValueError(f"out must be float32 of shape {tuple(xh.shape)}")
    return _convert("half_to_float", xh, out)


def mask_to_tap_major(wh, out=None):
    """The half mask (M, C, K, K) reordered to (M, K, K, C): conv2d_wmma's reduction order."""
    check_tensors(("fp16",), layout=None, w=wh)
    M, C, K, _ = (int(s) for s in wh.shape)
    out = _scratch((M, K, K, C), wh) if out is None else out
    _tap_major_plan(wh)(wh, out)
    return out


def _tap_major_plan(wh) -> Launch:
    M, C, K, _ = (int(s) for s in wh.shape)
    return remember(_plans, ("tap_major", wh.shape), lambda: Launch(
        CONVERT_FILE, "mask_to_tap_major", {"BLOCK": CONVERT_BLOCK}, (M, C, K * K),
        grid=(ceil_div(M * C * K * K, CONVERT_BLOCK),), block=(CONVERT_BLOCK,)))


# ---- steps 1 and 2: direct convolution in half, then half2 -----------------------------------------

def direct_config(M: int, C: int, K: int, Ho: int | None = None) -> dict:
    """Micro-tile for conv2d_half / conv2d_half2, by chapter 5's rule (conv2d_direct_regtile):
    the fewest groups of at most 32 maps (each group re-reads the input), MT the group size rounded
    up to 8 (16-byte mask loads; to 2 below 8 maps), fewer maps per group while the mask slice
    (C·K²·MT halves) is over 48 KB; ROWS the fewest rows giving 64 half accumulators (32 half2
    registers), at most 8 and at most Ho. lenet_c3: MT=16, ROWS=4; resnet: MT=32, ROWS=2."""
    groups = ceil_div(M, 32)
    while True:
        per = ceil_div(M, groups)
        MT = ceil_div(per, 8) * 8 if per > 8 else ceil_div(per, 2) * 2
        if C * K * K * MT * 2 <= SHARED_DEFAULT_MAX or MT <= 2:
            break
        groups += 1
    rows = 1
    while MT * rows < 64 and rows < 8:
        rows *= 2
    if Ho is not None:
        rows = max(1, min(rows, Ho))
    return {"MT": MT, "ROWS": rows, "BLOCK": 128}


def direct_fits(M: int, C: int, K: int, MT: int | None = None) -> bool:
    MT = MT or direct_config(M, C, K)["MT"]
    return C * K * K * MT * 2 <= SHARED_DEFAULT_MAX


def _direct(path, kname, xh, wh, y, stride, padding, MT, ROWS, BLOCK):
    def build():
        B, C, M, H, W, K, Ho, Wo = conv2d_shapes(xh, wh, stride, padding)
        cfg = direct_config(M, C, K, Ho)
        mt, rows, block = int(MT or cfg["MT"]), int(ROWS or cfg["ROWS"]), int(BLOCK or cfg["BLOCK"])
        if mt % 2:
            raise ValueError(f"MT={mt}: must be even (maps go in pairs)")
        if not direct_fits(M, C, K, mt):
            raise ValueError(f"the mask slice C·K²·MT = {C * K * K * mt:,} halves does not fit in 48 KB of shared memory")
        threads = B * ceil_div(Ho, rows) * Wo
        return (B, M, Ho, Wo), Launch(path, kname, {"M_OUT": M, "C_IN": C, "KSIZE": K, "STRIDE": stride, "MT": mt,
                                                    "ROWS": rows, "BLOCK": block},
                                      (B, H, W, padding), grid=(ceil_div(threads, block), ceil_div(M, mt), 1),
                                      block=(block, 1, 1))

    check_tensors(("fp16",), layout=None, x=xh, w=wh)
    shape, launch = remember(_plans, (kname, xh.shape, wh.shape, stride, padding, MT, ROWS, BLOCK), build)
    y = _half_out(y, shape, xh)
    launch(xh, wh, y)
    return y


def conv2d_half(xh, wh, y=None, *, stride: int = 1, padding: int = 0, MT: int | None = None,
                ROWS: int | None = None, BLOCK: int | None = None):
    """Step 1: register-tiled direct convolution computing in half (accumulators in half)."""
    return _direct(HALF_FILE, "conv2d_half", xh, wh, y, stride, padding, MT, ROWS, BLOCK)


def conv2d_half2(xh, wh, y=None, *, stride: int = 1, padding: int = 0, MT: int | None = None,
                 ROWS: int | None = None, BLOCK: int | None = None):
    """Step 2: the same with half2: maps in pairs, two results per HFMA2."""
    return _direct(HALF2_FILE, "conv2d_half2", xh, wh, y, stride, padding, MT, ROWS, BLOCK)


# ---- step 3: WMMA implicit GEMM ---------------------------------------------------------------------

def wmma_config(M: int, C: int, K: int) -> dict:
    """Block tile for conv2d_wmma: as many maps as the layer has, up to 64 (BM 16, 32 or 64), 128
    pixels, 2 warps across the pixels: warp tiles of (BM/2 or 16) x 64, FM x FN = 2 x 4 fragments
    for resnet. BK = 32 when C is a multiple of 32 (each reduction tile one tap), else 16 when C is
    a multiple of 16, else 32 (the general path)."""
    if M <= 16:
        BM, WM = 16, 1
    elif M <= 32:
        BM, WM = 32, 2
    else:
        BM, WM = 64, 2
    BK = 32 if C % 32 == 0 else (16 if C % 16 == 0 else 32)
    return {"BM": BM, "BN": 128, "BK": BK, "WARPS_M": WM, "WARPS_N": 2}


def check_wmma_tunables(BM: int, BN: int, BK: int, WARPS_M: int, WARPS_N: int) -> None:
    """The kernel's static_asserts, as a Python error before compiling (and for sweeps to skip)."""
    threads = 32 * WARPS_M * WARPS_N
    wtm, wtn = (BM // WARPS_M if WARPS_M else 0), (BN // WARPS_N if WARPS_N else 0)
    ok = (WARPS_M >= 1 and WARPS_N >= 1 and BM % 16 == 0 and BN % 16 == 0 and BK % 16 == 0
          and BM % WARPS_M == 0 and BN % WARPS_N == 0 and wtm % 16 == 0 and wtn % 16 == 0
          and threads <= 1024 and threads % (BN // 2) == 0 and BK % (threads // (BN // 2)) == 0)
    if not ok:
        raise ValueError(f"tile BM={BM} BN={BN} BK={BK} with {WARPS_M}x{WARPS_N} warps does not split: "
                         "BM, BN, BK multiples of 16; warp tiles multiples of 16; the threads a multiple "
                         "of BN/2 and BK a multiple of threads/(BN/2)")
    smem = max(2 * BM * (BK + 8) * 2 + 2 * BK * (BN + 8) * 2, WARPS_M * WARPS_N * 16 * (wtn + 4) * 4)
    if smem > SHARED_DEFAULT_MAX:
        raise ValueError(f"tile BM={BM} BN={BN} BK={BK} needs {smem:,} bytes of shared memory, over 48 KB")


def conv2d_wmma(xh, wh, y=None, *, stride: int = 1, padding: int = 0, BM: int | None = None,
                BN: int | None = None, BK: int | None = None, WARPS_M: int | None = None,
                WARPS_N: int | None = None):
    """Step 3: implicit GEMM on tensor cores. Runs mask_to_tap_major first (counted in its time).
    Tunables left out come from wmma_config(M, C, K)."""
    check_tensors(("fp16",), layout=None, x=xh, w=wh)
    shape, tap_major, wt_shape, launch = _wmma_plan(xh, wh, stride, padding, BM, BN, BK, WARPS_M, WARPS_N)
    y = _half_out(y, shape, xh)
    wt = _scratch(wt_shape, wh)
    tap_major(wh, wt)       # mask_to_tap_major
    launch(xh, wt, y)
    return y


def _wmma_plan(xh, wh, stride, padding, BM=None, BN=None, BK=None, WARPS_M=None, WARPS_N=None):
    """(output shape, the mask reorder's Launch, the reordered mask's shape, the convolution's Launch)
    of conv2d_wmma, once per shape and tunables."""
    def build():
        B, C, M, H, W, K, Ho, Wo = conv2d_shapes(xh, wh, stride, padding)
        cfg = wmma_config(M, C, K)
        t = {k: int(v or cfg[k]) for k, v in (("BM", BM), ("BN", BN), ("BK", BK), ("WARPS_M", WARPS_M),
                                               ("WARPS_N", WARPS_N))}
        check_wmma_tunables(**t)
        N = B * Ho * Wo
        defines = {**t, "C_IN": C, "M_OUT": M, "IN_H": H, "IN_W": W, "KSIZE": K, "PAD": padding, "STRIDE": stride}
        return (B, M, Ho, Wo), _tap_major_plan(wh), (M, K, K, C), Launch(
            WMMA_FILE, "conv2d_wmma", defines, (B,), grid=(ceil_div(N, t["BN"]), ceil_div(M, t["BM"]), 1),
            block=(32 * t["WARPS_M"] * t["WARPS_N"], 1, 1))

    return remember(_plans, ("wmma", xh.shape, wh.shape, stride, padding, BM, BN, BK, WARPS_M, WARPS_N), build)


# ---- step 4: WMMA for few channels, no im2col ---------------------------------------------------------

def _cp(C: int) -> int:
    return 1 if C <= 1 else 2 if C <= 2 else 4 if C <= 4 else 8


def smallc_shared(C: int, K: int, RP: int, BAND: int, WARPS: int) -> int:
    """Bytes of shared memory conv2d_wmma_smallc needs (the kernel's S_BYTES + W_BYTES + ST_BYTES)."""
    cp = _cp(C)
    nph, jc = 8 // cp, ceil_div(K * cp, 16)
    qt = 16 * nph
    npos = ceil_div(BAND * RP, qt) * qt + (K - 1) * RP + jc * 16 // cp
    return nph * npos * cp * 2 + K * jc * 256 * 2 + WARPS * nph * 16 * 16 * 4


def smallc_config(C: int, K: int, H: int, W: int, padding: int = 0, WARPS: int | None = None) -> dict | None:
    """RP (row pitch: W+2·padding rounded up to 16/CP positions), WARPS (4; 2 when the staging of
    NPH accumulators per warp would crowd shared memory) and BAND, the output rows of a block: all
    of Ho when they fit in 48 KB (lenet_c3: the whole 34 rows, 41 KB), else the fewest equal bands
    that fit. None when even one row does not fit."""
    if not 1 <= C <= 8:
        return None
    cp = _cp(C)
    RP = ceil_div(W + 2 * padding, 16 // cp) * (16 // cp)
    Ho = H + 2 * padding - K + 1
    if Ho < 1:
        return None
    warps_options = [int(WARPS)] if WARPS else ([4, 2, 1] if 8 // cp <= 2 else [2, 1])
    for warps in warps_options:
        if smallc_shared(C, K, RP, 1, warps) > SHARED_DEFAULT_MAX:
            continue
        band = Ho
        while smallc_shared(C, K, RP, band, warps) > SHARED_DEFAULT_MAX:
            band -= 1
        nbands = ceil_div(Ho, band)
        band = ceil_div(Ho, nbands)          # equal bands: less waste in the last one
        return {"RP": RP, "BAND": band, "WARPS": warps}
    return None


def smallc_fits(C: int, K: int, H: int, W: int, padding: int = 0, stride: int = 1) -> bool:
    return stride == 1 and smallc_config(C, K, H, W, padding) is not None


def conv2d_wmma_smallc(xh, wh, y=None, *, stride: int = 1, padding: int = 0, WARPS: int | None = None,
                       BAND: int | None = None):
    """Step 4: tensor cores straight from an input tile in shared memory (1 <= C <= 8, stride 1).
    Runs smallc_mask first (the mask as B matrices; counted in its time). WARPS and BAND left out
    come from smallc_config."""
    check_tensors(("fp16",), layout=None, x=xh, w=wh)
    shape, mask, wb_shape, conv = _smallc_plan(xh, wh, stride, padding, WARPS, BAND)
    y = _half_out(y, shape, xh)
    wb = _scratch(wb_shape, xh)
    mask(wh, wb)
    conv(xh, wb, y)
    return y


def _smallc_plan(xh, wh, stride, padding, WARPS=None, BAND=None):
    """(output shape, smallc_mask's Launch, its output's shape, the convolution's Launch) of
    conv2d_wmma_smallc, once per shape and tunables."""
    def build():
        B, C, M, H, W, K, Ho, Wo = conv2d_shapes(xh, wh, stride, padding)
        if stride != 1:
            raise ValueError("conv2d_wmma_smallc computes stride 1 only (use conv2d_wmma)")
        cfg = smallc_config(C, K, H, W, padding, WARPS)
        if cfg is None:
            raise ValueError(f"conv2d_wmma_smallc takes 1 to 8 channels and a row that fits in 48 KB; got C={C}, "
                             f"K={K}, W={W}, padding={padding} (use conv2d_wmma)")
        if BAND is not None:
            cfg["BAND"] = int(BAND)
            if smallc_shared(C, K, cfg["RP"], cfg["BAND"], cfg["WARPS"]) > SHARED_DEFAULT_MAX:
                raise ValueError(f"BAND={BAND} needs more than 48 KB of shared memory")
        groups = ceil_div(M, 16)
        defines = {"C_IN": C, "M_OUT": M, "KSIZE": K, "IN_H": H, "IN_W": W, "PAD": padding, **cfg}
        # the mask as B matrices, once per call (its cost is in the timing): groups x K x JC x 16 x 16
        nb = groups * K * ceil_div(K * _cp(C), 16) * 256
        mask = Launch(SMALLC_FILE, "smallc_mask", defines, grid=(ceil_div(nb, 256),), block=(256,))
        conv = Launch(SMALLC_FILE, "conv2d_wmma_smallc", defines, (B,), grid=(B * ceil_div(Ho, cfg["BAND"]), groups, 1),
                      block=(32 * cfg["WARPS"], 1, 1))
        return (B, M, Ho, Wo), mask, (nb,), conv

    return remember(_plans, ("smallc", xh.shape, wh.shape, stride, padding, WARPS, BAND), build)


# ---- the implementations, the dispatcher and the whole float32 -> float32 path ---------------------------

def _smallc_tunables(s: Workload) -> dict:
    cfg = smallc_config(s.C, s.K, s.H, s.W, s.padding)
    return {"WARPS": cfg["WARPS"], "BAND": cfg["BAND"]}


HALF = Impl("half (direct, register-tiled)", conv2d_half, op="conv2d_fp16",
            applies=lambda s: direct_fits(s.M, s.C, s.K), config=lambda s: direct_config(s.M, s.C, s.K, s.Ho),
            key="half", accumulation="half")
HALF2 = Impl("half2 (direct, register-tiled)", conv2d_half2, op="conv2d_fp16",
             applies=lambda s: direct_fits(s.M, s.C, s.K), config=lambda s: direct_config(s.M, s.C, s.K, s.Ho),
             key="half2", accumulation="half")
WMMA = Impl("WMMA implicit GEMM", conv2d_wmma, op="conv2d_fp16", config=lambda s: wmma_config(s.M, s.C, s.K), key="wmma")
WMMA_SMALLC = Impl("WMMA, few channels (no im2col)", conv2d_wmma_smallc, op="conv2d_fp16",
                   applies=lambda s: smallc_fits(s.C, s.K, s.H, s.W, s.padding, s.stride), config=_smallc_tunables, key="wmma_smallc")


def pick(shape: Workload) -> Impl:
    """The tensor-core kernel a layer gets in fp16 (HALF2, with direct_config, is the chapter's best
    without tensor cores).

    - 1–8 input channels, stride 1 and a row that fits (lenet_c1, lenet_c3, fa17):
      conv2d_wmma_smallc. There the GEMM's K dimension is short (C·K² ≤ 392) and an implicit GEMM
      spends its time gathering U one half at a time; the smallc kernel reads the fragments straight
      from the input tile.
    - Otherwise (resnet, days100): conv2d_wmma with wmma_config.
    """
    if isinstance(shape, str):
        shape = workloads.get(shape)
    return WMMA_SMALLC if WMMA_SMALLC.applies(shape) else WMMA


_best: dict = {}


_PLAN_OF = {"wmma_smallc": _smallc_plan, "wmma": _wmma_plan}      # by the Impl.key pick() gives


def conv2d_fp16_best(xh, wh, y=None, *, stride: int = 1, padding: int = 0):
    """pick()'s kernel for this shape, launched with its tunables (half in, half out): the same
    launches as pick(shape)(xh, wh, ...), kept per shape, one lookup per call."""
    if xh.dtype is not torch.float16 or wh.dtype is not torch.float16:
        check_tensors(("fp16",), layout=None, x=xh, w=wh)
    key = (xh.shape, wh.shape, stride, padding)
    hit = _best.get(key)
    if hit is None:
        shape = Workload.of(xh, wh, stride=stride, padding=padding)
        impl = pick(shape)
        hit = _best[key] = _PLAN_OF[impl.key](xh, wh, stride, padding, **impl.config(shape))
    out_shape, prep, wb_shape, conv = hit
    y = _half_out(y, out_shape, xh)
    wb = _scratch(wb_shape, wh)
    prep(wh, wb)            # the mask in the kernel's layout, in every call's time
    conv(xh, wb, y)
    return y


def conv2d_fp16(x, w, y=None, *, stride: int = 1, padding: int = 0, impl=None, **tunables):
    """float32 x, w -> float32 y through half: to_half(x), to_half(w), the convolution `impl` (a
    launcher or Impl of this module; default the pick), to_float(y). What a float32 network pays to
    run a layer in fp16, conversions included."""
    B, C, H, W = (int(s) for s in x.shape)
    M, K = int(w.shape[0]), int(w.shape[2])
    xh, wh = to_half(x, _scratch(x.shape, x)), to_half(w, _scratch(w.shape, w))
    yh = _scratch((B, M, (H + 2 * padding - K) // stride + 1, (W + 2 * padding - K) // stride + 1), x)
    yh = (impl or conv2d_fp16_best)(xh, wh, yh, stride=stride, padding=padding, **tunables)
    return to_float(yh, y)


FP16_PATH = Impl("ours, float32 in and out: to_half + pick() + to_float", conv2d_fp16,
                 applies=lambda s: s.dims == 2, key="fp16_path", candidate=False)
#: The chapter's implementations, by the name the figures use: the four kernels (half in and out),
#: then the whole float32 path through the pick.
IMPLEMENTATIONS = (HALF, HALF2, WMMA, WMMA_SMALLC, FP16_PATH)


# ---- accuracy ------------------------------------------------------------------------------------------

#: Safety factor on the error's standard deviation. The error of a half-accumulated sum has heavy
#: tails (outputs whose partial sums are large carry larger errors): simulating 400,000 random dot
#: products of length 576 needed up to 8.8 standard deviations, 196: 7.3; 12 leaves room for the
#: 185 million outputs of lenet_c3 at full size.
TOL_LAMBDA = 12.0


def fp16_tolerance(C: int, K: int, accumulate: str = "half", rounded_inputs: bool = False,
                   lam: float = TOL_LAMBDA, dims: int = 2) -> tuple[float, float]:
    """(rtol, atol_rms): an fp16 result y passes when |y - ref| <= atol_rms·RMS(ref) + rtol·|ref|
    everywhere, ref the fp64 reference of the float32 inputs. Derived for zero-mean random data
    (what the tests use), relative to R = RMS(ref) = sqrt(n)·RMS(term), n = C·K² (C·K³ for dims=3):

    - rounding x and w to half (unless rounded_inputs: ref computed from the half values): each
      term x·w gets a relative error δx+δw, |δ| <= u = 2^-11, std ~ u·sqrt(2/3); n independent
      terms add up to a std of u·sqrt(2/3)·R.
    - accumulate="half": each of the n fused multiply-adds rounds its partial sum s_k (size
      ~ sqrt(k/n)·R) by up to u·|s_k|: a random walk, std u·R·sqrt((n+1)/6). The error grows like
      sqrt(n)·u relative to the output (resnet n=576: ~10u; lenet_c3 n=196: ~6u).
    - accumulate="float": the same with u32 = 2^-24, plus up to n·u32 for a tensor core's
      truncating adds: negligible next to the inputs' rounding.
    - rounding the output to half: at most u·|y|: rtol = u.
    - a large output has large partial sums: given y, s_k drifts like (k/n)·y, and the rounding of
      those drifting sums adds a std of u·sqrt(n/9)·|y| (the sum of (k/n)²·y² over k is n·y²/3,
      each rounding's variance u²/3). With accumulate="half" that is relative to |y|, so it goes
      into rtol: lam·u·sqrt(n)/3. (A correct half kernel once missed the bound without it: an
      output at 4.5 RMS on days100 was off by 0.77 against 0.73.)

    atol_rms = lam·sqrt(sum of the squared stds)/R; lam (default 12) covers the tails (see
    TOL_LAMBDA)."""
    if accumulate not in ("half", "float"):
        raise ValueError("accumulate must be 'half' or 'float'")
    n = C * K ** dims
    var = 0.0 if rounded_inputs else (2.0 / 3.0) * U16 ** 2
    rtol = U16
    if accumulate == "half":
        var += U16 ** 2 * (n + 1) / 6.0
        rtol += lam * U16 * math.sqrt(n) / 3.0
    else:
        var += U32 ** 2 * (n + 1) / 6.0 + (n * U32) ** 2
    return rtol, lam * math.sqrt(var)


def check_fp16(y, ref, C: int, K: int, accumulate: str = "half", rounded_inputs: bool = False,
               name: str = "y", **kw):
    """cl.check with fp16_tolerance's bound (atol = atol_rms·RMS(ref))."""
    rtol, atol_rms = fp16_tolerance(C, K, accumulate, rounded_inputs)
    r = ref if isinstance(ref, torch.Tensor) else torch.as_tensor(ref)
    rms = float(r.double().pow(2).mean().sqrt()) if r.numel() else 1.0
    return check(y, ref, rtol=rtol, atol=atol_rms * max(rms, 1e-30), name=name, **kw)
