#!/usr/bin/env python3
"""Time chapter 6 (FP16: half, half2, WMMA) and chapter 7 (3D convolution) against torch.

    python benchmarks/conv_fp16_3d.py                         # lenet_c3 + resnet in fp16, conv3d
    python benchmarks/conv_fp16_3d.py --workloads resnet,conv3d --kernels wmma,coarse
    python benchmarks/conv_fp16_3d.py --sweep                 # tile / coarsening sweeps
    CONVLAB_BACKEND=emu python benchmarks/conv_fp16_3d.py     # emulator: small shapes, checks only

On a GPU, every kernel is first checked against an fp64 reference computed on the GPU (fp16: the
bound convlab.ops.fp16.fp16_tolerance derives from the precision and C·K²; 3D: the LeetGPU
challenge's rtol = atol = 1e-5), then timed with cl.bench (CUDA events, warm-up, L2 flushed
before each call, median of 20):

- fp16 layers (half inputs and output, NCHW): next to torch.nn.functional.conv2d on the same half
  tensors (cuDNN) at its defaults, tuned (cudnn.benchmark=True), and tuned with channels_last
  inputs (cuDNN's preferred layout; the layout change itself not timed); torch fp32 (TF32 off) as
  context. The conversions (float32 -> half input, half -> float32 output) are timed on their own,
  and the whole float32 -> float32 path (to_half + the picked kernel + to_float) against torch's
  x.half() -> conv2d -> .float(). The fp16 tensor-core rate is measured (torch.matmul in half on
  8192² matrices) and every row reports TFLOP/s and the fraction of that rate.
- conv3d (256×128×128, 5×5×5, fp32): next to torch conv3d at its defaults and tuned, TF32 off.

Every row: ms, GFLOP/s, GB/s (the least traffic: input, mask and output once, in the kernel's
dtype), the fraction of the roofline floor (floor / time; fp16 floor: half bytes at the copy
bandwidth or the FLOPs at the measured fp16 tensor rate; fp32: bytes at the copy bandwidth or
FLOPs at the fp32 GEMM rate), and the speedups over torch. The CSV carries the GPU's name, torch
and cuDNN versions, the TF32 setting, the measured rates and the date on every row.

On the emulator the same code runs at small sizes (each workload's small() twin), so the script
checks itself and every kernel; the times it prints are CPU wall times of an emulator, NOT GPU
timings, and the CSV (in .convlab-cache/) says so.
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
from convlab import roofline, workloads  # noqa: E402
from convlab.baselines import cudnn_benchmark, strict_fp32, versions  # noqa: E402
from convlab.ops import conv3d, fp16  # noqa: E402

FP16_WORKLOADS = ["lenet_c3", "resnet"]
DEFAULT_WORKLOADS = FP16_WORKLOADS + ["conv3d"]


# ---- rates --------------------------------------------------------------------------------------------

_tc_rate = None


def tensor_core_rate(n: int = 8192) -> float:
    """FLOP/s of torch.matmul in half on n×n matrices (cuBLAS on the tensor cores): the fp16 rate the
    WMMA kernels are measured against. On the emulator: None."""
    global _tc_rate
    if cl.backend() != "cuda":
        return float("nan")
    if _tc_rate is None:
        a = torch.randn(n, n, device="cuda", dtype=torch.float16)
        b = torch.randn(n, n, device="cuda", dtype=torch.float16)
        c = torch.empty_like(a)
        t = cl.bench(lambda: torch.matmul(a, b, out=c), reps=10, warmup=3)
        _tc_rate = 2 * n ** 3 / (t.ms * 1e-3)
        del a, b, c
        torch.cuda.empty_cache()
    return _tc_rate


def roof():
    r = roofline.current()
    return r


def floor_ms(flops, nbytes, half: bool):
    r = roof()
    rate = tensor_core_rate() if half and cl.backend() == "cuda" else r.flop_rate
    if half and cl.backend() != "cuda":
        rate = 989e12 * 0.8     # napkin number for the emulator's self-check only (not printed as a result)
    return 1e3 * max(nbytes / r.bandwidth, flops / rate)


# ---- checking on the device ---------------------------------------------------------------------------

def reference2d(x, w, wl):
    if cl.backend() == "cuda":
        return F.conv2d(x.double(), w.double(), stride=wl.stride, padding=wl.padding)
    return cl.ref.conv2d(x, w, stride=wl.stride, padding=wl.padding)


def reference3d(x, w):
    if cl.backend() == "cuda":
        return F.conv3d(x.double()[None, None], w.double()[None, None])[0, 0]
    return cl.ref.conv3d(x, w)


def check(y, ref, rtol, atol_rms=None, atol=None):
    """|y - ref| <= atol + rtol·|ref| everywhere (atol = atol_rms·RMS(ref) when given), evaluated on
    the device in chunks; on a failure cl.check on the first bad slice gives the details."""
    ref = ref.to(y.device)
    rms = float(ref.pow(2).mean().sqrt())
    atol = atol if atol is not None else atol_rms * rms
    step = max(1, (1 << 26) // max(1, ref[0].numel()))
    for b0 in range(0, ref.shape[0], step):
        yr, rr = y[b0:b0 + step].double(), ref[b0:b0 + step]
        ok = (yr - rr).abs() <= atol + rtol * rr.abs()
        if not bool(ok.all()):
            bad = b0 + int((~ok).flatten(1).any(1).nonzero()[0]) if ok.dim() > 1 else b0
            r = cl.check(y[bad:bad + 1], ref[bad:bad + 1], rtol=rtol, atol=atol, name=f"y[{bad}]", raise_on_error=False)
            return f"FAIL: {r}"
    return "ok"


# ---- rows -----------------------------------------------------------------------------------------------

def meta():
    v = versions()
    dev = cl.device()
    r = roof()
    tc = tensor_core_rate()
    return {"backend": dev.backend, "gpu": dev.name if dev.backend == "cuda" else "CPU emulator",
            "torch": v["torch"], "cudnn": v["cudnn"], "tf32": "off", "date": dt.date.today().isoformat(),
            "bandwidth_tbs": r.bandwidth / 1e12, "fp32_tflops": r.flop_rate / 1e12,
            "fp16_tc_tflops": tc / 1e12 if not math.isnan(tc) else float("nan"),
            "timing": "GPU: CUDA events, L2 flushed, median" if dev.backend == "cuda"
            else "emulator wall time, NOT a GPU timing"}


def make_row(wl, chapter, dtype, name, tunables, t, status, flops, nbytes, floor, base):
    ms = t.ms if t is not None else float("nan")
    ok = t is not None
    tc = tensor_core_rate()
    return {
        "workload": wl.name, "chapter": chapter, "dtype": dtype, "kernel": name,
        "tunables": " ".join(f"{k}={v}" for k, v in sorted(tunables.items())),
        "ms": ms, "p25": t.p25 if ok else float("nan"), "p75": t.p75 if ok else float("nan"),
        "gflops": flops / (ms * 1e-3) / 1e9 if ok else float("nan"),
        "gbs": nbytes / (ms * 1e-3) / 1e9 if ok else float("nan"),
        "floor_ms": floor,
        "floor_fraction": floor / ms if ok else float("nan"),
        "tc_fraction": (flops / (ms * 1e-3)) / tc if ok and dtype == "fp16" and not math.isnan(tc) else float("nan"),
        "speedup_vs_torch": base.get("default", float("nan")) / ms if ok else float("nan"),
        "speedup_vs_tuned": base.get("tuned", float("nan")) / ms if ok else float("nan"),
        "check": status,
    }


def timed(call, reps):
    try:
        call()
        cl.sync()
        return cl.bench(call, reps=reps), None
    except (cl.ConvlabError, ValueError, RuntimeError) as e:
        return None, f"error: {type(e).__name__}: {str(e).splitlines()[0]}"


# ---- fp16 layers ---------------------------------------------------------------------------------------

def fp16_kernels(wl):
    """(name, launcher, tunables, accumulate, applies -> reason or None)."""
    C, M, H, W, K, s, p = wl.C, wl.M, wl.H, wl.W, wl.K, wl.stride, wl.padding
    direct = None if fp16.direct_fits(M, C, K) else "mask slice over 48 KB"
    smallc = None if fp16.smallc_fits(C, K, H, W, p, s) else "more than 8 channels or stride > 1"
    return [
        ("half (direct, register-tiled)", fp16.conv2d_half, {}, "half", direct),
        ("half2 (direct, register-tiled)", fp16.conv2d_half2, {}, "half", direct),
        ("WMMA implicit GEMM", fp16.conv2d_wmma, {}, "float", None),
        ("WMMA, few channels (no im2col)", fp16.conv2d_wmma_smallc, {}, "float", smallc),
        ("best (pick)", None, {}, "float", None),
    ]


def fp16_sweep(wl):
    """About 25 configurations per layer (each one an nvcc compile on the GPU): half2 micro-tiles,
    WMMA block tiles, the few-channel kernel's warps and bands."""
    out = []
    C, M, K = wl.C, wl.M, wl.K
    Ho = (wl.H + 2 * wl.padding - K) // wl.stride + 1
    if fp16.direct_fits(M, C, K):
        base = fp16.direct_config(M, C, K, Ho)
        for MT in sorted({base["MT"], min(base["MT"], 8), -(-min(M, 32) // 8) * 8}):
            if not fp16.direct_fits(M, C, K, MT):
                continue
            for rows in (1, 2, 4, 8):
                if MT * rows <= 128 and rows <= Ho:
                    out.append(("sweep: half2", fp16.conv2d_half2, {"MT": MT, "ROWS": rows, "BLOCK": 128}, "half"))
        for block in (64, 256):
            out.append(("sweep: half2", fp16.conv2d_half2, {**base, "BLOCK": block}, "half"))
    for BM, BN, BK, WM, WN in ((16, 128, 32, 1, 2), (16, 256, 32, 1, 4), (32, 128, 32, 2, 2), (64, 64, 32, 2, 2),
                               (64, 128, 32, 2, 2), (64, 128, 16, 2, 2), (64, 256, 32, 2, 4),
                               (64, 128, 32, 4, 2), (128, 128, 32, 2, 4), (64, 64, 64, 2, 1)):
        if BM > max(16, 2 * M):
            continue
        try:
            fp16.check_wmma_tunables(BM, BN, BK, WM, WN)
        except ValueError:
            continue
        out.append(("sweep: WMMA implicit GEMM", fp16.conv2d_wmma,
                    {"BM": BM, "BN": BN, "BK": BK, "WARPS_M": WM, "WARPS_N": WN}, "float"))
    if fp16.smallc_fits(C, K, wl.H, wl.W, wl.padding, wl.stride):
        for warps in (1, 2, 4):
            cfg = fp16.smallc_config(C, K, wl.H, wl.W, wl.padding, warps)
            if cfg:
                out.append(("sweep: WMMA few channels", fp16.conv2d_wmma_smallc, {"WARPS": warps}, "float"))
                if cfg["BAND"] >= Ho and Ho > 8:
                    out.append(("sweep: WMMA few channels", fp16.conv2d_wmma_smallc,
                                {"WARPS": warps, "BAND": -(-Ho // 2)}, "float"))
    return out


def bench_fp16(wl, selected, reps, log, sweep=False):
    B, C, M, H, W, K, s, p = wl.B, wl.C, wl.M, wl.H, wl.W, wl.K, wl.stride, wl.padding
    flops = wl.flops
    hbytes = wl.bytes // 2                    # the same elements in half
    floor = floor_ms(flops, hbytes, half=True)
    x, w = cl.randn(B, C, H, W), cl.randn(M, C, K, K)
    xh, wh = fp16.to_half(x), fp16.to_half(w)
    ref = reference2d(x, w, wl)
    y = cl.empty(B, M, wl.Ho, wl.Wo, dtype=torch.float16)
    rows, base = [], {}

    def add(name, tunables, t, status, dtype="fp16", fl=flops, nb=hbytes, fmin=floor, chapter=6):
        rows.append(make_row(wl, chapter, dtype, name, tunables, t, status, fl, nb, fmin, base))
        log(rows[-1])

    # torch in half (cuDNN): default, tuned, tuned with channels_last
    conv = lambda a, b: F.conv2d(a, b, stride=s, padding=p)  # noqa: E731
    torch_rows = []
    for label, tuned, cl_last in (("torch fp16 default", False, False), ("torch fp16 tuned", True, False),
                                  ("torch fp16 tuned, channels_last", True, True)):
        if cl.backend() != "cuda" and cl_last:
            continue
        a = xh.to(memory_format=torch.channels_last) if cl_last else xh
        bw = wh.to(memory_format=torch.channels_last) if cl_last else wh
        with strict_fp32(), cudnn_benchmark(tuned):
            t, err = timed(lambda: conv(a, bw), reps)
            yt = conv(a, bw).contiguous() if err is None else None
        # cuDNN may use Winograd or other algorithms: checked with the looser half-sum bound
        status = err or fp16_status(yt, ref, C, K, "half")
        if label == "torch fp16 default" and t is not None:
            base["default"] = t.ms
        if label == "torch fp16 tuned" and t is not None:
            base["tuned"] = t.ms
        torch_rows.append((label, t, status))
        del yt
    for label, t, status in torch_rows:
        add(label, {}, t, status, chapter=0)
    # context: torch in float32, TF32 off
    with strict_fp32(), cudnn_benchmark(True):
        t, err = timed(lambda: conv(x, w), reps)
    add("torch fp32 tuned (TF32 off)", {}, t, err or "ok (not checked)", dtype="fp32", nb=wl.bytes,
        fmin=floor_ms(flops, wl.bytes, half=False), chapter=0)

    configs = [(n, f, t, a, why) for n, f, t, a, why in fp16_kernels(wl)]
    if sweep:
        configs = [(n, f, t, a, None) for n, f, t, a in fp16_sweep(wl)]
    for i, (name, fn, tun, acc, why) in enumerate(configs):
        if selected and not any(k.lower() in name.lower() for k in selected):
            continue
        if why:
            continue
        if fn is None:
            best = fp16.pick(wl)
            fn, tun, name = best.launcher, best.config(wl), f"best (pick): {best.name}"
        call = lambda: fn(xh, wh, y, stride=s, padding=p, **tun)  # noqa: E731
        y.fill_(float("nan"))
        t, err = timed(call, reps)
        status = err or fp16_status(y, ref, C, K, acc)
        if status != "ok":
            t = None
        add(name, tun, t, status)
        if cl.backend() == "cuda":
            torch.cuda.empty_cache()

    if not sweep and not selected:
        # the conversions, on their own, and the whole float32 -> float32 path
        t, err = timed(lambda: fp16.to_half(x, xh), reps)
        add("conversion: x float32 -> half", {}, t, err or "ok", fl=0, nb=x.numel() * 6,
            fmin=1e3 * x.numel() * 6 / roof().bandwidth)
        y32 = cl.empty(B, M, wl.Ho, wl.Wo)
        t, err = timed(lambda: fp16.to_float(y, y32), reps)
        add("conversion: y half -> float32", {}, t, err or "ok", fl=0, nb=y.numel() * 6,
            fmin=1e3 * y.numel() * 6 / roof().bandwidth)
        e2e_bytes = wl.bytes                                     # float32 in and out
        e2e_floor = floor_ms(flops, e2e_bytes, half=True)
        with strict_fp32(), cudnn_benchmark(True):
            t, err = timed(lambda: conv(x.half(), w.half()).float(), reps)
        t_torch_e2e = t
        add("torch: x.half() -> conv2d (tuned) -> .float()", {}, t, err or "ok (not checked)", nb=e2e_bytes,
            fmin=e2e_floor, chapter=0)
        y32.fill_(float("nan"))
        t, err = timed(lambda: fp16.conv2d_fp16(x, w, y32, stride=s, padding=p), reps)
        status = err or fp16_status(y32, ref, C, K, "float")
        add("ours: to_half -> best -> to_float", {}, t if status == "ok" else None, status, nb=e2e_bytes,
            fmin=e2e_floor)
        if t is not None and t_torch_e2e is not None:
            rows[-1]["speedup_vs_tuned"] = t_torch_e2e.ms / t.ms
        del y32
    del x, w, xh, wh, ref, y
    return rows


def fp16_status(y, ref, C, K, accumulate):
    rtol, atol_rms = fp16.fp16_tolerance(C, K, accumulate)
    return check(y, ref, rtol, atol_rms=atol_rms)


# ---- conv3d ------------------------------------------------------------------------------------------

def conv3d_sweep(wl):
    """About 30 configurations (each an nvcc compile on the GPU): the coarsened kernel's block height,
    coarsening factor and mask placement at TX=4 (the warp covers 128 columns), then TY=2, TX=2 and
    TX=1; and the tiled kernel's box."""
    K, out = wl.K, []
    Do = wl.Do
    cands = [(4, 1, by, zc, regs) for by in (2, 4, 8) for zc in (16, 32, -(-Do // 4)) for regs in (0, 1)]
    cands += [(4, 2, by, zc, 1) for by in (2, 4) for zc in (16, 32)]
    cands += [(2, 1, 4, zc, regs) for zc in (16, 32) for regs in (0, 1)]
    cands += [(1, 1, 4, 32, regs) for regs in (0, 1)]
    seen = set()
    for TX, TY, BY, ZC, regs in cands:
        ZC = max(1, min(ZC, Do))
        key = (TX, TY, BY, ZC, regs)
        if key in seen:
            continue
        seen.add(key)
        try:
            conv3d.check_coarse_tunables(TX, TY, BY, ZC, K, K, K, regs)
        except ValueError:
            continue
        out.append(("sweep: coarse", conv3d.conv3d_coarse, {"TX": TX, "TY": TY, "BY": BY, "ZC": ZC, "MASK_REGS": regs}))
    for TX, TY, TZ in ((32, 4, 4), (32, 8, 2), (32, 4, 8), (16, 8, 4)):
        out.append(("sweep: tiled", conv3d.conv3d_tiled, {"TX": TX, "TY": TY, "TZ": TZ}))
    return out


def bench_conv3d(wl, selected, reps, log, sweep=False):
    flops, nbytes = wl.flops, wl.bytes
    floor = floor_ms(flops, nbytes, half=False)
    x, w = cl.randn(wl.D, wl.H, wl.W), cl.randn(wl.K, wl.K, wl.K)
    ref = reference3d(x, w)
    y = cl.empty(wl.Do, wl.Ho, wl.Wo)
    rows, base = [], {}

    def add(name, tunables, t, status, chapter=7):
        rows.append(make_row(wl, chapter, "fp32", name, tunables, t, status, flops, nbytes, floor, base))
        log(rows[-1])

    x5, w5 = x[None, None], w[None, None]
    torch_rows = []
    for label, tuned in (("torch default", False), ("torch tuned", True)):
        with strict_fp32(), cudnn_benchmark(tuned):
            t, err = timed(lambda: F.conv3d(x5, w5), reps)
            status = err or check(F.conv3d(x5, w5)[0, 0], ref, 1e-5, atol=1e-5)
        base["default" if not tuned else "tuned"] = t.ms if t is not None else float("nan")
        torch_rows.append((label, t, status))
    for label, t, status in torch_rows:
        add(label, {}, t, status, chapter=0)

    if sweep:
        configs = conv3d_sweep(wl)
    else:
        configs = [(impl.name, impl.launcher, {}) for impl in conv3d.IMPLEMENTATIONS] + [("best (pick)", None, {})]
    for name, fn, tun in configs:
        if selected and not any(k.lower() in name.lower() for k in selected):
            continue
        if fn is None:
            best = conv3d.pick(wl)
            fn, tun, name = best.launcher, best.config(wl), f"best (pick): {best.name}"
        y.fill_(float("nan"))
        t, err = timed(lambda: fn(x, w, y, **tun), reps)
        status = err or check(y, ref, 1e-5, atol=1e-5)
        add(name, tun, t if status == "ok" else None, status)
    del x, w, y, ref
    return rows


# ---- output -------------------------------------------------------------------------------------------

HEADER = (f"{'workload':15s} {'ch':>2s} {'kernel':48s} {'ms':>9s} {'TFLOP/s':>8s} {'GB/s':>7s} {'floor':>6s} "
          f"{'of TC':>6s} {'vs torch':>8s} {'vs tuned':>8s}  check")


def fmt(r):
    def f(v, spec):
        return format(v, spec) if isinstance(v, float) and not math.isnan(v) else "-"
    name = r["kernel"] + (f" [{r['tunables']}]" if r["tunables"] and r["kernel"].startswith("sweep") else "")
    return (f"{r['workload']:15s} {r['chapter']:>2d} {name[:48]:48s} {f(r['ms'], '9.4f')} "
            f"{f(r['gflops'] / 1e3, '8.2f')} {f(r['gbs'], '7.0f')} {f(r['floor_fraction'], '6.1%')} "
            f"{f(r['tc_fraction'], '6.1%')} {f(r['speedup_vs_torch'], '7.2f')}x {f(r['speedup_vs_tuned'], '7.2f')}x  "
            f"{r['check']}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default="", help=f"comma-separated names (default: {','.join(DEFAULT_WORKLOADS)})")
    ap.add_argument("--kernels", default="", help="comma-separated substrings of kernel names to keep")
    ap.add_argument("--sweep", action="store_true", help="the tile / coarsening sweeps instead")
    ap.add_argument("--reps", type=int, default=None, help="timed runs per kernel (GPU default 20, emulator 1)")
    ap.add_argument("--csv", default=None, help="where to write the CSV (default: benchmarks/results/...)")
    ap.add_argument("--full", action="store_true", help="on the emulator too, the full sizes (very slow)")
    args = ap.parse_args(argv)

    dev = cl.device()
    on_gpu = dev.backend == "cuda"
    reps = args.reps or (20 if on_gpu else 1)
    names = [n for n in args.workloads.split(",") if n] or DEFAULT_WORKLOADS
    wls = [workloads.get(n) for n in names]
    if not on_gpu and not args.full:
        wls = [w.small() for w in wls]
    selected = [s for s in args.kernels.split(",") if s]
    m = meta()
    print(f"# {dev}")
    print(f"# torch {m['torch']}, cuDNN {m['cudnn']}, TF32 off, {m['date']}; roofline: {roof()}")
    if on_gpu:
        print(f"# fp16 tensor-core rate (torch.matmul, half, 8192²): {m['fp16_tc_tflops']:.0f} TFLOP/s")
    else:
        print("# EMULATOR: small shapes, wall times of a CPU emulator: these are checks, NOT GPU timings")
    print(HEADER)

    def log(r):
        print(fmt(r), flush=True)

    rows = []
    for wl in wls:
        t0 = time.time()
        if wl.dims == 3:
            rows += bench_conv3d(wl, selected, reps, log, args.sweep)
        else:
            rows += bench_fp16(wl, selected, reps, log, args.sweep)
        print(f"# {wl.name}: {time.time() - t0:.0f} s", flush=True)
        if on_gpu:
            torch.cuda.empty_cache()

    save_rows(rows, m, "conv_fp16_3d" + ("_sweep" if args.sweep else ""), args.csv, on_gpu)
    return report_failures(rows, fmt)


if __name__ == "__main__":
    sys.exit(main())
