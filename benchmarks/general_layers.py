#!/usr/bin/env python3
"""Time chapter 9's general kernels (convlab.ops.general) on the layers modern networks use,
against torch: depthwise 3x3 and 7x7 (MobileNet, ConvNeXt), grouped (ResNeXt), dilated
(DeepLab), non-square (Inception) and a few standard layers.

    python benchmarks/general_layers.py                          # every layer, fp32 and fp16, forward
    python benchmarks/general_layers.py --kinds depthwise --dtypes fp32
    python benchmarks/general_layers.py --backward               # + forward, dX and dW through autograd
    CONVLAB_BACKEND=emu python benchmarks/general_layers.py      # emulator: small twins, checks only

Per layer and dtype: ours (the drop-in's forward: the depthwise kernel where groups == C, else the
general one; NCHW, the layout our kernels take) against torch with cudnn.benchmark on, in NCHW and
in channels_last (the input and the mask converted before timing, so torch is timed at its best
layout), strict fp32 (TF32 off). speedup = the faster of torch's two / ours. Every output is first
checked against an fp64 reference of the same (fp16: already rounded) inputs; a row that fails is
reported and exits 1. Timings: cl.bench (CUDA events, warm-up, L2 flushed, median of --reps), torch
in this process (not convlab.measure's fresh process per layout: these layers are not Workloads,
which have no groups, dilation or non-square masks). On a GPU the rows go to
benchmarks/results/general_layers_cuda.csv.
With --backward, also forward + dX + dW through autograd (ours: Conv2dFunction; torch: autograd),
each gradient checked.

On the emulator the same code runs on each layer's small twin (B=2, at most 8 channels, at most
12x12) and only checks; its times are CPU wall times, NOT GPU timings, and the CSV says so.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import datetime as dt
import math
import sys
import zlib
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import convlab as cl  # noqa: E402
from convlab.baselines import strict_fp32, versions  # noqa: E402
from convlab.ops import general  # noqa: E402
from convlab.ops.fp16 import fp16_tolerance  # noqa: E402

DTYPES = {"fp32": torch.float32, "fp16": torch.float16}


@dataclass(frozen=True)
class Layer:
    name: str
    kind: str                 # depthwise | grouped | dilated | nonsquare | standard
    B: int
    C: int
    M: int
    H: int
    W: int
    K: tuple                  # (Kh, Kw)
    stride: tuple = (1, 1)
    padding: tuple = (0, 0)
    dilation: tuple = (1, 1)
    groups: int = 1

    def small(self) -> "Layer":
        """The emulator's twin: the same mask, stride, dilation, padding and kind of grouping, with
        B=2, at most 8 channels (4 groups of 2 for a grouped layer) and at most 12x12 (or the mask's span)."""
        if self.groups == self.C:                      # depthwise, with its channel multiplier
            C = min(self.C, 8)
            g, M = C, C * (self.M // self.C)
        elif self.groups > 1:
            g = min(self.groups, 4)
            C, M = g * min(self.C // self.groups, 2), g * min(self.M // self.groups, 2)
        else:
            g, C, M = 1, min(self.C, 8), min(self.M, 8)
        span = [(k - 1) * d + 1 for k, d in zip(self.K, self.dilation)]
        H, W = (min(n, max(12, s)) for n, s in zip((self.H, self.W), span))
        return replace(self, name=self.name + "_small", B=2, C=C, M=M, H=H, W=W, groups=g)

    def args(self) -> dict:
        return dict(stride=self.stride, padding=self.padding, dilation=self.dilation, groups=self.groups)

    def text(self) -> str:
        s = f"B={self.B} C={self.C}->M={self.M} {self.H}x{self.W} k{self.K[0]}x{self.K[1]}"
        for name, v, d in (("s", self.stride, (1, 1)), ("p", self.padding, None), ("d", self.dilation, (1, 1))):
            if v != d:
                s += f" {name}{v[0]}" if v[0] == v[1] else f" {name}{v}"
        return s + (f" g{self.groups}" if self.groups > 1 else "")


def _dw(name, B, C, HW, K, stride=1):
    return Layer(name, "depthwise", B, C, C, HW, HW, (K, K), (stride, stride), (K // 2, K // 2), groups=C)


LAYERS = [
    _dw("mbv2_dw3_56", 32, 144, 56, 3),
    _dw("mbv2_dw3_28", 32, 192, 28, 3),
    _dw("mbv2_dw3_14", 32, 384, 14, 3),
    _dw("mbv2_dw3_56_s2", 32, 144, 56, 3, stride=2),
    _dw("convnext_dw7_56", 32, 128, 56, 7),
    _dw("convnext_dw7_28", 32, 256, 28, 7),
    _dw("convnext_dw7_14", 32, 512, 14, 7),
    Layer("resnext_g32_56", "grouped", 32, 128, 128, 56, 56, (3, 3), padding=(1, 1), groups=32),
    Layer("resnext_g32_28", "grouped", 32, 256, 256, 28, 28, (3, 3), padding=(1, 1), groups=32),
    Layer("deeplab_d2_28", "dilated", 16, 256, 256, 28, 28, (3, 3), padding=(2, 2), dilation=(2, 2)),
    Layer("deeplab_d4_28", "dilated", 16, 256, 256, 28, 28, (3, 3), padding=(4, 4), dilation=(4, 4)),
    Layer("inception_1x7_17", "nonsquare", 32, 128, 128, 17, 17, (1, 7), padding=(0, 3)),
    Layer("inception_7x1_17", "nonsquare", 32, 128, 128, 17, 17, (7, 1), padding=(3, 0)),
    Layer("resnet_3x3_56", "standard", 32, 64, 64, 56, 56, (3, 3), padding=(1, 1)),
    Layer("resnet_1x1_56", "standard", 32, 256, 64, 56, 56, (1, 1)),
    Layer("resnet_stem_7x7_s2", "standard", 32, 3, 64, 224, 224, (7, 7), (2, 2), (3, 3)),
]
KINDS = sorted({lay.kind for lay in LAYERS})


@contextlib.contextmanager
def cudnn_benchmark(on: bool):
    saved = torch.backends.cudnn.benchmark
    try:
        torch.backends.cudnn.benchmark = on
        yield
    finally:
        torch.backends.cudnn.benchmark = saved


def save_rows(rows: list[dict], meta: dict, csv_path: str | None, on_gpu: bool) -> Path:
    """GPU rows to benchmarks/results/ (to be committed), an emulator's checks to the ignored cache;
    every row with the run's metadata (GPU, versions, date)."""
    folder = ROOT / "benchmarks" / "results" if on_gpu else ROOT / ".convlab-cache"
    out = Path(csv_path) if csv_path else folder / f"general_layers_{meta['backend']}.csv"
    out.parent.mkdir(parents=True, exist_ok=True)
    fields = list(dict.fromkeys(k for r in rows for k in r)) + [k for k in meta]
    with open(out, "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=fields)
        wr.writeheader()
        for r in rows:
            wr.writerow({**r, **meta})
    print(f"# wrote {out}")
    return out


def meta():
    v = versions()
    dev = cl.device()
    return {"backend": dev.backend, "gpu": dev.name if dev.backend == "cuda" else "CPU emulator",
            "torch": v["torch"], "cudnn": v["cudnn"], "tf32": "off", "cudnn_benchmark": "on",
            "date": dt.date.today().isoformat(),
            "timing": "GPU: CUDA events, L2 flushed, median" if dev.backend == "cuda"
            else "emulator wall time, NOT a GPU timing"}


def check(out, ref, dtype, n: int, name: str) -> str:
    """'ok' or 'FAIL: ...': fp32 cl.check's rule; fp16 the bound of fp16_tolerance for half inputs,
    float sums over n terms and a half result (tests/test_conformance.py's)."""
    rtol = atol = None
    if dtype == torch.float16:
        rtol, atol_rms = fp16_tolerance(max(n, 1), 1, accumulate="float", rounded_inputs=True)
        atol = atol_rms * max(float(ref.double().pow(2).mean().sqrt()), 1e-30)
    res = cl.check(out, ref, rtol=rtol, atol=atol, name=name, raise_on_error=False)
    return "ok" if isinstance(res, cl.CheckResult) else "FAIL: " + str(res).splitlines()[0][:200]


def bench_layer(lay: Layer, dtype, reps: int, backward: bool, log) -> list[dict]:
    dev = cl.device().torch_device
    gen = torch.Generator(device=dev).manual_seed(zlib.crc32(lay.name.encode()))
    x = torch.randn(lay.B, lay.C, lay.H, lay.W, device=dev, generator=gen).to(dtype)
    w = torch.randn(lay.M, lay.C // lay.groups, *lay.K, device=dev, generator=gen).to(dtype)
    kw = lay.args()
    g = general.geometry(x.shape, w.shape, **kw)
    kernel = "depthwise" if general.depthwise_applies(g) else "general"
    n_fwd = w[0].numel()
    with strict_fp32():
        ref = F.conv2d(x.double(), w.double(), **kw)
    status = check(general.conv2d_forward(x, w, **kw), ref, dtype, n_fwd, "y")
    del ref
    row = {"layer": lay.name, "kind": lay.kind, "shape": lay.text(), "dtype": str(dtype).split(".")[-1],
           "pass": "forward", "ours_kernel": kernel, "check": status}
    xc, wc = x.to(memory_format=torch.channels_last), w.to(memory_format=torch.channels_last)
    with strict_fp32(), cudnn_benchmark(True):
        row["ours_ms"] = cl.bench(lambda: general.conv2d_forward(x, w, **kw), reps=reps).ms
        row["torch_nchw_ms"] = cl.bench(lambda: F.conv2d(x, w, **kw), reps=reps).ms
        row["torch_nhwc_ms"] = cl.bench(lambda: F.conv2d(xc, wc, **kw), reps=reps).ms
    row["torch_best_ms"] = min(row["torch_nchw_ms"], row["torch_nhwc_ms"])
    row["speedup"] = row["torch_best_ms"] / row["ours_ms"]
    log(row)
    rows = [row]
    if backward:
        dx_kernel = "depthwise" if general.depthwise_dx_padding(g) and general.depthwise_applies(g) else "general"
        rows.append(bench_backward(lay, x, w, xc, wc, dtype, reps, gen, f"{kernel}, dX {dx_kernel}, dW general"))
        log(rows[-1])
    return rows


def bench_backward(lay, x, w, xc, wc, dtype, reps, gen, kernels: str) -> dict:
    """forward + dX + dW through autograd: ours (general.conv2d) against torch's, each checked."""
    kw = lay.args()
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    with strict_fp32():
        y = F.conv2d(x, w, **kw)
    dy = torch.randn(y.shape, device=x.device, generator=gen).to(dtype)
    with strict_fp32():
        xd, wd = x.double().requires_grad_(), w.double().requires_grad_()
        rx, rw = torch.autograd.grad(F.conv2d(xd, wd, **kw), (xd, wd), dy.double())
        del xd, wd
    gx, gw = torch.autograd.grad(general.conv2d(xg, wg, **kw), (xg, wg), dy)
    pixels = dy.numel() // lay.M
    status = check(gx, rx, dtype, lay.M // lay.groups * lay.K[0] * lay.K[1], "dx")
    if status == "ok":
        status = check(gw, rw, dtype, pixels, "dw")
    del rx, rw, gx, gw

    def ours():
        torch.autograd.grad(general.conv2d(xg, wg, **kw), (xg, wg), dy)

    def theirs(a, b, d):
        return lambda: torch.autograd.grad(F.conv2d(a, b, **kw), (a, b), d)

    xcg, wcg = xc.clone().requires_grad_(), wc.clone().requires_grad_()
    dyc = dy.to(memory_format=torch.channels_last)
    row = {"layer": lay.name, "kind": lay.kind, "shape": lay.text(), "dtype": str(dtype).split(".")[-1],
           "pass": "fwd+dX+dW", "ours_kernel": kernels, "check": status}
    with strict_fp32(), cudnn_benchmark(True):
        row["ours_ms"] = cl.bench(ours, reps=reps).ms
        row["torch_nchw_ms"] = cl.bench(theirs(xg, wg, dy), reps=reps).ms
        row["torch_nhwc_ms"] = cl.bench(theirs(xcg, wcg, dyc), reps=reps).ms
    row["torch_best_ms"] = min(row["torch_nchw_ms"], row["torch_nhwc_ms"])
    row["speedup"] = row["torch_best_ms"] / row["ours_ms"]
    return row


HEADER = (f"{'layer':<22} {'dtype':<8} {'pass':<10} {'ours kernel':<12} {'ours ms':>9} {'torch NCHW':>11} "
          f"{'torch NHWC':>11} {'speedup':>8}  check")


def fmt(r) -> str:
    return (f"{r['layer']:<22} {r['dtype']:<8} {r['pass']:<10} {r['ours_kernel'].split(',')[0]:<12} "
            f"{r.get('ours_ms', float('nan')):>9.4f} {r.get('torch_nchw_ms', float('nan')):>11.4f} "
            f"{r.get('torch_nhwc_ms', float('nan')):>11.4f} {r.get('speedup', float('nan')):>7.2f}x  {r['check']}")


def summary(rows) -> list[str]:
    """Geometric means of the speedups per (kind, dtype, pass)."""
    out = ["# geometric mean of torch best / ours:"]
    groups = {}
    for r in rows:
        if r["check"] == "ok":
            groups.setdefault((r["kind"], r["dtype"], r["pass"]), []).append(r["speedup"])
    for (kind, dtype, ps), v in sorted(groups.items()):
        out.append(f"#   {kind:<10} {dtype:<8} {ps:<10} {math.exp(sum(map(math.log, v)) / len(v)):.2f}x "
                   f"over {len(v)} layers")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kinds", default="", help=f"comma-separated kinds of layer (default all: {', '.join(KINDS)})")
    ap.add_argument("--layers", default="", help="comma-separated layer names (default all)")
    ap.add_argument("--dtypes", default="fp32,fp16", help="fp32, fp16 or both (default both)")
    ap.add_argument("--backward", action="store_true", help="also forward + dX + dW through autograd")
    ap.add_argument("--reps", type=int, default=None, help="timed runs per contender (GPU default 20, emulator 1)")
    ap.add_argument("--csv", default=None, help="where to write the CSV (default: benchmarks/results/...)")
    args = ap.parse_args(argv)

    dev = cl.device()
    on_gpu = dev.backend == "cuda"
    reps = args.reps or (20 if on_gpu else 1)
    kinds = [k for k in args.kinds.split(",") if k]
    names = [n for n in args.layers.split(",") if n]
    dtypes = [d for d in args.dtypes.split(",") if d]
    for what, given, known in (("kinds", kinds, KINDS), ("layers", names, [lay.name for lay in LAYERS]),
                               ("dtypes", dtypes, list(DTYPES))):
        if set(given) - set(known):
            ap.error(f"unknown {what} {sorted(set(given) - set(known))}; known: {', '.join(known)}")
    layers = [lay for lay in LAYERS if (not kinds or lay.kind in kinds) and (not names or lay.name in names)]
    if not on_gpu:
        layers = [lay.small() for lay in layers]
    m = meta()
    print(f"# {dev}")
    print(f"# torch {m['torch']}, cuDNN {m['cudnn']}, TF32 off, cudnn.benchmark on, {m['date']}")
    if not on_gpu:
        print("# EMULATOR: small twins, wall times of a CPU emulator: these are checks, NOT GPU timings")
    print(HEADER)
    rows = []
    for lay in layers:
        for d in dtypes:
            rows += bench_layer(lay, DTYPES[d], reps, args.backward, lambda r: print(fmt(r), flush=True))
    for line in summary(rows):
        print(line)
    save_rows(rows, m, args.csv, on_gpu)
    bad = [r for r in rows if r["check"] != "ok"]
    for r in bad:
        print("# FAILED its check: " + fmt(r))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
