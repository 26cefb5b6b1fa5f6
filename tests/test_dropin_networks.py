"""The networks' layer lists (convlab.measuring.network_layers) against what their papers and torchvision
quote, and benchmarks/dropin_networks.py as far as no GPU is needed: every route of its three
smoke layers against fp64 (--emu-smoke), and its summary from rows alone."""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from convlab.measuring import network_layers


#: Multiply-adds per 224x224 image, in millions, as torchvision's model cards give them (its GFLOPS
#: column counts multiply-adds), less the layers that are no convolutions: VGG-16's three fully
#: connected ones (123.6 M), EfficientNet-B0's (1.28 M); MobileNetV3's head is 1x1 convolutions
#: in the paper (NBN), counted as such. Within the rounding of the figures quoted.
QUOTED_MMACS = {"resnet50": (4090, 0.005), "vgg16": (15470 - 123.6, 0.005), "mobilenetv3": (220, 0.03),
                "efficientnet_b0": (390 - 1.28, 0.02)}
CONVOLUTIONS = {"resnet50": 53, "vgg16": 13, "unet_resblocks": 58}


@pytest.mark.parametrize("net", network_layers.NETWORKS)
def test_the_layer_lists_are_the_networks(net):
    layers = network_layers.all_layers(net, 1)
    if net in QUOTED_MMACS:
        quoted, rel = QUOTED_MMACS[net]
        assert network_layers.macs(net) / 1e6 == pytest.approx(quoted, rel=rel)
    if net in CONVOLUTIONS:
        assert len(layers) == CONVOLUTIONS[net]
    distinct = network_layers.layers(net, 32)
    assert sum(c for _, c in distinct) == len(layers) and all(wl.B == 32 for wl, _ in distinct)
    names = [wl.name for wl, _ in distinct]
    assert len(set(names)) == len(names), "a distinct layer's name says what it is, once"
    for wl in layers:
        assert wl.Ho >= 1 and wl.padding == wl.K // 2 and wl.C % wl.groups == 0


def test_each_networks_layers_chain():
    """Each layer's input is the size the one before it gives (ResNet-50's shortcut and VGG's pools aside)."""
    vgg = network_layers.all_layers("vgg16", 1)
    assert [(wl.C, wl.M, wl.H) for wl in vgg[:3]] == [(3, 64, 224), (64, 64, 224), (64, 128, 112)]
    assert vgg[-1].H == 14
    r50 = network_layers.all_layers("resnet50", 1)
    assert (r50[0].K, r50[0].stride, r50[-1].C, r50[-1].M, r50[-1].Ho) == (7, 2, 512, 2048, 7)
    mbv3 = network_layers.all_layers("mobilenetv3", 1)
    dw = [wl for wl in mbv3 if wl.family == "depthwise"]
    assert len(dw) == 15 and dw[-1].Ho == 7 and {wl.K for wl in dw} == {3, 5}
    unet = network_layers.layers("unet_resblocks", 1)
    assert max(wl.C for wl, _ in unet) == 2560 and {wl.H for wl, _ in unet} == {8, 16, 32, 64}


def test_the_benchmarks_smoke_run_checks_every_route(capsys):
    from benchmarks import dropin_networks as D

    assert D.main(["--emu-smoke"]) == 0
    out = capsys.readouterr().out
    assert "every route gives the fp64 result" in out
    lines = out.splitlines()
    for _, name in D.SMOKE:         # each dtype, pass and layout of x
        assert sum(line.startswith(name + " ") and line.endswith(" pass") for line in lines) == 3 * 2 * 2


def test_the_summary_weighs_each_layer_as_often_as_the_network_has_it():
    from benchmarks import dropin_networks as D

    rows = []
    for layer, count, ours, theirs in (("a", 1, 2.0, 1.0), ("b", 3, 1.0, 2.0)):
        base = dict(gpu="GPU", network="resnet50", layer=layer, count=count, B=32, dtype="fp16", adds="",
                    **{"pass": "forward"})
        rows += [dict(base, who="ours", layout="channels_last", kernel="wgmma", check="pass", caller_ms=ours,
                      gpu_ms=ours),
                 dict(base, who="torch", layout="nchw", kernel="k", check="", caller_ms=theirs, gpu_ms=theirs),
                 dict(base, who="torch", layout="channels_last", kernel="k", check="", caller_ms=2 * theirs,
                      gpu_ms=theirs)]
    s = network_layers.summary(pd.DataFrame(rows))
    (r,) = s.to_dict("records")
    assert r["caller"] == pytest.approx(math.exp((math.log(0.5) + 3 * math.log(2.0)) / 4))
    assert (r["layers"], r["worst"], r["fallback"]) == (2, 0.5, 0)
    assert "1 of" not in "\n".join(D.report(pd.DataFrame(rows)))


def test_the_committed_summary_is_the_summary_of_the_committed_rows():
    """The chapters glue numbers from the results file through network_layers.summary: it gives
    back the summary the benchmark wrote beside it."""
    results = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
    for csv_path in sorted(results.glob("dropin_networks_*.csv")):
        s = network_layers.summary(pd.read_csv(csv_path, keep_default_na=False, na_values=[""]))
        written = csv_path.with_suffix(".txt").read_text().splitlines()
        for r in s.to_dict("records"):
            line = (f"{r['network']} {r['dtype']} {r['pass']} {r['B']} {r['layout']} {r['layers']} "
                    f"{r['caller']:.3f} {r['gpu']:.3f} {r['worst']:.3f} {r['fallback']}")
            assert line in {" ".join(w.split()) for w in written}, line
