#!/usr/bin/env python3
"""How much Python a launch costs: each chapter's best launcher, Conv2dFunction forward +
backward, the drop-in conv2d (forward; forward + backward; fp32 NCHW, and fp16 channels_last on a
layer of 16 maps, chapter 11's wgmma kernel on an H100/H200) and torch's conv2d, called again and
again on a tiny layer (the launch plan is kept after the first call); then, on a GPU, the time a
caller waits against the GPU's time on the course's layers, and an epoch of chapter 8's LeNet-5
with our convolutions and with torch's.

    python benchmarks/launch_overhead.py             # the active backend (a GPU when there is one)
    python benchmarks/launch_overhead.py --profile   # and cProfile's top functions for fused.conv2d_best
    python benchmarks/launch_overhead.py --breakdown # and fused.conv2d_best's call taken apart, step by step

The tiny layer, per launcher:
- launches: kernels of ours one call launches (torch's own ops inside a call not counted);
  torch_kernels: on a GPU, every kernel one call runs, torch's included (torch.profiler);
- the row "autograd Function, empty Python backward": an autograd Function that allocates what a
  convolution's forward and backward return and computes nothing, the cost of a Python backward
  itself (torch's own convolution runs its backward in C++);
- python_us: convlab.measuring.bench.time_host: wall time per call of CALLS calls made while the GPU
  sleeps, so every kernel only queues: the Python (and the driver's enqueue) a call costs, the
  best of 5 such loops; per_launch_us is that over the launches. A loop's kernels, ours and
  torch's, stay under the driver's queue (time_host's note), else it would time the GPU;
- caller_us: CUDA events around a single call with nothing held, the median: what a caller waits
  for a tiny layer, launch overhead and GPU time together;
- gpu_us: cl.bench's time for the same call (events with the GPU held: the kernels' own time).
The drop-in against torch (the goal's figures): the median call of loops in which a call of each
alternates with a call of the other (paired()), forward and forward+backward, and the empty Python
backward against torch's forward+backward; on a GPU the last two again with autograd's
multithreading off (the backward then runs on the caller's thread, with no hand-over to autograd's
device thread), then each pair in a loop of back-to-back calls (wall time, synchronised at the
end: what a training loop sees), and the drop-in's python_us with its routes kept as convlab.gpu.native
Routes (its repeated call one C call: convlab.ops._kernels.Kept) against every route through
Python (_kernels.NATIVE off).
The course's layers: gpu_us and caller_us (convlab.measuring.bench.time_gpu / time_caller, the L2 flushed)
and their ratio, for each chapter's best on each layer it takes.

On the emulator the backend's own launch (running nothing) is replaced by a no-op and outputs are
not poisoned, as on a GPU: python_us is then the CPU time of the Python above the backend's launch,
the code both backends share (launchers, Kernel.__call__, argument checks); and the drop-in's cases
once more with their routes kept as Routes, recorded from a stand-in GPU backend and replayed with
a C function that returns at once in place of the driver's (host_on_cpu). Nothing else is timed.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import convlab as cl  # noqa: E402
from convlab.measuring.bench import (HOST_CALLS, HOST_HOLD_CYCLES, count_launches, time_caller, time_gpu, time_host,
                                     wall_per_call)
from convlab.measuring.workloads import Workload  # noqa: E402
from convlab.ops import _kernels, backprop, conv3d, dropin, fp16, fused, im2col, naive, tiled  # noqa: E402

CALLS = HOST_CALLS           # calls per timed loop (convlab.measuring.bench.time_host's: under the driver's queue)
LAYERS = ("fa17", "lenet_c3", "resnet", "days100")   # the course's 2D layers the best launchers are timed on
DROPIN_FWD, DROPIN_TRAIN = "ch9 dropin.conv2d forward", "ch9 dropin.conv2d forward+backward"
#: channels_last fp16, 16 -> 16 maps: the layer that runs chapter 11's wgmma kernel on an H100/H200
HALF_FWD, HALF_TRAIN = "dropin.conv2d fp16 channels_last forward", "dropin.conv2d fp16 channels_last fwd+bwd"
TORCH_HALF_FWD, TORCH_HALF_TRAIN = "torch F.conv2d fp16 channels_last", "torch F.conv2d fp16 channels_last fwd+bwd"
FLOOR = "autograd Function, empty Python backward"
TORCH_FWD, TORCH_TRAIN = "torch F.conv2d", "torch F.conv2d forward+backward"
#: The drop-in's Python per call, at most this many times torch's (forward; forward + backward)
GOAL = 1.2


def cases():
    """(name, fn) for each chapter's best launcher on a tiny layer, the autograd functions, and torch's."""
    x, w = cl.randn(2, 4, 20, 20), cl.randn(8, 4, 3, 3)
    shape = Workload.of(x, w, padding=1)
    xh, wh = fp16.to_half(x), fp16.to_half(w)
    x3, w3 = cl.randn(1, 1, 12, 20, 20), cl.randn(1, 1, 3, 3, 3)
    dy = cl.randn(*shape.y_shape)
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    half = dict(dtype=torch.float16)
    xh_cl = cl.randn(2, 16, 8, 8, **half).contiguous(memory_format=torch.channels_last)
    wh_cl = cl.randn(16, 16, 3, 3, **half).contiguous(memory_format=torch.channels_last)
    bh = cl.randn(16, **half)
    dyh = cl.randn(2, 16, 8, 8, **half).contiguous(memory_format=torch.channels_last)
    xhg, whg, bhg = (t.clone().requires_grad_() for t in (xh_cl, wh_cl, bh))
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
        (DROPIN_FWD, lambda: dropin.conv2d(x, w, None, 1, 1)),
        (DROPIN_TRAIN, lambda: dropin.conv2d(xg, wg, None, 1, 1).backward(dy)),
        (TORCH_FWD, lambda: F.conv2d(x, w, padding=1)),
        (TORCH_TRAIN, lambda: F.conv2d(xg, wg, padding=1).backward(dy)),
        (FLOOR, lambda: _EmptyBackward.apply(xg, wg).backward(dy)),
        (HALF_FWD, lambda: dropin.conv2d(xh_cl, wh_cl, bh, 1, 1)),
        (HALF_TRAIN, lambda: dropin.conv2d(xhg, whg, bhg, 1, 1).backward(dyh)),
        (TORCH_HALF_FWD, lambda: F.conv2d(xh_cl, wh_cl, bh, 1, 1)),
        (TORCH_HALF_TRAIN, lambda: F.conv2d(xhg, whg, bhg, 1, 1).backward(dyh)),
    ]
    return out


class _EmptyBackward(torch.autograd.Function):
    """What any autograd Function with a Python backward costs, with no kernel of its own: the
    forward allocates y, the backward dx and dw (as a convolution's do), nothing is computed."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.shapes = x.shape, w.shape
        return x.new_empty(x.shape[0], w.shape[0], *x.shape[2:])

    @staticmethod
    def backward(ctx, dy):
        xs, ws = ctx.shapes
        return dy.new_empty(xs), dy.new_empty(ws)


def torch_kernels(fn) -> int:
    """Every GPU kernel one call of fn runs, ours and torch's (the autograd engine's gradient sums
    included), as torch.profiler records them."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA], acc_events=True) as p:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA)


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


def paired(ours, theirs, on_gpu: bool, rounds: int = 9) -> tuple:
    """(ours, theirs): us per call, the median of every call of `rounds` loops in which a call of
    one and a call of the other alternate, each timed alone (on a GPU with the GPU held, as
    python_us; on the emulator this thread's CPU time). Whatever else the host does then weighs on
    both alike, call by call: the table's rows, timed one loop after another, moved by several us
    between runs on a shared host."""
    clock = time.perf_counter if on_gpu else time.thread_time
    ours()
    theirs()
    a, b = [], []
    for _ in range(rounds):
        if on_gpu:
            torch.cuda.synchronize()
            torch.cuda._sleep(HOST_HOLD_CYCLES)
        for _ in range(CALLS // 2):
            t0 = clock()
            ours()
            t1 = clock()
            theirs()
            a.append(t1 - t0)
            b.append(clock() - t1)
    if on_gpu:
        torch.cuda.synchronize()
    return statistics.median(a) * 1e6, statistics.median(b) * 1e6


def stub_emulator_launch():
    """Replace the emulator's launch (ctypes packing and running every thread) by a no-op, and
    allocate outputs with torch.empty as on a GPU."""
    from convlab.gpu.emu import EmuModule

    EmuModule.launch = lambda self, *args, **kwargs: None
    cl.runtime.poisoning = lambda: False


def routes_through_python(fns: dict, names) -> list:
    """(name, python_us) of the drop-in's cases with every route run through Python (no
    convlab.gpu.native Route: _kernels.NATIVE off, the routes made afresh), on a GPU: what the kept
    Routes save."""
    _kernels.NATIVE = False
    dropin._routes.clear()
    try:
        return [(name, time_host(fns[name])) for name in names]
    finally:
        _kernels.NATIVE = True
        dropin._routes.clear()


def host_on_cpu(fns: dict, names) -> list:
    """(name, us of the route through Python, us of the kept Route) per call on the CPU, the GPU's
    work replaced by no-ops: the Python route with the emulator's launch stubbed; the kept Route
    recorded from a stand-in GPU backend (each launch recorded as the GPU backend records it, its
    pointers in 8-byte slots) and replayed by convlab.gpu.native with a C function that returns at once
    in place of the driver's. Neither counts the driver's own work per launch (the same for both)."""
    import ctypes
    import subprocess
    import tempfile

    from convlab.gpu import backend_cuda, native, runtime
    from convlab.gpu._tensor_map import TensorMap

    if native.route_type() is None:
        return []
    python = [(name, python_us_emu(fns[name])) for name in names]
    with tempfile.TemporaryDirectory() as tmp:                 # a C function that returns 0 at once
        src, lib = Path(tmp) / "noop.c", Path(tmp) / "noop.so"
        src.write_text("int noop(void) { return 0; }\n")
        subprocess.run(["cc", "-O2", "-shared", "-fPIC", str(src), "-o", str(lib)], check=True)
        noop = ctypes.CDLL(str(lib)).noop
        address = ctypes.cast(noop, ctypes.c_void_p).value

        class StandIn:
            """The GPU backend as far as a kept route needs it."""
            name = "cuda"
            raw_stream, has_context = staticmethod(lambda: 0), staticmethod(lambda: True)

            def record(self, fn):
                rec = backend_cuda._recording = backend_cuda.Recording()
                try:
                    return fn(), rec
                finally:
                    backend_cuda._recording = None

            def driver_functions(self):
                return address, address, address

            def encode_tensor_map(self, *args):
                return bytes(128)

        def kernel_call(self, *args, grid, block, shared=0, max_shared=None, **kw):
            rec = backend_cuda._recording
            if rec is not None:
                at = tuple(128 * (i + 1) if isinstance(a, TensorMap) else 8 * i for i, a in enumerate(args))
                ptrs = [(8 * i, a) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
                maps = [(128 * (i + 1), a) for i, a in enumerate(args) if isinstance(a, TensorMap)]
                size = 128 * (len(args) + 2)
                rec.steps.append(("launch", 1, (*grid, *block, shared), bytes(size), at, ptrs, maps))
        real_backend, real_call = _kernels.recording_backend, runtime.Kernel.__call__
        _kernels.recording_backend, runtime.Kernel.__call__ = StandIn, kernel_call
        dropin._routes.clear()
        try:
            kept = [(name, python_us_emu(fns[name])) for name in names]
            assert all(isinstance(e[1].run, native.route_type()) for e in dropin._routes.values()), \
                "every route measured is kept as a Route"
        finally:
            _kernels.recording_backend, runtime.Kernel.__call__ = real_backend, real_call
            dropin._routes.clear()
    return [(n, a, b) for (n, a), (_, b) in zip(python, kept)]


def stat_us() -> float:
    """One os.stat of a kernel file: what a launcher pays per call to see an edited .cu."""
    path = str(ROOT / "kernels/05_fused/conv2d_direct_regtile.cu")
    t0 = time.perf_counter()
    for _ in range(10_000):
        os.stat(path)
    return (time.perf_counter() - t0) / 10_000 * 1e6


def layer_rows():
    """(launcher, layer, gpu_us, caller_us) for each chapter's best on the course's 2D layers."""
    from convlab.measuring import workloads
    from convlab.programs import measure

    best = [("ch5 conv2d_best", fused.pick, "fp32"), ("ch6 conv2d_fp16_best", fp16.pick, "fp16"),
            ("ch8 dX best", backprop.pick_input_grad, "fp32"), ("ch8 dW best", backprop.pick_weight_grad, "fp32")]
    rows = []
    for name in LAYERS:
        wl = workloads.get(name)
        for label, pick, dtype in best:
            impl = pick(wl)
            t = measure.inputs(wl, measure.PASS_OF_OP[impl.op], dtype)
            fn = measure.call(impl, wl, t, impl.config(wl))
            rows.append((label, name, time_gpu(fn).ms * 1e3, time_caller(fn).ms * 1e3))
            del t, fn
            torch.cuda.empty_cache()
    return rows


def lenet_epoch_ms(epochs: int = 3) -> dict:
    """ms of the last of a few epochs of chapter 8's LeNet-5 on the digits, ours and torch's twin."""
    from convlab.programs import lenet

    data = lenet.load_digits()
    ours, theirs = lenet.twins(data.image_size, seed=0)
    return {who: 1e3 * lenet.train(model, data, epochs=epochs).epoch_seconds[-1]
            for who, model in (("ours", ours), ("torch", theirs))}


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


def breakdown():
    """(step, us per call) for each step of a cached fused.conv2d_best call on the tiny layer, each
    timed alone in a loop (on a GPU with the GPU held, as python_us): what the 'whole call' row is
    made of. The steps overlap a little (the driver call includes the stream lookup)."""
    from convlab.ops import _kernels
    from convlab.ops import output as new_or_given

    x, w = cl.randn(2, 4, 20, 20), cl.randn(8, 4, 3, 3)
    y = fused.conv2d_best(x, w, padding=1)
    key = (x.shape, w.shape, 1, 1)
    shape, launch = fused._best[key]
    bound, ref = launch.bound, launch.ref
    b = cl.runtime.backend_impl()
    steps = [("whole call: fused.conv2d_best(x, w, padding=1)", lambda: fused.conv2d_best(x, w, padding=1)),
             ("  plan lookup (dict keyed by the shapes)", lambda: fused._best.get(key)),
             ("  output: ops.output (new_empty on a GPU)", lambda: new_or_given(None, shape, x)),
             ("  output: torch.empty alone", lambda: torch.empty(shape, dtype=x.dtype, device=x.device)),
             ("  module check (one os.stat)", ref.get),
             ("  bound launch: tensor checks, pack, driver", lambda: bound((x, w, y)))]
    if b.name == "cuda":
        launcher, slots = bound.launcher, bound.slots
        steps += [("    torch's current stream (b.raw_stream())", b.raw_stream),
                  ("    cuLaunchKernel alone (convlab.gpu.native's call + driver)",
                   lambda: b.cu.launch(launcher.func_id, *bound.dims, b.raw_stream(), slots.address)),
                  ("    three tensor checks + data_ptr", lambda: [(t.is_cuda, t.dtype, t.is_contiguous(), t.data_ptr())
                                                              for t in (x, w, y)])]
    timer = time_host if b.name == "cuda" else python_us_emu
    return [(name, timer(fn)) for name, fn in steps]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", action="store_true", help="cProfile fused.conv2d_best's calls")
    ap.add_argument("--breakdown", action="store_true", help="time each step of a fused.conv2d_best call alone")
    args = ap.parse_args(argv)
    dev = cl.device()
    on_gpu = dev.is_gpu
    print(f"# launch overhead on {dev}; {CALLS} calls per loop, torch {torch.__version__}")
    if not on_gpu:
        stub_emulator_launch()
        print("# emulator: the backend's launch replaced by a no-op; python_us is the Python above it")
    torch.backends.cudnn.benchmark = False
    rows = []
    for name, fn in cases():
        fn()                                   # compile, plan
        launches = 0 if name.startswith("torch") else count_launches(fn)
        if on_gpu:
            t = cl.bench(fn, reps=20, flush_l2=False)
            rows.append((name, launches, torch_kernels(fn), time_host(fn), caller_us_gpu(fn), t.ms * 1e3))
        else:
            rows.append((name, launches, "-", python_us_emu(fn), float("nan"), float("nan")))
    print(f"{'launcher':40s} {'launches':>8s} {'torch_kernels':>13s} {'python_us':>10s} {'per_launch_us':>13s} "
          f"{'caller_us':>10s} {'gpu_us':>9s}")
    for name, launches, kernels, py, caller, gpu in rows:
        per = py / launches if launches else float("nan")
        print(f"{name:40s} {launches or '-':>8} {kernels:>13} {py:10.1f} {per:13.1f} {caller:10.1f} {gpu:9.1f}")
    fns = dict(cases())
    for ours, theirs in ((DROPIN_FWD, TORCH_FWD), (DROPIN_TRAIN, TORCH_TRAIN)):
        a, b = paired(fns[ours], fns[theirs], on_gpu)
        print(f"# {ours}: {a / b:.2f}x torch's Python per call ({a:.1f} against {b:.1f} us, the median call, "
              f"calls of the two alternating; goal: at most {GOAL}x)")
    for ours, theirs in ((HALF_FWD, TORCH_HALF_FWD), (HALF_TRAIN, TORCH_HALF_TRAIN)):
        a, b = paired(fns[ours], fns[theirs], on_gpu)
        print(f"# {ours}: {a / b:.2f}x torch's ({a:.1f} against {b:.1f} us, alternating)")
    a, b = paired(fns[FLOOR], fns[TORCH_TRAIN], on_gpu)
    print(f"# {FLOOR} (no kernel at all): {a / b:.2f}x torch's convolution forward+backward ({a:.1f} against "
          f"{b:.1f} us): the part of the drop-in's forward+backward that any Python backward pays")
    pairs = ((DROPIN_FWD, TORCH_FWD), (DROPIN_TRAIN, TORCH_TRAIN), (HALF_FWD, TORCH_HALF_FWD),
             (HALF_TRAIN, TORCH_HALF_TRAIN))
    if on_gpu:
        for ours, theirs in pairs:                 # a loop of back-to-back calls, as a training loop makes them
            a, b = wall_per_call(fns[ours], calls=CALLS) * 1e3, wall_per_call(fns[theirs], calls=CALLS) * 1e3
            print(f"# {ours}, back to back ({CALLS} calls, wall time, synchronised at the end): {a / b:.2f}x "
                  f"torch's ({a:.1f} against {b:.1f} us a call)")
        names = (DROPIN_FWD, DROPIN_TRAIN, HALF_FWD, HALF_TRAIN)
        kept = {r[0]: r[3] for r in rows}
        for name, us in routes_through_python(fns, names):
            print(f"# {name}: python_us {kept[name]:.1f} with its kept convlab.gpu.native Route, {us:.1f} through "
                  "Python (_kernels.NATIVE off)")
    else:
        print("\n# the drop-in's host time per call on this CPU, the GPU's work replaced by no-ops (us): its route "
              "through Python, and its kept convlab.gpu.native Route (recorded from a stand-in GPU backend)")
        for name, a, b in host_on_cpu(fns, (DROPIN_FWD, DROPIN_TRAIN, HALF_FWD, HALF_TRAIN)):
            print(f"{name:44s} python {a:6.2f}   kept Route {b:6.2f}")
    if on_gpu:
        # autograd runs the backward of CUDA tensors on a thread of its own, to which every backward hands
        # over (and a Python backward takes the GIL there); with that off it runs on the caller's
        with torch.autograd.set_multithreading_enabled(False):
            for ours in (DROPIN_TRAIN, FLOOR):
                a, b = paired(fns[ours], fns[TORCH_TRAIN], on_gpu)
                print(f"# {ours}, autograd's multithreading off (torch.autograd.set_multithreading_enabled"
                      f"(False)): {a / b:.2f}x torch's ({a:.1f} against {b:.1f} us)")
    print(f"# one os.stat of a kernel file (a launcher's check for an edited .cu, once per call): {stat_us():.2f} us")
    if on_gpu:
        print("\n# the course's layers: the time a caller waits (nothing held) against the GPU's")
        print(f"{'launcher':24s} {'layer':10s} {'gpu_us':>10s} {'caller_us':>10s} {'caller/gpu':>10s}")
        for label, layer, gpu, caller in layer_rows():
            print(f"{label:24s} {layer:10s} {gpu:10.1f} {caller:10.1f} {caller / gpu:10.3f}")
        ms = lenet_epoch_ms()
        print(f"\n# chapter 8's LeNet-5 on the digits, one epoch (batch 64): ours {ms['ours']:.1f} ms, "
              f"torch {ms['torch']:.1f} ms ({ms['ours'] / ms['torch']:.2f}x)")
    if args.breakdown:
        print("\n# fused.conv2d_best's call, step by step (each step alone in a loop; us per call)")
        for name, us in breakdown():
            print(f"{name:52s} {us:8.2f}")
    if args.profile:
        x, w = cl.randn(2, 4, 20, 20), cl.randn(8, 4, 3, 3)
        profile(lambda: fused.conv2d_best(x, w, padding=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
