"""Chapter 12's kernels (kernels/12_tf32, convlab/ops/tf32.py) against torch in float64, on awkward
shapes (C = 1, odd sizes, a mask of 5 with padding 3, maps past a tile, a split reduction), with
the error bound derived for each precision (tf32.tf32_tolerance: TF32 about 2^-11 per product,
3xTF32 about fp32's). Outputs are poisoned (NaN) first: one never written fails. On the emulator
the TF32 arithmetic is the model of clemu_mma_numerics.h; on an H100/H200 the same tests run the
GPU (the wgmma kernel only on sm_90).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import convlab as cl
from convlab.ops.shapes import layer
from convlab.ops.tf32 import (TF32_MMA, TF32_WGMMA, TF32X3_MMA, TF32X3_WGMMA, check_tf32, conv2d_tf32_mma,
                              conv2d_wgmma_tf32, nhwc, split_tf32, tf32_tolerance, tf32_wgmma_config,
                              wgmma_runs_here)

# (B, C, H, W, M, (Kh, Kw), stride, padding, dilation)
MMA_CASES = [
    (1, 1, 5, 7, 3, (3, 3), 1, 0, 1),           # one channel (padded to 4), 3 maps of a 64-map tile
    (2, 6, 9, 11, 10, (3, 3), 1, 1, 1),         # odd everything, padding
    (2, 5, 11, 9, 17, (3, 2), 2, (2, 1), 2),    # strided, dilated, non-square
    (1, 40, 6, 7, 72, (2, 2), 1, 0, 1),         # a partial second 32-channel step, 72 maps: two tiles of 64
]
# (B, C, H, W, M, K, padding, tunables)
WGMMA_CASES = [
    (1, 1, 5, 7, 3, 3, 0, {}),                  # one channel, 3 maps
    (2, 6, 9, 11, 10, 3, 1, {}),
    (2, 8, 6, 5, 16, 5, 3, dict(BW=4, BH=3, BI=1)),     # padding 3 of a 5x5 mask: boxes far outside
    (1, 40, 7, 8, 72, 2, 0, dict(SPLITS=3)),            # split reduction, a partial channel step
    (3, 8, 5, 5, 136, 1, 0, dict(MAPS=64, BN=64)),      # 1x1, three map tiles of 64, boxes of 3 images
]


def _ref(x, w, b, **conv):
    return F.conv2d(x.double().cpu(), w.double().cpu(), None if b is None else b.double().cpu(), **conv)


@pytest.mark.parametrize("products", [1, 3])
@pytest.mark.parametrize("case", MMA_CASES, ids=lambda c: "B{}C{}-{}x{}-M{}-k{}s{}p{}d{}".format(*c))
def test_tf32_mma_against_fp64(case, products):
    B, C, H, W, M, K, stride, padding, dilation = case
    x, w, b = cl.randn(B, C, H, W), cl.randn(M, C, *K), cl.randn(M)
    y = conv2d_tf32_mma(x, w, stride=stride, padding=padding, dilation=dilation, bias=b, products=products)
    s = layer(x.shape, w.shape, stride, padding, dilation, 1)
    check_tf32(y, _ref(x, w, b, stride=stride, padding=padding, dilation=dilation), s,
               TF32_MMA if products == 1 else TF32X3_MMA)


@pytest.mark.parametrize("products", [1, 3])
@pytest.mark.parametrize("case", WGMMA_CASES, ids=lambda c: "B{}C{}-{}x{}-M{}-k{}p{}".format(*c[:7]))
def test_tf32_wgmma_against_fp64(case, products):
    if not wgmma_runs_here():
        pytest.skip("wgmma needs an H100/H200 (or the emulator)")
    B, C, H, W, M, K, padding, tun = case
    x, w, b = cl.randn(B, C, H, W), cl.randn(M, C, K, K), cl.randn(M)
    y = conv2d_wgmma_tf32(x, w, padding=padding, bias=b, products=products, **tun)
    s = layer(x.shape, w.shape, 1, padding, 1, 1)
    check_tf32(y, _ref(x, w, b, padding=padding), s, TF32_WGMMA if products == 1 else TF32X3_WGMMA)


def test_channels_last_input_and_a_given_output():
    """A channels_last x of C % 4 == 0 is read as it is by the mma.sync kernel; the wgmma kernel lays
    it out like any other; both write a given NCHW y."""
    x = cl.randn(2, 8, 6, 7).contiguous(memory_format=torch.channels_last)
    w = cl.randn(12, 8, 3, 3)
    ref = _ref(x, w, None, padding=1)
    s = layer(x.shape, w.shape, 1, 1, 1, 1)
    for f, impl in ((conv2d_tf32_mma, TF32X3_MMA), (conv2d_wgmma_tf32, TF32X3_WGMMA)):
        if f is conv2d_wgmma_tf32 and not wgmma_runs_here():
            continue
        y = cl.to_device(torch.full((2, 12, 6, 7), float("nan")))
        assert f(x, w, y, padding=1) is y
        check_tf32(y, ref, s, impl)


def test_3xtf32_is_as_accurate_as_fp32_and_tf32_is_not():
    """On the same inputs: 3xTF32's error is within a few times fp32's (torch's float32 conv2d on
    the CPU), TF32's a hundred times larger or more; and each error is within its derived bound."""
    x, w = cl.randn(1, 64, 6, 6), cl.randn(8, 64, 3, 3)
    ref = _ref(x, w, None)
    err = {p: (conv2d_tf32_mma(x, w, products=p).cpu().double() - ref).abs().max().item() for p in (1, 3)}
    fp32 = (F.conv2d(x.cpu(), w.cpu()).double() - ref).abs().max().item()
    assert err[3] < 4 * fp32 and err[1] > 100 * fp32
    rms = ref.pow(2).mean().sqrt().item()
    for p in (1, 3):
        rtol, atol_rms = tf32_tolerance(64 * 9, p)
        assert err[p] <= atol_rms * rms + rtol * ref.abs().max().item()


def test_the_layout_pass():
    """nhwc(t, mode): NCHW and channels_last in, (B, H, W, C4) out with zero channels past C; mode 1
    rounds to TF32, mode 2 splits, bit for bit as convlab.ops.tf32.split_tf32."""
    t = cl.randn(3, 5, 4, 6)
    for src in (t, t.contiguous(memory_format=torch.channels_last)):
        raw, none = nhwc(src, 0)
        assert none is None and raw.shape == (3, 4, 6, 8)
        assert torch.equal(raw[..., :5].cpu(), t.permute(0, 2, 3, 1).cpu()) and raw[..., 5:].eq(0).all()
        hi, lo = nhwc(src, 2)
        want_hi, want_lo = split_tf32(t.permute(0, 2, 3, 1).cpu())
        assert torch.equal(hi[..., :5].cpu(), want_hi) and torch.equal(lo[..., :5].cpu(), want_lo)
        assert torch.equal(nhwc(src, 1)[0].cpu(), hi.cpu())


def test_wgmma_config_spreads_the_board_shape():
    """The ranked conv2d_v2 shape (128 maps of a 32x32 mask over 128 x 256 x 256): the tile's units
    fill the SMs' rounds to within a few percent, by a split reduction."""
    s = layer((1, 128, 256, 256), (128, 128, 32, 32), 1, 0, 1, 1)
    t = tf32_wgmma_config(s, sms=132)
    tiles = (-(-s.Wo // t["BW"])) * (-(-s.Ho // t["BH"])) * (-(-s.B // t["BI"]))
    units = tiles * t["SPLITS"]
    assert t["SPLITS"] > 1 and units / (132 * -(-units // 132)) > 0.95


def test_refusals_say_why():
    x, w = cl.randn(1, 4, 8, 8), cl.randn(4, 4, 3, 3)
    with pytest.raises(ValueError, match="stride 1"):
        conv2d_wgmma_tf32(x, w, stride=2)
    with pytest.raises(ValueError, match="one group"):
        conv2d_tf32_mma(x, cl.randn(4, 2, 3, 3), groups=2)
    with pytest.raises(TypeError, match="float32"):
        conv2d_tf32_mma(x.half(), w.half())
    with pytest.raises(ValueError, match="products"):
        conv2d_tf32_mma(x, w, products=2)
