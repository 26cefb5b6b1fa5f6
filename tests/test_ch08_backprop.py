"""Chapter 8's computations behind its glued numbers (convlab/chapters/ch08_backprop.py): the bound
a dW element is held to is the measuring harness's own."""
import pytest
import torch

from convlab.chapters import ch08_backprop as ch8
from convlab.measuring import workloads
from convlab.programs import measure


def test_dw_bound_is_the_harness_tolerance_over_the_rms():
    ref = torch.randn(1000, dtype=torch.float64)
    rms = float(ref.pow(2).mean().sqrt())
    for n in (9, 576, 65_536, 200_704, 10 ** 8):
        assert ch8.dw_bound(n) * rms == pytest.approx(measure._atol(ref, "fp32", n), rel=1e-12)


def test_dw_bound_widens_only_for_long_sums():
    # the forward pass's longest sum (C*K*K) keeps cl.check's share; dW's B*Ho*Wo widen it
    longest_forward = max(wl.C * wl.K ** 2 for wl in workloads.WORKLOADS_2D)
    assert ch8.dw_bound(longest_forward) == 1e-4
    resnet = workloads.get("resnet")
    assert ch8.dw_bound(resnet.B * resnet.Ho * resnet.Wo) > 1e-4
