"""The GPU backend: PyCUDA on the primary context, so torch and the kernels share one context
and torch tensors reach kernels without copies."""
from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

from ._errors import ArgumentError, BackendUnavailable, CompileError, LaunchError
from ._source import Source, map_compiler_output, rewrite_for_nvcc


def _why_not() -> str | None:
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


class CudaBackend:
    name = "cuda"
    device_type = "cuda"

    def __init__(self):
        why = _why_not()
        if why:
            raise BackendUnavailable(f"the cuda backend cannot run here: {why}")
        import torch
        torch.cuda.init()                     # torch first: both then use the device's primary context
        import pycuda.autoprimaryctx as apc  # noqa: F401 - retains and pushes the primary context
        import pycuda.driver as drv
        self.drv = drv
        self.dev = apc.device
        self.ctx = apc.context
        self.cc = self.dev.compute_capability()
        self.gpu_name = self.dev.name()
        attr = drv.device_attribute
        self.max_grid = (self.dev.get_attribute(attr.MAX_GRID_DIM_X), self.dev.get_attribute(attr.MAX_GRID_DIM_Y),
                         self.dev.get_attribute(attr.MAX_GRID_DIM_Z))
        self.max_shared_optin = self.dev.get_attribute(attr.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        self.threads = self.dev.get_attribute(attr.MULTIPROCESSOR_COUNT)
        self._threads = threading.local()

    @contextlib.contextmanager
    def context(self):
        """The primary context, current in this thread for the duration. torch runs autograd's
        backward on a thread of its own, where PyCUDA may find no context; and a thread that ends
        with a context still pushed aborts the process, so it is popped again."""
        if self.has_context():
            yield
            return
        self.ctx.push()
        try:
            yield
        finally:
            self.drv.Context.pop()

    def has_context(self) -> bool:
        """Whether this thread has a current context; asked of the driver once per thread that has
        one (torch's threads and ours never pop it), so a launch costs no driver query."""
        if getattr(self._threads, "current", False):
            return True
        if self.drv.Context.get_current() is None:
            return False
        self._threads.current = True
        return True

    def compile(self, src: Source, defines: dict, options: list[str]) -> "CudaModule":
        from pycuda.compiler import SourceModule

        from .book import repo_root
        text = f'#line 1 "{src.path}"\n' + rewrite_for_nvcc(src)
        opts = ["-std=c++17", "-lineinfo"]
        opts += [f"-D{k}" if v is None else f"-D{k}={v}" for k, v in defines.items()] + list(options)
        cache = Path(os.environ.get("CONVLAB_CACHE") or Path.home() / ".cache" / "convlab") / "cuda"
        cache.mkdir(parents=True, exist_ok=True)
        try:
            with self.context():
                mod = SourceModule(text, options=opts, include_dirs=[str(src.path.parent), str(repo_root() / "kernels")],
                                   no_extern_c=True, arch=f"sm_{self.cc[0]}{self.cc[1]}", cache_dir=str(cache))
        except Exception as e:   # pycuda.driver.CompileError carries nvcc's stderr
            err = getattr(e, "stderr", None) or str(e)
            raise CompileError(f"{src.path} does not compile (nvcc):\n" + map_compiler_output(err)) from None
        return CudaModule(self, mod, src)


class CudaModule:
    def __init__(self, backend, mod, src):
        self.backend, self.mod, self.src = backend, mod, src
        self._funcs = {}

    def _function(self, name):
        f = self._funcs.get(name)
        if f is None:
            with self.backend.context():
                f = self._funcs[name] = self.mod.get_function(name)
        return f

    def set_constant(self, name: str, data: bytes):
        with self.backend.context():
            self._set_constant(name, data)

    def _set_constant(self, name: str, data: bytes):
        try:
            ptr, size = self.mod.get_global(name)
        except Exception:   # noqa: BLE001 - pycuda raises LogicError for a missing symbol
            raise ArgumentError(f"__constant__ {name} is not in this build of {self.src.path.name}: is it "
                                f"inside an #if that the defines turned off?") from None
        if len(data) > size:
            raise ArgumentError(f"__constant__ {name} holds {size} bytes, but {len(data)} were given")
        self.backend.drv.memcpy_htod(ptr, data)

    def limits(self, name) -> dict:
        """The compiled kernel's attributes, read from the driver (once per Kernel: its plan keeps them)."""
        f = self._function(name)
        with self.backend.context():
            return dict(static_shared=f.shared_size_bytes, max_threads=f.max_threads_per_block,
                        registers=f.num_regs, max_grid=self.backend.max_grid)

    def launcher(self, name, params, ctypes):
        """launch(values, grid, block, shared) for one kernel: values are the checked arguments
        (tensors and Python numbers) in order; grid and block 3-tuples already within the limits.
        Pointers go as their addresses, half scalars as their 16 bits, everything else as it is,
        packed by PyCUDA's prepared call with the struct format worked out here once."""
        import numpy as np

        f = self._function(name)
        f.prepare("".join("P" if p.pointer else t.pycuda_code for p, t in zip(params, ctypes)))
        pointers = [i for i, p in enumerate(params) if p.pointer]
        halves = [i for i, p in enumerate(params) if not p.pointer and p.base == "half"]
        backend, call = self.backend, f.prepared_call
        opt_in = [48 * 1024]         # the dynamic shared memory this function may use now

        def launch(values, grid, block, shared):
            for i in pointers:
                values[i] = values[i].data_ptr()
            for i in halves:
                values[i] = int(np.float16(values[i]).view(np.uint16))
            if shared > opt_in[0]:
                if shared > backend.max_shared_optin:
                    raise LaunchError(f"{name}: {shared:,} bytes of shared memory is over this GPU's opt-in "
                                      f"maximum of {backend.max_shared_optin:,}")
                with backend.context():
                    f.set_attribute(backend.drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, shared)
                opt_in[0] = shared
            if backend.has_context():
                call(grid, block, *values, shared_size=shared)
            else:
                with backend.context():
                    call(grid, block, *values, shared_size=shared)

        return launch
