"""torch at its best on one layer, timed in a fresh process: `python -m convlab.measuring.torch_baseline SPEC`.

cuDNN's choice of algorithm depends on what the process ran before (the same lenet_c1 layer took
7.0 ms in one fresh process and 11.3 ms in another that had run other shapes first), so every
torch configuration the book compares with is timed in a process of its own: cudnn.benchmark on
from the first call, TF32 off, the layout asked for (NCHW or channels_last), the same timing as
our kernels (convlab.measuring.bench), and the names of the kernels torch ran, from its profiler.

SPEC is JSON: {"op": "conv2d"|"conv3d"|"conv2d_train", "dtype": "fp32"|"fp16",
"layout": "nchw"|"channels_last", "shape": {B, C, M, H, W, K, stride, padding, D, and for a 2D
layer optionally Kw, stride_w, padding_w, dilation, dilation_w, groups (a convlab Workload's
fields; a missing width is the height's value, dilation and groups default to 1)}, "reps": 20}.
The answer is one JSON line per pass on stdout: {"pass", "ms", "p25", "p75", "caller_ms",
"wall_ms", "kernels"}. conv2d_train times forward, dX, dW and forward+dX+dW (autograd) of one
layer in that one process.
"""
from __future__ import annotations

import json
import sys

from .bench import time_caller, time_gpu, wall_per_call

DTYPES = {"fp32": "float32", "fp16": "float16"}


def _tensors(spec):
    import torch

    s = spec["shape"]
    dtype = getattr(torch, DTYPES[spec["dtype"]])
    spatial = (s["H"], s["W"]) if s.get("D") is None else (s["D"], s["H"], s["W"])
    mask = (s["K"], s.get("Kw") or s["K"]) if s.get("D") is None else (s["K"],) * 3
    g = torch.Generator(device="cuda").manual_seed(20261122)
    x = torch.randn(s["B"], s["C"], *spatial, device="cuda", dtype=dtype, generator=g)
    w = torch.randn(s["M"], s["C"] // s.get("groups", 1), *mask, device="cuda", dtype=dtype, generator=g)
    if spec["layout"] == "channels_last":
        fmt = torch.channels_last if len(spatial) == 2 else torch.channels_last_3d
        x, w = x.contiguous(memory_format=fmt), w.contiguous(memory_format=fmt)
    return x, w


def _kernels(fn) -> list:
    """The CUDA kernels one call of fn launches, by name, from torch's profiler."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA], acc_events=True) as prof:
        fn()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return list(dict.fromkeys(n for n in names if not n.startswith("Memcpy") and not n.startswith("Memset")))


def conv_kwargs(s: dict, two_d: bool = True) -> dict:
    """torch's stride, padding, dilation and groups for a spec's shape: (height, width) pairs in 2D."""
    def pair(name, default):
        h = s.get(name, default)
        w = s.get(name + "_w")
        return (h, h if w is None else w) if two_d else h

    return {"stride": pair("stride", 1), "padding": pair("padding", 0), "dilation": pair("dilation", 1),
            "groups": s.get("groups", 1)}


def _passes(spec, x, w):
    """(name, zero-argument callable) for each pass the spec asks for."""
    import torch
    import torch.nn.functional as F

    conv = F.conv2d if x.dim() == 4 else F.conv3d
    kw = conv_kwargs(spec["shape"], x.dim() == 4)
    if spec["op"] in ("conv2d", "conv3d"):
        return [("forward", lambda: conv(x, w, **kw))]
    if spec["op"] != "conv2d_train":
        raise ValueError(f"unknown op {spec['op']!r}")
    y = conv(x, w, **kw)
    dy = torch.randn_like(y)
    xg, wg = x.detach().requires_grad_(), w.detach().requires_grad_()

    def train():
        out = conv(xg, wg, **kw)
        out.backward(dy)

    return [
        ("forward", lambda: conv(x, w, **kw)),
        ("dX", lambda: torch.nn.grad.conv2d_input(x.shape, w, dy, **kw)),
        ("dW", lambda: torch.nn.grad.conv2d_weight(x, w.shape, dy, **kw)),
        ("forward+dX+dW", train),
    ]


def main(argv) -> int:
    import torch

    spec = json.loads(argv[0])
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    x, w = _tensors(spec)
    reps = int(spec.get("reps", 20))
    for name, fn in _passes(spec, x, w):
        t = time_gpu(fn, reps=reps)
        caller = time_caller(fn, reps=reps)
        wall = wall_per_call(fn)
        print(json.dumps({"pass": name, "ms": t.ms, "p25": t.p25, "p75": t.p75, "caller_ms": caller.ms,
                          "wall_ms": wall, "kernels": _kernels(fn)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
