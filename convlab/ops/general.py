"""Chapter 9 launchers: the general direct convolution (kernels/09_general/conv2d_general*.cu),
forward, dE/dX and dE/dW, for every layer torch.nn.functional.conv2d takes. The reference path of
the drop-in: what the dispatcher runs where no faster kernel takes a layer.

- conv2d_general(x, w, y=None, *, stride=1, padding=0, dilation=1, groups=1, bias=None) -> y
- conv2d_general_dx(dy, w, dx=None, *, stride=1, padding=0, input_size=(H, W), dilation=1, groups=1) -> dx
- conv2d_general_dw(x, dy, dw=None, *, stride=1, padding=0, kernel_size=(Kh, Kw), dilation=1, groups=1,
  splits=None) -> dw

float32 or float16 tensors (half in and out, float sums), NCHW, contiguous, on the backend's device;
stride, padding and dilation as torch takes them (an int, a 1- or 2-sequence; padding also 'same'
or 'valid'). Each launcher works out its launch once per call signature (shapes, dtype, arguments)
and keeps it, as every launcher of the course does: a repeated call allocates its output and
launches. The depthwise kernels are in depthwise.py, the routing among all kernels in dispatch.py,
the drop-in conv2d / Conv2d in dropin.py.
"""
from __future__ import annotations

import torch

from ..gpu._limits import GRID_X_MAX, GRID_YZ_MAX
from ..measuring.workloads import Workload
from . import Impl, ceil_div, new_output, output
from ._kernels import Launch, remember, sm_count
from .shapes import check_inputs, check_plane_sizes, check_tensors, layer, suffix, two

FWD_FILE = "kernels/09_general/conv2d_general.cu"
DX_FILE = "kernels/09_general/conv2d_general_dx.cu"
DW_FILE = "kernels/09_general/conv2d_general_dw.cu"

BLOCK = 256
DW_TAPS = 12     # taps per block of conv2d_general_dw (its TAPS)


def kernel_args(s: Workload) -> tuple:
    """The integer arguments the conv2d_general*.cu kernels take, in their order."""
    return (s.B, s.C, s.H, s.W, s.M, s.K, s.Kw, s.Ho, s.Wo, s.stride, s.stride_w, s.padding, s.padding_w,
            s.dilation, s.dilation_w, s.groups)


def _blocks(n: int) -> int:
    return max(1, min(ceil_div(n, BLOCK), GRID_X_MAX))


_plans: dict = {}


# ---- forward -----------------------------------------------------------------------------------

def conv2d_general(x, w, y=None, *, stride=1, padding=0, dilation=1, groups: int = 1, bias=None):
    """y = conv2d(x, w, bias) by kernels/09_general/conv2d_general.cu: one thread per output."""
    b_shape = None if bias is None else bias.shape
    args = (stride, padding, dilation, groups)
    s, launch = remember(_plans, ("fwd", x.shape, w.shape, x.dtype, b_shape, *args),
                         lambda: _forward_plan(x, w, bias, stride, padding, dilation, groups), args)
    y = output(y, s.y_shape, x, name="y")
    if launch is not None:
        # no bias: any tensor of the dtype fills the slot; the kernel's has_bias=0 keeps it from reading it
        launch(x, w, w if bias is None else bias, y)
    return y


def _forward_plan(x, w, bias, stride, padding, dilation, groups):
    check_inputs(x, w, bias)
    s = layer(x.shape, w.shape, stride, padding, dilation, groups, None if bias is None else bias.shape)
    check_plane_sizes(s)
    if s.outputs == 0:
        return s, None
    return s, Launch(FWD_FILE, "conv2d_general" + suffix(x.dtype), {"BLOCK": BLOCK},
                     (*kernel_args(s), int(bias is not None)), grid=(_blocks(s.outputs),), block=(BLOCK,))


# ---- dE/dX -------------------------------------------------------------------------------------

def conv2d_general_dx(dy, w, dx=None, *, stride=1, padding=0, input_size, dilation=1, groups: int = 1):
    """dx of conv2d by kernels/09_general/conv2d_general_dx.cu (a gather: one thread per dx
    element, no atomics). input_size=(H, W): with stride > 1 several input sizes give dy's size."""
    args = (input_size, stride, padding, dilation, groups)
    s, launch = remember(_plans, ("dx", dy.shape, w.shape, dy.dtype, *args),
                         lambda: _dx_plan(dy, w, stride, padding, input_size, dilation, groups), args)
    dx = output(dx, s.x_shape, dy, name="dx")
    if launch is not None:
        launch(dy, w, dx)
    return dx


def _dx_plan(dy, w, stride, padding, input_size, dilation, groups):
    check_tensors(dy=dy, w=w, device=True)
    if dy.dim() != 4:
        raise ValueError(f"dy must be (B, M, Ho, Wo), got {tuple(dy.shape)}")
    H, W = (int(v) for v in two(input_size))
    x_shape = (dy.shape[0], w.shape[1] * groups, H, W)
    s = layer(x_shape, w.shape, stride, padding, dilation, groups)
    if tuple(dy.shape) != s.y_shape:
        raise ValueError(f"dy has shape {tuple(dy.shape)}, but an input of {x_shape} and w {tuple(w.shape)} give "
                         f"outputs of {s.y_shape}: check input_size, stride, padding, dilation")
    check_plane_sizes(s)
    n = s.B * s.C * s.H * s.W
    if n == 0:
        return s, None
    return s, Launch(DX_FILE, "conv2d_general_dx" + suffix(dy.dtype), {"BLOCK": BLOCK}, kernel_args(s),
                     grid=(_blocks(n),), block=(BLOCK,))


# ---- dE/dW -------------------------------------------------------------------------------------

def dw_splits(s: Workload, taps: int = DW_TAPS) -> int:
    """How many slices of the B*Ho*Wo pixels conv2d_general_dw splits each weight's sum into: enough
    blocks for about 4 waves of 8 resident blocks per SM, each thread still summing 8 pixels or more."""
    blocks = s.M * (s.C // s.groups) * ceil_div(s.K * s.Kw, taps)
    pixels = s.B * s.Ho * s.Wo
    want = ceil_div(4 * 8 * sm_count(), max(blocks, 1))
    return max(1, min(want, ceil_div(pixels, 8 * BLOCK), GRID_YZ_MAX))


def conv2d_general_dw(x, dy, dw=None, *, stride=1, padding=0, kernel_size, dilation=1, groups: int = 1,
                      splits: int | None = None):
    """dw of conv2d by kernels/09_general/conv2d_general_dw.cu: a block per (map, channel, 12 taps,
    pixel slice), sums in registers then shared memory, the slices added in order by a second
    kernel (deterministic). kernel_size: Kh or (Kh, Kw). splits: pixel slices (default dw_splits)."""
    args = (kernel_size, stride, padding, dilation, groups, splits)
    s, splits, launch, finish = remember(_plans, ("dw", x.shape, dy.shape, x.dtype, *args),
                                         lambda: _dw_plan(x, dy, stride, padding, kernel_size, dilation, groups,
                                                          splits), args)
    dw = output(dw, s.w_shape, x, name="dw")
    if launch is not None:
        partial = new_output((splits * dw.numel(),), x, torch.float32)       # float sums, whatever the dtype
        launch(x, dy, partial)
        finish(partial, dw)
    return dw


def _dw_plan(x, dy, stride, padding, kernel_size, dilation, groups, splits):
    check_tensors(x=x, dy=dy, device=True)
    if x.dim() != 4 or dy.dim() != 4:
        raise ValueError(f"x and dy must be 4-D, got {tuple(x.shape)} and {tuple(dy.shape)}")
    Kh, Kw = (int(k) for k in two(kernel_size))
    B, C = (int(v) for v in x.shape[:2])
    if groups < 1 or C % groups:
        raise ValueError(f"groups={groups} must divide the input's {C} channels")
    w_shape = (int(dy.shape[1]), C // groups, Kh, Kw)
    s = layer(x.shape, w_shape, stride, padding, dilation, groups)
    if tuple(dy.shape) != s.y_shape:
        raise ValueError(f"dy has shape {tuple(dy.shape)}, but x {tuple(x.shape)} and a mask of {w_shape} give "
                         f"outputs of {s.y_shape}: check kernel_size, stride, padding, dilation")
    check_plane_sizes(s)
    n = s.M * (s.C // s.groups) * Kh * Kw
    if n == 0:
        return s, 0, None, None
    splits = dw_splits(s) if splits is None else int(splits)
    if not 1 <= splits <= GRID_YZ_MAX:
        raise ValueError(f"splits={splits}: between 1 and {GRID_YZ_MAX:,} (gridDim.z)")
    pixels = s.B * s.Ho * s.Wo
    per_split = max(1, ceil_div(pixels, splits))
    splits = max(1, ceil_div(pixels, per_split))          # no empty slice
    pairs = s.M * (s.C // s.groups)
    if pairs > GRID_X_MAX or ceil_div(Kh * Kw, DW_TAPS) > GRID_YZ_MAX:
        raise ValueError(f"{pairs:,} (map, channel) pairs or {Kh}x{Kw} taps: over the grid's limits")
    defines = {"BLOCK": BLOCK, "TAPS": DW_TAPS}
    launch = Launch(DW_FILE, "conv2d_general_dw" + suffix(x.dtype), defines, (*kernel_args(s), per_split),
                    grid=(pairs, ceil_div(Kh * Kw, DW_TAPS), splits), block=(BLOCK,))
    finish = Launch(DW_FILE, "conv2d_general_dw_finish" + suffix(x.dtype), defines, (splits, n),
                    grid=(_blocks(n),), block=(BLOCK,))
    return s, splits, launch, finish


def _is_2d(shape) -> bool:
    return shape.D is None


GENERAL = Impl("general direct (any layer)", conv2d_general, "conv2d", _is_2d, any_layer=True, key="general", bias=True)
GENERAL_FP16 = Impl("general direct fp16 (any layer)", conv2d_general, "conv2d_fp16", _is_2d, any_layer=True,
                    key="general_fp16", bias=True)
GENERAL_DX = Impl("general dX gather (any layer)", conv2d_general_dx, "conv2d_dx", _is_2d, any_layer=True,
                  key="general_dx", dtypes=("fp32", "fp16"))
GENERAL_DW = Impl("general dW (blocks, second pass)", conv2d_general_dw, "conv2d_dw", _is_2d, any_layer=True,
                  key="general_dw", dtypes=("fp32", "fp16"))
#: The chapter's general kernels. Their tunables default to None and are resolved by the
#: launchers (dw_splits), so config() is empty.
IMPLEMENTATIONS: tuple[Impl, ...] = (GENERAL, GENERAL_FP16, GENERAL_DX, GENERAL_DW)
