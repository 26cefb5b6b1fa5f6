#!/usr/bin/env python3
"""How much Python a launch costs: each chapter's best launcher, and Conv2dFunction forward +
backward, called again and again on a tiny layer (the launch plan is kept after the first call).

    python benchmarks/launch_overhead.py             # the active backend (a GPU when there is one)
    python benchmarks/launch_overhead.py --profile   # and cProfile's top functions for fused.conv2d_best

On a GPU, three figures per launcher:
- python_us: wall time per call of N calls made while torch.cuda._sleep keeps the GPU busy, so
  every kernel only queues: the Python (and the driver's enqueue) a call costs;
- caller_us: CUDA events around a single call with nothing held, the median: what a caller waits
  for a tiny layer, launch overhead and GPU time together;
- gpu_us: cl.bench's time for the same call (events with the GPU held: the kernels' own time).
torch.nn.functional.conv2d on the same layer is the yardstick.

On the emulator the backend's own launch (running nothing) is replaced by a no-op and outputs are
not poisoned, as on a GPU: python_us is then the CPU time of the Python above the backend's launch,
the code both backends share (launchers, Kernel.__call__, argument checks).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import convlab as cl  # noqa: E402
from convlab.ops import backprop, conv3d, fp16, fused, im2col, naive, tiled  # noqa: E402
from convlab.workloads import Workload  # noqa: E402

CALLS = 300          # calls per timed loop
SLEEP_CYCLES = 50_000_000   # ~25 ms at 2 GHz: longer than CALLS launches take to queue


def cases():
    """(name, kernels per call, fn) for each chapter's best launcher on a tiny layer, and torch's."""
    x, w = cl.randn(2, 4, 20, 20), cl.randn(8, 4, 3, 3)
    shape = Workload.of(x, w, padding=1)
    xh, wh = fp16.to_half(x), fp16.to_half(w)
    x3, w3 = cl.randn(1, 1, 12, 20, 20), cl.randn(1, 1, 3, 3, 3)
    dy = cl.randn(*shape.y_shape)
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    out = []
    for chapter, module in ((2, naive), (3, tiled), (4, im2col)):
        impl = module.pick(shape)
        tunables = impl.config(shape)
        out.append((f"ch{chapter} {impl.name}", lambda impl=impl, t=tunables: impl(x, w, padding=1, **t)))
    out += [
        ("ch5 fused.conv2d_best", lambda: fused.conv2d_best(x, w, padding=1)),
        ("ch6 fp16.conv2d_fp16_best", lambda: fp16.conv2d_fp16_best(xh, wh, padding=1)),
        ("ch7 conv3d.conv3d_best", lambda: conv3d.conv3d_best(x3, w3)),
        ("ch8 conv2d_input_grad_best", lambda: backprop.conv2d_input_grad_best(dy, w, padding=1)),
        ("ch8 conv2d_weight_grad_best", lambda: backprop.conv2d_weight_grad_best(x, dy, padding=1)),
        ("ch8 Conv2dFunction forward+backward",
         lambda: backprop.Conv2dFunction.apply(xg, wg, None, 1, 1).backward(dy)),
        ("torch F.conv2d", lambda: torch.nn.functional.conv2d(x, w, padding=1)),
    ]
    return out


def python_us_gpu(fn) -> float:
    """Wall time per call while the GPU is kept busy: the kernels only queue."""
    fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(SLEEP_CYCLES)
    t0 = time.perf_counter()
    for _ in range(CALLS):
        fn()
    dt = time.perf_counter() - t0
    torch.cuda.synchronize()
    return dt / CALLS * 1e6


def caller_us_gpu(fn, reps: int = 50) -> float:
    """Median of CUDA events around one call, nothing held."""
    fn()
    samples = []
    for _ in range(reps):
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        samples.append(s.elapsed_time(e) * 1e3)
    return statistics.median(samples)


def python_us_emu(fn, repeats: int = 5) -> float:
    """Per call, the backend's launch stubbed out: this thread's CPU time (other processes on a
    shared machine do not count), the best of a few loops."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.thread_time()
        for _ in range(CALLS):
            fn()
        best = min(best, (time.thread_time() - t0) / CALLS * 1e6)
    return best


def stub_emulator_launch():
    """Replace the emulator's launch (ctypes packing and running every thread) by a no-op, and
    allocate outputs with torch.empty as on a GPU."""
    from convlab.emu import EmuModule
    EmuModule.launch = lambda self, *args, **kwargs: None
    cl.poisoning = lambda: False


def profile(fn, calls: int = 2000, top: int = 15):
    import cProfile
    import pstats
    fn()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(calls):
        fn()
    pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(top)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", action="store_true", help="cProfile fused.conv2d_best's calls")
    args = ap.parse_args(argv)
    dev = cl.device()
    on_gpu = dev.is_gpu
    print(f"# launch overhead on {dev}; {CALLS} calls per loop, torch {torch.__version__}")
    if not on_gpu:
        stub_emulator_launch()
        print("# emulator: the backend's launch replaced by a no-op; python_us is the Python above it")
    rows = []
    for name, fn in cases():
        if on_gpu:
            t = cl.bench(fn, reps=20, flush_l2=False)
            rows.append((name, python_us_gpu(fn), caller_us_gpu(fn), t.ms * 1e3))
        else:
            rows.append((name, python_us_emu(fn), float("nan"), float("nan")))
    print(f"{'launcher':46s} {'python_us':>10s} {'caller_us':>10s} {'gpu_us':>9s}")
    for name, py, caller, gpu in rows:
        print(f"{name:46s} {py:10.1f} {caller:10.1f} {gpu:9.1f}")
    if args.profile:
        x, w = cl.randn(2, 4, 20, 20), cl.randn(8, 4, 3, 3)
        profile(lambda: fused.conv2d_best(x, w, padding=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
