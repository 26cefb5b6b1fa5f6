"""The drop-in's precision switch (convlab.ops.dispatch.fp32_precision, conv2d's and Conv2d's
precision=): by default a float32 convolution keeps fp32's accuracy (torch's own default turns
cuDNN's TF32 flag on, so the flag is a permission, not a request); torch's float32 matmul
precision 'high' gives 3xTF32, 'medium' TF32 where cuDNN's flag allows it; precision= decides
when given. Each result is checked against float64 with the bound derived for the kernel that
ran (tf32.check_tf32, or fp32's), and TF32's error is shown to be TF32's.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import convlab as cl
from convlab.ops import dispatch, dropin
from convlab.ops.shapes import layer
from convlab.ops.tf32 import TF32_MMA, TF32_WGMMA, TF32X3_MMA, TF32X3_WGMMA, check_tf32, tf32_tolerance


@pytest.fixture
def switches():
    """Set torch's switches inside a test (cuDNN's TF32 flag by the legacy name every torch has);
    torch's own state comes back after it."""
    matmul, flag = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32

    def set_(matmul_precision="highest", cudnn_tf32=None):
        torch.set_float32_matmul_precision(matmul_precision)
        if cudnn_tf32 is not None:
            torch.backends.cudnn.allow_tf32 = cudnn_tf32
    yield set_
    torch.set_float32_matmul_precision(matmul)
    torch.backends.cudnn.allow_tf32 = flag


def _layer(stride=1):
    x, w, b = cl.randn(2, 16, 7, 9), cl.randn(24, 16, 3, 3), cl.randn(24)
    ref = F.conv2d(x.double().cpu(), w.double().cpu(), b.double().cpu(), stride=stride, padding=1)
    return x, w, b, ref, layer(x.shape, w.shape, stride, 1, 1, 1)


def _tensor_core(precision: str, stride: int):
    wg, mma = (TF32_WGMMA, TF32_MMA) if precision == "tf32" else (TF32X3_WGMMA, TF32X3_MMA)
    return wg if stride == 1 and wg.applies(layer((1, 1, 8, 8), (1, 1, 3, 3), 1, 1, 1, 1)) else mma


def test_by_default_fp32(switches):
    switches(cudnn_tf32=True)                                     # torch's default: TF32 allowed ...
    assert dispatch.fp32_precision() == "fp32"                    # ... and not used
    x, w, b, ref, s = _layer()
    assert dispatch.forward_impl(x, w, b, padding=1).key not in {i.key for i in (TF32_MMA, TF32X3_MMA, TF32_WGMMA,
                                                                                 TF32X3_WGMMA)}
    cl.check(dropin.conv2d(x, w, b, padding=1), ref)


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("matmul,cudnn_tf32,want", [("high", True, "3xtf32"), ("medium", True, "tf32"),
                                                    ("medium", False, "3xtf32"), ("highest", True, "fp32")])
def test_torch_switches(switches, matmul, cudnn_tf32, want, stride):
    switches(matmul, cudnn_tf32)
    assert dispatch.fp32_precision() == want
    x, w, b, ref, s = _layer(stride)
    y = dropin.conv2d(x, w, b, stride=stride, padding=1)
    if want == "fp32":
        cl.check(y, ref)
        return
    impl = _tensor_core(want, stride)
    assert dispatch.forward_impl(x, w, b, stride=stride, padding=1) is impl
    check_tf32(y, ref, s, impl)


def test_explicit_precision_wins_and_is_checked(switches):
    switches("highest", False)
    x, w, b, ref, s = _layer()
    assert dispatch.forward_impl(x, w, b, padding=1, precision="tf32") is _tensor_core("tf32", 1)
    y = dropin.conv2d(x, w, b, padding=1, precision="tf32")
    check_tf32(y, ref, s, _tensor_core("tf32", 1))
    # TF32's error is TF32's: well past 3xTF32's bound
    rtol, atol_rms = tf32_tolerance(s.reduction, 3)
    assert (y.cpu().double() - ref).abs().max() > atol_rms * ref.pow(2).mean().sqrt() + rtol * ref.abs().max()
    m = dropin.Conv2d(16, 24, 3, padding=1, precision="3xtf32", device=x.device)
    with torch.no_grad():
        m.weight.copy_(w)
        m.bias.copy_(b)
        check_tf32(m(x), ref, s, _tensor_core("3xtf32", 1))
    with pytest.raises(ValueError, match="precision"):
        dropin.Conv2d(16, 24, 3, precision="bf16")
    with pytest.raises(ValueError, match="precision"):
        dropin.conv2d(x, w, precision="half")


def test_a_switch_changes_the_kept_route(switches):
    """The drop-in keeps a route per call signature: the precision is part of it."""
    x, w, b, ref, s = _layer()
    switches("highest")
    first = dropin.conv2d(x, w, b, padding=1)
    switches("high")
    second = dropin.conv2d(x, w, b, padding=1)
    switches("highest")
    assert torch.equal(dropin.conv2d(x, w, b, padding=1).cpu(), first.cpu())
    check_tf32(second, ref, s, _tensor_core("3xtf32", 1))
    assert not torch.equal(first.cpu(), second.cpu())


def test_layers_the_tensor_core_kernels_refuse_keep_fp32(switches):
    """A depthwise layer (groups = C) under 'medium': the fp32 rule's kernel, fp32's accuracy; and
    float16 is not float32's business."""
    switches("medium", True)
    x, w = cl.randn(2, 8, 9, 9), cl.randn(8, 1, 3, 3)
    assert dispatch.forward_impl(x, w, padding=1, groups=8).key == "depthwise"
    cl.check(dropin.conv2d(x, w, padding=1, groups=8), F.conv2d(x.double().cpu(), w.double().cpu(), padding=1,
                                                                  groups=8))
    xh, wh = cl.randn(1, 16, 6, 6).half(), cl.randn(8, 16, 3, 3).half()
    assert dispatch.forward_impl(xh, wh, padding=1).op == "conv2d_fp16"


@pytest.mark.skipif(not hasattr(torch.backends.cudnn, "conv"), reason="torch without per-op TF32 settings")
def test_the_new_api_setting_for_convolutions_is_read(switches):
    """torch.backends.cudnn.conv.fp32_precision = "ieee" (the new API, convolutions only: reading
    the legacy flag then raises, as the two APIs disagree) is cuDNN's TF32 flag off."""
    switches("medium")
    before = torch.backends.cudnn.conv.fp32_precision
    try:
        torch.backends.cudnn.conv.fp32_precision = "ieee"
        assert dispatch.fp32_precision() == "3xtf32"
        torch.backends.cudnn.conv.fp32_precision = "tf32"
        assert dispatch.fp32_precision() == "tf32"
    finally:
        torch.backends.cudnn.conv.fp32_precision = before
