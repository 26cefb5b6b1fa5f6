"""The GPU backend. PyCUDA compiles (nvcc, with its disk cache) and holds the device's primary
context, which torch shares, so torch tensors reach kernels without copies. Modules are loaded and
kernels launched through the CUDA driver itself (libcuda, by ctypes): cuLaunchKernel takes torch's
current stream, so our kernels run in order with the caller's torch work on whatever stream it
uses (PyCUDA only launches on its own stream objects, or the legacy default stream), and a launch
costs one struct pack into a buffer kept for it and one foreign call."""
from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import struct
import threading
from pathlib import Path

from . import arch, native
from ._args import ctype_of
from ._errors import ArgumentError, BackendUnavailable, CompileError, LaunchError
from ._limits import SHARED_DEFAULT_MAX
from ._paths import repo_root
from ._source import Source, map_compiler_output, rewrite_for_nvcc


def why_not() -> str | None:
    """None when PyCUDA can drive a GPU here, else why not, in words."""
    try:
        import pycuda.driver as drv
    except Exception as e:   # noqa: BLE001 - any import failure means no GPU backend
        return f"PyCUDA cannot be imported ({e}); install it with `pip install -e .[gpu]`"
    try:
        drv.init()
    except Exception as e:   # noqa: BLE001
        return f"the CUDA driver cannot be initialised ({e}): is there an NVIDIA driver on this machine?"
    if drv.Device.count() == 0:
        return "the CUDA driver sees no GPU"
    return None


# CUfunction_attribute values (cuda.h)
_MAX_THREADS_PER_BLOCK, _SHARED_SIZE_BYTES, _NUM_REGS, _MAX_DYNAMIC_SHARED_SIZE_BYTES = 0, 1, 4, 8
_NOT_FOUND = 500          # CUDA_ERROR_NOT_FOUND: no such symbol in the module


class Driver:
    """The CUDA driver calls convlab makes itself. libcuda is opened as a PyDLL, whose calls keep
    the GIL: a launch's argument buffer cannot change under cuLaunchKernel. `launch(function, gx,
    gy, gz, bx, by, bz, shared, stream, params)`, all Python ints (params: the address of the void*
    array), is cuLaunchKernel called from convlab.gpu.native's C extension, one C call (through ctypes
    where it cannot be built)."""

    def __init__(self, lib=None):
        if lib is None:
            lib = _open_libcuda()
        self.lib = lib
        P, U, I, S = ctypes.c_void_p, ctypes.c_uint, ctypes.c_int, ctypes.c_size_t  # noqa: E741
        sig = {"cuModuleLoadData": [ctypes.POINTER(P), ctypes.c_char_p],
               "cuModuleGetFunction": [ctypes.POINTER(P), P, ctypes.c_char_p],
               "cuModuleGetGlobal_v2": [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(S), P, ctypes.c_char_p],
               "cuMemcpyHtoDAsync_v2": [ctypes.c_uint64, ctypes.c_char_p, S, P],
               "cuMemcpyDtoDAsync_v2": [ctypes.c_uint64, ctypes.c_uint64, S, P],
               "cuFuncGetAttribute": [ctypes.POINTER(I), I, P],
               "cuFuncSetAttribute": [P, I, I],
               "cuTensorMapEncodeTiled": [P, I, U, P, ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64),
                                          ctypes.POINTER(U), ctypes.POINTER(U), I, I, I, I],
               "cuGetErrorName": [U, ctypes.POINTER(ctypes.c_char_p)],
               "cuGetErrorString": [U, ctypes.POINTER(ctypes.c_char_p)]}
        for name, argtypes in sig.items():
            f = getattr(lib, name)
            f.argtypes, f.restype = argtypes, I
        lib.cuLaunchKernel.restype = I
        fast = native.fast_launch()
        address = ctypes.cast(lib.cuLaunchKernel, ctypes.c_void_p).value
        self.launch = functools.partial(fast, address) if fast else self._ctypes_launch

    def _ctypes_launch(self, func, gx, gy, gz, bx, by, bz, shared, stream, params):
        """cuLaunchKernel through ctypes (where convlab.gpu.native cannot be built), with the same int arguments."""
        U, P = ctypes.c_uint, ctypes.c_void_p
        return self.lib.cuLaunchKernel(P(func), U(gx), U(gy), U(gz), U(bx), U(by), U(bz), U(shared), P(stream),
                                       P(params), None)

    def describe(self, err: int) -> str:
        name, text = ctypes.c_char_p(), ctypes.c_char_p()
        self.lib.cuGetErrorName(err, ctypes.byref(name))
        self.lib.cuGetErrorString(err, ctypes.byref(text))
        return f"{(name.value or b'CUDA error').decode()} ({err}): {(text.value or b'').decode()}"

    def _call(self, what: str, f, *args, error=LaunchError):
        err = f(*args)
        if err:
            raise error(f"{what}: {self.describe(err)}")

    def load_module(self, image: bytes, what: str) -> int:
        m = ctypes.c_void_p()
        self._call(f"loading {what}", self.lib.cuModuleLoadData, ctypes.byref(m), image, error=CompileError)
        return m.value

    def function(self, module: int, name: str) -> int:
        f = ctypes.c_void_p()
        self._call(f"finding the kernel {name}", self.lib.cuModuleGetFunction, ctypes.byref(f), module, name.encode())
        return f.value

    def global_(self, module: int, name: str):
        """(address, bytes) of a __constant__ or __device__ variable; None when there is none."""
        ptr, size = ctypes.c_uint64(), ctypes.c_size_t()
        err = self.lib.cuModuleGetGlobal_v2(ctypes.byref(ptr), ctypes.byref(size), module, name.encode())
        if err == _NOT_FOUND:
            return None
        if err:
            raise LaunchError(f"finding the __constant__ {name}: {self.describe(err)}")
        return ptr.value, size.value

    def copy_to_device(self, address: int, data: bytes, stream: int):
        """Stream-ordered: after the kernels already queued on `stream`, before the next ones (the
        driver stages pageable memory at once, so `data` may go when this returns)."""
        self._call("copying to __constant__ memory", self.lib.cuMemcpyHtoDAsync_v2, address, data, len(data), stream)

    def copy_on_device(self, address: int, source: int, nbytes: int, stream: int):
        """Stream-ordered copy of nbytes from device memory at source to address."""
        self._call("copying to __constant__ memory", self.lib.cuMemcpyDtoDAsync_v2, address, source, nbytes, stream)

    def encode_tensor_map(self, dtype: int, address: int, dims, strides, box, swizzle: int,
                          element_strides=None) -> bytes:
        """cuTensorMapEncodeTiled's 128 bytes: a tiled map, element strides as given (innermost
        first; None: 1), no interleave, the swizzle (CUtensorMapSwizzle: 0 none, 1 32B, 2 64B, 3
        128B), L2 promotion of 256 bytes, zeros outside the tensor."""
        out = (ctypes.c_uint64 * 16)()
        rank = len(dims)
        U64, U32 = ctypes.c_uint64, ctypes.c_uint
        self._call("encoding a tensor map", self.lib.cuTensorMapEncodeTiled, ctypes.byref(out), dtype, rank, address,
                   (U64 * rank)(*dims), (U64 * max(rank - 1, 1))(*strides), (U32 * rank)(*box),
                   (U32 * rank)(*(element_strides or [1] * rank)), 0, swizzle, 3, 0, error=ArgumentError)
        return bytes(out)

    def make_current(self, context: int):
        """Makes `context` current in the calling thread unless one already is (cuCtxSetCurrent)."""
        c = ctypes.c_void_p()
        self._call("asking for the current context", self.lib.cuCtxGetCurrent, ctypes.byref(c))
        if not c.value:
            self._call("making the context current", self.lib.cuCtxSetCurrent, ctypes.c_void_p(context))

    def attribute(self, func: int, attr: int) -> int:
        v = ctypes.c_int()
        self._call("reading a kernel attribute", self.lib.cuFuncGetAttribute, ctypes.byref(v), attr, func)
        return v.value

    def set_attribute(self, func: int, attr: int, value: int):
        self._call("setting a kernel attribute", self.lib.cuFuncSetAttribute, func, attr, value)


def _open_libcuda():
    import ctypes.util

    for name in ("libcuda.so.1", ctypes.util.find_library("cuda"), "nvcuda.dll"):
        if name:
            try:
                return ctypes.PyDLL(name)
            except OSError:
                continue
    raise BackendUnavailable("the cuda backend cannot run here: the CUDA driver library (libcuda) cannot be opened")


def current_stream_getter(device_index: int):
    """A function returning torch's current CUDA stream (a handle) for the device, in the calling
    thread. torch._C._cuda_getCurrentRawStream is the call torch's compiler uses for this (one
    C call); torch.cuda.current_stream() builds a Stream object on each call."""
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return functools.partial(raw, device_index)
    return lambda: torch.cuda.current_stream(device_index).cuda_stream


class CudaBackend:
    name = "cuda"
    device_type = "cuda"

    def __init__(self):
        why = why_not()
        if why:
            raise BackendUnavailable(f"the cuda backend cannot run here: {why}")
        import torch
        torch.cuda.init()                     # torch first: both then use the device's primary context
        import pycuda.autoprimaryctx as apc  # noqa: F401 - retains and pushes the primary context
        import pycuda.driver as drv
        self.drv = drv
        self.dev = apc.device
        self.ctx = apc.context
        self.cu = Driver()
        self.device_index = torch.cuda.current_device()
        self.raw_stream = current_stream_getter(self.device_index)
        self._streams = {}
        self.cc = self.dev.compute_capability()
        self.gpu_name = self.dev.name()
        attr = drv.device_attribute
        self.max_grid = (self.dev.get_attribute(attr.MAX_GRID_DIM_X), self.dev.get_attribute(attr.MAX_GRID_DIM_Y),
                         self.dev.get_attribute(attr.MAX_GRID_DIM_Z))
        self.max_shared_optin = self.dev.get_attribute(attr.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        self.threads = self.dev.get_attribute(attr.MULTIPROCESSOR_COUNT)
        self._threads = threading.local()

    def encode_tensor_map(self, dtype, address, dims, strides, box, swizzle, element_strides=None) -> bytes:
        # a driver call like a launch: autograd's backward thread may have no context current yet
        self.has_context()
        return self.cu.encode_tensor_map(dtype, address, dims, strides, box, swizzle, element_strides)

    def set_heap_size(self, nbytes: int):
        """cudaLimitMallocHeapSize: the device heap of malloc and new in device code."""
        with self.context():
            self.drv.Context.set_limit(self.drv.limit.MALLOC_HEAP_SIZE, nbytes)

    def record(self, fn):
        """(fn()'s result, the Recording of what it did on the GPU from this thread), or (fn()'s
        result, None) while another call is being recorded."""
        global _recording
        if not _record_lock.acquire(blocking=False):
            return fn(), None
        rec = _recording = Recording()
        try:
            return fn(), rec
        finally:
            _recording = None
            _record_lock.release()

    def driver_functions(self) -> tuple:
        """The addresses of cuLaunchKernel, cuMemcpyDtoDAsync and cuTensorMapEncodeTiled (what a
        convlab.gpu.native Route calls)."""
        lib = self.cu.lib
        return tuple(ctypes.cast(getattr(lib, n), ctypes.c_void_p).value
                     for n in ("cuLaunchKernel", "cuMemcpyDtoDAsync_v2", "cuTensorMapEncodeTiled"))

    def stream(self) -> ctypes.c_void_p:
        """torch's current stream in this thread, as the ctypes object cuLaunchKernel takes."""
        h = self.raw_stream()
        s = self._streams.get(h)
        if s is None:
            if len(self._streams) > 256:     # streams made and dropped in a loop: keep the table small
                self._streams.clear()
            s = self._streams[h] = ctypes.c_void_p(h)
        return s

    @contextlib.contextmanager
    def context(self):
        """The primary context, current in this thread for the duration (and after: see has_context)."""
        self.has_context()
        yield

    def has_context(self) -> bool:
        """Makes the primary context current in this thread when none is, and says True. torch runs
        autograd's backward on a thread of its own, which may have none; the driver's own
        cuCtxSetCurrent makes it current there for good, outside PyCUDA's context stack (a thread
        that ends with a context on that stack aborts the process). Asked of the driver once per
        thread, so a launch costs no driver query."""
        if getattr(self._threads, "current", False):
            return True
        self.cu.make_current(self.ctx.handle)
        self._threads.current = True
        return True

    def compile(self, src: Source, defines: dict, options: list[str]) -> "CudaModule":
        too_old = arch.too_old(src.text, src.path, self.cc, self.gpu_name)
        if too_old:  # before nvcc, whose error would name an intrinsic, not the GPU
            raise CompileError(too_old)
        from pycuda.compiler import compile as nvcc

        text = f'#line 1 "{src.path}"\n' + rewrite_for_nvcc(src)
        opts = ["-std=c++17", "-lineinfo"]
        opts += [f"-D{k}" if v is None else f"-D{k}={v}" for k, v in defines.items()] + list(options)
        cache = Path(os.environ.get("CONVLAB_CACHE") or Path.home() / ".cache" / "convlab") / "cuda"
        cache.mkdir(parents=True, exist_ok=True)
        try:
            # an "a" target (sm_90a: wgmma, setmaxnreg) as -arch compute_90a -code sm_90a: the -arch sm_90a
            # shorthand also runs a plain sm_90 pass that rejects those instructions
            arch_only = arch.required_suffix(src.text)
            target = f"{self.cc[0]}{self.cc[1]}{arch_only}"
            with _compiling(cache, text, opts, target):
                cubin = nvcc(text, options=opts, include_dirs=[str(src.path.parent), str(repo_root() / "kernels")],
                             no_extern_c=True, arch=f"compute_{target}" if arch_only else f"sm_{target}",
                             code=f"sm_{target}" if arch_only else None, cache_dir=str(cache))
        except Exception as e:   # pycuda.driver.CompileError carries nvcc's stderr
            err = getattr(e, "stderr", None) or str(e)
            raise CompileError(f"{src.path} does not compile (nvcc):\n" + map_compiler_output(err)) from None
        with self.context():
            return CudaModule(self, self.cu.load_module(cubin, src.path.name), src)


@contextlib.contextmanager
def _compiling(cache: Path, text: str, options: list, target: str):
    """Held while one process compiles (or reads from PyCUDA's disk cache) this source for this
    target: PyCUDA writes a cached cubin in place, so a second process compiling the same kernel at
    once (benchmarks' parallel workers) would otherwise read it half written."""
    import fcntl
    import hashlib

    key = hashlib.sha256("\0".join([text, target, *options]).encode()).hexdigest()[:32]
    with open(cache / f"{key}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class CudaModule:
    def __init__(self, backend, handle: int, src):
        self.backend, self.handle, self.src = backend, handle, src
        self._funcs = {}
        self._globals = {}        # __constant__ name -> (device address, bytes)

    def _function(self, name) -> int:
        f = self._funcs.get(name)
        if f is None:
            with self.backend.context():
                f = self._funcs[name] = self.backend.cu.function(self.handle, name)
        return f

    def _global(self, name: str, nbytes: int) -> int:
        """The device address of the __constant__ `name`, checked to hold nbytes (looked up once)."""
        found = self._globals.get(name)
        if found is None:
            with self.backend.context():
                found = self.backend.cu.global_(self.handle, name)
            if found is None:
                raise ArgumentError(f"__constant__ {name} is not in this build of {self.src.path.name}: is it "
                                    f"inside an #if that the defines turned off?")
            self._globals[name] = found
        ptr, size = found
        if nbytes > size:
            raise ArgumentError(f"__constant__ {name} holds {size} bytes, but {nbytes} were given")
        return ptr

    def set_constant(self, name: str, data: bytes):
        b = self.backend
        ptr = self._global(name, len(data))
        rec = _recording
        if rec is not None and rec.mine():
            rec.why = f"__constant__ {name} is filled from the host"
        with b.context():
            b.cu.copy_to_device(ptr, data, b.stream())     # in order with the kernels on the current stream

    def set_constant_from_device(self, name: str, source: int, nbytes: int):
        """The same from device memory: a copy queued on the current stream, nothing waits."""
        b = self.backend
        ptr = self._global(name, nbytes)
        b.has_context()
        rec = _recording
        if rec is not None and rec.mine():
            rec.steps.append(("copy", ptr, source, nbytes))
        b.cu.copy_on_device(ptr, source, nbytes, b.stream())

    def limits(self, name) -> dict:
        """The compiled kernel's attributes, read from the driver (once per Kernel: its plan keeps them)."""
        f, cu = self._function(name), self.backend.cu
        with self.backend.context():
            return dict(static_shared=cu.attribute(f, _SHARED_SIZE_BYTES),
                        max_threads=cu.attribute(f, _MAX_THREADS_PER_BLOCK),
                        registers=cu.attribute(f, _NUM_REGS), max_grid=self.backend.max_grid)

    def launcher(self, name, params, ctypes_) -> "KernelLauncher":
        return KernelLauncher(self.backend, name, self._function(name), params, ctypes_)


class Recording:
    """What one call did on the GPU, in order (CudaBackend.record): each launch as ("launch",
    function, its grid, block and shared bytes, its argument buffer as packed, each argument's offset
    in it, the pointer arguments as (offset, tensor), the tensor-map arguments as (offset,
    TensorMap)); each copy into __constant__ memory as ("copy", to, from (an address), bytes); and
    why the call cannot be launched again from these alone (`why`: a __constant__ filled from the
    host), else None."""

    def __init__(self):
        self.thread, self.steps, self.why = threading.get_ident(), [], None

    def mine(self) -> bool:
        return threading.get_ident() == self.thread


#: The Recording of the call being recorded (CudaBackend.record), or None; only its thread's
#: launches go into it
_recording = None
_record_lock = threading.Lock()


def _half_bits(v) -> int:
    """A half scalar as the kernel reads it: its 16 bits (numpy rounds, and overflows to inf, as a GPU does)."""
    import numpy as np

    return int(np.float16(v).view(np.uint16))


class _Slots(threading.local):
    """One thread's argument buffer for one kernel: a slot per argument (8 bytes; a tensor map's
    128, 64-byte aligned), and the void** array of their addresses that cuLaunchKernel reads. Per
    thread, because packing and launching are two steps between which another thread may run."""

    def __init__(self, offsets: list, size: int, init: bytes):
        self.raw = ctypes.create_string_buffer(init.ljust(size + 64, b"\0"), size + 64)
        base = ctypes.addressof(self.raw)
        self.at = (-base) % 64                   # a tensor map's slot must be 64-byte aligned
        ctypes.memmove(base + self.at, init, len(init))
        self.buf = (ctypes.c_char * size).from_buffer(self.raw, self.at)
        n = len(offsets)
        self.params = (ctypes.c_void_p * max(n, 1))(*[base + self.at + o for o in offsets])
        self.address = ctypes.addressof(self.params)


def _dims(grid, block, shared) -> tuple:
    return (*grid, *block, shared)


class KernelLauncher:
    """One kernel's launches: launcher(values, grid, block, shared) with the checked arguments
    (tensors and Python numbers, in order; _args.ArgPlan) and a 3-tuple grid and block within the
    limits; bind() a launch whose scalars, grid and block are fixed. Pointers go as their
    addresses, half scalars as their 16 bits, everything else as struct packs it, each argument in
    an 8-byte slot (all scalar types are at most 8 bytes; the driver reads each one's own size)."""

    def __init__(self, backend, name: str, func: int, params, ctypes_):
        self.backend, self.name, self.func_id = backend, name, func
        codes, self.offsets, at = [], [], 0
        for p, t in zip(params, ctypes_):
            if p.pointer:
                code, size, slot = "Q", 8, 8
            elif t.kind == "m":
                pad = (-at) % 64
                if pad:
                    codes.append(f"{pad}x")
                    at += pad
                code, size, slot = t.code, 128, 128
            else:
                code, size, slot = t.code, ctypes.sizeof(t.ctype), 8
            codes.append(code + (f"{slot - size}x" if size < slot else ""))
            self.offsets.append(at)
            at += slot
        self.n = len(params)
        self.struct = struct.Struct("=" + "".join(codes))
        self.pointers = [i for i, p in enumerate(params) if p.pointer]
        self.halves = [i for i, p in enumerate(params) if not p.pointer and p.base == "half"]
        self.maps = [i for i, t in enumerate(ctypes_) if t.kind == "m"]
        self.params = params
        self.slots = _Slots(self.offsets, self.struct.size, bytes(self.struct.size))
        self.opt_in = SHARED_DEFAULT_MAX      # the dynamic shared memory this function may use now


    def __call__(self, values, grid, block, shared):
        rec = _recording
        if rec is not None and rec.mine():
            maps = [(self.offsets[i], values[i]) for i in self.maps]
            pointers = [(self.offsets[i], values[i]) for i in self.pointers]
        else:
            maps = None
        values = list(values)
        for i in self.pointers:
            values[i] = values[i].data_ptr()
        for i in self.halves:
            values[i] = _half_bits(values[i])
        for i in self.maps:
            values[i] = values[i].encoded
        if shared > self.opt_in:
            self.allow_shared(shared)
        slots = self.slots
        self.struct.pack_into(slots.buf, 0, *values)
        if maps is not None:
            rec.steps.append(("launch", self.func_id, _dims(grid, block, shared), bytes(slots.buf), tuple(self.offsets),
                              pointers, maps))
        b = self.backend
        b.has_context()
        err = b.cu.launch(self.func_id, *grid, *block, shared, b.raw_stream(), slots.address)
        if err:
            self.fail(err, _dims(grid, block, shared))

    def fail(self, err: int, dims):
        g, bl = dims[:3], dims[3:6]
        raise LaunchError(f"{self.name} (grid {g}, block {bl}, {dims[6]:,} bytes of dynamic shared memory) "
                          f"did not launch: {self.backend.cu.describe(err)}. An error from an earlier kernel "
                          f"(an illegal address, say) shows at the next launch and leaves the GPU unusable "
                          f"until the Python process restarts.")

    def allow_shared(self, shared: int):
        b = self.backend
        if shared > b.max_shared_optin:
            raise LaunchError(f"{self.name}: {shared:,} bytes of shared memory is over this GPU's opt-in "
                              f"maximum of {b.max_shared_optin:,}")
        with b.context():
            b.cu.set_attribute(self.func_id, _MAX_DYNAMIC_SHARED_SIZE_BYTES, shared)
        self.opt_in = shared

    def bind(self, scalars: tuple, grid: tuple, block: tuple, shared: int, slow) -> "BoundLaunch":
        return BoundLaunch(self, scalars, grid, block, shared, slow)


class BoundLaunch:
    """A launch with its scalar arguments, grid, block and shared memory fixed, after a first call
    through the full checks (a launcher's kept Launch): bound(tensors) checks each tensor against
    its parameter (on the GPU, an accepted dtype, contiguous), writes the addresses into the buffer
    whose scalars were packed once, and launches. Anything else goes to slow(tensors): the full
    checks, which say what is wrong."""

    __slots__ = ("launcher", "n", "dtypes", "pack", "slots", "dims", "slow", "backend")

    def __init__(self, launcher: KernelLauncher, scalars, grid, block, shared, slow):
        import torch

        n = launcher.n - len(scalars)         # the pointers come first (Kernel.bind sees to it)
        everything = tuple(v for v in vars(torch).values() if isinstance(v, torch.dtype))
        self.dtypes = tuple(ctype_of(p, launcher.name).dtypes or everything for p in launcher.params[:n])
        values = [0] * n + list(scalars)
        for i in launcher.halves:
            values[i] = _half_bits(values[i])
        self.launcher, self.n, self.slow = launcher, n, slow
        for i in launcher.maps:
            values[i] = values[i].encoded
        self.pack = struct.Struct("=" + "Q" * n).pack_into
        self.slots = _Slots(launcher.offsets, launcher.struct.size, launcher.struct.pack(*values))
        if shared > launcher.opt_in:
            launcher.allow_shared(shared)
        self.dims = _dims(grid, block, shared)
        self.backend = launcher.backend

    def __call__(self, tensors: tuple):
        if len(tensors) != self.n:
            return self.slow(tensors)
        try:
            for t, dtypes in zip(tensors, self.dtypes):
                if not (t.is_cuda and t.dtype in dtypes and t.is_contiguous()):
                    return self.slow(tensors)
            ptrs = [t.data_ptr() for t in tensors]
        except AttributeError:                       # not a tensor
            return self.slow(tensors)
        slots = self.slots
        self.pack(slots.buf, 0, *ptrs)
        rec = _recording
        if rec is not None and rec.mine():
            offsets = self.launcher.offsets
            rec.steps.append(("launch", self.launcher.func_id, self.dims, bytes(slots.buf), tuple(offsets),
                              list(zip(offsets, tensors)), []))
        b = self.backend
        b.has_context()
        err = b.cu.launch(self.launcher.func_id, *self.dims, b.raw_stream(), slots.address)
        if err:
            self.launcher.fail(err, self.dims)
