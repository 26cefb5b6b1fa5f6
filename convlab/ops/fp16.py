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
- pick(workload) / conv2d_fp16_best: which kernel and tunables a layer gets.
- fp16_tolerance / check_fp16: the error bound the tests use, from the precision and C·K².
"""
from __future__ import annotations

import math

import torch

from . import ceil_div, check_output, conv2d_shapes
from ._kernels import module, padding

CONVERT_FILE = "kernels/06_fp16/convert_fp16.cu"
HALF_FILE = "kernels/06_fp16/conv2d_half.cu"
HALF2_FILE = "kernels/06_fp16/conv2d_half2.cu"
WMMA_FILE = "kernels/06_fp16/conv2d_wmma.cu"
SMALLC_FILE = "kernels/06_fp16/conv2d_wmma_smallc.cu"

U16 = 2.0 ** -11          # unit roundoff of fp16 (11 significant bits, round to nearest)
U32 = 2.0 ** -24          # ... of fp32
MAX_SHARED = 48 * 1024    # bytes of shared memory a block may use without opting in
CONVERT_BLOCK = 256


# ---- tensors -------------------------------------------------------------------------------------

def _need_half(**tensors):
    for name, t in tensors.items():
        if t.dtype != torch.float16:
            raise TypeError(f"{name} must be float16 (convert it with fp16.to_half({name})), got {t.dtype}")


def _half_out(y, shape):
    import convlab as cl

    if y is None:
        return cl.empty(*shape, dtype=torch.float16)
    if y.dtype != torch.float16:
        raise TypeError(f"y must be float16, got {y.dtype}")
    check_output(y, shape)
    if not _aligned16(y):
        raise ValueError("y must start 16-byte aligned (the kernels store half2 pairs): pass a fresh tensor")
    return y


def _scratch(*shape, dtype=torch.float16):
    """An internal buffer that a kernel overwrites completely: torch.empty on the backend's device,
    not cl.empty (whose NaN fill is one more kernel, inside every timing)."""
    import convlab as cl

    return torch.empty(*shape, dtype=dtype, device=cl.device().torch_device)


def _aligned16(t) -> bool:
    return t.device.type == "meta" or t.data_ptr() % 16 == 0


def _convert(name, src, dst):
    n = src.numel()
    if n == 0:
        return dst
    if n > 2**31 - 1:
        raise ValueError(f"{n:,} values: too many for int indices")
    if not (src.is_contiguous() and dst.is_contiguous() and _aligned16(src) and _aligned16(dst)):
        raise ValueError("to_half/to_float need contiguous, 16-byte aligned tensors (use .contiguous() or .clone())")
    threads = n // 4 + n % 4
    module(CONVERT_FILE, {"BLOCK": CONVERT_BLOCK}).kernel(name)(
        src, dst, n, grid=(ceil_div(threads, CONVERT_BLOCK), 1, 1), block=(CONVERT_BLOCK, 1, 1))
    return dst


def to_half(x, out=None):
    """float32 -> float16 on the device, round to nearest even (bit for bit x.half())."""
    import convlab as cl

    if x.dtype != torch.float32:
        raise TypeError(f"to_half takes float32, got {x.dtype}")
    out = cl.empty(*x.shape, dtype=torch.float16) if out is None else out
    if out.dtype != torch.float16 or out.shape != x.shape:
        raise ValueError(f"out must be float16 of shape {tuple(x.shape)}")
    return _convert("float_to_half", x, out)


def to_float(xh, out=None):
    """float16 -> float32 on the device (exact)."""
    import convlab as cl

    _need_half(xh=xh)
    out = cl.empty(*xh.shape) if out is None else out
    if out.dtype != torch.float32 or out.shape != xh.shape:
        raise ValueError(f"out must be float32 of shape {tuple(xh.shape)}")
    return _convert("half_to_float", xh, out)


def mask_to_tap_major(wh, out=None):
    """The half mask (M, C, K, K) reordered to (M, K, K, C): conv2d_wmma's reduction order."""
    _need_half(w=wh)
    M, C, K, _ = (int(s) for s in wh.shape)
    out = _scratch(M, K, K, C) if out is None else out
    n = M * C * K * K
    module(CONVERT_FILE, {"BLOCK": CONVERT_BLOCK}).kernel("mask_to_tap_major")(
        wh, out, M, C, K * K, grid=(ceil_div(n, CONVERT_BLOCK), 1, 1), block=(CONVERT_BLOCK, 1, 1))
    return out


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
        if C * K * K * MT * 2 <= MAX_SHARED or MT <= 2:
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
    return C * K * K * MT * 2 <= MAX_SHARED


def _direct(path, kname, xh, wh, y, stride, pad, MT, ROWS, BLOCK):
    _need_half(x=xh, w=wh)
    B, C, M, H, W, K, Ho, Wo = conv2d_shapes(xh, wh, stride, pad)
    cfg = direct_config(M, C, K, Ho)
    MT, rows, BLOCK = int(MT or cfg["MT"]), int(ROWS or cfg["ROWS"]), int(BLOCK or cfg["BLOCK"])
    if MT % 2:
        raise ValueError(f"MT={MT}: must be even (maps go in pairs)")
    if not direct_fits(M, C, K, MT):
        raise ValueError(f"the mask slice C·K²·MT = {C * K * K * MT:,} halves does not fit in 48 KB of shared memory")
    y = _half_out(y, (B, M, Ho, Wo))
    mod = module(path, {"M_OUT": M, "C_IN": C, "KSIZE": K, "STRIDE": stride, "MT": MT, "ROWS": rows, "BLOCK": BLOCK})
    threads = B * ceil_div(Ho, rows) * Wo
    grid = (ceil_div(threads, BLOCK), ceil_div(M, MT), 1)
    if grid[1] > 65_535:
        raise ValueError(f"grid {grid} over the limits")
    mod.kernel(kname)(xh, wh, y, B, H, W, pad, grid=grid, block=(BLOCK, 1, 1))
    return y


def conv2d_half(xh, wh, y=None, *, stride: int = 1, pad: int = 0, padding: int | None = None,
                MT: int | None = None, ROWS: int | None = None, BLOCK: int | None = None):
    """Step 1: register-tiled direct convolution computing in half (accumulators in half)."""
    return _direct(HALF_FILE, "conv2d_half", xh, wh, y, stride, _pad(pad, padding), MT, ROWS, BLOCK)


def conv2d_half2(xh, wh, y=None, *, stride: int = 1, pad: int = 0, padding: int | None = None,
                 MT: int | None = None, ROWS: int | None = None, BLOCK: int | None = None):
    """Step 2: the same with half2: maps in pairs, two results per HFMA2."""
    return _direct(HALF2_FILE, "conv2d_half2", xh, wh, y, stride, _pad(pad, padding), MT, ROWS, BLOCK)


def _pad(pad, padding_alias):
    return padding(pad, padding_alias)


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
    if smem > MAX_SHARED:
        raise ValueError(f"tile BM={BM} BN={BN} BK={BK} needs {smem:,} bytes of shared memory, over 48 KB")


def conv2d_wmma(xh, wh, y=None, *, stride: int = 1, pad: int = 0, padding: int | None = None,
                BM: int | None = None, BN: int | None = None, BK: int | None = None,
                WARPS_M: int | None = None, WARPS_N: int | None = None):
    """Step 3: implicit GEMM on tensor cores. Runs mask_to_tap_major first (counted in its time)."""
    pad_ = _pad(pad, padding)
    _need_half(x=xh, w=wh)
    B, C, M, H, W, K, Ho, Wo = conv2d_shapes(xh, wh, stride, pad_)
    cfg = wmma_config(M, C, K)
    BM, BN, BK = int(BM or cfg["BM"]), int(BN or cfg["BN"]), int(BK or cfg["BK"])
    WARPS_M, WARPS_N = int(WARPS_M or cfg["WARPS_M"]), int(WARPS_N or cfg["WARPS_N"])
    check_wmma_tunables(BM, BN, BK, WARPS_M, WARPS_N)
    y = _half_out(y, (B, M, Ho, Wo))
    N = B * Ho * Wo
    grid = (ceil_div(N, BN), ceil_div(M, BM), 1)
    if grid[1] > 65_535:
        raise ValueError(f"grid {grid} over the limits")
    wt = mask_to_tap_major(wh)
    defines = {"BM": BM, "BN": BN, "BK": BK, "WARPS_M": WARPS_M, "WARPS_N": WARPS_N,
               "C_IN": C, "M_OUT": M, "IN_H": H, "IN_W": W, "KSIZE": K, "PAD": pad_, "STRIDE": stride}
    module(WMMA_FILE, defines).kernel("conv2d_wmma")(
        xh, wt, y, B, grid=grid, block=(32 * WARPS_M * WARPS_N, 1, 1))
    return y


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


def smallc_config(C: int, K: int, H: int, W: int, pad: int = 0, WARPS: int | None = None) -> dict | None:
    """RP (row pitch: W+2·pad rounded up to 16/CP positions), WARPS (4; 2 when the staging of NPH
    accumulators per warp would crowd shared memory) and BAND, the output rows of a block: all of
    Ho when they fit in 48 KB (lenet_c3: the whole 34 rows, 41 KB), else the fewest equal bands that
    fit. None when even one row does not fit."""
    if not 1 <= C <= 8:
        return None
    cp = _cp(C)
    RP = ceil_div(W + 2 * pad, 16 // cp) * (16 // cp)
    Ho = H + 2 * pad - K + 1
    if Ho < 1:
        return None
    warps_options = [int(WARPS)] if WARPS else ([4, 2, 1] if 8 // cp <= 2 else [2, 1])
    for warps in warps_options:
        if smallc_shared(C, K, RP, 1, warps) > MAX_SHARED:
            continue
        band = Ho
        while smallc_shared(C, K, RP, band, warps) > MAX_SHARED:
            band -= 1
        nbands = ceil_div(Ho, band)
        band = ceil_div(Ho, nbands)          # equal bands: less waste in the last one
        return {"RP": RP, "BAND": band, "WARPS": warps}
    return None


def smallc_fits(C: int, K: int, H: int, W: int, pad: int = 0, stride: int = 1) -> bool:
    return stride == 1 and smallc_config(C, K, H, W, pad) is not None


def conv2d_wmma_smallc(xh, wh, y=None, *, stride: int = 1, pad: int = 0, padding: int | None = None,
                       WARPS: int | None = None, BAND: int | None = None):
    """Step 4: tensor cores straight from an input tile in shared memory (1 <= C <= 8, stride 1).
    Runs smallc_mask first (the mask as B matrices; counted in its time)."""
    pad_ = _pad(pad, padding)
    _need_half(x=xh, w=wh)
    B, C, M, H, W, K, Ho, Wo = conv2d_shapes(xh, wh, stride, pad_)
    if stride != 1:
        raise ValueError("conv2d_wmma_smallc computes stride 1 only (use conv2d_wmma)")
    cfg = smallc_config(C, K, H, W, pad_, WARPS)
    if cfg is None:
        raise ValueError(f"conv2d_wmma_smallc takes 1 to 8 channels and a row that fits in 48 KB; got C={C}, "
                         f"K={K}, W={W}, pad={pad_} (use conv2d_wmma)")
    if BAND is not None:
        cfg["BAND"] = int(BAND)
        if smallc_shared(C, K, cfg["RP"], cfg["BAND"], cfg["WARPS"]) > MAX_SHARED:
            raise ValueError(f"BAND={BAND} needs more than 48 KB of shared memory")
    y = _half_out(y, (B, M, Ho, Wo))
    nbands = ceil_div(Ho, cfg["BAND"])
    groups = ceil_div(M, 16)
    grid = (B * nbands, groups, 1)
    defines = {"C_IN": C, "M_OUT": M, "KSIZE": K, "IN_H": H, "IN_W": W, "PAD": pad_, **cfg}
    mod = module(SMALLC_FILE, defines)
    # the mask as B matrices, once per call (its cost is in the timing): groups x K x JC x 16 x 16
    nb = groups * K * ceil_div(K * _cp(C), 16) * 256
    wb = _scratch(nb)
    mod.kernel("smallc_mask")(wh, wb, grid=(ceil_div(nb, 256), 1, 1), block=(256, 1, 1))
    mod.kernel("conv2d_wmma_smallc")(xh, wb, y, B, grid=grid, block=(32 * cfg["WARPS"], 1, 1))
    return y


# ---- the dispatcher and the whole float32 -> float32 path ----------------------------------------------

def _shape_of(workload):
    from .fused import _shape_of as shape_of
    return shape_of(workload)


def pick(workload, tensor_cores: bool = True) -> tuple:
    """(name, launcher, tunables) for a layer in fp16.

    - tensor_cores=False: conv2d_half2 with direct_config (the chapter's best without tensor cores).
    - 1–8 input channels, stride 1 and a row that fits (lenet_c1, lenet_c3, fa17):
      conv2d_wmma_smallc. There the GEMM's K dimension is short (C·K² ≤ 392) and an implicit GEMM
      spends its time gathering U one half at a time; the smallc kernel reads the fragments straight
      from the input tile.
    - Otherwise (resnet, days100): conv2d_wmma with wmma_config.
    """
    B, C, M, H, W, K, stride, pad = _shape_of(workload)
    if not tensor_cores:
        return "half2 direct", conv2d_half2, direct_config(M, C, K, (H + 2 * pad - K) // stride + 1)
    if smallc_fits(C, K, H, W, pad, stride):
        return "WMMA, few channels (no im2col)", conv2d_wmma_smallc, {}
    return "WMMA implicit GEMM", conv2d_wmma, wmma_config(M, C, K)


def conv2d_fp16_best(xh, wh, y=None, *, stride: int = 1, pad: int = 0, padding: int | None = None,
                     tensor_cores: bool = True):
    pad_ = _pad(pad, padding)
    B, C, H, W = (int(s) for s in xh.shape)
    M, K = int(wh.shape[0]), int(wh.shape[2])
    _, fn, tunables = pick({"B": B, "C": C, "M": M, "H": H, "W": W, "K": K, "stride": stride, "pad": pad_},
                           tensor_cores=tensor_cores)
    return fn(xh, wh, y, stride=stride, pad=pad_, **tunables)


def conv2d_fp16(x, w, y=None, *, stride: int = 1, pad: int = 0, padding: int | None = None, impl=None, **tunables):
    """float32 x, w -> float32 y through half: to_half(x), to_half(w), the convolution `impl` (a
    launcher of this module; default the pick), to_float(y). What a float32 network pays to run a
    layer in fp16, conversions included."""
    pad_ = _pad(pad, padding)
    B, C, H, W = (int(s) for s in x.shape)
    M, K = int(w.shape[0]), int(w.shape[2])
    xh, wh = to_half(x, _scratch(*x.shape)), to_half(w, _scratch(*w.shape))
    yh = _scratch(B, M, (H + 2 * pad_ - K) // stride + 1, (W + 2 * pad_ - K) // stride + 1)
    yh = (impl or conv2d_fp16_best)(xh, wh, yh, stride=stride, pad=pad_, **tunables)
    return to_float(yh, y)


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

    atol_rms = lam·sqrt(sum of the squared stds)/R; lam (default 12) covers the heavy tails (see
    TOL_LAMBDA)."""
    if accumulate not in ("half", "float"):
        raise ValueError("accumulate must be 'half' or 'float'")
    n = C * K ** dims
    var = 0.0 if rounded_inputs else (2.0 / 3.0) * U16 ** 2
    if accumulate == "half":
        var += U16 ** 2 * (n + 1) / 6.0
    else:
        var += U32 ** 2 * (n + 1) / 6.0 + (n * U32) ** 2
    return U16, lam * math.sqrt(var)


def check_fp16(y, ref, C: int, K: int, accumulate: str = "half", rounded_inputs: bool = False,
               name: str = "y", **kw):
    """cl.check with fp16_tolerance's bound (atol = atol_rms·RMS(ref))."""
    import convlab as cl

    rtol, atol_rms = fp16_tolerance(C, K, accumulate, rounded_inputs)
    r = ref if isinstance(ref, torch.Tensor) else torch.as_tensor(ref)
    rms = float(r.double().pow(2).mean().sqrt()) if r.numel() else 1.0
    return cl.check(y, ref, rtol=rtol, atol=atol_rms * max(rms, 1e-30), name=name, **kw)


#: The chapter's convolutions by the name the figures use: (launcher, accumulation).
IMPLEMENTATIONS = {
    "half (direct, register-tiled)": (conv2d_half, "half"),
    "half2 (direct, register-tiled)": (conv2d_half2, "half"),
    "WMMA implicit GEMM": (conv2d_wmma, "float"),
    "WMMA, few channels (no im2col)": (conv2d_wmma_smallc, "float"),
}
