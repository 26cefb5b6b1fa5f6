"""Chapter 9's tensor-core convolution (kernels/09_general/conv2d_mma.cu, convlab.ops.tensor_core)
on the emulator, against torch in float64 on the same half values.

Shapes are small (the emulator runs every lane's mma.sync on the CPU) but awkward: pixel counts
and map counts that are not multiples of the tile, channels 3 (padded to 8), 8, 16, 24 (one BK=32
step spans several taps), odd and even masks, 3x5, stride, padding, dilation, B=1, non-square,
several blocks along both axes, and every tile shape and pipeline depth mma_config can choose.
Outputs start as NaN (the launchers poison them on the emulator), so one never written fails.
Tolerance: chapter 6's fp16_tolerance for float sums of rounded inputs (the output's rounding).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import convlab as cl
from convlab import workloads
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
    (plan,) = [v for k, v in tc._plans.items() if k[:2] == ((1, 64, 4, 4), (16, 64, 3, 3)) and k[-1] == small]
    assert plan.reduce is None and plan.launch.grid[1] == 1     # SPLIT_K 1: no reducing pass


def test_shared_memory_opt_in():
    """A tile over 48 KB of shared memory launches with the opt-in; without it the launch is refused."""
    from convlab.ops._kernels import Launch

    t = tc.CANDIDATES["128x128x32 s4 (2x2 warps)"]
    assert tc.shared_bytes(**t) > 48 * 1024
    x = cl.randn(1, 8, 4, 4).half()
    w = cl.randn(8, 8, 1, 1).half()
    tc.conv2d_mma(x, w, **t)
    (plan,) = [v for k, v in tc._plans.items() if k[:2] == ((1, 8, 4, 4), (8, 8, 1, 1))]
    launch = plan.launch
    assert launch.max_shared == tc.shared_bytes(**t)
    bare = Launch(launch.path, launch.kernel, dict(launch.defines), launch.scalars, grid=launch.grid,
                  block=launch.block, shared=launch.shared)
    y = torch.empty(1, 4, 4, 8, dtype=torch.float16, device=x.device)
    xn, wn = x.permute(0, 2, 3, 1).contiguous(), w.permute(0, 2, 3, 1).contiguous()
    with pytest.raises(cl.LaunchError, match="opt in"):
        bare(xn, wn, wn, y, tc._no_workspace(x), 0)
