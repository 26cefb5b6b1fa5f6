"""Chapter 11 launcher: fp16 convolution on Hopper's warpgroup MMA fed by the tensor memory
accelerator (kernels/11_hopper/conv2d_wgmma.cu; the wgmma / TMA / mbarrier primitives are in
kernels/11_hopper/hopper.cuh).

- conv2d_wgmma(x, w, y=None, *, stride=1, padding=0, dilation=1, groups=1, bias=None, relu=False,
  **tunables): half in, half out, float sums rounded once; x NCHW or channels_last (an NCHW x is
  converted inside the call, in its time); the result channels_last, logical shape (B, M, Ho, Wo).
  Stride 1, dilation 1, no groups, C and M multiples of 8 (WGMMA.applies says which layers).
- wgmma_config(shape): the tile a layer gets: BN maps, a box of BW x BH pixels x BI images
  (box_shape), STAGES.
- WGMMA: the Impl record.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from ..gpu import runtime
from ..gpu._limits import GRID_X_MAX, INT32_MAX
from ..measuring.workloads import Workload
from . import Impl, ceil_div
from ._kernels import module_ref, remember, sm_count
from .shapes import check_tensors, layer
from .tensor_core import channels_last_out

FILE = "kernels/11_hopper/conv2d_wgmma.cu"
TUNABLES = ("BN", "STAGES", "RINGS", "BW", "BH", "BI")
ROWS = 128                            # pixel rows of the two consumer warpgroups: one tile, or one each (RINGS=2)
BK = 64                               # channels per stage
THREADS = 384                         # a producer warpgroup and two consumers
BLOCK = (THREADS, 1, 1)               # one tuple: a repeated launch's grid and block checked once
SHARED_OPTIN_MAX = 227 * 1024         # a block's opt-in maximum on an H100/H200 (static shared included)
MAX_STAGES = 6


def shared_bytes(BN: int, STAGES: int, RINGS: int = 1, **_) -> int:
    """The dynamic shared memory a block asks for: RINGS rings of STAGES stages of the A box (the
    tile's 128/RINGS pixel rows x 64 channels) and the B box (BN maps x 64 channels), the two
    warpgroups' staging tiles (64 pixels x BN halves + 16 bytes each), and 1 KB to align the rings
    to 1024 bytes."""
    return RINGS * STAGES * (ROWS // RINGS + BN) * BK * 2 + 2 * 64 * (2 * BN + 16) + 1024


def static_shared(STAGES: int, RINGS: int = 1, **_) -> int:
    """The kernel's own __shared__ bytes: its mbarriers, full and empty, 8 bytes a stage each."""
    return 16 * RINGS * STAGES


def box_shape(Ho: int, Wo: int, B: int, rows: int = ROWS, max_w: int = 256, max_h: int = 256) -> tuple:
    """(BW, BH, BI): the pixels a tile covers, BW columns x BH rows x BI images <= rows, chosen
    for the fewest tiles, then the most rows filled, then the wider box (longer contiguous runs in
    y). The same pixels of several images share a box: with 32 images, 8 x 1 x 16 on a 56x56 or a
    7x7 map (14 tiles of 112 rows on 7x7), 14 x 3 x 3 on 14x14. max_w, max_h: the most columns and
    rows a box may have (a strided layer's box spans stride times as many of the input)."""
    best = None
    for BW in sorted({min(Wo, rows, max_w), *(b for b in (8, 16, 32, 64) if b <= min(rows, max_w))}):
        for BH in range(1, min(rows // BW, max_h) + 1):
            BI = min(B, rows // (BW * BH))
            tiles = ceil_div(Wo, BW) * ceil_div(Ho, BH) * ceil_div(B, BI)
            key = (tiles, -BW * BH * BI, -BW)
            if best is None or key < best[0]:
                best = (key, (BW, BH, BI))
    return best[1]


def wgmma_config(shape, sms: int | None = None) -> dict:
    """The box by box_shape; BN (maps per tile) by the tiles it makes: 256 where a layer of 256 maps
    or more has at least two tiles per SM of that width, 64 for a layer of at most 64 maps or one
    whose 128-wide tiles would leave half the SMs idle, else 128; one ring, the deepest (up to
    MAX_STAGES) that fits. From benchmarks/hopper_layers.py on an H100 (every BN, both ring forms):
    BN=256 was the fastest on the VGG layer and ResNet's 1x1 expansion (392 and 784 tiles of 128
    pixels), BN=64 on ResNet's 7x7 maps (56 tiles at 128), BN=128 elsewhere; two rings (ping-pong)
    won only on one 1x1 layer, by 2%."""
    sms = sms or sm_count()
    rings = 1
    BW, BH, BI = box_shape(shape.Ho, shape.Wo, shape.B, ROWS // rings)
    pixel_tiles = ceil_div(shape.Wo, BW) * ceil_div(shape.Ho, BH) * ceil_div(shape.B, BI)
    if shape.M <= 64 or pixel_tiles * ceil_div(shape.M, 128) < sms // 2:
        BN = 64
    elif shape.M >= 256 and pixel_tiles * ceil_div(shape.M, 256) >= 2 * sms:
        BN = 256
    else:
        BN = 128
    return dict(BN=BN, STAGES=deepest(BN, rings), RINGS=rings, BW=BW, BH=BH, BI=BI)


def deepest(BN: int, rings: int) -> int:
    """The most stages (up to MAX_STAGES) whose rings fit in shared memory."""
    return max([s for s in range(2, MAX_STAGES + 1)
                if shared_bytes(BN, s, rings) + static_shared(s, rings) <= SHARED_OPTIN_MAX], default=2)


class _Plan(NamedTuple):
    out_shape: tuple
    defines: dict
    box: tuple                        # the x map's box, outermost first (BI, BH, BW, 64)
    scalars: tuple
    grid: tuple
    shared: int


def _plan(x_shape, w_shape, stride, padding, dilation, groups, tunables) -> _Plan:
    s = layer(x_shape, w_shape, stride, padding, dilation, groups)
    why = refuses(s)
    if why:
        raise ValueError(f"conv2d_wgmma: {why}")
    bad = [k for k in tunables if k not in TUNABLES]
    if bad:
        raise TypeError(f"conv2d_wgmma got unknown tunables {bad}; it takes {', '.join(TUNABLES)}")
    t = {**wgmma_config(s), **{k: int(v) for k, v in tunables.items() if v is not None}}
    if "RINGS" in tunables and not {"BW", "BH", "BI"} & set(tunables):      # the box for the rings' tile
        t.update(zip(("BW", "BH", "BI"), box_shape(s.Ho, s.Wo, s.B, ROWS // t["RINGS"])))
    if "STAGES" not in tunables:                  # the deepest ring that fits the tile given
        t["STAGES"] = deepest(t["BN"], t["RINGS"])
    BW, BH, BI, rings = t["BW"], t["BH"], t["BI"], t["RINGS"]
    if (t["BN"] not in (64, 128, 256) or not 2 <= t["STAGES"] <= 8 or rings not in (1, 2) or min(BW, BH, BI) < 1
            or BW * BH * BI > ROWS // rings):
        raise ValueError(f"conv2d_wgmma tunables {t}: BN 64, 128 or 256; STAGES 2..8; RINGS 1 or 2; "
                         f"BW*BH*BI <= {ROWS}/RINGS")
    smem = shared_bytes(**t)
    if smem + static_shared(**t) > SHARED_OPTIN_MAX:
        raise ValueError(f"conv2d_wgmma tunables {t}: {smem:,} bytes of shared memory, over {SHARED_OPTIN_MAX:,}")
    tiles = ceil_div(s.Wo, BW) * ceil_div(s.Ho, BH) * ceil_div(s.B, BI) * ceil_div(s.M, t["BN"])
    scalars = (s.B, s.C, s.M, s.Ho, s.Wo, s.K, s.Kw, s.padding, s.padding_w, BW, BH, BI, BW * BH * BI * BK * 2)
    # persistent: one block per SM, each taking tiles in turn (the end's padding needs nothing: the
    # boxes read zeros past the input)
    return _Plan((s.B, s.M, s.Ho, s.Wo), {"BN": t["BN"], "STAGES": t["STAGES"], "RINGS": rings}, (BI, BH, BW, BK),
                 scalars, (min(ceil_div(tiles, rings), sm_count()), 1, 1), smem)


def refuses(s: Workload) -> str | None:
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
    check_tensors(("fp16",), layout=None, x=x, w=w, bias=bias)
    if x.dim() != 4 or w.dim() != 4:
        raise ValueError(f"expected x (B, C, H, W) and w (M, C, Kh, Kw), got {tuple(x.shape)} and {tuple(w.shape)}")
    if bias is not None and tuple(bias.shape) != (w.shape[0],):
        raise ValueError(f"bias has shape {tuple(bias.shape)}, expected ({w.shape[0]},)")
    key = (x.shape, w.shape, stride, padding, dilation, groups, tuple(sorted(tunables.items())))
    plan = remember(_plans, key, lambda: _plan(x.shape, w.shape, stride, padding, dilation, groups, tunables),
                    (stride, padding, dilation, groups))
    y = channels_last_out(y, plan.out_shape, x, "y")
    xn = x.permute(0, 2, 3, 1)
    if not xn.is_contiguous() or xn.data_ptr() % 16:
        xn = xn.contiguous()
    wn = w.permute(0, 2, 3, 1)
    if not wn.is_contiguous() or wn.data_ptr() % 16:
        wn = wn.contiguous()
    x_map = runtime.tensor_map(xn, plan.box)
    w_map = runtime.tensor_map(wn, (plan.defines["BN"], 1, 1, BK))
    kernel = module_ref(FILE, plan.defines).get().kernel("conv2d_wgmma")
    b = wn if bias is None else bias.contiguous()
    kernel(y.permute(0, 2, 3, 1), b, x_map, w_map, int(bias is not None), int(bool(relu)), *plan.scalars,
           grid=plan.grid, block=BLOCK, shared=plan.shared, max_shared=SHARED_OPTIN_MAX)
    return y


_plans: dict = {}


def runs_here() -> bool:
    """wgmma needs an sm_90 GPU (H100, H200); the emulator runs it too."""
    dev = runtime.device()
    return dev.backend != "cuda" or tuple(dev.cc) == (9, 0)


WGMMA = Impl("wgmma + TMA implicit GEMM (NHWC)", conv2d_wgmma, op="conv2d_fp16",
             applies=lambda s: refuses(s) is None and runs_here(), config=wgmma_config, any_layer=True, key="wgmma",
             layouts=("channels_last",), out_layout="channels_last", bias=True, activations=("relu",))
IMPLEMENTATIONS: tuple[Impl, ...] = (WGMMA,)
