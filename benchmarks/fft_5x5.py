#!/usr/bin/env python3
"""Does a 5x5 mask gain from FFT? The FA17 project's report said little; cuDNN, timing its own
algorithms (cudnn.benchmark on), runs fa17's 5x5 dX as an FFT (book/data/08_backprop.csv). This
times fa17's dX (torch.nn.grad.conv2d_input) and forward twice, each in a fresh process, strict
fp32 (TF32 off), NCHW:

- "benchmark": cudnn.benchmark on, cuDNN times its algorithms and keeps the fastest (torch best's
  setting);
- "heuristic": cudnn.benchmark off, cuDNN takes its heuristics' first choice without timing.

Each row names the kernels the timed call ran (torch.profiler) and the algorithm they show
(convlab.measuring.baselines.torch_algorithm). Chapter 8 glues the dX rows (book/08_backprop.ipynb, "What
torch runs").

    python benchmarks/fft_5x5.py                     # on a GPU: benchmarks/results/fft_5x5_<GPU>.csv
    python benchmarks/fft_5x5.py --out $OUT          # the CSV into another folder
    CONVLAB_BACKEND=emu python benchmarks/fft_5x5.py --emu-smoke --out /tmp/x   # the code path, tiny
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

NAME = "fft_5x5"
CHOICES = {"benchmark": True, "heuristic": False}


def worker(choice: str, workload: str, reps: int) -> dict:
    """In this process: time the layer's dX and forward with cudnn.benchmark as `choice` says, and
    name the kernels the timed call ran. A dict per pass, printed as JSON lines."""
    import torch

    import convlab as cl
    from convlab.measuring import workloads
    from convlab.measuring.baselines import torch_algorithm
    from convlab.measuring.bench import bench, strict_fp32, time_gpu

    wl = workloads.get(workload)
    if cl.backend() != "cuda":
        wl = wl.small()
    torch.backends.cudnn.benchmark = CHOICES[choice]
    kw = {"stride": wl.stride, "padding": wl.padding}
    x, w, dy = cl.randn(*wl.x_shape), cl.randn(*wl.w_shape), cl.randn(*wl.y_shape)
    calls = {"dX": lambda: torch.nn.grad.conv2d_input(wl.x_shape, w, dy, **kw),
             "forward": lambda: torch.nn.functional.conv2d(x, w, **kw)}
    rows = []
    with strict_fp32(benchmark=CHOICES[choice]):
        for pass_, fn in calls.items():
            fn()                                   # cuDNN chooses (and times, with benchmark on)
            kernels = _kernels(fn) if cl.backend() == "cuda" else []
            t = time_gpu(fn, reps=reps) if cl.backend() == "cuda" else bench(fn, reps=1, warmup=0)
            algorithm, kernel = torch_algorithm(" | ".join(kernels))
            rows.append({"workload": wl.name, "pass": pass_, "choice": choice, "ms": float(t.ms),
                         "algorithm": algorithm, "kernel": kernel, "kernels": " | ".join(kernels),
                         "gpu": cl.device().name if cl.backend() == "cuda" else "CPU emulator",
                         "torch": torch.__version__, "tf32": "TF32 off"})
    return rows


def _kernels(fn) -> list:
    """The GPU kernels one call of fn ran, in order (torch.profiler)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA], acc_events=True) as prof:
        fn()
        torch.cuda.synchronize()
    return list(dict.fromkeys(e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                              and not e.name.startswith(("Memcpy", "Memset"))))


def measure(workload: str, reps: int) -> "pandas.DataFrame":  # noqa: F821
    """Each choice in a fresh process (cuDNN's choice is made once per process and shape)."""
    import pandas as pd

    rows = []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    for choice in CHOICES:
        done = subprocess.run([sys.executable, __file__, "--worker", choice, "--workload", workload,
                               "--reps", str(reps)], capture_output=True, text=True, env=env, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"{choice}: the worker failed:\n{done.stderr[-2000:]}")
        rows += [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return pd.DataFrame(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="fa17")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", type=Path, help="the folder for the CSV (default benchmarks/results)")
    ap.add_argument("--emu-smoke", action="store_true", help="on the emulator: the small twin, the code path only")
    ap.add_argument("--worker", choices=list(CHOICES), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        for row in worker(a.worker, a.workload, a.reps):
            print(json.dumps(row))
        return 0
    import convlab as cl
    from convlab.measuring import results

    if cl.backend() != "cuda" and not a.emu_smoke:
        print("fft_5x5 times cuDNN: run it on a GPU (or --emu-smoke on the emulator)")
        return 1
    df = measure(a.workload, 1 if a.emu_smoke else a.reps)
    print(df[["pass", "choice", "ms", "algorithm", "kernel"]].to_string(index=False))
    if cl.backend() == "cuda" or a.out:
        results.write_benchmark(df, NAME, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
