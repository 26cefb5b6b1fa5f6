"""Hopper's wgmma + TMA kernels for the layers of today's CNNs, in fp16 and bf16, forward and
backward (kernels/11_hopper/conv2d_hopper.cu, conv2d_hopper_dw.cu, splitk_reduce.cu; chapter 11's
conv2d_wgmma.cu is the teaching form they grow from, its launcher convlab.ops.wgmma).

- conv2d_hopper(x, w, y=None, *, stride=1, padding=0, dilation=1, groups=1, bias=None, relu=False,
  **tunables): y = conv2d(x, w, bias) (ReLU if relu), x and w both float16 or both bfloat16, float
  sums rounded once (TMA_STORE=1: the epilogue's stores by the copy engine, the consumers on to the
  next tile meanwhile); any stride (up to 8), padding and dilation, groups 1. x channels_last is read
  as it lies (an NCHW x is converted inside the call, in its time); C not a multiple of 8 is padded
  with zeros (one copy of x; C <= 8: the kernel's few-channel form, 8 taps a stage). A 1x1 layer at
  stride 1 without padding is a plain GEMM over the B*H*W pixels (box BW = 128 pixels of that row).
  Returns y channels_last, logical shape (B, M, Ho, Wo).
- conv2d_hopper_dx(dy, w, dx=None, *, stride, padding, input_size=None, dilation, groups=1,
  **tunables): dE/dX by the same kernel on dy with the mask read as it lies (N-major), every stride
  phase in one launch. C and M multiples of 8.
- conv2d_hopper_dw(x, dy, dw=None, *, stride, padding, kernel_size, dilation, groups=1,
  **tunables): dE/dW, a GEMM over pixels per tap (conv2d_hopper_dw.cu), fp32 sums split over the
  pixels and added in order (splitk_reduce.cu). M a multiple of 8; C padded to 8 where it is not.
- hopper_config(shape), hopper_dx_config(shape), hopper_dw_config(shape): the tunables a layer
  gets (BN, STAGES, RINGS, the box BW x BH x BI, SPLIT_K, TMA_STORE; dW: BN, STAGES, CONSUMERS, box,
  SPLIT_K). dX takes one ring and no TMA_STORE; TMA_STORE=1 needs one ring, no split and M % 8 == 0.
- refuses(shape, op): why a kernel cannot take a layer (None: it can).
- HOPPER, HOPPER_DX, HOPPER_DW (op conv2d_fp16, conv2d_dx_fp16, conv2d_dw_fp16: 16-bit in and out;
  dtypes fp16) and their bf16 twins HOPPER_BF16, HOPPER_DX_BF16, HOPPER_DW_BF16 (the same ops and
  launchers, dtypes bf16): the Impl records; the dispatcher's 16-bit rows name them
  (convlab.ops.dispatch: channels_last fp16 layers of their class, every bf16 layer they take).

Split-K: a layer with fewer output tiles than SPLIT_BELOW of the SMs gets SPLIT_K > 1: the work
units (tile, split) each sum an even share of K and store fp32 partials to a workspace (SPLIT_K,
output) allocated in the call; splitk_reduce.cu adds them in order 0, 1, ... and rounds once (the
same bits on every run: no atomics).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from ..gpu import runtime
from ..gpu._limits import INT32_MAX
from ..measuring.workloads import Workload
from . import Impl, ceil_div, new_output
from ._kernels import Launch, remember, sm_count
from .shapes import check_tensors, layer, two
from .tensor_core import channels_last_out
from .wgmma import BK, ROWS, SHARED_OPTIN_MAX, THREADS, box_shape, deepest, runs_here, shared_bytes, static_shared

FILE = "kernels/11_hopper/conv2d_hopper.cu"
DW_FILE = "kernels/11_hopper/conv2d_hopper_dw.cu"
REDUCE_FILE = "kernels/11_hopper/splitk_reduce.cu"
TUNABLES = ("BN", "STAGES", "RINGS", "BW", "BH", "BI", "SPLIT_K", "TMA_STORE")
DW_TUNABLES = ("BN", "STAGES", "CONSUMERS", "BW", "BH", "BI", "SPLIT_K")
DTYPES = {torch.float16: 0, torch.bfloat16: 1}     # the kernels' DTYPE define
MAX_STRIDE = 8                  # the copy engine's element strides go to 8
MAX_SPLIT = 16
MAX_DW_SPLIT = 64
MIN_SPLIT_STEPS = 4             # a split's share of K: at least this many stages (the pipeline fills)
#: Split K while the output tiles fill less than this share of the SMs (one tile a block).
SPLIT_BELOW = 0.75
SMALL_C_TAPS = 8                # the few-channel form: taps of 8 channels a stage
REDUCE_THREADS = 256
DW_BOX = 64                     # dW: pixels a stage (the K of 4 wgmma k16)


# ---- shapes -------------------------------------------------------------------------------------------

class _View(NamedTuple):
    """A forward layer as the kernel sees it: images, input and output sizes, channels as read."""
    B: int
    Hout: int
    Wout: int
    C8: int                       # x's channels as the kernel reads them (padded to 8)
    small_c: bool                 # 8 channels a tap, 8 taps a stage
    gemm: bool                    # 1x1, stride 1, no padding: one row of B*H*W pixels


def _view(s: Workload) -> _View:
    gemm = (s.K, s.Kw, s.stride, s.stride_w, s.padding, s.padding_w) == (1, 1, 1, 1, 0, 0)
    small = s.C <= 8 and not gemm
    C8 = 8 if small else ceil_div(s.C, 8) * 8
    if gemm:
        return _View(1, 1, s.B * s.H * s.W, C8, False, True)
    return _View(s.B, s.Ho, s.Wo, C8, small, False)


def _axis(r: int, n_out: int, K: int, s: int, p: int, d: int, dx: bool) -> tuple:
    """(pixels, taps) of one axis of a tile's phase, as the kernel's axis_of works them out."""
    if not dx:
        return n_out, K
    g = math.gcd(s, d)
    k0 = next((k for k in range(K - 1, -1, -1) if (r + p - k * d) % s == 0), -1)
    return ceil_div(n_out - r, s), (0 if k0 < 0 else k0 // (s // g) + 1)


def _phases(Hout, Wout, Kh, Kw, sh, sw, ph, pw, dh, dw, dx: bool) -> list:
    """[((rows, taps_h), (cols, taps_w))] per phase: the forward's one, or dX's stride phases."""
    hs = [_axis(r, Hout, Kh, sh, ph, dh, dx) for r in range(min(sh, Hout) if dx else 1)]
    ws = [_axis(r, Wout, Kw, sw, pw, dw, dx) for r in range(min(sw, Wout) if dx else 1)]
    return [(a, b) for a in hs for b in ws]


def _bn(NM: int, pixel_tiles: int, sms: int) -> int:
    """wgmma_config's rule: 256 where a layer of 256 channels or more has at least two tiles per SM
    of that width, 64 for at most 64 channels or where 128-wide tiles would leave half the SMs idle,
    else 128."""
    if NM <= 64 or pixel_tiles * ceil_div(NM, 128) < sms // 2:
        return 64
    if NM >= 256 and pixel_tiles * ceil_div(NM, 256) >= 2 * sms:
        return 256
    return 128


def _split(tiles: int, steps: int, sms: int, most: int) -> int:
    """SPLIT_K for `tiles` output tiles of `steps` K steps: 1 while they fill SPLIT_BELOW of the
    SMs, else enough splits for about one unit per SM, each at least MIN_SPLIT_STEPS steps."""
    if tiles >= SPLIT_BELOW * sms:
        return 1
    return max(1, min(most, sms // max(tiles, 1), steps // MIN_SPLIT_STEPS))


def _gemm_config(phases, B, NM, KC, small_c, sh, sw, sms, rings) -> dict:
    (Hp, _), (Wp, _) = phases[0]
    BW, BH, BI = box_shape(Hp, Wp, B, ROWS // rings, max_w=256 // sw, max_h=256 // sh)
    pixel_tiles = sum(ceil_div(w, BW) * ceil_div(h, BH) * ceil_div(B, BI) for (h, _), (w, _) in phases)
    BN = _bn(NM, pixel_tiles, sms)
    taps = max(th * tw for (_, th), (_, tw) in phases)
    steps = ceil_div(taps, SMALL_C_TAPS) if small_c else taps * ceil_div(KC, BK)
    split = _split(pixel_tiles * ceil_div(NM, BN), steps, sms, MAX_SPLIT)
    return dict(BN=BN, STAGES=deepest(BN, rings), RINGS=rings, BW=BW, BH=BH, BI=BI, SPLIT_K=split, TMA_STORE=0)


def hopper_config(shape: Workload, sms: int | None = None, rings: int = 1) -> dict:
    """The tunables conv2d_hopper uses for a layer when none are passed: the box by box_shape over the
    output pixels (its width and height times the stride at most 256, the copy engine's limit; a 1x1
    layer at stride 1: 128 pixels of its one row), BN by wgmma_config's rule, the deepest ring that
    fits, one ring (rings: the box for that many), SPLIT_K by _split, the epilogue's stores by the
    threads (TMA_STORE=0). By design from chapter 11's measurements; not yet timed on the new layers
    (benchmarks/hopper_layers.py sweeps them)."""
    sms = sms or sm_count()
    v = _view(shape)
    s = (1, 1) if v.gemm else (shape.stride, shape.stride_w)
    phases = _phases(v.Hout, v.Wout, shape.K, shape.Kw, *s, shape.padding, shape.padding_w, shape.dilation,
                     shape.dilation_w, False)
    return _gemm_config(phases, v.B, shape.M, v.C8, v.small_c, *s, sms, rings)


def hopper_dx_config(shape: Workload, sms: int | None = None, rings: int = 1) -> dict:
    """The tunables conv2d_hopper_dx uses for a layer (its forward Workload) when none are passed:
    hopper_config's rule on dX's GEMM (C output channels from M, over every stride phase; the box of
    the first phase, the largest)."""
    sms = sms or sm_count()
    phases = _phases(shape.H, shape.W, shape.K, shape.Kw, shape.stride, shape.stride_w, shape.padding,
                     shape.padding_w, shape.dilation, shape.dilation_w, True)
    return _gemm_config(phases, shape.B, shape.C, shape.M, False, 1, 1, sms, rings)


def dw_box(Ho: int, Wo: int, B: int) -> tuple:
    """(BW, BH, BI): dW's box of dy's pixels, powers of two with BW*BH*BI = DW_BOX (every K row of a
    stage a pixel, zeros past dy's edge), the fewest boxes, then the wider."""
    best = None
    for bw in (1, 2, 4, 8, 16, 32, 64):
        for bh in (1, 2, 4, 8, 16, 32, 64):
            if DW_BOX % (bw * bh):
                continue
            bi = DW_BOX // (bw * bh)
            key = (ceil_div(Wo, bw) * ceil_div(Ho, bh) * ceil_div(B, bi), -bw)
            if best is None or key < best[0]:
                best = (key, (bw, bh, bi))
    return best[1]


def dw_shared_bytes(BN: int, STAGES: int, CONSUMERS: int, **_) -> int:
    """dW's dynamic shared memory: STAGES stages of CONSUMERS + BN/64 boxes of 64 x 64 values, and
    1 KB to align them to 1024 bytes."""
    return STAGES * (CONSUMERS + BN // 64) * DW_BOX * 64 * 2 + 1024


def _dw_deepest(BN: int, consumers: int) -> int:
    return max([s for s in range(2, 9) if dw_shared_bytes(BN, s, consumers) + 16 * s <= SHARED_OPTIN_MAX], default=2)


def hopper_dw_config(shape: Workload, sms: int | None = None) -> dict:
    """The tunables conv2d_hopper_dw uses for a layer (its forward Workload) when none are passed:
    one consumer warpgroup for at most 64 maps, else two (128 maps a tile); the widest BN (channels a
    tile) whose tiles still give every SM one, else 64; dw_box; the deepest ring that fits; SPLIT_K
    over the pixels for about one unit per SM. By design, not yet timed."""
    sms = sms or sm_count()
    C8 = ceil_div(shape.C, 8) * 8
    consumers = 1 if shape.M <= 64 else 2
    tiles_of = lambda bn: ceil_div(shape.M, 64 * consumers) * shape.K * shape.Kw * ceil_div(C8, bn)  # noqa: E731
    BN = next((bn for bn in (256, 128) if bn <= C8 and tiles_of(bn) >= sms), 64)
    BW, BH, BI = dw_box(shape.Ho, shape.Wo, shape.B)
    steps = ceil_div(shape.Wo, BW) * ceil_div(shape.Ho, BH) * ceil_div(shape.B, BI)
    split = _split(tiles_of(BN), steps, sms, MAX_DW_SPLIT)
    return dict(BN=BN, STAGES=_dw_deepest(BN, consumers), CONSUMERS=consumers, BW=BW, BH=BH, BI=BI, SPLIT_K=split)


def refuses(s: Workload, op: str = "forward") -> str | None:
    """Why conv2d_hopper (op "forward"), conv2d_hopper_dx ("dx") or conv2d_hopper_dw ("dw") cannot
    take the layer (None: it can)."""
    if getattr(s, "D", None) is not None:
        return "a 3D layer"
    if s.groups != 1:
        return f"groups {s.groups}: the kernels take groups 1"
    if not s.symmetric:
        return "padding that differs at the two ends (torch's 'same' with an even mask)"
    if max(s.stride, s.stride_w) > MAX_STRIDE:
        return f"stride {(s.stride, s.stride_w)}: the copy engine steps at most {MAX_STRIDE} elements"
    if op == "dx" and (s.C % 8 or s.M % 8):
        return f"C={s.C}, M={s.M}: dX reads dy and the mask by 16-byte rows, both multiples of 8"
    if op == "dw" and s.M % 8:
        return f"M={s.M}: dW reads dy by 16-byte rows, a multiple of 8"
    C8 = ceil_div(s.C, 8) * 8
    if max(s.B * s.H * s.W * C8, s.B * s.Ho * s.Wo * s.M, s.M * s.K * s.Kw * C8) > INT32_MAX // 2:
        return "a tensor over 2^30 elements"
    return None


def _takes(op: str):
    return lambda s: refuses(s, op) is None and runs_here()


# ---- tensors ------------------------------------------------------------------------------------------

def _nhwc(t: torch.Tensor, C8: int | None = None) -> torch.Tensor:
    """t (N, C, H, W) as a contiguous, 16-byte aligned NHWC tensor of C8 channels (zeros past C): a
    view when t is channels_last already and needs no padding, else one copy."""
    tn = t.permute(0, 2, 3, 1)
    if C8 is not None and C8 != t.shape[1]:
        return F.pad(tn, (0, C8 - t.shape[1])).contiguous()
    if tn.is_contiguous() and tn.data_ptr() % 16 == 0:
        return tn
    return tn.contiguous()


_unused: dict = {}      # device -> a float the kernels get for ws when there is no split (never touched)


def _no_workspace(like: torch.Tensor) -> torch.Tensor:
    ws = _unused.get(like.device)
    if ws is None:
        ws = _unused[like.device] = torch.zeros(1, dtype=torch.float32, device=like.device)
    return ws


def _tunables(given: dict, allowed: tuple, who: str) -> dict:
    bad = [k for k in given if k not in allowed]
    if bad:
        raise TypeError(f"{who} got unknown tunables {bad}; it takes {', '.join(allowed)}")
    return {k: int(v) for k, v in given.items() if v is not None}


# ---- forward and dX: conv2d_hopper.cu -----------------------------------------------------------------

class _Plan(NamedTuple):
    out_shape: tuple              # the output's logical (N, C, H, W)
    C8: int | None                # x's channels padded to this (None: as they are)
    a_box: tuple                  # the input's box (outermost first), element strides, swizzle
    a_steps: tuple | None
    a_swizzle: int
    b_box: tuple
    b_swizzle: int
    y_box: tuple | None           # TMA_STORE: the output's box for the copy engine's stores
    view: tuple | None            # the input and output as the kernel sees them (a 1x1 layer's one row)
    launch: Launch
    reduce: Launch | None
    ws_shape: tuple


def _gemm_plan(op, dtype, B, Hout, Wout, KC, NM, Kh, Kw, stride, padding, dilation, small_c, t, out_shape, C8, view,
               has_bias=False, relu=False):
    """The launches of conv2d_hopper.cu (and its split-K reduction) for a forward or dX GEMM."""
    dx = op == "dx"
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    BN, STAGES, RINGS, BW, BH, BI, splits, tma_store = (t[k] for k in TUNABLES)
    if (BN not in (64, 128, 256) or not 2 <= STAGES <= 8 or RINGS not in (1, 2) or min(BW, BH, BI) < 1
            or BW * BH * BI > ROWS // RINGS or not 1 <= splits <= MAX_SPLIT or tma_store not in (0, 1)):
        raise ValueError(f"conv2d_hopper tunables {t}: BN 64, 128 or 256; STAGES 2..8; RINGS 1 or 2; "
                         f"BW*BH*BI <= {ROWS}/RINGS; SPLIT_K 1..{MAX_SPLIT}; TMA_STORE 0 or 1")
    if dx and RINGS != 1:
        raise ValueError(f"conv2d_hopper_dx tunables {t}: one ring (RINGS=1)")
    if tma_store and (dx or RINGS != 1 or splits != 1 or NM % 8):
        raise ValueError(f"conv2d_hopper tunables {t}: TMA_STORE=1 stores a forward's dense output with one ring, "
                         f"no split and output channels a multiple of 8 (here {NM})")
    es_h, es_w = (1, 1) if dx else (sh, sw)
    if BW * es_w > 256 or BH * es_h > 256:
        raise ValueError(f"conv2d_hopper tunables {t}: the box spans BW*stride = {BW * es_w} columns and "
                         f"BH*stride = {BH * es_h} rows of the input, at most 256 each (the copy engine's limit)")
    smem = shared_bytes(BN, STAGES, RINGS)
    if smem + static_shared(STAGES, RINGS) > SHARED_OPTIN_MAX:
        raise ValueError(f"conv2d_hopper tunables {t}: {smem:,} bytes of shared memory, over {SHARED_OPTIN_MAX:,}")
    phases = _phases(Hout, Wout, Kh, Kw, sh, sw, ph, pw, dh, dw, dx)
    tiles = sum(ceil_div(w, BW) * ceil_div(h, BH) * ceil_div(B, BI) for (h, _), (w, _) in phases) * ceil_div(NM, BN)
    units = tiles * splits
    n = B * Hout * Wout * NM
    if splits * n > INT32_MAX // 2 or units > INT32_MAX // 2:
        raise ValueError(f"SPLIT_K={splits}: a workspace of {splits * n:,} floats; a smaller SPLIT_K or batch")
    row = 16 if small_c else BK * 2
    defines = dict(DTYPE=DTYPES[dtype], BN=BN, STAGES=STAGES, RINGS=RINGS, DX=int(dx), SMALL_C=int(small_c),
                   TMA_STORE=tma_store)
    # the kernel adds the bias and applies ReLU itself only without a split (else the reduction does)
    scalars = (int(has_bias and splits == 1), int(relu and splits == 1), splits, units, B, KC, NM, Hout, Wout, Kh, Kw,
               sh, sw, ph, pw, dh, dw, BW, BH, BI, BW * BH * BI * row)
    launch = Launch(FILE, "conv2d_hopper", defines, scalars, grid=(min(ceil_div(units, RINGS), sm_count()),),
                    block=(THREADS,), shared=smem, max_shared=SHARED_OPTIN_MAX)
    reduce = None
    if splits > 1:
        reduce = Launch(REDUCE_FILE, "splitk_reduce", dict(DTYPE=DTYPES[dtype]),
                        (int(has_bias), int(relu), splits, n, NM),
                        grid=(ceil_div(n, 4 * REDUCE_THREADS),), block=(REDUCE_THREADS,))
    chan = 8 if small_c else BK
    a_box = (BI, BH * es_h, BW * es_w, chan)
    a_steps = (1, es_h, es_w, 1) if (es_h, es_w) != (1, 1) else None
    b_box = (64, 1, 1, 64) if dx else (BN, 1, 1, chan)
    sw_ = 0 if small_c else 128
    y_box = (BI, BH, BW, 64) if tma_store else None
    return _Plan(out_shape, C8, a_box, a_steps, sw_, b_box, sw_, y_box, view, launch, reduce, (splits, n))


def _fwd_plan(x_shape, w_shape, dtype, stride, padding, dilation, groups, has_bias, relu, tunables) -> _Plan:
    s = layer(x_shape, w_shape, stride, padding, dilation, groups)
    why = refuses(s)
    if why:
        raise ValueError(f"conv2d_hopper: {why}")
    given = _tunables(tunables, TUNABLES, "conv2d_hopper")
    t = {**hopper_config(s, rings=given.get("RINGS", 1)), **given}
    if "STAGES" not in given:
        t["STAGES"] = deepest(t["BN"], t["RINGS"])
    if "SPLIT_K" not in given and given:       # the config's split was for its own tile
        t["SPLIT_K"] = 1 if not set(given) <= {"TMA_STORE"} else t["SPLIT_K"]
    if t["TMA_STORE"] and "SPLIT_K" not in given:
        t["SPLIT_K"] = 1
    v = _view(s)
    st = (1, 1) if v.gemm else (s.stride, s.stride_w)
    view = ((1, 1, v.Wout, v.C8), (1, 1, v.Wout, s.M)) if v.gemm else None
    return _gemm_plan("forward", dtype, v.B, v.Hout, v.Wout, v.C8, s.M, s.K, s.Kw, st, (s.padding, s.padding_w),
                      (s.dilation, s.dilation_w), v.small_c, t, (s.B, s.M, s.Ho, s.Wo),
                      v.C8 if v.C8 != s.C else None, view, has_bias, relu)


def _run(plan: _Plan, a, wn, out_nhwc, bias):
    """One conv2d_hopper launch (and its reduction) on NHWC tensors."""
    a_map = runtime.tensor_map(a, plan.a_box, plan.a_swizzle, plan.a_steps)
    b_map = runtime.tensor_map(wn, plan.b_box, plan.b_swizzle)
    y_map = a_map if plan.y_box is None else runtime.tensor_map(out_nhwc, plan.y_box)   # a_map: not read
    b = out_nhwc if bias is None else bias
    if plan.reduce is None:
        plan.launch(out_nhwc, b, _no_workspace(out_nhwc), a_map, b_map, y_map)
        return
    ws = new_output(plan.ws_shape, out_nhwc, torch.float32)
    plan.launch(out_nhwc, b, ws, a_map, b_map, y_map)
    plan.reduce(out_nhwc, ws, b)


def conv2d_hopper(x, w, y=None, *, stride=1, padding=0, dilation=1, groups=1, bias=None, relu=False, **tunables):
    """y = conv2d(x, w, bias) (then ReLU if relu) in fp16 or bf16 on Hopper's wgmma fed by TMA; see
    the module's docstring."""
    dtype = check_tensors(("fp16", "bf16"), layout=None, x=x, w=w, bias=bias)
    if x.dim() != 4 or w.dim() != 4:
        raise ValueError(f"expected x (B, C, H, W) and w (M, C, Kh, Kw), got {tuple(x.shape)} and {tuple(w.shape)}")
    if bias is not None and tuple(bias.shape) != (w.shape[0],):
        raise ValueError(f"bias has shape {tuple(bias.shape)}, expected ({w.shape[0]},)")
    key = (x.shape, w.shape, dtype, stride, padding, dilation, groups, bias is not None, bool(relu),
           tuple(sorted(tunables.items())))
    plan = remember(_plans, key, lambda: _fwd_plan(x.shape, w.shape, dtype, stride, padding, dilation, groups,
                                                   bias is not None, bool(relu), tunables),
                    (stride, padding, dilation, groups))
    y = channels_last_out(y, plan.out_shape, x, "y")
    xn, wn, yn = _nhwc(x, plan.C8), _nhwc(w, plan.C8), y.permute(0, 2, 3, 1)
    if plan.view is not None:
        xn, yn = xn.view(plan.view[0]), yn.view(plan.view[1])
    _run(plan, xn, wn, yn, None if bias is None else bias.contiguous())
    return y


def _dx_plan(dy_shape, w_shape, dtype, stride, padding, dilation, groups, size, tunables) -> _Plan:
    B, M, Ho, Wo = (int(v) for v in dy_shape)
    _, Cg, Kh, Kw = (int(v) for v in w_shape)
    (sh, sw), (ph, pw), (dh, dw) = (two(v) for v in (stride, padding, dilation))
    H0, W0 = (Ho - 1) * sh - 2 * ph + dh * (Kh - 1) + 1, (Wo - 1) * sw - 2 * pw + dw * (Kw - 1) + 1
    H, W = size or (H0, W0)
    if not (H0 <= H < H0 + sh and W0 <= W < W0 + sw) or min(H, W) < 1:
        raise ValueError(f"input_size {size}: dy {tuple(dy_shape)} comes from an input of {H0}..{H0 + sh - 1} x "
                         f"{W0}..{W0 + sw - 1} at stride {stride}, padding {padding}, dilation {dilation}, mask "
                         f"{Kh}x{Kw}")
    s = layer((B, Cg * groups, H, W), w_shape, (sh, sw), (ph, pw), (dh, dw), groups)
    why = refuses(s, "dx")
    if why:
        raise ValueError(f"conv2d_hopper_dx: {why}")
    given = _tunables(tunables, TUNABLES, "conv2d_hopper_dx")
    t = {**hopper_dx_config(s, rings=given.get("RINGS", 1)), **given}
    if "STAGES" not in given:
        t["STAGES"] = deepest(t["BN"], t["RINGS"])
    if "SPLIT_K" not in given and given:
        t["SPLIT_K"] = 1
    return _gemm_plan("dx", dtype, B, H, W, M, s.C, Kh, Kw, (sh, sw), (ph, pw), (dh, dw), False, t, (B, s.C, H, W),
                      None, None)


def conv2d_hopper_dx(dy, w, dx=None, *, stride=1, padding=0, input_size=None, dilation=1, groups=1, **tunables):
    """dx = dE/dX of conv2d(x, w, stride, padding, dilation) in fp16 or bf16 on wgmma: conv2d_hopper.cu
    on dy with the mask read N-major, every stride phase in one launch. dy (B, M, Ho, Wo) and w
    (M, C, Kh, Kw), NCHW or channels_last (an NCHW dy converted in the call); input_size: x's (H, W)
    (None: the smallest that gives dy). Returns dx (B, C, H, W) channels_last."""
    dtype = check_tensors(("fp16", "bf16"), layout=None, dy=dy, w=w)
    if dy.dim() != 4 or w.dim() != 4 or int(dy.shape[1]) != int(w.shape[0]):
        raise ValueError(f"expected dy (B, M, Ho, Wo) and w (M, C, Kh, Kw) with the same M, got {tuple(dy.shape)} "
                         f"and {tuple(w.shape)}")
    size = None if input_size is None else tuple(int(v) for v in two(tuple(input_size)))
    key = (dy.shape, w.shape, dtype, stride, padding, dilation, groups, size, tuple(sorted(tunables.items())))
    plan = remember(_dx_plans, key, lambda: _dx_plan(dy.shape, w.shape, dtype, stride, padding, dilation, groups,
                                                     size, tunables), (stride, padding, dilation, groups))
    dx = channels_last_out(dx, plan.out_shape, dy, "dx")
    _run(plan, _nhwc(dy), _nhwc(w), dx.permute(0, 2, 3, 1), None)
    return dx


# ---- dW: conv2d_hopper_dw.cu --------------------------------------------------------------------------

class _DwPlan(NamedTuple):
    C8: int | None
    dy_box: tuple
    x_box: tuple
    x_steps: tuple | None
    launch: Launch
    reduce: Launch | None
    ws_shape: tuple


def _dw_plan(x_shape, dy_shape, dtype, K, stride, padding, dilation, groups, tunables) -> _DwPlan:
    B, C, H, W = (int(v) for v in x_shape)
    _, M, Ho, Wo = (int(v) for v in dy_shape)
    (Kh, Kw), (sh, sw), (ph, pw), (dh, dw) = (two(v) for v in (K, stride, padding, dilation))
    s = layer(x_shape, (M, C // max(groups, 1), Kh, Kw), (sh, sw), (ph, pw), (dh, dw), groups)
    if (s.Ho, s.Wo) != (Ho, Wo):
        raise ValueError(f"dy {tuple(dy_shape)}: x {tuple(x_shape)} with a {Kh}x{Kw} mask, stride {stride}, padding "
                         f"{padding}, dilation {dilation} gives {s.Ho}x{s.Wo} outputs")
    why = refuses(s, "dw")
    if why:
        raise ValueError(f"conv2d_hopper_dw: {why}")
    given = _tunables(tunables, DW_TUNABLES, "conv2d_hopper_dw")
    t = {**hopper_dw_config(s), **given}
    if "STAGES" not in given:
        t["STAGES"] = _dw_deepest(t["BN"], t["CONSUMERS"])
    if "SPLIT_K" not in given and given:
        t["SPLIT_K"] = 1
    BN, STAGES, cons, BW, BH, BI, splits = (t[k] for k in DW_TUNABLES)
    if (BN not in (64, 128, 256) or not 2 <= STAGES <= 8 or cons not in (1, 2) or BW * BH * BI != DW_BOX
            or not 1 <= splits <= MAX_DW_SPLIT or BW * sw > 256 or BH * sh > 256):
        raise ValueError(f"conv2d_hopper_dw tunables {t}: BN 64, 128 or 256; STAGES 2..8; CONSUMERS 1 or 2; "
                         f"BW*BH*BI = {DW_BOX} (BW*stride and BH*stride at most 256); SPLIT_K 1..{MAX_DW_SPLIT}")
    smem = dw_shared_bytes(BN, STAGES, cons)
    if smem + 16 * STAGES > SHARED_OPTIN_MAX:
        raise ValueError(f"conv2d_hopper_dw tunables {t}: {smem:,} bytes of shared memory, over {SHARED_OPTIN_MAX:,}")
    C8 = ceil_div(C, 8) * 8
    tiles = ceil_div(M, 64 * cons) * Kh * Kw * ceil_div(C8, BN)
    units = tiles * splits
    n = M * Kh * Kw * C
    if splits * n > INT32_MAX // 2:
        raise ValueError(f"SPLIT_K={splits}: a workspace of {splits * n:,} floats; a smaller SPLIT_K")
    defines = dict(DTYPE=DTYPES[dtype], BN=BN, STAGES=STAGES, CONSUMERS=cons)
    launch = Launch(DW_FILE, "conv2d_hopper_dw", defines,
                    (splits, units, B, C8, C, M, Ho, Wo, Kh, Kw, sh, sw, ph, pw, dh, dw, BW, BH, BI),
                    grid=(min(units, sm_count()),), block=(128 * (1 + cons),), shared=smem, max_shared=SHARED_OPTIN_MAX)
    reduce = None
    if splits > 1:
        reduce = Launch(REDUCE_FILE, "splitk_reduce", dict(DTYPE=DTYPES[dtype]), (0, 0, splits, n, C),
                        grid=(ceil_div(n, 4 * REDUCE_THREADS),), block=(REDUCE_THREADS,))
    steps = (1, sh, sw, 1) if (sh, sw) != (1, 1) else None
    return _DwPlan(C8 if C8 != C else None, (BI, BH, BW, 64), (BI, BH * sh, BW * sw, 64), steps, launch, reduce,
                   (splits, n))


def conv2d_hopper_dw(x, dy, dw=None, *, stride=1, padding=0, kernel_size, dilation=1, groups=1, **tunables):
    """dw = dE/dW of conv2d(x, w, stride, padding, dilation) in fp16 or bf16 on wgmma: per tap a GEMM
    over the output pixels, fp32 sums split over them (SPLIT_K) and added in order, rounded once.
    x (B, C, H, W) and dy (B, M, Ho, Wo), NCHW or channels_last (NCHW ones converted in the call);
    C not a multiple of 8: x padded with zeros (one copy). Returns dw (M, C, Kh, Kw) channels_last."""
    dtype = check_tensors(("fp16", "bf16"), layout=None, x=x, dy=dy)
    if x.dim() != 4 or dy.dim() != 4 or int(dy.shape[0]) != int(x.shape[0]):
        raise ValueError(f"expected x (B, C, H, W) and dy (B, M, Ho, Wo), got {tuple(x.shape)} and {tuple(dy.shape)}")
    K = tuple(int(k) for k in two(kernel_size))
    key = (x.shape, dy.shape, dtype, K, stride, padding, dilation, groups, tuple(sorted(tunables.items())))
    plan = remember(_dw_plans, key, lambda: _dw_plan(x.shape, dy.shape, dtype, K, stride, padding, dilation, groups,
                                                     tunables), (stride, padding, dilation, groups))
    M, C = int(dy.shape[1]), int(x.shape[1])
    dw = channels_last_out(dw, (M, C, *K), x, "dw")
    dwn = dw.permute(0, 2, 3, 1)
    dy_map = runtime.tensor_map(_nhwc(dy), plan.dy_box)
    x_map = runtime.tensor_map(_nhwc(x, plan.C8), plan.x_box, 128, plan.x_steps)
    if plan.reduce is None:
        plan.launch(dwn, _no_workspace(dwn), dy_map, x_map)
        return dw
    ws = new_output(plan.ws_shape, dwn, torch.float32)
    plan.launch(dwn, ws, dy_map, x_map)
    plan.reduce(dwn, ws, dwn)
    return dw


_plans: dict = {}
_dx_plans: dict = {}
_dw_plans: dict = {}


#: any_layer: stride, padding and dilation per axis, non-square masks (groups 1: refuses). What a
#: route reads: x (dy) and w channels_last as they lie (an NCHW one is converted), the result
#: channels_last; the forward's bias and ReLU in its epilogue. The bf16 twins are the same launchers.
_NHWC = dict(any_layer=True, layouts=("channels_last",), out_layout="channels_last")
HOPPER = Impl("wgmma + TMA, any layer (NHWC)", conv2d_hopper, op="conv2d_fp16", applies=_takes("forward"),
              config=hopper_config, key="hopper", dtypes=("fp16",), bias=True, activations=("relu",), **_NHWC)
HOPPER_BF16 = Impl("wgmma + TMA, any layer (NHWC), bf16", conv2d_hopper, op="conv2d_fp16", applies=_takes("forward"),
                   config=hopper_config, key="hopper_bf16", dtypes=("bf16",), bias=True, activations=("relu",),
                   **_NHWC)
HOPPER_DX = Impl("wgmma + TMA dX (NHWC)", conv2d_hopper_dx, op="conv2d_dx_fp16", applies=_takes("dx"),
                 config=hopper_dx_config, key="hopper_dx", dtypes=("fp16",), **_NHWC)
HOPPER_DX_BF16 = Impl("wgmma + TMA dX (NHWC), bf16", conv2d_hopper_dx, op="conv2d_dx_fp16", applies=_takes("dx"),
                      config=hopper_dx_config, key="hopper_dx_bf16", dtypes=("bf16",), **_NHWC)
HOPPER_DW = Impl("wgmma + TMA dW (NHWC)", conv2d_hopper_dw, op="conv2d_dw_fp16", applies=_takes("dw"),
                 config=hopper_dw_config, key="hopper_dw", dtypes=("fp16",), **_NHWC)
HOPPER_DW_BF16 = Impl("wgmma + TMA dW (NHWC), bf16", conv2d_hopper_dw, op="conv2d_dw_fp16", applies=_takes("dw"),
                      config=hopper_dw_config, key="hopper_dw_bf16", dtypes=("bf16",), **_NHWC)
IMPLEMENTATIONS: tuple[Impl, ...] = (HOPPER, HOPPER_BF16, HOPPER_DX, HOPPER_DX_BF16, HOPPER_DW, HOPPER_DW_BF16)
