"""Chapter 9 launchers: depthwise convolution (groups == C, one input channel per map), in both layouts.

- conv2d_depthwise(x, w, y=None, *, stride=1, padding=0, dilation=1, groups=1, bias=None,
  OY=, BX=, BY=, BZ=, vec=) -> y, by kernels/09_general/conv2d_depthwise.cu: NCHW; a block per tile
  of BZ output planes, their input in shared memory, OY outputs down a column per thread.
- conv2d_depthwise_nhwc(x, w, y=None, *, ..., OY=, OX=, vec=, CB=, PB=) -> y, by
  kernels/09_general/conv2d_depthwise_nhwc.cu: x and y channels_last (memory (B, H, W, C); an NCHW
  x converted in the call); an OY x OX patch of vec channels per thread, the block's masks in
  shared memory; groups == C == M.
- conv2d_depthwise_dx(dy, w, dx=None, *, stride, padding, input_size, dilation, groups) -> dx: dX of
  a stride-1 depthwise layer as conv2d_depthwise of dy with the flipped mask (depthwise_dx_applies).
- depthwise_applies(s) / nhwc_applies(s): which layers (a Workload) each takes; depthwise_config(s)
  and nhwc_config(s, dtype): their default tunables; depthwise_dx_padding(s): where dX of a
  depthwise layer is itself a depthwise forward (the flipped mask).

float32 or float16 (half in and out, float sums); stride, padding and dilation as torch takes them.
Each launcher works out its launch once per call signature (shapes, dtype, arguments, tunables and
whether x's storage is 16-byte aligned) and keeps it.
"""
from __future__ import annotations

import torch

from ..gpu._limits import GRID_X_MAX, GRID_YZ_MAX, SHARED_DEFAULT_MAX
from ..measuring.workloads import Workload
from . import Impl, ceil_div, new_output, output
from ._kernels import Launch, remember
from .shapes import DTYPE_NAME, check_inputs, check_plane_sizes, check_tensors, layer, suffix

DEPTHWISE_FILE = "kernels/09_general/conv2d_depthwise.cu"
NHWC_FILE = "kernels/09_general/conv2d_depthwise_nhwc.cu"
DEPTHWISE_MAX_TAPS = 64      # the mask lives in registers: up to 8x8 (3x3, 5x5, 7x7 layers)
MAX_SHARED = SHARED_DEFAULT_MAX     # bytes of shared memory a block may use without opting in
THREADS = 256       # threads an NHWC block aims at: CB lanes x PB patches

_plans: dict = {}


# ---- NCHW ----------------------------------------------------------------------------------------

def depthwise_vec(s: Workload, x: torch.Tensor) -> int:
    """Elements per global load of conv2d_depthwise's tile: 16 bytes (4 floats, 8 halves) where
    every row of x starts 16-byte aligned (W a multiple of that, x's storage aligned), else 1."""
    v = 16 // x.element_size()
    return v if s.W % v == 0 and x.data_ptr() % 16 == 0 else 1


def _depthwise_tile(s: Workload, OY: int, BX: int | None = None, BY: int | None = None,
                    BZ: int | None = None, vec: int = 1) -> tuple:
    """(BX, BY, BZ, shared bytes) of conv2d_depthwise's block: BX output columns (the row in as few
    tiles of at most 32 as it takes, split evenly), BY strips of OY rows (about 256 threads, the
    rows split evenly; fewer while one plane's input tile is over 48 KB), BZ planes (up to 256
    threads in all and 48 KB; more than 1 where one plane's tile is small). vec: elements per load
    (the tile's rows are whole vectors, from the multiple of vec at or left of the first column)."""
    if BX is None:
        BX = ceil_div(s.Wo, ceil_div(s.Wo, 32))
    strips = ceil_div(s.Ho, OY)
    if BY is None:
        most = max(1, min(256 // BX, strips))
        BY = ceil_div(strips, ceil_div(strips, most))
    IW = (BX - 1) * s.stride_w + (s.Kw - 1) * s.dilation_w + 1
    IWS = (IW + 2 * (vec - 1)) // vec * vec                       # as the kernel's IWS

    def shared(by):
        return ((by * OY - 1) * s.stride + (s.K - 1) * s.dilation + 1) * IWS * 4

    while BY > 1 and shared(BY) > MAX_SHARED:
        BY -= 1
    if BZ is None:
        BZ = max(1, min(256 // (BX * BY), MAX_SHARED // shared(BY), 64, s.B * s.M))
    return BX, BY, BZ, BZ * shared(BY)


#: Output maps of at least TALL_MAP rows take OY=16 rows a thread, others OY=8. From
#: benchmarks/depthwise_layers.py on an H200 (MobileNetV2 and ConvNeXt depthwise layers, fp32 and
#: fp16): OY=16 was the fastest on the 3x3 layers of 56x56 outputs, OY=8 on 14x14 maps and at
#: stride 2 (28x28 outputs); between the two at 28x28 and on the 7x7 masks (float32 and float16
#: disagreeing); both well ahead of OY=4 (each strip re-reads Kh-1 input rows: a taller strip
#: re-reads fewer, but cuts a short map into too few blocks).
TALL_MAP = 48


def depthwise_config(s: Workload) -> dict:
    """Default tunables of conv2d_depthwise: OY output rows per thread (16 on maps of TALL_MAP
    rows or more, else 8), and the block of _depthwise_tile. OY is compiled in: one variant per
    mask and map height class serves every plane size."""
    OY = 16 if s.Ho >= TALL_MAP else 8
    BX, BY, BZ, _ = _depthwise_tile(s, OY)
    return {"OY": OY, "BX": BX, "BY": BY, "BZ": BZ}


def depthwise_applies(s: Workload) -> bool:
    """A 2D depthwise layer (every map reads one channel: groups == C), the mask fits in registers
    and the input tile of one strip in 48 KB of shared memory (with 16-byte loads' widest rows)."""
    if s.D is not None or s.groups != s.C or s.K * s.Kw > DEPTHWISE_MAX_TAPS:
        return False
    return _depthwise_tile(s, depthwise_config(s)["OY"], BY=1, BZ=1, vec=8)[3] <= MAX_SHARED


def conv2d_depthwise(x, w, y=None, *, stride=1, padding=0, dilation=1, groups: int = 1, bias=None,
                     OY: int | None = None, BX: int | None = None, BY: int | None = None, BZ: int | None = None,
                     vec: int | None = None):
    """y = conv2d(x, w, bias, groups=C): 16-byte loads of the tile where depthwise_vec allows (vec=1
    forces single elements). Compiled per mask size, stride, dilation, OY and load width."""
    args = (stride, padding, dilation, groups, OY, BX, BY, BZ, vec)
    key = ("dw_nchw", x.shape, w.shape, x.dtype, None if bias is None else bias.shape, x.data_ptr() % 16 == 0, *args)
    s, launches = remember(_plans, key, lambda: _nchw_plan(x, w, bias, stride, padding, dilation, groups, OY, BX, BY,
                                                           BZ, vec), args)
    y = output(y, s.y_shape, x, name="y")
    for launch in launches:
        launch(x, w, w if bias is None else bias, y)
    return y


def _nchw_plan(x, w, bias, stride, padding, dilation, groups, OY, BX, BY, BZ, vec):
    check_inputs(x, w, bias)
    s = layer(x.shape, w.shape, stride, padding, dilation, groups, None if bias is None else bias.shape)
    check_plane_sizes(s)
    if not depthwise_applies(s):
        raise ValueError(f"conv2d_depthwise takes groups == C (here {s.groups} groups of {s.C} channels) and masks "
                         f"of at most {DEPTHWISE_MAX_TAPS} taps (here {s.K}x{s.Kw}): use general.conv2d_general")
    OY = int(OY or depthwise_config(s)["OY"])
    best = depthwise_vec(s, x)
    if vec not in (None, 1, best):
        raise ValueError(f"vec={vec}: this x takes {best} element(s) per load (depthwise_vec), or vec=1")
    vec = best if vec is None else 1
    BX, BY, BZ, shared = _depthwise_tile(s, OY, BX, BY, BZ, vec)
    if BX * BY * BZ > 1024 or BZ > 64 or shared > MAX_SHARED:
        raise ValueError(f"block BX={BX} x BY={BY} strips of OY={OY} rows x BZ={BZ} planes: {BX * BY * BZ} threads, "
                         f"{shared:,} bytes of shared memory; at most 1,024 threads, BZ <= 64 and 48 KB: "
                         "lower BX, BY, BZ or OY")
    if s.outputs == 0:
        return s, ()
    defines = {"KH": s.K, "KW": s.Kw, "SH": s.stride, "SW": s.stride_w, "DH": s.dilation, "DW": s.dilation_w,
               "OY": OY, "VEC16": int(vec > 1)}
    grid_xy = (ceil_div(s.Wo, BX), ceil_div(s.Ho, BY * OY))
    if grid_xy[1] > GRID_YZ_MAX:
        raise ValueError(f"Ho={s.Ho}: {grid_xy[1]:,} row tiles, over gridDim.y's 65,535: raise BY or OY")
    planes = s.B * s.M
    per_launch = GRID_YZ_MAX * BZ                  # gridDim.z holds at most 65,535 blocks of BZ planes
    return s, tuple(
        Launch(DEPTHWISE_FILE, "depthwise" + suffix(x.dtype), defines,
               (s.C, s.H, s.W, s.M, s.Ho, s.Wo, s.padding, s.padding_w, int(bias is not None), z0, planes),
               grid=(*grid_xy, ceil_div(min(per_launch, planes - z0), BZ)), block=(BX, BY, BZ), shared=shared)
        for z0 in range(0, planes, per_launch))


def conv2d_depthwise_dx(dy, w, dx=None, *, stride=1, padding=0, input_size=None, dilation=1, groups: int = 1):
    """dx of a depthwise layer where depthwise_dx_padding allows: conv2d_depthwise on dy with the
    flipped mask (one small copy of the mask a call), float32 or float16, NCHW."""
    M, _, Kh, Kw = (int(v) for v in w.shape)
    H, W = (int(v) for v in input_size) if input_size is not None else (None, None)
    s = layer((int(dy.shape[0]), M, H, W), tuple(w.shape), stride, padding, dilation, groups)
    pad = depthwise_dx_padding(s)
    if pad is None:
        raise ValueError(f"{s}: dX is a depthwise forward only for a stride-1 layer of one map per channel whose "
                         "padding gives the input's size back (depthwise_dx_padding); use general.conv2d_general_dx")
    return conv2d_depthwise(dy, torch.flip(w, (2, 3)), dx, padding=pad, dilation=(s.dilation, s.dilation_w), groups=M)


def depthwise_dx_applies(s: Workload) -> bool:
    """Where conv2d_depthwise_dx takes a layer (its forward Workload)."""
    return depthwise_dx_padding(s) is not None and depthwise_applies(s)


def depthwise_dx_padding(s: Workload) -> tuple | None:
    """For a stride-1 depthwise layer with one map per channel, dx is itself a depthwise forward:
    dy convolved with the flipped mask, padded d*(k-1) - p before, which gives the input's size
    back when the padding was symmetric. That padding (ph, pw), or None where this does not hold
    (strides, channel multipliers, 'same' with an even mask, padding past the mask's span)."""
    if (s.stride, s.stride_w) != (1, 1) or not s.M == s.C == s.groups:
        return None
    pad = (s.dilation * (s.K - 1) - s.padding, s.dilation_w * (s.Kw - 1) - s.padding_w)
    back = (s.Ho + 2 * pad[0] - s.dilation * (s.K - 1), s.Wo + 2 * pad[1] - s.dilation_w * (s.Kw - 1))
    if min(pad) < 0 or back != (s.H, s.W):
        return None
    return pad


# ---- NHWC (channels_last) ------------------------------------------------------------------------

def nhwc_applies(s: Workload) -> bool:
    """A 2D layer of one map per channel (groups == C == M) and a mask of at most DEPTHWISE_MAX_TAPS taps."""
    return s.D is None and s.groups == s.C == s.M and s.K * s.Kw <= DEPTHWISE_MAX_TAPS


def nhwc_vec(s: Workload, x: torch.Tensor, vec: int | None = None) -> int:
    """Channels per thread (one load each of x and y): 4 by default (16 bytes of float, 8 of half),
    the largest of vec, vec/2, ... 1 that divides C (every pixel's run of channels then starts
    aligned, given x's storage is)."""
    v = 4 if vec is None else int(vec)
    if v not in (1, 2, 4, 8):
        raise ValueError(f"vec={vec}: 1, 2, 4 or 8 channels per thread")
    while v > 1 and (s.C % v or x.data_ptr() % (v * x.element_size())):
        v //= 2
    return v


def nhwc_config(s: Workload, dtype: torch.dtype = torch.float32) -> dict:
    """Default tunables: an OY x OX patch per thread, 2 x 4 for masks up to 3 rows (24 loads per 8
    outputs at 3x3) in float32 and 2 x 2 in float16, 4 x 2 for taller masks (80 per 8 at 7x7, fewer
    rows re-read by the next patch down) with PB=16 patches a block; vec=4 channels a thread.
    From benchmarks/depthwise_layers.py on an H200: half's 2 x 2 patch was the fastest on the 3x3
    layers of 14x14 maps and at stride 2 (where 2 x 4 fell behind torch), and PB=16 the fastest
    on the 7x7 layers in both dtypes (PB left out: THREADS / CB, more patches a block)."""
    if s.K <= 3:
        OY, OX = (2, 2) if dtype == torch.float16 else (2, 4)
        return {"OY": OY, "OX": OX, "vec": 4, "PB": None}
    return {"OY": 4, "OX": 2, "vec": 4, "PB": 16}


def _block(s: Workload, vec: int, CB: int | None, PB: int | None) -> tuple:
    """(CB, PB, shared bytes): CB lanes of vec channels (the C/vec of them in as few groups of at
    most 32 as it takes, split evenly, and fewer while the masks are over 48 KB), PB patches."""
    cv = ceil_div(s.C, vec)
    if CB is None:
        CB = ceil_div(cv, ceil_div(cv, 32))
        while CB > 1 and s.K * s.Kw * CB * vec * 4 > SHARED_DEFAULT_MAX:
            CB = ceil_div(CB, 2)
    if PB is None:
        PB = max(1, THREADS // CB)
    return CB, PB, s.K * s.Kw * CB * vec * 4


def conv2d_depthwise_nhwc(x, w, y=None, *, stride=1, padding=0, dilation=1, groups: int = 1, bias=None,
                          OY: int | None = None, OX: int | None = None, vec: int | None = None,
                          CB: int | None = None, PB: int | None = None):
    """y = conv2d(x, w, bias, groups=C) on channels-last x and y: OY x OX outputs of vec channels a
    thread, the block's masks in shared memory. Compiled per mask size, stride, dilation, OY, OX, vec.
    An x in another layout is converted to channels_last inside the call (one copy, in its time)."""
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        raise ValueError(f"x must be a (B, C, H, W) tensor, got {getattr(x, 'shape', type(x).__name__)}")
    x = x.contiguous(memory_format=torch.channels_last)     # x itself when it is channels_last
    xh = x.permute(0, 2, 3, 1)                  # (B, H, W, C): contiguous, the memory the kernel reads
    args = (stride, padding, dilation, groups, OY, OX, vec, CB, PB)
    key = ("dw_nhwc", x.shape, w.shape, x.dtype, None if bias is None else bias.shape, x.data_ptr() % 16, *args)
    s, launch = remember(_plans, key, lambda: _nhwc_plan(x, xh, w, bias, stride, padding, dilation, groups, OY, OX,
                                                         vec, CB, PB), args)
    if y is None:
        yh = new_output((s.B, s.Ho, s.Wo, s.M), x)
    else:
        if tuple(y.shape) != s.y_shape or not y.is_contiguous(memory_format=torch.channels_last):
            raise ValueError(f"y must be a channels-last {s.y_shape} tensor, got {tuple(y.shape)}")
        yh = y.permute(0, 2, 3, 1)
        check_tensors((DTYPE_NAME[x.dtype],), y=yh, device=True)
    if launch is not None:
        launch(xh, w, w if bias is None else bias, yh)
    return yh.permute(0, 3, 1, 2)


def _nhwc_plan(x, xh, w, bias, stride, padding, dilation, groups, OY, OX, vec, CB, PB):
    check_tensors(x=xh, w=w, bias=bias, device=True)
    s = layer(x.shape, w.shape, stride, padding, dilation, groups, None if bias is None else bias.shape)
    check_plane_sizes(s)
    if not nhwc_applies(s):
        raise ValueError(f"conv2d_depthwise_nhwc takes one map per channel (groups == C == M; here {s.groups} groups, "
                         f"{s.C} channels, {s.M} maps) and masks of at most {DEPTHWISE_MAX_TAPS} taps "
                         f"(here {s.K}x{s.Kw}): use general.conv2d_general")
    cfg = nhwc_config(s, x.dtype)
    OY, OX = int(OY or cfg["OY"]), int(OX or cfg["OX"])
    v = nhwc_vec(s, x, vec or cfg["vec"])
    CB, PB, shared = _block(s, v, CB, PB or cfg["PB"])
    if CB * PB > 1024 or shared > SHARED_DEFAULT_MAX:
        raise ValueError(f"block of CB={CB} lanes x PB={PB} patches, {shared:,} bytes of masks: at most 1,024 "
                         "threads and 48 KB: lower CB or PB")
    if s.outputs == 0:
        return s, None
    patches = s.B * ceil_div(s.Ho, OY) * ceil_div(s.Wo, OX)
    grid = (ceil_div(patches, PB), ceil_div(ceil_div(s.C, v), CB))
    if grid[0] > GRID_X_MAX or grid[1] > GRID_YZ_MAX:
        raise ValueError(f"grid {grid}: over the grid's limits: raise PB, OY or OX")
    defines = {"KH": s.K, "KW": s.Kw, "SH": s.stride, "SW": s.stride_w, "DH": s.dilation, "DW": s.dilation_w,
               "OY": OY, "OX": OX, "VEC": v}
    return s, Launch(NHWC_FILE, "depthwise_nhwc" + suffix(x.dtype), defines,
                     (s.B, s.C, s.H, s.W, s.Ho, s.Wo, s.padding, s.padding_w, int(bias is not None), CB),
                     grid=grid, block=(CB * PB,), shared=shared)


DEPTHWISE = Impl("depthwise (input tile in shared, column strips)", conv2d_depthwise, "conv2d", depthwise_applies,
                 any_layer=True, key="depthwise", bias=True)
DEPTHWISE_FP16 = Impl("depthwise fp16 (input tile in shared, column strips)", conv2d_depthwise, "conv2d_fp16",
                      depthwise_applies, any_layer=True, key="depthwise_fp16", bias=True)
#: x and y channels_last (an NCHW x converted in the call); the dispatcher routes a channels_last x
#: of a depthwise layer here.
DEPTHWISE_NHWC = Impl("depthwise NHWC (channels_last)", conv2d_depthwise_nhwc, "conv2d", nhwc_applies,
                      any_layer=True, key="depthwise_nhwc", layouts=("channels_last",), out_layout="channels_last",
                      bias=True)
DEPTHWISE_NHWC_FP16 = Impl("depthwise NHWC fp16 (channels_last)", conv2d_depthwise_nhwc, "conv2d_fp16", nhwc_applies,
                           any_layer=True, key="depthwise_nhwc_fp16", layouts=("channels_last",),
                           out_layout="channels_last", bias=True)
#: dE/dX of a stride-1 depthwise layer (MobileNet's, ConvNeXt's) as the depthwise forward of dy.
DEPTHWISE_DX = Impl("depthwise dX (forward of the flipped mask)", conv2d_depthwise_dx, "conv2d_dx",
                    depthwise_dx_applies, any_layer=True, key="depthwise_dx", dtypes=("fp32", "fp16"))
#: Their tunables default to None and are resolved by the launchers (depthwise_config,
#: nhwc_config), so config() is empty.
IMPLEMENTATIONS: tuple[Impl, ...] = (DEPTHWISE, DEPTHWISE_FP16, DEPTHWISE_NHWC, DEPTHWISE_NHWC_FP16, DEPTHWISE_DX)
