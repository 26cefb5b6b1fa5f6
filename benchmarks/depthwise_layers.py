#!/usr/bin/env python3
"""Depthwise layers (MobileNetV2 3x3, ConvNeXt 7x7): every variant of our two depthwise kernels
against torch at its best, and all of them against the memory floor.

    python benchmarks/depthwise_layers.py                        # every layer, fp32 and fp16
    python benchmarks/depthwise_layers.py --layers convnext_dw7_56 --dtypes fp16 --reps 50
    CONVLAB_BACKEND=emu python benchmarks/depthwise_layers.py    # emulator: small twins, checks only

Contenders per layer and dtype (edit CONFIGS below to try others):
- ours NCHW:  general.conv2d_depthwise (kernels/09_general/conv2d_depthwise.cu), its default
              config (what the drop-in general.conv2d runs) and the tunables in CONFIGS["nchw"];
- ours NHWC:  depthwise.conv2d_depthwise_nhwc (conv2d_depthwise_nhwc.cu) on channels_last x,
              default and CONFIGS["nhwc"];
- torch NCHW and torch channels_last: F.conv2d, cudnn.benchmark on (cuDNN or torch's own
              depthwise kernels, whichever torch picks), TF32 off (strict_fp32).
Every contender's output is first checked against an fp64 reference (ours written into
NaN-filled outputs, so an element never written fails); a failing row says FAIL and the script
exits 1. Timings: cl.bench (CUDA events, L2 flushed before each call, median of --reps).

The floor: these layers are memory-bound, so no kernel beats reading x once and writing y once.
bytes = x + y + mask + bias; floor_ms = bytes / the DRAM bandwidth, both
- the spec bandwidth of the GPU (PEAK_GBS below by name, or --peak-gbs), and
- the copy bandwidth measured here (a device-to-device copy of x's size: read + write),
and each row prints GB/s (bytes / its time) and the fraction of both floors it reaches.
ratio = torch best (the faster of NCHW and channels_last) / that row's time: above 1, ours is
faster. 1.5x torch best can only happen where torch best is below 2/3 of the floor.

On a GPU the rows go to benchmarks/results/depthwise_layers_<gpu>.csv (or --csv).
"""
from __future__ import annotations

import argparse
import math
import sys
import zlib
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import convlab as cl  # noqa: E402
from benchmarks.general_layers import DTYPES, LAYERS, _dw, check, cudnn_benchmark, meta, save_rows  # noqa: E402
from convlab.baselines import strict_fp32  # noqa: E402
from convlab.ops import depthwise, general  # noqa: E402

# the 7 depthwise layers of general_layers.py, a batch-64 and a 112x112 MobileNetV2 layer
DW_LAYERS = [lay for lay in LAYERS if lay.kind == "depthwise"] + [
    replace(_dw("mbv2_dw3_56", 64, 144, 56, 3), name="mbv2_dw3_56_b64"),
    _dw("mbv2_dw3_112", 32, 96, 112, 3),
]

# Tunables tried besides each launcher's default ({} = the default). Keys: the launchers' keywords.
CONFIGS = {
    "nchw": [dict(vec=1),                                   # one element per load (the old tile load)
             dict(OY=2), dict(OY=8), dict(OY=16), dict(BX=64), dict(OY=8, BX=64)],
    "nhwc": [dict(vec=8), dict(OY=1, OX=4), dict(OY=2, OX=2), dict(OY=4, OX=4), dict(OY=4, OX=2),
             dict(OY=8, OX=2), dict(OY=2, OX=8), dict(vec=8, OY=4, OX=2), dict(PB=4), dict(PB=16)],
}

# DRAM bandwidth by GPU name (spec sheets, GB/s); others: --peak-gbs, or the copy bandwidth only
PEAK_GBS = {"H200": 4800, "H100 SXM": 3350, "H100 80GB HBM3": 3350, "H100 PCIe": 2000, "A100-SXM4-80GB": 2039,
            "A100-SXM4-40GB": 1555, "A100-PCIE": 1555, "L4": 300, "T4": 320}


def peak_gbs(name: str, given: float | None) -> float | None:
    if given:
        return given
    for key, v in PEAK_GBS.items():
        if key.lower() in name.lower():
            return v
    return None


def copy_gbs(nbytes: int, reps: int) -> float:
    """GB/s of a device-to-device copy moving nbytes (half read, half written): what DRAM gives a
    plain streaming kernel here."""
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = cl.bench(lambda: dst.copy_(src), reps=reps).ms
    return nbytes / (ms * 1e-3) / 1e9


def contenders(lay, x, xc, w, b, kw):
    """(name, layout, tunables, fn(y or None) -> y) of every variant to check and time."""
    g = general.geometry(x.shape, w.shape, **kw)
    out = []
    if general.depthwise_applies(g):
        for tun in [{}] + CONFIGS["nchw"]:
            out.append(("ours NCHW", "NCHW", tun,
                        lambda y, t=tun: general.conv2d_depthwise(x, w, y, bias=b, **kw, **t)))
    if depthwise.nhwc_applies(g):
        for tun in [{}] + CONFIGS["nhwc"]:
            out.append(("ours NHWC", "NHWC", tun,
                        lambda y, t=tun: depthwise.conv2d_depthwise_nhwc(xc, w, y, bias=b, **kw, **t)))
    return out


def bench_layer(lay, dtype, reps, peak, copy, log) -> list[dict]:
    dev = cl.device().torch_device
    on_gpu = dev == "cuda"
    gen = torch.Generator(device=dev).manual_seed(zlib.crc32(lay.name.encode()))
    x = torch.randn(lay.B, lay.C, lay.H, lay.W, device=dev, generator=gen).to(dtype)
    w = torch.randn(lay.M, 1, *lay.K, device=dev, generator=gen).to(dtype)
    b = torch.randn(lay.M, device=dev, generator=gen).to(dtype)
    xc = x.to(memory_format=torch.channels_last)
    kw = lay.args()
    with strict_fp32():
        ref = F.conv2d(x.double(), w.double(), b.double(), **kw)
    n = w[0].numel() + 1
    nbytes = (x.numel() + ref.numel() + w.numel() + b.numel()) * x.element_size()
    dname = str(dtype).split(".")[-1]

    def row(name, layout, tun, ms, status):
        r = {"layer": lay.name, "shape": lay.text(), "dtype": dname, "contender": name, "layout": layout,
             "config": ",".join(f"{k}={v}" for k, v in tun.items()) or "default", "check": status,
             "ms": ms, "bytes": nbytes, "GBps": nbytes / (ms * 1e-3) / 1e9 if ms else float("nan")}
        r["of_copy_floor"] = r["GBps"] / copy if copy else float("nan")
        r["of_spec_floor"] = r["GBps"] / peak if peak else float("nan")
        return r

    rows = []
    with strict_fp32(), cudnn_benchmark(True):
        for name, xin in (("torch NCHW", x), ("torch channels_last", xc)):
            status = check(F.conv2d(xin, w, b, **kw), ref, dtype, n, "y")
            ms = cl.bench(lambda xin=xin: F.conv2d(xin, w, b, **kw), reps=reps).ms
            rows.append(row(name, "NCHW" if xin is x else "NHWC", {}, ms, status))
        # torch's rows set the baseline even if one misses the check (the row says so: a torch
        # result outside the bound is itself a finding, not a reason to stop the run)
        torch_best = min(r["ms"] for r in rows) if on_gpu else float("nan")
        for name, layout, tun, fn in contenders(lay, x, xc, w, b, kw):
            try:
                nan = torch.full(ref.shape, float("nan"), dtype=dtype, device=dev)
                y = fn(nan.to(memory_format=torch.channels_last) if layout == "NHWC" else nan)
                status = check(y, ref, dtype, n, "y")
                ms = cl.bench(lambda fn=fn: fn(None), reps=reps).ms
            except ValueError as e:              # a config the layer does not take (a block too large)
                status, ms = f"skipped: {str(e)[:80]}", float("nan")
            rows.append(row(name, layout, tun, ms, status))
    for r in rows:
        r["torch_best_ms"] = torch_best
        r["ratio_to_torch_best"] = torch_best / r["ms"] if r["ms"] == r["ms"] else float("nan")
        log(r)
    return rows


HEADER = (f"{'layer':<17} {'dtype':<7} {'contender':<20} {'config':<18} {'ms':>8} {'GB/s':>7} "
          f"{'%copy':>6} {'%spec':>6} {'vs torch':>8}  check")


def fmt(r) -> str:
    pct = lambda v: f"{100 * v:>5.0f}%" if v == v else f"{'-':>6}"  # noqa: E731
    return (f"{r['layer']:<17} {r['dtype']:<7} {r['contender']:<20} {r['config']:<18} {r['ms']:>8.4f} "
            f"{r['GBps']:>7.0f} {pct(r['of_copy_floor'])} {pct(r['of_spec_floor'])} "
            f"{r['ratio_to_torch_best']:>7.2f}x  {r['check']}")


def geomean(v):
    return math.exp(sum(map(math.log, v)) / len(v)) if v else float("nan")


def summary(rows) -> list[str]:
    """Per layer and dtype: torch best, ours default (the drop-in's NCHW path; NHWC default) and
    ours best (any checked config), each as a fraction of the copy floor; geometric means."""
    out = ["", "# summary per layer: ms (fraction of the copy floor); ratio = torch best / ours",
           f"# {'layer':<17} {'dtype':<7} {'torch best':>16} {'NCHW default':>16} {'NHWC default':>16} "
           f"{'ours best':>16}  best config"]
    ratios = {}
    keys = dict.fromkeys((r["layer"], r["dtype"]) for r in rows)
    for lay, d in keys:
        rs = [r for r in rows if (r["layer"], r["dtype"]) == (lay, d) and r["check"] == "ok"]
        tb = min((r for r in rs if r["contender"].startswith("torch")), key=lambda r: r["ms"], default=None)
        nchw = next((r for r in rs if r["contender"] == "ours NCHW" and r["config"] == "default"), None)
        nhwc = next((r for r in rs if r["contender"] == "ours NHWC" and r["config"] == "default"), None)
        best = min((r for r in rs if r["contender"].startswith("ours")), key=lambda r: r["ms"], default=None)
        cell = lambda r: f"{r['ms']:.4f} ({100 * r['of_copy_floor']:.0f}%)" if r else "-"  # noqa: E731
        out.append(f"# {lay:<17} {d:<7} {cell(tb):>16} {cell(nchw):>16} {cell(nhwc):>16} {cell(best):>16}  "
                   + (f"{best['contender']} {best['config']}" if best else ""))
        for what, r in (("NCHW default", nchw), ("NHWC default", nhwc), ("ours best", best)):
            if tb and r:
                ratios.setdefault((d, what), []).append(tb["ms"] / r["ms"])
    out.append("# geometric mean of torch best / ours:")
    for (d, what), v in sorted(ratios.items()):
        out.append(f"#   {d:<8} {what:<13} {geomean(v):.2f}x over {len(v)} layers")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", default="", help="comma-separated layer names (default all: "
                    + ", ".join(lay.name for lay in DW_LAYERS) + ")")
    ap.add_argument("--dtypes", default="fp32,fp16", help="fp32, fp16 or both (default both)")
    ap.add_argument("--reps", type=int, default=None, help="timed runs per contender (GPU default 30, emulator 1)")
    ap.add_argument("--peak-gbs", type=float, default=None, help="the GPU's DRAM bandwidth in GB/s "
                    "(default: PEAK_GBS by the GPU's name)")
    ap.add_argument("--csv", default=None, help="where to write the CSV")
    args = ap.parse_args(argv)

    dev = cl.device()
    on_gpu = dev.backend == "cuda"
    reps = args.reps or (30 if on_gpu else 1)
    names = [s for s in args.layers.split(",") if s]
    dtypes = [s for s in args.dtypes.split(",") if s]
    known = [lay.name for lay in DW_LAYERS]
    if set(names) - set(known) or set(dtypes) - set(DTYPES):
        ap.error(f"unknown layers or dtypes; layers: {', '.join(known)}; dtypes: {', '.join(DTYPES)}")
    layers = [lay for lay in DW_LAYERS if not names or lay.name in names]
    m = meta()
    peak = copy = None
    print(f"# {dev}")
    print(f"# torch {m['torch']}, cuDNN {m['cudnn']}, TF32 off, cudnn.benchmark on, {m['date']}")
    if on_gpu:
        peak = peak_gbs(m["gpu"], args.peak_gbs)
        copy = copy_gbs(256 << 20, reps)
        print(f"# DRAM: spec {peak or 'unknown (pass --peak-gbs)'} GB/s; a 256 MB device copy runs at {copy:.0f} GB/s "
              "(%copy and %spec: a row's GB/s over these)")
    else:
        layers = [replace(lay.small(), B=2) for lay in layers]
        print("# EMULATOR: small twins, wall times of a CPU emulator: these are checks, NOT GPU timings")
    print(HEADER)
    rows = []
    for lay in layers:
        for d in dtypes:
            rows += bench_layer(lay, DTYPES[d], reps, peak, copy, lambda r: print(fmt(r), flush=True))
    for line in summary(rows):
        print(line)
    gpu = m["gpu"].replace(" ", "_") if on_gpu else m["backend"]
    save_rows(rows, {**m, "peak_GBps": peak, "copy_GBps": copy},
              args.csv or (str(ROOT / "benchmarks" / "results" / f"depthwise_layers_{gpu}.csv") if on_gpu else
                           str(ROOT / ".convlab-cache" / "depthwise_layers_emu.csv")), on_gpu)
    bad = [r for r in rows if r["check"] != "ok" and not r["check"].startswith("skipped")]
    for r in bad:
        print("# FAILED its check: " + fmt(r))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
