"""The napkin math every chapter quotes: FLOPs, bytes, floors, result rows."""
import math

import pytest

from convlab.measuring import roofline, workloads
from convlab.measuring.workloads import WORKLOADS, WORKLOADS_2D, Workload


def test_the_design_table():
    assert [w.name for w in WORKLOADS_2D] == ["lenet_c1", "lenet_c3", "fa17", "days100", "resnet"]
    assert set(WORKLOADS) == {"lenet_c1", "lenet_c3", "fa17", "days100", "resnet", "conv3d"}
    fa17 = workloads.get("fa17")
    assert fa17.B * fa17.M == 500_000  # the one that breaks blockIdx.z over B·M


@pytest.mark.parametrize("name, y_shape, flops, nbytes", [
    # 2·B·M·Ho·Wo·C·K², and 4·(input + weights + output), worked out by hand
    ("lenet_c1", (10000, 4, 80, 80), 2 * 10000 * 4 * 80 * 80 * 1 * 49,
     4 * (10000 * 1 * 86 * 86 + 4 * 1 * 49 + 10000 * 4 * 80 * 80)),
    ("lenet_c3", (10000, 16, 34, 34), 2 * 10000 * 16 * 34 * 34 * 4 * 49,
     4 * (10000 * 4 * 40 * 40 + 16 * 4 * 49 + 10000 * 16 * 34 * 34)),
    ("fa17", (10000, 50, 24, 24), 2 * 10000 * 50 * 24 * 24 * 1 * 25,
     4 * (10000 * 28 * 28 + 50 * 25 + 10000 * 50 * 24 * 24)),
    ("days100", (1, 128, 256, 256), 2 * 128 * 256 * 256 * 32 * 9,
     4 * (32 * 256 * 256 + 128 * 32 * 9 + 128 * 256 * 256)),
    ("resnet", (64, 64, 56, 56), 2 * 64 * 64 * 56 * 56 * 64 * 9,
     4 * (64 * 64 * 56 * 56 + 64 * 64 * 9 + 64 * 64 * 56 * 56)),
    ("conv3d", (1, 1, 252, 124, 124), 2 * 252 * 124 * 124 * 125,
     4 * (256 * 128 * 128 + 125 + 252 * 124 * 124)),
])
def test_flops_and_bytes(name, y_shape, flops, nbytes):
    w = workloads.get(name)
    assert w.y_shape == y_shape
    assert w.flops == flops == 2 * w.macs
    assert w.bytes == nbytes
    assert w.intensity == pytest.approx(flops / nbytes)


def test_the_numbers_quoted_in_chapter_1():
    w = workloads.get("lenet_c1")
    assert w.macs == 12_544_000_000  # "12.5 G multiply-adds, 25 GFLOP"
    assert round(w.flops / 1e9, 1) == 25.1


def test_stride_and_padding():
    w = Workload("t", B=1, C=1, M=1, H=23, W=18, K=3, stride=2, padding=1)
    assert (w.Ho, w.Wo) == ((23 + 2 - 3) // 2 + 1, (18 + 2 - 3) // 2 + 1) == (12, 9)


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_small_twins_keep_the_character(name):
    full = workloads.get(name)
    small = full.small()
    assert small.B <= 2 and small.dims == full.dims
    assert (small.K, small.stride, small.padding) == (full.K, full.stride, full.padding)
    assert small.Ho >= 1 and small.Wo >= 1 and small.Ho <= 20 and small.Wo <= 20
    assert small.flops < full.flops and small.flops < 1e8  # emulator-sized
    assert small.name.startswith(full.name)


@pytest.mark.parametrize("name", [w.name for w in WORKLOADS_2D])
def test_cpu_sized_twins(name):
    full = workloads.get(name)
    cut = full.scaled_to(2e8)
    assert 0.5e8 < cut.flops <= 1.5 * 2e8
    assert (cut.C, cut.M, cut.K, cut.padding) == (full.C, full.M, full.K, full.padding)


def test_workload_of_tensors():
    import torch
    x, w = torch.empty(3, 4, 23, 18, device="meta"), torch.empty(5, 4, 3, 3, device="meta")
    wl = Workload.of(x, w, stride=2, padding=1, name="t")
    assert wl == Workload("t", B=3, C=4, M=5, H=23, W=18, K=3, stride=2, padding=1)
    assert wl.y_shape == (3, 5, 12, 9)
    w3 = Workload.of(torch.empty(1, 1, 9, 8, 7, device="meta"), torch.empty(1, 1, 3, 3, 3, device="meta"))
    assert (w3.D, w3.dims, w3.y_shape) == (9, 3, (1, 1, 7, 6, 5))
    assert Workload.of(torch.empty(9, 8, 7, device="meta"), torch.empty(3, 3, 3, device="meta")) == w3
    with pytest.raises(ValueError, match="does not fit"):
        Workload.of(x, torch.empty(5, 3, 3, 3, device="meta"))


def test_roofline_floor():
    roof = roofline.Roofline("test GPU", bandwidth=1e12, flop_rate=10e12)
    assert roof.ridge == 10
    assert roof.floor_ms(flops=1e9, nbytes=1e9) == pytest.approx(1.0)  # memory: 1 GB at 1 TB/s
    assert roof.floor_ms(flops=1e11, nbytes=1e9) == pytest.approx(10.0)  # compute: 100 GFLOP at 10 TFLOP/s
    assert roof.bound(1e9, 1e9) == "memory" and roof.bound(1e11, 1e9) == "compute"


def test_reference_floor_of_lenet_c1():
    w = workloads.get("lenet_c1")
    floor = roofline.REFERENCE_H200.floor_ms(w.flops, w.bytes)
    assert floor == pytest.approx(w.flops / 51e12 * 1e3)  # compute-bound on the H200
    assert 0.45 < floor < 0.5


def test_result_rows():
    from convlab.measuring import results

    class Timing:
        ms, p25, p75 = 2.0, 1.9, 2.2

    w = workloads.get("resnet")
    roof = roofline.Roofline("test GPU", bandwidth=1e12, flop_rate=10e12)
    row = results.row(w, "naive", Timing(), roof=roof, device="test GPU")
    assert set(row) == set(results.COLUMNS)
    assert row["gflops"] == pytest.approx(w.flops / 2e-3 / 1e9)
    assert row["gbs"] == pytest.approx(w.bytes / 2e-3 / 1e9)
    assert row["floor_frac"] == pytest.approx(roof.floor_ms(w.flops, w.bytes) / 2.0)
    assert row["gpu"] == "test GPU" and row["tf32"] == "TF32 off"
    cpu_row = results.row(w, "C++", Timing(), device="CPU: x", cudnn="n/a (CPU)")
    assert math.isnan(cpu_row["floor_frac"]) and cpu_row["cudnn"] == "n/a (CPU)"
    with pytest.raises(KeyError):
        results.row(w, "C++", Timing(), device="CPU: x", no_such_column=1)


def test_a_general_layer_keeps_both_axes():
    wl = Workload("g", B=2, C=6, M=9, H=15, W=14, K=(3, 2), stride=(1, 2), padding=(3, 0), dilation=(3, 2), groups=3)
    assert (wl.K, wl.Kw, wl.stride, wl.stride_w, wl.padding, wl.padding_w, wl.dilation, wl.dilation_w) == \
        (3, 2, 1, 2, 3, 0, 3, 2)
    assert wl.w_shape == (9, 2, 3, 2) and not wl.plain and wl.family == "grouped"
    # torch's output size: (n + 2p - d(k-1) - 1) // s + 1 per axis
    assert (wl.Ho, wl.Wo) == ((15 + 6 - 6 - 1) // 1 + 1, (14 + 0 - 2 - 1) // 2 + 1)
    assert wl.reduction == 2 * 3 * 2 and wl.macs == wl.outputs * 12
    assert wl.conv_kwargs() == {"stride": (1, 2), "padding": (3, 0), "dilation": (3, 2), "groups": 3}
    assert wl.shape_text == "B=2, C=6→M=9, 15×14, K=3×2, stride (1, 2), pad (3, 0), dilation (3, 2), groups 3"
    assert wl == Workload("g", B=2, C=6, M=9, H=15, W=14, K=3, Kw=2, stride=1, stride_w=2, padding=3, padding_w=0,
                          dilation=3, dilation_w=2, groups=3)
    import torch
    assert Workload.of(torch.empty(2, 6, 15, 14, device="meta"), torch.empty(9, 2, 3, 2, device="meta"),
                       stride=(1, 2), padding=(3, 0), dilation=(3, 2), groups=3, name="g") == wl
    with pytest.raises(ValueError, match="groups"):
        Workload("bad", B=1, C=6, M=4, H=8, W=8, K=3, groups=4)


def test_plain_layers_read_as_before():
    wl = workloads.get("resnet")
    assert wl.plain and wl.family == "standard" and (wl.Kw, wl.stride_w, wl.padding_w, wl.groups) == (3, 1, 1, 1)
    assert wl.conv_kwargs() == {"stride": 1, "padding": 1} and wl.kernel_size == 3
    assert wl.shape_text == "B=64, C=64→M=64, 56×56, K=3×3, pad 1"      # the key of book/data's rows


@pytest.mark.parametrize("wl", workloads.LAYERS, ids=lambda w: w.name)
def test_the_general_layers_and_their_small_twins(wl):
    import torch
    import torch.nn.functional as F

    small = wl.small()
    assert workloads.get(wl.name) is wl and wl.plain == (wl.family == "standard")
    assert small.family == wl.family and small.B <= 2 and small.Ho <= 20 and small.Wo <= 20
    assert (small.K, small.Kw, small.stride, small.stride_w, small.dilation, small.dilation_w) == \
        (wl.K, wl.Kw, wl.stride, wl.stride_w, wl.dilation, wl.dilation_w)
    assert small.M // small.groups * small.groups == small.M and small.macs < 1e7
    for w in (wl, small):
        y = F.conv2d(torch.empty(w.x_shape, device="meta"), torch.empty(w.w_shape, device="meta"), **w.conv_kwargs())
        assert tuple(y.shape) == w.y_shape
    assert set(workloads.FAMILIES) == {"depthwise", "grouped", "dilated", "nonsquare", "standard"}
