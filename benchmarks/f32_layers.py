#!/usr/bin/env python3
"""Chapter 9's fp32 implicit GEMM (convlab.ops.igemm) on standard ResNet/VGG layers, against torch
at its best and chapter 5's best, every tile and split-K candidate checked, then timed.

    python benchmarks/f32_layers.py                         # every layer, every candidate
    python benchmarks/f32_layers.py --layers resnet3x3_7,stem7x7_s2
    python benchmarks/f32_layers.py --quick                 # igemm_config's choice only
    python benchmarks/f32_layers.py --out DIR               # CSV into DIR (default benchmarks/results)
    CONVLAB_BACKEND=emu python benchmarks/f32_layers.py     # emulator: small twins, config only, checks

Per layer: torch with cudnn.benchmark on and TF32 off (convlab.baselines.strict_fp32), in NCHW
and in channels_last (input and mask converted before timing, so torch runs at its best layout;
"torch best" = the faster); ours with igemm_config's choice ("config") and with every candidate
tile x split; chapter 5's pick (fused.conv2d_best). Every output is checked against an fp64
reference before it is timed; a candidate that fails is reported and the script exits 1.
Times: cl.bench (CUDA events, warm-up, L2 flushed before each call, median of --reps), torch in
this process (as benchmarks/general_layers.py; the book's harness times it in a fresh one). Each
call of ours makes the K-major mask first (a copy kept per weight tensor would miss changes made
through w.data); the time to make it is also shown on its own (mask ms).

The last lines print geometric means (torch best / ours: above 1 is faster than torch) and a
TUNED table of each layer's fastest candidate: paste it into convlab/ops/igemm.py (TUNED) to make
igemm_config choose those, or adjust the rule in igemm_config where the winners show a pattern.
"""
from __future__ import annotations

import argparse
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
from convlab.ops import ceil_div, fused, igemm  # noqa: E402
from convlab.workloads import Workload  # noqa: E402


@dataclass(frozen=True)
class Layer:
    name: str
    B: int
    C: int
    M: int
    H: int
    K: int
    stride: int = 1
    padding: int = 0

    def workload(self) -> Workload:
        return Workload(self.name, self.B, self.C, self.M, self.H, self.H, self.K, self.stride, self.padding)

    def small(self) -> "Layer":
        """The emulator's twin: the same mask, stride, padding and loader (C a multiple of 8 stays
        one), B=2, at most 16 channels and 24 maps, at most 12x12."""
        C = self.C if self.C < 8 else min(self.C, 16)
        return replace(self, name=self.name + "_small", B=2, C=C, M=min(self.M, 24), H=min(self.H, 12))

    def text(self) -> str:
        s = f"B={self.B} {self.C}->{self.M} {self.H}x{self.H} k{self.K}"
        return s + (f" s{self.stride}" if self.stride != 1 else "") + (f" p{self.padding}" if self.padding else "")


LAYERS = [
    Layer("resnet3x3_56", 32, 64, 64, 56, 3, 1, 1),
    Layer("resnet3x3_28", 32, 128, 128, 28, 3, 1, 1),
    Layer("resnet3x3_14", 32, 256, 256, 14, 3, 1, 1),
    Layer("resnet3x3_7", 32, 512, 512, 7, 3, 1, 1),
    Layer("vgg3x3_56", 16, 256, 256, 56, 3, 1, 1),
    Layer("pw1x1_56_256to64", 32, 256, 64, 56, 1),
    Layer("pw1x1_56_64to256", 32, 64, 256, 56, 1),
    Layer("pw1x1_14_1024to256", 32, 1024, 256, 14, 1),
    Layer("stem7x7_s2", 32, 3, 64, 224, 7, 2, 3),
]

# Tile candidates (BM, BN, BK, WM, WN, MIN_BLOCKS); each is tried with every split in SPLITS that
# leaves at least 4 steps per split (splits > 1 only where the tile grid is under 4 blocks per SM).
# MIN_BLOCKS caps the registers (65536 / (threads x MIN_BLOCKS)): 2 for 256 threads and 4 for 128
# both mean 128 per thread.
TILES = [
    (128, 128, 8, 32, 64, 2), (128, 128, 8, 32, 64, 1), (128, 128, 16, 32, 64, 1), (128, 128, 8, 64, 32, 2),
    (128, 64, 8, 32, 64, 1), (128, 64, 8, 32, 64, 4), (128, 64, 16, 32, 64, 1),
    (64, 128, 8, 32, 64, 1), (64, 128, 8, 32, 64, 4), (64, 128, 16, 32, 64, 1), (64, 64, 8, 32, 64, 1),
    (64, 64, 16, 64, 32, 1),
    (32, 128, 8, 32, 64, 1),
]
SPLITS = (1, 2, 3, 4, 6, 8, 12)
TKEYS = ("BM", "BN", "BK", "WM", "WN", "MIN_BLOCKS")


def candidates(wl: Workload, sms: int, quick: bool) -> list[dict]:
    """igemm_config's choice first, then every tile x split worth trying on this layer."""
    cfg = igemm.igemm_config(wl)
    out = [dict(cfg, label="config")]
    if quick:
        return out
    for tile in TILES:
        t = dict(zip(TKEYS, tile))
        if t["BM"] > max(32, 2 * wl.M):                    # over half the tile's maps would be empty
            continue
        try:
            igemm.check_tunables(t["BM"], t["BN"], t["BK"], t["WM"], t["WN"])
        except ValueError:
            continue
        steps = ceil_div(wl.C * wl.K * wl.K, t["BK"])
        blocks = ceil_div(wl.M, t["BM"]) * ceil_div(wl.B * wl.Ho * wl.Wo, t["BN"])
        for s in SPLITS:
            if s == 1 or (blocks < 4 * sms and steps // s >= 4):
                c = dict(t, SPLIT=s, label="")
                if {k: c[k] for k in (*TKEYS, "SPLIT")} != {k: cfg[k] for k in (*TKEYS, "SPLIT")}:
                    out.append(c)
    return out


def tunables(c: dict) -> dict:
    return {k: c[k] for k in (*TKEYS, "SPLIT")}


def ctext(c: dict) -> str:
    return (f"{c['BM']}x{c['BN']}x{c['BK']} warp {c['WM']}x{c['WN']} minB {c['MIN_BLOCKS']} split {c['SPLIT']}"
            + (f" ({c['label']})" if c.get("label") else ""))


def check(out, ref, name: str) -> str:
    res = cl.check(out, ref, name=name, raise_on_error=False)
    return "ok" if isinstance(res, cl.CheckResult) else "FAIL: " + str(res).splitlines()[0][:200]


def bench_layer(lay: Layer, reps: int, quick: bool, sms: int) -> list[dict]:
    wl = lay.workload()
    kw = dict(stride=lay.stride, padding=lay.padding)
    dev = cl.device().torch_device
    gen = torch.Generator(device=dev).manual_seed(zlib.crc32(lay.name.encode()))
    x = torch.randn(lay.B, lay.C, lay.H, lay.H, device=dev, generator=gen)
    w = torch.randn(lay.M, lay.C, lay.K, lay.K, device=dev, generator=gen)
    with strict_fp32():
        ref = F.conv2d(x.double(), w.double(), **kw)
    gflop = wl.flops / 1e9
    base = {"layer": lay.name, "shape": lay.text(), "gflop": round(gflop, 4)}
    rows = []

    def row(who, config, status, ms, **extra):
        r = {**base, "who": who, "config": config, "check": status, "ms": ms,
             "gflops": gflop / (ms / 1e3) if ms == ms else float("nan"), **extra}
        rows.append(r)
        return r

    # torch, both layouts
    xc, wc = x.to(memory_format=torch.channels_last), w.to(memory_format=torch.channels_last)
    with strict_fp32(benchmark=True):
        for who, a, b in (("torch NCHW", x, w), ("torch channels_last", xc, wc)):
            status = check(F.conv2d(a, b, **kw), ref, who)
            row(who, "cudnn.benchmark, TF32 off", status, cl.bench(lambda: F.conv2d(a, b, **kw), reps=reps).ms)
    torch_best = min(r["ms"] for r in rows)
    for r in rows:
        r["torch_best_ms"] = torch_best
    del xc, wc

    # chapter 5's pick
    impl = fused.pick(wl)
    status = check(fused.conv2d_best(x, w, **kw), ref, "chapter 5")
    ms = cl.bench(lambda: fused.conv2d_best(x, w, **kw), reps=reps).ms if status == "ok" else float("nan")
    row("chapter 5 best", impl.name, status, ms, torch_best_ms=torch_best)

    # the mask's one-time transposition (order 1 for MODE 1, else 0)
    order = int(igemm.igemm_mode(wl, igemm.igemm_config(wl)["BK"]) == 1)

    mask_ms = cl.bench(lambda: igemm.kmajor(w, order), reps=reps).ms

    # ours: every candidate, checked then timed
    for c in candidates(wl, sms, quick):
        t = tunables(c)
        mode = igemm.igemm_mode(wl, c["BK"])
        try:
            status = check(igemm.conv2d_igemm_f32(x, w, **kw, **t), ref, ctext(c))
        except Exception as e:            # a compile or launch failure is a result too
            status = f"FAIL: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
        ms = cl.bench(lambda: igemm.conv2d_igemm_f32(x, w, **kw, **t), reps=reps).ms if status == "ok" else float("nan")
        row("ours", ctext(c), status, ms, torch_best_ms=torch_best, mode=mode, mask_ms=mask_ms, **t)
    for r in rows:
        r["torch_best_over_this"] = r["torch_best_ms"] / r["ms"] if r["ms"] == r["ms"] else float("nan")
    return rows


def bench_backward(lay: Layer, reps: int) -> list[dict]:
    """A stride-1 layer's gradients, ours (igemm_config's choice for each convolution) against
    torch (cudnn.benchmark, TF32 off, NCHW and channels_last), each checked against fp64:
    "dX" (torch.nn.grad.conv2d_input: cuDNN's backward-data alone), "dW" (torch.nn.grad.conv2d_weight)
    and "fwd+dX+dW" (ours: the three launchers in a row; torch: autograd of F.conv2d)."""
    wl = lay.workload()
    p = lay.padding
    dev = cl.device().torch_device
    gen = torch.Generator(device=dev).manual_seed(zlib.crc32(lay.name.encode()) + 1)
    x = torch.randn(lay.B, lay.C, lay.H, lay.H, device=dev, generator=gen)
    w = torch.randn(lay.M, lay.C, lay.K, lay.K, device=dev, generator=gen)
    dy = torch.randn(lay.B, lay.M, wl.Ho, wl.Wo, device=dev, generator=gen)
    size = tuple(x.shape)
    ref_dx = cl.ref.conv2d_input_grad(size, w, dy, padding=p)
    ref_dw = cl.ref.conv2d_weight_grad(x, tuple(w.shape), dy, padding=p)
    with strict_fp32():
        ref_y = F.conv2d(x.double(), w.double(), padding=p)
    t_dx = tunables(igemm.igemm_config(igemm.dx_workload(wl)))
    t_dw = tunables(igemm.igemm_config(igemm.dw_workload(wl)))
    t_fw = tunables(igemm.igemm_config(wl))

    def torch_step(a, b, d):
        a, b = a.detach().requires_grad_(), b.detach().requires_grad_()
        def f():
            y = F.conv2d(a, b, padding=p)
            return (y, *torch.autograd.grad(y, (a, b), d))
        return f

    def ours_step():
        return (igemm.conv2d_igemm_f32(x, w, padding=p, **t_fw), igemm.conv2d_igemm_f32_dx(dy, w, padding=p, **t_dx),
                igemm.conv2d_igemm_f32_dw(x, dy, padding=p, **t_dw))

    def checks(outs, refs, name):
        bad = [check(o, r, f"{name} {what}") for o, r, what in zip(outs, refs, ("y", "dx", "dw"))]
        return next((b for b in bad if b != "ok"), "ok")

    xc, wc, dyc = (t.to(memory_format=torch.channels_last) for t in (x, w, dy))
    passes = {
        "dX": ([lambda a=a, d=d: torch.nn.grad.conv2d_input(size, a, d, padding=p) for a, d in ((w, dy), (wc, dyc))],
               lambda: igemm.conv2d_igemm_f32_dx(dy, w, padding=p, **t_dx), (ref_dx,), t_dx),
        "dW": ([lambda a=a, d=d: torch.nn.grad.conv2d_weight(a, tuple(w.shape), d, padding=p)
                for a, d in ((x, dy), (xc, dyc))],
               lambda: igemm.conv2d_igemm_f32_dw(x, dy, padding=p, **t_dw), (ref_dw,), t_dw),
        "fwd+dX+dW": ([torch_step(x, w, dy), torch_step(xc, wc, dyc)], ours_step,
                      (ref_y, ref_dx, ref_dw), {"fwd": t_fw, "dx": t_dx, "dw": t_dw}),
    }
    gflop = {"dX": wl.flops, "dW": wl.flops, "fwd+dX+dW": 3 * wl.flops}
    rows = []
    for ps, (theirs, ours, refs, cfg) in passes.items():
        out = []
        with strict_fp32(benchmark=True):
            for who, f in zip(("torch NCHW", "torch channels_last"), theirs):
                r = f()
                status = checks(r if isinstance(r, tuple) else (r,), refs, who)
                out.append({"who": who, "config": "cudnn.benchmark, TF32 off", "check": status,
                            "ms": cl.bench(f, reps=reps).ms})
        r = ours()
        status = checks(r if isinstance(r, tuple) else (r,), refs, "ours")
        out.append({"who": "ours", "config": str(cfg), "check": status,
                    "ms": cl.bench(ours, reps=reps).ms if status == "ok" else float("nan")})
        tb = min(r["ms"] for r in out[:2])
        for r in out:
            r.update(layer=lay.name, shape=lay.text(), gflop=round(gflop[ps] / 1e9, 4), torch_best_ms=tb,
                     gflops=gflop[ps] / 1e9 / (r["ms"] / 1e3), torch_best_over_this=tb / r["ms"], **{"pass": ps})
        rows += out
    return rows


def geomean(v) -> float:
    v = [a for a in v if a == a and a > 0]
    return math.exp(sum(map(math.log, v)) / len(v)) if v else float("nan")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", default="", help="comma-separated layer names (default all)")
    ap.add_argument("--quick", action="store_true", help="time igemm_config's choice only")
    ap.add_argument("--no-backward", action="store_true",
                    help="leave out the stride-1 layers' dX, dW and forward+dX+dW")
    ap.add_argument("--reps", type=int, default=None, help="timed runs per contender (GPU default 30, emulator 1)")
    ap.add_argument("--out", default=None, help="folder for the CSV (default benchmarks/results on a GPU)")
    args = ap.parse_args(argv)

    dev = cl.device()
    on_gpu = dev.backend == "cuda"
    reps = args.reps or (30 if on_gpu else 1)
    names = [n for n in args.layers.split(",") if n]
    if set(names) - {lay.name for lay in LAYERS}:
        ap.error(f"unknown layers {sorted(set(names) - {lay.name for lay in LAYERS})}; "
                 f"known: {', '.join(lay.name for lay in LAYERS)}")
    layers = [lay for lay in LAYERS if not names or lay.name in names]
    if not on_gpu:                     # the candidates' checks are the tests' job there
        layers, args.quick = [lay.small() for lay in layers], True
    sms = dev.threads if on_gpu else igemm.SMS
    v = versions()
    meta = {"gpu": dev.name if on_gpu else "CPU emulator", "torch": v["torch"], "cudnn": v["cudnn"],
            "tf32": "off", "date": dt.date.today().isoformat(),
            "timing": "CUDA events, L2 flushed, median" if on_gpu else "emulator wall time, NOT a GPU timing"}
    print(f"# {dev}")
    print(f"# torch {v['torch']}, cuDNN {v['cudnn']}, TF32 off, cudnn.benchmark on, {meta['date']}, median of {reps}")
    print("# ratio = torch best ms / this ms (above 1: faster than torch at its best layout)")
    if not on_gpu:
        print("# EMULATOR: small twins; the times are CPU wall times, NOT GPU timings: these are checks")

    rows, summary = [], []
    for lay in layers:
        print(f"\n## {lay.name}: {lay.text()}, {lay.workload().flops / 1e9:.2f} GFLOP")
        print(f"   {'contender':<58} {'ms':>9} {'GFLOP/s':>9} {'ratio':>6}  check")
        out = bench_layer(lay, reps, args.quick, sms)
        for r in sorted(out, key=lambda r: (r["ms"] != r["ms"], r["ms"])):
            who = r["who"] if r["who"] != "ours" else "ours " + r["config"]
            print(f"   {who:<58} {r['ms']:>9.4f} {r['gflops']:>9.0f} {r['torch_best_over_this']:>6.2f}  {r['check']}")
        ours = [r for r in out if r["who"] == "ours" and r["check"] == "ok"]
        conf = next((r for r in ours if r["config"].endswith("(config)")), None)
        best = min(ours, key=lambda r: r["ms"]) if ours else None
        ch5 = next(r for r in out if r["who"] == "chapter 5 best")
        tb = out[0]["torch_best_ms"]
        summary.append((lay, tb, conf, best, ch5))
        mask_ms = ours[0]["mask_ms"] if ours else float("nan")
        print(f"   mask to K-major (part of every call of ours): {mask_ms:.4f} ms")
        rows += out

    back_rows = []
    if not args.no_backward:
        print("\n# gradients of the stride-1 layers, igemm_config's choice for each convolution "
              "(ratio = torch best / ours)")
        print(f"{'layer':<20} {'pass':<10} {'torch NCHW':>10} {'torch NHWC':>10} {'ours ms':>9} {'ratio':>6}  check")
        for lay in layers:
            if lay.stride == 1:
                d = bench_backward(lay, reps)
                back_rows += d
                for i in range(0, len(d), 3):
                    t0, t1, o = d[i:i + 3]
                    verdict = ", ".join(sorted({t0["check"], t1["check"], o["check"]}))
                    print(f"{lay.name:<20} {o['pass']:<10} {t0['ms']:>10.4f} {t1['ms']:>10.4f} {o['ms']:>9.4f} "
                          f"{o['torch_best_over_this']:>6.2f}  {verdict}")
        for ps in ("dX", "dW", "fwd+dX+dW"):
            g = geomean([r["torch_best_over_this"] for r in back_rows if r["who"] == "ours" and r["pass"] == ps])
            print(f"# geometric mean of torch best / ours, {ps}: {g:.3f}x")
    for r in rows:
        r["pass"] = "forward"

    print("\n# summary of the forward pass (ratio = torch best / ours)")
    print(f"{'layer':<20} {'torch best':>10} {'config ms':>10} {'ratio':>6} {'best ms':>9} {'ratio':>6} "
          f"{'ch5 ms':>9} {'ratio':>6}  best candidate")
    for lay, tb, conf, best, ch5 in summary:
        c_ms = conf["ms"] if conf else float("nan")
        b_ms = best["ms"] if best else float("nan")
        print(f"{lay.name:<20} {tb:>10.4f} {c_ms:>10.4f} {tb / c_ms:>6.2f} {b_ms:>9.4f} {tb / b_ms:>6.2f} "
              f"{ch5['ms']:>9.4f} {tb / ch5['ms']:>6.2f}  {best['config'] if best else '-'}")
    for what, idx in (("ours, igemm_config", 2), ("ours, best candidate", 3), ("chapter 5 best", 4)):
        g = geomean([s[1] / s[idx]["ms"] for s in summary if s[idx] is not None])
        print(f"# geometric mean of torch best / {what}: {g:.3f}x over {len(summary)} layers")

    if on_gpu:
        print(f"\n# TUNED: each layer's fastest candidate on {dev.name}; paste into convlab/ops/igemm.py "
              "to make igemm_config use it")
        print("TUNED = {")
        for lay, _, _, best, _ in summary:
            if best is not None:
                key = (lay.B, lay.C, lay.M, lay.H, lay.H, lay.K, lay.stride, lay.padding)
                print(f"    {key}: {tunables(best)},   # {lay.name}: {best['ms']:.4f} ms")
        print("}")

    rows += back_rows
    folder = Path(args.out) if args.out else (ROOT / "benchmarks" / "results" if on_gpu else ROOT / ".convlab-cache")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"f32_layers_{meta['gpu'].replace(' ', '_')}.csv"
    fields = list(dict.fromkeys(k for r in rows for k in r)) + list(meta)
    with open(path, "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=fields)
        wr.writeheader()
        for r in rows:
            wr.writerow({**r, **meta})
    print(f"# wrote {path}")
    bad = [r for r in rows if r["check"] != "ok"]
    for r in bad:
        print(f"# FAILED its check: {r['layer']} {r['who']} {r['config']}: {r['check']}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
