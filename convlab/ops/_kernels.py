"""What the launchers share to compile and launch their kernels.

- module(path, defines): a kernel file compiled with a set of defines, through cl.load (whose cache
  is keyed by the source text). A call looks at the file's modification time and size (one
  os.stat, at most every LOOK_EVERY_NS: 20 ms) and loads it again when they changed: an edited .cu recompiles through a launcher in a
  live notebook, and going back to an earlier text finds its compiled module again.
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
"""
from __future__ import annotations

import os
import time

from .. import runtime
from .._paths import path as repo_path
from .shapes import plain_arg
from .._limits import GRID_YZ_MAX

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
