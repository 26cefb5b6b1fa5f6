"""Chapter 9: depthwise convolution on channels-last tensors, by
kernels/09_general/conv2d_depthwise_nhwc.cu (the NCHW kernel is conv2d_depthwise in general.py).

    conv2d_depthwise_nhwc(x, w, y=None, *, stride=1, padding=0, dilation=1, groups=1, bias=None,
                          OY=, OX=, vec=, CB=, PB=) -> y

x: (B, C, H, W) in torch.channels_last (its memory is (B, H, W, C)); y the same layout, (B, C, Ho, Wo);
w (C, 1, Kh, Kw) contiguous, bias (C,) or None; float32 or float16 (half in and out, float sums);
groups == C == M (one map per channel: nhwc_applies). stride, padding, dilation as torch takes them.
DEPTHWISE_NHWC, DEPTHWISE_NHWC_FP16: its Impl records (benchmarks/depthwise_layers.py measures them).
"""
from __future__ import annotations

import torch

from .._limits import GRID_X_MAX, GRID_YZ_MAX, SHARED_DEFAULT_MAX
from . import Impl, ceil_div, new_output
from ._kernels import module
from .general import DEPTHWISE_MAX_TAPS, Geometry, _check_in, _check_plane_sizes, _suffix, geometry

NHWC_FILE = "kernels/09_general/conv2d_depthwise_nhwc.cu"
THREADS = 256       # threads a block aims at: CB lanes x PB patches


def nhwc_applies(g: Geometry) -> bool:
    """One map per channel (groups == C == M) and a mask of at most DEPTHWISE_MAX_TAPS taps."""
    return g.groups == g.C == g.M and g.Kh * g.Kw <= DEPTHWISE_MAX_TAPS


def nhwc_vec(g: Geometry, x: torch.Tensor, vec: int | None = None) -> int:
    """Channels per thread (one load each of x and y): 4 by default (16 bytes of float, 8 of half),
    the largest of vec, vec/2, ... 1 that divides C (every pixel's run of channels then starts
    aligned, given x's storage is)."""
    v = 4 if vec is None else int(vec)
    if v not in (1, 2, 4, 8):
        raise ValueError(f"vec={vec}: 1, 2, 4 or 8 channels per thread")
    while v > 1 and (g.C % v or x.data_ptr() % (v * x.element_size())):
        v //= 2
    return v


def nhwc_config(g: Geometry, dtype: torch.dtype = torch.float32) -> dict:
    """Default tunables: an OY x OX patch per thread, 2 x 4 for masks up to 3 rows (24 loads per 8
    outputs at 3x3) in float32 and 2 x 2 in float16, 4 x 2 for taller masks (80 per 8 at 7x7, fewer
    rows re-read by the next patch down) with PB=16 patches a block; vec=4 channels a thread.
    From benchmarks/depthwise_layers.py on an H200: half's 2 x 2 patch was the fastest on the 3x3
    layers of 14x14 maps and at stride 2 (where 2 x 4 fell behind torch), and PB=16 the fastest
    on the 7x7 layers in both dtypes (PB left out: THREADS / CB, more patches a block)."""
    if g.Kh <= 3:
        OY, OX = (2, 2) if dtype == torch.float16 else (2, 4)
        return {"OY": OY, "OX": OX, "vec": 4, "PB": None}
    return {"OY": 4, "OX": 2, "vec": 4, "PB": 16}


def _block(g: Geometry, vec: int, CB: int | None, PB: int | None) -> tuple:
    """(CB, PB, shared bytes): CB lanes of vec channels (the C/vec of them in as few groups of at
    most 32 as it takes, split evenly, and fewer while the masks are over 48 KB), PB patches."""
    cv = ceil_div(g.C, vec)
    if CB is None:
        CB = ceil_div(cv, ceil_div(cv, 32))
        while CB > 1 and g.Kh * g.Kw * CB * vec * 4 > SHARED_DEFAULT_MAX:
            CB = ceil_div(CB, 2)
    if PB is None:
        PB = max(1, THREADS // CB)
    return CB, PB, g.Kh * g.Kw * CB * vec * 4


def conv2d_depthwise_nhwc(x, w, y=None, *, stride=1, padding=0, dilation=1, groups: int = 1, bias=None,
                          OY: int | None = None, OX: int | None = None, vec: int | None = None,
                          CB: int | None = None, PB: int | None = None):
    """y = conv2d(x, w, bias, groups=C) on channels-last x and y: OY x OX outputs of vec channels a
    thread, the block's masks in shared memory. Compiled per mask size, stride, dilation, OY, OX, vec."""
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        raise ValueError(f"x must be a (B, C, H, W) tensor, got {getattr(x, 'shape', type(x).__name__)}")
    if not x.is_contiguous(memory_format=torch.channels_last):
        raise ValueError("x must be channels-last: pass x.to(memory_format=torch.channels_last), "
                         "or use general.conv2d_depthwise for NCHW")
    xh = x.permute(0, 2, 3, 1)                  # (B, H, W, C): contiguous, the memory the kernel reads
    _check_in(xh, "x")
    _check_in(w, "w", x.dtype)
    if bias is not None:
        _check_in(bias, "bias", x.dtype)
    g = geometry(x.shape, w.shape, stride, padding, dilation, groups, None if bias is None else bias.shape)
    _check_plane_sizes(g)
    if not nhwc_applies(g):
        raise ValueError(f"conv2d_depthwise_nhwc takes one map per channel (groups == C == M; here {g.groups} groups, "
                         f"{g.C} channels, {g.M} maps) and masks of at most {DEPTHWISE_MAX_TAPS} taps "
                         f"(here {g.Kh}x{g.Kw}): use general.conv2d_general")
    cfg = nhwc_config(g, x.dtype)
    OY, OX = int(OY or cfg["OY"]), int(OX or cfg["OX"])
    v = nhwc_vec(g, x, vec or cfg["vec"])
    CB, PB, shared = _block(g, v, CB, PB or cfg["PB"])
    if CB * PB > 1024 or shared > SHARED_DEFAULT_MAX:
        raise ValueError(f"block of CB={CB} lanes x PB={PB} patches, {shared:,} bytes of masks: at most 1,024 "
                         "threads and 48 KB: lower CB or PB")
    shape = (g.B, g.Ho, g.Wo, g.M)
    if y is None:
        yh = new_output(shape, x)
    else:
        if tuple(y.shape) != (g.B, g.M, g.Ho, g.Wo) or not y.is_contiguous(memory_format=torch.channels_last):
            raise ValueError(f"y must be a channels-last {(g.B, g.M, g.Ho, g.Wo)} tensor, got {tuple(y.shape)}")
        yh = y.permute(0, 2, 3, 1)
        _check_in(yh, "y", x.dtype)
    if yh.numel():
        patches = g.B * ceil_div(g.Ho, OY) * ceil_div(g.Wo, OX)
        grid = (ceil_div(patches, PB), ceil_div(ceil_div(g.C, v), CB))
        if grid[0] > GRID_X_MAX or grid[1] > GRID_YZ_MAX:
            raise ValueError(f"grid {grid}: over the grid's limits: raise PB, OY or OX")
        defines = {"KH": g.Kh, "KW": g.Kw, "SH": g.sh, "SW": g.sw, "DH": g.dh, "DW": g.dw, "OY": OY, "OX": OX,
                   "VEC": v}
        kern = module(NHWC_FILE, defines).kernel("depthwise_nhwc" + _suffix(x.dtype))
        kern(xh, w, w if bias is None else bias, yh, g.B, g.C, g.H, g.W, g.Ho, g.Wo, g.ph, g.pw,
             int(bias is not None), CB, grid=(*grid, 1), block=(CB * PB, 1, 1), shared=shared)
    return yh.permute(0, 3, 1, 2)


def _takes(shape) -> bool:
    """A 2D depthwise layer (groups == C == M) whose mask has at most DEPTHWISE_MAX_TAPS taps."""
    from .general import workload_geometry

    return getattr(shape, "D", None) is None and nhwc_applies(workload_geometry(shape))


#: channels_last x only (measure.run(..., layout="channels_last")); the drop-in dispatch.conv2d
#: routes a channels_last x of a depthwise layer here.
DEPTHWISE_NHWC = Impl("depthwise NHWC (channels_last)", conv2d_depthwise_nhwc, "conv2d", _takes, any_layer=True)
DEPTHWISE_NHWC_FP16 = Impl("depthwise NHWC fp16 (channels_last)", conv2d_depthwise_nhwc, "conv2d_fp16", _takes,
                           any_layer=True)
#: The module's implementations, by the names the figures use. Their tunables default to None and
#: are resolved by the launcher (nhwc_config), so config() is empty.
IMPLEMENTATIONS: tuple[Impl, ...] = (DEPTHWISE_NHWC, DEPTHWISE_NHWC_FP16)
