"""Chapter 9's tensor-core convolution (kernels/09_general/conv2d_mma.cu, convlab.ops.tensor_core)
on the emulator, against torch in float64 on the same half values.

Shapes are small (the emulator runs every lane's mma.sync on the CPU) but awkward: pixel counts
and map counts that are not multiples of the tile, channels 3 (padded to 8), 8, 16, 24 (one BK=32
step spans several taps), odd and even masks, 3x5, stride, padding, dilation, B=1, non-square,
several blocks along both axes, and every tile shape and pipeline depth mma_config can choose.
Grouped layers (2, 4 and 32 groups; 8, 16 and 12 channels a group, 12 padded to 16; maps a group
not a multiple of the tile), and their data and weight gradients (conv2d_mma_dx, conv2d_mma_dw)
against torch's autograd in float64: stride phases, dilation, 1x7 masks, split-K, both layouts.
Outputs start as NaN (the launchers poison them on the emulator), so one never written fails.
Tolerance: chapter 6's fp16_tolerance for float sums of rounded inputs (the output's rounding).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import convlab as cl
from convlab.measuring import workloads
from convlab.ops import tensor_core as tc
from convlab.ops.fp16 import check_fp16

SMALL = dict(BM=64, BN=64, BK=32, WARPS_M=2, WARPS_N=2, STAGES=3)

# (B, C, H, W, M, Kh, Kw, stride, padding, dilation, tunables)
CASES = [
    (1, 16, 6, 5, 16, 3, 3, 1, 1, 1, SMALL),                                        # B=1, one block, 5 steps
    (2, 3, 11, 9, 20, 7, 7, 2, 3, 1, SMALL),                                        # stem: C=3 padded, 7x7 s2
    (2, 8, 7, 9, 24, 3, 3, 1, 1, 1, dict(SMALL, BK=16, STAGES=2)),                  # C=8, BK=16, 2 stages
    (1, 24, 9, 10, 17, 3, 5, (2, 1), (1, 2), (2, 1), dict(SMALL, BK=64)),           # odd M, 3x5, dilation
    (2, 40, 5, 6, 40, 1, 1, 1, 0, 1, dict(SMALL, BN=32, WARPS_N=1, STAGES=4)),      # 1x1, C=40 (K tail)
    (1, 64, 6, 6, 72, 3, 3, 1, 1, 1, dict(SMALL, BM=32, WARPS_M=1)),                # 2 map tiles, 18 steps
    (3, 16, 10, 11, 8, 2, 2, 1, 0, 1, dict(SMALL, BM=32, BN=32, WARPS_M=1, WARPS_N=1)),   # even mask, 10 pixel tiles
    (2, 8, 18, 16, 16, 3, 3, 2, 1, 1, tc.CANDIDATES["128x64x32 s4 (2x2 warps)"]),   # 4 stages, 48 KB
    (1, 8, 9, 10, 8, 5, 3, 1, 2, (2, 1), dict(SMALL, BK=64)),                      # a step: 2 rows + 2 columns of taps
    (1, 8, 16, 17, 8, 15, 16, 1, 7, 1, SMALL),                                      # Kh + Kw = 31: tap bit 30 in use
    (1, 8, 9, 9, 16, 3, 3, 1, 1, 1, tc.CANDIDATES["128x128x32 s4 (2x2 warps)"]),    # 64 KB: the opt-in
    (2, 16, 9, 8, 24, 3, 3, 1, 1, 1, tc.CANDIDATES["128x64x64 s3 (2x1 warps)"]),    # 64 threads, 64x64 warp tiles
    # split-K: 7 steps in 3 splits (3, 3, 1); 5 steps in 4 (2, 2, 1, 0: an empty split stores zeros);
    # one step in 2; odd M with a pixel tail and dilation; C=8 where a step spans taps
    (1, 24, 6, 7, 20, 3, 3, 1, 1, 1, dict(SMALL, SPLIT_K=3)),
    (2, 16, 5, 5, 16, 3, 3, 1, 1, 1, dict(SMALL, SPLIT_K=4)),
    (1, 8, 4, 5, 8, 1, 1, 1, 0, 1, dict(SMALL, SPLIT_K=2)),
    (1, 24, 9, 10, 17, 3, 5, (2, 1), (1, 2), (2, 1), dict(SMALL, BK=16, SPLIT_K=5)),
    (2, 8, 7, 9, 24, 3, 3, 1, 1, 1, dict(SMALL, BM=32, WARPS_M=1, SPLIT_K=2)),
]


def _ids(case):
    B, C, H, W, M, Kh, Kw, s, p, d, t = case
    return (f"B{B}C{C}M{M}-{H}x{W}-k{Kh}x{Kw}-s{s}-p{p}-d{d}-{t['BM']}x{t['BN']}x{t['BK']}s{t['STAGES']}"
            f"-split{t.get('SPLIT_K', 1)}").replace(" ", "")


def _reference(x, w, b, **kw):
    return F.conv2d(x.double().cpu(), w.double().cpu(), None if b is None else b.double().cpu(), **kw)


def _check(y, ref, C, Kh, Kw):
    return check_fp16(y, ref, C=C * Kh * Kw, K=1, accumulate="float", rounded_inputs=True)


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_awkward_shapes(case):
    B, C, H, W, M, Kh, Kw, s, p, d, t = case
    x = cl.randn(B, C, H, W).half()
    w = cl.randn(M, C, Kh, Kw).half()
    b = cl.randn(M).half()
    y = tc.conv2d_mma(x, w, bias=b, stride=s, padding=p, dilation=d, **t)
    assert y.is_contiguous(memory_format=torch.channels_last)
    _check(y, _reference(x, w, b, stride=s, padding=p, dilation=d), C, Kh, Kw)


def test_layouts_bias_and_given_output():
    """NCHW and channels_last inputs and masks give the same result; no bias; a given y is written."""
    x = cl.randn(2, 16, 7, 6).half()
    w = cl.randn(24, 16, 3, 3).half()
    ref = _reference(x, w, None, padding=1)
    y1 = tc.conv2d_mma(x, w, padding=1, **SMALL)
    cl_ = torch.channels_last
    y = torch.full((2, 24, 7, 6), float("nan"), dtype=torch.float16, device=x.device).to(memory_format=cl_)
    y2 = tc.conv2d_mma(x.to(memory_format=cl_), w.to(memory_format=cl_), y, padding=1, **SMALL)
    assert y2 is y
    _check(y1, ref, 16, 3, 3)
    assert torch.equal(y1, y2)


def test_default_config_runs():
    """The tile mma_config gives a small layer (no tunables passed) computes it right."""
    x = cl.randn(1, 8, 5, 7).half()
    w = cl.randn(8, 8, 3, 3).half()
    _check(tc.conv2d_mma(x, w, padding=1), _reference(x, w, None, padding=1), 8, 3, 3)


def test_errors_say_what_to_change():
    x = cl.randn(1, 8, 5, 5).half()
    w = cl.randn(8, 8, 3, 3).half()
    with pytest.raises(TypeError, match="float16"):
        tc.conv2d_mma(x.float(), w)
    with pytest.raises(ValueError, match="groups=1"):
        tc.conv2d_mma(x, w[:, :4])
    with pytest.raises(ValueError, match="channels_last"):
        tc.conv2d_mma(x, w, torch.empty(1, 8, 3, 3, dtype=torch.float16, device=x.device))
    with pytest.raises(ValueError, match="multiples of 16"):
        tc.conv2d_mma(x, w, BM=24)
    with pytest.raises(ValueError, match="shared memory"):
        tc.check_mma_tunables(BM=256, BN=256, BK=64, WARPS_M=4, WARPS_N=4, STAGES=4)
    with pytest.raises(TypeError, match="unknown tunables"):
        tc.conv2d_mma(x, w, TILE=16)
    with pytest.raises(ValueError, match="31"):
        tc.conv2d_mma(cl.randn(1, 8, 33, 2).half(), cl.randn(8, 8, 32, 1).half())
    with pytest.raises(ValueError, match="SPLIT_K"):
        tc.conv2d_mma(x, w, SPLIT_K=9)
    with pytest.raises(ValueError, match="multiple of 8"):      # 32 threads, BK=64: 4 rows per pass
        tc.check_mma_tunables(BM=32, BN=32, BK=64, WARPS_M=1, WARPS_N=1, STAGES=2)


def test_candidates_and_config():
    """Every candidate tile is valid; mma_config picks one of them, and splits K for few pixels."""
    for t in tc.CANDIDATES.values():
        tc.check_mma_tunables(**t)
    big = workloads.Workload("r56", B=32, C=64, M=64, H=56, W=56, K=3, padding=1)
    deep = workloads.Workload("r7", B=8, C=512, M=512, H=7, W=7, K=3, padding=1)
    for shape in (big, deep):
        t = tc.mma_config(shape)
        assert {k: t[k] for k in tc.TILE} in tc.CANDIDATES.values()
    assert tc.MMA.applies(big) and tc.MMA.config(big) == tc.mma_config(big)
    assert tc.mma_config(big)["SPLIT_K"] == 1 and tc.mma_config(deep)["SPLIT_K"] > 1   # 7x7, B=8: too few tiles
    r7 = workloads.Workload("r7", B=32, C=512, M=512, H=7, W=7, K=3, padding=1)
    assert tc.mma_config(r7)["SPLIT_K"] == 1          # 104 of 132 SMs busy: a split cost more (SPLIT_BELOW)


def test_default_split_k_runs():
    """mma_config's split for a layer with few output tiles (sms=... a big GPU for a small layer)
    computes it right; a tile passed without SPLIT_K gets no split."""
    x = cl.randn(1, 64, 4, 4).half()
    w = cl.randn(16, 64, 3, 3).half()
    b = cl.randn(16).half()
    shape = workloads.Workload("tiny", B=1, C=64, M=16, H=4, W=4, K=3, padding=1)   # 18 BK=32 steps
    t = tc.mma_config(shape, sms=64)
    assert t["SPLIT_K"] > 1
    _check(tc.conv2d_mma(x, w, bias=b, padding=1, **t), _reference(x, w, b, padding=1), 64, 3, 3)
    tc.conv2d_mma(x, w, padding=1, **SMALL)
    small = tuple(SMALL.get(n) for n in tc.TUNABLES)             # SMALL's tile, SPLIT_K left out
    (plan,) = [v for k, v in tc._plans.items() if k[:2] == ((1, 64, 4, 4), (16, 64, 3, 3)) and k[-2] == small]
    assert plan.gemm.reduce is None and plan.gemm.launch.grid[1] == 1     # SPLIT_K 1: no reducing pass


def test_shared_memory_opt_in():
    """A tile over 48 KB of shared memory launches with the opt-in; without it the launch is refused."""
    from convlab.ops._kernels import Launch

    t = tc.CANDIDATES["128x128x32 s4 (2x2 warps)"]
    assert tc.shared_bytes(**t) > 48 * 1024
    x = cl.randn(1, 8, 4, 4).half()
    w = cl.randn(8, 8, 1, 1).half()
    tc.conv2d_mma(x, w, **t)
    (plan,) = [v for k, v in tc._plans.items() if k[:2] == ((1, 8, 4, 4), (8, 8, 1, 1))]
    launch = plan.gemm.launch
    assert launch.max_shared == tc.shared_bytes(**t)
    bare = Launch(launch.path, launch.kernel, dict(launch.defines), launch.scalars, grid=launch.grid,
                  block=launch.block, shared=launch.shared)
    y = torch.empty(1, 4, 4, 8, dtype=torch.float16, device=x.device)
    xn, wn = x.permute(0, 2, 3, 1).contiguous(), w.permute(0, 2, 3, 1).contiguous()
    with pytest.raises(cl.LaunchError, match="opt in"):
        bare(xn, wn, wn, y, tc._no_workspace(x), 0)


# ---- groups: one GEMM a group, channels padded per group -----------------------------------------

NARROW = dict(BM=64, BN=16, BK=32, WARPS_M=2, WARPS_N=1, STAGES=3)

# (B, C, H, W, M, groups, Kh, Kw, stride, padding, dilation, tunables)
GROUPED = [
    (2, 16, 6, 5, 24, 2, 3, 3, 1, 1, 1, SMALL),                     # C/g 8, M/g 12: a group's map tile has a tail
    (1, 64, 7, 6, 80, 4, 3, 3, 2, 1, 1, NARROW),                    # C/g 16, M/g 20: 2 narrow map tiles a group
    (1, 384, 5, 4, 128, 32, 3, 3, 1, 1, 1, NARROW),                 # 32 groups, C/g 12 padded to 16
    (2, 24, 5, 9, 18, 2, 1, 7, 1, (0, 3), (1, 2), dict(SMALL, BK=16)),   # 1x7, dilated columns, C/g 12, M/g 9
    (1, 32, 6, 6, 32, 4, 3, 3, 1, 2, 2, dict(NARROW, SPLIT_K=3)),   # dilation 2, split-K over 3 of 5 steps
]


def _gids(case):
    B, C, H, W, M, g, Kh, Kw, s, p, d, t = case
    tile = f"{t['BM']}x{t['BN']}x{t['BK']}-split{t.get('SPLIT_K', 1)}" if t else "default"
    return f"B{B}C{C}M{M}g{g}-{H}x{W}-k{Kh}x{Kw}-s{s}-p{p}-d{d}-{tile}".replace(" ", "")


def _layer(case, channels_last=False):
    B, C, H, W, M, g, Kh, Kw, s, p, d, t = case
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = cl.randn(B, C, H, W).half().contiguous(memory_format=fmt)
    w = cl.randn(M, C // g, Kh, Kw).half().contiguous(memory_format=fmt)
    return x, w, dict(stride=s, padding=p, dilation=d, groups=g)


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("case", GROUPED, ids=_gids)
def test_grouped_forward(case, channels_last):
    """Grouped layers from both layouts against torch's grouped conv2d in fp64 (outputs start NaN)."""
    B, C, H, W, M, g, Kh, Kw, s, p, d, t = case
    x, w, kw = _layer(case, channels_last)
    b = cl.randn(M).half()
    y = tc.conv2d_mma(x, w, bias=b, **kw, **t)
    assert y.is_contiguous(memory_format=torch.channels_last)
    _check(y, _reference(x, w, b, **kw), C // g, Kh, Kw)


def _dx_reference(dy, w, x_shape, **kw):
    x = torch.zeros(x_shape, dtype=torch.float64, requires_grad=True)
    F.conv2d(x, w.double().cpu(), **kw).backward(dy.double().cpu())
    return x.grad


# dX on the grouped shapes, and what only dX has: stride phases (several taps, one tap, none: the
# odd pixels of a 1x1 stride-2 layer are zero), an input one row and column past the smallest,
# padding past dilation*(K-1) (the phase's padding negative), split-K over a phase
DX = [dict(case=c) for c in GROUPED] + [
    dict(case=(2, 16, 7, 8, 16, 1, 3, 3, 2, 1, 1, SMALL)),                         # 4 phases: 2x2, 2x1, 1x2, 1x1 taps
    dict(case=(1, 32, 8, 9, 24, 2, 3, 3, 2, 1, 2, NARROW)),                        # stride 2, dilation 2, groups
    dict(case=(2, 16, 6, 7, 24, 1, 1, 1, 2, 0, 1, SMALL)),                         # 1x1 s2: 3 of 4 phases zero
    dict(case=(1, 24, 9, 9, 16, 1, 3, 5, (3, 2), (1, 2), 1, dict(SMALL, BK=64)), extra=(2, 1)),   # input past the smallest
    dict(case=(1, 8, 6, 5, 16, 1, 1, 3, 1, (1, 2), 1, SMALL)),                     # padding > d*(K-1): negative in dX
    dict(case=(1, 16, 9, 7, 16, 2, 3, 3, 2, 1, 1, dict(SMALL, BK=16, SPLIT_K=2))),   # split-K in each phase
]


def _dxids(c):
    return _gids(c["case"]) + ("-extra{}x{}".format(*c["extra"]) if "extra" in c else "")


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("dx_case", DX, ids=_dxids)
def test_dx(dx_case, channels_last):
    """dE/dX against torch's autograd in fp64, dy NCHW or channels_last; dx starts NaN."""
    case = dx_case["case"]
    B, C, H, W, M, g, Kh, Kw, s, p, d, t = case
    eh, ew = dx_case.get("extra", (0, 0))
    H, W = H + eh, W + ew
    x, w, kw = _layer((B, C, H, W, M, g, Kh, Kw, s, p, d, t), channels_last)
    Ho, Wo = F.conv2d(x.double().cpu(), w.double().cpu(), **kw).shape[2:]
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    dy = cl.randn(B, M, Ho, Wo).half().contiguous(memory_format=fmt)
    dx = tc.conv2d_mma_dx(dy, w, input_size=(H, W), **kw, **t)
    assert dx.shape == (B, C, H, W) and dx.is_contiguous(memory_format=torch.channels_last)
    _check(dx, _dx_reference(dy, w, (B, C, H, W), **kw), M // g, Kh, Kw)


def test_dx_given_output_and_default_tile():
    """A given dx (NaN first) is written whole; without tunables mma_dx_config's tile runs; without
    input_size the smallest input."""
    dy = cl.randn(2, 24, 4, 4).half()
    w = cl.randn(24, 8, 3, 3).half()
    kw = dict(stride=2, padding=1, groups=2)
    dx = torch.full((2, 16, 7, 7), float("nan"), dtype=torch.float16, device=dy.device)
    dx = dx.to(memory_format=torch.channels_last)
    assert tc.conv2d_mma_dx(dy, w, dx, **kw) is dx
    _check(dx, _dx_reference(dy, w, (2, 16, 7, 7), **kw), 12, 3, 3)


def test_groups_config_and_applies():
    """A grouped layer of few maps a group gets a narrow tile, every group's blocks counted; the
    Impls take grouped layers, not depthwise ones; a grouped default tile computes right."""
    g32 = workloads.get("resnext_g32_28")                    # 8 channels and 8 maps a group
    t = tc.mma_config(g32)
    assert {k: t[k] for k in tc.TILE} in tc.CANDIDATES.values() and t["BN"] == 16     # the narrowest
    assert tc.mma_dx_config(g32)["BN"] == 16
    assert tc.MMA.takes(g32) and tc.MMA_DX.takes(g32)
    dw_layer = workloads.Workload("dw", B=1, C=8, M=8, H=5, W=5, K=3, padding=1, groups=8)
    huge = workloads.Workload("huge", B=4096, C=256, M=256, H=56, W=56, K=3, padding=1, groups=2)   # x: 3.3e9 halves
    for impl in (tc.MMA, tc.MMA_DX, tc.MMA_DW):
        assert impl.takes(workloads.get("resnet_3x3_56")) and not impl.takes(dw_layer) and not impl.takes(huge)
    x = cl.randn(1, 32, 5, 6).half()
    w = cl.randn(32, 8, 3, 3).half()
    _check(tc.conv2d_mma(x, w, padding=1, groups=4), _reference(x, w, None, padding=1, groups=4), 8, 3, 3)


def test_dx_phases():
    """Each dx pixel's taps are exactly the phase's: (r + p - k*d) % s == 0, every tap once."""
    for n, K, s, p, d in ((9, 3, 2, 1, 1), (10, 5, 3, 2, 2), (6, 1, 2, 0, 1), (7, 3, 1, 1, 2)):
        phases = tc.dx_phases(n, 1, (K, 1), (s, 1), (p, 0), (d, 1))
        assert sorted(ph[0][0] for ph in phases) == list(range(min(s, n)))
        assert sum(len(ph[0][2]) for ph in phases) == K
        for (r, size, taps, pad, dil), _ in phases:
            assert size == len(range(r, n, s)) and all((r + p - k * d) % s == 0 for k in taps)


def test_group_and_dx_errors():
    x = cl.randn(1, 16, 5, 5).half()
    with pytest.raises(ValueError, match="depthwise"):
        tc.conv2d_mma(x, cl.randn(16, 1, 3, 3).half(), groups=16)
    with pytest.raises(ValueError, match="groups=3"):
        tc.conv2d_mma(x, cl.randn(12, 8, 3, 3).half(), groups=3)
    dy = cl.randn(1, 8, 3, 3).half()
    w = cl.randn(8, 16, 3, 3).half()
    with pytest.raises(ValueError, match="input_size"):
        tc.conv2d_mma_dx(dy, w, stride=2, padding=1, input_size=(8, 5))
    with pytest.raises(ValueError, match="channels_last"):
        tc.conv2d_mma_dx(dy, w, torch.empty(1, 16, 5, 5, dtype=torch.float16, device=dy.device), padding=0)


# ---- dW: per group dy^T times x's windows, split over the pixels --------------------------------

# dW on the grouped shapes (their tiles read as dW tiles: maps x columns x pixels), and: stride 2 with
# dilation and 5 splits of 2 steps (3 shares empty: they store zeros); a 128x128x64 tile over 136
# maps (a map tile's tail) with K's columns a tail too; a 1x1 stride-2 layer; mma_dw_config's tile
DW = [dict(case=c) for c in GROUPED] + [
    dict(case=(1, 32, 8, 9, 24, 2, 3, 3, 2, 1, 2, dict(BM=16, BN=32, BK=32, WARPS_M=1, WARPS_N=1, STAGES=4, SPLIT_K=5))),
    dict(case=(1, 16, 6, 6, 136, 1, 3, 3, 1, 1, 1, dict(BM=128, BN=128, BK=64, WARPS_M=2, WARPS_N=2, STAGES=2,
                                                         SPLIT_K=2))),
    dict(case=(2, 16, 7, 6, 24, 1, 1, 1, 2, 0, 1, dict(SMALL, BK=16))),
    dict(case=(2, 24, 9, 7, 16, 1, 3, 5, (2, 1), (1, 2), 1, {})),
]


def _dw_reference(x, dy, w_shape, **kw):
    w = torch.zeros(w_shape, dtype=torch.float64, requires_grad=True)
    F.conv2d(x.double().cpu(), w, **kw).backward(dy.double().cpu())
    return w.grad


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("dw_case", DW, ids=lambda c: _gids(c["case"]))
def test_dw(dw_case, channels_last):
    """dE/dW against torch's autograd in fp64, x and dy NCHW or channels_last; the workspace and dw
    start NaN. The bound: float sums of B*Ho*Wo products of rounded halves."""
    B, C, H, W, M, g, Kh, Kw, s, p, d, t = dw_case["case"]
    x, w, kw = _layer(dw_case["case"], channels_last)
    Ho, Wo = F.conv2d(x.double().cpu(), w.double().cpu(), **kw).shape[2:]
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    dy = cl.randn(B, M, Ho, Wo).half().contiguous(memory_format=fmt)
    dw = tc.conv2d_mma_dw(x, dy, kernel_size=(Kh, Kw), **kw, **t)
    assert dw.shape == w.shape and dw.is_contiguous(memory_format=torch.channels_last)
    check_fp16(dw, _dw_reference(x, dy, tuple(w.shape), **kw), C=B * Ho * Wo, K=1, accumulate="float",
               rounded_inputs=True)


def test_dw_given_output_config_and_errors():
    """A given dw (NaN first) is written whole; mma_dw_config narrows the map tile to a group's maps
    and splits a long reduction; bad tiles and shapes say what to change."""
    x = cl.randn(2, 16, 6, 6).half()
    dy = cl.randn(2, 16, 3, 3).half()
    kw = dict(stride=2, padding=1, groups=2)
    dw = torch.full((16, 8, 3, 3), float("nan"), dtype=torch.float16, device=x.device)
    dw = dw.to(memory_format=torch.channels_last)
    assert tc.conv2d_mma_dw(x, dy, dw, kernel_size=3, **kw) is dw
    check_fp16(dw, _dw_reference(x, dy, (16, 8, 3, 3), **kw), C=18, K=1, accumulate="float", rounded_inputs=True)
    g32 = workloads.get("resnext_g32_28")
    assert tc.mma_dw_config(g32)["BM"] == 16 and tc.MMA_DW.takes(g32)
    assert tc.mma_dw_config(workloads.get("resnet_3x3_56"))["SPLIT_K"] > 1      # 9 tiles of 64x64, 25,088 pixels
    with pytest.raises(ValueError, match="gives"):
        tc.conv2d_mma_dw(x, dy, kernel_size=3, padding=1)                        # stride 1 gives 6x6, not 3x3
    with pytest.raises(ValueError, match="BM and BN"):
        tc.conv2d_mma_dw(x, dy, kernel_size=3, BM=48, **kw)
    with pytest.raises(ValueError, match="SPLIT_K"):
        tc.conv2d_mma_dw(x, dy, kernel_size=3, SPLIT_K=tc.MAX_DW_SPLIT + 1, **kw)


def test_backward_impls_run_through_the_harness():
    """measure.run times MMA_DX and MMA_DW as the dX and dW passes (op conv2d_dx_fp16 / conv2d_dw_fp16),
    each output checked against the fp64 reference first."""
    from convlab.programs import measure

    wl = workloads.Workload("g", B=1, C=16, M=16, H=6, W=5, K=3, stride=2, padding=1, groups=2)
    df = measure.run([tc.MMA_DX, tc.MMA_DW], [wl], dtype="fp16", layout="channels_last", torch_baseline=False, reps=1)
    assert sorted(zip(df["impl"], df["pass"])) == [(tc.MMA_DW.name, "dW"), (tc.MMA_DX.name, "dX")]
