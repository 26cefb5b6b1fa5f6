"""Chapter 11 launcher: fp16 convolution on Hopper's warpgroup MMA fed by the tensor memory
accelerator (kernels/11_hopper/conv2d_wgmma.cu; the wgmma / TMA / mbarrier primitives are in
kernels/11_hopper/hopper.cuh).

- conv2d_wgmma(x, w, y=None, *, stride=1, padding=0, dilation=1, groups=1, bias=None, relu=False,
  **tunables): half in, half out, float sums rounded once; x NCHW or channels_last (an NCHW x is
  converted inside the call, in its time); the result channels_last, logical shape (B, M, Ho, Wo).
  Stride 1, dilation 1, no groups, C and M multiples of 8 (WGMMA.applies says which layers).
- wgmma_config(shape): the tile (BN maps, BW x 128/BW pixels, STAGES) a layer gets.
- WGMMA: the Impl record.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from .. import runtime
from .._limits import GRID_X_MAX, INT32_MAX
from ..workloads import Workload
from . import Impl, ceil_div
from ._kernels import module_ref, remember
from .shapes import layer
from .tensor_core import _channels_last_out, _check_halves

FILE = "kernels/11_hopper/conv2d_wgmma.cu"
TUNABLES = ("BN", "BW", "STAGES")
PIXELS = 128                          # a block's output pixels: 64 per consumer warpgroup
BK = 64                               # channels per stage
THREADS = 384                         # a producer warpgroup and two consumers
SHARED_OPTIN_MAX = 227 * 1024        # a block's opt-in maximum on an H100/H200
STATIC_SHARED = 1024                 # ptxas: the kernel's static shared memory (its mbarriers, 1024-aligned)


def shared_bytes(BN: int, STAGES: int, **_) -> int:
    """The dynamic shared memory a block asks for: STAGES stages of the A box (128 pixels x 64
    channels) and the B box (BN maps x 64 channels), and 1 KB to align the ring to 1024 bytes."""
    return STAGES * (PIXELS + BN) * BK * 2 + 1024


def wgmma_config(shape) -> dict:
    """BN: 256 maps when the layer has that many and its tiles fill the GPU twice over, else 128
    (64 for a layer of at most 64 maps); BW: 16 pixels a row (8 rows) on maps of 16 or more
    columns, else 8 (16 rows); the deepest ring that fits."""
    BW = 16 if shape.Wo >= 16 else 8
    tiles = shape.B * ceil_div(shape.Ho, PIXELS // BW) * ceil_div(shape.Wo, BW)
    BN = 64 if shape.M <= 64 else 256 if shape.M >= 256 and tiles * ceil_div(shape.M, 256) >= 2 * 132 else 128
    stages = max(s for s in range(2, 9) if shared_bytes(BN, s) + STATIC_SHARED <= SHARED_OPTIN_MAX)
    return dict(BN=BN, BW=BW, STAGES=stages)


class _Plan(NamedTuple):
    out_shape: tuple
    defines: dict
    scalars: tuple
    grid: tuple
    shared: int


def _plan(x_shape, w_shape, stride, padding, dilation, groups, tunables) -> _Plan:
    s = layer(x_shape, w_shape, stride, padding, dilation, groups)
    why = _refuses(s)
    if why:
        raise ValueError(f"conv2d_wgmma: {why}")
    bad = [k for k in tunables if k not in TUNABLES]
    if bad:
        raise TypeError(f"conv2d_wgmma got unknown tunables {bad}; it takes {', '.join(TUNABLES)}")
    t = {**wgmma_config(s), **{k: int(v) for k, v in tunables.items() if v is not None}}
    if t["BN"] not in (64, 128, 256) or t["BW"] not in (8, 16, 32) or not 2 <= t["STAGES"] <= 8:
        raise ValueError(f"conv2d_wgmma tunables {t}: BN 64, 128 or 256; BW 8, 16 or 32; STAGES 2..8")
    smem = shared_bytes(**t)
    if smem + STATIC_SHARED > SHARED_OPTIN_MAX:
        raise ValueError(f"conv2d_wgmma tunables {t}: {smem:,} bytes of shared memory, over {SHARED_OPTIN_MAX:,}")
    tiles_w, tiles_h = ceil_div(s.Wo, t["BW"]), ceil_div(s.Ho, PIXELS // t["BW"])
    blocks = s.B * tiles_w * tiles_h
    if blocks > GRID_X_MAX:
        raise ValueError(f"{blocks:,} blocks: over gridDim.x's limit; split the batch")
    ph, pw = s.padding, s.padding_w     # the end's padding needs nothing: the boxes read zeros past the input
    scalars = (s.C, s.M, s.Ho, s.Wo, s.K, s.Kw, ph, pw)
    return _Plan((s.B, s.M, s.Ho, s.Wo), t, scalars + (tiles_w, tiles_h), (blocks, ceil_div(s.M, t["BN"])), smem)


def _refuses(s: Workload) -> str | None:
    """Why the kernel cannot take the layer (None: it can)."""
    if getattr(s, "D", None) is not None:
        return "a 3D layer"
    if (s.stride, s.stride_w, s.dilation, s.dilation_w, s.groups) != (1, 1, 1, 1, 1):
        return (f"stride {(s.stride, s.stride_w)}, dilation {(s.dilation, s.dilation_w)}, groups {s.groups}: it "
                "takes stride 1, dilation 1, no groups")
    if s.C % 8 or s.M % 8:
        return f"C={s.C}, M={s.M}: both must be multiples of 8 (TMA's 16-byte rows, y's half2 stores)"
    if max(s.B * s.H * s.W * s.C, s.B * s.Ho * s.Wo * s.M) > INT32_MAX:
        return "a tensor over 2^31 elements"
    return None


def conv2d_wgmma(x, w, y=None, *, stride=1, padding=0, dilation=1, groups=1, bias=None, relu=False, **tunables):
    """y = conv2d(x, w, bias) (then ReLU if relu) in fp16 on Hopper's wgmma, fed by TMA; see the
    module's docstring."""
    _check_halves(x=x, w=w, bias=bias)
    if x.dim() != 4 or w.dim() != 4:
        raise ValueError(f"expected x (B, C, H, W) and w (M, C, Kh, Kw), got {tuple(x.shape)} and {tuple(w.shape)}")
    if bias is not None and tuple(bias.shape) != (w.shape[0],):
        raise ValueError(f"bias has shape {tuple(bias.shape)}, expected ({w.shape[0]},)")
    key = (x.shape, w.shape, stride, padding, dilation, groups, tuple(sorted(tunables.items())))
    plan = remember(_plans, key, lambda: _plan(x.shape, w.shape, stride, padding, dilation, groups, tunables),
                    (stride, padding, dilation, groups))
    y = _channels_last_out(y, plan.out_shape, x, "y")
    xn = x.permute(0, 2, 3, 1)
    if not xn.is_contiguous() or xn.data_ptr() % 16:
        xn = xn.contiguous()
    wn = w.permute(0, 2, 3, 1)
    if not wn.is_contiguous() or wn.data_ptr() % 16:
        wn = wn.contiguous()
    t = plan.defines
    x_map = runtime.tensor_map(xn, (1, PIXELS // t["BW"], t["BW"], BK))
    w_map = runtime.tensor_map(wn, (t["BN"], 1, 1, BK))
    kernel = module_ref(FILE, t).get().kernel("conv2d_wgmma")
    b = wn if bias is None else bias.contiguous()
    kernel(y.permute(0, 2, 3, 1), b, x_map, w_map, int(bias is not None), int(bool(relu)), *plan.scalars,
           grid=plan.grid, block=(THREADS, 1, 1), shared=plan.shared,
           max_shared=SHARED_OPTIN_MAX)
    return y


_plans: dict = {}


def runs_here() -> bool:
    """wgmma needs an sm_90 GPU (H100, H200); the emulator runs it too."""
    dev = runtime.device()
    return dev.backend != "cuda" or tuple(dev.cc) == (9, 0)


WGMMA = Impl("wgmma + TMA implicit GEMM (NHWC)", conv2d_wgmma, op="conv2d_fp16",
             applies=lambda s: _refuses(s) is None and runs_here(), config=wgmma_config, any_layer=True, key="wgmma")
IMPLEMENTATIONS: tuple[Impl, ...] = (WGMMA,)
