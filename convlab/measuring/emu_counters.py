"""The emulator's memory counters (convlab/gpu/emu/profile.cpp), by ncu's metric names, in the order
of its enum clprof_counter: each launch counted as a KernelProfile (emu_profiling, the recorder the
emulator calls around each launch), and an access trace counted without a kernel (count_trace).
"""
from __future__ import annotations

import ctypes
from contextlib import contextmanager

from ..gpu import emu
from .cards import EMU_COUNTERS, KernelProfile


KINDS = {"global_ld": 0, "global_st": 1, "shared_ld": 2, "shared_st": 3, "global_atom": 4, "shared_atom": 5,
         "constant_ld": 6}


def counters_lib(lib):
    """Declare profile.cpp's C functions (its counters and cl.trace's records) on a ctypes library
    that contains them."""
    lib.clprof_site.argtypes = [ctypes.c_ulonglong, ctypes.c_int]
    lib.clprof_site.restype = ctypes.c_int
    lib.clprof_access.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_ulonglong]
    lib.clprof_epoch.argtypes = [ctypes.c_int, ctypes.c_int]
    lib.clprof_totals.argtypes = [ctypes.POINTER(ctypes.c_longlong)]
    lib.clprof_totals.restype = ctypes.c_int
    lib.clprof_site_info.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_ulonglong), ctypes.POINTER(ctypes.c_int),
                                     ctypes.POINTER(ctypes.c_longlong)]
    lib.clprof_site_info.restype = ctypes.c_int
    lib.clprof_site_where.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    lib.clprof_site_where.restype = ctypes.c_int
    lib.clprof_trace_blocks.argtypes = [ctypes.POINTER(ctypes.c_uint), ctypes.c_int]
    lib.clprof_trace_take.argtypes = [ctypes.c_void_p, ctypes.c_longlong]
    lib.clprof_trace_take.restype = ctypes.c_longlong
    lib.clprof_trace_array.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    lib.clprof_trace_array.restype = ctypes.c_int
    return lib


def emu_totals(lib) -> dict:
    """The counters since the last clprof_reset, by ncu metric name."""
    out = (ctypes.c_longlong * len(EMU_COUNTERS))()
    lib.clprof_totals(out)
    return {name: float(out[i]) for i, name in enumerate(EMU_COUNTERS)}


_standalone = None


def count_trace(events, n_threads: int) -> dict:
    """Count an access trace as the emulator's profiler does, without running a kernel: the metric
    math on its own. events: (thread, kind, address, bytes), (thread, kind, address, bytes, site) or
    (thread, kind, address, bytes, site, loop) tuples in the order the threads made them (kind: one
    of KINDS; site: any int naming the source instruction, by default one site per kind; loop: any
    int naming the loop iteration the thread is in, by default 0, none), and "barrier" where the
    block's threads all meet a __syncthreads(). Returns ncu metric name -> count for that one block."""
    global _standalone
    import hashlib
    if _standalone is None:
        text = emu.PROFILE_SRC.read_text() + (emu.INCLUDE / "clemu_profile.h").read_text()
        key = "profile-" + hashlib.sha256(text.encode()).hexdigest()[:20]
        so = emu.compile_library(emu.PROFILE_SRC.read_text(), key, ["-I", str(emu.INCLUDE)], "emulator profiler")
        _standalone = counters_lib(ctypes.CDLL(str(so)))
    lib = _standalone
    lib.clprof_reset()
    sites = {}
    for ev in events:
        if ev == "barrier":
            lib.clprof_epoch(n_threads, 1)
            continue
        thread, kind, addr, nbytes, *rest = ev
        if kind not in KINDS:
            raise ValueError(f"kind {kind!r}: use one of {', '.join(KINDS)}")
        site, loop = (list(rest) + [None, 0][len(rest):])[:2]
        key = (-1 - KINDS[kind] if site is None else site, KINDS[kind])
        if key not in sites:
            sites[key] = lib.clprof_site(key[0] & 0xFFFFFFFFFFFFFFFF, key[1])
        lib.clprof_access(int(thread), sites[key], int(addr), int(nbytes), int(loop) & 0xFFFFFFFFFFFFFFFF)
    lib.clprof_epoch(n_threads, 0)
    return emu_totals(lib)


class EmuRecorder:
    """What emu_profiling() hands the emulator (convlab.gpu.emu.recording): it arms the runtime before
    each launch and keeps each finished launch's counters, as a KernelProfile, in `launches`."""

    blocks: tuple = ()    # blockIdx triples whose accesses to record (cl.trace's recorder sets them)

    def __init__(self):
        self.launches = []

    def arm(self, lib):
        xyz = (ctypes.c_uint * max(3 * len(self.blocks), 1))(*[int(v) for b in self.blocks for v in b])
        counters_lib(lib).clprof_trace_blocks(xyz, len(self.blocks))

    def record(self, lib, name, grid, block, src, checked):
        self.launches.append(emu_kernel_profile(lib, name, grid, block))


@contextmanager
def emu_profiling(recorder: EmuRecorder | None = None):
    """Count every emulator launch made inside: yields the list of their KernelProfiles."""
    rec = recorder or EmuRecorder()
    with emu.recording(rec):
        yield rec.launches


def emu_kernel_profile(lib, name: str, grid, block) -> KernelProfile:
    """One finished emulator launch's counters (the runtime library holds them until the next)."""
    lib = counters_lib(lib)
    metrics = emu_totals(lib)
    metrics["launch__block_size"] = float(block[0] * block[1] * block[2])
    metrics["launch__grid_size"] = float(grid[0] * grid[1] * grid[2])
    sites = []
    key, kind = ctypes.c_ulonglong(), ctypes.c_int()
    counts = (ctypes.c_longlong * len(EMU_COUNTERS))()
    buf = ctypes.create_string_buffer(2048)
    n = lib.clprof_totals((ctypes.c_longlong * len(EMU_COUNTERS))())
    for site in range(n):
        if lib.clprof_site_info(site, ctypes.byref(key), ctypes.byref(kind), counts) and any(counts):
            where = buf.value.decode() if lib.clprof_site_where(site, buf, len(buf)) else ""
            sites.append((where, kind.value, tuple(counts)))
    return KernelProfile(name, metrics, f"({grid[0]}, {grid[1]}, {grid[2]})", f"({block[0]}, {block[1]}, {block[2]})",
                         sites)
