"""A simulated GPU to grade a timing harness without one (exercise 2.2), and the same calls on a
real GPU, so one harness runs on both.

    gpu = simgpu.SimGPU(ms=0.8, seed=1)       # a kernel whose cold-cache time is 0.8 ms
    kernel = gpu.kernel()                     # kernel() launches it: queued, returns at once
    start, end = gpu.event(), gpu.event()
    gpu.flush_l2(); start.record(); kernel(); end.record(); end.synchronize()
    start.elapsed_time(end)                   # ms between the two events on the GPU

    gpu = simgpu.cuda()                       # the same calls on this machine's GPU (torch.cuda)

The calls (both): gpu.event() -> an event with record(), synchronize(), elapsed_time(other);
gpu.synchronize(); gpu.flush_l2(); gpu.empty(nbytes) -> a buffer with zero_(); gpu.L2_BYTES;
gpu.now() -> the host's clock in ms. What the simulated one models, as a GPU behaves:

- a launch queues the kernel and returns at once: the host's clock moves on by the launch's cost
  (LAUNCH_MS) while the GPU runs the kernel later, after whatever was queued before it;
- an event is a mark in the same queue: it completes when the GPU reaches it, and elapsed_time
  of an event not yet completed fails, as CUDA's does (cudaErrorNotReady);
- the first call of a kernel compiles it (COMPILE_MS on the host, the GPU idle meanwhile);
- the L2 cache: a launch that finds its data still in L2 (the previous launch read the same data
  and nothing flushed it) takes HOT of the cold time; flush_l2(), or zeroing a buffer of at least
  L2_BYTES, evicts it;
- other work: every OUTLIER_EVERY-th launch waits behind some (OUTLIER_X times the kernel's time)
  after its start event, as a GPU shared with other processes does now and then;
- a small jitter (JITTER of the time), the same for the same seed.

The simulated GPU keeps a log the exercise check reads: each launch (when it ran, cold or hot,
compiled, held up by other work), each elapsed_time read, each host clock read and each buffer
zeroed (a flush).
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

from .bench import l2_flush

LAUNCH_MS = 0.006          # the host's cost of a launch (Python and the driver)
RECORD_MS = 0.001          # the host's cost of recording an event
COMPILE_MS = 180.0         # the first call of a kernel: compile and load the module
HOT = 0.55                 # a launch whose data is still in L2 takes this share of its cold time
OUTLIER_EVERY = 7          # launch 3, 10, 17, ... waits behind other work
OUTLIER_X = (2.0, 5.0)     # for this many times the kernel's time (drawn per outlier)
JITTER = 0.01
L2_BYTES = 50 << 20        # an H100's L2
FLUSH_MS_PER_MB = 0.0004   # zeroing a buffer: about 2.5 TB/s


class NotReady(RuntimeError):
    """elapsed_time of an event the GPU has not reached yet (CUDA: cudaErrorNotReady)."""


@dataclass
class Launch:
    index: int
    begin_ms: float           # when the host's call began
    host_ms: float            # when the host had queued it (the call returned)
    start_ms: float           # when the GPU began the kernel (after other work, if any)
    end_ms: float
    hot: bool
    compiled: bool            # this call compiled the kernel
    other_ms: float           # other work it waited behind, after its start event


@dataclass
class Log:
    launches: list = field(default_factory=list)
    elapsed: list = field(default_factory=list)   # (start event's GPU time, end's, the ms returned)
    clock: list = field(default_factory=list)     # the host clock's reads (ms)
    zeroed: list = field(default_factory=list)    # buffers zeroed (flushes): (GPU start, end, bytes)


class SimEvent:
    def __init__(self, gpu: "SimGPU"):
        self.gpu, self.at = gpu, None

    def record(self) -> None:
        g = self.gpu
        g._host += RECORD_MS
        self.at = max(g._host, g._free)          # the GPU reaches it after what is queued before

    def synchronize(self) -> None:
        if self.at is None:
            raise RuntimeError("synchronize() of an event that was never recorded")
        self.gpu._host = max(self.gpu._host, self.at)

    def query(self) -> bool:
        return self.at is not None and self.gpu._host >= self.at

    def elapsed_time(self, end: "SimEvent") -> float:
        if self.at is None or end.at is None:
            raise RuntimeError("elapsed_time() of an event that was never recorded: record() both first")
        if not (self.query() and end.query()):
            raise NotReady("elapsed_time() of an event the GPU has not reached yet (cudaErrorNotReady): the "
                           "host must wait for it first (end.synchronize() or gpu.synchronize())")
        ms = end.at - self.at
        self.gpu.log.elapsed.append((self.at, end.at, ms))
        return ms


class SimBuffer:
    def __init__(self, gpu: "SimGPU", nbytes: int):
        self.gpu, self.nbytes = gpu, int(nbytes)

    def zero_(self) -> "SimBuffer":
        g = self.gpu
        g._host += LAUNCH_MS
        start = max(g._host, g._free)
        g._free = start + FLUSH_MS_PER_MB * self.nbytes / 2 ** 20
        g.log.zeroed.append((start, g._free, self.nbytes))
        # what it writes passes through L2: a buffer as large as L2 leaves nothing else there
        g._l2 = {id(self)} if self.nbytes >= g.L2_BYTES else g._l2 | {id(self)}
        return self


class SimGPU:
    """A GPU in a simulation: see the module's doc. ms: the kernel's cold-cache time, the time a
    harness should report."""

    L2_BYTES = L2_BYTES

    def __init__(self, ms: float = 0.8, seed: int = 0):
        self.ms = float(ms)
        self.log = Log()
        self._rng = random.Random(seed)
        self._host = 0.0          # the host's clock
        self._free = 0.0          # when the GPU has done all it was given
        self._l2: set = set()
        self._compiled: set = set()
        self._flush = None

    def kernel(self, data: str = "x"):
        """A kernel that reads `data` (launches of the same data find it in L2): kernel() launches it."""
        key = ("data", data)

        def launch():
            self._launch(key)
        return launch

    def _launch(self, key) -> None:
        n, begin = len(self.log.launches), self._host
        compiled = key not in self._compiled
        if compiled:
            self._compiled.add(key)
            self._host += COMPILE_MS
        self._host += LAUNCH_MS
        queued = max(self._host, self._free)
        other = self.ms * self._rng.uniform(*OUTLIER_X) if n % OUTLIER_EVERY == 3 else 0.0
        hot = key in self._l2
        run = self.ms * (HOT if hot else 1.0) * (1 + self._rng.gauss(0, JITTER))
        start = queued + other
        self._free = start + run
        self._l2 = self._l2 | {key}
        self.log.launches.append(Launch(n, begin, self._host, start, self._free, hot, compiled, other))

    def event(self) -> SimEvent:
        return SimEvent(self)

    def synchronize(self) -> None:
        self._host = max(self._host, self._free)

    def flush_l2(self) -> None:
        if self._flush is None:
            self._flush = SimBuffer(self, 2 * self.L2_BYTES)
        self._flush.zero_()

    def empty(self, nbytes: int) -> SimBuffer:
        return SimBuffer(self, nbytes)

    def now(self) -> float:
        self.log.clock.append(self._host)
        return self._host


class CudaGPU:
    """The same calls on this machine's GPU, through torch.cuda (on torch's current stream, where
    convlab's kernels launch): a harness written for SimGPU runs here unchanged."""

    def __init__(self):
        import torch

        self._torch = torch
        self.L2_BYTES = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", L2_BYTES)

    def event(self):
        return self._torch.cuda.Event(enable_timing=True)

    def synchronize(self) -> None:
        self._torch.cuda.synchronize()

    def flush_l2(self) -> None:
        l2_flush()

    def empty(self, nbytes: int):
        return self._torch.empty(int(nbytes), dtype=self._torch.uint8, device="cuda")

    def now(self) -> float:
        return time.perf_counter() * 1e3


def cuda() -> CudaGPU:
    """This machine's GPU with SimGPU's calls."""
    return CudaGPU()
