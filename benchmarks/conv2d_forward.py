#!/usr/bin/env python3
"""Time every forward kernel of chapters 2–5 on the course's 2D workloads against torch.

    python benchmarks/conv2d_forward.py                       # all kernels, all 2D workloads
    python benchmarks/conv2d_forward.py --workloads lenet_c1,fa17 --kernels direct,implicit
    python benchmarks/conv2d_forward.py --sweep               # chapter 5's block size x coarsening sweep
    CONVLAB_BACKEND=emu python benchmarks/conv2d_forward.py   # emulator: small shapes, checks only

On a GPU: every kernel is first checked against an fp64 reference (computed on the GPU with
torch, same tolerance rule as cl.check), then timed with cl.bench (CUDA events, warm-up, L2 flushed
before each call, median), next to torch's convolution at its defaults and with
cudnn.benchmark=True, both in strict fp32 (TF32 off). The table gives ms, GFLOP/s, GB/s (the
least traffic: input, weights and output once), the fraction of the roofline floor reached
(floor / time), and the speedup over torch default and tuned. The CSV carries the GPU's name,
the torch and cuDNN versions, the TF32 setting and the date on every row.

On the emulator the same code runs on each workload's small() twin, so the script checks itself
and every kernel; the times it prints are CPU wall times of an emulator, NOT GPU timings, and the
CSV says so in its `timing` column.
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

import convlab as cl  # noqa: E402
from _harness import report_failures, save_rows  # noqa: E402
from convlab.ops import fused, im2col, naive, tiled  # noqa: E402
from convlab import roofline as _roofline  # noqa: E402
from convlab.baselines import strict_fp32, versions  # noqa: E402
from convlab.workloads import WORKLOADS_2D  # noqa: E402


def roof():
    """(bandwidth B/s, fp32 FLOP/s, where the numbers come from)."""
    r = _roofline.current()
    return r.bandwidth, r.flop_rate, r.source


# ---- the contenders ------------------------------------------------------------------------------

def _fits_constant(wl):
    return wl.M * wl.C * wl.K * wl.K <= tiled.MASK_MAX


def kernels():
    """(chapter, name, launcher, tunables, applies(workload) -> reason or None)."""
    always = lambda wl: None  # noqa: E731
    const = lambda wl: None if _fits_constant(wl) else "mask over 64 KB of constant memory"  # noqa: E731
    ks = [
        (2, "naive (flat grid)", naive.conv2d_naive_flat, {}, always),
        (2, "naive (B·M on grid z)", naive.conv2d_naive_z, {},
         lambda wl: None if wl.B * wl.M <= 65535 else "B·M over the grid z limit"),
        (3, "tiled multi-pass, const mask", tiled.conv2d_tiled_halo_multi_pass, {"mask": "constant"}, const),
        (3, "tiled multi-pass, global mask", tiled.conv2d_tiled_halo_multi_pass, {"mask": "global"}, always),
        (3, "tiled input-block, const mask", tiled.conv2d_tiled_input_block, {"mask": "constant"}, const),
        (3, "tiled input-block, global mask", tiled.conv2d_tiled_input_block, {"mask": "global"},
         lambda wl: "measured with the constant mask" if _fits_constant(wl) else None),
        (3, "tiled cached-halo, const mask", tiled.conv2d_tiled_cached_halo, {"mask": "constant"},
         lambda wl: const(wl) or (None if wl.stride == 1 else "stride 1 only")),
        (3, "tiled cached-halo, global mask", tiled.conv2d_tiled_cached_halo, {"mask": "global"},
         lambda wl: ("measured with the constant mask" if _fits_constant(wl) else None)
         or (None if wl.stride == 1 else "stride 1 only")),
        (4, "im2col + tiled GEMM", im2col.conv2d_im2col_gemm, {}, always),
        (4, "im2col + torch.matmul", im2col.conv2d_im2col_matmul, {}, always),
        (5, "implicit GEMM", fused.conv2d_implicit_gemm, {}, always),
        (5, "implicit GEMM, K compiled in", fused.conv2d_implicit_gemm, {"KSIZE": "K"}, always),
        (5, "implicit GEMM, register-tiled", fused.conv2d_implicit_gemm_reg, {"BM": "auto"}, always),
        (5, "direct, coarsened", fused.conv2d_direct_coarse, {},
         lambda wl: None if fused.direct_fits(wl.M, wl.C, wl.K) else "M·C·K² too large for the unrolled body"),
        (5, "direct, register-tiled", fused.conv2d_direct_regtile, {},
         lambda wl: None if fused.regtile_fits(wl.M, wl.C, wl.K) else "mask slice over 48 KB of shared memory"),
        (5, "best (pick)", None, {}, always),
    ]
    return ks


def resolve(fn, tunables, wl):
    """Fill in tunables that depend on the workload ("K", "auto", pick())."""
    if fn is None:
        best = fused.pick(wl)
        return best.launcher, best.config(wl), best.name
    t = dict(tunables)
    if t.get("KSIZE") == "K":
        t["KSIZE"] = wl.K
    if t.get("BM") == "auto":     # the dispatcher's GEMM tile for this many maps
        t.update(fused.gemm_config(wl.M))
    return fn, t, None


# ---- checking on the device ------------------------------------------------------------------------

def reference(x, w, wl):
    """fp64 reference: torch on the GPU (fast at full size), cl.ref on the emulator."""
    if cl.backend() == "cuda":
        with strict_fp32():
            return torch.nn.functional.conv2d(x.double(), w.double(), stride=wl.stride, padding=wl.padding)
    return cl.ref.conv2d(x, w, stride=wl.stride, padding=wl.padding)


def check(y, ref, x, w, wl, fn, tunables):
    """cl.check's rule (|y-ref| <= atol + rtol|ref|, atol = 1e-4·RMS(ref), rtol = 1e-4), evaluated
    on the device in chunks so a 1 GB output is checked in a second. On a failure, cl.check on the
    first failing images gives its detailed message."""
    rms = float(ref.pow(2).mean().sqrt())
    atol, rtol = 1e-4 * rms, 1e-4
    bad_images = []
    step = max(1, (1 << 26) // max(1, ref[0].numel()))
    for b0 in range(0, ref.shape[0], step):
        yr, rr = y[b0:b0 + step].double(), ref[b0:b0 + step]
        ok = (yr - rr).abs() <= atol + rtol * rr.abs()          # NaN compares False: never written
        if not bool(ok.all()):
            bad_images.append(b0 + int((~ok).flatten(1).any(1).nonzero()[0]))
            break
    if not bad_images:
        return "ok"
    b = bad_images[0]
    r = cl.check(y[b:b + 1], ref[b:b + 1], name=f"y[{b}]", raise_on_error=False)
    return f"FAIL: {r}"


# ---- one row ---------------------------------------------------------------------------------------

def meta():
    v = versions()
    dev = cl.device()
    return {"backend": dev.backend, "gpu": dev.name if dev.backend == "cuda" else "CPU emulator",
            "torch": v["torch"], "cudnn": v["cudnn"], "tf32": "off", "date": dt.date.today().isoformat(),
            "timing": "GPU: CUDA events, L2 flushed, median" if dev.backend == "cuda"
            else "emulator wall time, NOT a GPU timing"}


def row(wl, chapter, name, tunables, t, status, floor_ms, torch_ms):
    ms = t.ms if t is not None else float("nan")
    return {
        "workload": wl.name, "chapter": chapter, "kernel": name,
        "tunables": " ".join(f"{k}={v}" for k, v in sorted(tunables.items())),
        "ms": ms, "p25": t.p25 if t else float("nan"), "p75": t.p75 if t else float("nan"),
        "gflops": wl.flops / (ms * 1e-3) / 1e9 if t else float("nan"),
        "gbs": wl.bytes / (ms * 1e-3) / 1e9 if t else float("nan"),
        "floor_fraction": floor_ms / ms if t else float("nan"),
        "speedup_vs_torch": torch_ms.get("torch default", float("nan")) / ms if t else float("nan"),
        "speedup_vs_tuned": torch_ms.get("torch tuned", float("nan")) / ms if t else float("nan"),
        "check": status,
    }


def time_torch(x, w, wl, tuned, reps):
    conv = lambda: torch.nn.functional.conv2d(x, w, stride=wl.stride, padding=wl.padding)  # noqa: E731
    saved = torch.backends.cudnn.benchmark
    try:
        torch.backends.cudnn.benchmark = tuned
        with strict_fp32():
            y = conv()
            return cl.bench(conv, reps=reps), y
    finally:
        torch.backends.cudnn.benchmark = saved


def bench_workload(wl, selected, reps, log):
    dev_is_gpu = cl.backend() == "cuda"
    bw, rate, _ = roof()
    floor_ms = 1e3 * max(wl.bytes / bw, wl.flops / rate)
    x = cl.randn(wl.B, wl.C, wl.H, wl.W)
    w = cl.randn(wl.M, wl.C, wl.K, wl.K)
    ref = reference(x, w, wl)
    y = torch.empty(wl.B, wl.M, wl.Ho, wl.Wo, dtype=torch.float32, device=x.device)
    rows, torch_ms, timed = [], {}, []
    for label, tuned in (("torch default", False), ("torch tuned", True)):
        t, yt = time_torch(x, w, wl, tuned, reps)
        torch_ms[label] = t.ms
        timed.append((label, t, check(yt, ref, x, w, wl, None, {})))
        del yt
    for label, t, status in timed:          # both torch times known: the speedup columns are complete
        rows.append(row(wl, 0, label, {}, t, status, floor_ms, torch_ms))
        log(rows[-1])
    for chapter, name, fn, tunables, applies in kernels():
        if selected and not any(s in name for s in selected):
            continue
        why = applies(wl)
        if why:
            continue
        fn, tun, picked = resolve(fn, tunables, wl)
        label = name if picked is None else f"{name}: {picked}"
        call = lambda: fn(x, w, y, stride=wl.stride, padding=wl.padding, **tun)  # noqa: E731
        try:
            y.fill_(float("nan"))
            call()
            cl.sync()
            status = check(y, ref, x, w, wl, fn, tun)
            t = cl.bench(call, reps=reps) if status == "ok" else None
        except (cl.ConvlabError, ValueError) as e:
            status, t = f"error: {type(e).__name__}: {str(e).splitlines()[0]}", None
        rows.append(row(wl, chapter, label, tun, t, status, floor_ms, torch_ms))
        log(rows[-1])
        if dev_is_gpu:
            torch.cuda.empty_cache()
    del x, w, y, ref
    return rows


# ---- the chapter 5 sweep ----------------------------------------------------------------------------

def sweep_configs(wl):
    """(kernel name, launcher, tunables): block size x coarsening for the chapter 5 kernels that can
    take the layer. Direct kernels: threads per block x output rows (and maps) per thread; the
    register-tiled GEMM: block tile x micro-tile."""
    out = []
    if fused.direct_fits(wl.M, wl.C, wl.K):
        for rows in (1, 2, 4, 8):
            if wl.M * wl.C * wl.K * wl.K * rows > 8192 or wl.M * rows > 64:
                continue            # code and registers past any sensible size
            for block in (128, 256):
                out.append(("direct, coarsened", fused.conv2d_direct_coarse, {"ROWS": rows, "BLOCK": block}))
    if wl.M <= 64 and fused.regtile_fits(wl.M, wl.C, wl.K):
        mts = sorted({-(-wl.M // 4) * 4, min(16, -(-wl.M // 4) * 4), min(8, -(-wl.M // 4) * 4),
                      -(-(-(-wl.M // 2)) // 4) * 4})
        for MT in mts:
            for rows in (1, 2, 3, 4, 6, 8, 16):
                if MT * rows > 128 or MT * rows < 16 or rows > wl.Ho:
                    continue
                for block in (64, 128, 256):
                    out.append(("direct, register-tiled", fused.conv2d_direct_regtile,
                                {"MT": MT, "ROWS": rows, "BLOCK": block}))
    if wl.M * wl.C * wl.K * wl.K > 2048 or wl.M >= 32:      # where a GEMM is in the running
        for BM, BN, TM, TN in ((32, 128, 4, 8), (64, 64, 8, 4), (64, 64, 8, 8), (64, 128, 8, 4), (64, 128, 8, 8),
                               (64, 256, 8, 8), (128, 64, 8, 8), (128, 128, 8, 8), (128, 128, 8, 4)):
            if BM > 2 * max(wl.M, 32):
                continue
            for BK in (8, 16):
                try:
                    fused.check_reg_tunables(BM, BN, BK, TM, TN)
                except ValueError:
                    continue
                out.append(("implicit GEMM, register-tiled", fused.conv2d_implicit_gemm_reg,
                            {"BM": BM, "BN": BN, "BK": BK, "TM": TM, "TN": TN}))
    return out


def sweep_workload(wl, selected, reps, log):
    bw, rate, _ = roof()
    floor_ms = 1e3 * max(wl.bytes / bw, wl.flops / rate)
    x = cl.randn(wl.B, wl.C, wl.H, wl.W)
    w = cl.randn(wl.M, wl.C, wl.K, wl.K)
    ref = reference(x, w, wl)
    y = torch.empty(wl.B, wl.M, wl.Ho, wl.Wo, dtype=torch.float32, device=x.device)
    t, _ = time_torch(x, w, wl, False, reps)
    torch_ms = {"torch default": t.ms}
    t, _ = time_torch(x, w, wl, True, reps)
    torch_ms["torch tuned"] = t.ms
    rows = []
    configs = [c for c in sweep_configs(wl) if not selected or any(k in c[0] for k in selected)]
    for i, (name, fn, tun) in enumerate(configs):
        call = lambda: fn(x, w, y, stride=wl.stride, padding=wl.padding, **tun)  # noqa: E731
        try:
            y.fill_(float("nan"))
            call()
            cl.sync()
            status = check(y, ref, x, w, wl, fn, tun)
            t = cl.bench(call, reps=reps) if status == "ok" else None
        except (cl.ConvlabError, ValueError) as e:
            status, t = f"error: {type(e).__name__}: {str(e).splitlines()[0]}", None
        r = row(wl, 5, "sweep: " + name, tun, t, status, floor_ms, torch_ms)
        rows.append(r)
        log(r, progress=f"[{i + 1}/{len(configs)}]")
    return rows


# ---- output -----------------------------------------------------------------------------------------

HEADER = f"{'workload':10s} {'ch':>2s} {'kernel':52s} {'ms':>9s} {'GFLOP/s':>9s} {'GB/s':>8s} {'floor':>6s} {'vs torch':>8s} {'vs tuned':>8s}  check"


def fmt(r):
    def f(v, spec):
        return format(v, spec) if isinstance(v, float) and not math.isnan(v) else "-"
    name = r["kernel"] + (f" [{r['tunables']}]" if r["tunables"] and r["kernel"].startswith("sweep") else "")
    return (f"{r['workload']:10s} {r['chapter']:>2d} {name[:52]:52s} {f(r['ms'], '9.4f')} {f(r['gflops'], '9.0f')} "
            f"{f(r['gbs'], '8.0f')} {f(r['floor_fraction'], '6.1%')} {f(r['speedup_vs_torch'], '7.2f')}x "
            f"{f(r['speedup_vs_tuned'], '7.2f')}x  {r['check']}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default="", help="comma-separated names (default: the five 2D layers)")
    ap.add_argument("--kernels", default="", help="comma-separated substrings of kernel names to keep")
    ap.add_argument("--sweep", action="store_true", help="chapter 5's block size x coarsening sweep instead")
    ap.add_argument("--reps", type=int, default=None, help="timed runs per kernel (GPU default 20, emulator 1)")
    ap.add_argument("--csv", default=None, help="where to write the CSV (default: benchmarks/results/...)")
    ap.add_argument("--full", action="store_true", help="on the emulator too, the full sizes (very slow)")
    args = ap.parse_args(argv)

    dev = cl.device()
    on_gpu = dev.backend == "cuda"
    reps = args.reps or (20 if on_gpu else 1)
    names = [n for n in args.workloads.split(",") if n]
    wls = [w for w in WORKLOADS_2D if not names or w.name in names]
    if not on_gpu and not args.full:
        wls = [w.small() for w in wls]
    selected = [s for s in args.kernels.split(",") if s]
    m = meta()
    print(f"# {dev}")
    print(f"# torch {m['torch']}, cuDNN {m['cudnn']}, TF32 off, {m['date']}; roofline: {roof()[2]}")
    if not on_gpu:
        print("# EMULATOR: small shapes, wall times of a CPU emulator: these are checks, NOT GPU timings")
    print(HEADER)

    def log(r, progress=""):
        print(fmt(r) + (f"  {progress}" if progress else ""), flush=True)

    rows = []
    for wl in wls:
        t0 = time.time()
        rows += sweep_workload(wl, selected, reps, log) if args.sweep else bench_workload(wl, selected, reps, log)
        print(f"# {wl.name}: {time.time() - t0:.0f} s", flush=True)

    save_rows(rows, m, "conv2d_forward" + ("_sweep" if args.sweep else ""), args.csv, on_gpu)
    return report_failures(rows, fmt)


if __name__ == "__main__":
    sys.exit(main())
