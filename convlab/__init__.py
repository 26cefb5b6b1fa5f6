"""convlab: compile, run, check and time the course's CUDA kernels, on a GPU (PyCUDA) or, with
no GPU, on a CPU emulator that runs the very same .cu files.

    import convlab as cl
    mod = cl.load("kernels/02_naive/conv2d_naive.cu")
    conv = mod.kernel("conv2d_naive_flat")
    x, w = cl.randn(2, 3, 32, 32), cl.randn(8, 3, 5, 5)
    y = cl.empty(2, 8, 28, 28)                       # NaN until written
    conv(x, w, y, 2, 3, 8, 32, 32, 5, 0, 1, grid=25, block=256)   # ..., K, padding, stride
    cl.check(y, cl.ref.conv2d(x, w))

This file only hands names on, from the packages below it: convlab.gpu (the runtime: backend,
modules, kernels, launch settings; tensors; references and checks), convlab.measuring (cl.bench,
cl.profile, cl.sass, cl.trace) and convlab.display (cl.draw, book). docs/convlab-api.md lists everything.
"""
from __future__ import annotations

from .display import book
from .display.draw import draw
from .gpu import ref, runtime
from .gpu._errors import (ArgumentError, BackendUnavailable, BarrierError, CheckError, CompileError, ConvlabError,
                          KernelFault, KernelInterrupted, KernelTimeout, LaunchError, OutOfBoundsError,
                          ProfileUnavailable, RaceDetectorOff, RaceError, WarpMaskError)
from .gpu.check import CheckResult, check
from .gpu.runtime import (CpuFunction, CpuModule, DeviceInfo, Kernel, Module, backend, debug, default_timeout,
                          detect_races, device, find_race, launch_timeout, load, load_cpu, load_source, poisoning,
                          set_heap_size, set_timeout, sync, tensor_map, thread_order, time_limit)
from .gpu.tensors import empty, out_size, randn, seed, to_device, zeros
from .measuring.bench import Timing, bench
from .measuring.profile import ProfileCard, profile, profile_torch
from .measuring.sass import SassUnavailable, sass
from .measuring.trace import Trace, trace

__all__ = ["device", "backend", "load", "load_source", "load_cpu", "randn", "empty", "zeros", "to_device",
           "seed", "out_size", "tensor_map", "check", "bench", "sync", "ref", "thread_order", "set_timeout", "set_heap_size", "find_race", "debug",
           "poisoning", "detect_races", "time_limit", "RaceError", "RaceDetectorOff", "KernelInterrupted",
           "profile", "profile_torch", "sass", "trace", "draw", "Trace", "ProfileCard", "ProfileUnavailable", "SassUnavailable",
           "Timing", "CheckResult", "ConvlabError", "CompileError", "LaunchError", "ArgumentError",
           "KernelFault", "BarrierError", "WarpMaskError", "OutOfBoundsError", "KernelTimeout", "CheckError",
           "BackendUnavailable"]



def __getattr__(name):
    # cl.DEFAULT_TIMEOUT: the default cl.set_timeout last set, read when asked (a copy would go stale)
    if name == "DEFAULT_TIMEOUT":
        return runtime.default_timeout()
    raise AttributeError(f"module 'convlab' has no attribute {name!r}")
