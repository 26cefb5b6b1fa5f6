#!/usr/bin/env python3
"""Hopper's wgmma kernels on the convolutions of today's CNNs (convlab.ops.hopper: forward, dX and dW,
fp16 and bf16, channels_last), each output checked against torch, a few tunables swept per layer,
torch beside them; and, with --chapter, chapter 11's conv2d_wgmma on the standard ResNet/VGG layers.

    python benchmarks/hopper_layers.py --out $OUT            # every network, fp16 and bf16, forward, dX, dW
    python benchmarks/hopper_layers.py --networks resnet50 --passes forward --dtypes fp16
    python benchmarks/hopper_layers.py --chapter             # chapter 11's kernel (its CSV, as before)
    CONVLAB_BACKEND=emu python benchmarks/hopper_layers.py --networks unet --small   # emulator: checks only

Networks (batch 32, NETWORKS): every convolution of ResNet-50, VGG-16, MobileNetV3-Large and
EfficientNet-B0 that is not depthwise (those go to convlab.ops.depthwise), squeeze-excitation 1x1s
included, and a diffusion UNet's res-block at three scales, each distinct shape once. Per layer,
dtype and pass: ours with its config (hopper_config / hopper_dx_config / hopper_dw_config), then
(fp16 only, while the time budget lasts) the swept tunables that matter for the layer's class
(sweep(): BN; SPLIT_K where the config splits or the tiles are few; RINGS=2 on 1x1 layers; the
epilogue by TMA stores, TMA_STORE=1; dW's CONSUMERS) and torch: channels_last for every
pass and NCHW for the forward, cudnn.benchmark on, TF32 off, timed in one fresh process per dtype
(a worker, --torch-worker; the book's per-shape processes would take longer than the run may),
first, so that what is left of --budget goes to the sweeps. --mma adds chapter 9's mma.sync.
Every output of ours is checked against torch's float32 on the same half/bf16 inputs (TF32 off),
to the bound of fp16.fp16_tolerance for float sums (bf16's unit roundoff for its final rounding).

GPU times are convlab.measuring.bench.time_gpu's (CUDA events, L2 flushed, the median of --reps). Printed: per
layer and pass, torch best, ours with the config, ours best and its tunables; per network, dtype
and pass the geometric mean of torch best / ours (above 1: ours faster), for the config and for
the best swept tile; the config's misses (a swept tile 10% faster) by layer class, what
hopper_config's rule should learn. Rows go to <out>/hopper_networks_<GPU>.csv (default
benchmarks/results). Meant to finish under 6 minutes on an H200: no sweep starts after --budget
seconds (270), the configs' rows go on.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import convlab as cl  # noqa: E402
from convlab.measuring import baselines, results, workloads  # noqa: E402
from convlab.measuring.bench import strict_fp32, time_gpu  # noqa: E402
from convlab.measuring.workloads import Workload  # noqa: E402
from convlab.ops import hopper  # noqa: E402
from convlab.ops import tensor_core as tc  # noqa: E402
from convlab.ops import wgmma  # noqa: E402
from convlab.programs import measure

DTYPES = ("fp16", "bf16")
PASSES = ("forward", "dX", "dW")
BATCH = 32


# ---- the networks --------------------------------------------------------------------------------

def _conv(net: str, C: int, M: int, HW: int, K: int = 1, stride: int = 1, B: int = BATCH) -> Workload:
    name = f"{net}:{K}x{K}{f's{stride}' if stride > 1 else ''}_{C}-{M}@{HW}"
    return Workload(name, B=B, C=C, M=M, H=HW, W=HW, K=K, stride=stride, padding=K // 2)


def _resnet50():
    out = [("resnet50", 3, 64, 224, 7, 2)]
    C, HW = 64, 56
    for width, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        out += [("resnet50", C, width, HW), ("resnet50", width, width, HW, 3, stride)]
        HW //= stride
        out += [("resnet50", width, 4 * width, HW), ("resnet50", C, 4 * width, HW * stride, 1, stride),
                ("resnet50", 4 * width, width, HW), ("resnet50", width, width, HW, 3)]
        C = 4 * width
    return out


def _vgg16():
    out, C, HW = [], 3, 224
    for M, convs in ((64, 2), (128, 2), (256, 3), (512, 3), (512, 3)):
        for _ in range(convs):
            out.append(("vgg16", C, M, HW, 3))
            C = M
        HW //= 2
    return out


def _mobilenet_v3():
    """MobileNetV3-Large: the stem, the expansions and projections, the squeeze-excitation 1x1s (on
    1x1 maps), the last 1x1 (depthwise layers left out)."""
    out = [("mobilenet_v3", 3, 16, 224, 3, 2), ("mobilenet_v3", 16, 16, 112)]
    blocks = [(16, 64, 24, 112, 2, 0), (24, 72, 24, 56, 1, 0), (24, 72, 40, 56, 2, 24), (40, 120, 40, 28, 1, 32),
              (40, 240, 80, 28, 2, 0), (80, 200, 80, 14, 1, 0), (80, 184, 80, 14, 1, 0), (80, 480, 112, 14, 1, 120),
              (112, 672, 112, 14, 1, 168), (112, 672, 160, 14, 2, 168), (160, 960, 160, 7, 1, 240)]
    for c, e, o, hw, s, se in blocks:
        out += [("mobilenet_v3", c, e, hw), ("mobilenet_v3", e, o, hw // s)]
        if se:
            out += [("mobilenet_v3", e, se, 1), ("mobilenet_v3", se, e, 1)]
    return out + [("mobilenet_v3", 160, 960, 7)]


def _efficientnet_b0():
    """EfficientNet-B0: the stem, the expansions and projections, the squeeze-excitation 1x1s (a
    quarter of the block's input channels: 4, 6, 10, 20, 28, 48 maps), the head."""
    out = [("efficientnet_b0", 3, 32, 224, 3, 2), ("efficientnet_b0", 32, 8, 1), ("efficientnet_b0", 8, 32, 1),
           ("efficientnet_b0", 32, 16, 112)]
    blocks = [(16, 24, 112, 2), (24, 24, 56, 1), (24, 40, 56, 2), (40, 40, 28, 1), (40, 80, 28, 2), (80, 80, 14, 1),
              (80, 112, 14, 1), (112, 112, 14, 1), (112, 192, 14, 2), (192, 192, 7, 1), (192, 320, 7, 1)]
    for c, o, hw, s in blocks:
        e = 6 * c
        out += [("efficientnet_b0", c, e, hw), ("efficientnet_b0", e, c // 4, 1), ("efficientnet_b0", c // 4, e, 1),
                ("efficientnet_b0", e, o, hw // s)]
    return out + [("efficientnet_b0", 320, 1280, 7)]


def _unet():
    """A diffusion UNet's res-block at three scales: the two 3x3s, the channel-raising 3x3 and its 1x1
    skip."""
    return [("unet", 320, 320, 64, 3), ("unet", 320, 640, 32, 3), ("unet", 640, 640, 32, 3), ("unet", 320, 640, 32),
            ("unet", 1280, 1280, 16, 3)]


NETWORKS = {"resnet50": _resnet50, "vgg16": _vgg16, "mobilenet_v3": _mobilenet_v3,
            "efficientnet_b0": _efficientnet_b0, "unet": _unet}


def network_layers(names) -> list:
    """[Workload]: each network's distinct convolutions, in order."""
    out, seen = [], set()
    for net in names:
        for spec in NETWORKS[net]():
            wl = _conv(*spec)
            if wl.name not in seen:
                seen.add(wl.name)
                out.append(wl)
    return out


def layer_class(wl: Workload, pass_: str) -> str:
    """The class whose config rule a layer informs: pass, mask, stride, few channels, few tiles."""
    kind = "1x1" if wl.K == 1 else f"{wl.K}x{wl.K}"
    if wl.stride > 1:
        kind += " strided"
    if wl.C <= 8:
        kind += " few channels"
    if wl.Ho * wl.Wo <= 64:
        kind += " small map"
    return f"{pass_} {kind}"


# ---- ours ----------------------------------------------------------------------------------------

def _torch_dtype(dtype: str):
    import torch
    return {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]


def config_of(wl: Workload, pass_: str) -> dict:
    return {"forward": hopper.hopper_config, "dX": hopper.hopper_dx_config, "dW": hopper.hopper_dw_config}[pass_](wl)


def refusal(wl: Workload, pass_: str) -> str | None:
    return hopper.refuses(wl, {"forward": "forward", "dX": "dx", "dW": "dw"}[pass_])


def sweep(wl: Workload, pass_: str) -> list:
    """The tunables worth timing beside the config on this layer: each BN the output channels fill,
    SPLIT_K around the config's (and 1) where it splits or the tiles are few; one and two rings on a
    1x1 layer; the forward's epilogue by TMA stores; dW's CONSUMERS for 128 maps or fewer."""
    cfg = config_of(wl, pass_)
    out = []
    width = wl.C if pass_ == "dX" else wl.M if pass_ == "forward" else wl.C
    for BN in (64, 128, 256):
        if BN != cfg["BN"] and BN <= max(64, width):
            out.append({**cfg, "BN": BN, "STAGES": None})
    splits = {1, max(1, cfg["SPLIT_K"] // 2), cfg["SPLIT_K"] * 2} - {cfg["SPLIT_K"]}
    most = hopper.MAX_DW_SPLIT if pass_ == "dW" else hopper.MAX_SPLIT
    if cfg["SPLIT_K"] > 1 or wl.Ho * wl.Wo * wl.B <= 4096:
        out += [{**cfg, "SPLIT_K": s} for s in sorted(splits) if s <= most]
    if pass_ == "forward" and wl.K == 1:
        out.append({**cfg, "RINGS": 2, "BW": None, "BH": None, "BI": None, "STAGES": None})
    if pass_ == "forward" and wl.M % 8 == 0:
        out.append({**cfg, "TMA_STORE": 1, "SPLIT_K": 1})
    if pass_ == "dW" and wl.M <= 128:
        out.append({**cfg, "CONSUMERS": 3 - cfg["CONSUMERS"], "STAGES": None})
    return out


def run_ours(wl: Workload, pass_: str, t: dict, tunables: dict):
    kw = dict(wl.conv_kwargs(), **{k: v for k, v in tunables.items() if v is not None})
    if pass_ == "forward":
        return lambda: hopper.conv2d_hopper(t["x"], t["w"], **kw)
    if pass_ == "dX":
        return lambda: hopper.conv2d_hopper_dx(t["dy"], t["w"], input_size=(wl.H, wl.W), **kw)
    return lambda: hopper.conv2d_hopper_dw(t["x"], t["dy"], kernel_size=wl.kernel_size, **kw)


def run_mma(wl: Workload, pass_: str, t: dict):
    kw = wl.conv_kwargs()
    if pass_ == "forward":
        return lambda: tc.conv2d_mma(t["x"], t["w"], **kw)
    if pass_ == "dX":
        return lambda: tc.conv2d_mma_dx(t["dy"], t["w"], input_size=(wl.H, wl.W), **kw)
    return lambda: tc.conv2d_mma_dw(t["x"], t["dy"], kernel_size=wl.kernel_size, **kw)


def inputs(wl: Workload, dtype: str) -> dict:
    import torch

    dt = _torch_dtype(dtype)
    cl_ = torch.channels_last
    return {"x": cl.randn(*wl.x_shape).to(dt).contiguous(memory_format=cl_),
            "w": cl.randn(*wl.w_shape).to(dt).contiguous(memory_format=cl_),
            "dy": cl.randn(*wl.y_shape).to(dt).contiguous(memory_format=cl_)}


def reference(wl: Workload, pass_: str, t: dict):
    """torch in float32 on the same inputs (TF32 off): the reference our outputs are checked against."""
    import torch
    import torch.nn.functional as F

    kw = wl.conv_kwargs()
    f = {k: v.float() for k, v in t.items()}
    with strict_fp32():
        if pass_ == "forward":
            return F.conv2d(f["x"], f["w"], **kw)
        if pass_ == "dX":
            return torch.nn.grad.conv2d_input(f["x"].shape, f["w"], f["dy"], **kw)
        return torch.nn.grad.conv2d_weight(f["x"], f["w"].shape, f["dy"], **kw)


def check(out, ref, wl: Workload, pass_: str, dtype: str) -> float:
    """The largest |ours - ref| over the bound (fp16.fp16_tolerance, float sums; bf16's unit roundoff
    for the final rounding; the float32 reference's own error, u32 per term, added): at most 1 passes."""
    from convlab.ops.fp16 import U16, U32, fp16_tolerance

    terms = {"forward": wl.reduction, "dX": wl.M * wl.K * wl.Kw, "dW": wl.B * wl.Ho * wl.Wo}[pass_]
    rtol, atol_rms = fp16_tolerance(terms, 1, "float", rounded_inputs=True)
    if dtype == "bf16":
        rtol += 2.0 ** -8 - U16
    r = ref.double()
    rms = float(r.pow(2).mean().sqrt())
    bound = rtol * r.abs() + (atol_rms + 12 * U32 * math.sqrt(terms)) * max(rms, 1e-30)
    err = (out.double() - r).abs()
    if not bool(torch_isfinite(out)):
        return math.inf
    return float((err / bound).max())


def torch_isfinite(t):
    import torch
    return torch.isfinite(t).all()


# ---- torch, in a worker process ------------------------------------------------------------------

def torch_worker(spec_path: str) -> int:
    """Time torch on each (layer, pass, layout) of the spec file, one JSON line each."""
    import torch

    from convlab.measuring.torch_baseline import _kernels

    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    spec = json.loads(Path(spec_path).read_text())
    dt = _torch_dtype(spec["dtype"])
    g = torch.Generator(device="cuda").manual_seed(2026)
    for item in spec["layers"]:
        wl = Workload(**item["workload"])
        kw = wl.conv_kwargs()
        for layout in ("channels_last", "nchw"):
            fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
            x = torch.randn(wl.x_shape, device="cuda", dtype=dt, generator=g).contiguous(memory_format=fmt)
            w = torch.randn(wl.w_shape, device="cuda", dtype=dt, generator=g).contiguous(memory_format=fmt)
            dy = torch.randn(wl.y_shape, device="cuda", dtype=dt, generator=g).contiguous(memory_format=fmt)
            fns = {"forward": lambda: torch.nn.functional.conv2d(x, w, **kw),
                   "dX": lambda: torch.nn.grad.conv2d_input(x.shape, w, dy, **kw),
                   "dW": lambda: torch.nn.grad.conv2d_weight(x, w.shape, dy, **kw)}
            for p in item["passes"]:
                if layout == "nchw" and p != "forward":
                    continue
                t = time_gpu(fns[p], reps=spec["reps"])
                names = _kernels(fns[p]) if (p, layout) == ("forward", "channels_last") else []   # the profiler is slow
                print(json.dumps({"workload": wl.name, "pass": p, "layout": layout, "ms": t.ms, "p25": t.p25,
                                  "p75": t.p75, "kernels": names}), flush=True)
            del x, w, dy
    return 0


def time_torch(layers, passes, dtype: str, reps: int, folder: Path) -> list:
    spec = {"dtype": dtype, "reps": reps, "layers": [
        {"workload": {k: getattr(wl, k) for k in ("name", "B", "C", "M", "H", "W", "K", "stride", "padding")},
         "passes": list(passes)} for wl in layers]}
    path = folder / f"torch_spec_{dtype}.json"
    path.write_text(json.dumps(spec))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--torch-worker", str(path)],
                          capture_output=True, text=True, env=env, timeout=900)
    path.unlink()
    if done.returncode != 0:
        print(f"# torch ({dtype}) failed:\n{done.stderr[-3000:]}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


# ---- the run -------------------------------------------------------------------------------------

def plan_of(wl: Workload, pass_: str, dtype: str, tun: dict):
    """The launcher's plan for one call (its Launches: the kernel variants it compiles)."""
    dt = _torch_dtype(dtype)
    given = {k: v for k, v in tun.items() if v is not None}
    if pass_ == "forward":
        return hopper._fwd_plan(wl.x_shape, wl.w_shape, dt, wl.stride, wl.padding, 1, 1, False, False, given)
    if pass_ == "dX":
        return hopper._dx_plan(wl.y_shape, wl.w_shape, dt, wl.stride, wl.padding, 1, 1, (wl.H, wl.W), given)
    return hopper._dw_plan(wl.x_shape, wl.y_shape, dt, wl.K, wl.stride, wl.padding, 1, 1, given)


def warm_up(layers, passes, dtypes) -> None:
    """Compile every kernel variant the configs and sweeps need, several at once (nvcc runs outside
    the GIL); a failure here is left to the call that meets it."""
    from concurrent.futures import ThreadPoolExecutor

    launches = set()
    for wl in layers:
        for dtype in dtypes:
            for p in passes:
                if refusal(wl, p):
                    continue
                for tun in [config_of(wl, p)] + (sweep(wl, p) if dtype == "fp16" else []):
                    try:
                        plan = plan_of(wl, p, dtype, tun)
                    except ValueError:
                        continue
                    for launch in (plan.launch, plan.reduce):
                        if launch is not None:
                            launches.add((launch.path, launch.defines))
    from convlab.ops._kernels import module_ref

    def build(key):
        try:
            module_ref(*key).get()
        except Exception as e:  # noqa: BLE001 - reported, then met again by the call
            return f"{key}: {e}"
        return None

    t0 = time.time()
    with ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 2)) as pool:
        errors = [e for e in pool.map(build, sorted(launches)) if e]
    print(f"# compiled {len(launches)} kernel variants in {time.time() - t0:.0f} s"
          + (f"; {len(errors)} failed: {errors[:3]}" if errors else ""))


def measure_networks(args) -> int:
    import pandas as pd
    import torch

    gpu = cl.backend() == "cuda"
    t_start = time.time()
    names = [n for n in args.networks.split(",") if n]
    layers = network_layers(names)
    if args.small or not gpu:
        layers = [wl.small() for wl in layers]
    dtypes = [d for d in args.dtypes.split(",") if d]
    passes = [p for p in args.passes.split(",") if p]
    print(f"# {cl.device()}; {len(layers)} layers of {', '.join(names)}; {', '.join(dtypes)}; {', '.join(passes)}")
    if gpu:
        warm_up(layers, passes, dtypes)
    folder = Path(args.out) if args.out else ROOT / "benchmarks" / "results"
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    if gpu and args.torch:                    # first: what is left of the budget goes to the sweeps
        for dtype in dtypes:
            for r in time_torch(layers, passes, dtype, args.reps, folder):
                wl = next(w for w in layers if w.name == r["workload"])
                rows.append(_row(wl, r["pass"], dtype, f"torch ({r['layout']})", "torch", {},
                                 results.Measured(r["ms"], r["p25"], r["p75"]),
                                 note=baselines.kernel_short_name(" ".join(r["kernels"]))[:60]))
        print(f"# torch done at {time.time() - t_start:.0f} s")
    over = False
    for dtype in dtypes:
        for wl in layers:
            t = inputs(wl, dtype)
            for p in passes:
                why = refusal(wl, p)
                if why:
                    rows.append(_row(wl, p, dtype, "refused", "hopper", {}, None, note=why))
                    continue
                ref = reference(wl, p, t)
                cfg = config_of(wl, p)
                over = over or time.time() - t_start > args.budget
                tries = [cfg] + (sweep(wl, p) if dtype == "fp16" and not over else [])
                for i, tun in enumerate(tries):
                    fn = run_ours(wl, p, t, tun)
                    try:
                        out = fn()
                    except (cl.ConvlabError, ValueError) as e:
                        print(f"# {wl.name} {p} {tun}: cannot run ({str(e).splitlines()[0]})")
                        continue
                    err = check(out, ref, wl, p, dtype)
                    if err > 1:
                        print(f"# WRONG: {wl.name} {p} {dtype} {tun}: error {err:.3g} x the bound")
                    timing = time_gpu(fn, reps=args.reps) if gpu else None
                    rows.append(_row(wl, p, dtype, "config" if i == 0 else "sweep", "hopper", tun, timing, err=err))
                    del out
                if dtype == "fp16" and args.mma and gpu and not over and tc.MMA.takes(wl):
                    fn = run_mma(wl, p, t)
                    out = fn()
                    rows.append(_row(wl, p, dtype, "mma.sync", "mma", {}, time_gpu(fn, reps=args.reps),
                                     err=check(out, ref, wl, p, dtype)))
                    del out
                del ref
            del t
            torch.cuda.empty_cache() if gpu else None
        print(f"# {dtype}: ours done at {time.time() - t_start:.0f} s"
              + ("; the sweeps stopped at the budget" if over else ""))
    df = pd.DataFrame(rows)
    if not gpu:
        bad = df[(df["kind"] != "refused") & ~(df["error"] <= 1)]
        print(f"# emulator: {int((df['kind'] == 'config').sum())} configs and {int((df['kind'] == 'sweep').sum())} "
              f"sweeps checked on the layers' small twins; {len(bad)} outside the bound; nothing timed")
        return 1 if len(bad) else 0
    for line in report(df):
        print(line)
    target = folder / f"hopper_networks_{str(cl.device().name).replace(' ', '_')}.csv"
    df.to_csv(target, index=False, float_format="%.6g")
    print(f"# wrote {target.name} ({len(df)} rows) at {time.time() - t_start:.0f} s")
    return 0


def _row(wl: Workload, pass_: str, dtype: str, kind: str, impl: str, tun: dict, timing, err=math.nan,
         note: str = "") -> dict:
    flops = wl.flops
    ms = float(timing.ms) if timing is not None else math.nan
    row = {"network": wl.name.split(":")[0], "workload": wl.name, "shape": wl.shape_text, "class": layer_class(wl, pass_),
           "pass": pass_, "dtype": dtype, "impl": impl, "kind": kind, "ms": ms,
           "p25": float(timing.p25) if timing is not None else math.nan,
           "p75": float(timing.p75) if timing is not None else math.nan,
           "tflops": flops / (ms * 1e-3) / 1e12 if ms == ms else math.nan, "error": err, "note": note,
           "gpu": cl.device().name, **results.versions(), "tf32": "TF32 off", "date": datetime.date.today().isoformat()}
    for k in ("BN", "STAGES", "RINGS", "BW", "BH", "BI", "SPLIT_K", "TMA_STORE", "CONSUMERS"):
        row[k] = tun.get(k) if tun.get(k) is not None else math.nan
    return row


def _geo(v) -> float:
    v = [x for x in v if x == x and x > 0]
    return math.exp(sum(map(math.log, v)) / len(v)) if v else math.nan


def report(df) -> list:
    """Per layer and pass: torch best, ours (config), ours best; per network, dtype and pass the
    geometric means of torch best / ours; the config's misses by layer class."""
    out = [f"{'layer':34s} {'pass':7s} {'dtype':5s} {'torch best':>10s} {'config':>9s} {'best':>9s} "
           f"{'torch/config':>12s} {'torch/best':>10s}  best tunables"]
    summary, misses = {}, {}
    for (name, p, dtype), g in df.groupby(["workload", "pass", "dtype"], sort=False):
        torch_rows = g[g["impl"] == "torch"]
        ours = g[(g["impl"] == "hopper") & (g["kind"].isin(["config", "sweep"]))]
        if ours.empty:
            continue
        cfg = ours[ours["kind"] == "config"]["ms"].min()
        best = ours.loc[ours["ms"].idxmin()]
        t = torch_rows["ms"].min() if len(torch_rows) else math.nan
        tun = {k: int(best[k]) for k in ("BN", "RINGS", "SPLIT_K", "TMA_STORE", "CONSUMERS") if best[k] == best[k]}
        out.append(f"{name:34s} {p:7s} {dtype:5s} {t:10.4f} {cfg:9.4f} {best['ms']:9.4f} {t / cfg:12.2f} "
                   f"{t / best['ms']:10.2f}  {tun}")
        key = (name.split(":")[0], dtype, p)
        summary.setdefault(key, []).append((t / cfg, t / best["ms"]))
        if best["ms"] < 0.9 * cfg:
            misses.setdefault(g["class"].iloc[0], []).append(f"{name} {tun} {cfg / best['ms']:.2f}x")
    out.append("# torch best / ours, geometric mean (config; best swept tile), per network, dtype and pass:")
    for (net, dtype, p), v in summary.items():
        out.append(f"#   {net:16s} {dtype:5s} {p:7s} {_geo([a for a, _ in v]):.2f}; {_geo([b for _, b in v]):.2f} "
                   f"({len(v)} layers, config below 0.8x on {sum(a < 0.8 for a, _ in v)})")
    out.append("# the config's misses (a swept tile at least 10% faster), by layer class:")
    for k, v in sorted(misses.items()):
        out.append(f"#   {k}: " + "; ".join(v))
    return out


# ---- chapter 11: conv2d_wgmma on GEMM_LAYERS ----------------------------------------------------------

def chapter_layers(names: list[str]) -> list:
    """The GEMM layers conv2d_wgmma takes (by name, or all of them); the others said why not."""
    out = []
    for wl in workloads.GEMM_LAYERS:
        if names and wl.name not in names:
            continue
        why = wgmma.refuses(wl)
        if why:
            print(f"# {wl.name}: not taken by conv2d_wgmma ({why}); chapter 9's mma.sync kernel runs it")
        else:
            out.append(wl)
    return out


def chapter_configs(wl) -> list[dict]:
    """wgmma_config's choice, then each BN the layer's maps fill, with one ring and with two."""
    shape = wl if cl.backend() == "cuda" else wl.small()
    out = [wgmma.wgmma_config(shape)]
    for BN in (64, 128, 256):
        if BN > max(64, shape.M):
            continue
        for rings in (1, 2):
            if wgmma.shared_bytes(BN, 2, rings) + wgmma.static_shared(2, rings) <= wgmma.SHARED_OPTIN_MAX:
                out.append(dict(BN=BN, RINGS=rings))
    return [dict(c) for c in dict.fromkeys(tuple(sorted(c.items())) for c in out)]


def chapter_measure(wl, reps: int):
    import pandas as pd

    swept = measure.sweep(wgmma.WGMMA, wl, chapter_configs(wl), dtype="fp16", layout="channels_last", reps=reps,
                          desc=wl.name)
    rest = measure.run([tc.MMA], [wl], dtype="fp16", layout="channels_last", reps=reps, desc=wl.name)
    return pd.concat([swept, rest], ignore_index=True)


def _tunables(r) -> dict:
    return {k: int(r[k]) for k in wgmma.TUNABLES if k in r and isinstance(r[k], (int, float)) and not math.isnan(r[k])}


def chapter_report(df) -> list[str]:
    """Per layer: torch best, mma.sync, wgmma_config's tile, the fastest tile; ratios; geomeans."""
    out = [f"{'layer':22s} {'torch best (kernel)':44s} {'mma.sync':>9s} {'wgmma':>9s} {'best':>9s}  "
           f"{'torch/wgmma GPU':>15s} {'caller':>7s}  best tile"]
    ratios = {"gpu": [], "caller": [], "best": []}
    for name, rows in df.groupby("workload", sort=False):
        best_t = rows[rows["kind"] == "torch best"].iloc[0]
        mma = rows[(rows["kind"] == "ours") & (rows["impl"] == tc.MMA.name)]
        ours = rows[(rows["kind"] == "ours") & (rows["impl"] == wgmma.WGMMA.name)]
        wl = next(w for w in workloads.GEMM_LAYERS if w.name == name)
        cfg = wgmma.wgmma_config(wl)
        mine = ours[[all(_tunables(r).get(k) == v for k, v in cfg.items() if k in ("BN", "RINGS"))
                     and (_tunables(r).get("STAGES") in (None, cfg["STAGES"])) for _, r in ours.iterrows()]]
        chosen = mine.loc[mine["ms"].idxmin()]
        best = ours.loc[ours["ms"].idxmin()]
        t_caller = best_t["caller_ms"]
        ratios["gpu"].append(best_t["ms"] / chosen["ms"])
        ratios["caller"].append(t_caller / chosen["caller_ms"])
        ratios["best"].append(best_t["ms"] / best["ms"])
        kernel = baselines.kernel_short_name(str(best_t["torch_kernels"] or ""))[:30]
        out.append(f"{name:22s} {best_t['ms']:.4f} {best_t['layout']:>13s} {kernel:30s} {mma['ms'].min():9.4f} "
                   f"{chosen['ms']:9.4f} {best['ms']:9.4f}  {ratios['gpu'][-1]:15.2f} {ratios['caller'][-1]:7.2f}  "
                   f"{_tunables(best)}")
    out.append(f"# torch best / wgmma_config's tile, geometric mean: GPU time {_geo(ratios['gpu']):.2f} "
               f"(at least 1.0 on {sum(r >= 1 for r in ratios['gpu'])} of {len(ratios['gpu'])} layers), as a caller "
               f"sees it {_geo(ratios['caller']):.2f}; the fastest tile per layer: {_geo(ratios['best']):.2f}")
    return out


def chapter_main(args) -> int:
    import pandas as pd

    print(f"# {cl.device()}")
    df = pd.concat([chapter_measure(w, args.reps) for w in chapter_layers([n for n in args.layers.split(",") if n])],
                   ignore_index=True)
    if cl.backend() != "cuda":
        print(f"# emulator: {len(df)} rows checked against fp64 on the layers' small twins; nothing timed")
        return 0
    print(f"# {results.provenance(df)}")
    for line in chapter_report(df):
        print(line)
    results.save_benchmark(df, "hopper_layers", args.out)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--networks", default=",".join(NETWORKS), help=f"comma-separated, of {', '.join(NETWORKS)}")
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--passes", default=",".join(PASSES))
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--budget", type=float, default=270.0, help="seconds (from the start, torch's time "
                    "included) after which no more sweeps start")
    ap.add_argument("--small", action="store_true", help="the layers' small twins (the emulator's)")
    ap.add_argument("--mma", action="store_true", help="chapter 9's mma.sync kernels too (fp16; its tiles compile "
                    "one by one: longer)")
    ap.add_argument("--no-torch", dest="torch", action="store_false", help="leave torch out")
    ap.add_argument("--out", default=None, help="folder for the CSV (default benchmarks/results)")
    ap.add_argument("--chapter", action="store_true", help="chapter 11's conv2d_wgmma on GEMM_LAYERS instead")
    ap.add_argument("--layers", default="", help="--chapter: comma-separated layer names (default: all it takes)")
    ap.add_argument("--torch-worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.torch_worker:
        return torch_worker(args.torch_worker)
    if args.chapter:
        return chapter_main(args)
    return measure_networks(args)


if __name__ == "__main__":
    sys.exit(main())
