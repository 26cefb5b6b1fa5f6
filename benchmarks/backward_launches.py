#!/usr/bin/env python3
"""dX and dW of small fp32 layers: a route of one launch against a route of several, in the time a
caller waits. On a small layer the GPU's work takes less time than launching it; how many kernels a
route launches then decides what it costs.

    python benchmarks/backward_launches.py        # the active backend (on the emulator: checks only)

Layers: 3x3, padding 1, 20x20 planes, channels (C -> M) 4->8, 8->16, 16->32, 32->64, batches 1 to 256.
Routes, each checked against an fp64 reference first:
- dX: chapter 9's fp32 implicit GEMM (igemm.conv2d_igemm_f32_dx: the mask transposed, the GEMM, and a
  split-K sum where it splits) and chapter 8's best dX (backprop.conv2d_input_grad_best);
- dW: chapter 8's best dW with its partial sums and second pass, and the same kernel in one part
  (chunks=1 for the direct reduction, splits=1 for the GEMM), its sums written straight into dW.
Per route: launches, gpu_us (events with the GPU held: the kernels' own time), caller_us (events
around one call with nothing held: what a caller waits, launches included), host_us
(convlab.measuring.bench.time_host: wall time per call in a loop of calls while the GPU sleeps, the Python
and the driver's enqueue). The L2 is not flushed: a training step's small layer finds its tensors
there. On a GPU the rows go to
benchmarks/results/backward_launches_<GPU>.csv.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import convlab as cl  # noqa: E402
from convlab.measuring.bench import count_launches, time_caller, time_gpu, time_host  # noqa: E402
from convlab.measuring.workloads import Workload  # noqa: E402
from convlab.ops import backprop, igemm  # noqa: E402

CHANNELS = ((4, 8), (8, 16), (16, 32), (32, 64))
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
SIDE, K = 20, 3


def routes(shape: Workload):
    """(pass, route, fn(x, w, dy)) for one layer."""
    conv = dict(stride=1, padding=1)
    size = (shape.H, shape.W)
    out = [("dx", "chapter 8's best", lambda x, w, dy: backprop.conv2d_input_grad_best(dy, w, input_size=size, **conv))]
    if igemm.IGEMM_F32_DX.applies(shape):
        out.append(("dx", "implicit GEMM", lambda x, w, dy: igemm.conv2d_igemm_f32_dx(dy, w, input_size=size, **conv)))
    out.append(("dw", "chapter 8's best",
                lambda x, w, dy: backprop.conv2d_weight_grad_best(x, dy, kernel_size=K, **conv)))
    if backprop.direct_dw_fits(shape.C, shape.M, K):
        one = lambda x, w, dy: backprop.conv2d_weight_grad_direct(x, dy, kernel_size=K, chunks=1, **conv)  # noqa: E731
    else:
        one = lambda x, w, dy: backprop.conv2d_weight_grad_gemm(x, dy, kernel_size=K, splits=1, **conv)  # noqa: E731
    out.append(("dw", "one part", one))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, nargs="*", default=BATCHES)
    args = ap.parse_args(argv)
    dev = cl.device()
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    batches = args.batches if dev.is_gpu else (1, 2)
    print(f"# dX and dW routes of small layers on {dev}")
    rows = []
    for C, M in CHANNELS:
        for B in batches:
            shape = Workload(f"{C}to{M}_b{B}", B=B, C=C, M=M, H=SIDE, W=SIDE, K=K, stride=1, padding=1)
            x, w = cl.randn(B, C, SIDE, SIDE), cl.randn(M, C, K, K)
            dy = cl.randn(*shape.y_shape)
            xd, wd = x.double().cpu().requires_grad_(), w.double().cpu().requires_grad_()
            F.conv2d(xd, wd, padding=1).backward(dy.double().cpu())
            for pass_, route, f in routes(shape):
                fn = lambda f=f: f(x, w, dy)  # noqa: E731
                with cl.debug():
                    cl.check(fn(), xd.grad if pass_ == "dx" else wd.grad, name=f"{pass_} {route} {shape.name}")
                row = {"layer": shape.name, "B": B, "C": C, "M": M, "macs": shape.macs, "pass": pass_, "route": route}
                if dev.is_gpu:
                    row.update(launches=count_launches(fn), gpu_us=time_gpu(fn, flush_l2=False).ms * 1e3,
                               caller_us=time_caller(fn, flush_l2=False).ms * 1e3, host_us=time_host(fn))
                rows.append(row)
    df = pd.DataFrame(rows)
    if not dev.is_gpu:
        print(f"# emulator: {len(df)} routes checked against fp64; timings need a GPU")
        return 0
    df["gpu"] = dev.name
    pd.set_option("display.width", 200)
    print(df.drop(columns="gpu").to_string(index=False, float_format=lambda v: f"{v:.1f}"))
    out = ROOT / "benchmarks" / "results" / f"backward_launches_{dev.name.replace(' ', '_')}.csv"
    df.to_csv(out, index=False, float_format="%.2f")
    print(f"# wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
