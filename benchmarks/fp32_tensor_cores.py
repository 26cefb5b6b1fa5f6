#!/usr/bin/env python3
"""fp32 convolution on the tensor cores (chapter 12): the five shapes of GPU MODE's conv2d_v2
leaderboard (gpu-mode/reference-kernels, problems/pmpp_v2/conv2d_py: float32 NCHW, stride 1, no
padding, C maps of C channels, its inputs from its seeds) and the course's plain float32 layers of
64 channels or more, each at

  fp32         the drop-in's float32 forward by default (dispatch's fp32 rule: the CUDA cores)
  tf32         the drop-in with precision="tf32" (convlab.ops.tf32: wgmma on an H100/H200)
  3xtf32       the drop-in with precision="3xtf32"
  cudnn fp32   torch.nn.functional.conv2d, TF32 off
  cudnn tf32   torch.nn.functional.conv2d, TF32 on

torch's rows: cudnn.benchmark on, NCHW and channels_last x, the faster kept and its kernels named
(torch's profiler); measured in this process, before ours on the same inputs. Time: CUDA events,
the median of --reps calls (L2 flushed, the GPU held busy while Python queues: cl.bench.time_gpu),
and the time a caller sees (cl.bench.time_caller); TFLOP/s from the GPU time. Error: the largest
|y - ref| over the outputs, ref the convolution of the same float32 inputs in float64 on the GPU
(torch, a few maps at a time), also divided by the largest |ref| and by RMS(ref).

    source .gpu/setup.sh
    python benchmarks/fp32_tensor_cores.py --out $OUT          # every shape (a few minutes on an H200)
    python benchmarks/fp32_tensor_cores.py --shapes board_k32_256
    CONVLAB_BACKEND=emu python benchmarks/fp32_tensor_cores.py --shapes board_k8_128   # small twins, checks only

Printed: per shape and contender, ms, caller ms, TFLOP/s, max error, the kernel; then cuDNN fp32 /
3xTF32 per shape, its geometric mean over the course's layers, and the ranked shape's 3xTF32 time
and error against cuDNN fp32's. On a GPU the rows go to <out>/fp32_tensor_cores_<GPU>.csv (default
benchmarks/results).
"""
from __future__ import annotations

import argparse
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
from convlab.measuring import results, workloads  # noqa: E402
from convlab.measuring.bench import (time_caller, time_gpu)  # noqa: E402  (convlab.measuring.bench, the name, is cl.bench)
from convlab.measuring.workloads import Workload  # noqa: E402
from convlab.ops import dispatch, dropin  # noqa: E402
from convlab.ops.tf32 import check_tf32  # noqa: E402

#: conv2d_v2's benchmarks, in its order (size, kernel size, channels, batch, seed); the last one ranked
BOARD_SPECS = [(128, 8, 64, 4, 54352), (128, 16, 64, 4, 93246), (256, 16, 128, 2, 6256), (256, 16, 128, 2, 8841),
               (256, 32, 128, 1, 6252)]
RANKED = "board_k32_256"
OURS = ("fp32", "tf32", "3xtf32")
TORCH = ("cudnn fp32", "cudnn tf32")
REF_MAPS = 16              # maps per float64 launch: bounds cuDNN's workspace


def board() -> list[tuple[Workload, int]]:
    """(the shape, its seed); the two benchmarks of one shape are told apart by their seed."""
    out = []
    for i, (size, k, c, b, seed) in enumerate(BOARD_SPECS):
        name = f"board_k{k}_{size}" + ("_b" if BOARD_SPECS[i - 1][:4] == (size, k, c, b) and i else "")
        out.append((Workload(name, B=b, C=c, M=c, H=size, W=size, K=k, note=f"conv2d_v2, seed {seed}"), seed))
    return out


def course() -> list[Workload]:
    """The course's plain layers of at least 64 channels and maps (workloads: the design's table and
    the GEMM layers), each once."""
    seen = {}
    for w in [*workloads.WORKLOADS_2D, *workloads.GEMM_LAYERS]:
        if w.plain and w.C >= 64 and w.M >= 64:
            seen.setdefault(w.name, w)
    return list(seen.values())


def twin(wl: Workload) -> Workload:
    """The shape run here: itself on a GPU; on the emulator a small one of the same character."""
    if cl.backend() == "cuda":
        return wl
    if wl.name.startswith("board"):
        return Workload(wl.name + "_small", B=1, C=8, M=8, H=10, W=11, K=min(wl.K, 4))
    return wl.small()


def inputs(wl: Workload, seed: int):
    """x, w as conv2d_v2 makes them (randn from a generator seeded on the device), float32 NCHW."""
    dev = cl.device().torch_device
    gen = torch.Generator(device=dev)
    gen.manual_seed(seed)
    x = torch.randn(wl.B, wl.C, wl.H, wl.W, device=dev, dtype=torch.float32, generator=gen)
    w = torch.randn(wl.M, wl.C, wl.K, wl.K, device=dev, dtype=torch.float32, generator=gen)
    return x, w


def reference(x, w, padding: int):
    """conv2d of the float32 inputs in float64, REF_MAPS maps a launch (on the GPU: cuDNN's float64)."""
    xd = x.double()
    return torch.cat([F.conv2d(xd, w[m:m + REF_MAPS].double(), padding=padding)
                      for m in range(0, w.shape[0], REF_MAPS)], dim=1)


def kernels(fn) -> str:
    """The CUDA kernels one call of fn launches (torch's profiler), joined by ' + '."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA], acc_events=True) as prof:
        fn()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return " + ".join(dict.fromkeys(n for n in names if not n.startswith(("Memcpy", "Memset"))))


def contenders(x, w, padding: int) -> dict:
    """name -> (f() -> y, the kernel's label, the Impl or None, cuDNN's TF32 flag): ours through the
    drop-in at each precision; torch's, TF32 off and on, in the layout (NCHW or channels_last) that
    cudnn.benchmark found faster."""
    out = {}
    for p in OURS:
        impl = dispatch.forward_impl(x, w, padding=padding, precision=p)
        out[p] = ((lambda p=p: dropin.conv2d(x, w, padding=padding, precision=p)), impl.name, impl, False)
    if cl.backend() != "cuda":
        return out
    xl = x.contiguous(memory_format=torch.channels_last)
    wl = w.contiguous(memory_format=torch.channels_last)
    for name, tf32 in zip(TORCH, (False, True)):
        best = None
        with cudnn(tf32):
            for xx, ww in ((x, w), (xl, wl)):
                def f(xx=xx, ww=ww):
                    return F.conv2d(xx, ww, padding=padding)
                t = time_gpu(f, reps=3, warmup=2)
                if best is None or t.ms < best[0]:
                    best = (t.ms, f)
            out[name] = (best[1], kernels(best[1]), None, tf32)
    return out


def cudnn(tf32: bool):
    """cuDNN with cudnn.benchmark on and its TF32 flag as given, through its flags() context (which
    also works where torch's test helpers have frozen the global flags)."""
    c = torch.backends.cudnn
    return c.flags(enabled=c.enabled, benchmark=True, deterministic=c.deterministic, allow_tf32=tf32)


def measure_shape(wl: Workload, seed: int, reps: int) -> list[dict]:
    s = twin(wl)
    x, w = inputs(s, seed)
    t0 = time.perf_counter()
    ref = reference(x, w, s.padding)
    ref_s = time.perf_counter() - t0
    rmax, rrms = ref.abs().max().item(), ref.pow(2).mean().sqrt().item()
    rows = []
    for name, (f, label, impl, tf32) in contenders(x, w, s.padding).items():
        with cudnn(tf32):
            y = f()
            err = (y.double() - ref).abs()
            emax = err.max().item()
            # within the bound derived for the kernel (tf32.check_tf32; fp32's default for the rest)
            if impl is not None and any(impl.key in keys for keys in dispatch.TENSOR_CORE_FP32.values()):
                ok = check_tf32(y, ref, s, impl, raise_on_error=False)
            else:
                ok = cl.check(y, ref, raise_on_error=False)
            row = dict(workload=s.name, shape=s.shape_text, B=s.B, C=s.C, M=s.M, H=s.H, W=s.W, K=s.K,
                       padding=s.padding, seed=seed, flops=s.flops, contender=name, kernel=label, max_err=emax, max_err_rel=emax / rmax,
                       max_err_rms=emax / rrms, rms_err=err.pow(2).mean().sqrt().item() / rrms,
                       within_bound=not isinstance(ok, Exception), ref_s=ref_s, gpu=cl.device().name)
            if cl.backend() == "cuda":
                g, c = time_gpu(f, reps=reps), time_caller(f, reps=reps)
                row.update(ms=g.ms, p25=g.p25, p75=g.p75, caller_ms=c.ms, tflops=s.flops / g.ms / 1e9)
            rows.append(row)
            del y, err
    return rows


def report(df) -> list[str]:
    """Per shape and contender, then the ratios the targets name."""
    out = [f"{'shape':22s} {'contender':11s} {'ms':>9s} {'caller':>9s} {'TFLOP/s':>8s} {'max err':>10s} "
           f"{'/max|ref|':>10s} {'bound':>5s}  kernel"]
    for _, r in df.iterrows():
        out.append(f"{r['workload']:22s} {r['contender']:11s} {r['ms']:9.3f} {r['caller_ms']:9.3f} {r['tflops']:8.1f} "
                   f"{r['max_err']:10.3g} {r['max_err_rel']:10.3g} {'ok' if r['within_bound'] else 'OVER':>5s}  "
                   f"{str(r['kernel'])[:70]}")
    by = {(r["workload"], r["contender"]): r for _, r in df.iterrows()}
    ratios = []
    names = [w.name for w in course()]
    for shape in dict.fromkeys(df["workload"]):
        a, b = by[(shape, "cudnn fp32")], by[(shape, "3xtf32")]
        out.append(f"# {shape}: cuDNN fp32 / 3xTF32 {a['ms'] / b['ms']:.2f}x, max error {b['max_err']:.3g} against "
                   f"cuDNN fp32's {a['max_err']:.3g} ({'no larger' if b['max_err'] <= a['max_err'] else 'larger'})")
        if shape in names:
            ratios.append(a["ms"] / b["ms"])
    if ratios:
        out.append(f"# course layers of 64+ channels: cuDNN fp32 / 3xTF32, geometric mean "
                   f"{math.exp(sum(map(math.log, ratios)) / len(ratios)):.2f}x over {len(ratios)} layers")
    if (RANKED, "3xtf32") in by:
        r, c = by[(RANKED, "3xtf32")], by[(RANKED, "cudnn fp32")]
        out.append(f"# ranked conv2d_v2 shape: 3xTF32 {r['ms']:.2f} ms ({r['tflops']:.1f} TFLOP/s), max error "
                   f"{r['max_err']:.3g}; cuDNN fp32 {c['ms']:.2f} ms, max error {c['max_err']:.3g}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="", help="comma-separated shape names (default: every board and course shape)")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", default=None, help="folder for the CSV (default benchmarks/results)")
    args = ap.parse_args(argv)
    import pandas as pd

    print(f"# {cl.device()}")
    want = {n for n in args.shapes.split(",") if n}
    shapes = [(w, s) for w, s in board() if not want or w.name in want]
    shapes += [(w, 1000 + i) for i, w in enumerate(course()) if not want or w.name in want]
    unknown = want - {w.name for w, _ in shapes}
    if unknown:
        raise SystemExit(f"unknown shapes {sorted(unknown)}; known: {', '.join(w.name for w, _ in board())}, "
                         f"{', '.join(w.name for w in course())}")
    rows, t0 = [], time.perf_counter()
    for wl, seed in shapes:
        rows += measure_shape(wl, seed, args.reps)
        print(f"# {wl.name}: done at {time.perf_counter() - t0:.0f} s (float64 reference {rows[-1]['ref_s']:.1f} s)",
              flush=True)
        if cl.backend() == "cuda":      # the rows so far: a run stopped at its time limit keeps them
            results.save_benchmark(pd.DataFrame(rows), "fp32_tensor_cores", args.out, say=False)
    df = pd.DataFrame(rows)
    if cl.backend() != "cuda":
        for _, r in df.iterrows():
            print(f"{r['workload']:22s} {r['contender']:8s} max error {r['max_err']:.3g} ({r['max_err_rms']:.3g} "
                  f"of RMS(ref)), {'within' if r['within_bound'] else 'OVER'} its bound  {r['kernel']}")
        print(f"# emulator: {len(df)} results checked against float64 on small twins; nothing timed")
        return 0
    for line in report(df):
        print(line)
    results.save_benchmark(df, "fp32_tensor_cores", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
