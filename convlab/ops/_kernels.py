"""What the launchers share to compile and launch their kernels.

- module(path, defines): a kernel file compiled with a set of defines, through cl.load (whose cache
  is keyed by the source text). A call looks at the file's modification time and size (one
  os.stat, at most every LOOK_EVERY_NS: 20 ms) and loads it again when they changed: an edited .cu
  recompiles through a launcher in a live notebook, and going back to an earlier text finds its
  compiled module again.
- Launch: one launch worked out by a launcher for one shape (file, defines, kernel, grid, block,
  shared memory and its opt-in past 48 KB, scalar arguments), kept so that a repeated call only
  launches it: its kernel's bind() checks the scalars, grid and block once per compiled module, and
  a call then only checks its tensors (on a GPU, from a buffer with the scalars already packed).
- Launch.with_mask(w, *tensors): a kept launch whose module's __constant__ mask is filled from w
  first, on every launch (on the GPU a device-to-device copy queued on the stream), with the one
  os.stat of its call;
- batch_chunks(): split a batch that would put more than 65,535 blocks on gridDim.y or z;
- sm_count(): the GPU's SMs, for the config functions that size a grid to the machine (on the
  emulator, EMULATED_SMS: the H200's, so a config is the one the GPU run gets).
- Kept(route): a route (dispatch's, for one call signature) as its caller keeps it: kept.run(*args)
  runs it through Python for its first call; its second is recorded (compiled()), and on a GPU,
  where that call's work is only allocations, launches and copies into __constant__ memory, from
  then on kept.run is a convlab.gpu.native Route: the allocations and launches in one C call, the
  call's tensors' addresses written into the recorded argument buffers. Such a Route answers
  NotImplemented where a tensor is not as recorded (strides, alignment) and every LOOK_EVERY_NS:
  kept.slow(*args) then runs the route through Python, and the Route goes on while no kernel
  file it launches was edited (else the route stays on Python).
"""
from __future__ import annotations

import functools
import os
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..gpu import native, runtime
from ..gpu._limits import GRID_YZ_MAX
from ..gpu._paths import path as repo_path
from ..gpu._tensor_map import SWIZZLES
from .shapes import plain_arg

EMULATED_SMS = 132      # H100/H200 SXM: the GPU the committed results and tuned choices come from
#: A launcher looks at its kernel file at most this often: an edit (made by a person, seconds apart)
#: is seen by the next call, and a loop of calls pays one os.stat per interval, not per call.
LOOK_EVERY_NS = 20_000_000


def defines_key(defines: dict | None) -> tuple:
    """Defines as a hashable key, the same for the same names and values in any order."""
    return tuple(sorted((str(k), str(v)) for k, v in (defines or {}).items()))


class _ModuleRef:
    """The module of one (file, defines), compiled again when the file or what it includes changes."""

    __slots__ = ("path", "defines", "files", "stamp", "mod", "seen")

    def __init__(self, path: str, defines: tuple):
        self.path, self.defines = str(repo_path(path)), dict(defines)
        self.files, self.stamp, self.mod, self.seen = (self.path,), None, None, 0

    def get(self):
        if _gets is not None:
            _gets.append(self)
        now = time.monotonic_ns()
        if now - self.seen < LOOK_EVERY_NS and self.mod is not None:
            return self.mod               # looked a moment ago: a loop's repeated calls skip the os.stat
        self.seen = now
        if len(self.files) == 1:          # the usual file, with no #include of its own
            s = os.stat(self.path)
            stamp = [(s.st_mtime_ns, s.st_size)]
        else:
            stamp = [(s.st_mtime_ns, s.st_size) for s in map(os.stat, self.files)]
        if stamp != self.stamp:
            self.mod = runtime.load(self.path, defines=self.defines)
            self.files = (self.path, *(str(p) for p in self.mod.src.includes))
            self.stamp = [(s.st_mtime_ns, s.st_size) for s in map(os.stat, self.files)]
        return self.mod


_refs: dict = {}
_gets: list | None = None       # the _ModuleRefs a call being recorded looks at (compiled())


def module_ref(path: str, defines: tuple | dict = ()) -> _ModuleRef:
    """The one _ModuleRef of (path, defines); defines: a dict, or a defines_key() tuple."""
    key = (path, defines if type(defines) is tuple else defines_key(defines))
    ref = _refs.get(key)
    if ref is None:
        ref = _refs[key] = _ModuleRef(path, key[1])
    return ref


def module(path: str, defines: tuple | dict = ()):
    """cl.load(path, defines) on the active backend, found again cheaply (see the module's doc)."""
    return module_ref(path, defines).get()


class Launch:
    """One kernel launch as a launcher works it out for a shape; launch(*tensors) runs it with the
    kept scalar arguments after the tensors."""

    __slots__ = ("path", "defines", "kernel", "scalars", "grid", "block", "shared", "max_shared", "ref", "mod",
                 "bound")

    def __init__(self, path: str, kernel: str, defines: dict | None = None, scalars: tuple = (), *,
                 grid: tuple, block: tuple, shared: int = 0, max_shared: int | None = None):
        self.path, self.kernel, self.defines = path, kernel, defines_key(defines)
        self.scalars = tuple(s if type(s) is float else int(s) for s in scalars)   # float: a float parameter
        self.grid = tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
        self.block = tuple(int(b) for b in block) + (1,) * (3 - len(block))
        self.shared = int(shared)
        self.max_shared = None if max_shared is None else int(max_shared)   # the opt-in past 48 KB
        self.ref = self.mod = self.bound = None

    def module(self):
        if self.ref is None:
            self.ref = module_ref(self.path, self.defines)
        return self.ref.get()

    def __call__(self, *tensors):
        mod = (self.ref or self._ref()).get()
        if mod is not self.mod:          # the first call, or the file was edited: bind the new build
            self._bind(mod)
        self.bound(tensors)

    def with_mask(self, w, *tensors, name: str = "c_mask", also: tuple = ()):
        """module.set_constant(name, w) (and set_constant(n, t) for each (n, t) in also), then launch:
        one look at the file for all of them. Filled on every launch, never skipped when w looks
        unchanged: torch's version counter misses writes through w.data or by a kernel of ours, and a
        stale mask is a wrong result."""
        mod = (self.ref or self._ref()).get()
        if mod is not self.mod:
            self._bind(mod)
        mod.set_constant(name, w)
        for n, t in also:
            mod.set_constant(n, t)
        self.bound(tensors)

    def _bind(self, mod):
        self.bound = mod.kernel(self.kernel).bind(self.scalars, self.grid, self.block, self.shared, self.max_shared)
        self.mod = mod

    def _ref(self):
        self.ref = module_ref(self.path, self.defines)
        return self.ref


def remember(cache: dict, key, build, args: tuple = ()):
    """cache[key], built by build() the first time (a launcher's plan for one call signature). args:
    the arguments as the caller gave them (stride, padding, ...), part of key; where one is not
    plain (a list, a float: its value alone does not say what torch makes of it) nothing is kept."""
    if not all(map(plain_arg, args)):       # maybe unhashable too
        return build()
    plan = cache.get(key)
    if plan is None:
        plan = cache[key] = build()
    return plan


def sm_count() -> int:
    """The active GPU's SM count; EMULATED_SMS on the emulator."""
    dev = runtime.device()
    return dev.threads if dev.backend == "cuda" else EMULATED_SMS


def batch_chunks(B: int, limit: int = GRID_YZ_MAX):
    """(b0, b1) ranges of at most `limit` images: for kernels with the batch on gridDim.y or z."""
    return [(b0, min(B, b0 + limit)) for b0 in range(0, B, limit)]


# ---- routes kept as their GPU work ---------------------------------------------------------------

#: Whether compiled() keeps a route as a convlab.gpu.native Route (False: every call runs through
#: Python; benchmarks/launch_overhead.py compares the two)
NATIVE = True
#: aten ops that only allocate: in a recorded call, the outputs and workspaces a Route allocates again
ALLOCATING = frozenset(("empty", "empty_strided", "new_empty", "new_empty_strided", "empty_like"))


class _Made(TorchDispatchMode):
    """The tensors torch allocates inside (kept alive, so no two share an address), and the names of
    the other aten ops that are no views (work a Route could not do again)."""

    def __init__(self):
        super().__init__()
        self.tensors, self.ops = [], []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name in ALLOCATING:
            self.tensors.append(out)
        elif not all(r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns):
            self.ops.append(name)
        return out


def _extent(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _dense(t: torch.Tensor) -> bool:
    """t's elements fill its memory once each: its strides, smallest first, those of a contiguous
    tensor in some order of its dimensions (what torch.empty_strided makes again)."""
    step = 1
    for stride, size in sorted((st, sz) for st, sz in zip(t.stride(), t.shape) if sz != 1):
        if stride != step:
            return False
        step *= size
    return True


def recording_backend():
    """The backend whose calls compiled() records and replays: the active one (a stand-in GPU
    backend in benchmarks/launch_overhead.py's measurement on the CPU)."""
    return runtime.backend_impl()


def compiled(route, args: tuple):
    """(route(*args), a convlab.gpu.native Route that does again what this call did on the GPU, or None
    where it cannot: not a GPU, convlab.gpu.native not built, outputs poisoned, or a call that has torch
    compute something, fills a __constant__ from the host, or copies from memory that is neither an
    argument's nor an allocation of the call's). Args: tensors or None (None stays None). A kernel
    handed a tensor that is neither (a launcher's own, kept from call to call) gets that same tensor
    again: the Route keeps it alive (its `holds`)."""
    global _gets
    b, Route = recording_backend(), native.route_type()
    if b.name != "cuda" or Route is None or runtime.poisoning() or not NATIVE:
        return route(*args), None
    _gets, made = [], _Made()
    try:
        with made:
            out, rec = b.record(lambda: route(*args))
        refs = {ref: ref.mod for ref in _gets}
    finally:
        _gets = None
    if rec is None or rec.why or made.ops or not isinstance(out, torch.Tensor):
        return out, None
    try:
        kept = _route_of(Route, b, rec, made.tensors, args, out)
    except (LookupError, ValueError):        # memory the call neither got nor made, or two sources overlap
        return out, None
    kept.slow = functools.partial(_renewed, kept, route, tuple(refs.items()))
    return out, kept


def _route_of(Route, b, rec, made: list, args: tuple, out):
    """The convlab.gpu.native Route of a recorded call (compiled()): its sources are the call's
    arguments, then the allocations something reads (the result as the route returns it)."""
    sources = [(a.data_ptr(), _extent(a)) if isinstance(a, torch.Tensor) else None for a in args]
    sources += [(t.data_ptr(), _extent(t)) for t in made]
    spans = sorted(s for s in sources if s is not None and s[1])
    if any(a[0] + a[1] > c[0] for a, c in zip(spans, spans[1:])):
        raise ValueError("two sources overlap: an address would be ambiguous")
    if out.storage_offset() or not _dense(out):
        raise ValueError("the result is not its allocation")

    def where(ptr):
        for i, s in enumerate(sources):
            if s is not None and s[0] <= ptr < s[0] + s[1]:
                return i, ptr - s[0]
        raise LookupError(ptr)

    holds = []

    def slots(pointers):                # a launcher's own tensor: its address stays in the buffer as packed
        out = []
        for at, t in pointers:
            try:
                out.append((at, *where(t.data_ptr())))
            except LookupError:
                holds.append(t)
        return tuple(out)

    steps = []
    for step in rec.steps:
        if step[0] == "copy":
            _, dst, src, nbytes = step
            steps.append((1, dst, nbytes, *where(src)))
            continue
        _, func, dims, buf, offsets, pointers, maps = step
        steps.append((0, func, tuple(dims), buf, offsets, slots(pointers),
                      tuple((at, *where(m.tensor.data_ptr()), runtime.MAP_DTYPES[m.tensor.dtype],
                             SWIZZLES.index(m.swizzle), tuple(m.dims), tuple(m.strides), tuple(m.box),
                             tuple(m.element_strides) or (1,) * len(m.dims))    # a strided layer's steps
                            for at, m in maps)))
    n = len(args)
    result = next((i for i in range(n, len(sources)) if sources[i] == (out.data_ptr(), _extent(out))), None)
    if result is None:
        raise LookupError("the result is none of the call's allocations")
    used = {result} | {p[1] for s in steps if s[0] == 0 for p in (*s[5], *s[6])} | {s[3] for s in steps if s[0] == 1}
    keep = [i for i in range(n, len(sources)) if i in used]      # the allocations something reads
    index = {**{i: i for i in range(n)}, **{k: n + j for j, k in enumerate(keep)}}
    steps = [(1, s[1], s[2], index[s[3]], s[4]) if s[0] == 1 else
             (0, *s[1:5], tuple((at, index[i], o) for at, i, o in s[5]),
              tuple((at, index[i], *rest) for at, i, *rest in s[6])) for s in steps]
    allocs = tuple(functools.partial(torch.empty_strided, tuple(t.shape), t.stride(), dtype=t.dtype, device=t.device)
                   for t in (out if k == result else made[k - n] for k in keep))   # the result as the route returns it
    checks = tuple(None if a is None else (a.data_ptr() % 16, a.stride()) for a in args)
    launch, copy, encode = b.driver_functions()
    kept = Route(launch, copy, encode, b.raw_stream, b.has_context, checks, allocs, tuple(steps), index[result],
                 native.now_ns() + LOOK_EVERY_NS)
    kept.holds = holds
    return kept


def _renewed(kept, route, refs, *args):
    """route(*args) through Python, where a Route answered NotImplemented; the Route goes on for
    another LOOK_EVERY_NS while every kernel module it launches is the one recorded."""
    out = route(*args)
    kept.expires = native.now_ns() + LOOK_EVERY_NS if all(ref.get() is mod for ref, mod in refs) else 0
    return out


class Kept:
    """A route kept by its caller for one call signature (see the module's doc): run(*args), then,
    where that answers NotImplemented, slow(*args). impl, adds, reads: the route's."""

    __slots__ = ("route", "run", "slow", "calls")

    def __init__(self, route):
        self.route, self.run, self.slow, self.calls = route, self._first, route, 0

    def _first(self, *args):
        self.calls += 1
        if self.calls < 2:                      # the first call compiles and plans: the second is a repeat
            return self.route(*args)
        out, kept = compiled(self.route, args)
        if kept is not None:
            self.run, self.slow = kept, kept.slow
        else:
            self.run = self.route
        return out

    def __call__(self, *args):
        out = self.run(*args)
        return self.slow(*args) if out is NotImplemented else out

    def __getattr__(self, name):                # impl, adds, reads: the route's
        return getattr(self.route, name)
