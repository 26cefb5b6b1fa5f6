#!/usr/bin/env python3
"""The numbers a kernel designer reasons from, measured on this GPU by the small kernels of
kernels/00_numbers/numbers.cu: DRAM, L2, L1 and shared-memory bandwidth; the latency of one load
from each; fp32 FFMA and fp16 HFMA2 throughput; what a launch costs.

    python benchmarks/gpu_numbers.py                       # a GPU: time them, write book/data/gpu_numbers.csv
    CONVLAB_BACKEND=emu python benchmarks/gpu_numbers.py   # emulator: check each kernel on a tiny size

Sizes come from the device (its SM count and L2 size, read from the driver). Every kernel's result
is checked against the host's prediction before it is timed (a copy copies, a chase ends where the
permutation says, an FMA chain gives the host's value). Times: CUDA events, warm-up calls first,
the median of the repeats (convlab.measuring.bench). Latencies: the difference between a chase of 2S steps
and one of S steps, over S, so the launch cancels; and clock64 cycles inside the kernel.
On the emulator nothing is timed and nothing is written.
"""
from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import convlab as cl  # noqa: E402
from convlab.display import book  # noqa: E402
from convlab.measuring.bench import l2_flush, time_caller, time_gpu  # noqa: E402

KERNELS = "kernels/00_numbers/numbers.cu"
CSV = "gpu_numbers"                 # book/data/gpu_numbers.csv
COLUMNS = ["what", "value", "unit", "how", "gpu", "date", "torch", "cuda"]
CHAINS = 8                          # numbers.cu's CHAINS
SMEM_VEC = 1024                     # numbers.cu's SMEM_VEC (int4)
CHASE_SHARED = 8192                 # numbers.cu's CHASE_SHARED (ints)
LINE = 128                          # bytes between two nodes of a global chase: one cache line each
A, B = 0.5, 1.0                     # the FMA chains' x*a + b: a power of two, so a*x is exact and
                                    # fma(x, a, b) is x*a + b rounded once, as numpy computes it


class WrongResult(AssertionError):
    """A microbenchmark kernel's result is not the host's prediction: its time would mean nothing."""


def expect(name: str, got, want):
    got, want = np.asarray(got), np.asarray(want)
    bad = np.flatnonzero(got.ravel() != want.ravel())
    if got.shape != want.shape or bad.size:
        first = int(bad[0]) if bad.size else None
        raise WrongResult(f"{name}: {bad.size} of {want.size} values differ from the host's prediction"
                          + (f" (first at {first}: {got.ravel()[first]} instead of {want.ravel()[first]})"
                             if first is not None else f" (shape {got.shape}, expected {want.shape})"))


# ---- the host's predictions ------------------------------------------------------------------

def cycle(nodes: int, spacing: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(next, order): one random cycle through `nodes` nodes `spacing` ints apart; next[order[i]]
    is order[i + 1] (the last back to the first). Ints between nodes are -1, never read."""
    order = np.random.default_rng(seed).permutation(nodes).astype(np.int64) * spacing
    nxt = np.full(nodes * spacing, -1, dtype=np.int32)
    nxt[order] = np.roll(order, -1)
    return nxt, order


def chase_end(order: np.ndarray, start_pos: int, steps: int) -> int:
    """Where a chase from order[start_pos] stops after `steps` loads."""
    return int(order[(start_pos + steps) % len(order)])


def read_sums(rows: np.ndarray, threads: int, blocks: int, iters: int) -> np.ndarray:
    """out[] of l1_read / shared_read: thread t of every block sums rows[(t + k) % len(rows)] over
    k < iters, each int4's four parts, in unsigned 32-bit (wrapping) arithmetic."""
    row = rows.astype(np.int64).sum(axis=1)
    t = np.arange(threads)[:, None]
    k = np.arange(iters)[None, :]
    per_thread = row[(t + k) % len(rows)].sum(axis=1) % 2**32
    return np.tile(per_thread, blocks).astype(np.uint32)


def fma_sums(threads: int, iters: int, half: bool = False) -> np.ndarray:
    """out[] of fma_chains (fp32) or hfma2_chains (fp16 pairs): each chain x = x*A + B from its
    start value, then the chains summed in order, in float32. A thread's start values depend on
    its index mod 16 only, so 16 threads are computed and repeated."""
    t = np.arange(min(threads, 16))[:, None]
    c = np.arange(CHAINS)[None, :]
    if half:
        x = np.stack([(t + c) & 15, (t + c + 1) & 15], axis=-1).astype(np.float16)
        a, b = np.float16(A), np.float16(B)
    else:
        x = ((t + c) & 15).astype(np.float32)
        a, b = np.float32(A), np.float32(B)
    for _ in range(iters):
        x = x * a + b                       # a*x exact, one rounding: what fma gives
    x = x.astype(np.float32)
    total = np.zeros(len(t), dtype=np.float32)
    for ch in range(CHAINS):
        total = total + (x[:, ch, 0] + x[:, ch, 1] if half else x[:, ch])
    return total[np.arange(threads) % len(t)]


# ---- the device --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Sizes:
    """What each probe runs on: from the device's SM count and L2 size on a GPU, tiny on the emulator."""
    blocks: int            # blocks of `threads` for the throughput kernels (8 per SM: 2,048 threads)
    threads: int
    dram_floats: int       # per array of the DRAM copy: far larger than L2
    l2_floats: int         # per array of the L2 copy: both arrays fit in L2 with room to spare
    l2_reps: int
    read_iters: int        # int4 each thread reads from L1 or shared memory
    window: int            # int4 in the L1 window (a power of two)
    chase_steps: int       # S: the chase runs S and 2S steps
    l1_nodes: int          # cycle of l1_nodes lines: fits in L1
    l2_nodes: int          # fits in L2, far larger than L1
    dram_nodes: int        # far larger than L2
    shared_nodes: int
    fma_iters: int

    @classmethod
    def for_gpu(cls, sms: int, l2_bytes: int) -> "Sizes":
        return cls(blocks=8 * sms, threads=256,
                   dram_floats=max(8 * l2_bytes, 2**30) // 4, l2_floats=l2_bytes // 8 // 4, l2_reps=50,
                   read_iters=8192, window=1024, chase_steps=10_000,
                   l1_nodes=16 * 1024 // LINE, l2_nodes=l2_bytes // 4 // LINE, dram_nodes=4 * l2_bytes // LINE,
                   shared_nodes=CHASE_SHARED, fma_iters=8192)

    @classmethod
    def tiny(cls) -> "Sizes":
        return cls(blocks=3, threads=64, dram_floats=4 * 1000 + 8, l2_floats=4 * 200, l2_reps=2,
                   read_iters=40, window=16, chase_steps=50,
                   l1_nodes=16, l2_nodes=64, dram_nodes=256, shared_nodes=100, fma_iters=20)


def device_facts() -> dict:
    """name, SMs, L2 bytes, shared memory per SM, read from the driver."""
    import pycuda.driver as drv

    dev, attr = cl.runtime.backend_impl().dev, drv.device_attribute
    return {"name": dev.name(), "sms": dev.get_attribute(attr.MULTIPROCESSOR_COUNT),
            "l2_bytes": dev.get_attribute(attr.L2_CACHE_SIZE),
            "shared_per_sm": dev.get_attribute(attr.MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)}


# ---- the probes: each checks its kernel's result, then (on a GPU) times it ---------------------

@dataclass
class Number:
    what: str
    value: float
    unit: str
    how: str


class Probes:
    def __init__(self, sizes: Sizes, gpu: bool, reps: int = 20):
        self.s, self.gpu, self.reps = sizes, gpu, reps
        self.mod = cl.load(KERNELS)
        self.numbers: list[Number] = []
        self.checked: list[str] = []

    def ms(self, fn, flush_l2: bool = False) -> float:
        return time_gpu(fn, reps=self.reps, warmup=3, flush_l2=flush_l2).ms

    def add(self, what, value, unit, how):
        self.numbers.append(Number(what, float(value), unit, how))

    # (a) bandwidth
    def copy(self, what: str, floats: int, reps: int, flush_l2: bool, how: str):
        s = self.s
        src = torch.arange(floats, dtype=torch.float32, device=cl.device().torch_device)
        dst = cl.empty(floats)
        run = lambda: self.mod.copy_float4(src, dst, floats // 4, reps, grid=s.blocks, block=s.threads)  # noqa: E731
        run()
        cl.sync()
        expect(f"copy_float4 ({what})", dst.cpu().numpy(), src.cpu().numpy())
        self.checked.append(f"copy_float4 {what}: {floats:,} floats copied")
        if self.gpu:
            self.add(what, 2 * floats * 4 * reps / (self.ms(run, flush_l2) * 1e-3) / 1e9, "GB/s", how)

    def reads(self):
        s = self.s
        rows = np.arange(4 * s.window, dtype=np.int32).reshape(s.window, 4) * 7 + 1
        src = cl.to_device(torch.from_numpy(rows).reshape(-1))
        out = torch.empty(s.blocks * s.threads, dtype=torch.int32, device=cl.device().torch_device)
        l1 = lambda: self.mod.l1_read(src, s.window - 1, out, s.read_iters, grid=s.blocks, block=s.threads)  # noqa: E731
        sh = lambda: self.mod.shared_read(out, s.read_iters, grid=s.blocks, block=s.threads)  # noqa: E731
        shared_rows = np.arange(SMEM_VEC)[:, None] * np.arange(1, 5)[None, :]
        bytes_read = s.blocks * s.threads * s.read_iters * 16
        for name, run, want, how in (
                ("L1 bandwidth (loads)", l1, read_sums(rows, s.threads, s.blocks, s.read_iters),
                 f"l1_read: {s.blocks} blocks x {s.threads} threads each read {s.read_iters} int4 of a "
                 f"{s.window * 16 // 1024} KB window through L1 (__ldg)"),
                ("shared-memory bandwidth (loads)", sh, read_sums(shared_rows, s.threads, s.blocks, s.read_iters),
                 f"shared_read: {s.blocks} blocks x {s.threads} threads each read {s.read_iters} int4 of "
                 f"shared memory, no bank conflicts")):
            run()
            cl.sync()
            expect(name, out.cpu().numpy().view(np.uint32), want)
            self.checked.append(f"{name.split(' (')[0]}: every thread's sum as predicted")
            if self.gpu:
                self.add(name, bytes_read / (self.ms(run) * 1e-3) / 1e9, "GB/s", how)

    # (b) latency
    def chase(self, level: str, kernel: str, nodes: int, spacing: int, flush_l2: bool, size_text: str):
        s = self.s
        nxt, order = cycle(nodes, spacing, seed=nodes)
        dev = cl.device().torch_device
        table = torch.from_numpy(nxt).to(dev)
        end = torch.empty(1, dtype=torch.int32, device=dev)
        cycles = torch.empty(1, dtype=torch.int64, device=dev)
        k = getattr(self.mod, kernel)

        def run(steps):
            if kernel == "chase_shared":
                return lambda: k(table, nodes, int(order[0]), steps, end, cycles, grid=1, block=256)
            return lambda: k(table, int(order[0]), steps, end, cycles, grid=1, block=1)
        for steps in (s.chase_steps, 2 * s.chase_steps):
            run(steps)()
            cl.sync()
            expect(f"{kernel} ({level}, {steps} steps)", int(end.item()), chase_end(order, 0, steps))
        self.checked.append(f"{kernel} {level}: ends at the predicted node after {s.chase_steps} and "
                            f"{2 * s.chase_steps} steps")
        if self.gpu:
            one, two = self.ms(run(s.chase_steps), flush_l2), self.ms(run(2 * s.chase_steps), flush_l2)
            how = (f"{kernel}: one thread follows a random cycle of {nodes:,} nodes ({size_text}); "
                   f"(time of {2 * s.chase_steps:,} steps - time of {s.chase_steps:,}) / {s.chase_steps:,}")
            self.add(f"{level} latency", (two - one) * 1e6 / s.chase_steps, "ns", how)
            if flush_l2:    # the cycle count of a run that starts cold, like the timed ones
                l2_flush()
            run(2 * s.chase_steps)()
            cl.sync()
            self.add(f"{level} latency (cycles)", int(cycles.item()) / (2 * s.chase_steps), "cycles",
                     f"{kernel}: clock64 around the {2 * s.chase_steps:,}-step loop, per step")

    # (c) arithmetic
    def fma(self, half: bool):
        s = self.s
        n = s.blocks * s.threads
        out = cl.empty(n)
        kernel = "hfma2_chains" if half else "fma_chains"
        run = lambda: getattr(self.mod, kernel)(out, A, B, s.fma_iters, grid=s.blocks, block=s.threads)  # noqa: E731
        run()
        cl.sync()
        expect(kernel, out.cpu().numpy(), fma_sums(n, s.fma_iters, half))
        self.checked.append(f"{kernel}: every thread's sum is the host's")
        if self.gpu:
            per = 4 if half else 2          # FLOPs per lane per instruction: HFMA2 is two FMAs
            what = "fp16 HFMA2 throughput" if half else "fp32 FFMA throughput"
            self.add(what, per * CHAINS * s.fma_iters * n / (self.ms(run) * 1e-3) / 1e12, "TFLOP/s",
                     f"{kernel}: {s.blocks} blocks x {s.threads} threads, {CHAINS} independent chains each, "
                     f"{s.fma_iters} steps; an FMA counted as 2 FLOPs")

    # (d) a launch
    def launch(self, calls: int = 1000):
        run = lambda: self.mod.empty_kernel(grid=1, block=1)  # noqa: E731
        run()
        cl.sync()
        self.checked.append("empty_kernel: launched")
        if not self.gpu:
            return
        self.add("empty kernel, GPU time", self.ms(run) * 1e3, "us",
                 "CUDA events around one launch, the GPU kept busy while it is queued: the GPU's own time")
        self.add("empty kernel, a caller's wait", time_caller(run, reps=self.reps, flush_l2=False).ms * 1e3, "us",
                 "CUDA events around one launch on an idle GPU: the Python call and the driver included")
        loops = []
        for _ in range(5):
            cl.sync()
            t0 = time.perf_counter()
            for _ in range(calls):
                run()
            loops.append((time.perf_counter() - t0) / calls * 1e6)
            cl.sync()
        self.add("launch, host time per call", statistics.median(loops), "us",
                 f"host wall clock over {calls} back-to-back launches (convlab's Python + cuLaunchKernel), "
                 "median of 5 loops")
        trips = []
        for _ in range(100):
            t0 = time.perf_counter()
            run()
            cl.sync()
            trips.append((time.perf_counter() - t0) * 1e6)
        self.add("launch + synchronize, host round trip", statistics.median(trips), "us",
                 "host wall clock of one launch and the wait for it, median of 100")


def measure(sizes: Sizes, gpu: bool, reps: int = 20) -> Probes:
    """Run every probe: check each kernel, and on a GPU time it. The Probes keep .numbers and .checked."""
    s, p = sizes, Probes(sizes, gpu, reps)
    p.copy("DRAM bandwidth (copy)", s.dram_floats, 1, True,
           f"copy_float4 of {s.dram_floats * 4 / 2**20:,.0f} MiB, bytes read + written, L2 flushed before each")
    p.copy("L2 bandwidth (copy)", s.l2_floats, s.l2_reps, False,
           f"copy_float4 of {s.l2_floats * 4 / 2**20:,.1f} MiB (both arrays fit in L2) {s.l2_reps} times "
           "in one launch, loads L2-only (__ldcg), bytes read + written")
    p.reads()
    p.chase("L1", "chase_l1", s.l1_nodes, LINE // 4, False, f"{s.l1_nodes * LINE // 1024} KB, one line apart, __ldg")
    p.chase("L2", "chase_l2", s.l2_nodes, LINE // 4, False,
            f"{s.l2_nodes * LINE / 2**20:,.1f} MiB, one line apart, __ldcg, warmed in L2")
    p.chase("DRAM", "chase_l2", s.dram_nodes, LINE // 4, True,
            f"{s.dram_nodes * LINE / 2**20:,.0f} MiB, one line apart, __ldcg, L2 flushed before each")
    p.chase("shared-memory", "chase_shared", s.shared_nodes, 1, False, f"{s.shared_nodes * 4 // 1024} KB of ints")
    p.fma(half=False)
    p.fma(half=True)
    p.launch()
    return p


def write_csv(numbers: list[Number], facts: dict) -> Path:
    import pandas as pd
    import pycuda.driver as drv

    d = drv.get_driver_version()
    cuda = f"{torch.version.cuda} (driver {d // 1000}.{d % 1000 // 10})"
    rows = [("SM count", facts["sms"], "", "device attribute MULTIPROCESSOR_COUNT"),
            ("L2 size", facts["l2_bytes"] / 2**20, "MiB", "device attribute L2_CACHE_SIZE"),
            ("shared memory per SM", facts["shared_per_sm"] / 1024, "KiB",
             "device attribute MAX_SHARED_MEMORY_PER_MULTIPROCESSOR")]
    rows += [(n.what, n.value, n.unit, n.how) for n in numbers]
    df = pd.DataFrame(rows, columns=COLUMNS[:4])
    df["gpu"], df["date"] = facts["name"], dt.date.today().isoformat()
    df["torch"], df["cuda"] = torch.__version__, cuda
    target = book.repo_root() / "book" / "data" / f"{CSV}.csv"
    df[COLUMNS].to_csv(target, index=False, float_format="%.6g")
    return target


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=20, help="timed repeats per number (the median is kept)")
    args = ap.parse_args(argv)
    dev = cl.device()
    print(f"# {dev}")
    if not dev.is_gpu:
        p = measure(Sizes.tiny(), gpu=False)
        print("# emulator: every kernel checked on a tiny size; nothing timed, nothing written")
        for line in p.checked:
            print(f"checked {line}")
        return 0
    facts = device_facts()
    p = measure(Sizes.for_gpu(facts["sms"], facts["l2_bytes"]), gpu=True, reps=args.reps)
    print(f"# {facts['sms']} SMs, L2 {facts['l2_bytes'] / 2**20:.0f} MiB; every kernel checked before it was timed")
    for n in p.numbers:
        print(f"{n.what:40s} {n.value:12.4g} {n.unit:8s} {n.how}")
    print(f"# wrote {write_csv(p.numbers, facts).name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
