"""Runs one call that cl.profile wrote down, under ncu: once to warm up (compile, load, let cuDNN
choose), then once between cudaProfilerStart and cudaProfilerStop, which are the only kernels ncu
(started with --profile-from-start off) profiles. Prints nothing of its own: stdout is ncu's CSV."""
from __future__ import annotations

import sys

import torch

from ..gpu.runtime import load_source


def _to_device(v):
    if isinstance(v, tuple) and len(v) == 3 and v[0] == "__tensor__":
        return v[1].cuda() if v[2] else v[1]
    if isinstance(v, (list, tuple)):
        return type(v)(_to_device(a) for a in v)
    if isinstance(v, dict):
        return {k: _to_device(a) for k, a in v.items()}
    return v


def _callable(job):
    if job["kind"] == "call":
        return job["fn"]
    from pathlib import Path
    path = Path(job["path"])
    m = load_source(job["text"], name=path.name, defines=job["defines"], options=job["options"],
                    directory=path.parent)
    for name, data in job["constants"].items():
        m._impl.set_constant(name, data)
    return m.kernel(job["kernel"])


def prepare(job: dict):
    """The callable and its arguments, on the devices they were on in the notebook."""
    return _callable(job), _to_device(job["args"]), _to_device(job["kwargs"])


def configure(job: dict) -> None:
    """torch's settings for the profiled call: the notebook's cudnn.benchmark, and strict fp32 as
    the book times torch (TF32 would let cuDNN and cuBLAS round fp32 inputs to 10-bit mantissas and
    run other kernels than the timed ones; it has no effect on fp16 inputs)."""
    torch.backends.cudnn.benchmark = job["cudnn_benchmark"]
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def main(job_file: str) -> None:
    job = torch.load(job_file, weights_only=False)
    configure(job)
    fn, args, kwargs = prepare(job)
    fn(*args, **kwargs)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()     # cudaProfilerStart: ncu profiles from here ...
    fn(*args, **kwargs)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()      # ... to here


if __name__ == "__main__":
    main(sys.argv[1])
