"""Chapter 9 launcher: fp16 convolution on tensor cores through mma.sync, an NHWC implicit GEMM
(kernels/09_general/conv2d_mma.cu; the ldmatrix / mma.sync / cp.async primitives are in
kernels/09_general/tensor_core.cuh).

- conv2d_mma(x, w, y=None, *, stride, padding, dilation, groups, bias, **tunables): half in, half
  out, float sums. x NCHW or channels_last; the result is channels_last (logical shape
  (B, M, Ho, Wo), as torch's). Any stride, padding and dilation (ints or pairs); groups: one GEMM
  per group, the group part of the block's index (depthwise layers, groups == C > 1, are refused:
  one channel a group would be padded to 8, and convlab.ops.depthwise has kernels of their own).
- conv2d_mma_dx(dy, w, dx=None, *, stride, padding, input_size, dilation, groups, **tunables): the
  data gradient dE/dX in fp16 by the same kernel: the forward of dy with the flipped mask,
  transposed per group (C/groups maps of M/groups channels). Stride 1: one convolution, padding
  dilation*(K-1) - padding. A strided layer: one such convolution per stride phase (dx's pixels
  (ih, iw) of one residue mod the stride, dx_phases), each with the taps that reach that phase
  and writing every stride-th pixel of dx; a phase no tap reaches is zero.
- conv2d_mma_dw(x, dy, dw=None, *, stride, padding, kernel_size, dilation, groups, **tunables): the
  weight gradient dE/dW in fp16 (kernels/09_general/conv2d_mma_dw.cu): per group dy^T times x's
  windows, fp32 sums split over the pixels, added in order and rounded once; dw channels_last.
- mma_config(shape): the tile a layer gets (tunables BM, BN, BK, WARPS_M, WARPS_N, STAGES) and its
  SPLIT_K (K split over that many blocks when the output tiles alone would leave SMs idle), from
  preference(shape) (the PREFERENCE tuples); the one place to change the choice. mma_dx_config:
  the same for a layer's dX; mma_dw_config: dW's tile and split. CANDIDATES: the tiles
  benchmarks/tensor_core_layers.py times.
- MMA.applies (and MMA_DX's, MMA_DW's): a 2D layer, not depthwise, Kh + Kw <= 31, on sm_80 or
  newer (runs_here; the emulator runs it too).
- gemm_shape(shape): a layer's GEMM per group, (P, M/groups, K, C/groups, groups).
- check_mma_tunables(...), check_dw_tunables(...): the kernels' static_asserts and shared memory,
  as a Python error.
- channels_last_out(y, shape, like, name): the 16-bit launchers' channels_last output (chapter 11's
  wgmma and Hopper launchers share it).
- MMA: the Impl record, "mma.sync implicit GEMM (NHWC)"; MMA_DX, op "conv2d_dx_fp16"; MMA_DW, op
  "conv2d_dw_fp16".

A group's channels not a multiple of 8 (an RGB stem, ResNeXt's 4 channels a group; for dX, the
maps a group): the input and the mask are padded with zero channels up to a multiple of 8, per
group (one copy, in the call's time; from an NCHW input it is the same one copy that converts it
to NHWC). The kernel then keeps a single loader, 16-byte cp.async copies of 8 channels; the extra
zero channels cost tensor-core work (7x7 stem: K = 392 instead of 147), not memory traffic beyond
that one copy.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from ..gpu import runtime
from ..gpu._limits import GRID_X_MAX, INT32_MAX, SHARED_DEFAULT_MAX
from ..measuring.workloads import Workload
from . import Impl, ceil_div, new_output
from ._kernels import Launch, remember
from .shapes import check_tensors

MMA_FILE = "kernels/09_general/conv2d_mma.cu"
DW_FILE = "kernels/09_general/conv2d_mma_dw.cu"
TILE = ("BM", "BN", "BK", "WARPS_M", "WARPS_N", "STAGES")      # compile-time (#defines)
TUNABLES = TILE + ("SPLIT_K",)                                # SPLIT_K: gridDim.y, at run time
MAX_SPLIT_K = 8
MAX_TAP_BITS = 31                    # Kh + Kw: a pixel's tap rows and columns share a 32-bit mask, bit 31 spare
MIN_STEPS_PER_SPLIT = 8              # a block's share of K: enough BK steps to fill and drain the pipeline
#: No split while the unsplit grid fills this share of the SMs' BLOCKS_PER_SM slots: on resnet_3x3_7
#: (104 blocks of 128x64 on 132 SMs) the split in two took 0.043 ms, the unsplit grid 0.039
#: (tensor_core_layers_NVIDIA_H200.csv): the partials' fp32 traffic and the reducing kernel cost
#: more than the idle fifth of the SMs.
SPLIT_BELOW = 0.75
REDUCE_THREADS = 256
SHARED_OPTIN_MAX = 227 * 1024        # an sm_80/sm_90 block's opt-in maximum (A100: 163 KB; checked by the driver)

#: Block tiles the benchmark tries on each layer (name -> tunables); mma_config picks among them.
CANDIDATES: dict[str, dict] = {
    "128x128x32 s4 (2x2 warps)": dict(BM=128, BN=128, BK=32, WARPS_M=2, WARPS_N=2, STAGES=4),
    "128x128x32 s3 (2x2 warps)": dict(BM=128, BN=128, BK=32, WARPS_M=2, WARPS_N=2, STAGES=3),
    "128x128x64 s3 (2x2 warps)": dict(BM=128, BN=128, BK=64, WARPS_M=2, WARPS_N=2, STAGES=3),
    "256x128x32 s3 (4x2 warps)": dict(BM=256, BN=128, BK=32, WARPS_M=4, WARPS_N=2, STAGES=3),
    "128x256x32 s3 (2x4 warps)": dict(BM=128, BN=256, BK=32, WARPS_M=2, WARPS_N=4, STAGES=3),
    "128x64x32 s4 (2x2 warps)": dict(BM=128, BN=64, BK=32, WARPS_M=2, WARPS_N=2, STAGES=4),
    "128x64x64 s3 (2x2 warps)": dict(BM=128, BN=64, BK=64, WARPS_M=2, WARPS_N=2, STAGES=3),
    "256x64x32 s4 (4x1 warps)": dict(BM=256, BN=64, BK=32, WARPS_M=4, WARPS_N=1, STAGES=4),
    "64x128x32 s4 (2x2 warps)": dict(BM=64, BN=128, BK=32, WARPS_M=2, WARPS_N=2, STAGES=4),
    "64x64x32 s4 (2x2 warps)": dict(BM=64, BN=64, BK=32, WARPS_M=2, WARPS_N=2, STAGES=4),
    # 64x64 warp tiles 64 deep: 8 ldmatrix per 32 mma.sync (a 64x32 warp tile: 6 per 16), and
    # fewer loop instructions per mma.sync in the SASS; under 255 registers, no spills (ptxas)
    "128x64x64 s3 (2x1 warps)": dict(BM=128, BN=64, BK=64, WARPS_M=2, WARPS_N=1, STAGES=3),
    "256x128x64 s3 (4x2 warps)": dict(BM=256, BN=128, BK=64, WARPS_M=4, WARPS_N=2, STAGES=3),
    "128x256x64 s3 (2x4 warps)": dict(BM=128, BN=256, BK=64, WARPS_M=2, WARPS_N=4, STAGES=3),
    # narrow tiles for grouped layers of few maps a group (ResNeXt: 4 or 8): 64 threads, so a pass of
    # 16-byte copies fills 16 rows and BN may be 16
    "128x32x32 s4 (2x1 warps)": dict(BM=128, BN=32, BK=32, WARPS_M=2, WARPS_N=1, STAGES=4),
    "64x32x32 s4 (2x1 warps)": dict(BM=64, BN=32, BK=32, WARPS_M=2, WARPS_N=1, STAGES=4),
    "128x16x32 s4 (2x1 warps)": dict(BM=128, BN=16, BK=32, WARPS_M=2, WARPS_N=1, STAGES=4),
    "64x16x32 s4 (2x1 warps)": dict(BM=64, BN=16, BK=32, WARPS_M=2, WARPS_N=1, STAGES=4),
}

#: mma_config's preferences, best first, by kind of layer; it takes the first tile whose grid, split
#: along K if need be, fills SPLIT_BELOW of the GPU's BLOCKS_PER_SM slots, else the one with the most
#: blocks. From benchmarks/tensor_core_layers.py on an H200 (benchmarks/results/
#: tensor_core_layers_NVIDIA_H200.csv, every candidate on each layer): 128x64x64 s3 was the fastest
#: tile on the 3x3 layers from 56x56 maps down to 7x7 (unsplit there) and on the 1x1 layers with a
#: reduction of 256 or more: half the accumulators of a 128x128 tile, so fewer registers and more
#: blocks per SM, and a BK=64 step pays its cp.async issue and barrier once per twice the HMMAs.
PREFERENCE = ("128x64x64 s3 (2x2 warps)", "64x64x32 s4 (2x2 warps)")
#: A reduction of at most 64 (a 1x1 layer from 64 channels) is one or two BK steps: nothing for a
#: deep pipeline to overlap; 64x128x32 s4 was the fastest there, a wide tile of maps (M > 64).
PREFERENCE_SHORT_K = ("64x128x32 s4 (2x2 warps)",) + PREFERENCE
#: Fewer than 8 channels (an RGB stem, padded to 8): 256x64x32 s4 was the fastest, the taller tile
#: re-reads each mask chunk for 256 pixels.
PREFERENCE_FEW_CHANNELS = ("256x64x32 s4 (4x1 warps)",) + PREFERENCE
#: 256 maps or more and enough pixels for BIG_WAVES waves of 128x128 tiles (the VGG layer): the
#: larger tile's reuse wins once the grid is many waves deep; 128x128x32 s3 was the fastest there.
PREFERENCE_BIG = ("128x128x32 s3 (2x2 warps)",) + PREFERENCE
BIG_WAVES = 4
#: Grouped layers of at most 16 or 32 maps a group (ResNeXt's 3x3 layers: 4 or 8): a 64-wide map
#: tile would compute 4 to 16 times the maps the group has, so the tile is as narrow as the group.
#: Chosen by that count, not yet by timing (benchmarks/tensor_core_layers.py --layers
#: resnext_g32_56,resnext_g32_28 times every candidate); BK=32: a group's reduction is short
#: (9 taps x 8 channels = 72), and a 64-deep step would be mostly K's zero-filled tail.
PREFERENCE_NARROW_16 = ("128x16x32 s4 (2x1 warps)", "64x16x32 s4 (2x1 warps)")
PREFERENCE_NARROW_32 = ("128x32x32 s4 (2x1 warps)", "64x32x32 s4 (2x1 warps)")
BLOCKS_PER_SM = 1
SMS = 132                            # H100/H200 SXM; mma_config(shape, sms=...) for another GPU

#: dW: its GEMM per group is small (maps x Kh*Kw*C) and its reduction long (B*Ho*Wo pixels), so it
#: is split over the pixels into enough blocks for DW_BLOCKS_PER_SM a SM, each share at least
#: MIN_DW_STEPS BK steps, at most MAX_DW_SPLIT shares (gridDim.y; the workspace grows with them).
DW_BLOCKS_PER_SM = 2
MIN_DW_STEPS = 8
MAX_DW_SPLIT = 256

_plans: dict = {}
_dx_plans: dict = {}
_dw_plans: dict = {}


class _Gemm(NamedTuple):
    """One run of the kernel: every group's GEMM, and the split-K pass after it."""
    launch: Launch                   # conv2d_mma
    reduce: Launch | None            # conv2d_mma_splitk_reduce, when SPLIT_K > 1
    ws_shape: tuple                  # (SPLIT_K, P, MY)


class _Plan(NamedTuple):
    out_shape: tuple                 # (B, M, Ho, Wo)
    Cg8: int                         # a group's channels after padding to a multiple of 8
    gemm: _Gemm


class _Phase(NamedTuple):
    """One stride phase of dX: dx's pixels (rh + sh*t, rw + sw*u), from the taps of the flipped
    mask rows start_h, start_h + step_h, ... (Jh of them) and columns likewise."""
    rh: int
    rw: int
    rows: tuple                      # (start_h, step_h, Jh) in the flipped mask
    cols: tuple                      # (start_w, step_w, Jw)
    gemm: _Gemm


class _DxPlan(NamedTuple):
    dx_shape: tuple                  # (B, C, H, W)
    Mg8: int                         # a group's maps (dX's channels) after padding to a multiple of 8
    stride: tuple
    phases: tuple                    # _Phase, one per phase some tap reaches
    zero: tuple                      # (rh, rw) of the phases no tap reaches: dx is 0 there


def _pair(v, what: str) -> tuple[int, int]:
    t = (v, v) if isinstance(v, int) else tuple(v)
    if len(t) != 2 or not all(isinstance(i, int) for i in t):
        raise ValueError(f"{what}={v!r}: an int or a pair of ints")
    return int(t[0]), int(t[1])


def shared_bytes(BM: int, BN: int, BK: int, STAGES: int, **_) -> int:
    """Dynamic shared memory of a block: STAGES stages of a BM x BK and a BN x BK half tile, or the
    epilogue's BM x (BN + 8) half tile in the same memory if that is larger."""
    return max(STAGES * (BM + BN) * BK, BM * (BN + 8)) * 2


def check_mma_tunables(BM: int, BN: int, BK: int, WARPS_M: int, WARPS_N: int, STAGES: int, SPLIT_K: int = 1) -> None:
    """The kernel's static_asserts, the opt-in shared-memory limit and SPLIT_K's range, as a ValueError
    before compiling."""
    if not 1 <= SPLIT_K <= MAX_SPLIT_K:
        raise ValueError(f"SPLIT_K={SPLIT_K}: 1 (no split) to {MAX_SPLIT_K}")
    threads = 32 * WARPS_M * WARPS_N
    chunks = BK // 8
    ok = (BK in (16, 32, 64) and WARPS_M >= 1 and WARPS_N >= 1 and STAGES >= 2 and threads <= 1024
          and BM % WARPS_M == 0 and BN % WARPS_N == 0 and (BM // WARPS_M) % 16 == 0 and (BN // WARPS_N) % 16 == 0
          and (threads // chunks) % 8 == 0 and BM % (threads // chunks) == 0 and BN % (threads // chunks) == 0)
    if not ok:
        raise ValueError(f"tile BM={BM} BN={BN} BK={BK} with {WARPS_M}x{WARPS_N} warps, {STAGES} stages does not "
                         "split: BK 16, 32 or 64; warp tiles (BM/WARPS_M, BN/WARPS_N) multiples of 16; the rows one "
                         "pass of 16-byte copies fills (threads / (BK/8)) a multiple of 8 (the swizzle's period) "
                         "that divides BM and BN; STAGES >= 2")
    smem = shared_bytes(BM, BN, BK, STAGES)
    if smem > SHARED_OPTIN_MAX:
        raise ValueError(f"tile BM={BM} BN={BN} BK={BK} x {STAGES} stages needs {smem:,} bytes of shared memory, "
                         f"over the {SHARED_OPTIN_MAX:,} a block may opt in to: fewer stages or a smaller tile")


def _blocks(P: int, M: int, t: dict, groups: int = 1) -> int:
    return ceil_div(P, t["BM"]) * ceil_div(M, t["BN"]) * groups


def split_k(P: int, M: int, K: int, t: dict, sms: int = SMS, groups: int = 1) -> int:
    """SPLIT_K for tile t on `groups` GEMMs of P x M x K: 1 when their output tiles fill SPLIT_BELOW
    of the SMs' BLOCKS_PER_SM slots; else the fewest splits that do, at most MAX_SPLIT_K and each at
    least MIN_STEPS_PER_SPLIT BK steps deep (a split's partial tile costs fp32 traffic, and a short
    share does not amortise the pipeline's fill)."""
    blocks, steps = _blocks(P, M, t, groups), ceil_div(K, t["BK"])
    if blocks >= SPLIT_BELOW * BLOCKS_PER_SM * sms:
        return 1
    want = ceil_div(BLOCKS_PER_SM * sms, blocks)
    return max(1, min(want, MAX_SPLIT_K, steps // MIN_STEPS_PER_SPLIT))


def gemm_shape(shape: Workload) -> tuple:
    """A layer's GEMM per group: (P pixels, maps, K with the channels padded to 8, channels, groups)
    (one group: the layer's own GEMM)."""
    G = shape.groups
    Cg = shape.C // G
    return shape.B * shape.Ho * shape.Wo, shape.M // G, shape.K * shape.Kw * ceil_div(Cg, 8) * 8, Cg, G


def _preference(P: int, M: int, K: int, C: int, G: int, sms: int) -> tuple:
    if G > 1 and M <= 16:
        return PREFERENCE_NARROW_16
    if G > 1 and M <= 32:
        return PREFERENCE_NARROW_32
    if C < 8:
        return PREFERENCE_FEW_CHANNELS
    if K <= 64 and M > 64:
        return PREFERENCE_SHORT_K
    if M >= 256 and _blocks(P, M, CANDIDATES[PREFERENCE_BIG[0]], G) >= BIG_WAVES * sms:
        return PREFERENCE_BIG
    return PREFERENCE


def preference(shape: Workload, sms: int = SMS) -> tuple:
    """The tiles mma_config tries for a layer, best first (the PREFERENCE tuples: which kind of
    layer gets which, and the reason), by its GEMM per group."""
    return _preference(*gemm_shape(shape), sms)


def _config(P: int, M: int, K: int, C: int, G: int, sms: int) -> dict:
    options = [dict(CANDIDATES[n], SPLIT_K=split_k(P, M, K, CANDIDATES[n], sms, G))
               for n in _preference(P, M, K, C, G, sms)]
    for t in options:
        if _blocks(P, M, t, G) * t["SPLIT_K"] >= SPLIT_BELOW * BLOCKS_PER_SM * sms:
            return t
    return max(options, key=lambda t: _blocks(P, M, t, G) * t["SPLIT_K"])


def mma_config(shape: Workload, sms: int = SMS) -> dict:
    """The tunables conv2d_mma uses for a layer when none are passed: from preference(shape), the
    first tile whose grid (every group's tiles), split along K if need be (split_k), fills
    SPLIT_BELOW of the SMs' slots; else the one with the most blocks (7x7 maps: few pixels, where
    even a 128x64 tile leaves SMs idle without a split)."""
    return _config(*gemm_shape(shape), sms)


def _axis_phases(n: int, K: int, s: int, p: int, d: int) -> list:
    """dX along one axis of n input pixels, by residue r mod s: (r, size, taps, padding, dilation).
    dx[r + s*t] = sum over the taps k with (r + p - k*d) % s == 0 of dy[t + (r + p - k*d)/s] * w[k]:
    taps in descending order (the flipped mask) are a forward convolution of dy at stride 1, with
    dilation (k_0 - k_1)*d/s and padding -(r + p - k_0*d)/s (negative where the phase starts past
    dy's first row). taps == (): no tap reaches the phase."""
    out = []
    for r in range(min(s, n)):
        taps = tuple(k for k in range(K - 1, -1, -1) if (r + p - k * d) % s == 0)
        pad = -((r + p - taps[0] * d) // s) if taps else 0
        dil = (taps[0] - taps[1]) * d // s if len(taps) > 1 else 1
        out.append((r, ceil_div(n - r, s), taps, pad, dil))
    return out


def dx_phases(H: int, W: int, K, stride, padding, dilation=1) -> list:
    """The stride phases conv2d_mma_dx runs for an input of H x W: per (rh, rw), dx's pixels
    (rh + sh*t, rw + sw*u), ((rh, Hp, taps_h, pad_h, dil_h), (rw, Wp, taps_w, pad_w, dil_w)), taps
    in the order of the flipped mask; a phase with no taps along an axis is zero. Stride 1: one."""
    (Kh, Kw), (sh, sw), (ph, pw), (dh, dw) = (_pair(v, n) for v, n in ((K, "K"), (stride, "stride"),
                                                                  (padding, "padding"), (dilation, "dilation")))
    return [(a, b) for a in _axis_phases(H, Kh, sh, ph, dh) for b in _axis_phases(W, Kw, sw, pw, dw)]


def _dx_gemm(shape: Workload) -> tuple:
    """dX's GEMM per group on its largest phase: (P, maps = C/groups, K with the channels M/groups
    padded to 8, channels, groups)."""
    G = shape.groups
    Mg8 = ceil_div(shape.M // G, 8) * 8
    (_, Hp, th, _, _), (_, Wp, tw, _, _) = dx_phases(shape.H, shape.W, (shape.K, shape.Kw), (shape.stride, shape.stride_w),
                                                     (shape.padding, shape.padding_w),
                                                     (shape.dilation, shape.dilation_w))[0]
    return shape.B * Hp * Wp, shape.C // G, max(1, len(th) * len(tw)) * Mg8, shape.M // G, G


def mma_dx_config(shape: Workload, sms: int = SMS) -> dict:
    """The tunables conv2d_mma_dx uses for a layer (the forward Workload) when none are passed:
    mma_config's rule on dX's GEMM (its first stride phase, the largest), for every phase."""
    return _config(*_dx_gemm(shape), sms)


def check_dw_tunables(BM: int, BN: int, BK: int, WARPS_M: int, WARPS_N: int, STAGES: int, SPLIT_K: int = 1) -> None:
    """conv2d_mma_dw.cu's static_asserts, its shared memory and SPLIT_K's range, as a ValueError."""
    if not 1 <= SPLIT_K <= MAX_DW_SPLIT:
        raise ValueError(f"SPLIT_K={SPLIT_K}: 1 (no split) to {MAX_DW_SPLIT}")
    ok = (BM in (16, 32, 64, 128) and BN in (16, 32, 64, 128) and BK in (16, 32, 64) and STAGES >= 2
          and WARPS_M >= 1 and WARPS_N >= 1 and 32 * WARPS_M * WARPS_N <= 1024
          and BM % WARPS_M == 0 and BN % WARPS_N == 0 and (BM // WARPS_M) % 16 == 0 and (BN // WARPS_N) % 16 == 0)
    if not ok:
        raise ValueError(f"dW tile BM={BM} BN={BN} BK={BK} with {WARPS_M}x{WARPS_N} warps, {STAGES} stages does not "
                         "split: BM and BN 16, 32, 64 or 128, BK 16, 32 or 64, warp tiles multiples of 16, STAGES >= 2")
    smem = STAGES * BK * (BM + BN) * 2
    if smem > SHARED_OPTIN_MAX:
        raise ValueError(f"dW tile needs {smem:,} bytes of shared memory, over the {SHARED_OPTIN_MAX:,} a block may "
                         "opt in to: fewer stages or a smaller tile")


def _dw_gemm(shape: Workload) -> tuple:
    """dW's GEMM per group: (maps padded to 8, columns Kh*Kw*C/groups padded to 8, pixels, groups)."""
    G = shape.groups
    return (ceil_div(shape.M // G, 8) * 8, shape.K * shape.Kw * ceil_div(shape.C // G, 8) * 8,
            shape.B * shape.Ho * shape.Wo, G)


def mma_dw_config(shape: Workload, sms: int = SMS) -> dict:
    """The tunables conv2d_mma_dw uses for a layer (its forward Workload) when none are passed: maps
    a tile as few as the group has (16, 32, else 64), 64 columns, BK=32 pixels in 4 stages; split
    over the pixels (DW_BLOCKS_PER_SM). By design, not yet timed."""
    M8, N, P, G = _dw_gemm(shape)
    BM = 16 if M8 <= 16 else 32 if M8 <= 32 else 64
    t = dict(BM=BM, BN=64, BK=32, WARPS_M=max(1, BM // 32), WARPS_N=2, STAGES=4)
    tiles = ceil_div(M8, BM) * ceil_div(N, t["BN"]) * G
    want = ceil_div(DW_BLOCKS_PER_SM * sms, tiles)
    t["SPLIT_K"] = max(1, min(want, ceil_div(P, t["BK"]) // MIN_DW_STEPS, MAX_DW_SPLIT))
    return t


def _nhwc(x: torch.Tensor, C8: int, groups: int = 1) -> torch.Tensor:
    """x (B, C, H, W) as an NHWC tensor of groups*C8 channels, each group's C/groups padded with zero
    channels to C8: a view when x is channels_last already (and needs no padding), else one copy."""
    xp = x.permute(0, 2, 3, 1)
    Cg = x.shape[1] // groups
    if C8 != Cg:
        return F.pad(xp.unflatten(3, (groups, Cg)), (0, C8 - Cg)).flatten(3).contiguous()
    if xp.is_contiguous() and xp.data_ptr() % 16 == 0:
        return xp
    return xp.clone(memory_format=torch.contiguous_format)      # cp.async reads 16-byte aligned chunks


def _check_tunables(tunables: dict, who: str) -> None:
    bad = [k for k in tunables if k not in TUNABLES]
    if bad:
        raise TypeError(f"{who} got unknown tunables {bad}; it takes {', '.join(TUNABLES)}")


def _check_groups(C: int, w, groups, what: str) -> None:
    """w (M, C/groups, Kh, Kw) for C channels, M a multiple of groups, and not depthwise."""
    if not isinstance(groups, int) or groups < 1 or int(w.shape[1]) * groups != C or int(w.shape[0]) % groups:
        raise ValueError(f"{what} and w {tuple(w.shape)} with groups={groups}: need w (M, C/groups, Kh, Kw) and M a "
                         "multiple of groups")
    if groups == C > 1:
        raise ValueError(f"groups={groups} == C: a depthwise layer; its one channel a group would be padded to 8 "
                         "(7/8 of the tensor cores' work zeros): use convlab.ops.depthwise")


def channels_last_out(y, shape, like, name: str):
    """A channels_last output of logical shape (N, C, H, W) in like's dtype: the given one, checked
    (dtype, shape, channels_last, 16-byte aligned), or a new one."""
    if y is None:
        B, C, H, W = shape
        return new_output((B, H, W, C), like).permute(0, 3, 1, 2)
    if (y.dtype != like.dtype or tuple(y.shape) != tuple(shape) or not y.permute(0, 2, 3, 1).is_contiguous()
            or y.data_ptr() % 16):
        raise ValueError(f"{name} must be {like.dtype} of shape {tuple(shape)} in channels_last memory format "
                         f"(torch.empty(..., memory_format=torch.channels_last)), got {y.dtype} {tuple(y.shape)} "
                         f"with strides {y.stride()}")
    return y


def conv2d_mma(x, w, y=None, *, stride=1, padding=0, dilation=1, groups=1, bias=None, swizzle: bool = True,
               **tunables):
    """y = conv2d(x, w, bias, groups=groups) in fp16 on tensor cores (mma.sync), float sums rounded
    once.

    x (B, C, H, W) and w (M, C/groups, Kh, Kw), float16, in NCHW or channels_last memory format;
    bias (M,) float16 or None. The kernel reads NHWC: an NCHW x is converted inside the call, and
    that conversion is part of the call's time (pass x in channels_last to avoid it). The mask is
    reordered to (M, Kh, Kw, C/groups) in each call the same way: a free view when w is
    channels_last, as a channels_last model's weights are, else one small copy (no cache: a mask
    changed in place is never stale). C/groups not a multiple of 8: x and w are padded with zero
    channels per group (one copy each). groups == C > 1 (depthwise): refused.

    Returns y of logical shape (B, M, Ho, Wo) in channels_last memory format. A given y must be
    that (y.permute(0, 2, 3, 1) contiguous). Tunables (TUNABLES) left out come from mma_config;
    SPLIT_K left out is mma_config's when the tile is left out too, else 1. SPLIT_K > 1 adds an fp32
    workspace (SPLIT_K, P, M) and a second, reducing kernel to the call. swizzle=False builds the
    kernel without its XOR swizzle (SWIZZLE=0): what the swizzle buys, measured on its own
    (benchmarks/mma_ablation.py)."""
    check_tensors(("fp16",), layout=None, x=x, w=w, bias=bias)
    if x.dim() != 4 or w.dim() != 4:
        raise ValueError(f"expected x (B, C, H, W) and w (M, C/groups, Kh, Kw), got {tuple(x.shape)} and {tuple(w.shape)}")
    _check_groups(int(x.shape[1]), w, groups, f"x {tuple(x.shape)}")
    if bias is not None and tuple(bias.shape) != (w.shape[0],):
        raise ValueError(f"bias has shape {tuple(bias.shape)}, expected ({w.shape[0]},)")
    _check_tunables(tunables, "conv2d_mma")
    (sh, sw), (ph, pw), (dh, dw) = _pair(stride, "stride"), _pair(padding, "padding"), _pair(dilation, "dilation")
    key = (tuple(x.shape), tuple(w.shape), sh, sw, ph, pw, dh, dw, groups, tuple(tunables.get(k) for k in TUNABLES),
           swizzle)
    out_shape, Cg8, gemm = remember(_plans, key, lambda: _plan(x.shape, w.shape, (sh, sw), (ph, pw), (dh, dw),
                                                               groups, tunables, swizzle))
    y = channels_last_out(y, out_shape, x, "y")
    _run(gemm, _nhwc(x, Cg8, groups), _nhwc(w, Cg8), None if bias is None else bias.contiguous(), y.permute(0, 2, 3, 1))
    return y


def conv2d_mma_dx(dy, w, dx=None, *, stride=1, padding=0, input_size=None, dilation=1, groups=1, **tunables):
    """dx = dE/dX of conv2d(x, w, stride, padding, dilation, groups) in fp16 on tensor cores, float
    sums rounded once: conv2d_mma's kernel on dy with the flipped mask, transposed per group (each
    group's C/groups maps of its M/groups channels).

    dy (B, M, Ho, Wo) and w (M, C/groups, Kh, Kw), float16, NCHW or channels_last (an NCHW dy is
    converted inside the call, in its time; the flipped mask is one small copy a call). input_size:
    x's (H, W), which a strided layer needs (several sizes give the same Ho); None: the smallest.
    Stride 1: one convolution, padding dilation*(K-1) - padding. Stride s: one per stride phase
    (dx_phases), s_h*s_w launches, each writing its pixels of dx; a phase no tap reaches (a 1x1
    stride-2 layer's odd pixels) is set to zero. M/groups not a multiple of 8: dy and the mask
    padded with zero channels per group.

    Returns dx of logical shape (B, C, H, W) in channels_last memory format (a given dx must be
    that). Tunables left out come from mma_dx_config, one tile for every phase."""
    check_tensors(("fp16",), layout=None, dy=dy, w=w)
    if dy.dim() != 4 or w.dim() != 4 or int(dy.shape[1]) != int(w.shape[0]):
        raise ValueError(f"expected dy (B, M, Ho, Wo) and w (M, C/groups, Kh, Kw) with the same M, got "
                         f"{tuple(dy.shape)} and {tuple(w.shape)}")
    if not isinstance(groups, int) or groups < 1:
        raise ValueError(f"groups={groups!r}: a positive int")
    _check_groups(int(w.shape[1]) * groups, w, groups, f"dy {tuple(dy.shape)}")
    _check_tunables(tunables, "conv2d_mma_dx")
    (sh, sw), (ph, pw), (dh, dw) = _pair(stride, "stride"), _pair(padding, "padding"), _pair(dilation, "dilation")
    size = None if input_size is None else _pair(tuple(input_size), "input_size")
    key = (tuple(dy.shape), tuple(w.shape), sh, sw, ph, pw, dh, dw, groups, size,
           tuple(tunables.get(k) for k in TUNABLES))
    plan = remember(_dx_plans, key, lambda: _dx_plan(dy.shape, w.shape, (sh, sw), (ph, pw), (dh, dw), groups, size,
                                                     tunables))
    dx = channels_last_out(dx, plan.dx_shape, dy, "dx")
    dxn = dx.permute(0, 2, 3, 1)
    dyn = _nhwc(dy, plan.Mg8, groups)
    flipped = w.flip(2, 3)
    for phase in plan.phases:
        _run(phase.gemm, dyn, _dx_mask(flipped, groups, phase.rows, phase.cols, plan.Mg8), None, dxn)
    for rh, rw in plan.zero:
        dxn[:, rh::plan.stride[0], rw::plan.stride[1]] = 0
    return dx


def conv2d_mma_dw(x, dy, dw=None, *, stride=1, padding=0, kernel_size, dilation=1, groups=1, **tunables):
    """dw = dE/dW of conv2d(x, w, stride, padding, dilation, groups) in fp16 on tensor cores: per
    group, dy^T (maps x pixels) times x's windows (pixels x Kh*Kw*C/groups), fp32 sums split over
    the pixels (kernels/09_general/conv2d_mma_dw.cu), the splits added in order and rounded once.

    x (B, C, H, W) and dy (B, M, Ho, Wo), float16, NCHW or channels_last (NCHW ones converted inside
    the call, in its time); kernel_size: K or (Kh, Kw). A group's channels or maps not a multiple
    of 8: padded with zeros per group (one copy). Returns dw of logical shape (M, C/groups, Kh, Kw)
    in channels_last memory format (a given dw must be that). Tunables (TUNABLES; SPLIT_K 1 to
    MAX_DW_SPLIT) left out come from mma_dw_config; SPLIT_K left out with a tile given: 1."""
    check_tensors(("fp16",), layout=None, x=x, dy=dy)
    if x.dim() != 4 or dy.dim() != 4 or int(dy.shape[0]) != int(x.shape[0]):
        raise ValueError(f"expected x (B, C, H, W) and dy (B, M, Ho, Wo), got {tuple(x.shape)} and {tuple(dy.shape)}")
    C, M = int(x.shape[1]), int(dy.shape[1])
    if not isinstance(groups, int) or groups < 1 or C % groups or M % groups:
        raise ValueError(f"groups={groups!r} must divide C={C} and M={M}")
    if groups == C > 1:
        raise ValueError(f"groups={groups} == C: a depthwise layer; use convlab.ops.depthwise")
    _check_tunables(tunables, "conv2d_mma_dw")
    (Kh, Kw), (sh, sw) = _pair(kernel_size, "kernel_size"), _pair(stride, "stride")
    (ph, pw), (dh, dw_) = _pair(padding, "padding"), _pair(dilation, "dilation")
    key = (tuple(x.shape), tuple(dy.shape), Kh, Kw, sh, sw, ph, pw, dh, dw_, groups,
           tuple(tunables.get(k) for k in TUNABLES))
    plan = remember(_dw_plans, key, lambda: _dw_plan(x.shape, dy.shape, (Kh, Kw), (sh, sw), (ph, pw), (dh, dw_),
                                                     groups, tunables))
    launch, reduce, ws_shape, Cg8, Mg8 = plan
    dw = channels_last_out(dw, (M, C // groups, Kh, Kw), x, "dw")
    ws = new_output(ws_shape, x, torch.float32)
    launch(_nhwc(x, Cg8, groups), _nhwc(dy, Mg8, groups), ws)
    reduce(ws, dw.permute(0, 2, 3, 1))
    return dw


def _dw_plan(x_shape, dy_shape, K, stride, padding, dilation, groups, tunables) -> tuple:
    B, C, H, W = (int(s) for s in x_shape)
    _, M, Ho, Wo = (int(s) for s in dy_shape)
    (Kh, Kw), (sh, sw), (ph, pw), (dh, dw) = K, stride, padding, dilation
    if min(sh, sw, dh, dw, Kh, Kw) < 1 or min(ph, pw) < 0:
        raise ValueError(f"kernel_size {K}, stride {stride}, dilation {dilation} must be >= 1 and padding {padding} >= 0")
    shape = Workload("", B=B, C=C, M=M, H=H, W=W, K=(Kh, Kw), stride=stride, padding=padding, dilation=dilation,
                     groups=groups)
    if (shape.Ho, shape.Wo) != (Ho, Wo):
        raise ValueError(f"dy {tuple(dy_shape)}: x {tuple(x_shape)} with a {Kh}x{Kw} mask, stride {stride}, padding "
                         f"{padding}, dilation {dilation} gives {shape.Ho}x{shape.Wo} outputs")
    _check_mask(Kh, Kw)
    Cg, Mg = C // groups, M // groups
    Cg8, Mg8 = ceil_div(Cg, 8) * 8, ceil_div(Mg, 8) * 8
    N = Kh * Kw * Cg8
    t = _tile(tunables, mma_dw_config(shape), check_dw_tunables)
    splits = t["SPLIT_K"]
    _check_sizes(**_numels(shape, "dw"), ws=splits * M * N)
    tile = {k: t[k] for k in TILE}
    smem = t["STAGES"] * t["BK"] * (t["BM"] + t["BN"]) * 2
    blocks = groups * ceil_div(Mg8, t["BM"]) * ceil_div(N, t["BN"])
    launch = Launch(DW_FILE, "conv2d_mma_dw", tile, (B, H, W, Cg8, groups * Cg8, Mg8, groups * Mg8, Mg, Kh, Kw, Ho, Wo,
                                                     sh, sw, ph, pw, dh, dw),
                    grid=(blocks, splits), block=(32 * t["WARPS_M"] * t["WARPS_N"],), shared=smem,
                    max_shared=smem if smem > SHARED_DEFAULT_MAX else None)
    reduce = Launch(DW_FILE, "conv2d_mma_dw_reduce", tile, (M, Kh * Kw, Cg, Cg8, splits),
                    grid=(ceil_div(M * Kh * Kw * Cg, REDUCE_THREADS),), block=(REDUCE_THREADS,))
    return launch, reduce, (splits, M, N), Cg8, Mg8


def _dx_mask(flipped: torch.Tensor, groups: int, rows: tuple, cols: tuple, Mg8: int) -> torch.Tensor:
    """The mask of one dX phase as the kernel reads it, (C, Jh, Jw, Mg8): for group g, map c of its
    C/groups and channel m of its M/groups, the flipped mask's tap of w[g*M/groups + m][c]."""
    (h0, hs, Jh), (w0, ws, Jw) = rows, cols
    M, Cg = int(flipped.shape[0]), int(flipped.shape[1])
    Mg = M // groups
    sub = flipped[:, :, h0::hs, w0::ws][:, :, :Jh, :Jw]               # (M, Cg, Jh, Jw)
    sub = sub.unflatten(0, (groups, Mg)).permute(0, 2, 3, 4, 1)     # (G, Cg, Jh, Jw, Mg)
    if Mg8 != Mg:
        sub = F.pad(sub, (0, Mg8 - Mg))
    return sub.reshape(groups * Cg, Jh, Jw, Mg8).contiguous()


def _run(gemm: _Gemm, xn, wn, bias, yn) -> None:
    """One run of the kernel (and its split-K reducing pass) on NHWC tensors."""
    b = wn if bias is None else bias
    if gemm.reduce is None:
        gemm.launch(xn, wn, b, yn, _no_workspace(xn), int(bias is not None))
    else:                                # split-K: fp32 partials (splits, P, MY), then one rounding pass
        ws = new_output(gemm.ws_shape, xn, torch.float32)
        gemm.launch(xn, wn, b, yn, ws, int(bias is not None))
        gemm.reduce(ws, b, yn, int(bias is not None))


_NO_WORKSPACE: dict = {}


def _no_workspace(like: torch.Tensor) -> torch.Tensor:
    """The kernel's ws argument without split-K: one float, never read or written, made once per
    device (an allocation per call would be work the route adds)."""
    ws = _NO_WORKSPACE.get(like.device)
    if ws is None:
        ws = _NO_WORKSPACE[like.device] = torch.empty(1, dtype=torch.float32, device=like.device)
    return ws


def _tile(tunables: dict, cfg: dict, check=check_mma_tunables) -> dict:
    """The tunables given, the rest from cfg; SPLIT_K 1 when a tile is given without it (cfg's split
    was for its own tile); checked by check."""
    t = {k: int(tunables[k]) if tunables.get(k) is not None else cfg[k] for k in TUNABLES}
    if tunables.get("SPLIT_K") is None and any(tunables.get(k) is not None for k in TILE):
        t["SPLIT_K"] = 1
    check(**t)
    return t


def _check_mask(Kh: int, Kw: int) -> None:
    if Kh + Kw > MAX_TAP_BITS:
        raise ValueError(f"mask {Kh}x{Kw}: conv2d_mma keeps a pixel's valid rows and columns of taps in one 32-bit "
                         f"mask, Kh + Kw <= {MAX_TAP_BITS} (up to 15x16): a larger mask needs another implementation "
                         "(convlab.ops.general, fp16 or fp32)")


def _numels(shape: Workload, op: str) -> dict:
    """The element counts the kernels of op ("forward", "dx" or "dw") index with int: its tensors as
    the kernel reads them (channels padded per group)."""
    G, KK = shape.groups, shape.K * shape.Kw
    Cg8, Mg8 = ceil_div(shape.C // G, 8) * 8, ceil_div(shape.M // G, 8) * 8
    pix_in, pix_out = shape.B * shape.H * shape.W, shape.B * shape.Ho * shape.Wo
    if op == "forward":
        return dict(x=pix_in * G * Cg8, y=pix_out * shape.M, w=shape.M * KK * Cg8)
    if op == "dx":
        return dict(dy=pix_out * G * Mg8, dx=pix_in * shape.C, w=shape.C * KK * Mg8)
    return dict(x=pix_in * G * Cg8, dy=pix_out * G * Mg8)


def _check_sizes(**numels) -> None:
    for name, n in numels.items():
        if n > INT32_MAX // 2:
            raise ValueError(f"{name} has {n:,} elements: too many for the kernel's int indices; split the batch")


def _gemm(B, H, W, C8, G, M, Kh, Kw, Ho, Wo, stride, padding, dilation, t, place=None, swizzle=True) -> _Gemm:
    """The launches of `G` GEMMs of (B*Ho*Wo) x M x (Kh*Kw*C8), input (B, H, W, G*C8), output pixels
    placed by place = (y0, y_img, y_row, y_col) (None: dense, (B, Ho, Wo, G*M))."""
    P, MY = B * Ho * Wo, G * M
    splits = t["SPLIT_K"]
    if splits * P * MY > INT32_MAX // 2:
        raise ValueError(f"SPLIT_K={splits}: a workspace of {splits * P * MY:,} floats, too many for int indices; "
                         "a smaller SPLIT_K or batch")
    blocks = _blocks(P, M, t, G)
    if blocks > GRID_X_MAX:
        raise ValueError(f"{blocks:,} blocks: over gridDim.x's limit; split the batch")
    place = place or (0, Ho * Wo, Wo, 1)
    smem = shared_bytes(**t)
    tile = {k: t[k] for k in TILE}
    if not swizzle:
        tile["SWIZZLE"] = 0
    launch = Launch(MMA_FILE, "conv2d_mma", tile, (B, H, W, C8, G * C8, M, MY, Kh, Kw, Ho, Wo, *stride, *padding,
                                                   *dilation, *place),
                    grid=(blocks, splits), block=(32 * t["WARPS_M"] * t["WARPS_N"],), shared=smem,
                    max_shared=smem if smem > SHARED_DEFAULT_MAX else None)
    reduce = None if splits == 1 else Launch(MMA_FILE, "conv2d_mma_splitk_reduce", tile, (P, MY, splits, Ho, Wo, *place),
                                             grid=(ceil_div(P * MY, REDUCE_THREADS),), block=(REDUCE_THREADS,))
    return _Gemm(launch, reduce, (splits, P, MY))


def _plan(x_shape, w_shape, stride, padding, dilation, groups, tunables, swizzle=True) -> _Plan:
    B, C, H, W = (int(s) for s in x_shape)
    M, Cg, Kh, Kw = (int(s) for s in w_shape)
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    if min(sh, sw, dh, dw) < 1 or min(ph, pw) < 0:
        raise ValueError(f"stride {stride}, dilation {dilation} must be >= 1 and padding {padding} >= 0")
    Ho = (H + 2 * ph - dh * (Kh - 1) - 1) // sh + 1
    Wo = (W + 2 * pw - dw * (Kw - 1) - 1) // sw + 1
    if Ho < 1 or Wo < 1:
        raise ValueError(f"no output: input {H}x{W}, mask {Kh}x{Kw}, stride {stride}, padding {padding}, "
                         f"dilation {dilation}")
    _check_mask(Kh, Kw)
    Cg8 = ceil_div(Cg, 8) * 8
    shape = Workload("", B=B, C=C, M=M, H=H, W=W, K=(Kh, Kw), stride=stride, padding=padding, dilation=dilation,
                     groups=groups)
    _check_sizes(**_numels(shape, "forward"))
    t = _tile(tunables, mma_config(shape))
    gemm = _gemm(B, H, W, Cg8, groups, M // groups, Kh, Kw, Ho, Wo, stride, padding, dilation, t, swizzle=swizzle)
    return _Plan((B, M, Ho, Wo), Cg8, gemm)


def _dx_plan(dy_shape, w_shape, stride, padding, dilation, groups, size, tunables) -> _DxPlan:
    B, M, Ho, Wo = (int(s) for s in dy_shape)
    _, Cg, Kh, Kw = (int(s) for s in w_shape)
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    if min(sh, sw, dh, dw) < 1 or min(ph, pw) < 0:
        raise ValueError(f"stride {stride}, dilation {dilation} must be >= 1 and padding {padding} >= 0")
    H0, W0 = (Ho - 1) * sh - 2 * ph + dh * (Kh - 1) + 1, (Wo - 1) * sw - 2 * pw + dw * (Kw - 1) + 1
    H, W = size or (H0, W0)
    if not (H0 <= H < H0 + sh and W0 <= W < W0 + sw) or min(H, W) < 1:
        raise ValueError(f"input_size {size}: dy {tuple(dy_shape)} comes from an input of {H0}..{H0 + sh - 1} x "
                         f"{W0}..{W0 + sw - 1} at stride {stride}, padding {padding}, dilation {dilation}, mask "
                         f"{Kh}x{Kw}")
    _check_mask(Kh, Kw)
    C, Mg = groups * Cg, M // groups
    Mg8 = ceil_div(Mg, 8) * 8
    shape = Workload("", B=B, C=C, M=M, H=H, W=W, K=(Kh, Kw), stride=stride, padding=padding, dilation=dilation,
                     groups=groups)
    _check_sizes(**_numels(shape, "dx"))
    t = _tile(tunables, mma_dx_config(shape))
    phases, zero = [], []
    for (rh, Hp, th, pad_h, dil_h), (rw, Wp, tw, pad_w, dil_w) in dx_phases(H, W, (Kh, Kw), stride, padding, dilation):
        if not th or not tw:
            zero.append((rh, rw))
            continue
        # the flipped mask's row of tap k is Kh-1-k; the phase's taps are evenly spaced in it
        rows = (Kh - 1 - th[0], th[0] - th[1] if len(th) > 1 else 1, len(th))
        cols = (Kw - 1 - tw[0], tw[0] - tw[1] if len(tw) > 1 else 1, len(tw))
        place = (rh * W + rw, H * W, sh * W, sw)
        gemm = _gemm(B, Ho, Wo, Mg8, groups, Cg, len(th), len(tw), Hp, Wp, (1, 1), (pad_h, pad_w), (dil_h, dil_w), t,
                     place)
        phases.append(_Phase(rh, rw, rows, cols, gemm))
    return _DxPlan((B, C, H, W), Mg8, (sh, sw), tuple(phases), tuple(zero))


def runs_here() -> bool:
    """mma.sync and cp.async need sm_80: False on an older GPU (the emulator runs them)."""
    dev = runtime.device()
    return dev.backend != "cuda" or tuple(dev.cc) >= (8, 0)


def _takes(shape, op: str = "forward") -> bool:
    """What the launcher of op ("forward", "dx", "dw") runs with its default tile: a 2D layer, not
    depthwise (groups == C > 1), a mask of Kh + Kw <= MAX_TAP_BITS taps (a dX phase's mask is part
    of the layer's), tensors and workspace within int indices, on a GPU that has mma.sync."""
    if getattr(shape, "D", None) is not None or shape.groups == shape.C > 1 or shape.K + shape.Kw > MAX_TAP_BITS:
        return False
    G, P, KK = shape.groups, shape.B * shape.Ho * shape.Wo, shape.K * shape.Kw
    ws = {"forward": lambda: mma_config(shape)["SPLIT_K"] * P * shape.M,
          "dx": lambda: mma_dx_config(shape)["SPLIT_K"] * _dx_gemm(shape)[0] * shape.C,
          "dw": lambda: mma_dw_config(shape)["SPLIT_K"] * shape.M * KK * ceil_div(shape.C // G, 8) * 8}[op]()
    return all(n <= INT32_MAX // 2 for n in (*_numels(shape, op).values(), ws)) and runs_here()


#: any_layer: stride, padding and dilation per axis, non-square masks and groups (not depthwise: _takes).
MMA = Impl("mma.sync implicit GEMM (NHWC)", conv2d_mma, op="conv2d_fp16", applies=_takes, config=mma_config,
           any_layer=True, key="mma", layouts=("channels_last",), out_layout="channels_last", bias=True)
#: dE/dX of the same layers by the same kernel (stride phases for a strided layer).
MMA_DX = Impl("mma.sync implicit GEMM dX (NHWC)", conv2d_mma_dx, op="conv2d_dx_fp16",
              applies=lambda s: _takes(s, "dx"), config=mma_dx_config, any_layer=True, key="mma_dx",
              layouts=("channels_last",), out_layout="channels_last")
#: dE/dW of the same layers (fp32 sums split over the pixels).
MMA_DW = Impl("mma.sync implicit GEMM dW (NHWC)", conv2d_mma_dw, op="conv2d_dw_fp16",
              applies=lambda s: _takes(s, "dw"), config=mma_dw_config, any_layer=True, key="mma_dw",
              layouts=("channels_last",), out_layout="channels_last")
#: The chapter's tensor-core implementations, by the names the figures use.
IMPLEMENTATIONS: tuple[Impl, ...] = (MMA, MMA_DX, MMA_DW)
