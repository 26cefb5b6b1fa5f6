"""The channels-last depthwise kernel (kernels/09_general/conv2d_depthwise_nhwc.cu,
convlab.ops.depthwise) on awkward shapes, against torch in float64. Outputs are NaN-poisoned on the
emulator, so an output never written fails the check. Tolerances as in test_general_conv.py."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import convlab as cl
from convlab.ops import depthwise, shapes
from convlab.ops.fp16 import check_fp16

DTYPES = [torch.float32, torch.float16]

# (B, C, H, W, K(h, w), stride, padding, dilation): W not a multiple of OX, C not a multiple of the
# vector (down to 1 channel a thread), B=1, C=1, odd and even masks, stride 2, dilation, 7x7
SHAPES = [
    (2, 8, 9, 11, (3, 3), 1, 1, 1),
    (1, 12, 10, 7, (3, 3), 2, 1, 1),
    (2, 6, 13, 9, (7, 7), 1, 3, 1),
    (1, 1, 8, 9, (3, 3), 1, 1, 1),                  # C=1
    (2, 10, 7, 10, (2, 4), (2, 1), (1, 2), 1),      # even masks, C=10: two channels a thread
    (1, 16, 12, 11, (3, 5), 1, (2, 4), (2, 2)),     # dilation, padding past the mask's span
    (3, 4, 5, 6, (5, 5), (1, 2), 0, 1),             # no padding
]


def _ids(s):
    return "B{}C{}-{}x{}-k{}x{}-s{}-p{}-d{}".format(s[0], s[1], s[2], s[3], *s[4], s[5], s[6], s[7]).replace(" ", "")


def _check(out, ref, dtype, n, name):
    if dtype == torch.float16:
        return check_fp16(out, ref, C=n, K=1, accumulate="float", rounded_inputs=True, name=name)
    return cl.check(out, ref, name=name)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16"])
@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
def test_depthwise_nhwc(shape, dtype):
    B, C, H, W, K, st, pad, dil = shape
    kw = dict(stride=st, padding=pad, dilation=dil, groups=C)
    x = cl.randn(B, C, H, W, dtype=dtype).to(memory_format=torch.channels_last)
    w, b = cl.randn(C, 1, *K, dtype=dtype), cl.randn(C, dtype=dtype)
    g = shapes.layer(x.shape, w.shape, **kw)
    assert depthwise.nhwc_applies(g)
    ref = F.conv2d(x.double().cpu(), w.double().cpu(), b.double().cpu(), **kw)
    n = w[0].numel() + 1
    runs = [dict(), dict(vec=8, OY=1, OX=3, PB=3), dict(vec=2, OY=3, OX=1, CB=1), dict(vec=1, OX=5)]
    for tun in runs:
        y = depthwise.conv2d_depthwise_nhwc(x, w, bias=b, **kw, **tun)
        assert y.is_contiguous(memory_format=torch.channels_last) and y.shape == ref.shape
        _check(y, ref, dtype, n, f"y {tun}")
    y = cl.empty(*ref.shape, dtype=dtype).to(memory_format=torch.channels_last)
    y.fill_(float("nan"))
    out = depthwise.conv2d_depthwise_nhwc(x, w, y, **kw)
    assert out.data_ptr() == y.data_ptr()
    _check(y, F.conv2d(x.double().cpu(), w.double().cpu(), None, **kw), dtype, n, "y (given, no bias)")


def test_nhwc_converts_an_nchw_x_and_refuses_what_it_does_not_take():
    x, w = cl.randn(2, 4, 8, 8), cl.randn(4, 1, 3, 3)
    with cl.debug():
        y = depthwise.conv2d_depthwise_nhwc(x, w, groups=4)        # converted to channels_last in the call
    assert y.is_contiguous(memory_format=torch.channels_last)
    cl.check(y, F.conv2d(x.double().cpu(), w.double().cpu(), groups=4))
    xc = x.to(memory_format=torch.channels_last)
    with pytest.raises(ValueError, match="one map per channel"):
        depthwise.conv2d_depthwise_nhwc(xc, cl.randn(8, 1, 3, 3), groups=4)      # a channel multiplier
    with pytest.raises(ValueError, match="vec="):
        depthwise.conv2d_depthwise_nhwc(xc, cl.randn(4, 1, 3, 3), groups=4, vec=3)


@pytest.mark.emu_only
def test_nhwc_no_race_under_other_thread_orders():
    x = cl.randn(2, 6, 9, 10).to(memory_format=torch.channels_last)
    w, b = cl.randn(6, 1, 3, 3), cl.randn(6)
    out = cl.empty(2, 6, 9, 10).to(memory_format=torch.channels_last)
    problem = cl.find_race(lambda: depthwise.conv2d_depthwise_nhwc(x, w, out, padding=1, groups=6, bias=b, PB=4), out)
    assert problem is None, problem
