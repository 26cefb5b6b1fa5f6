"""cl.bench: time a launch the way the course asks. On a GPU: CUDA events around each call, a
warm-up, the L2 cache flushed before each timed call (so a small layer is not timed hot), the
median of many and the spread. On the emulator: wall time, labelled as such, never a GPU time.

Before each timed call the GPU is kept busy by a short sleep, so Python has queued the call's
kernels by the time the start event fires: the events then time the GPU's work, not Python's.
Without it a launcher that does 50-100 us of Python work between two ~0.1 ms kernels was timed
60% slow on an H200 (resnet fp16: 0.170 ms instead of 0.107).

The events, the flush and the hold all go on torch's current stream, where convlab's kernels
launch too (as torch's ops do): timed from inside `with torch.cuda.stream(s):`, the events bracket
the call's kernels on s.

torch's own contenders (and the roofline's GEMM) are timed under strict_fp32(): TF32 off, the
arithmetic our kernels do.

Besides: time_alternating (several contenders timed in turns, call by call), time_host (the host
time per call), and what one call does, on either backend: count_launches (our kernels) and
work_of (those, and every aten op that is not a view: the allocations and torch's own passes over
memory, convlab.measuring.bench.Work)."""
from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..gpu import native
from ..gpu.emu import EmuModule
from ..gpu.runtime import backend, backend_impl, device


@dataclass
class Timing:
    ms: float                 # median
    p25: float
    p75: float
    min: float
    max: float
    samples: list = field(repr=False)
    is_gpu: bool
    device: str

    def __str__(self):
        if self.is_gpu:
            return (f"{self.ms:.4g} ms (median of {len(self.samples)}, IQR {self.p25:.4g}-{self.p75:.4g}) "
                    f"on {self.device}")
        return f"{self.ms:.4g} ms emulator wall time (CPU, not a GPU timing)"


_flush_buf = None


def l2_flush():
    global _flush_buf
    if _flush_buf is None:
        l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 64 << 20)
        _flush_buf = torch.empty(max(2 * l2, 64 << 20), dtype=torch.uint8, device="cuda")
    _flush_buf.zero_()


HOLD_CYCLES = 2_000_000     # about 1 ms at 2 GHz: longer than Python takes to queue a launcher's kernels


def _hold_gpu():
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is not None:
        sleep(HOLD_CYCLES)


def bench(fn, reps: int | None = None, warmup: int | None = None, flush_l2: bool = True) -> Timing:
    """GPU time of fn() (see the module's doc); on the emulator, wall time labelled as such."""
    if backend() == "cuda":
        t = time_gpu(fn, reps=reps or 20, warmup=3 if warmup is None else warmup, flush_l2=flush_l2)
        return Timing(t.ms, t.p25, t.p75, t.min, t.max, t.samples, True, device().name)
    samples = wall_clock_ms(fn, reps or 3, 1 if warmup is None else warmup)
    median, p25, p75 = spread(samples)
    return Timing(median, p25, p75, min(samples), max(samples), samples, False, "CPU emulator")


def _events(fn, reps: int, warmup: int, flush_l2: bool, hold: bool) -> Timing:
    for _ in range(warmup):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(starts, ends):
        if flush_l2:
            l2_flush()
        if hold:
            _hold_gpu()
        else:
            torch.cuda.synchronize()    # an idle GPU, as a caller finds it between two calls
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    samples = [s.elapsed_time(e) for s, e in zip(starts, ends)]
    median, p25, p75 = spread(samples)
    return Timing(median, p25, p75, min(samples), max(samples), samples, True, torch.cuda.get_device_name())


def time_gpu(fn, reps: int = 20, warmup: int = 3, flush_l2: bool = True) -> Timing:
    """The GPU's time for fn(): events with the GPU held busy while Python queues the work."""
    return _events(fn, reps, warmup, flush_l2, hold=True)


def time_caller(fn, reps: int = 20, warmup: int = 3, flush_l2: bool = True) -> Timing:
    """The time a caller sees for one call of fn() on an idle GPU: events around the Python call
    with nothing held, so Python's own work before and between the kernels counts too."""
    return _events(fn, reps, warmup, flush_l2, hold=False)


def time_alternating(fns: dict, reps: int = 15, warmup: int = 2, hold: bool = False) -> dict:
    """{name: Timing} of each fn() in fns, timed in turns: each round times one call of every fn
    (CUDA events around it, no L2 flush), in an order rotated from round to round, so drift on the
    host or the GPU weighs on each alike. hold=False: each call from an idle GPU, the time a caller
    sees (Python included); hold=True: the GPU kept busy while Python queues the call, its GPU time."""
    names = list(fns)
    for _ in range(warmup):
        for n in names:
            fns[n]()
    samples = {n: [] for n in names}
    for r in range(reps):
        k = r % len(names)
        for n in names[k:] + names[:k]:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if hold:
                _hold_gpu()
            else:
                torch.cuda.synchronize()
            s.record()
            fns[n]()
            e.record()
            e.synchronize()
            samples[n].append(s.elapsed_time(e))
    name = torch.cuda.get_device_name()
    out = {}
    for n, v in samples.items():
        median, p25, p75 = spread(v)
        out[n] = Timing(median, p25, p75, min(v), max(v), v, True, name)
    return out


#: Calls per loop of time_host: with at most 8 kernels a call, fewer than the ~1,000 launches the
#: driver queues before a launch waits for the GPU (measured on an H100: 5.9 us a launch with 768
#: queued, 99 us with 1,024).
HOST_CALLS = 64
HOST_HOLD_CYCLES = 100_000_000      # about 50 ms at 2 GHz: longer than HOST_CALLS calls take to queue


def time_host(fn, calls: int = HOST_CALLS, repeats: int = 5) -> float:
    """us of host time per call of fn(): wall time over a loop of `calls` calls made while the GPU
    sleeps, so every kernel only queues: the Python and the driver's enqueue, the best of
    `repeats` loops (one loop alone moves by several us with whatever else the host does). GPU only."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        torch.cuda.synchronize()
        torch.cuda._sleep(HOST_HOLD_CYCLES)
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    torch.cuda.synchronize()
    return best


@contextlib.contextmanager
def counted_launches(run: bool = True):
    """Counts the kernels of convlab's launched inside (torch's own not counted): yields a list whose
    one item is the count (on a GPU, final at the block's end). On a GPU, the backend's driver
    launches and those of convlab.gpu.native's Routes (kept routes); on the emulator, its
    launches, which run=False replaces by the count alone (nothing runs: outputs keep what they
    held), and while one runs, what it does is no part of the call (Work.pause)."""
    n = [0]
    if backend() == "cuda":
        b = backend_impl()
        real, before = b.cu.launch, native.launched()

        def counting(*args):
            n[0] += 1
            return real(*args)
        b.cu.launch = counting
        try:
            yield n
        finally:
            b.cu.launch = real
            n[0] += native.launched() - before       # those of kept routes (convlab.gpu.native Routes) too
        return
    real = EmuModule.launch

    def emu_launch(self, *args, **kwargs):
        n[0] += 1
        if run:
            with Work.pause():
                return real(self, *args, **kwargs)
    EmuModule.launch = emu_launch
    try:
        yield n
    finally:
        EmuModule.launch = real


def count_launches(fn, run: bool = True) -> int:
    """Kernels of convlab's that one call of fn() launches (counted_launches)."""
    with counted_launches(run) as n:
        fn()
    return n[0]


#: aten ops that only allocate (or allocate and fill): a new tensor, no input read
ALLOCATING = frozenset(("empty", "empty_strided", "new_empty", "new_empty_strided", "full", "new_full", "zeros",
                        "new_zeros", "ones", "new_ones", "empty_like", "full_like", "zeros_like", "ones_like"))


class Work(TorchDispatchMode):
    """What torch does inside: every aten op that is not a view, as `allocations` (ops of ALLOCATING)
    and `ops` (the names of the others, each a pass over memory by torch: a copy, a conversion of
    layout, a fill, an add). Our kernels are no aten ops: beside count_launches, this is what a
    route adds to them. Views (permute, view, unsqueeze...) move no memory and are not counted."""

    _paused = [0]

    def __init__(self):
        super().__init__()
        self.allocations, self.ops = 0, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not Work._paused[0] and not _is_view(func):
            name = func.overloadpacket.__name__
            if name in ALLOCATING:
                self.allocations += 1
            else:
                self.ops.append(name)
        return out

    @staticmethod
    @contextlib.contextmanager
    def pause():
        """Ops inside are not counted (the emulator's own work while it runs a kernel)."""
        Work._paused[0] += 1
        try:
            yield
        finally:
            Work._paused[0] -= 1


def _is_view(func) -> bool:
    """An op whose outputs alias an input without writing it (a view), or that only reads metadata."""
    returns = func._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)


@dataclass
class CallWork:
    launches: int              # kernels of ours
    allocations: int           # tensors torch allocated (outputs, workspaces)
    ops: tuple                 # torch's passes over memory besides (copies, conversions, fills, adds), by name

    def __str__(self):
        return f"{self.launches} launches, {self.allocations} allocations, torch ops {list(self.ops) or 'none'}"


def work_of(fn, run: bool = True) -> CallWork:
    """The launches, allocations and torch ops of one call of fn() (after a first call that plans
    it: a repeated call, as a loop makes). run=False on the emulator: nothing runs, only counted."""
    fn()
    with counted_launches(run) as n, Work() as w:
        fn()
    return CallWork(n[0], w.allocations, tuple(w.ops))


def wall_per_call(fn, calls: int | None = None, budget_s: float = 0.5) -> float:
    """ms per call of fn() in a loop of back-to-back calls, wall clock, synchronised at the end:
    what a training loop sees (Python's work overlaps the GPU's when the GPU is the slower)."""
    fn()
    torch.cuda.synchronize()
    if calls is None:
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        one = max(time.perf_counter() - t0, 1e-6)
        calls = int(min(200, max(5, budget_s / one)))
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3 / calls


def wall_clock_ms(fn, reps: int, warmup: int) -> list:
    """fn()'s wall time in ms, reps times after warmup calls (the emulator's and chapter 1's CPU timings)."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    return samples


def spread(samples: list) -> tuple:
    """(median, 25th, 75th percentile)."""
    q = statistics.quantiles(samples, n=4) if len(samples) > 1 else [samples[0]] * 3
    return statistics.median(samples), q[0], q[2]


@contextlib.contextmanager
def strict_fp32(benchmark: bool | None = None):
    """TF32 off for cuDNN convolutions and for matmul inside the block (and cudnn.benchmark set,
    when given); the old settings after. Through cuDNN's flags() context, which works also where
    torch.testing has frozen the global flags."""
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    saved = matmul.allow_tf32
    bench = cudnn.benchmark if benchmark is None else benchmark
    try:
        matmul.allow_tf32 = False
        with cudnn.flags(enabled=cudnn.enabled, benchmark=bench, deterministic=cudnn.deterministic,
                         allow_tf32=False):
            yield
    finally:
        matmul.allow_tf32 = saved
