"""The routing layer: which kernel runs a layer, forward, dE/dX and dE/dW, by explicit rules derived
from the chapters' measurements, and the route that runs it. Below it the launchers (one module per
kernel family), above it the drop-in (dropin.py).

- registered() / by_key(key): every Impl record of the launcher modules (each module's
  IMPLEMENTATIONS; a new module of convlab/ops joins by having them), and one by its key.
- implementations(dtype, direction, precision=None): the records of a pass ("forward", "dX", "dW")
  that take dtype (by its name: "fp32", "fp16", "bf16", shapes.DTYPE) and that the dispatcher may
  choose; with a precision ("tf32", "3xtf32"), the float32 kernels that compute in it (Impl.precision).
- candidates(shape, dtype, direction, precision=None): those that take the layer (the chapters' own
  kernels take only plain layers: Impl.takes).
- RULES, DX_RULES, DW_RULES / dispatch_rule(): per dtype table ("fp32"; "fp16", which bf16 reads
  too: TABLE_OF), an ordered list of conditions -> kernel (by Impl.key) with the measured reason:
  the first row whose condition holds, that is for x's layout and whose kernel takes the layer and
  the dtype wins. Printable.
- fp32_precision(option=None): the precision switch, 'fp32', 'tf32' or '3xtf32', from torch's
  float32 matmul precision and cuDNN's TF32 flag (or the drop-in's precision= option);
  PRECISION_RULES[precision]: the rows a float32 forward reads first where it is not 'fp32' (the
  TF32 or 3xTF32 tensor-core kernels, convlab.ops.tf32), then the fp32 table; TENSOR_CORE_FP32: their
  kernels' keys, in order.
- pick(shape, dtype, layout, direction, precision="fp32") -> Impl (NoKernel where no row gives one:
  a bf16 layer no bf16 kernel takes; the drop-in then hands the call to torch).
- The route: a function for one call signature, every choice made, that runs the picked kernel as
  its record says (Impl.layouts, out_layout, bias): x (dy) converted only where the kernel does not
  read its layout (once, inside the call), the bias added by torch only where the kernel has none,
  the result in x's layout (forward) or as the kernel returns it (dX, dW). route.impl is the kernel,
  route.adds what the route does beside it ("x", "y": converted; "bias": added by torch).
- forward(x, w, y=None, *, stride, padding, dilation, groups, bias, precision=None: as
  fp32_precision takes it; part of the kept route's key); input_grad(dy, w, dx=None, ...),
  weight_grad(x, dy, dw=None, ...): the passes the drop-in runs, their routes kept per call
  signature (a repeated call is one dictionary lookup, then the kernel's own kept launch);
  forward_route(...) and grad_routes(...): the routes themselves, for a caller that keeps them.
- evidence(): pick()'s choice beside the fastest kernel measured on each shape of the chapters'
  committed results (book/data/05_fused.csv, 06_fp16.csv, 09_general.csv): the rule holds where
  every choice is the fastest, within the measurement's spread.
"""
from __future__ import annotations

import functools
import importlib
import pkgutil
from dataclasses import dataclass
from typing import Callable

import torch

from ..gpu.check import check
from ..gpu._limits import INT32_MAX
from ..measuring import results, workloads
from ..measuring.workloads import Workload
from . import DW_OPS, DX_OPS, FORMATS, FORWARD_OPS, Impl
from .backprop import pick_input_grad, pick_weight_grad
from .fp16 import U16, fp16_tolerance
from .igemm import dx_workload
from ._kernels import remember
from .shapes import DTYPE, DTYPE_NAME, layer, two
from .tf32 import PRECISIONS

LAYOUTS = tuple(FORMATS)                            # x's memory format, as pick() takes it
#: The rule table each dtype reads: bf16 the 16-bit one, among the kernels whose record takes bf16
TABLE_OF = {"fp32": "fp32", "fp16": "fp16", "bf16": "fp16"}
DIRECTIONS = {"forward": FORWARD_OPS, "dX": DX_OPS, "dW": DW_OPS}
#: The chapters whose committed results are pick()'s evidence.
EVIDENCE = ("05_fused", "06_fp16", "09_general")
#: The label and key of pick()'s own rows in those results (not a candidate).
BEST = "best: pick()"
BEST_KEY = "pick"
#: convlab.ops modules that are not launchers: the layers above and below them
NOT_LAUNCHERS = {"shapes", "_kernels", "dispatch", "dropin"}
#: bf16's unit roundoff (8 significant bits): its output's rounding, as fp16.U16 is fp16's
U_BF16 = 2.0 ** -8


class NoKernel(LookupError):
    """No rule gives a kernel that takes the layer in that dtype (a bf16 layer no bf16 kernel takes)."""


@functools.cache
def _launcher_modules() -> tuple:
    """(module name, its IMPLEMENTATIONS) for each launcher module of convlab.ops, by name."""
    package = importlib.import_module(__package__)
    names = sorted(m.name for m in pkgutil.iter_modules(package.__path__) if m.name not in NOT_LAUNCHERS)
    return tuple((name, tuple(getattr(importlib.import_module(f"{__package__}.{name}"), "IMPLEMENTATIONS", ())))
                 for name in names)


@functools.cache
def registered() -> tuple:
    """Every Impl of every launcher module of convlab.ops, in module order: the records the
    dispatcher, the measuring harness and the docs' kernel tables read."""
    return tuple(i for _, impls in _launcher_modules() for i in impls)


def module_of(impl: Impl) -> str:
    """The launcher module (convlab.ops.<name>) whose IMPLEMENTATIONS has impl."""
    return next(name for name, impls in _launcher_modules() if impl in impls)


def by_key(key: str) -> Impl:
    """The registered Impl of that key."""
    for impl in registered():
        if impl.key == key:
            return impl
    raise KeyError(f"no kernel with key {key!r}; there are: {', '.join(i.key for i in registered())}")


def _dtype_name(dtype: str) -> str:
    if dtype not in TABLE_OF:
        raise ValueError(f"dtype {dtype!r}: one of {', '.join(TABLE_OF)}")
    return dtype


@functools.cache
def implementations(dtype: str, direction: str = "forward", precision: str | None = None) -> tuple:
    """Every registered kernel of a pass ("forward", "dX", "dW") that takes dtype ("fp32", "fp16",
    "bf16") and that pick() may choose (its record says candidate: not the chapters' teaching steps,
    not the float32 path in half) in its dtype's own precision, or (precision "tf32", "3xtf32") the
    float32 kernels whose record says they compute in that one (Impl.precision)."""
    ops = DIRECTIONS[direction]
    return tuple(i for i in registered() if i.op in ops and _dtype_name(dtype) in i.dtypes and i.candidate
                 and i.precision == precision)


def _fits_int(shape: Workload) -> bool:
    """The chapters' kernels index x and y with int (and keep headroom for a grid stride)."""
    return max(shape.B * shape.C * shape.H * shape.W, shape.B * shape.M * shape.Ho * shape.Wo) <= INT32_MAX // 2


def candidates(shape: Workload, dtype: str = "fp32", direction: str = "forward", precision: str | None = None) -> list:
    """The registered kernels of a pass and dtype (and precision: implementations) that take this 2D layer."""
    if shape.dims != 2:
        raise ValueError(f"{shape}: pick() chooses among 2D kernels")
    return [i for i in implementations(dtype, direction, precision)
            if i.takes(shape) and (i.any_layer or _fits_int(shape))]


# ---- the rules ---------------------------------------------------------------------------------------

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


def _uneven(s: Workload) -> bool:
    """torch's 'same' with an even mask: one more row and column of padding at the end."""
    return not s.symmetric


def _hopper_class(s: Workload, reduction: int) -> bool:
    """The layers the Hopper rows send fp16 to: one group, C and M multiples of 8 (read as they lie,
    no padding copy) and a reduction of two 64-channel stages or more (reduction: the pass's, C·Kh·Kw
    forward and dW, M·Kh·Kw dX): the class where chapter 11's wgmma beat mma.sync."""
    return s.groups == 1 and s.C % 8 == 0 and s.M % 8 == 0 and reduction >= 128


#: Why the Hopper layers' kernels (convlab.ops.hopper) are where they are: by design, not measured
_HOPPER_BY_DESIGN = ("by design until a GPU run of benchmarks/hopper_layers.py and benchmarks/dropin_networks.py "
                     "(H100/H200) measures it")
_HOPPER_CLASS = ("on the class of layers where chapter 11's wgmma beat mma.sync (C and M multiples of 8, a reduction "
                 "of two 64-channel stages or more): " + _HOPPER_BY_DESIGN)
_HOPPER_FP16 = "wgmma fed by the copy engine (its element strides step over a strided layer's input), " + _HOPPER_CLASS
_HOPPER_BF16 = ("the only kernel whose record takes bf16 for this pass (a layer it does not take goes to torch): "
                + _HOPPER_BY_DESIGN)
#: The Hopper kernels' conditions as the table prints them (their records' applies say the rest)
_ON_HOPPER = "stride ≤ 8, even padding, an H100/H200"

_NHWC_DEPTHWISE = ("x channels_last, depthwise (one map per channel)",
                   "reads x and writes y channels_last, vec channels a thread: no conversion of x "
                   "(benchmarks/depthwise_layers.py)")
_UNEVEN = ("'same' with an even mask (more padding at the end)",
           "only chapter 9's direct kernels take uneven padding")

RULES = {
    "fp32": [
        Rule(_NHWC_DEPTHWISE[0], lambda s: True, "depthwise_nhwc", _NHWC_DEPTHWISE[1], layouts=("channels_last",)),
        Rule(_UNEVEN[0] + ", depthwise", _uneven, "depthwise", _UNEVEN[1]),
        Rule(_UNEVEN[0], _uneven, "general", _UNEVEN[1]),
        Rule("plain, stride 1, C < 8, M ≤ 64", lambda s: s.plain and s.stride == 1 and s.C < 8 and s.M <= 64,
             "direct_regtile",
             "few channels: a GEMM tile would be mostly padding (05_fused: lenet_c1, lenet_c3, fa17)"),
        Rule("plain", lambda s: s.plain, "igemm_f32",
             "long reductions: warp tiles of 8x8 outputs (benchmarks/f32_layers.py: faster than chapter 5's "
             "best on every layer it measured)"),
        Rule("grouped, dilated, non-square, strided per axis", lambda s: s.groups != s.C, "igemm_f32",
             "a grouped implicit GEMM with the layer's index arithmetic in its loader (benchmarks/f32_layers.py "
             "--any)"),
        Rule("depthwise (groups = C)", lambda s: s.groups == s.C, "depthwise",
             "memory-bound: each input read once into shared memory (09_general)"),
        Rule("any layer", lambda s: True, "general", "the only kernel that takes every layer"),
    ],
    "fp16": [
        Rule(_NHWC_DEPTHWISE[0], lambda s: True, "depthwise_nhwc_fp16", _NHWC_DEPTHWISE[1],
             layouts=("channels_last",)),
        Rule(_UNEVEN[0] + ", depthwise", _uneven, "depthwise_fp16", _UNEVEN[1]),
        Rule(_UNEVEN[0], _uneven, "general_fp16", _UNEVEN[1]),
        Rule("plain, C = 1, M ≤ 8", lambda s: s.plain and s.C == 1 and s.M <= 8, "half",
             "one channel, few maps: faster than half2 and tensor cores (06_fp16: lenet_c1)"),
        Rule("plain, C = 1, M ≤ 64", lambda s: s.plain and s.C == 1 and s.M <= 64, "half2",
             "one channel: a reduction of K² taps, too short for tensor cores (06_fp16: fa17)"),
        Rule("plain, C ≤ 8, stride 1", lambda s: s.plain and s.C <= 8 and s.stride == 1,
             "wmma_smallc", "fragments read straight from the input tile (06_fp16: lenet_c3)"),
        Rule("x channels_last, stride 1, no dilation or groups, C and M multiples of 8, C·Kh·Kw ≥ 128, "
             "an H100/H200", lambda s: _taps(s) >= 128, "wgmma",
             "Hopper's warpgroup MMA fed by the copy engine: faster than mma.sync on every such layer measured "
             "(benchmarks/results/hopper_layers_NVIDIA_H100_80GB_HBM3.csv); a reduction of one 64-channel step "
             "(a 1x1 layer from 64 channels) leaves its pipeline nothing to overlap, and mma.sync was faster",
             layouts=("channels_last",)),
        Rule(f"x channels_last, groups 1, C and M multiples of 8, C·Kh·Kw ≥ 128, {_ON_HOPPER}",
             lambda s: _hopper_class(s, _taps(s)), "hopper",
             "the layers of that class chapter 11's wgmma does not take (strided, dilated, non-square; a layer "
             "both take stays on the row above, measured, until a GPU run times both): " + _HOPPER_FP16,
             layouts=("channels_last",)),
        Rule(f"bf16, x channels_last, groups 1, {_ON_HOPPER}", lambda s: True, "hopper_bf16", _HOPPER_BF16,
             layouts=("channels_last",)),
        Rule("x channels_last, groups 1, C pads to 8 cheaply",
             lambda s: s.groups == 1 and _pads_cheaply(s), "mma",
             "mma.sync fed by ldmatrix from a cp.async pipeline reads x channels_last as it lies (needs sm_80); "
             "WMMA would convert x and y and add the bias in a pass of its own: on an H200, of the channels_last "
             "fp16 layers of today's networks, those WMMA took ran slower than torch best, those mma.sync took "
             "faster (geometric means of the caller's time, forward, batch 32: "
             "benchmarks/results/dropin_networks_NVIDIA_H200.csv), few channels (1x1 layers from 16 to 40) "
             "among the first",
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

#: The largest layer benchmarks/backward_launches.py measured (B=256, 16 -> 32 maps, 20x20, 3x3):
#: on every layer up to it whose dX chapter 8 gives to the gather kernel (C < 32), the gather was
#: faster than the implicit GEMM's dX in GPU time and in the time a caller waits (H100).
GATHER_DX_MACS = 256 * 32 * 20 * 20 * 16 * 3 * 3


def igemm_dx_applies(s: Workload) -> bool:
    """A stride-1 plain layer (padding at most K-1) whose dX, itself a convolution of dy by the
    flipped mask (M channels to C maps), goes to the fp32 implicit GEMM: where pick() gives that
    convolution the implicit GEMM, except a small layer with chapter 8's gather dX (C < 32, at most
    GATHER_DX_MACS multiply-adds), whose one launch beat the GEMM's three (the mask transposed,
    the GEMM, the split-K sum)."""
    if not (s.plain and s.stride == 1):
        return False
    if pick_input_grad(s).key == "dx_gather" and s.macs <= GATHER_DX_MACS:
        return False
    return pick(dx_workload(s), "fp32").key == "igemm_f32"


_GENERAL_DX = ("any layer", "the only kernel that takes every layer")

DX_RULES = {
    "fp32": [
        Rule("plain, stride 1, where pick() gives the dX convolution the implicit GEMM, but a small layer with "
             "chapter 8's gather", igemm_dx_applies, "igemm_f32_dx",
             "the flipped mask's convolution by the fp32 implicit GEMM; under GATHER_DX_MACS the gather's one "
             "launch beat the GEMM's three (benchmarks/backward_launches.py, H100)"),
        Rule("plain, chapter 8's pick_input_grad: C ≥ 32, stride 1, padding ≤ K-1",
             lambda s: s.plain and pick_input_grad(s).key == "dx_forward", "dx_forward",
             "many channels: the transposed layer through chapter 5's GEMM (08_backprop)"),
        Rule("plain", lambda s: s.plain, "dx_gather",
             "few channels, any stride: the gather, no atomics (08_backprop: lenet_c1, lenet_c3, fa17)"),
        Rule("even padding", lambda s: s.symmetric, "igemm_f32_dx",
             "one stride-1 implicit GEMM per stride phase (benchmarks/f32_layers.py, its dX rows)"),
        Rule("depthwise, stride 1, one map per channel", lambda s: True, "depthwise_dx",
             "dX of such a layer is the depthwise forward of dy by the flipped mask: the memory-bound "
             "kernel instead of the general gather (MobileNet's and ConvNeXt's layers)"),
        Rule(*_GENERAL_DX[:1], lambda s: True, "general_dx", _GENERAL_DX[1]),
    ],
    "fp16": [
        Rule(f"groups 1, C and M multiples of 8, M·Kh·Kw ≥ 128, {_ON_HOPPER}",
             lambda s: _hopper_class(s, s.M * s.K * s.Kw), "hopper_dx",
             "the forward's Hopper kernel on dy with the mask read as it lies, every stride phase in one launch, "
             + _HOPPER_CLASS),
        Rule(f"bf16, groups 1, C and M multiples of 8, {_ON_HOPPER}", lambda s: True, "hopper_dx_bf16", _HOPPER_BF16),
        Rule("even padding", lambda s: s.symmetric, "mma_dx",
             "the forward's mma.sync kernel on dy with the flipped mask, one launch per stride phase "
             "(benchmarks/tensor_core_layers.py --backward)"),
        Rule("depthwise, stride 1, one map per channel", lambda s: True, "depthwise_dx",
             "dX of such a layer is the depthwise forward of dy by the flipped mask: the memory-bound "
             "kernel instead of the general gather (MobileNet's and ConvNeXt's layers)"),
        Rule(*_GENERAL_DX[:1], lambda s: True, "general_dx", _GENERAL_DX[1]),
    ],
}

DW_RULES = {
    "fp32": [
        Rule("plain, chapter 8's pick_weight_grad: C·K² ≤ 64", lambda s: s.plain and pick_weight_grad(s).key ==
             "dw_direct", "dw_direct",
             "a short reduction per map: sums in registers, a deterministic second pass (08_backprop: lenet_c1, "
             "fa17)"),
        Rule("plain", lambda s: s.plain, "dw_gemm",
             "the split-K GEMM over the batch's pixels, a deterministic second pass (08_backprop: lenet_c3, "
             "resnet, days100)"),
        Rule("even padding", lambda s: s.symmetric, "igemm_f32_dw",
             "the fp32 implicit GEMM over the batch, per group (benchmarks/f32_layers.py, its dW rows)"),
        Rule("any layer", lambda s: True, "general_dw", "the only kernel that takes every layer"),
    ],
    "fp16": [
        Rule(f"groups 1, C and M multiples of 8, C·Kh·Kw ≥ 128, {_ON_HOPPER}", lambda s: _hopper_class(s, _taps(s)),
             "hopper_dw", "dy^T times x's windows on wgmma, a GEMM over pixels per tap, fp32 sums split over them "
             "and added in order, " + _HOPPER_CLASS),
        Rule(f"bf16, groups 1, M a multiple of 8, {_ON_HOPPER}", lambda s: True, "hopper_dw_bf16", _HOPPER_BF16),
        Rule("even padding", lambda s: s.symmetric, "mma_dw",
             "dy^T times x's windows on mma.sync, fp32 sums split over the pixels "
             "(benchmarks/tensor_core_layers.py --backward)"),
        Rule("any layer", lambda s: True, "general_dw", "the only kernel that takes every layer"),
    ],
}

TABLES = {"forward": RULES, "dX": DX_RULES, "dW": DW_RULES}

# ---- float32 on the tensor cores: the precision switch -------------------------------------------------

_TF32_ASKED = "asked for by torch's switches or precision= (fp32_precision)"
_WGMMA_FIRST = "wgmma where it runs (an H100/H200), else mma.sync"

#: A float32 forward where fp32_precision() is 'tf32' or '3xtf32' reads these rows first (kernels whose
#: record computes in that precision: Impl.precision), then RULES["fp32"]: a layer neither takes
#: (grouped, depthwise, uneven padding) keeps the fp32 rule's kernel, at fp32's accuracy. Forward
#: only: dX and dW stay on the fp32 routes.
PRECISION_RULES = {
    "tf32": [
        Rule("stride 1, no dilation, groups 1, even padding, an H100/H200", lambda s: True, "tf32_wgmma",
             f"TF32 {_TF32_ASKED}: one TF32 product per multiply-add, about 2^-11 relative error per product "
             f"(chapter 12, tf32.tf32_tolerance); {_WGMMA_FIRST}"),
        Rule("groups 1, even padding, sm_80 or newer", lambda s: True, "tf32_mma",
             f"TF32 {_TF32_ASKED}, on mma.sync where wgmma does not take the layer or does not run"),
    ],
    "3xtf32": [
        Rule("stride 1, no dilation, groups 1, even padding, an H100/H200", lambda s: True, "tf32x3_wgmma",
             f"3xTF32 {_TF32_ASKED}: three TF32 products per multiply-add, fp32's accuracy on the tensor cores "
             f"(chapter 12, tf32.tf32_tolerance); {_WGMMA_FIRST}"),
        Rule("groups 1, even padding, sm_80 or newer", lambda s: True, "tf32x3_mma",
             f"3xTF32 {_TF32_ASKED}, on mma.sync where wgmma does not take the layer or does not run"),
    ],
}
#: The tensor-core kernels of each precision, in the order PRECISION_RULES tries them
TENSOR_CORE_FP32 = {p: tuple(r.kernel for r in rows) for p, rows in PRECISION_RULES.items()}


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


def _precision_of(dtype: torch.dtype, option) -> str:
    """fp32_precision(option) for a float32 x; 'fp32' (nothing to choose) for the 16-bit dtypes."""
    return fp32_precision(option) if dtype == torch.float32 else "fp32"


def _tables(direction: str) -> dict:
    """A pass's tables by the name the printed rule and the docs give them: the dtype tables, and
    for the forward the precision tables ("fp32 (tf32)", ...)."""
    out = dict(TABLES[direction])
    if direction == "forward":
        out.update({f"fp32 ({p})": rows for p, rows in PRECISION_RULES.items()})
    return out


def routed() -> tuple:
    """The registered records some rule names: every kernel a route of the drop-in may run."""
    named = {r.kernel for d in TABLES for rules in _tables(d).values() for r in rules}
    return tuple(i for i in registered() if i.key in named)


def direction_of(impl: Impl) -> str:
    """The pass an Impl's op is: "forward", "dX" or "dW"."""
    return next(d for d, ops in DIRECTIONS.items() if impl.op in ops)


def dispatch_rule(dtype: str | None = None, direction: str = "forward") -> str:
    """The rule as a table: for each dtype, the conditions in order, the kernel and why (for fp32's
    forward, the precision tables too: read first where fp32_precision() asks for one)."""
    lines = []
    table = _tables(direction)
    wanted = TABLE_OF[_dtype_name(dtype)] if dtype else None
    for dt in [t for t in table if wanted is None or t.split(" ")[0] == wanted]:
        rules = table[dt]
        wc = max(len(r.condition) for r in rules)
        names = [by_key(r.kernel).name for r in rules]
        wk = max(map(len, names))
        first = ", then the fp32 table" if dt.startswith("fp32 (") else ""
        lines.append(f"{dt} {direction}: the first row whose condition holds and whose kernel takes the layer{first}")
        lines.append(f"  {'condition':<{wc}}  {'kernel':<{wk}}  why")
        lines += [f"  {r.condition:<{wc}}  {n:<{wk}}  {r.why}" for r, n in zip(rules, names)]
    return "\n".join(lines)


@functools.lru_cache(maxsize=4096)
def pick(shape: Workload, dtype: str = "fp32", layout: str = "nchw", direction: str = "forward",
         precision: str = "fp32") -> Impl:
    """The Impl the rule gives this 2D layer (its forward Workload) for a pass ("forward", "dX",
    "dW") in dtype ("fp32", "fp16", "bf16") with x in layout ("nchw" or "channels_last");
    best = pick(shape, dtype); best(x, w, **shape.conv_kwargs()) runs it. precision (fp32_precision's
    answer): for a float32 forward other than 'fp32', PRECISION_RULES[precision]'s rows first.
    NoKernel where no row gives a kernel that takes the layer (only bf16: the last fp32 and fp16
    rows take any layer)."""
    if isinstance(shape, str):
        shape = workloads.get(shape)
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r}: one of {', '.join(LAYOUTS)}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: one of {', '.join(PRECISIONS)}")
    rules = TABLES[direction][TABLE_OF[dtype]]
    takes = {i.key: i for i in candidates(shape, dtype, direction)}
    if precision != "fp32" and dtype == "fp32" and direction == "forward":
        rules = PRECISION_RULES[precision] + rules
        takes.update((i.key, i) for i in candidates(shape, dtype, direction, precision))
    for rule in rules:
        if layout in rule.layouts and rule.kernel in takes and rule.holds(shape):
            return takes[rule.kernel]
    raise NoKernel(f"no {dtype} {direction} kernel takes {shape}")

# ---- the routes --------------------------------------------------------------------------------------

def layout_of(x) -> str:
    """'channels_last' where x is in channels_last memory (and not also plain NCHW, as a 1x1 plane or
    one channel is), else 'nchw' (a strided x is made NCHW contiguous)."""
    return ("channels_last" if x.dim() == 4 and not x.is_contiguous()
            and x.is_contiguous(memory_format=torch.channels_last) else "nchw")


def _reader(impl: Impl):
    """t -> t in a memory format the kernel reads: t itself where it is in one, else one copy into
    its first (Impl.layouts)."""
    fmts = tuple(FORMATS[name] for name in impl.layouts)
    if len(fmts) == 1:
        fmt = fmts[0]
        return lambda t: t.contiguous(memory_format=fmt)
    return lambda t: t if any(t.is_contiguous(memory_format=f) for f in fmts) else t.contiguous(memory_format=fmts[0])


def _mask_reader(impl: Impl):
    """w as the kernel takes it: as it is for one that reads channels_last only (its launcher
    reorders w: a view where w is channels_last); for one that reads NCHW, as _reader gives x (NCHW
    contiguous, or as it is where the kernel reads its layout too)."""
    if "nchw" in impl.layouts:
        return _reader(impl)
    return lambda w: w


def _into(given, fmt):
    """given, where the kernel can write it (in the format it writes), else None (the route copies)."""
    return given if given is not None and given.is_contiguous(memory_format=fmt) else None


def forward_runner(impl: Impl, s: Workload, layout: str, bias: bool):
    """run(x, w, y, bias): impl on layer s for x in layout, as its record says: x converted where the
    kernel does not read its layout, the bias passed to its epilogue or added after, the result in
    x's layout (a given y filled). run.impl is impl; run.adds what the route does beside the
    kernel ("x": converted to the layout it reads, "y": converted back, "bias": added by torch)."""
    f, kw = impl.launcher, s.conv_kwargs()
    reads = layout if layout in impl.layouts else impl.layouts[0]
    fmt, out_fmt, x_fmt = FORMATS[reads], FORMATS[impl.out_layout], FORMATS[layout]
    mask = _mask_reader(impl)
    epilogue, adds_bias = impl.bias, bias and not impl.bias

    def run(x, w, y, b):
        given = None if y is None else _into(y, out_fmt)
        if epilogue:
            out = f(x.contiguous(memory_format=fmt), mask(w), given, bias=b, **kw)
        else:
            out = f(x.contiguous(memory_format=fmt), mask(w), given, **kw)
            if adds_bias:
                out.add_(b.view(1, -1, 1, 1))
        if y is not None:
            return y if out is y else y.copy_(out)
        return out.contiguous(memory_format=x_fmt)
    adds = (("x",) if reads != layout else ()) + (("y",) if impl.out_layout != layout else ()) + \
        (("bias",) if adds_bias else ())
    return _tagged(run, impl, adds)


def grad_runner(impl: Impl, s: Workload, direction: str):
    """run(a, b, out): impl's dX (a = dy, b = w, out = dx) or dW (a = x, b = dy, out = dw) on layer s
    (its forward Workload), as its record says: a tensor the kernel does not read in its layout
    converted, the result as the kernel returns it (Impl.out_layout; a given out filled)."""
    f, kw, read = impl.launcher, s.conv_kwargs(), _reader(impl)
    out_fmt = FORMATS[impl.out_layout]
    if direction == "dX":
        kw["input_size"] = (s.H, s.W)
        mask = _mask_reader(impl)

        def run(dy, w, dx):
            out = f(read(dy), mask(w), None if dx is None else _into(dx, out_fmt), **kw)
            return out if dx is None or out is dx else dx.copy_(out)
    else:
        kw["kernel_size"] = s.K if s.K == s.Kw else (s.K, s.Kw)

        def run(x, dy, dw):
            out = f(read(x), read(dy), None if dw is None else _into(dw, out_fmt), **kw)
            return out if dw is None or out is dw else dw.copy_(out)
    run.reads = FORMATS[impl.layouts[0]]          # the format a tensor input is converted to, where needed
    return _tagged(run, impl, ())


def _tagged(run, impl: Impl, adds: tuple):
    run.impl, run.adds = impl, adds           # what the route runs, and what it does beside
    return run


def _forward_runner(x_shape, w_shape, b_shape, dtype, layout, stride, padding, dilation, groups, precision):
    """forward()'s route for one call signature (dtype: its name; precision: fp32_precision's answer)."""
    s = layer(x_shape, w_shape, stride, padding, dilation, groups, b_shape)
    return forward_runner(pick(s, dtype, layout, "forward", precision), s, layout, b_shape is not None)


def _name(dtype: torch.dtype) -> str:
    name = DTYPE_NAME.get(dtype)
    if name is None:
        raise TypeError(f"{dtype}: the kernels take {', '.join(map(str, DTYPE.values()))}")
    return name


_routes: dict = {}      # call signature -> the route: a repeated call's one lookup


def forward(x, w, y=None, *, stride=1, padding=0, dilation=1, groups: int = 1, bias=None, precision=None):
    """y = conv2d(x, w, bias) by pick()'s kernel for the layer (x 4-D, NCHW or channels_last);
    stride, padding and dilation in any form torch takes; a float32 x in fp32_precision(precision).
    y comes back in x's layout, as torch's does (a given y is filled)."""
    layout, p = layout_of(x), _precision_of(x.dtype, precision)
    key = (x.shape, w.shape, None if bias is None else bias.shape, x.dtype, layout, p, stride, padding, dilation,
           groups)
    run = remember(_routes, key, lambda: forward_route(x, w, bias, stride=stride, padding=padding,
                                                       dilation=dilation, groups=groups, precision=p), key[6:])
    return run(x, w, y, bias)


def forward_route(x, w, bias=None, *, stride=1, padding=0, dilation=1, groups: int = 1, precision=None):
    """run(x, w, y, bias): forward()'s route for this call signature and precision (as
    fp32_precision takes it), every choice made, for a caller that keeps it (the drop-in); run.impl
    the kernel it runs, run.adds what it does beside."""
    return _forward_runner(x.shape, w.shape, None if bias is None else bias.shape, _name(x.dtype), layout_of(x),
                           stride, padding, dilation, groups, _precision_of(x.dtype, precision))


def forward_impl(x, w, bias=None, *, stride=1, padding=0, dilation=1, groups: int = 1, precision=None) -> Impl:
    """The Impl forward() runs for these arguments (precision as fp32_precision takes it)."""
    return forward_route(x, w, bias, stride=stride, padding=padding, dilation=dilation, groups=groups,
                         precision=precision).impl


def dx_route(dy_shape, w_shape, dtype: str, stride, padding, input_size, dilation, groups):
    """run(dy, w, dx): the dX route (DX_RULES) of a layer with dy of dy_shape, a mask of w_shape and
    an input of input_size, in dtype (its name); run.impl which kernel."""
    H, W = (int(v) for v in two(input_size))
    s = layer((dy_shape[0], w_shape[1] * groups, H, W), w_shape, stride, padding, dilation, groups)
    return grad_runner(pick(s, dtype, "nchw", "dX"), s, "dX")


def dw_route(x_shape, dy_shape, dtype: str, stride, padding, kernel_size, dilation, groups):
    """run(x, dy, dw): the dW route (DW_RULES) of a layer with x of x_shape, dy of dy_shape and a mask
    of kernel_size, in dtype (its name); run.impl which kernel."""
    Kh, Kw = (int(k) for k in two(kernel_size))
    s = layer(x_shape, (dy_shape[1], x_shape[1] // groups, Kh, Kw), stride, padding, dilation, groups)
    return grad_runner(pick(s, dtype, "nchw", "dW"), s, "dW")


_grad_routes: dict = {}     # ("dx" | "dw", shapes, dtype, arguments as given) -> the route


def _dx_kept(dy_shape, w_shape, dtype, input_size, stride, padding, dilation, groups):
    key = ("dx", dy_shape, w_shape, dtype, input_size, stride, padding, dilation, groups)
    return remember(_grad_routes, key, lambda: dx_route(dy_shape, w_shape, dtype, stride, padding, input_size,
                                                        dilation, groups), key[4:])


def _dw_kept(x_shape, dy_shape, dtype, kernel_size, stride, padding, dilation, groups):
    key = ("dw", x_shape, dy_shape, dtype, kernel_size, stride, padding, dilation, groups)
    return remember(_grad_routes, key, lambda: dw_route(x_shape, dy_shape, dtype, stride, padding, kernel_size,
                                                        dilation, groups), key[4:])


def grad_routes(x_shape, w_shape, y_shape, dtype: str, *, stride=1, padding=0, dilation=1, groups: int = 1) -> tuple:
    """(dx_route's run(dy, w, dx), dw_route's run(x, dy, dw)) of the layer conv2d(x, w) that gave y, in
    dtype (its name): both gradients' routes at once, for a caller that keeps them with its forward
    route (the drop-in's backward then runs them straight away)."""
    return (_dx_kept(y_shape, w_shape, dtype, tuple(x_shape[-2:]), stride, padding, dilation, groups),
            _dw_kept(x_shape, y_shape, dtype, tuple(w_shape[-2:]), stride, padding, dilation, groups))


def dx_impl(dy, w, *, stride=1, padding=0, input_size, dilation=1, groups: int = 1) -> Impl:
    """The Impl input_grad() runs for these arguments."""
    return _dx_kept(dy.shape, w.shape, _name(dy.dtype), input_size, stride, padding, dilation, groups).impl


def dw_impl(x, dy, *, stride=1, padding=0, kernel_size, dilation=1, groups: int = 1) -> Impl:
    """The Impl weight_grad() runs for these arguments."""
    return _dw_kept(x.shape, dy.shape, _name(x.dtype), kernel_size, stride, padding, dilation, groups).impl


def input_grad(dy, w, dx=None, *, stride=1, padding=0, input_size, dilation=1, groups: int = 1):
    """dx of conv2d by dx_route's kernel (the choice kept per call signature)."""
    return _dx_kept(dy.shape, w.shape, _name(dy.dtype), input_size, stride, padding, dilation, groups)(dy, w, dx)


def weight_grad(x, dy, dw=None, *, stride=1, padding=0, kernel_size, dilation=1, groups: int = 1):
    """dw of conv2d by dw_route's kernel (the choice kept per call signature)."""
    return _dw_kept(x.shape, dy.shape, _name(x.dtype), kernel_size, stride, padding, dilation, groups)(x, dy, dw)


def no_kernel(s: Workload, dtype: str, layout: str = "nchw", passes=("forward",)) -> str | None:
    """Why no kernel runs a pass of this layer in dtype (a NoKernel's message), or None when each of
    `passes` ("forward", "dX", "dW") has one."""
    for direction in passes:
        try:
            pick(s, dtype, layout, direction)
        except NoKernel as e:
            return str(e)
    return None


# ---- 16-bit: how the routed forward adds -------------------------------------------------------------

def fp16_accumulation(shape: Workload) -> str:
    """How the kernel pick() gives a 16-bit layer keeps its sums: the accumulation_of of a record
    whose launcher runs the routes (picked(), a benchmark's forward and backward through the drop-in)."""
    return pick(shape, "fp16").accumulation


def _route_impl(x_shape, w_shape, stride, padding, dilation, groups, dtype: str, layout: str) -> Impl:
    x_shape = tuple(x_shape) if len(x_shape) == 4 else (1, *x_shape)
    return pick(layer(x_shape, w_shape, stride, padding, dilation, groups), dtype, layout)


def forward_accumulation(x_shape, w_shape, stride=1, padding=0, dilation=1, groups: int = 1, dtype: str = "fp16",
                         layout: str = "nchw") -> str:
    """'half' or 'float': how the kernel conv2d runs in a 16-bit dtype on this layer keeps its sums
    (chapter 6's direct kernels add in half where pick() chooses them): what fp16.fp16_tolerance needs."""
    return _route_impl(x_shape, w_shape, stride, padding, dilation, groups, dtype, layout).accumulation


def tolerance(n: int, accumulation: str, dtype: str = "fp16") -> tuple:
    """(rtol, atol_rms) of a 16-bit result (dtype "fp16" or "bf16") of sums of n products of 16-bit
    inputs, against fp64 of those inputs: fp16.fp16_tolerance (rounded inputs); bf16's output is
    rounded to 8 significant bits (2^-8), its float sums add what fp16's do."""
    rtol, atol_rms = fp16_tolerance(n, 1, accumulation, rounded_inputs=True)
    return (rtol - U16 + U_BF16 if dtype == "bf16" else rtol), atol_rms


def check_fp16_forward(y, ref, x_shape, w_shape, bias=None, stride=1, padding=0, dilation=1, groups: int = 1,
                       name: str = "y", dtype: str = "fp16", layout: str = "nchw", impl: Impl | None = None):
    """cl.check of conv2d's 16-bit output y (dtype "fp16" or "bf16", x in layout) against ref (fp64
    of the 16-bit inputs, bias included) with the bound derived for the kernel conv2d runs
    (fp16.fp16_tolerance: its sums, in half or float, of C/groups·Kh·Kw terms and the bias; bf16's
    output rounding is 2^-8, not 2^-11). Where that kernel adds no bias, conv2d adds it to the
    kernel's 16-bit output, which is rounded once more: u·|y - bias| <= u·|ref| + u·|bias| more.
    impl: the kernel that ran, where it is not the one the route picks."""
    impl = impl or _route_impl(x_shape, w_shape, stride, padding, dilation, groups, dtype, layout)
    n = w_shape[1] * w_shape[2] * w_shape[3] + (bias is not None)
    rtol, atol_rms = tolerance(n, impl.accumulation, dtype)
    u = U_BF16 if dtype == "bf16" else U16
    r = ref.detach().double().cpu()
    atol = atol_rms * max(float(r.pow(2).mean().sqrt()) if r.numel() else 1.0, 1e-30)
    if bias is not None and not impl.bias:
        rtol, atol = 2 * rtol, atol + u * float(bias.detach().double().abs().max())
    return check(y, r, rtol=rtol, atol=atol, name=name)


def picked(dtype: str = "fp32"):
    """An Impl labelled BEST that runs pick()'s kernel on any layer, for measure.run."""
    return Impl(BEST, forward, "conv2d_fp16" if dtype != "fp32" else "conv2d", any_layer=True, key=BEST_KEY,
                dtypes=(dtype,), layouts=LAYOUTS, bias=True,
                accumulation_of=fp16_accumulation if dtype != "fp32" else None)


# ---- the document -------------------------------------------------------------------------------

KERNEL_TABLE_BEGIN = "<!-- the kernel table: dispatch.kernel_table(), written by scripts/kernel_table.py -->"
KERNEL_TABLE_END = "<!-- end of the kernel table -->"


def kernel_table() -> str:
    """The registered kernels as docs/convlab-api.md's table, read from their records: key, label,
    op, dtypes (and the precision a float32 kernel computes in, where not fp32's), the layouts read
    -> returned, bias in the epilogue, sums, module, whether the dispatcher may choose it, and the
    rule tables that name it."""
    named = {}
    for direction in TABLES:
        for dt, rules in _tables(direction).items():
            for r in rules:
                named.setdefault(r.kernel, []).append(f"{dt} {direction}")
    lines = ["| key | label | op | dtypes | reads → returns | bias | sums | module | dispatcher may choose | rules |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for i in registered():
        dtypes = ", ".join(i.dtypes) + (f" ({i.precision})" if i.precision else "")
        lines.append(f"| `{i.key}` | {i.name} | {i.op} | {dtypes} | {'/'.join(i.layouts)} → "
                     f"{i.out_layout} | {'yes' if i.bias else 'no'} | {i.accumulation} | `{module_of(i)}` | "
                     f"{'yes' if i.candidate else 'no'} | {', '.join(dict.fromkeys(named.get(i.key, []))) or '-'} |")
    return "\n".join(lines)


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
