#!/usr/bin/env python3
"""The drop-in as users call it (convlab.ops.dropin.conv2d, the arguments of F.conv2d) on every
convolution of ResNet-50, VGG-16, MobileNetV3-Large, EfficientNet-B0 and Stable Diffusion v1.5's
UNet res-blocks (convlab.measuring.network_layers: each distinct layer once, with how often the network has
it), beside torch at its best.

    source .gpu/setup.sh && python benchmarks/dropin_networks.py            # on a GPU; writes to $OUT
    python benchmarks/dropin_networks.py --quick --budget-s 200              # batch 32, forward only
    python benchmarks/dropin_networks.py --report $OUT/dropin_networks_<GPU>.csv   # summary + figure again
    CONVLAB_BACKEND=emu python benchmarks/dropin_networks.py --emu-smoke     # 3 tiny layers, checks only

Per layer, network, dtype (fp16, bf16, fp32), pass (forward; forward+backward: autograd.grad of
x, w and the bias) and batch (32, then 1 and 256), four contenders timed in turns, call by call
(convlab.measuring.bench.time_alternating): ours from NCHW x and from channels_last x (w in x's layout, as a
model moved to channels_last holds it; what the call does beside our kernels, inside its time, is
the `adds` column: "x" converted to the layout the kernel reads and "y" back, "bias" added by
torch, and for the gradients "dy" (and "x" for dW) converted), torch from NCHW and from
channels_last (cudnn.benchmark on, TF32 off; the kernel it ran named by torch.profiler); torch
best is the faster torch. Caller time: CUDA events around the Python call from an idle GPU, as a
user calls it; GPU time: the same with the GPU kept busy while Python queues the call. No L2
flush. Each of our outputs (y; dx, dw, dbias) is
first checked against fp64 of the same inputs (fp32: cl.check; 16-bit: the bound of the kernel
that ran, dispatch.check_fp16_forward / dispatch.tolerance); a wrong one is a failing row, never
timed. Where the drop-in hands a call to torch (a bf16 layer no bf16 kernel takes), its row says so
(kernel "torch: ...") and is timed as it is: the drop-in is what runs.

Order, so that a run cut short by --budget-s (default 420 s, the figure and summary included) has
the most telling rows: batch 32 forward in fp16 and bf16, then fp32; batch 32 forward+backward;
then batch 1 and 256. One worker process per network and dtype (ours and torch in the same one;
they start in parallel and compile and check their batch-32 layers at once, then time one at a
time). Rows are written to the CSV as they come: a killed run leaves its data.

Writes, into --out (default $OUT, else benchmarks/results): dropin_networks_<GPU>.csv (one row per
layer, dtype, pass, batch and contender), dropin_networks_<GPU>.txt (the summary: per network,
dtype, pass and batch, the geometric mean over its layers, each as often as the network has it, of
torch best / ours in caller and GPU time, per layout of ours, and the failing rows) and
dropin_networks_<GPU>.png (one figure).
"""
from __future__ import annotations

import argparse
import csv
import math
import multiprocessing as mp
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import convlab as cl  # noqa: E402
from convlab.measuring import network_layers  # noqa: E402
from convlab.measuring.bench import time_alternating  # noqa: E402
from convlab.measuring.network_layers import summary  # noqa: E402
from convlab.ops import FORMATS, Impl, dispatch, dropin  # noqa: E402
from convlab.ops.shapes import DTYPE  # noqa: E402

DTYPES = ("fp16", "bf16", "fp32")
PASSES = ("forward", "forward+backward")
LAYOUTS = ("nchw", "channels_last")
#: (pass, batch, dtypes) in the order they are measured
TIERS = (("forward", 32, ("fp16", "bf16")), ("forward", 32, ("fp32",)),
         ("forward+backward", 32, ("fp16", "bf16", "fp32")),
         ("forward", 1, DTYPES), ("forward+backward", 1, DTYPES),
         ("forward", 256, DTYPES), ("forward+backward", 256, DTYPES))
REPS, QUICK_REPS = 15, 5
#: Images of a batch above this checked against fp64 (the first and last two): the reference of a
#: whole batch of 256 in fp64 would take longer than the timing. Gradients are checked in full.
CHECK_IMAGES = 32
MARGIN_S = 20           # kept for the summary and the figure at the end of the budget
FIRST_PASS = 0.4        # the share of the budget the parallel first pass (compiles and checks) may take
COLUMNS = ("gpu", "network", "layer", "count", "B", "C", "M", "H", "W", "K", "stride", "padding", "groups", "dtype",
           "pass", "who", "layout", "kernel", "adds", "check", "caller_ms", "caller_p25", "caller_p75", "gpu_ms",
           "gpu_p25", "gpu_p75", "gflop")


# ---- one layer ---------------------------------------------------------------------------------------

def _inputs(wl, dtype: str):
    """x, w, bias and dy of the layer in dtype, NCHW, fresh random values (w scaled by its fan-in)."""
    t, dev = DTYPE[dtype], cl.device().torch_device
    w = torch.randn(wl.w_shape, device=dev) / math.sqrt(wl.reduction)
    return (torch.randn(wl.x_shape, device=dev).to(t), w.to(t), torch.randn(wl.M, device=dev).to(t),
            torch.randn(wl.y_shape, device=dev).to(t))


def _in_layout(tensors, layout: str, grad: bool):
    """The same values in layout (x, w, dy; the bias as it is), leaves of their own that require a
    gradient where one is wanted."""
    fmt = FORMATS[layout]
    x, w, b, dy = (t.contiguous(memory_format=fmt) if t.dim() == 4 else t.clone() for t in tensors)
    return x.requires_grad_(grad), w.requires_grad_(grad), b.requires_grad_(grad), dy


def _call(conv, x, w, b, dy, kw: dict, pass_: str):
    """fn(): one call as a user makes it: the forward, or the forward and the three gradients."""
    if pass_ == "forward":
        return lambda: conv(x, w, b, **kw)
    return lambda: torch.autograd.grad(conv(x, w, b, **kw), (x, w, b), dy)


def our_kernel(wl, x, w, b, kw: dict, pass_: str, layout: str) -> tuple:
    """(kernel, adds): the keys of what the drop-in runs (forward, +dX+dW), or why it is torch's, and
    what its routes do beside (dispatch's route.adds; dy, and x for dW, converted for the gradients)."""
    grad = pass_ != "forward"
    reason = dropin.kernel_fallback_reason(x, w, b, **kw, grad=grad)
    if reason is not None:
        return f"torch: {reason}", ""
    route = dispatch.forward_route(x, w, b, **kw)
    keys, adds = [route.impl.key], list(route.adds)
    if grad:
        dx, dw = dispatch.grad_routes(x.shape, w.shape, wl.y_shape, _name(x.dtype), **kw)
        keys += [dx.impl.key, dw.impl.key]
        adds += [name for name, reads in (("dy", dx.reads), ("x for dW", dw.reads)) if reads is not FORMATS[layout]]
    return "+".join(keys), ",".join(adds)


def _name(t: torch.dtype) -> str:
    return next(n for n, d in DTYPE.items() if d == t)


#: torch's arithmetic in 16 bits, for the bound of a call the drop-in hands to torch: float sums,
#: the bias added to the rounded result
TORCH_16BIT = Impl("torch", F.conv2d, "conv2d_fp16", dtypes=("fp16", "bf16"), bias=False)


def reference(wl, tensors, kw: dict, pass_: str):
    """fp64 of the inputs: y (of the first and last two images where the batch is over CHECK_IMAGES),
    or (dx, dw, dbias)."""
    x, w, b, dy = (t.double() for t in tensors)
    with torch.backends.cudnn.flags(enabled=torch.backends.cudnn.enabled, benchmark=False):   # no autotuning in fp64
        if pass_ == "forward":
            return F.conv2d(x[_checked(wl)], w, b, **kw)
        leaves = [t.requires_grad_() for t in (x, w, b)]
        return torch.autograd.grad(F.conv2d(*leaves, **kw), leaves, dy)


def _checked(wl):
    return slice(None) if wl.B <= CHECK_IMAGES else [0, 1, wl.B - 2, wl.B - 1]


def check(wl, x, w, b, dy, kw: dict, pass_: str, layout: str, ref) -> str:
    """'pass', or 'fail: ...': the drop-in's outputs against ref (reference())."""
    dtype = _name(x.dtype)
    try:
        with cl.debug():                                  # outputs poisoned with NaN: one never written fails
            out = _call(dropin.conv2d, x, w, b, dy, kw, pass_)()
        if pass_ == "forward":
            y = out[_checked(wl)]
            if dtype == "fp32":
                cl.check(y, ref, name="y")
            else:
                torch_runs = dropin.kernel_fallback_reason(x, w, b, **kw, grad=False) is not None
                impl = TORCH_16BIT if torch_runs else dispatch.forward_route(x, w, b, **kw).impl
                dispatch.check_fp16_forward(y, ref, x.shape, w.shape, b, **kw, dtype=dtype, layout=layout, impl=impl)
            return "pass"
        lengths = (wl.M // wl.groups * wl.K * wl.Kw, wl.B * wl.Ho * wl.Wo, wl.B * wl.Ho * wl.Wo)
        for name, o, r, n in zip(("dx", "dw", "dbias"), out, ref, lengths):
            if dtype == "fp32":
                cl.check(o, r, name=name)
            else:
                rtol, atol_rms = dispatch.tolerance(n, "float", dtype)
                cl.check(o, r, rtol=rtol, atol=atol_rms * max(float(r.pow(2).mean().sqrt()), 1e-30), name=name)
        return "pass"
    except Exception as e:          # a failing row says why; the run goes on
        return f"fail: {type(e).__name__}: {str(e)[:300]}"


def torch_kernel(fn) -> str:
    """The CUDA kernels torch ran for fn() (torch.profiler), the longest first, those over a tenth of the time."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA], acc_events=True) as p:
        fn()
        torch.cuda.synchronize()
    times: dict = {}
    for e in p.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            times[e.name] = times.get(e.name, 0.0) + e.device_time
    total = sum(times.values()) or 1.0
    names = [re.sub(r"\s+", " ", n)[:80] for n, t in sorted(times.items(), key=lambda kv: -kv[1]) if t >= 0.1 * total]
    return " + ".join(names) or "-"


def measure_layer(net: str, wl, count: int, dtype: str, pass_: str, reps: int, time_it: bool = True,
                  verdicts: dict | None = None) -> list:
    """The rows of one layer: ours from each layout (checked first), and, when timing, torch from each.
    verdicts: the checks made before, by (layer, pass, layout); a pass found there is not checked again."""
    grad = pass_ != "forward"
    kw = wl.conv_kwargs()
    base = dict(gpu=cl.device().name, network=net, layer=wl.name, count=count, B=wl.B, C=wl.C, M=wl.M, H=wl.H,
                W=wl.W, K=wl.K, stride=wl.stride, padding=wl.padding, groups=wl.groups, dtype=dtype, pass_=pass_,
                gflop=round(wl.flops * (3 if grad else 1) / 1e9, 4))
    rows, fns = [], {}
    verdicts = {} if verdicts is None else verdicts
    tensors = _inputs(wl, dtype)
    known = all(verdicts.get((wl, pass_, layout)) == "pass" for layout in LAYOUTS)
    ref = None if known else reference(wl, tensors, kw, pass_)
    for layout in LAYOUTS:
        x, w, b, dy = _in_layout(tensors, layout, grad)
        kernel, adds = our_kernel(wl, x, w, b, kw, pass_, layout)
        verdict = verdicts[wl, pass_, layout] = "pass" if known else check(wl, x, w, b, dy, kw, pass_, layout, ref)
        rows.append(dict(base, who="ours", layout=layout, kernel=kernel, adds=adds, check=verdict))
        if verdict == "pass":
            fns[("ours", layout)] = _call(dropin.conv2d, x, w, b, dy, kw, pass_)
        if time_it:
            fns[("torch", layout)] = _call(F.conv2d, x, w, b, dy, kw, pass_)
            rows.append(dict(base, who="torch", layout=layout, kernel=torch_kernel(fns[("torch", layout)]),
                             adds="", check=""))
    if time_it:
        caller = time_alternating(fns, reps, hold=False)
        gpu = time_alternating(fns, reps, hold=True)
        for r in rows:
            c, g = caller.get((r["who"], r["layout"])), gpu.get((r["who"], r["layout"]))
            if c is not None:
                r.update(caller_ms=c.ms, caller_p25=c.p25, caller_p75=c.p75, gpu_ms=g.ms, gpu_p25=g.p25,
                         gpu_p75=g.p75)
    del fns, tensors, ref
    if cl.device().is_gpu:
        torch.cuda.empty_cache()
    return [{("pass" if k == "pass_" else k): v for k, v in r.items()} for r in rows]


# ---- the workers -----------------------------------------------------------------------------------

def _setup_torch():
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False


def worker(net: str, dtype: str, conn, reps: int, gate) -> None:
    """Serves (pass, batch, deadline, time_it) requests for one network and dtype: every distinct
    layer's rows, sent one layer at a time, then ('done', n). gate: a semaphore held while a
    request is served without timing (the parallel first pass), to bound the GPU memory in use."""
    _setup_torch()
    verdicts: dict = {}             # (layer, pass, layout) -> its check: the first pass's, kept for the timing
    while True:
        msg = conn.recv()
        if msg is None:
            return
        pass_, B, deadline, time_it = msg
        done = 0
        for wl, count in network_layers.layers(net, B):
            if time.time() > deadline:
                break
            try:
                if time_it:
                    rows = measure_layer(net, wl, count, dtype, pass_, reps, verdicts=verdicts)
                else:
                    with gate:
                        rows = measure_layer(net, wl, count, dtype, pass_, reps, time_it=False, verdicts=verdicts)
            except Exception as e:      # out of memory, say: the layer's row says so, the next one runs
                rows = [dict(gpu=cl.device().name, network=net, layer=wl.name, count=count, B=wl.B, C=wl.C, M=wl.M,
                             H=wl.H, W=wl.W, K=wl.K, stride=wl.stride, padding=wl.padding, groups=wl.groups,
                             dtype=dtype, who="ours", layout="", kernel="", adds="",
                             check=f"fail: {type(e).__name__}: {str(e)[:300]}", **{"pass": pass_})]
                if cl.device().is_gpu:
                    torch.cuda.empty_cache()
            conn.send(("rows", rows))
            done += 1
        conn.send(("done", done))


def _items(nets, quick: bool) -> list:
    tiers = TIERS[:2] if quick else TIERS
    return [(net, dtype, pass_, B) for pass_, B, dtypes in tiers for dtype in dtypes for net in nets]


def run(args) -> Path:
    out = Path(args.out or os.environ.get("OUT") or ROOT / "benchmarks" / "results")
    out.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.get_device_name()
    path = out / f"dropin_networks_{gpu.replace(' ', '_')}.csv"
    start = time.time()
    deadline = start + args.budget_s - MARGIN_S
    ctx = mp.get_context("spawn")
    gate = ctx.Semaphore(4)
    nets, dtypes = args.networks, args.dtypes
    workers = {}
    for net in nets:
        for dtype in dtypes:
            mine, theirs = ctx.Pipe()
            p = ctx.Process(target=worker, args=(net, dtype, theirs, QUICK_REPS if args.quick else REPS, gate),
                            daemon=True)
            p.start()
            workers[net, dtype] = (p, mine)
    items = [i for i in _items(nets, args.quick) if i[1] in dtypes]
    print(f"# {gpu}: {len(workers)} workers, {len(items)} items, budget {args.budget_s} s; rows to {path}", flush=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, COLUMNS)
        writer.writeheader()
        # the first pass in parallel: every worker compiles its kernels and checks its batch-32 forward
        first = [(net, dtype) for net, dtype, pass_, B in items if (pass_, B) == ("forward", 32)]
        for key in first:
            workers[key][1].send(("forward", 32, start + FIRST_PASS * args.budget_s, False))
        for key in first:
            if _drain(workers[key][1], None, f, workers[key][0]) < 0:
                print(f"# the worker of {key} died in its first pass", flush=True)
        print(f"# compiled and checked in parallel: {time.time() - start:.0f} s", flush=True)
        for net, dtype, pass_, B in items:
            if time.time() > deadline:
                print(f"# out of time before {net} {dtype} {pass_} B={B}", flush=True)
                break
            process, conn = workers[net, dtype]
            if not process.is_alive():
                print(f"# {net} {dtype} {pass_} B={B}: its worker died before (exit code {process.exitcode})")
                continue
            conn.send((pass_, B, deadline, True))
            n = _drain(conn, writer, f, process)
            print(f"# {time.time() - start:5.0f} s  {net:15s} {dtype} {pass_:16s} B={B:<3d} {n} layers", flush=True)
    for p, conn in workers.values():
        try:
            conn.send(None)
        except (BrokenPipeError, OSError):
            pass
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
    return path


def _drain(conn, writer, f, process) -> int:
    """Rows from a worker until it says done (written to the CSV, or, without a writer, only their
    failures printed); -1 if the worker died."""
    while True:
        while not conn.poll(1.0):
            if not process.is_alive():
                print(f"# a worker died (exit code {process.exitcode})", flush=True)
                return -1
        kind, payload = conn.recv()
        if kind == "done":
            return payload
        if writer is not None:
            writer.writerows(payload)
            f.flush()
        else:
            for r in payload:
                if r["check"].startswith("fail"):
                    print(f"# FAIL {r['network']} {r['layer']} {r['dtype']} {r['layout']}: {r['check']}", flush=True)


# ---- the summary and the figure ------------------------------------------------------------------

def report(df) -> list:
    s = summary(df)
    gpu = df["gpu"].iloc[0] if len(df) else "?"
    lines = [f"# the drop-in against torch best on {gpu}: geometric means of torch best / ours over each network's "
             "layers (each as often as the network has it); above 1: ours faster. caller: CUDA events around the "
             "call from an idle GPU; gpu: the GPU held. fallback: layers the drop-in hands to torch.",
             s.to_string(index=False, float_format=lambda v: f"{v:.3f}") if len(s) else "(no rows timed)"]
    bad = df[(df["who"] == "ours") & df["check"].fillna("").str.startswith("fail")]
    lines.append(f"# failing rows (never timed): {len(bad)}")
    lines += [f"{r.network} {r.layer} {r.dtype} {r['pass']} B={r.B} {r.layout}: {r.check}" for _, r in bad.iterrows()]
    adds = df[(df["who"] == "ours") & df["adds"].fillna("").astype(str).str.len().gt(0)]
    lines.append(f"# rows whose call does more than its kernels inside it (the adds column: a conversion of x, y or "
                 f"dy to or from the layout a kernel reads, a bias added by torch): {len(adds)} of "
                 f"{int((df['who'] == 'ours').sum())}")
    return lines


def figure(df, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = summary(df)
    B = 32 if (s["B"] == 32).any() else int(s["B"].min())      # batch 32, the first measured
    s = s[s["B"] == B]
    gpu = df["gpu"].iloc[0]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True, layout="constrained")
    groups = [(d, lay) for d in DTYPES for lay in LAYOUTS]
    for ax, pass_ in zip(axes, PASSES):
        sub = s[s["pass"] == pass_]
        nets = [n for n in network_layers.NETWORKS if n in set(sub["network"])]
        width = 0.8 / len(groups)
        for i, (d, lay) in enumerate(groups):
            vals = [sub[(sub["network"] == n) & (sub["dtype"] == d) & (sub["layout"] == lay)]["caller"] for n in nets]
            ax.bar([j + i * width for j in range(len(nets))], [v.iloc[0] if len(v) else 0 for v in vals], width,
                   label=f"{d}, x {lay}")
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(nets))], nets, rotation=20)
        ax.set_title(f"{pass_}, batch {B}")
    axes[0].set_ylabel("torch best / drop-in, caller time (geomean)")
    axes[1].legend(fontsize=7, ncol=2)
    fig.suptitle(f"convlab's drop-in conv2d against torch at its best on {gpu} (above 1: the drop-in is faster)")
    fig.savefig(path, dpi=110)


def write_report(csv_path: Path) -> None:
    import pandas as pd

    df = pd.read_csv(csv_path)
    text = "\n".join(report(df))
    print(text)
    csv_path.with_suffix(".txt").write_text(text + "\n")
    if (df["who"] == "torch").any():
        figure(df, csv_path.with_suffix(".png"))


# ---- the emulator's smoke run ------------------------------------------------------------------------

#: Three layers of the networks, cut to the emulator's size (Workload.small): a 3x3 and a 1x1 of
#: ResNet-50, a strided 5x5 depthwise one of MobileNetV3
SMOKE = (("resnet50", "r50_3x3_64to64_56"), ("resnet50", "r50_1x1_256to64_56"), ("mobilenetv3", "mbv3_dw5_72_56_s2"))


def emu_smoke() -> int:
    """Every route of the three layers (each dtype, layout and pass) against fp64; nothing timed."""
    failures = 0
    for net, name in SMOKE:
        (wl,) = [wl.small() for wl, _ in network_layers.layers(net, 2) if wl.name == name]
        for dtype in DTYPES:
            for pass_ in PASSES:
                for r in measure_layer(net, wl, 1, dtype, pass_, reps=0, time_it=False):
                    failures += r["check"] != "pass"
                    print(f"{name:22s} {dtype} {pass_:16s} x {r['layout']:13s} {r['kernel']:40s} "
                          f"adds [{r['adds']}] {r['check']}")
    print(f"# {failures} failing" if failures else "# every route gives the fp64 result")
    return int(failures > 0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budget-s", type=float, default=420, help="seconds for the whole run, summary included")
    ap.add_argument("--quick", action="store_true", help="batch 32 forward only, fewer repetitions")
    ap.add_argument("--emu-smoke", action="store_true", help="3 tiny layers, every route checked, nothing timed")
    ap.add_argument("--networks", nargs="+", default=list(network_layers.NETWORKS), choices=network_layers.NETWORKS)
    ap.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES)
    ap.add_argument("--out", help="the folder for the CSV, summary and figure (default $OUT, else benchmarks/results)")
    ap.add_argument("--report", type=Path, help="only the summary and the figure, from this CSV")
    args = ap.parse_args(argv)
    if args.emu_smoke:
        return emu_smoke()
    if args.report:
        write_report(args.report)
        return 0
    if not cl.device().is_gpu:
        print("# no GPU: the emulator runs --emu-smoke (nothing else here is a GPU measurement)")
        return emu_smoke()
    write_report(run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
