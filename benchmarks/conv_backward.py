#!/usr/bin/env python3
"""Time chapter 8's backward kernels (dE/dX, dE/dW) and the course's forward on the 2D workloads,
against torch autograd.

    python benchmarks/conv_backward.py                        # every 2D workload, every kernel
    python benchmarks/conv_backward.py --workloads lenet_c1 --skip-slow
    python benchmarks/conv_backward.py --sweep --workloads lenet_c1,lenet_c3,fa17   # tunables of the picks
    python benchmarks/conv_backward.py --lenet [FASHION_MNIST_DIR]   # + LeNet epochs, ours vs torch
    CONVLAB_BACKEND=emu python benchmarks/conv_backward.py    # emulator: small shapes, checks only

On a GPU, for each workload: the forward (chapter 5's pick), every dX kernel (scatter with atomics,
gather, the flipped mask through the forward), every dW kernel (atomics per product, the direct
reduction and the split-K GEMM, each with a second pass or with block atomics), the picks together
(forward + dX + dW) and the same through torch.autograd (Conv2dFunction), against torch: its
forward, its dX and dW alone (aten.convolution_backward, what autograd calls) and autograd's
forward + backward, each at its defaults and with cudnn.benchmark=True, strict fp32 (TF32 off).
Every output is first checked against an fp64 reference computed on the GPU (cl.check's rule).
Timings: cl.bench (CUDA events, warm-up, L2 flushed before each call, median of 20). The kernels
with atomics per product can take seconds on the big layers: after one call over 0.2 s they get 3
timed calls (--skip-slow leaves them out). The CSV carries the GPU, torch/cuDNN versions, TF32
setting and date on every row.

On the emulator the same code runs on each workload's small() twin and checks every kernel; the
times it prints are CPU wall times of an emulator, NOT GPU timings, and the CSV says so.
"""
from __future__ import annotations

import argparse
import datetime as dt
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import convlab as cl  # noqa: E402
from _harness import report_failures, save_rows  # noqa: E402
from convlab.baselines import cudnn_benchmark, strict_fp32, versions  # noqa: E402
from convlab.ops import backprop as bp  # noqa: E402
from convlab.ops import fused  # noqa: E402
from convlab.workloads import WORKLOADS_2D  # noqa: E402

SLOW_MS = 200.0


def roof():
    try:
        from convlab import roofline
        r = roofline.current()
        return r.bandwidth, r.flop_rate, r.source
    except Exception:            # noqa: BLE001 (no roofline: the design's H200 numbers)
        return 4.19e12, 51e12, "reference: H200, design.md"


def meta():
    v = versions()
    dev = cl.device()
    return {"backend": dev.backend, "gpu": dev.name if dev.backend == "cuda" else "CPU emulator",
            "torch": v["torch"], "cudnn": v["cudnn"], "tf32": "off", "date": dt.date.today().isoformat(),
            "timing": "GPU: CUDA events, L2 flushed, median" if dev.backend == "cuda"
            else "emulator wall time, NOT a GPU timing"}


# ---- data and references ---------------------------------------------------------------------------

def randn(*shape, gen):
    """Fresh normal values on the backend's device (on the GPU made there: lenet_c1's dy is 1 GB)."""
    dev = cl.device().torch_device
    if dev == "cuda":
        return torch.randn(*shape, device="cuda", generator=gen)
    return cl.randn(*shape)


def references(x, w, dy, wl):
    """fp64 y, dx, dw: torch in double on the GPU (fast at full size), cl.ref on the emulator."""
    s, p = wl.stride, wl.padding
    if cl.backend() == "cuda":
        with strict_fp32():
            xd, wd, dyd = x.double(), w.double(), dy.double()
            y = F.conv2d(xd, wd, stride=s, padding=p)
            dx = torch.nn.grad.conv2d_input(x.shape, wd, dyd, stride=s, padding=p)
            dw = torch.nn.grad.conv2d_weight(xd, w.shape, dyd, stride=s, padding=p)
            del xd, dyd
            return y, dx, dw
    return (cl.ref.conv2d(x, w, stride=s, padding=p), cl.ref.conv2d_input_grad(x.shape, w, dy, s, p),
            cl.ref.conv2d_weight_grad(x, w.shape, dy, s, p))


def check(out, ref, name):
    """(status, error): cl.check's rule (|out-ref| <= 1e-4*RMS(ref) + 1e-4*|ref|; NaN fails), on the
    device in chunks, with cl.check's message for the first failing slice; error = the largest
    |out-ref| as a fraction of RMS(ref) (for a tuple, the worst of its parts)."""
    if isinstance(out, (tuple, list)):
        res = [check(o, r, f"{name}[{i}]") for i, (o, r) in enumerate(zip(out, ref))]
        bad = [st for st, _ in res if st != "ok"]
        return (bad[0] if bad else "ok"), max(e for _, e in res)
    rms = float(ref.pow(2).mean().sqrt())
    atol, rtol = 1e-4 * rms, 1e-4
    step = max(1, (1 << 26) // max(1, ref[0].numel()))
    status, worst = "ok", 0.0
    for b0 in range(0, ref.shape[0], step):
        o, r = out[b0:b0 + step].double(), ref[b0:b0 + step]
        diff = (o - r).abs()
        worst = max(worst, float(diff.max()) if diff.numel() else 0.0)   # NaN stays NaN
        ok = diff <= atol + rtol * r.abs()
        if status == "ok" and not bool(ok.all()):
            b = b0 + int((~ok).flatten(1).any(1).nonzero()[0])
            res = cl.check(out[b:b + 1], ref[b:b + 1], atol=atol, name=f"{name}[{b}]", raise_on_error=False)
            status = f"FAIL: {str(res).splitlines()[0][:200]}"
    return status, worst / max(rms, 1e-30)


# ---- timing ------------------------------------------------------------------------------------------

def timed(fn, reps):
    """cl.bench, with fewer reps for a call that takes more than SLOW_MS (the atomics per product)."""
    if cl.backend() == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        if start.elapsed_time(end) > SLOW_MS:
            return cl.bench(fn, reps=3, warmup=0)
    return cl.bench(fn, reps=reps)


def contenders(wl, x, w, dy, skip_slow):
    """(pass, name, callable, reference key, slow) for our kernels on this workload."""
    s, p = wl.stride, wl.padding
    hw, K = (wl.H, wl.W), wl.K
    out = []
    out.append(("forward", "ours: " + fused.pick(wl).name, lambda: fused.conv2d_best(x, w, stride=s, padding=p), "y", False))
    if not skip_slow:
        out.append(("dX", "scatter (atomics)", lambda: bp.conv2d_input_grad_scatter(dy, w, stride=s, padding=p, input_size=hw), "dx", True))
    out.append(("dX", "gather (transposed conv)", lambda: bp.conv2d_input_grad_gather(dy, w, stride=s, padding=p, input_size=hw), "dx", False))
    if s == 1 and p <= wl.K - 1:
        out.append(("dX", "forward of flipped mask", lambda: bp.conv2d_input_grad_forward(dy, w, stride=s, padding=p, input_size=hw),
                    "dx", False))
    name_dx = bp.pick_input_grad(wl).name
    out.append(("dX", f"best: {name_dx}", lambda: bp.conv2d_input_grad_best(dy, w, stride=s, padding=p, input_size=hw), "dx", False))
    if not skip_slow:
        out.append(("dW", "atomics per product", lambda: bp.conv2d_weight_grad_atomic(x, dy, stride=s, padding=p, kernel_size=K), "dw", True))
    if wl.C * wl.K * wl.K <= 256:        # the direct reduction keeps all taps of a channel per thread
        for final in ("partials", "atomic"):
            out.append(("dW", f"direct, {'second pass' if final == 'partials' else 'block atomics'}",
                        lambda final=final: bp.conv2d_weight_grad_direct(x, dy, stride=s, padding=p, kernel_size=K, final=final),
                        "dw", False))
    for final in ("partials", "atomic"):
        out.append(("dW", f"split-K GEMM, {'second pass' if final == 'partials' else 'block atomics'}",
                    lambda final=final: bp.conv2d_weight_grad_gemm(x, dy, stride=s, padding=p, kernel_size=K, final=final), "dw", False))
    name_dw = bp.pick_weight_grad(wl).name
    out.append(("dW", f"best: {name_dw}", lambda: bp.conv2d_weight_grad_best(x, dy, stride=s, padding=p, kernel_size=K), "dw", False))

    def total():
        return (fused.conv2d_best(x, w, stride=s, padding=p), bp.conv2d_input_grad_best(dy, w, stride=s, padding=p, input_size=hw),
                bp.conv2d_weight_grad_best(x, dy, stride=s, padding=p, kernel_size=K))
    out.append(("fwd+dX+dW", "ours: best forward + best dX + best dW", total, "all", False))

    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()

    def autograd():
        y = bp.Conv2dFunction.apply(xr, wr, None, s, p)
        return (y.detach(),) + torch.autograd.grad(y, (xr, wr), dy)
    out.append(("fwd+dX+dW", "ours: autograd (Conv2dFunction)", autograd, "all", False))
    return out


def torch_contenders(wl, x, w, dy):
    s, p = wl.stride, wl.padding
    aten = torch.ops.aten.convolution_backward

    def dx():
        return aten(dy, x, w, None, [s, s], [p, p], [1, 1], False, [0, 0], 1, [True, False, False])[0]

    def dw():
        return aten(dy, x, w, None, [s, s], [p, p], [1, 1], False, [0, 0], 1, [False, True, False])[1]

    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()

    def autograd():
        y = F.conv2d(xr, wr, stride=s, padding=p)
        return (y.detach(),) + torch.autograd.grad(y, (xr, wr), dy)
    return [("forward", lambda: F.conv2d(x, w, stride=s, padding=p), "y"), ("dX", dx, "dx"), ("dW", dw, "dw"),
            ("fwd+dX+dW", autograd, "all")]


def bench_workload(wl, reps, skip_slow, log, gen):
    bw, rate, _ = roof()
    x, w, dy = randn(*wl.x_shape, gen=gen), randn(*wl.w_shape, gen=gen), randn(*wl.y_shape, gen=gen)
    y_ref, dx_ref, dw_ref = references(x, w, dy, wl)
    refs = {"y": y_ref, "dx": dx_ref, "dw": dw_ref, "all": (y_ref, dx_ref, dw_ref)}
    nx, nw, ny = x.numel(), w.numel(), dy.numel()
    traffic = {"forward": 4 * (nx + nw + ny), "dX": 4 * (ny + nw + nx), "dW": 4 * (nx + ny + nw),
               "fwd+dX+dW": 4 * 3 * (nx + nw + ny)}
    flops = {"forward": wl.flops, "dX": wl.flops, "dW": wl.flops, "fwd+dX+dW": 3 * wl.flops}
    rows, torch_ms = [], {}

    def row(pass_, impl, t, status, err):
        ms = t.ms if t is not None else float("nan")
        floor = 1e3 * max(traffic[pass_] / bw, flops[pass_] / rate)
        r = {"workload": wl.name, "pass": pass_, "kernel": impl, "ms": ms,
             "p25": t.p25 if t else float("nan"), "p75": t.p75 if t else float("nan"),
             "gflops": flops[pass_] / (ms * 1e-3) / 1e9 if t else float("nan"),
             "gbs": traffic[pass_] / (ms * 1e-3) / 1e9 if t else float("nan"),
             "floor_fraction": floor / ms if t else float("nan"),
             "speedup_vs_torch": torch_ms.get((pass_, False), float("nan")) / ms if t else float("nan"),
             "speedup_vs_tuned": torch_ms.get((pass_, True), float("nan")) / ms if t else float("nan"),
             "max_err_rms": err, "check": status}
        rows.append(r)
        log(r)

    for tuned in (False, True):
        for pass_, fn, key in torch_contenders(wl, x, w, dy):
            with strict_fp32(), cudnn_benchmark(tuned):
                out = fn()
                cl.sync()
                status, err = check(out, refs[key], pass_)
                del out
                t = timed(fn, reps)
            torch_ms[(pass_, tuned)] = t.ms
            row(pass_, f"torch {'tuned' if tuned else 'default'}", t, status, err)

    for pass_, name, fn, key, slow in contenders(wl, x, w, dy, skip_slow):
        err = float("nan")
        try:
            with strict_fp32():
                out = fn()
                cl.sync()
                status, err = check(out, refs[key], pass_)
                del out
                if slow and status != "ok" and math.isfinite(err):
                    # millions of float atomics into one weight lose digits: a finding, not a bug
                    status = f"loose: fp32 sum of atomics, max error {err:.1e} x RMS"
                t = timed(fn, reps) if status == "ok" or status.startswith("loose") else None
        except (cl.ConvlabError, ValueError) as e:
            status, t = f"error: {type(e).__name__}: {str(e).splitlines()[0][:160]}", None
        row(pass_, name, t, status, err)
        if cl.backend() == "cuda":
            torch.cuda.empty_cache()
    del x, w, dy, refs, y_ref, dx_ref, dw_ref
    return rows


# ---- the sweep: tunables of the picked kernels -------------------------------------------------------

def sweep_configs(wl):
    """A short list around each pick (each config is one nvcc compile, 2-3 s, and 20 timed runs)."""
    s = wl.stride
    out = []
    if not (s == 1 and wl.C >= 32):
        base = bp.gather_config(wl.C, wl.M, wl.K, s, wl.H)
        ct, mv = base["CT"], base["MV"]
        target = 16 if ct == 1 else 4 if ct <= 4 else 2
        for t, mb in ((target, base["MIN_BLOCKS"]), (target, base["MIN_BLOCKS"] + 1), (target // 2, 4), (target // 2, 5),
                      (target * 2, 2)):
            rows = bp._best_rows(-(-wl.H // s), t, -(-wl.K // s) - 1)
            out.append(("dX", "gather", bp.conv2d_input_grad_gather,
                        {"CT": ct, "MV": mv, "ROWS": rows, "MIN_BLOCKS": mb}))
        if ct == 1 and wl.M % 4 == 0:
            out.append(("dX", "gather", bp.conv2d_input_grad_gather, {"CT": 1, "MV": 4, "ROWS": 8, "MIN_BLOCKS": 2}))
    if bp.direct_dw_fits(wl.C, wl.M, wl.K):
        mt = bp.direct_dw_config(wl.C, wl.M, wl.K)["MT"]
        for t in ({"MT": mt, "ROWS": 4, "MIN_BLOCKS": 3}, {"MT": mt, "ROWS": 8, "MIN_BLOCKS": 2},
                  {"MT": max(1, mt // 2), "ROWS": 8, "MIN_BLOCKS": 3}, {"MT": max(1, mt // 2), "ROWS": 8, "MIN_BLOCKS": 4},
                  {"MT": mt, "ROWS": 4, "MIN_BLOCKS": 3, "BLOCK": 256}):
            out.append(("dW", "direct", bp.conv2d_weight_grad_direct, t))
    base = bp.gemm_dw_config(wl.C, wl.M, wl.K)
    seen = set()
    for BN, TN, BK in ((base["BN"], 4, 16), (base["BN"], 4, 8), (32, 4, 16), (64, 8, 16), (128, 8, 16)):
        t = dict(base, BN=BN, TN=TN, BK=BK)
        if (BN, TN, BK) in seen:
            continue
        seen.add((BN, TN, BK))
        try:
            bp.check_gemm_dw_tunables(t["BM"], BN, BK, t["TM"], TN)
        except ValueError:
            continue
        out.append(("dW", "split-K GEMM", bp.conv2d_weight_grad_gemm, t))
    return out


def sweep_workload(wl, reps, log, gen):
    x, w, dy = randn(*wl.x_shape, gen=gen), randn(*wl.w_shape, gen=gen), randn(*wl.y_shape, gen=gen)
    _, dx_ref, dw_ref = references(x, w, dy, wl)
    rows = []
    configs = sweep_configs(wl)
    for i, (pass_, name, fn, tun) in enumerate(configs):
        if pass_ == "dX":
            call = lambda: fn(dy, w, stride=wl.stride, padding=wl.padding, input_size=(wl.H, wl.W), **tun)  # noqa: E731
            ref = dx_ref
        else:
            call = lambda: fn(x, dy, stride=wl.stride, padding=wl.padding, kernel_size=wl.K, **tun)  # noqa: E731
            ref = dw_ref
        try:
            out = call()
            cl.sync()
            status, _ = check(out, ref, pass_)
            t = cl.bench(call, reps=reps) if status == "ok" else None
        except (cl.ConvlabError, ValueError) as e:
            status, t = f"error: {type(e).__name__}: {str(e).splitlines()[0][:160]}", None
        r = {"workload": wl.name, "pass": pass_, "kernel": "sweep: " + name,
             "tunables": " ".join(f"{k}={v}" for k, v in sorted(tun.items())),
             "ms": t.ms if t else float("nan"), "check": status}
        rows.append(r)
        print(f"{wl.name:10s} {pass_:4s} {name:14s} {r['tunables']:48s} {r['ms']:9.4f}  {status}  [{i + 1}/{len(configs)}]",
              flush=True)
    return rows


# ---- LeNet epochs ------------------------------------------------------------------------------------

def lenet_rows(path, epochs):
    from convlab import lenet
    if path:
        data = lenet.load_fashion_mnist(path)
    else:
        data = lenet.load_digits()
    epochs = epochs or (5 if path else 20)
    if cl.backend() != "cuda":
        data = data.subset(256, 128)
        epochs = 1
    print(f"# LeNet on {data}, {epochs} epochs of SGD (batch 64, lr 0.05, momentum 0.9)")
    res = lenet.compare(data, epochs=epochs, batch_size=64, lr=0.05)
    rows = []
    for which, r in res.items():
        print(f"#   {which:6s}: {r}")
        epochs_s = r.epoch_seconds[1:] or r.epoch_seconds       # the first epoch compiles and warms up
        rows.append({"workload": f"lenet {data.name}", "pass": "train epoch", "kernel": f"{which} convolutions",
                     "ms": 1e3 * sum(epochs_s) / len(epochs_s),
                     "check": f"test accuracy {r.test_accuracy:.4f}, final loss {r.epoch_losses[-1]:.4f}"})
    return rows


# ---- output ------------------------------------------------------------------------------------------

HEADER = (f"{'workload':10s} {'pass':9s} {'kernel':52s} {'ms':>9s} {'GFLOP/s':>8s} {'GB/s':>7s} {'floor':>6s} "
          f"{'vs torch':>8s} {'vs tuned':>8s} {'err/RMS':>8s}  check")


def fmt(r):
    def f(v, spec):
        return format(v, spec) if isinstance(v, float) and not math.isnan(v) else "-"
    return (f"{r['workload']:10s} {r['pass']:9s} {r['kernel'][:52]:52s} {f(r['ms'], '9.4f')} {f(r['gflops'], '8.0f')} "
            f"{f(r['gbs'], '7.0f')} {f(r['floor_fraction'], '6.1%')} {f(r['speedup_vs_torch'], '7.2f')}x "
            f"{f(r['speedup_vs_tuned'], '7.2f')}x {f(r.get('max_err_rms', float('nan')), '8.1e')}  {r['check']}")


def summary(rows):
    """The chapter's target line per workload: ours (forward + dX + dW) against torch autograd."""
    out = []
    for wl in dict.fromkeys(r["workload"] for r in rows if r["pass"] == "fwd+dX+dW"):
        get = {r["kernel"]: r["ms"] for r in rows if r["workload"] == wl and r["pass"] == "fwd+dX+dW"}
        ours = get.get("ours: best forward + best dX + best dW", float("nan"))
        t_def, t_tun = get.get("torch default", float("nan")), get.get("torch tuned", float("nan"))
        note = "" if cl.backend() == "cuda" else " [emulator wall times: NOT GPU timings]"
        out.append(f"# {wl}: ours forward + dX + dW {ours:.3f} ms; torch autograd {t_def:.3f} ms (default), "
                   f"{t_tun:.3f} ms (tuned): {t_def / ours:.2f}x, {t_tun / ours:.2f}x faster{note}")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default="", help="comma-separated names (default: the five 2D layers)")
    ap.add_argument("--reps", type=int, default=None, help="timed runs per kernel (GPU default 20, emulator 1)")
    ap.add_argument("--skip-slow", action="store_true", help="leave out the kernels with atomics per product")
    ap.add_argument("--sweep", action="store_true", help="sweep the tunables of the dX gather and the dW kernels")
    ap.add_argument("--lenet", nargs="?", const="", default=None, metavar="FASHION_MNIST_DIR",
                    help="also train the LeNet twins (digits, or Fashion-MNIST from this folder) and time epochs")
    ap.add_argument("--epochs", type=int, default=None, help="LeNet epochs (with --lenet; default 20 digits, 5 Fashion-MNIST)")
    ap.add_argument("--csv", default=None, help="where to write the CSV (default: benchmarks/results/...)")
    ap.add_argument("--full", action="store_true", help="on the emulator too, the full sizes (very slow)")
    args = ap.parse_args(argv)

    dev = cl.device()
    on_gpu = dev.backend == "cuda"
    reps = args.reps or (20 if on_gpu else 1)
    names = [n for n in args.workloads.split(",") if n]
    unknown = set(names) - {w.name for w in WORKLOADS_2D}
    if unknown:
        ap.error(f"unknown workloads {sorted(unknown)}; known: {', '.join(w.name for w in WORKLOADS_2D)}")
    wls = [w for w in WORKLOADS_2D if not names or w.name in names]
    if not on_gpu and not args.full:
        wls = [w.small() for w in wls]
    m = meta()
    gen = torch.Generator(device="cuda" if on_gpu else "cpu").manual_seed(int(time.time()))
    print(f"# {dev}")
    print(f"# torch {m['torch']}, cuDNN {m['cudnn']}, TF32 off, {m['date']}; roofline: {roof()[2]}")
    if not on_gpu:
        print("# EMULATOR: small shapes, wall times of a CPU emulator: these are checks, NOT GPU timings")
    rows = []
    if args.sweep:
        for wl in wls:
            rows += sweep_workload(wl, reps, None, gen)
    else:
        print(HEADER)

        def log(r):
            print(fmt(r), flush=True)
        for wl in wls:
            t0 = time.time()
            rows += bench_workload(wl, reps, args.skip_slow, log, gen)
            print(f"# {wl.name}: {time.time() - t0:.0f} s", flush=True)
        for line in summary(rows):
            print(line)
    if args.lenet is not None:
        rows += lenet_rows(args.lenet, args.epochs)

    save_rows(rows, m, "conv_backward" + ("_sweep" if args.sweep else ""), args.csv, on_gpu)
    return report_failures(rows, fmt)


if __name__ == "__main__":
    sys.exit(main())
