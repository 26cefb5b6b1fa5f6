"""What one launch touches, access by access, for a few chosen blocks: the record cl.draw draws.

    t = cl.trace(conv, x, w, y, 2, 3, 8, 32, 32, 5, grid=g, block=b, blocks=[(0, 0, 0)])
    t = cl.trace(cl.ops.naive.conv2d_naive_z, x, w, blocks=[(1, 0, 0)])   # a launcher call
    t.accesses      # one row per access: thread, warp, lane, buffer, element, read/write, line, ...

The call runs on the emulator as cl.profile runs it (the whole grid, with the profiler's counters:
t.profile is the launch's KernelProfile, the same numbers cl.profile shows); only the chosen
blocks' accesses are kept, so a small block costs little however large the grid. A read-modify-
write (y[i] += v) is two rows, a read and a write, as the profiler counts it.
"""
from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass

from ..gpu import emu, runtime
from ..gpu._errors import ConvlabError, ProfileUnavailable
from ..gpu._source import where
from .emu_counters import EmuRecorder, counters_lib, emu_profiling

__all__ = ["trace", "Trace", "Buffer", "request_sectors", "request_wavefronts"]


class _Rec(ctypes.Structure):   # clprof_trace_rec (clemu_profile.h)
    _fields_ = [("addr", ctypes.c_ulonglong), ("loop", ctypes.c_ulonglong), ("epoch", ctypes.c_ulonglong),
                ("offset", ctypes.c_longlong), ("elem", ctypes.c_longlong), ("size", ctypes.c_longlong),
                ("block", ctypes.c_int), ("thread", ctypes.c_int), ("kind", ctypes.c_int), ("site", ctypes.c_int),
                ("bytes", ctypes.c_int), ("array", ctypes.c_int)]


_KIND = {0: ("global", "read"), 1: ("global", "write"), 2: ("shared", "read"), 3: ("shared", "write"),
         4: ("global", "atomic"), 5: ("shared", "atomic")}
_SIZES = {"float": 4, "int": 4, "unsigned": 4, "unsigned int": 4, "double": 8, "half": 2, "__half": 2,
          "half2": 4, "__half2": 4, "float2": 8, "float4": 16, "int4": 16, "char": 1, "short": 2, "long long": 8}


@dataclass
class Buffer:
    """An array the traced blocks touched: a kernel argument (space "global": shape and element size
    of its tensor) or a __shared__ array (its declared shape where the source says it plainly, else
    rows of 32 four-byte words, the banks)."""
    name: str
    space: str
    shape: tuple
    itemsize: int
    declared: bool = True    # shared: the shape is the declaration's (not rows of 32 words)


@dataclass
class Trace:
    """One launch's accesses by the chosen blocks (`accesses`, a DataFrame, columns below), the
    arrays they went to (`buffers`), the kernel's scalar arguments (`scalars`) and the launch's
    profiler counters (`profile`, as cl.profile's card has them).

    accesses: bx, by, bz (block); thread (linear in the block), tx, ty, tz, warp, lane; buffer,
    space ("global", "shared"), access ("read", "write", "atomic"); index (element in the flattened
    array), elems (elements the access covers: 4 for a float4), offset and bytes; line (where in
    the source, as error messages name it), lineno, code (the line's text); site (the
    instruction); loop (the loop-iteration tag), phase (barrier interval, counted from 0 among
    those in which the block accessed memory), seq (order of execution); request (the warp request
    the access belongs to, as the profiler groups them)."""
    kernel: str
    grid: tuple
    block: tuple
    blocks: list
    accesses: object
    buffers: dict
    scalars: dict
    profile: object = None

    def of_block(self, block_id) -> "object":
        b = tuple(block_id) + (0,) * (3 - len(tuple(block_id)))
        a = self.accesses
        return a[(a.bx == b[0]) & (a.by == b[1]) & (a.bz == b[2])]


# ---------------------------------------------------------------------------------------------
# The emulator's side: the profiler's recorder, which also takes the chosen blocks' records

class _TraceRecorder(EmuRecorder):
    """cl.profile's recorder (convlab.measuring.emu_counters.EmuRecorder) that also keeps the chosen blocks'
    accesses of each launch, as a Trace on its KernelProfile (kprofile.trace)."""

    def __init__(self, blocks):
        super().__init__()
        self.blocks = blocks

    def record(self, lib, name, grid, block, src, checked):
        import numpy as np
        super().record(lib, name, grid, block, src, checked)
        if not self.blocks:
            return
        lib = counters_lib(lib)
        n = lib.clprof_trace_take(None, 0)
        recs = (_Rec * max(n, 1))()
        lib.clprof_trace_take(ctypes.addressof(recs), n)
        names, buf = [], ctypes.create_string_buffer(512)
        while lib.clprof_trace_array(len(names), buf, len(buf)) >= 0:
            names.append(buf.value.decode())
        lib.clprof_trace_blocks(None, 0)
        kprofile = self.launches[-1]
        kprofile.trace = _build(kprofile, src, checked, self.blocks, np.ctypeslib.as_array(recs)[:n], names)


def _where_to_code(src) -> dict:
    """where()'s name of each line of the kernel's file -> the line's text."""
    return {where(src.path, i + 1): text.strip() for i, text in enumerate(src.text.splitlines())}


def _shared_shape(src, name: str, elem: int, size: int) -> tuple[tuple, bool]:
    """A __shared__ array's shape from its declaration, evaluated with the file's integer #defines;
    a last extent the #defines get wrong (a -D define) follows from the array's size."""
    m = re.search(r"__shared__\s+[\w\s]*?\b" + re.escape(name) + r"\s*((?:\[[^\]]+\])+)", src.text)
    words = max(size // 4, 1)
    flat = ((words + 31) // 32, 32) if words > 32 else (words,)
    if not m or not elem:
        return flat, False
    consts = {k: int(v) for k, v in re.findall(r"^\s*#\s*define\s+(\w+)\s+\(?(-?\d+)\)?\s*$", src.text, re.M)}
    dims = []
    for d in re.findall(r"\[([^\]]+)\]", m[1]):
        try:
            dims.append(int(eval(d, {"__builtins__": {}}, consts)))   # noqa: S307 - digits, names, + - * /
        except Exception:  # noqa: BLE001 - an extent the #defines do not settle
            dims.append(None)
    total = size // elem
    known = 1
    for d in dims[:-1]:
        known *= d or 0
    if known and total % known == 0:
        dims[-1] = total // known
        return tuple(dims), True
    return flat, False


def _build(kprofile, src, checked, blocks, recs, names) -> Trace:
    import numpy as np
    import pandas as pd

    bx, by, bz = (int(v) for v in kprofile.block.strip("()").split(","))
    ptrs = {p.name: v for p, _, v in checked if p.pointer and hasattr(v, "data_ptr")}
    scalars = {p.name: v for p, _, v in checked if not p.pointer}
    buffers = {n: Buffer(n, "global", tuple(v.shape), v.element_size()) for n, v in ptrs.items()}
    extern = re.search(r"extern\s+__shared__\s+(?:__align__\s*\(\s*\d+\s*\)\s*)?([\w\s]+?)\s+(\w+)\s*\[", src.text)
    df = pd.DataFrame({k: recs[k] for k in recs.dtype.names})
    space = df.kind.map(lambda k: _KIND[k][0])
    df["space"], df["access"] = space, df.kind.map(lambda k: _KIND[k][1])
    # the array's name; extern __shared__ memory takes its declaration's name
    shared_name = extern[2] if extern else "extern shared"
    df["buffer"] = [names[a] if a >= 0 and names[a] else (shared_name if s == "shared" else "?")
                    for a, s in zip(df.array, df.space)]
    for (name, sp), g in df.groupby(["buffer", "space"]):
        if sp == "shared" and name not in buffers:
            elem = int(g.elem.max()) or (_SIZES.get(extern[1].strip(), 4) if extern and name == shared_name else 4)
            shape, declared = _shared_shape(src, name, elem, int(g["size"].max()))
            buffers[name] = Buffer(name, "shared", shape, elem if declared else 4, declared)
    item = df.buffer.map(lambda n: buffers[n].itemsize if n in buffers else 1)
    df["index"] = np.where(df.offset >= 0, df.offset // item, -1)
    df["elems"] = np.maximum(df.bytes // item, 1)
    blk = np.array(blocks)[df.block.to_numpy()] if len(df) else np.zeros((0, 3), dtype=int)
    df["bx"], df["by"], df["bz"] = blk[:, 0], blk[:, 1], blk[:, 2]
    df["tx"], df["ty"], df["tz"] = df.thread % bx, (df.thread // bx) % by, df.thread // (bx * by)
    df["warp"], df["lane"] = df.thread // 32, df.thread % 32
    df["seq"] = np.arange(len(df))
    # the barrier interval: the worker's epoch count, numbered afresh in each block
    df["phase"] = df.groupby("block").epoch.rank(method="dense").astype(int) - 1 if len(df) else 0
    # where each site is in the source
    buf = ctypes.create_string_buffer(2048)
    rt = counters_lib(emu.runtime_library())
    tokens = []
    sites = sorted(df.site.unique()) if len(df) else []
    for s in sites:
        tokens.append(buf.value.decode() if rt.clprof_site_where(int(s), buf, len(buf)) else "{{site:?+0x0}}")
    where = dict(zip(sites, emu.resolve_sites("\n".join(tokens)).split("\n"))) if sites else {}
    code = _where_to_code(src)
    df["line"] = df.site.map(where)
    df["lineno"] = df.line.map(lambda w: int(m[1]) if (m := re.search(r"(\d+)$", str(w))) else -1)
    df["code"] = df.line.map(lambda w: code.get(w, ""))
    # the profiler's requests: one warp's lanes at one site, in one loop iteration of one barrier
    # interval; a lane's k-th such access goes with the other lanes' k-th
    key = ["block", "warp", "site", "epoch", "loop"]
    df["k"] = df.groupby(key + ["lane"]).cumcount()
    df["request"] = df.groupby(key + ["k"], sort=False).ngroup() if len(df) else 0
    keep = ["bx", "by", "bz", "thread", "tx", "ty", "tz", "warp", "lane", "buffer", "space", "access", "index",
            "elems", "offset", "bytes", "line", "lineno", "code", "site", "loop", "phase", "seq", "request", "addr"]
    return Trace(kprofile.name, tuple(int(v) for v in kprofile.grid.strip("()").split(",")), (bx, by, bz),
                 [tuple(b) for b in blocks], df[keep].reset_index(drop=True), buffers, scalars, kprofile)


# ---------------------------------------------------------------------------------------------
# The profiler's arithmetic on one request (profile.cpp), for the views that draw it

def request_sectors(acc) -> list:
    """The distinct 32-byte sectors one global request's lanes touch (addresses // 32)."""
    out = set()
    for a, n in zip(acc.addr.astype("uint64"), acc.bytes):
        out.update(range(int(a) >> 5, ((int(a) + int(n) - 1) >> 5) + 1))
    return sorted(out)


def request_wavefronts(acc) -> tuple[int, int]:
    """(wavefronts, least possible) of one shared-memory request, as profile.cpp counts them: per
    phase of 128 bytes, the most distinct 4-byte words in one bank."""
    lanes = dict(zip(acc.lane, acc.addr.astype("uint64")))
    width = int(acc.bytes.max())
    phases = 4 if width > 8 else 2 if width > 4 else 1
    if phases > 1 and any(all(lanes.get(l ^ bit, a) == a for l, a in lanes.items()) for bit in (1, 2)):
        phases //= 2
    per = 32 // phases
    wave = least = 0
    for ph in range(phases):
        sel = acc[(acc.lane // per) == ph]
        if not len(sel):
            continue
        words = set()
        for a, n in zip(sel.addr.astype("uint64"), sel.bytes):
            words.update(range(int(a) >> 2, ((int(a) + int(n) - 1) >> 2) + 1))
        banks = {}
        for wd in words:
            banks[wd & 31] = banks.get(wd & 31, 0) + 1
        wave += max(banks.values())
        least += 1
    return wave, least


# ---------------------------------------------------------------------------------------------
# The entry point

def trace(fn, *args, blocks=((0, 0, 0),), launch: int | str = 0, **kwargs) -> Trace:
    """Run fn(*args, **kwargs) on the emulator (fn: a Kernel with grid=, block=, shared= among
    kwargs, or a launcher such as cl.ops.naive.conv2d_naive_z) and record every memory access of
    the blocks given (blockIdx triples; a shorter tuple is padded with 0s). launch: which of the
    call's kernel launches (its index, or part of its kernel's name). Returns a Trace."""
    if runtime.backend() != "emu":
        raise ProfileUnavailable("cl.trace records accesses on the emulator only: run with CONVLAB_BACKEND=emu "
                                 "(the same kernel file runs there)")
    blocks = [tuple(int(v) for v in b) + (0,) * (3 - len(tuple(b))) for b in blocks]
    limit = runtime.default_timeout()
    runtime.set_timeout(10 * limit)
    try:
        with emu_profiling(_TraceRecorder(blocks)) as launches:
            fn(*args, **kwargs)
    finally:
        runtime.set_timeout(limit)
    traced = [k for k in launches if getattr(k, "trace", None) is not None]
    if isinstance(launch, str):
        traced = [k for k in traced if launch in k.name]
        idx = 0
    else:
        idx = launch
    if idx >= len(traced):
        have = ", ".join(k.name for k in launches) or "none"
        raise ConvlabError(f"the call made no kernel launch {launch!r} to trace (it launched: {have})")
    return traced[idx].trace
