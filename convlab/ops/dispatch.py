"""The routing layer: which kernel runs a layer, forward, dE/dX and dE/dW, by explicit rules derived
from the chapters' measurements. Below it the launchers (one module per kernel family), above it
the drop-in (dropin.py).

- implementations(dtype): every forward kernel of that dtype ('fp32', 'fp16') the launcher modules
  register (each module's IMPLEMENTATIONS; a new module of convlab/ops joins by having them).
- candidates(shape, dtype): those that take the layer (the chapters' own kernels take only plain
  layers: Impl.takes).
- RULES / dispatch_rule(): the forward rule, an ordered table of conditions -> kernel (by Impl.key):
  the first row whose condition holds and whose kernel takes the layer wins. Printable.
- pick(shape, dtype, layout) -> Impl.
- forward(x, w, y=None, *, stride, padding, dilation, groups, bias): the forward the drop-in runs
  (pick()'s kernel with its tunables, the bias added where the kernel has none). The layout of x
  decides one thing more: a channels_last x of a depthwise layer goes to the NHWC depthwise
  kernel, and the mma.sync kernel reads it without a conversion; the result has x's layout.
- fp32_precision(option=None): the precision switch, 'fp32', 'tf32' or '3xtf32', from torch's
  float32 matmul precision and cuDNN's TF32 flag (or the drop-in's precision= option); where it is
  not 'fp32', a float32 layer that one of TENSOR_CORE_FP32's kernels takes runs on it.
- input_grad(dy, w, dx=None, ...), weight_grad(x, dy, dw=None, ...): the dX and dW the drop-in
  runs (dx_route / dw_route say which kernel, and why); grad_routes(...): both routes of a layer at
  once, which the drop-in keeps beside its forward route.
- Every route is worked out once per call signature (shapes, dtype, layout, the arguments as given)
  and kept: a repeated call is one dictionary lookup, then the kernel's own kept launch.
- evidence(): pick()'s choice beside the fastest kernel measured on each shape of the chapters'
  committed results (book/data/05_fused.csv, 06_fp16.csv, 09_general.csv): the rule holds where
  every choice is the fastest, within the measurement's spread.
"""
from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil
from dataclasses import dataclass
from typing import Callable

import torch

from .. import results, workloads
from ..check import check
from .._limits import INT32_MAX
from ..workloads import Workload
from . import Impl
from .backprop import (DX_GATHER, conv2d_input_grad_best, conv2d_weight_grad_best, pick_input_grad,
                       pick_weight_grad)
from .depthwise import (DEPTHWISE, DEPTHWISE_FP16, conv2d_depthwise, conv2d_depthwise_nhwc, depthwise_applies,
                        depthwise_dx_padding, nhwc_applies)
from .fp16 import U16, accumulation, fp16_tolerance
from .general import GENERAL, GENERAL_DW, GENERAL_DX, GENERAL_FP16, conv2d_general_dw, conv2d_general_dx
from .igemm import IGEMM_F32, IGEMM_F32_DW, IGEMM_F32_DX, conv2d_igemm_f32_dw, conv2d_igemm_f32_dx, dx_workload
from ._kernels import remember
from .shapes import layer, two
from .tensor_core import MMA_DW, MMA_DX, conv2d_mma, conv2d_mma_dw, conv2d_mma_dx
from .tf32 import PRECISIONS

LAYOUTS = ("nchw", "channels_last")                 # x's memory format, as pick() takes it
OPS = {"fp32": "conv2d", "fp16": "conv2d_fp16"}      # the forward op of each dtype's kernels
DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16"}
#: The chapters whose committed results are pick()'s evidence.
EVIDENCE = ("05_fused", "06_fp16", "09_general")
#: The label and key of pick()'s own rows in those results (not a candidate).
BEST = "best: pick()"
BEST_KEY = "pick"
#: convlab.ops modules that are not launchers: the layers above and below them
NOT_LAUNCHERS = {"shapes", "_kernels", "dispatch", "dropin"}


@functools.cache
def registered() -> tuple:
    """Every Impl of every launcher module of convlab.ops, in module order: the records the
    dispatcher, the measuring harness and the docs' kernel tables read."""
    out = []
    package = importlib.import_module(__package__)
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        if info.name not in NOT_LAUNCHERS:
            out += getattr(importlib.import_module(f"{__package__}.{info.name}"), "IMPLEMENTATIONS", ())
    return tuple(out)


def by_key(key: str) -> Impl:
    """The registered Impl of that key."""
    for impl in registered():
        if impl.key == key:
            return impl
    raise KeyError(f"no kernel with key {key!r}; there are: {', '.join(i.key for i in registered())}")


@functools.cache
def implementations(dtype: str) -> tuple:
    """Every registered forward kernel of a dtype ('fp32' or 'fp16') that pick() may choose (its
    record says candidate: not the chapters' teaching steps, not the float32 path in half, not the
    NHWC depthwise kernels, where forward() sends a channels_last depthwise layer itself)."""
    return tuple(i for i in registered() if i.op == OPS[dtype] and i.candidate)


def _fits_int(shape: Workload) -> bool:
    """The chapters' kernels index x and y with int (and keep headroom for a grid stride)."""
    return max(shape.B * shape.C * shape.H * shape.W, shape.B * shape.M * shape.Ho * shape.Wo) <= INT32_MAX // 2


def candidates(shape: Workload, dtype: str = "fp32") -> list:
    """The registered kernels of dtype that take this 2D layer."""
    if shape.dims != 2:
        raise ValueError(f"{shape}: pick() chooses among 2D kernels")
    return [i for i in implementations(dtype) if i.takes(shape) and (i.any_layer or _fits_int(shape))]


# ---- the rule ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Rule:
    condition: str                  # the condition, as the printed table says it
    holds: Callable                 # Workload -> bool
    kernel: str                     # an Impl's key
    why: str                        # the measured reason, and where the data is
    layouts: tuple = LAYOUTS        # the layouts of x the row is for


def _taps(s: Workload) -> int:
    return s.C * s.K * s.Kw


def _pads_cheaply(s: Workload) -> bool:
    """C a multiple of 8, or padding it to one (the mma.sync kernel's 16-byte loads) adds at most a
    quarter: an RGB stem's 3 -> 8 would nearly triple its tensor-core work."""
    return s.C % 8 == 0 or 4 * (-(-s.C // 8) * 8) <= 5 * s.C


RULES = {
    "fp32": [
        Rule("plain, stride 1, C < 8, M ≤ 64", lambda s: s.plain and s.stride == 1 and s.C < 8 and s.M <= 64,
             "direct_regtile",
             "few channels: a GEMM tile would be mostly padding (05_fused: lenet_c1, lenet_c3, fa17)"),
        Rule("plain", lambda s: s.plain, "igemm_f32",
             "long reductions: warp tiles of 8x8 outputs (benchmarks/f32_layers.py: faster than chapter 5's "
             "best on every layer it measured)"),
        Rule("plain", lambda s: s.plain, "igemm_reg",
             "where the warp-tiled kernel does not take the layer (05_fused: days100, resnet)"),
        Rule("grouped, dilated, non-square, strided per axis", lambda s: s.groups != s.C, "igemm_f32",
             "a grouped implicit GEMM with the layer's index arithmetic in its loader (benchmarks/f32_layers.py "
             "--any)"),
        Rule("depthwise (groups = C)", lambda s: s.groups == s.C, "depthwise",
             "memory-bound: each input read once into shared memory (09_general)"),
        Rule("any layer", lambda s: True, "general", "the only kernel that takes every layer"),
    ],
    "fp16": [
        Rule("plain, C = 1, M ≤ 8", lambda s: s.plain and s.C == 1 and s.M <= 8, "half",
             "one channel, few maps: faster than half2 and tensor cores (06_fp16: lenet_c1)"),
        Rule("plain, C = 1, M ≤ 64", lambda s: s.plain and s.C == 1 and s.M <= 64, "half2",
             "one channel: a reduction of K² taps, too short for tensor cores (06_fp16: fa17)"),
        Rule("plain, C ≤ 8, stride 1", lambda s: s.plain and s.C <= 8 and s.stride == 1,
             "wmma_smallc", "fragments read straight from the input tile (06_fp16: lenet_c3)"),
        Rule("x channels_last, stride 1, no dilation or groups, C and M multiples of 8, C·Kh·Kw ≥ 128, "
             "an H100/H200", lambda s: _taps(s) >= 128, "wgmma",
             "Hopper's warpgroup MMA fed by the copy engine: faster than mma.sync on every such layer measured, "
             "0.80-1.01x torch best (benchmarks/hopper_layers.py, H100); a reduction of one 64-channel step "
             "(a 1x1 layer from 64 channels) leaves its pipeline nothing to overlap, and mma.sync was faster",
             layouts=("channels_last",)),
        Rule("x channels_last, groups 1, C·Kh·Kw ≥ 64, C pads to 8 cheaply",
             lambda s: s.groups == 1 and _taps(s) >= 64 and _pads_cheaply(s), "mma",
             "many channels: mma.sync fed by ldmatrix from a cp.async pipeline (benchmarks/tensor_core_layers.py; "
             "needs sm_80); from NCHW, converting x costs more than WMMA loses (09_general)",
             layouts=("channels_last",)),
        Rule("plain", lambda s: s.plain, "wmma",
             "tensor cores through WMMA (06_fp16: days100, resnet); the stem's 3 channels, an older GPU"),
        Rule("groups 1, C·Kh·Kw ≥ 64, C pads to 8 cheaply", lambda s: s.groups == 1 and _taps(s) >= 64 and
             _pads_cheaply(s), "mma",
             "a layer WMMA does not take (dilated, non-square): faster than the general kernel even with x "
             "converted from NCHW (09_general)"),
        Rule("grouped, not depthwise", lambda s: 1 < s.groups < s.C, "mma",
             "a grouped GEMM on tensor cores, a group's channels padded to 8 where they are fewer "
             "(benchmarks/general_layers.py --all)"),
        Rule("depthwise (groups = C)", lambda s: s.groups == s.C,
             "depthwise_fp16",
             "memory-bound: each input read once into shared memory (09_general)"),
        Rule("any layer", lambda s: True, "general_fp16", "the only kernel that takes every layer"),
    ],
}


#: float32 layers where fp32_precision() is 'tf32' or '3xtf32': the first of these kernels that takes
#: the layer runs it (wgmma on an H100/H200, else mma.sync on sm_80 or newer, one group); a layer
#: neither takes keeps the fp32 rule's kernel, at fp32's accuracy (convlab/ops/tf32.py).
TENSOR_CORE_FP32 = {"tf32": ("tf32_wgmma", "tf32_mma"), "3xtf32": ("tf32x3_wgmma", "tf32x3_mma")}


def fp32_precision(option: str | None = None) -> str:
    """How the drop-in computes a float32 convolution: 'fp32' (CUDA cores), 'tf32' or '3xtf32'
    (tensor cores, convlab.ops.tf32). option (the drop-in's precision=) decides when given; else
    torch's switches: torch.set_float32_matmul_precision 'highest' (torch's default) gives 'fp32',
    'high' '3xtf32', 'medium' 'tf32' where cuDNN's TF32 flag (torch.backends.cudnn.allow_tf32, or
    torch.backends.cudnn.conv.fp32_precision) allows it, else '3xtf32'. torch turns that flag on
    by default, so it is read as a permission, never as a request: by default results keep fp32's
    accuracy."""
    if option is not None:
        if option not in PRECISIONS:
            raise ValueError(f"precision={option!r}: one of {', '.join(PRECISIONS)}")
        return option
    wanted = {"highest": "fp32", "high": "3xtf32", "medium": "tf32"}[torch.get_float32_matmul_precision()]
    return "3xtf32" if wanted == "tf32" and not _cudnn_tf32() else wanted


def _cudnn_tf32() -> bool:
    """cuDNN's TF32 flag for convolutions (the new API's conv setting first: reading the legacy flag
    raises where the two APIs were mixed)."""
    setting = getattr(getattr(torch.backends.cudnn, "conv", None), "fp32_precision", "none")
    if setting in ("tf32", "ieee"):
        return setting == "tf32"
    try:
        return bool(torch.backends.cudnn.allow_tf32)
    except RuntimeError:
        return False


def dispatch_rule(dtype: str | None = None) -> str:
    """The rule as a table: for each dtype, the conditions in order, the kernel and why."""
    lines = []
    for dt in ([dtype] if dtype else list(RULES)):
        rules = RULES[dt]
        wc = max(len(r.condition) for r in rules)
        names = [by_key(r.kernel).name for r in rules]
        wk = max(map(len, names))
        lines.append(f"{dt}: the first row whose condition holds and whose kernel takes the layer")
        lines.append(f"  {'condition':<{wc}}  {'kernel':<{wk}}  why")
        lines += [f"  {r.condition:<{wc}}  {n:<{wk}}  {r.why}" for r, n in zip(rules, names)]
    return "\n".join(lines)


@functools.lru_cache(maxsize=4096)
def pick(shape: Workload, dtype: str = "fp32", layout: str = "nchw"):
    """The Impl the rule gives this 2D layer in dtype ('fp32' or 'fp16') with x in layout ('nchw' or
    'channels_last'); best = pick(shape, dtype); best(x, w, **shape.conv_kwargs(), **best.config(shape))
    runs it."""
    if isinstance(shape, str):
        shape = workloads.get(shape)
    if dtype not in RULES:
        raise ValueError(f"dtype {dtype!r}: one of {', '.join(RULES)}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r}: one of {', '.join(LAYOUTS)}")
    takes = {i.key: i for i in candidates(shape, dtype)}
    for rule in RULES[dtype]:
        if layout in rule.layouts and rule.holds(shape) and rule.kernel in takes:
            return takes[rule.kernel]
    raise ValueError(f"no rule of {dtype} gives a kernel that takes {shape}: the last rule should take any layer")


# ---- the forward the drop-in runs --------------------------------------------------------------------

def course_applies(s: Workload, dtype) -> bool:
    """Whether the chapters' own kernels take the layer (chapter 5's pick forward, chapter 8's best
    dX and dW): float32, a plain layer (one group, no dilation, a square mask, one stride and one
    symmetric padding) and tensors their int indices reach (the general kernels index with 64 bits)."""
    return dtype == torch.float32 and s.plain and _fits_int(s)


@functools.lru_cache(maxsize=4096)
def _forward_route(s: Workload, dtype: str, nhwc: bool, precision: str = "fp32"):
    """(Impl, keyword arguments or None for the arguments as given) for a layer and x's layout
    (nhwc: channels_last). Only chapter 9's kernels take torch's 'same' with an even mask (which
    pads one more at the end): they pick among themselves."""
    if dtype == "fp32" and precision != "fp32":
        for key in TENSOR_CORE_FP32[precision]:
            impl = by_key(key)
            if impl.takes(s):
                return impl, {**s.conv_kwargs(), **impl.config(s)}
    if nhwc and nhwc_applies(s):
        return by_key("depthwise_nhwc_fp16" if dtype == "fp16" else "depthwise_nhwc"), None
    if not s.symmetric:
        fp16 = dtype == "fp16"
        impl = (DEPTHWISE_FP16 if fp16 else DEPTHWISE) if depthwise_applies(s) else (GENERAL_FP16 if fp16 else GENERAL)
        return impl, None
    impl = pick(s, dtype, "channels_last" if nhwc else "nchw")
    return impl, {**s.conv_kwargs(), **impl.config(s)}


def _channels_last(x) -> bool:
    """x is in channels_last memory (and not also plain NCHW, as a 1x1 plane or one channel is)."""
    return x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last)


_routes: dict = {}      # call signature -> the route: a repeated call's one lookup


def forward(x, w, y=None, *, stride=1, padding=0, dilation=1, groups: int = 1, bias=None, precision=None):
    """y = conv2d(x, w, bias) by pick()'s kernel for the layer (x 4-D, float32 or float16, NCHW or
    channels_last); stride, padding and dilation in any form torch takes; precision as
    fp32_precision takes it. y comes back in x's layout, as torch's does (a given y: NCHW
    contiguous)."""
    nhwc = _channels_last(x)
    p = fp32_precision(precision) if x.dtype == torch.float32 else "fp32"
    key = (x.shape, w.shape, None if bias is None else bias.shape, x.dtype, nhwc, p, stride, padding, dilation, groups)
    run = remember(_routes, key, lambda: _forward_runner(x, w, bias, nhwc, stride, padding, dilation, groups, p),
                   key[6:])
    return run(x, w, y, bias)


def forward_route(x, w, bias=None, *, stride=1, padding=0, dilation=1, groups: int = 1, precision="fp32"):
    """run(x, w, y, bias): forward()'s route for this call signature and fp32_precision's answer,
    every choice made, for a caller that keeps it (the drop-in); run.impl the kernel it runs."""
    return _forward_runner(x, w, bias, _channels_last(x), stride, padding, dilation, groups, precision)


def forward_impl(x, w, bias=None, *, stride=1, padding=0, dilation=1, groups: int = 1, precision=None) -> Impl:
    """The Impl forward() runs for these arguments (its kept route's kernel)."""
    p = fp32_precision(precision) if x.dtype == torch.float32 else "fp32"
    return _forward_runner(x, w, bias, _channels_last(x), stride, padding, dilation, groups, p).impl


def _tagged(run, impl: Impl):
    run.impl = impl          # what the route runs: forward_impl, dx_impl and dw_impl read it
    return run


def _forward_runner(x, w, bias, nhwc, stride, padding, dilation, groups, precision="fp32"):
    """f(x, w, y, bias): the route of forward() for one call signature, every choice made; f.impl
    the kernel it runs."""
    dtype = DTYPE_NAMES.get(x.dtype)
    if dtype is None:
        raise TypeError(f"x is {x.dtype}: pick() has float32 and float16 kernels")
    s = layer(x.shape, w.shape, stride, padding, dilation, groups, None if bias is None else bias.shape)
    impl, kw = _forward_route(s, dtype, nhwc, precision)
    if kw is None:
        kw = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    f = impl.launcher
    layout = torch.channels_last if nhwc else torch.contiguous_format
    if f in (conv2d_mma, conv2d_depthwise_nhwc):            # NHWC kernels: channels_last out

        def run(x, w, y, bias):
            out = f(x, w.contiguous(), bias=bias, **kw)
            return y.copy_(out) if y is not None else out.contiguous(memory_format=layout)
        return _tagged(run, impl)
    if "bias" in inspect.signature(f).parameters:

        def run(x, w, y, bias):
            out = f(x.contiguous(), w.contiguous(), None if nhwc else y, bias=bias, **kw)
            if y is not None:
                return y if out is y else y.copy_(out)
            return out.contiguous(memory_format=layout) if nhwc else out
        return _tagged(run, impl)

    def run(x, w, y, bias):
        out = f(x.contiguous(), w.contiguous(), None if nhwc else y, **kw)
        if bias is not None:
            out.add_(bias.view(1, -1, 1, 1))
        if y is not None:
            return y if out is y else y.copy_(out)
        return out.contiguous(memory_format=layout) if nhwc else out
    return _tagged(run, impl)


# ---- dE/dX and dE/dW ---------------------------------------------------------------------------------

#: The largest layer benchmarks/backward_launches.py measured (B=256, 16 -> 32 maps, 20x20, 3x3):
#: on every layer up to it whose dX chapter 8 gives to the gather kernel (C < 32), the gather was
#: faster than the implicit GEMM's dX in GPU time and in the time a caller waits (H100).
GATHER_DX_MACS = 256 * 32 * 20 * 20 * 16 * 3 * 3


def igemm_dx_applies(s: Workload) -> bool:
    """A stride-1 plain layer (padding at most K-1) whose dX, itself a convolution of dy by the
    flipped mask (M channels to C maps), goes to the fp32 implicit GEMM: where pick() gives that
    convolution the implicit GEMM, except a small layer with chapter 8's gather dX (C < 32, at most
    GATHER_DX_MACS multiply-adds), whose one launch beat the GEMM's three (the mask transposed,
    the GEMM, the split-K sum). Its dW stays on weight_grad's kernels."""
    if not (s.plain and s.stride == 1 and IGEMM_F32_DX.applies(s)):
        return False
    if pick_input_grad(s) is DX_GATHER and s.macs <= GATHER_DX_MACS:
        return False
    return pick(dx_workload(s), "fp32") is IGEMM_F32


def _into(out, result):
    """result in out's memory (the mma.sync kernels return channels_last), or result itself."""
    return result if out is None else out.copy_(result)


def _resolved(s: Workload) -> dict:
    """The layer's stride, padding, dilation and groups as pairs and ints (torch's 'same' and
    'valid' resolved): what the implicit GEMM's launchers take."""
    return dict(stride=(s.stride, s.stride_w), padding=(s.padding, s.padding_w),
                dilation=(s.dilation, s.dilation_w), groups=s.groups)


def dx_route(dy_shape, w_shape, dtype, stride, padding, input_size, dilation, groups):
    """f(dy, w, dx): the dX kernel for a layer with dy of dy_shape, a mask of w_shape and dtype, with
    its arguments resolved (f.impl: which): the fp32 implicit GEMM's dX where igemm_dx_applies
    (plain layers where pick() gives it the dX convolution, but for small ones of chapter 8's
    gather), chapter 8's best dX on the other plain fp32 layers, the implicit GEMM's dX (stride
    phases) on every other fp32 layer it takes, the mma.sync kernel's dX on the fp16 layers it takes
    (not depthwise; sm_80 or newer), the depthwise forward on dy with the flipped mask
    where depthwise_dx_padding allows (MobileNet and ConvNeXt layers), else the general dX kernel."""
    H, W = (int(v) for v in two(input_size))
    s = layer((dy_shape[0], w_shape[1] * groups, H, W), w_shape, stride, padding, dilation, groups)
    if dtype == torch.float32 and igemm_dx_applies(s):
        return _tagged(lambda dy, w, dx: conv2d_igemm_f32_dx(dy, w, dx, input_size=(H, W), **_resolved(s)),
                       IGEMM_F32_DX)
    if course_applies(s, dtype):
        return _tagged(lambda dy, w, dx: conv2d_input_grad_best(dy, w, dx, stride=s.stride, padding=s.padding,
                                                                input_size=(H, W)), pick_input_grad(s))
    if dtype == torch.float32 and s.symmetric and IGEMM_F32_DX.applies(s):
        kw = _resolved(s)
        return _tagged(lambda dy, w, dx: conv2d_igemm_f32_dx(dy, w, dx, input_size=(H, W), **kw), IGEMM_F32_DX)
    if dtype == torch.float16 and s.symmetric and MMA_DX.applies(s):
        kw = _resolved(s)
        return _tagged(lambda dy, w, dx: _into(dx, conv2d_mma_dx(dy, w, input_size=(H, W), **kw)), MMA_DX)
    pad = depthwise_dx_padding(s)
    if pad is not None and depthwise_applies(s):
        return _tagged(lambda dy, w, dx: conv2d_depthwise(dy, torch.flip(w, (2, 3)), dx, padding=pad,
                                                          dilation=(s.dilation, s.dilation_w), groups=s.C),
                       DEPTHWISE)
    return _tagged(lambda dy, w, dx: conv2d_general_dx(dy, w, dx, stride=stride, padding=padding, input_size=(H, W),
                                                       dilation=dilation, groups=groups), GENERAL_DX)


def dw_route(x_shape, dy_shape, dtype, stride, padding, kernel_size, dilation, groups):
    """f(x, dy, dw): the dW kernel for a layer with x of x_shape, dy of dy_shape and dtype (f.impl:
    which): chapter 8's best dW where course_applies, the implicit GEMM's dW (per group, over the
    batch) on every other fp32 layer it takes, the mma.sync kernel's dW on the fp16 layers it takes,
    else the general dW kernel."""
    Kh, Kw = (int(k) for k in two(kernel_size))
    s = layer(x_shape, (dy_shape[1], x_shape[1] // groups, Kh, Kw), stride, padding, dilation, groups)
    if course_applies(s, dtype):
        return _tagged(lambda x, dy, dw: conv2d_weight_grad_best(x, dy, dw, stride=s.stride, padding=s.padding,
                                                                 kernel_size=Kh), pick_weight_grad(s))
    if dtype == torch.float16 and s.symmetric and MMA_DW.applies(s):
        kw = _resolved(s)
        return _tagged(lambda x, dy, dw: _into(dw, conv2d_mma_dw(x, dy, kernel_size=(Kh, Kw), **kw)), MMA_DW)
    if dtype == torch.float32 and s.symmetric and IGEMM_F32_DW.applies(s):
        kw = _resolved(s)
        return _tagged(lambda x, dy, dw: conv2d_igemm_f32_dw(x, dy, dw, kernel_size=(Kh, Kw), **kw), IGEMM_F32_DW)
    return _tagged(lambda x, dy, dw: conv2d_general_dw(x, dy, dw, stride=stride, padding=padding,
                                                       kernel_size=(Kh, Kw), dilation=dilation, groups=groups),
                   GENERAL_DW)


_grad_routes: dict = {}     # ("dx" | "dw", shapes, dtype, arguments as given) -> the route


def _dx_kept(dy_shape, w_shape, dtype, input_size, stride, padding, dilation, groups):
    key = ("dx", dy_shape, w_shape, dtype, input_size, stride, padding, dilation, groups)
    return remember(_grad_routes, key, lambda: dx_route(dy_shape, w_shape, dtype, stride, padding, input_size,
                                                        dilation, groups), key[4:])


def _dw_kept(x_shape, dy_shape, dtype, kernel_size, stride, padding, dilation, groups):
    key = ("dw", x_shape, dy_shape, dtype, kernel_size, stride, padding, dilation, groups)
    return remember(_grad_routes, key, lambda: dw_route(x_shape, dy_shape, dtype, stride, padding, kernel_size,
                                                        dilation, groups), key[4:])


def grad_routes(x_shape, w_shape, y_shape, dtype, *, stride=1, padding=0, dilation=1, groups: int = 1) -> tuple:
    """(dx_route's f(dy, w, dx), dw_route's f(x, dy, dw)) of the layer conv2d(x, w) that gave y: both
    gradients' routes at once, for a caller that keeps them with its forward route (the drop-in's
    backward then runs them straight away)."""
    return (_dx_kept(y_shape, w_shape, dtype, tuple(x_shape[-2:]), stride, padding, dilation, groups),
            _dw_kept(x_shape, y_shape, dtype, tuple(w_shape[-2:]), stride, padding, dilation, groups))


def dx_impl(dy, w, *, stride=1, padding=0, input_size, dilation=1, groups: int = 1) -> Impl:
    """The Impl input_grad() runs for these arguments."""
    return _dx_kept(dy.shape, w.shape, dy.dtype, input_size, stride, padding, dilation, groups).impl


def dw_impl(x, dy, *, stride=1, padding=0, kernel_size, dilation=1, groups: int = 1) -> Impl:
    """The Impl weight_grad() runs for these arguments."""
    return _dw_kept(x.shape, dy.shape, x.dtype, kernel_size, stride, padding, dilation, groups).impl


def input_grad(dy, w, dx=None, *, stride=1, padding=0, input_size, dilation=1, groups: int = 1):
    """dx of conv2d by dx_route's kernel (the choice kept per call signature)."""
    return _dx_kept(dy.shape, w.shape, dy.dtype, input_size, stride, padding, dilation, groups)(dy, w, dx)


def weight_grad(x, dy, dw=None, *, stride=1, padding=0, kernel_size, dilation=1, groups: int = 1):
    """dw of conv2d by dw_route's kernel (the choice kept per call signature)."""
    return _dw_kept(x.shape, dy.shape, x.dtype, kernel_size, stride, padding, dilation, groups)(x, dy, dw)


# ---- fp16: how the routed forward adds ---------------------------------------------------------------

def _accumulation(shape: Workload) -> str:
    return accumulation(pick(shape, "fp16"))


forward.accumulation = _accumulation      # fp16.accumulation: how the kernel pick() runs adds (fp16)


def _fp16_route(x_shape, w_shape, stride, padding, dilation, groups):
    """(launcher, whether it adds the bias) of forward() in float16 for NCHW x."""
    x_shape = tuple(x_shape) if len(x_shape) == 4 else (1, *x_shape)
    impl, _ = _forward_route(layer(x_shape, w_shape, stride, padding, dilation, groups), "fp16", False)
    return impl.launcher, "bias" in inspect.signature(impl.launcher).parameters


def forward_accumulation(x_shape, w_shape, stride=1, padding=0, dilation=1, groups: int = 1) -> str:
    """'half' or 'float': how the kernel conv2d runs in float16 on this layer keeps its sums (chapter
    6's direct kernels add in half where pick() chooses them): what fp16.fp16_tolerance needs."""
    return accumulation(_fp16_route(x_shape, w_shape, stride, padding, dilation, groups)[0])


def check_fp16_forward(y, ref, x_shape, w_shape, bias=None, stride=1, padding=0, dilation=1, groups: int = 1,
                       name: str = "y"):
    """cl.check of conv2d's float16 output y against ref (fp64 of the half inputs, bias included)
    with the bound derived for the kernel conv2d runs (fp16.fp16_tolerance: its sums, in half or
    float, of C/groups·Kh·Kw terms and the bias). Where that kernel adds no bias, conv2d adds it to
    the kernel's half output, which is rounded once more: u·|y - bias| <= u·|ref| + u·|bias| more."""
    launcher, takes_bias = _fp16_route(x_shape, w_shape, stride, padding, dilation, groups)
    n = w_shape[1] * w_shape[2] * w_shape[3] + (bias is not None)
    rtol, atol_rms = fp16_tolerance(n, 1, accumulation(launcher), rounded_inputs=True)
    r = ref.detach().double().cpu()
    atol = atol_rms * max(float(r.pow(2).mean().sqrt()) if r.numel() else 1.0, 1e-30)
    if bias is not None and not takes_bias:
        rtol, atol = 2 * rtol, atol + U16 * float(bias.detach().double().abs().max())
    return check(y, r, rtol=rtol, atol=atol, name=name)


def picked(dtype: str = "fp32"):
    """An Impl labelled BEST that runs pick()'s kernel on any layer, for measure.run."""
    return Impl(BEST, forward, OPS[dtype], any_layer=True, key=BEST_KEY)


# ---- the evidence ------------------------------------------------------------------------------------

def measured(chapters=EVIDENCE):
    """The committed forward rows of our kernels in the chapters' results, one per (chapter,
    workload, dtype, impl), for the kernels pick() chooses among; None when there are none."""
    import pandas as pd                    # optional heavy dependency: only the evidence needs it

    frames = []
    for ch in chapters:
        df = results.load(ch, quiet=True)
        if df is None:
            continue
        df = df[(df["kind"] == "ours") & (df["pass"] == "forward") & df["dtype"].isin(list(RULES))]
        keys = {d: {i.key for i in implementations(d)} for d in RULES}
        df = df[[k in keys[d] for k, d in zip(df["key"], df["dtype"])]]
        frames.append(df.assign(chapter=ch))
    return pd.concat(frames, ignore_index=True) if frames else None


def evidence(chapters=EVIDENCE):
    """Per measured (chapter, workload, dtype): pick()'s kernel, the fastest measured kernel, their
    GPU times and whether pick() agrees (its median within the fastest's p75: as fast, within the
    measurement's spread). A (chapter, workload, dtype) whose results lack pick()'s kernel (chapters
    5 and 6 measure their own kernels; chapter 9's run measures every registered one on the course's
    layers too) is left out. None when no results are committed."""
    import pandas as pd                    # optional heavy dependency: only the evidence needs it

    df = measured(chapters)
    if df is None:
        return None
    rows = []
    for (ch, name, dtype), sub in df.groupby(["chapter", "workload", "dtype"], sort=False):
        shape = workloads.get(name)
        if sub["shape"].iloc[0] != shape.shape_text:
            raise ValueError(f"book/data/{ch}.csv measured {name} as {sub['shape'].iloc[0]!r}, but the workload "
                             f"is now {shape.shape_text!r}: re-run the chapter on a GPU")
        fastest = sub.loc[sub["ms"].idxmin()]
        layout = str(sub["layout"].iloc[0]) if "layout" in sub and sub["layout"].iloc[0] in LAYOUTS else "nchw"
        chosen = pick(shape, dtype, layout)
        mine = sub[sub["key"] == chosen.key]
        if not len(mine):                # a kernel newer than the chapter's run: chapter 9's run measures it
            continue
        ms = float(mine["ms"].iloc[0])
        rows.append({"chapter": ch, "workload": name, "family": shape.family, "dtype": dtype,
                     "pick()": chosen.name, "pick() ms": ms, "fastest": by_key(fastest["key"]).name, "fastest ms": fastest["ms"],
                     "pick() / fastest": ms / fastest["ms"], "agrees": bool(ms <= fastest["p75"]),
                     "kernels measured": len(sub)})
    return pd.DataFrame(rows) if rows else None
