"""The GPU backend: PyCUDA on the primary context, so torch and the kernels share one context
and torch tensors reach kernels without copies."""
from __future__ import annotations

import os
import contextlib
from pathlib import Path

from . import arch
from ._errors import BackendUnavailable, CompileError, LaunchError
from ._source import KERNELS_DIR, Source, map_compiler_output, rewrite_for_nvcc


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

    @contextlib.contextmanager
    def context(self):
        """The primary context, current in this thread for the duration. torch runs autograd's
        backward on a thread of its own, where PyCUDA finds no context; and a thread that ends
        with a context still pushed aborts the process, so it is popped again."""
        if self.drv.Context.get_current() is not None:
            yield
            return
        self.ctx.push()
        try:
            yield
        finally:
            self.drv.Context.pop()

    def describe(self) -> str:
        return f"{self.gpu_name} (compute capability {self.cc[0]}.{self.cc[1]}, {self.threads} SMs)"

    def compile(self, src: Source, defines: dict, options: list[str]) -> "CudaModule":
        too_old = arch.too_old(src.text, src.path, self.cc, self.gpu_name)
        if too_old:  # before nvcc, whose error would name an intrinsic, not the GPU
            raise CompileError(too_old)
        from pycuda.compiler import SourceModule
        text = f'#line 1 "{src.path}"\n' + rewrite_for_nvcc(src)
        opts = ["-std=c++17", "-lineinfo"]
        opts += [f"-D{k}" if v is None else f"-D{k}={v}" for k, v in defines.items()] + list(options)
        cache = Path(os.environ.get("CONVLAB_CACHE") or Path.home() / ".cache" / "convlab") / "cuda"
        cache.mkdir(parents=True, exist_ok=True)
        try:
            with self.context():
                mod = SourceModule(text, options=opts, include_dirs=[str(src.path.parent), str(KERNELS_DIR)],
                                   no_extern_c=True, arch=f"sm_{self.cc[0]}{self.cc[1]}", cache_dir=str(cache))
        except Exception as e:   # pycuda.driver.CompileError carries nvcc's stderr
            err = getattr(e, "stderr", None) or str(e)
            raise CompileError(f"{src.path} does not compile (nvcc):\n" + map_compiler_output(err)) from None
        return CudaModule(self, mod, src)


class CudaModule:
    def __init__(self, backend, mod, src):
        self.backend, self.mod, self.src = backend, mod, src
        self._funcs = {}
        self._limits = {}

    def _func(self, name, checked):
        f = self._funcs.get(name)
        if f is None:
            f = self.mod.get_function(name)
            f.prepare("".join("P" if p.pointer else t.pycuda_code for p, t, _ in checked))
            self._funcs[name] = f
        return f

    def set_constant(self, name: str, data: bytes):
        with self.backend.context():
            self._set_constant(name, data)

    def _set_constant(self, name: str, data: bytes):
        try:
            ptr, size = self.mod.get_global(name)
        except Exception:   # noqa: BLE001 - pycuda raises LogicError for a missing symbol
            from ._errors import ArgumentError
            raise ArgumentError(f"__constant__ {name} is not in this build of {self.src.path.name}: is it "
                                f"inside an #if that the defines turned off?") from None
        if len(data) > size:
            from ._errors import ArgumentError
            raise ArgumentError(f"__constant__ {name} holds {size} bytes, but {len(data)} were given")
        self.backend.drv.memcpy_htod(ptr, data)

    def limits(self, name, checked):
        """The compiled kernel's attributes, read from the driver once (they never change)."""
        lim = self._limits.get(name)
        if lim is None:
            with self.backend.context():
                f = self._func(name, checked)
                lim = dict(static_shared=f.shared_size_bytes, max_threads=f.max_threads_per_block,
                           registers=f.num_regs, max_grid=self.backend.max_grid)
            self._limits[name] = lim
        return dict(lim)

    def launch(self, name, checked, grid, block, shared, max_shared=None, **_emulator_only):
        with self.backend.context():
            self._launch(name, checked, grid, block, shared)

    def _launch(self, name, checked, grid, block, shared):
        import numpy as np
        f = self._func(name, checked)
        if shared > 48 * 1024:
            if shared > self.backend.max_shared_optin:
                raise LaunchError(f"{name}: {shared} bytes of shared memory is over this GPU's opt-in "
                                  f"maximum of {self.backend.max_shared_optin}")
            f.set_attribute(self.backend.drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, shared)
        vals = []
        for p, t, v in checked:
            if p.pointer:
                vals.append(np.uintp(v.data_ptr()))
            elif p.base == "half":
                vals.append(np.float16(v).view(np.uint16))
            else:
                vals.append(t.np_type(v))
        f.prepared_call(grid, block, *vals, shared_size=shared)
