"""Chapter 9 launcher: fp16 convolution on tensor cores through mma.sync, an NHWC implicit GEMM
(kernels/09_general/conv2d_mma.cu; the ldmatrix / mma.sync / cp.async primitives are in
kernels/09_general/tensor_core.cuh).

- conv2d_mma(x, w, y=None, *, stride, padding, dilation, bias, **tunables): half in, half out,
  float sums. x NCHW or channels_last; the result is channels_last (logical shape (B, M, Ho, Wo),
  as torch's). Any stride, padding and dilation (ints or pairs), groups=1.
- mma_config(shape): the tile a layer gets (tunables BM, BN, BK, WARPS_M, WARPS_N, STAGES) and its
  SPLIT_K (K split over that many blocks when the output tiles alone would leave SMs idle), from
  preference(shape) (the PREFERENCE tuples); the one place to change the choice. CANDIDATES: the
  tiles benchmarks/tensor_core_layers.py times.
- MMA.applies: a 2D layer of one group on sm_80 or newer (runs_here; the emulator runs it too).
- check_mma_tunables(...): the kernel's static_asserts and its shared memory, as a Python error.
- MMA: the Impl record, "mma.sync implicit GEMM (NHWC)".

Fewer than 8 channels, or a count not a multiple of 8 (an RGB stem): the input and the mask are
padded with zero channels up to a multiple of 8 (one copy, in the call's time). The kernel then
keeps a single loader, 16-byte cp.async copies of 8 channels; the extra zero channels cost
tensor-core work (7x7 stem: K = 392 instead of 147), not memory traffic beyond that one copy.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from .. import runtime
from .._limits import GRID_X_MAX, INT32_MAX, SHARED_DEFAULT_MAX
from ..workloads import Workload
from . import Impl, ceil_div, new_output
from ._kernels import Launch, remember

MMA_FILE = "kernels/09_general/conv2d_mma.cu"
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
BLOCKS_PER_SM = 1
SMS = 132                            # H100/H200 SXM; mma_config(shape, sms=...) for another GPU

_plans: dict = {}


class _Plan(NamedTuple):
    out_shape: tuple                 # (B, M, Ho, Wo)
    C8: int                          # channels after padding to a multiple of 8
    launch: Launch                   # conv2d_mma
    reduce: Launch | None            # conv2d_mma_splitk_reduce, when SPLIT_K > 1
    ws_shape: tuple                  # (SPLIT_K, P, M)


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


def _blocks(P: int, M: int, t: dict) -> int:
    return ceil_div(P, t["BM"]) * ceil_div(M, t["BN"])


def split_k(P: int, M: int, K: int, t: dict, sms: int = SMS) -> int:
    """SPLIT_K for tile t on a P x M x K GEMM: 1 when its output tiles fill SPLIT_BELOW of the SMs'
    BLOCKS_PER_SM slots; else the fewest splits that do, at most MAX_SPLIT_K and each at least MIN_STEPS_PER_SPLIT
    BK steps deep (a split's partial tile costs fp32 traffic, and a short share does not amortise
    the pipeline's fill)."""
    blocks, steps = _blocks(P, M, t), ceil_div(K, t["BK"])
    if blocks >= SPLIT_BELOW * BLOCKS_PER_SM * sms:
        return 1
    want = ceil_div(BLOCKS_PER_SM * sms, blocks)
    return max(1, min(want, MAX_SPLIT_K, steps // MIN_STEPS_PER_SPLIT))


def preference(shape: Workload, sms: int = SMS) -> tuple:
    """The tiles mma_config tries for a layer, best first (the PREFERENCE tuples: which kind of
    layer gets which, and the measured reason)."""
    P, M = shape.B * shape.Ho * shape.Wo, shape.M
    K = shape.K * shape.Kw * ceil_div(shape.C, 8) * 8
    if shape.C < 8:
        return PREFERENCE_FEW_CHANNELS
    if K <= 64 and M > 64:
        return PREFERENCE_SHORT_K
    if M >= 256 and _blocks(P, M, CANDIDATES[PREFERENCE_BIG[0]]) >= BIG_WAVES * sms:
        return PREFERENCE_BIG
    return PREFERENCE


def mma_config(shape: Workload, sms: int = SMS) -> dict:
    """The tunables conv2d_mma uses for a layer when none are passed: from preference(shape), the
    first tile whose grid, split along K if need be (split_k), fills SPLIT_BELOW of the SMs' slots;
    else the one with the most blocks (7x7 maps: few pixels, where even a 128x64 tile leaves SMs
    idle without a split)."""
    P = shape.B * shape.Ho * shape.Wo
    K = shape.K * shape.Kw * ceil_div(shape.C, 8) * 8
    options = [dict(CANDIDATES[n], SPLIT_K=split_k(P, shape.M, K, CANDIDATES[n], sms)) for n in preference(shape, sms)]
    for t in options:
        if _blocks(P, shape.M, t) * t["SPLIT_K"] >= SPLIT_BELOW * BLOCKS_PER_SM * sms:
            return t
    return max(options, key=lambda t: _blocks(P, shape.M, t) * t["SPLIT_K"])


def _nhwc(x: torch.Tensor, C8: int) -> torch.Tensor:
    """x (B, C, H, W) as an NHWC tensor of C8 >= C channels: a view when x is channels_last already
    (and needs no channel padding), else one copy (zero channels appended up to C8)."""
    xp = x.permute(0, 2, 3, 1)
    if C8 != x.shape[1]:
        return F.pad(xp, (0, C8 - x.shape[1]))
    if xp.is_contiguous() and xp.data_ptr() % 16 == 0:
        return xp
    return xp.clone(memory_format=torch.contiguous_format)      # cp.async reads 16-byte aligned chunks


def conv2d_mma(x, w, y=None, *, stride=1, padding=0, dilation=1, bias=None, **tunables):
    """y = conv2d(x, w, bias) in fp16 on tensor cores (mma.sync), float sums rounded once.

    x (B, C, H, W) and w (M, C, Kh, Kw), float16, in NCHW or channels_last memory format; bias
    (M,) float16 or None. The kernel reads NHWC: an NCHW x is converted inside the call, and that
    conversion is part of the call's time (pass x in channels_last to avoid it). The mask is
    reordered to (M, Kh, Kw, C) in each call the same way: a free view when w is channels_last, as
    a channels_last model's weights are, else one small copy (no cache: a mask changed in place is
    never stale). C not a multiple of 8: x and w are padded with zero channels (one copy each).

    Returns y of logical shape (B, M, Ho, Wo) in channels_last memory format. A given y must be
    that (y.permute(0, 2, 3, 1) contiguous). Tunables (TUNABLES) left out come from mma_config;
    SPLIT_K left out is mma_config's when the tile is left out too, else 1. SPLIT_K > 1 adds an fp32
    workspace (SPLIT_K, P, M) and a second, reducing kernel to the call."""
    for name, t in (("x", x), ("w", w)) + (() if bias is None else (("bias", bias),)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float16:
            raise TypeError(f"{name} must be a float16 tensor, got {getattr(t, 'dtype', type(t).__name__)}")
    if x.dim() != 4 or w.dim() != 4 or w.shape[1] != x.shape[1]:
        raise ValueError(f"expected x (B, C, H, W) and w (M, C, Kh, Kw) with the same C (groups=1), got "
                         f"{tuple(x.shape)} and {tuple(w.shape)}")
    if bias is not None and tuple(bias.shape) != (w.shape[0],):
        raise ValueError(f"bias has shape {tuple(bias.shape)}, expected ({w.shape[0]},)")
    bad = [k for k in tunables if k not in TUNABLES]
    if bad:
        raise TypeError(f"conv2d_mma got unknown tunables {bad}; it takes {', '.join(TUNABLES)}")
    (sh, sw), (ph, pw), (dh, dw) = _pair(stride, "stride"), _pair(padding, "padding"), _pair(dilation, "dilation")
    key = (tuple(x.shape), tuple(w.shape), sh, sw, ph, pw, dh, dw, tuple(tunables.get(k) for k in TUNABLES))
    (B, M, Ho, Wo), C8, launch, reduce, ws_shape = remember(_plans, key, lambda: _plan(x.shape, w.shape, (sh, sw), (ph, pw),
                                                                      (dh, dw), tunables))
    if y is None:
        y = new_output((B, Ho, Wo, M), x).permute(0, 3, 1, 2)
    elif (y.dtype != torch.float16 or tuple(y.shape) != (B, M, Ho, Wo) or not y.permute(0, 2, 3, 1).is_contiguous()
          or y.data_ptr() % 16):
        raise ValueError(f"y must be float16 of shape {(B, M, Ho, Wo)} in channels_last memory format "
                         f"(torch.empty(..., memory_format=torch.channels_last)), got {y.dtype} {tuple(y.shape)} "
                         f"with strides {y.stride()}")
    xn = _nhwc(x, C8)
    wn = _nhwc(w, C8)
    b = wn if bias is None else bias.contiguous()
    yn = y.permute(0, 2, 3, 1)
    if reduce is None:
        launch(xn, wn, b, yn, _no_workspace(x), int(bias is not None))
    else:                                # split-K: fp32 partials (splits, P, M), then one rounding pass
        ws = new_output(ws_shape, x, torch.float32)
        launch(xn, wn, b, yn, ws, int(bias is not None))
        reduce(ws, b, yn, int(bias is not None))
    return y


def _no_workspace(like: torch.Tensor) -> torch.Tensor:
    """The kernel's ws argument without split-K: one float, never read or written."""
    return torch.empty(1, dtype=torch.float32, device=like.device)


def _plan(x_shape, w_shape, stride, padding, dilation, tunables):
    B, C, H, W = (int(s) for s in x_shape)
    M, _, Kh, Kw = (int(s) for s in w_shape)
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    if min(sh, sw, dh, dw) < 1 or min(ph, pw) < 0:
        raise ValueError(f"stride {stride}, dilation {dilation} must be >= 1 and padding {padding} >= 0")
    Ho = (H + 2 * ph - dh * (Kh - 1) - 1) // sh + 1
    Wo = (W + 2 * pw - dw * (Kw - 1) - 1) // sw + 1
    if Ho < 1 or Wo < 1:
        raise ValueError(f"no output: input {H}x{W}, mask {Kh}x{Kw}, stride {stride}, padding {padding}, "
                         f"dilation {dilation}")
    if Kh + Kw > MAX_TAP_BITS:
        raise ValueError(f"mask {Kh}x{Kw}: conv2d_mma keeps a pixel's valid rows and columns of taps in one 32-bit "
                         f"mask, Kh + Kw <= {MAX_TAP_BITS} (up to 15x16): a larger mask needs another implementation "
                         "(convlab.ops.general, fp16 or fp32)")
    C8 = ceil_div(C, 8) * 8
    P = B * Ho * Wo
    for name, n in (("x", B * H * W * C8), ("y", P * M), ("w", M * Kh * Kw * C8)):
        if n > INT32_MAX // 2:
            raise ValueError(f"{name} has {n:,} elements: too many for the kernel's int indices; split the batch")
    cfg = mma_config(Workload("", B=B, C=C, M=M, H=H, W=W, K=(Kh, Kw), stride=(sh, sw), padding=(ph, pw),
                              dilation=(dh, dw)))
    t = {k: int(tunables[k]) if tunables.get(k) is not None else cfg[k] for k in TUNABLES}
    if tunables.get("SPLIT_K") is None and any(tunables.get(k) is not None for k in TILE):
        t["SPLIT_K"] = 1                 # mma_config's split was for its own tile
    check_mma_tunables(**t)
    splits = t["SPLIT_K"]
    if splits * P * M > INT32_MAX // 2:
        raise ValueError(f"SPLIT_K={splits}: a workspace of {splits * P * M:,} floats, too many for int indices; "
                         "a smaller SPLIT_K or batch")
    blocks = _blocks(P, M, t)
    if blocks > GRID_X_MAX:
        raise ValueError(f"{blocks:,} blocks: over gridDim.x's limit; split the batch")
    smem = shared_bytes(**t)
    tile = {k: t[k] for k in TILE}
    launch = Launch(MMA_FILE, "conv2d_mma", tile, (B, H, W, C8, M, Kh, Kw, Ho, Wo, sh, sw, ph, pw, dh, dw),
                    grid=(blocks, splits), block=(32 * t["WARPS_M"] * t["WARPS_N"],), shared=smem,
                    max_shared=smem if smem > SHARED_DEFAULT_MAX else None)
    reduce = None if splits == 1 else Launch(MMA_FILE, "conv2d_mma_splitk_reduce", tile, (P, M, splits),
                                             grid=(ceil_div(P * M, REDUCE_THREADS),), block=(REDUCE_THREADS,))
    return _Plan((B, M, Ho, Wo), C8, launch, reduce, (splits, P, M))


def runs_here() -> bool:
    """mma.sync and cp.async need sm_80: False on an older GPU (the emulator runs them)."""
    dev = runtime.device()
    return dev.backend != "cuda" or tuple(dev.cc) >= (8, 0)


def _takes(shape) -> bool:
    """A 2D layer of one group, a mask of Kh + Kw <= MAX_TAP_BITS taps, on a GPU that has mma.sync."""
    return (getattr(shape, "D", None) is None and shape.groups == 1 and shape.K + shape.Kw <= MAX_TAP_BITS
            and runs_here())


#: any_layer: stride, padding and dilation per axis and non-square masks (groups=1: _takes).
MMA = Impl("mma.sync implicit GEMM (NHWC)", conv2d_mma, op="conv2d_fp16", applies=_takes, config=mma_config,
           any_layer=True, key="mma")
#: The chapter's tensor-core implementations, by the names the figures use.
IMPLEMENTATIONS: tuple[Impl, ...] = (MMA,)
