#!/usr/bin/env python3
"""A recorded trace of chapter 10's class project network, ours and torch's: one forward pass of a
batch (copied in from pinned memory, the logits copied back) and one training step (forward with
the tape, backward, the SGD update), each recorded with torch.profiler after warm-up calls: every
host API call (the CUDA runtime's and driver's, launches included), every copy and memset, and
every kernel on its stream, with its start and duration. Chapter 10 glues a summary of ours (book/
10_network.ipynb, step 5: kernels, streams, the host's API calls, the fully-connected GEMMs and the
softmax).

    python benchmarks/network_trace.py                 # on a GPU: benchmarks/results/network_trace_<GPU>.csv
    python benchmarks/network_trace.py --images 2000   # a smaller forward batch
    python benchmarks/network_trace.py --out $OUT      # the CSV into another folder
    CONVLAB_BACKEND=emu python benchmarks/network_trace.py --emu-smoke --out /tmp/x  # the code path

Rows: phase ("forward", "training step"), who ("ours", "torch"), kind ("host API", "kernel",
"memcpy", "memset", "python"), name, stream, start_us (from the phase's first event), dur_us, gpu.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

NAME = "network_trace"


def _events(prof, phase: str, who: str, gpu: str) -> list:
    """The profiler's events as rows, times from the phase's first event."""
    import torch

    rows = []
    for e in prof.events():
        on_gpu = e.device_type == torch.autograd.DeviceType.CUDA
        name = e.name
        if on_gpu:
            kind = "memcpy" if name.startswith("Memcpy") else "memset" if name.startswith("Memset") else "kernel"
        elif name.startswith(("cuda", "cu")) and not name.startswith("cudnn"):
            kind = "host API"
        else:
            kind = "python"
        start = e.time_range.start
        rows.append({"phase": phase, "who": who, "kind": kind, "name": name,
                     "stream": getattr(e, "device_resource_id", None) if on_gpu else None,
                     "start_us": start, "dur_us": e.time_range.end - start, "gpu": gpu})
    if rows:
        t0 = min(r["start_us"] for r in rows)
        for r in rows:
            r["start_us"] -= t0
    return rows


def record(images: int, batch: int, warmup: int = 2):
    import pandas as pd
    import torch
    from torch.profiler import ProfilerActivity, profile

    import convlab as cl
    from convlab.programs import network

    gpu_name = cl.device().name if cl.backend() == "cuda" else "CPU emulator"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cl.backend() == "cuda" else [])
    arch = network.CLASS_PROJECT
    if cl.backend() != "cuda":
        arch = arch.at_size(30)             # chapter 10's twin on the emulator: the same layers
    size = arch.image_size
    params = network.init(arch, seed=0)
    dev = next(iter(params.values())).device
    model = network.load_into(network.torch_model(arch), params).to(dev)
    host = torch.randn(images, 1, size, size).pin_memory() if cl.backend() == "cuda" else torch.randn(images, 1, size, size)
    labels = torch.randint(0, arch.classes, (batch,), device=dev)
    velocity = {k: torch.zeros_like(v) for k, v in params.items()}

    def forward_ours():
        x = host.to(dev, non_blocking=True)
        return network.forward(arch, params, x).cpu()

    def forward_torch():
        with torch.no_grad(), network.TorchAtItsBest():
            return model(host.to(dev, non_blocking=True)).cpu()

    xb = host[:batch].to(dev)

    def step_ours():
        from convlab.ops import layers as ops
        logits, tape = network.forward(arch, params, xb, keep=True)
        _, grads = network.backward(arch, params, tape, labels)
        for k, p in params.items():
            ops.sgd_momentum(p, grads[k], velocity[k], lr=0.05, momentum=0.9)
        cl.sync()

    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def step_torch():
        with network.TorchAtItsBest():
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), labels).backward()
            opt.step()
        cl.sync()

    rows = []
    for phase, who, fn in (("forward", "ours", forward_ours), ("forward", "torch", forward_torch),
                           ("training step", "ours", step_ours), ("training step", "torch", step_torch)):
        for _ in range(warmup):
            fn()
        cl.sync()
        with profile(activities=acts, acc_events=True) as prof:
            fn()
            cl.sync()
        rows += _events(prof, phase, who, gpu_name)
    return pd.DataFrame(rows)


def summary(df) -> str:
    lines = []
    for (phase, who), ev in df.groupby(["phase", "who"], sort=False):
        k, api = ev[ev["kind"] == "kernel"], ev[ev["kind"] == "host API"]
        span = (ev["start_us"] + ev["dur_us"]).max() - ev["start_us"].min()
        lines.append(f"{phase:14s} {who:6s} {len(k):4d} kernels on {k['stream'].nunique()} stream(s), "
                     f"{k['dur_us'].sum() / 1e3:8.3f} ms of kernels in {span / 1e3:8.3f} ms; "
                     f"{len(api)} host API calls, {api['dur_us'].sum() / 1e3:.3f} ms")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=10_000, help="the forward pass's batch (chapter 10's: 10,000)")
    ap.add_argument("--batch", type=int, default=64, help="the training step's batch")
    ap.add_argument("--out", type=Path, help="the folder for the CSV (default benchmarks/results)")
    ap.add_argument("--emu-smoke", action="store_true", help="on the emulator: a tiny twin, the code path only")
    a = ap.parse_args(argv)
    import convlab as cl
    from convlab.measuring import results

    if cl.backend() != "cuda" and not a.emu_smoke:
        print("network_trace records a GPU's timeline: run it on a GPU (or --emu-smoke on the emulator)")
        return 1
    images, batch = (4, 2) if a.emu_smoke else (a.images, a.batch)
    df = record(images, batch, warmup=1 if a.emu_smoke else 2)
    print(summary(df))
    if cl.backend() == "cuda" or a.out:
        results.write_benchmark(df, NAME, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
