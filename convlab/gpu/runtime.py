"""The runtime: which backend runs the kernels, compiled modules and their kernels (each with its
launch plan), the settings launches run under (thread order, race detector, time limit, poisoned
outputs), and find_race. convlab's front (``import convlab as cl``) hands these names on.

Below it: the backends (convlab.gpu.emu, convlab.gpu.backend_cuda), the source reader (convlab.gpu._source)
and the argument checks (convlab.gpu._args). Above it: everything that launches (bench, profile,
trace, the launchers in convlab.ops, the chapters).
"""
from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from . import _args, _limits, _source, backend_cuda, emu
from ._errors import ArgumentError, BackendUnavailable, LaunchError, RaceError
from ._paths import repo_root
from ._tensor_map import SWIZZLES, TensorMap

_backend = None
_lock = threading.Lock()
_settings = threading.local()
_TIMEOUT_S = 10.0
_default_timeout = _TIMEOUT_S   # emulator: exercise-size launches take well under a second


def backend_impl():
    """The backend object itself (convlab.gpu.emu.EmuBackend or convlab.gpu.backend_cuda.CudaBackend),
    chosen on first use: CONVLAB_BACKEND=emu|cuda, else the GPU when PyCUDA finds one."""
    global _backend
    if _backend is not None:
        return _backend
    with _lock:
        if _backend is None:
            want = os.environ.get("CONVLAB_BACKEND", "").strip().lower()
            if want not in ("", "emu", "cuda"):
                raise BackendUnavailable(f"CONVLAB_BACKEND={want!r}: use 'emu' or 'cuda' (or leave it unset)")
            if want == "cuda":
                _backend = backend_cuda.CudaBackend()     # raises with the reason when it cannot work
            elif want == "emu":
                _backend = emu.EmuBackend()
            elif backend_cuda.why_not() is None and torch.cuda.is_available():
                _backend = backend_cuda.CudaBackend()
            else:
                _backend = emu.EmuBackend()
        return _backend


@dataclass(frozen=True)
class DeviceInfo:
    backend: str            # "cuda" or "emu"
    name: str               # the GPU's name, or "CPU emulator"
    cc: tuple | None        # compute capability on a GPU
    threads: int            # SMs on a GPU, OS threads on the emulator
    torch_device: str       # where cl.randn & co put tensors: "cuda" or "cpu"

    def __str__(self):
        if self.backend == "cuda":
            return f"cuda: {self.name} (compute capability {self.cc[0]}.{self.cc[1]}, {self.threads} SMs)"
        return f"emu: CPU emulator, {self.threads} threads (timings here are not GPU timings)"

    @property
    def is_gpu(self) -> bool:
        return self.backend == "cuda"


def device() -> DeviceInfo:
    """Which backend runs the kernels, and on what."""
    b = backend_impl()
    if b.name == "cuda":
        return DeviceInfo("cuda", b.gpu_name, b.cc, b.threads, "cuda")
    return DeviceInfo("emu", "CPU emulator", None, b.threads, "cpu")


def backend() -> str:
    """The active backend's name: "cuda" or "emu"."""
    return backend_impl().name


# ---------------------------------------------------------------------------------------------
# Modules and kernels

def resolve_path(path) -> Path:
    """A kernel file's absolute path: relative paths from the working directory, else the
    repository root; FileNotFoundError naming both when it is in neither."""
    p = Path(path)
    if not p.is_absolute():
        root = repo_root()
        for base in (Path.cwd(), root):
            if (base / p).exists():
                return (base / p).resolve()
        raise FileNotFoundError(f"no kernel file {path} (looked in {Path.cwd()} and {root})")
    if not p.exists():
        raise FileNotFoundError(f"no kernel file {p}")
    return p


# The one module cache: keyed by the source text (and defines, options, backend), so an edited file
# compiles again and going back to an earlier text finds its module again.
_modules: dict = {}


def clear_module_cache():
    """Forget the compiled modules held in memory (the compilers' caches on disk stay)."""
    _modules.clear()


def load(path, defines: dict | None = None, options: list | None = None) -> "Module":
    """Compile a .cu file on the active backend (cached by content) and return its Module."""
    p = resolve_path(path)
    return _load_text(p.read_text(), p, defines, options)


def load_source(text: str, name: str = "cell", defines: dict | None = None, options: list | None = None,
                directory=None) -> "Module":
    """Compile CUDA source given as a string (the %%cuda magic uses this). Messages name `name`."""
    directory = Path(directory) if directory else Path.cwd()
    p = directory / (name if name.endswith(".cu") else f"{name}.cu")
    return _load_text(text, p, defines, options)


def _load_text(text, p: Path, defines, options) -> "Module":
    defines = dict(defines or {})
    options = list(options or [])
    b = backend_impl()
    key = (b.name, str(p), text, tuple(sorted((k, str(v)) for k, v in defines.items())), tuple(options))
    m = _modules.get(key)
    if m is None:
        src = _source.parse(text, p, [repo_root() / "kernels"])
        m = Module(b.compile(src, defines, options), src, defines, options)
        _modules[key] = m
    return m


class Module:
    """A compiled kernel file: its kernels by name and its __constant__ memory."""

    def __init__(self, impl, src, defines, options=()):
        self._impl, self.src, self.defines, self.options = impl, src, defines, list(options)
        self.path = src.path
        self._kernels = {}
        self.constants_set = {}       # name -> bytes (or the device tensor), so cl.profile can repeat a launch elsewhere
        self._device_fills = set()    # (name, dtype) filled from device memory once: checked

    @property
    def race_checked(self) -> bool:
        """Whether the emulator's race detector can run this file's kernels (False after a
        cl.RaceDetectorOff warning); the GPU has no race detector, so False there too."""
        return bool(getattr(self._impl, "can_detect", False))

    @property
    def kernels(self) -> list[str]:
        return list(self.src.kernels)

    def kernel(self, name: str) -> "Kernel":
        """The kernel `name`: the same Kernel object on every call, so its launch plan is kept."""
        k = self._kernels.get(name)
        if k is None:
            if name not in self.src.kernels:
                have = ", ".join(self.src.kernels) or "none"
                raise ArgumentError(f"{self.path.name} has no __global__ function `{name}` (it has: {have})")
            k = self._kernels[name] = Kernel(self, name)
        return k

    def __getattr__(self, name):
        if name.startswith("_") or name not in self.__dict__.get("src").kernels:
            raise AttributeError(name)
        return self.kernel(name)

    def set_constant(self, name: str, value):
        """Fill a __constant__ array (a tensor or numpy array on any device) by name."""
        t = value
        if not (type(t) is torch.Tensor and t.is_cuda and (name, t.dtype) in self._device_fills
                and t.is_contiguous()):             # checked before: the copy alone (a launcher's mask, each launch)
            t = self._checked_constant(name, value)
        if t.is_cuda and hasattr(self._impl, "set_constant_from_device"):
            # a copy on the GPU, in order with the kernels on the stream: no round trip through the host
            self._impl.set_constant_from_device(name, t.data_ptr(), t.numel() * t.element_size())
            self.constants_set[name] = t      # cl.profile reads its values when it replays a launch
            self._device_fills.add((name, t.dtype))
            return
        data = t.cpu().numpy().tobytes()
        self._impl.set_constant(name, data)
        self.constants_set[name] = data

    def _checked_constant(self, name: str, value) -> torch.Tensor:
        """value as a contiguous tensor for the __constant__ `name`, or ArgumentError saying why not."""
        if name not in self.src.constants:
            have = ", ".join(self.src.constants) or "none"
            raise ArgumentError(f"{self.path.name} has no __constant__ `{name}` (it has: {have})")
        want = self.src.constants[name]
        t = (value if isinstance(value, torch.Tensor) else torch.as_tensor(value)).detach()
        need = _args.TYPES.get(_source.TYPE_ALIASES.get(want, want))
        if need is not None and need.dtypes and t.dtype not in need.dtypes:
            raise ArgumentError(f"__constant__ {want} {name} needs {need.dtypes[0]} values, got {t.dtype}")
        return t.contiguous()

    def __repr__(self):
        return f"<convlab.Module {self.path.name}: {', '.join(self.kernels)} on {backend()}>"


# ---------------------------------------------------------------------------------------------
# The settings launches run under (per thread where a context sets them)

def _setting(name, default):
    return getattr(_settings, name, default)


@contextlib.contextmanager
def thread_order(order: str):
    """Run the threads of each block in another order on the emulator: 'forward', 'reverse' or
    'shuffled'. A kernel whose result changes with the order has a race. No effect on a GPU."""
    if order not in ("forward", "reverse", "shuffled"):
        raise ValueError("order must be 'forward', 'reverse' or 'shuffled'")
    old = _setting("order", "forward")
    _settings.order = order
    try:
        yield
    finally:
        _settings.order = old


@contextlib.contextmanager
def detect_races(on: bool = True):
    """Run the emulator's race detector on every launch inside (on=True), or on none (False).
    Outside, it runs by itself on launches of at most 16,384 threads. No effect on a GPU."""
    old = emu.detect_setting()
    emu.set_detect(bool(on))
    try:
        yield
    finally:
        emu.set_detect(old)


def set_heap_size(nbytes: int):
    """The device heap that malloc and new in device code allocate from, in bytes (a GPU's
    cudaLimitMallocHeapSize, 8 MB unless raised): on a GPU, set it before the kernels that use the
    heap run; the emulator refuses a change while blocks are allocated."""
    backend_impl().set_heap_size(int(nbytes))


def set_timeout(seconds: float):
    """How long an emulator launch may go without any CUDA thread finishing before the watchdog
    stops it as stuck (default 10 s). A launch that keeps finishing threads runs to its end,
    however long; cl.time_limit sets a total limit on top (the exercise checks use 5 s, while
    this default stands)."""
    global _default_timeout
    _default_timeout = float(seconds)


def default_timeout() -> float:
    """How long an emulator launch may go without a CUDA thread finishing, as cl.set_timeout last
    set it (10 s to begin with)."""
    return _default_timeout


@contextlib.contextmanager
def time_limit(seconds: float):
    """A total time limit for the emulator launches inside (however well they progress), unless
    cl.set_timeout changed the default."""
    old = _setting("timeout", None)
    _settings.timeout = seconds
    try:
        yield
    finally:
        _settings.timeout = old


def launch_timeout() -> float:
    """How long an emulator launch may go without a CUDA thread finishing now (cl.set_timeout's)."""
    return _default_timeout


def total_limit() -> float | None:
    """The total time an emulator launch may run now: cl.time_limit's inside one, unless
    cl.set_timeout changed the default; None (as long as it progresses) elsewhere."""
    return _setting("timeout", None) if _default_timeout == _TIMEOUT_S else None


#: Whether cl.debug is on (what poisoning() reads; the drop-in keys its kept routes by it too)
debugging = False


class debug:
    """Poison the outputs that launchers allocate with NaN, so an output a kernel never writes
    shows in cl.check: `cl.debug(True)` from now on (`cl.debug(False)` back off), or
    `with cl.debug(): ...` for a block. The emulator always poisons; on a GPU launchers otherwise
    allocate with torch.empty, as torch does (a NaN fill is one more full write of the output)."""

    def __init__(self, on: bool = True):
        global debugging
        self._before = debugging
        debugging = bool(on)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        global debugging
        debugging = self._before
        return False

    def __repr__(self):
        return f"<convlab.debug: outputs {'poisoned' if poisoning() else 'not poisoned'}>"


def poisoning() -> bool:
    """Whether launchers fill the outputs they allocate with NaN now: under cl.debug, and always on
    the emulator (where the students' checks run)."""
    return debugging or (_backend or backend_impl()).name == "emu"


class Kernel:
    """A __global__ function: call it with its arguments and grid=, block=, shared=.

    The first call builds a launch plan (how to check and pack each argument, the compiled
    function, its limits); later calls only compare each argument with the plan and launch.
    Error messages are built only when something is wrong."""

    def __init__(self, module: Module, name: str):
        self.module, self.name = module, name
        self.params = module.src.kernels[name].params
        self._plan = None

    @property
    def signature(self) -> str:
        return f"{self.name}(" + ", ".join(str(p) for p in self.params) + ")"

    def __repr__(self):
        return f"<convlab.Kernel {self.signature}>"

    @property
    def attributes(self) -> dict:
        """What the GPU's driver reports for the compiled kernel: registers per thread, static
        shared memory in bytes, the most threads a block of it may have. None on the emulator,
        which has no registers to count."""
        lim = self._get_plan().limits
        return {k: lim.get(k) for k in ("registers", "static_shared", "max_threads")}

    def _get_plan(self) -> "_LaunchPlan":
        if self._plan is None:
            self._plan = _LaunchPlan(self)
        return self._plan

    def __call__(self, *args, grid, block, shared: int = 0, max_shared: int | None = None,
                 order: str | None = None, timeout: float | None = None, seed: int = 0):
        plan = self._plan or self._get_plan()
        values = plan.args.values(args)
        ok = plan.ok
        if grid is ok[0] and block is ok[1] and shared == ok[2] and max_shared == ok[3]:
            pass            # the very tuples of the last call (a launcher's kept launch): checked then
        elif (type(grid) is tuple and type(block) is tuple and len(grid) == 3 and len(block) == 3
                and type(shared) is int and (max_shared is None or type(max_shared) is int)):
            # the usual launch: 3-tuples of ints within the limits (anything else: check_launch says why)
            gx, gy, gz = grid
            bx, by, bz = block
            if (type(gx) is int and type(gy) is int and type(gz) is int and type(bx) is int
                    and type(by) is int and type(bz) is int and 0 < gx <= plan.gx and 0 < gy <= plan.gy
                    and 0 < gz <= plan.gz and 0 < bx and 0 < by and 0 < bz and bz <= 64
                    and bx * by * bz <= plan.max_threads and 0 <= shared
                    and shared <= (plan.shared_left if max_shared is None else max_shared - plan.static_shared)):
                plan.ok = (grid, block, shared, max_shared)
            else:
                grid, block = plan.check_launch(grid, block, shared, max_shared)
        else:
            grid, block = plan.check_launch(grid, block, int(shared), max_shared)
            shared = int(shared)
        if plan.emu:
            plan.impl.launch(self.name, list(zip(self.params, plan.args.ctypes, values)), grid, block, shared,
                             order=order or _setting("order", "forward"), timeout=timeout or launch_timeout(),
                             seed=seed, shared_limit=_limits.SHARED_DEFAULT_MAX if max_shared is None else max_shared,
                             total=total_limit())
        else:
            plan.launch(values, grid, block, shared)

    def bind(self, scalars: tuple, grid: tuple, block: tuple, shared: int = 0, max_shared: int | None = None):
        """f(tensors): this kernel launched with `tensors` as its first arguments (its pointers) and
        these scalars, grid, block and shared memory (up to max_shared, the opt-in past 48 KB),
        which are checked here, once (a launcher's kept launch). On a GPU a call then checks only the
        tensors and launches from a buffer whose scalars were packed here; on the emulator, or for a
        kernel whose pointers do not all come before its scalars, it is an ordinary call."""
        def slow(tensors):
            self(*tensors, *scalars, grid=grid, block=block, shared=shared, max_shared=max_shared)

        plan = self._plan or self._get_plan()
        n = len(self.params) - len(scalars)
        if plan.emu or n < 0 or not all(p.pointer for p in self.params[:n]) or any(p.pointer for p in self.params[n:]):
            return slow
        values = [v for _, _, v in _args.check_args(self.name, self.params[n:], tuple(scalars), "cuda")]
        g, b = plan.check_launch(grid, block, int(shared), max_shared)
        return plan.launch.bind(tuple(values), g, b, int(shared), slow)


class _LaunchPlan:
    """What a Kernel works out on its first call and keeps: the argument checks, the backend's
    launch function, and the compiled kernel's limits."""

    def __init__(self, kernel: Kernel):
        b = backend_impl()
        self.kernel, self.impl, self.emu = kernel.name, kernel.module._impl, b.name == "emu"
        self.args = _args.ArgPlan(kernel.name, kernel.params, b.device_type)
        self.limits = {"registers": None, "static_shared": None, "max_threads": None}
        if not self.emu:
            self.limits = self.impl.limits(kernel.name)
        self.max_threads = self.limits["max_threads"] or _limits.BLOCK_THREADS_MAX
        self.static_shared = self.limits["static_shared"] or 0
        self.gx, self.gy, self.gz = self.limits.get("max_grid") or _limits.MAX_GRID
        self.shared_left = _limits.SHARED_DEFAULT_MAX - self.static_shared
        self.ok = (None, None, None, None)   # (grid, block, shared, max_shared) of the last call that passed the quick checks
        self.launch = None if self.emu else self.impl.launcher(kernel.name, kernel.params, self.args.ctypes)

    def check_launch(self, grid, block, shared, max_shared):
        try:
            return _args.check_launch(self.kernel, grid, block, shared,
                                      max_shared=_limits.SHARED_DEFAULT_MAX if max_shared is None else max_shared,
                                      max_threads=self.max_threads, static_shared=self.static_shared,
                                      max_grid=(self.gx, self.gy, self.gz))
        except LaunchError as e:
            if "threads" in str(e) and self.max_threads < _limits.BLOCK_THREADS_MAX:
                raise LaunchError(f"{e} (this kernel uses {self.limits['registers']} registers per thread, so "
                                  f"at most {self.max_threads} threads fit in a block)") from None
            raise


def load_cpu(path, defines: dict | None = None, options: list | None = None) -> "CpuModule":
    """Compile plain C++ (extern "C" functions) with g++ for the CPU; call its functions with CPU
    tensors. A crash or an endless loop inside becomes an error, not a dead notebook."""
    p = resolve_path(path)
    text = p.read_text()
    defines = dict(defines or {})
    key = ("cpu", str(p), text, tuple(sorted((k, str(v)) for k, v in defines.items())), tuple(options or []))
    m = _modules.get(key)
    if m is None:
        src = _source.parse(text, p, [repo_root() / "kernels"])
        functions = _source.parse_extern_c(text, p)
        m = CpuModule(emu.EmuBackend().compile_cpu(src, functions, defines, list(options or [])), functions, p)
        _modules[key] = m
    return m


class CpuModule:
    def __init__(self, impl, functions, path):
        self._impl, self.functions, self.path = impl, functions, path

    def function(self, name: str) -> "CpuFunction":
        if name not in self.functions:
            raise ArgumentError(f"{self.path.name} has no extern \"C\" function `{name}` "
                                f"(it has: {', '.join(self.functions) or 'none'})")
        return CpuFunction(self, name)


class CpuFunction:
    def __init__(self, module, name):
        self.module, self.name, self.params = module, name, module.functions[name]

    def __call__(self, *args, timeout: float | None = None):
        checked = _args.check_args(self.name, self.params, args, "cpu")
        self.module._impl.launch(self.name, checked, (1, 1, 1), (1, 1, 1), 0,
                                 timeout=timeout or launch_timeout(), fibers=False, total=total_limit())


#: CUtensorMapDataType of the dtypes a tensor map may describe (a kept route re-encodes its maps with it)
MAP_DTYPES = {torch.uint8: 0, torch.float16: 6, torch.float32: 7, torch.bfloat16: 9}


def tensor_map(t: torch.Tensor, box, swizzle: int = 128, element_strides=None) -> TensorMap:
    """A tiled tensor map of the contiguous tensor t for a kernel's `const __grid_constant__
    CUtensorMap` parameter: the copy engine (tma_load_Nd, kernels/11_hopper/hopper.cuh) then
    fetches boxes of `box` elements (listed as t's shape is, outermost first), zeros outside t,
    into shared memory in the given swizzle (bytes: 0, 32, 64, 128; with a swizzle, the box's
    innermost extent is at most that many bytes). element_strides (as t's shape, 1 to 8, the
    innermost 1; None: all 1): a copy steps through dimension d by element_strides[d], loading
    ceil(box[d] / element_strides[d]) elements of it (a strided convolution's pixels). Made by the
    same call on both backends: the GPU driver's cuTensorMapEncodeTiled, or the emulator's record
    of the same fields."""
    try:                                  # a repeated call: the same memory, shape, box, swizzle and strides
        hit = _encoded.get((t.data_ptr(), t.dtype, t.shape, box, swizzle, element_strides, backend_impl().name))
        if hit is not None and t.is_contiguous():
            return TensorMap(t, *hit)
    except (AttributeError, TypeError):   # not a tensor, or a box that cannot key: the checks below say why
        pass
    if not isinstance(t, torch.Tensor) or not t.is_contiguous():
        raise ArgumentError("tensor_map needs a contiguous tensor (a channels_last x: x.permute(0, 2, 3, 1))")
    if t.dtype not in MAP_DTYPES:
        raise ArgumentError(f"tensor_map: {t.dtype} is not one of {', '.join(map(str, MAP_DTYPES))}")
    if t.device.type != device().torch_device:
        raise ArgumentError(f"tensor_map: the tensor is on '{t.device}', the kernels run on '{device().torch_device}'")
    box = tuple(int(b) for b in box)
    if len(box) != t.dim() or not 1 <= t.dim() <= 5:
        raise ArgumentError(f"tensor_map: a box of {t.dim()} extents (1 to 5 dimensions) for a tensor of shape "
                            f"{tuple(t.shape)}, got {box}")
    if swizzle not in SWIZZLES:
        raise ArgumentError(f"tensor_map: swizzle={swizzle!r}, one of {SWIZZLES} bytes")
    steps = (1,) * t.dim() if element_strides is None else tuple(int(e) for e in element_strides)
    if len(steps) != t.dim() or not all(1 <= e <= 8 for e in steps) or steps[-1] != 1:
        raise ArgumentError(f"tensor_map: element_strides {element_strides}: one per dimension of {tuple(t.shape)}, "
                            "each 1 to 8, the innermost 1 (the copy engine steps only through the outer ones)")
    size = t.element_size()
    dims, box_in, steps_in = tuple(int(d) for d in reversed(t.shape)), tuple(reversed(box)), tuple(reversed(steps))
    # a contiguous tensor's strides from its shape (a size-1 dimension may report any stride)
    strides, step = [], size
    for d in dims[:-1]:
        step *= d
        strides.append(step)
    strides = tuple(strides)
    if any(not 1 <= b <= 256 for b in box_in):
        raise ArgumentError(f"tensor_map: each extent of the box is 1 to 256 elements, got {box}")
    if box_in[0] * size % 16:
        raise ArgumentError(f"tensor_map: the box's innermost extent must be a multiple of 16 bytes, got "
                            f"{box_in[0]} x {size} bytes")
    if swizzle and box_in[0] * size > swizzle:
        raise ArgumentError(f"tensor_map: with a {swizzle}-byte swizzle the box's innermost extent is at most "
                            f"{swizzle} bytes, got {box_in[0] * size}")
    if any(s % 16 for s in strides) or t.data_ptr() % 16:
        raise ArgumentError(f"tensor_map: the tensor's address and strides ({strides} bytes) must be multiples of "
                            f"16 bytes (e.g. channels a multiple of {16 // size})")
    b = backend_impl()
    encoded = b.encode_tensor_map(MAP_DTYPES[t.dtype], t.data_ptr(), dims, strides, box_in, SWIZZLES.index(swizzle),
                                  None if element_strides is None else steps_in)
    if len(_encoded) > 4096:              # tensors come and go in a loop: keep the table small
        _encoded.clear()
    key = (t.data_ptr(), t.dtype, t.shape, box, swizzle, element_strides, b.name)
    fields = _encoded[key] = (dims, strides, box_in, swizzle, encoded, steps_in)
    return TensorMap(t, *fields)


# (address, dtype, shape, box as given, swizzle, element strides as given, backend) -> a TensorMap's fields: a repeated call's
# tensors (the same memory and shape) reuse their encoding; the tensor itself is never kept here
_encoded: dict = {}


def sync():
    """Wait until the GPU has finished every kernel launched so far (launches are asynchronous
    there, as in CUDA); the emulator's launches are synchronous already."""
    if backend_impl().name == "cuda":
        torch.cuda.synchronize()


# ---------------------------------------------------------------------------------------------
# Races

def find_race(launch, outputs, orders=("forward", "reverse", "shuffled"), rtol: float = 1e-5) -> str | None:
    """Look for a race in `launch()` (emulator): first with the race detector, which names both
    source lines and the fix; then, as a second opinion, by running the threads of each block in
    several orders and comparing the tensors in `outputs` (within rtol, since atomics legitimately
    add in another order). Returns None when both find nothing, else the message."""
    outputs = [outputs] if isinstance(outputs, torch.Tensor) else list(outputs)
    results = {}
    for order in orders:
        for o in outputs:
            o.fill_(float("nan") if o.dtype.is_floating_point else -1)
        try:
            with thread_order(order), detect_races(order == orders[0]):
                launch()
        except RaceError as e:
            return str(e)
        sync()
        results[order] = [o.detach().cpu().clone() for o in outputs]
    base = orders[0]
    for order in orders[1:]:
        for i, (a, b) in enumerate(zip(results[base], results[order])):
            if a.dtype.is_floating_point:
                a64, b64 = a.double(), b.double()
                scale = float(a64[torch.isfinite(a64)].abs().max()) if bool(torch.isfinite(a64).any()) else 0.0
                same = ((a64 - b64).abs() <= rtol * scale) | (torch.isnan(a64) & torch.isnan(b64))
            else:
                same = a == b
            if not bool(same.all()):
                bad = (~same).nonzero()
                idx = tuple(int(v) for v in bad[0])
                return (f"output {i} differs between thread orders '{base}' and '{order}' at {bad.shape[0]} "
                        f"elements (first at {idx}: {a[idx].item()} vs {b[idx].item()}): a race the detector did "
                        f"not see (through a plain pointer, e.g. `float* p = &s[0]`, or a half/vector type). Look "
                        f"for a thread that reads memory another thread writes, with no __syncthreads() between.")
    return None
