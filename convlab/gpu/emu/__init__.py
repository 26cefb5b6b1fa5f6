"""The emulator backend: a .cu file compiled by g++ with cuda_emu.h, loaded with ctypes and
launched over the grid by runtime.cpp. The same file runs on a GPU through PyCUDA."""
from __future__ import annotations

import ctypes
import hashlib
import os
import re
import struct
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch


from .._errors import (ArgumentError, BarrierError, CompileError, KernelFault, KernelInterrupted, KernelTimeout,
                       LaunchError, OutOfBoundsError, ProfileUnavailable, RaceDetectorOff, RaceError, WarpMaskError)
from .._paths import repo_root
from .._source import Source, display_name, locate, map_compiler_output, rewrite_for_emulator, strip_comments, where
from . import device_code

HERE = Path(__file__).resolve().parent
INCLUDE = HERE / "include"
RUNTIME_SRC = HERE / "runtime.cpp"
PROFILE_SRC = HERE / "profile.cpp"
GUARD_SRC = HERE / "guard.cpp"
STACK_BYTES = 128 * 1024          # per CUDA thread (fiber)
CXX = os.environ.get("CXX", "g++")
# -g1: line tables only, so a fault, a race or a stopped kernel can name its source line
CXXFLAGS = ["-std=c++17", "-O2", "-g1", "-gdwarf-4", "-fPIC", "-shared", "-fno-strict-aliasing", "-fno-fast-math",
            "-Wno-unknown-pragmas", "-Wno-attributes"]
# warp operations too (ldmatrix and mma exchange registers between lanes: tensor_core.cuh)
_BARRIER_RE = re.compile(r"\b(__syncthreads\w*|__syncwarp|__shfl\w*|__ballot_sync|__any_sync|__all_sync|__match_\w+_sync|"
                         r"__reduce_\w+_sync|ldmatrix_\w+|"
                         r"mma_16816\w*|mma_1688_tf32|wgmma_\w+|mbar_wait|setmaxnreg_\w+|named_barrier_sync)\b")
# Hopper's asynchronous path (clemu_hopper.h): the runtime then records ordinary shared-memory stores
# too, for the checks against TMA copies and wgmma reads (fence_proxy_async)
_ASYNC_RE = re.compile(r"\b(wgmma_\w+|tma_load_\w+|tma_store_\w+|bulk_\w+|mbar_\w+|fence_proxy_async|smem_desc_\w+)\s*[(<]")
#: the emulator's CUtensorMap (clemu_abi.h's clemu_tensor_map): magic, dtype, rank, swizzle, address,
#: dims[5], strides[4], box[5], element bytes, element strides[5], 3 bytes reserved
_TMAP = struct.Struct("<IiiiQ5q4q5II5B3x")
_TMAP_MAGIC = 0x4D544C43
_MAP_ELEM_BYTES = {0: 1, 6: 2, 7: 4, 9: 2}
_STATUS = {1: KernelFault, 2: BarrierError, 3: OutOfBoundsError, 4: KernelTimeout, 5: OutOfBoundsError,
           6: KernelFault, 7: KernelFault, 8: KernelFault, 9: LaunchError, 10: RaceError, 11: KernelInterrupted,
           12: WarpMaskError}
TIMEOUT, RACE, INTERRUPT = 4, 10, 11
#: The race detector runs by itself on launches of at most this many threads (exercise sizes,
#: where it stays well under a second); cl.detect_races() turns it on or off for any launch.
AUTO_DETECT_THREADS = 1 << 14
PROGRESS_AFTER_S = 2.0        # a launch running longer shows a progress line
_detect = threading.local()
_one_launch = threading.Lock()   # the runtime runs one launch at a time; others wait their turn
_recorder = threading.local()


def detect_setting():
    """True, False or None (automatic: launches up to AUTO_DETECT_THREADS threads)."""
    return getattr(_detect, "value", None)


def set_detect(value):
    _detect.value = value


def recorder():
    """What records this thread's emulator launches now (cl.profile's counters, cl.trace's
    accesses), or None. A recorder has arm(lib), called before each launch, and record(lib, name,
    grid, block, src, checked), called after each that finished: lib is the runtime library, which
    holds the launch's counters (convlab/gpu/emu/profile.cpp) until the next launch."""
    return getattr(_recorder, "value", None)


@contextmanager
def recording(rec):
    """Every emulator launch inside goes through the per-access hooks and is recorded by `rec`."""
    old = recorder()
    _recorder.value = rec
    try:
        yield rec
    finally:
        _recorder.value = old


@contextmanager
def flat_shared():
    """Inside, a static __shared__ index past its dimension but inside the array reads on into the
    array, as a GPU does (Bs[0][64] of a float Bs[8][64] is Bs[1][0]), instead of faulting: the
    exercise checks run a launch that faulted so once more, to show what the read computes."""
    flag = ctypes.c_int.in_dll(runtime_library(), "clemu_flat_shared")
    old, flag.value = flag.value, 1
    try:
        yield
    finally:
        flag.value = old


def cache_dir() -> Path:
    d = Path(os.environ.get("CONVLAB_CACHE") or Path.home() / ".cache" / "convlab") / "emu"
    d.mkdir(parents=True, exist_ok=True)
    return d


class _Buf(ctypes.Structure):
    _fields_ = [("p", ctypes.c_void_p), ("nbytes", ctypes.c_longlong)]


class _Launch(ctypes.Structure):
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared_bytes", ctypes.c_longlong),
                ("shared_limit", ctypes.c_longlong), ("order", ctypes.c_int), ("seed", ctypes.c_uint), ("timeout_s", ctypes.c_double),
                ("n_workers", ctypes.c_int), ("use_fibers", ctypes.c_int), ("stack_bytes", ctypes.c_longlong),
                ("body", ctypes.c_void_p), ("args", ctypes.POINTER(ctypes.c_void_p)), ("n_bufs", ctypes.c_int),
                ("bufs", ctypes.POINTER(_Buf)), ("buf_names", ctypes.POINTER(ctypes.c_char_p)),
                ("buf_elem", ctypes.POINTER(ctypes.c_longlong)),
                ("detect", ctypes.c_int), ("profile", ctypes.c_int), ("async_proxy", ctypes.c_int),
                ("status", ctypes.c_int), ("message", ctypes.c_char * 4096)]


def _run_compiler(args: list[str]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(args, capture_output=True, text=True)
    except FileNotFoundError:
        raise CompileError(f"the emulator compiles kernels with a C++ compiler, and `{args[0]}` is not installed: "
                           f"install g++ (Debian/Ubuntu: sudo apt-get install g++; macOS: xcode-select --install), "
                           f"or name another with the CXX environment variable") from None


def compile_library(cpp_text: str, key: str, flags: list[str], display: str, libs: list[str] = (),
                    source=None, link_flags: list[str] = (), check=None) -> Path:
    """g++ cpp_text into a shared library named by `key` in the cache, once per key (a content
    hash); concurrent processes race harmlessly (atomic rename). Errors name `display`. With
    link_flags the source is compiled and linked in two steps (flags only for the first: a
    sanitizer's flags must not pull in its run-time library); check(so) may refuse the library
    (raise CompileError) before it enters the cache."""
    out = cache_dir() / f"{key}.so"
    if out.exists():
        return out
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        src = Path(tmp) / "module.cpp"
        src.write_text(cpp_text)
        so = Path(tmp) / "module.so"
        if link_flags:
            obj = Path(tmp) / "module.o"
            compile_flags = [f for f in CXXFLAGS if f != "-shared"]
            r = _run_compiler([CXX, *compile_flags, *flags, "-c", str(src), "-o", str(obj)])
            if r.returncode == 0:
                r2 = _run_compiler([CXX, "-shared", str(obj), *libs, *link_flags, "-o", str(so)])
                r = subprocess.CompletedProcess(r2.args, r2.returncode, (r.stdout or "") + (r2.stdout or ""),
                                                (r.stderr or "") + (r2.stderr or ""))
        else:
            r = _run_compiler([CXX, *CXXFLAGS, *flags, str(src), *libs, "-o", str(so)])
        msg = (r.stderr or "") + (r.stdout or "")
        if "stack usage" in msg and r.returncode == 0:
            lines = [l for l in msg.splitlines() if "stack usage" in l]
            raise CompileError(
                f"{display}: a kernel's local variables need more stack than the emulator gives a CUDA thread "
                f"({STACK_BYTES // 1024} KB; a GPU thread has far less fast local memory): make local arrays "
                f"smaller or move them to shared memory.\n" + "\n".join(lines))
        if r.returncode != 0:
            msg = map_compiler_output(msg)
            raise CompileError(f"{display} does not compile (g++, emulator):\n" + (locate(msg, source) if source else msg))
        if check:
            check(so)
        os.replace(so, out)
    return out


class _Runtime:
    _lock = threading.Lock()
    _lib = None
    path = None
    shadow_offset = 0

    @classmethod
    def get(cls):
        with cls._lock:
            if cls._lib is None:
                text = RUNTIME_SRC.read_text() + (INCLUDE / "clemu_abi.h").read_text()
                text += (INCLUDE / "clemu_mma_numerics.h").read_text()
                text += PROFILE_SRC.read_text() + (INCLUDE / "clemu_profile.h").read_text()
                text += GUARD_SRC.read_text() + (HERE / "guard.h").read_text()
                key = "runtime-" + hashlib.sha256((text + " ".join(CXXFLAGS)).encode()).hexdigest()[:20]
                # the profiler (profile.cpp) and the guard (guard.cpp) are more translation units of the library
                so = compile_library(RUNTIME_SRC.read_text(), key,
                                     ["-I", str(INCLUDE), "-I", str(HERE), "-pthread", "-fvisibility=hidden",
                                      "-fvisibility-inlines-hidden"], "emulator runtime", [str(PROFILE_SRC), str(GUARD_SRC)])
                # RTLD_LOCAL: kernel modules link against this file by path instead (see compile)
                lib = ctypes.CDLL(str(so), mode=ctypes.RTLD_LOCAL)
                cls.path = so
                for f in ("clemu_start", "clemu_stop", "clemu_wait"):
                    getattr(lib, f).restype = ctypes.c_int
                lib.clemu_start.argtypes = [ctypes.POINTER(_Launch)]
                lib.clemu_stop.argtypes = [ctypes.POINTER(_Launch), ctypes.c_int]
                lib.clemu_wait.argtypes = [ctypes.POINTER(_Launch), ctypes.c_double]
                lib.clemu_progress.argtypes = [ctypes.POINTER(ctypes.c_longlong)] * 3
                lib.clemu_take_output.argtypes = [ctypes.c_char_p, ctypes.c_longlong]
                lib.clemu_take_output.restype = ctypes.c_longlong
                lib.clemu_guard_offset.restype = ctypes.c_ulonglong
                lib.clemu_module_loaded.argtypes = [ctypes.c_char_p]
                lib.clemu_heap_limit.argtypes = [ctypes.c_longlong]
                lib.clemu_heap_bytes.restype = ctypes.c_longlong
                cls.shadow_offset = lib.clemu_guard_offset()   # reserves the guard's shadow (guard.cpp)
                cls._lib = lib
            return cls._lib


def runtime_library():
    """The emulator's runtime (runtime.cpp and profile.cpp) as a ctypes library, built on first use."""
    return _Runtime.get()


_SITE_RE = re.compile(r"\{\{(site|chain):(.+?)\+(0x[0-9a-f]+)\}\}")
_site_names: dict = {}


def _frames(so: str, offsets: list) -> dict:
    """offset -> the source lines of its inlined frames, innermost first, outside convlab's own
    headers and the launchers (addr2line on the module's line tables)."""
    try:
        r = subprocess.run(["addr2line", "-i", "-a", "-e", so, *[hex(int(o, 16) - 1) for o in offsets]],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    frames, key = {}, None
    for line in r.stdout.splitlines():
        if line.startswith("0x"):
            key = int(line, 16) + 1
            frames[key] = []
        elif key is not None:
            path, _, no = line.split(" (discriminator")[0].strip().rpartition(":")
            if path and path != "??" and no.isdigit() and no != "0" and not path.startswith((str(INCLUDE), "<", "/usr/")):
                frames[key].append(where(path, no))
    return frames


def resolve_sites(text: str) -> str:
    """Turn the runtime's {{site:MODULE+OFFSET}} tokens into source lines (addr2line on the module's
    line tables; the innermost frame outside convlab's own headers, as where() names it), and its
    {{chain:..}} tokens into that line and the lines whose inlined calls led to it ("LINE, called
    at LINE")."""
    found = _SITE_RE.findall(text)
    names = _site_names   # a module file never changes under its name (content hash)
    for so in {f[1] for f in found}:
        offs = sorted({off for _, s, off in found if s == so and (s, off) not in names})
        if not offs or Path(so).parent != cache_dir():
            continue   # outside the kernel modules (the C library, say): no line of the student's
        frames = _frames(so, offs)
        for off in offs:
            fr = frames.get(int(off, 16), [])
            names[(so, off)] = fr or ["an unknown line"]

    def name(m):
        fr = names.get((m[2], m[3]), ["an unknown line"])
        if m[1] == "site":
            return fr[0]
        chain = [f for i, f in enumerate(fr) if i == 0 or f != fr[i - 1]]
        return ", called at ".join(chain)
    return _SITE_RE.sub(name, text)


def _one_report_per_fix(text: str) -> str:
    """The runtime tells races apart by instruction; two instructions of the same lines (an
    unrolled loop, say) make the same report to a student: keep the first per fix."""
    seen, keep = set(), []
    for line in text.split("\n"):
        fix = line.split("nothing orders the two. ", 1)[-1]
        if line.startswith("data race on") and fix in seen:
            continue
        seen.add(fix)
        keep.append(line)
    return "\n".join(keep)


def _flush_printf(lib):
    n = lib.clemu_take_output(None, 0)
    if n:
        buf = ctypes.create_string_buffer(n)
        n = lib.clemu_take_output(buf, n)
        sys.stdout.write(buf.raw[:n].decode(errors="replace"))
        sys.stdout.flush()


def _elem(p) -> str:
    """The element type of a pointer parameter as written, without restrict."""
    head = p.ctype.split("*")[0]
    return " ".join(w for w in head.split() if w not in ("__restrict__", "__restrict", "restrict"))


def _scalar_type(p) -> str:
    return " ".join(w for w in p.ctype.split() if w not in ("const", "volatile", "__grid_constant__"))


class EmuBackend:
    name = "emu"
    device_type = "cpu"

    def __init__(self):
        self.threads = int(os.environ.get("CONVLAB_EMU_THREADS") or os.cpu_count() or 1)

    def encode_tensor_map(self, dtype: int, address: int, dims, strides, box, swizzle: int,
                          element_strides=None) -> bytes:
        """The 128 bytes a kernel's CUtensorMap parameter receives on the emulator: the same fields
        as the driver's cuTensorMapEncodeTiled (dims, box and element strides innermost first, in
        elements; strides in bytes for dims[1:]; swizzle 0 none, 1 32B, 2 64B, 3 128B), read by
        clemu_hopper.h's TMA loads."""
        def pad(v, n):
            return list(v) + [0] * (n - len(v))
        return _TMAP.pack(_TMAP_MAGIC, dtype, len(dims), swizzle, address, *pad(dims, 5), *pad(strides, 4),
                          *pad(box, 5), _MAP_ELEM_BYTES[dtype], *pad(element_strides or [1] * len(dims), 5))

    def set_heap_size(self, nbytes: int):
        """The device heap of malloc and new in device code (a GPU's cudaLimitMallocHeapSize)."""
        if _Runtime.get().clemu_heap_limit(nbytes) != 0:
            raise LaunchError(f"the device heap cannot change to {nbytes:,} bytes while blocks of it are still "
                              f"allocated (kernels that malloc without free): as on a GPU, set the heap's size before "
                              f"the kernels that use it run")

    def compile(self, src: Source, defines: dict, options: list[str]) -> "EmuModule":
        rt = _Runtime.get()
        device_code.check_host_functions(src)
        device_code.check_std_library(src)
        body = rewrite_for_emulator(src)
        launchers = []
        for k in src.kernels.values():
            args, nbuf = [], 0
            for i, p in enumerate(k.params):
                if p.pointer and p.base != "pointer":
                    args.append(f"::clemu::ptr<{_elem(p)}>::make(a[{i}], {nbuf})")
                    nbuf += 1
                elif p.pointer:
                    raise CompileError(
                        f"{where(src.path, k.line)}: parameter `{p}` of {k.name} is a pointer to pointers: the "
                        f"emulator checks every access against the buffers a launch passes, and cannot follow the "
                        f"pointers stored in one. Pass each buffer as a parameter of its own.")
                else:
                    args.append(f"*({_scalar_type(p)}*)a[{i}]")
            # the launcher reads Python's argument block: it is the one function the guard does not check
            launchers.append(f'extern "C" __attribute__((no_sanitize_address)) void __clemu_body_{k.name}(void** a) '
                             f'{{ {k.name}({", ".join(args)}); }}')
        text = (f'#line 1 "{src.path}"\n{body}\n#line 1 "<convlab launchers>"\n' + "\n".join(launchers) + "\n")
        flags = ["-I", str(INCLUDE), "-include", "cuda_emu.h", f"-Wstack-usage={STACK_BYTES - 16 * 1024}"]
        flags += device_code.compile_flags(_Runtime.shadow_offset)
        libs = ["-Wl,--no-as-needed", str(_Runtime.path)]
        flags += ["-I", str(src.path.parent), "-I", str(repo_root() / "kernels")]
        flags += [f"-D{k}" if v is None else f"-D{k}={v}" for k, v in defines.items()] + list(options)
        header = "".join(p.read_text() for p in sorted(INCLUDE.iterdir()))
        digest = hashlib.sha256(
            (text + header + " ".join(flags + libs + CXXFLAGS + device_code.LINK_FLAGS)
             + "".join(p.read_text() for p in src.includes)).encode()
        ).hexdigest()[:20]
        device_code.check_inline_asm(text, src, flags, INCLUDE, CXX)

        def build(hooks: bool):
            key = f"{src.path.stem}-{'hooks-' if hooks else ''}{digest}"
            so = compile_library(text, key, flags + (["-DCLEMU_HOOKS"] if hooks else []), display_name(src.path), libs,
                                 src, link_flags=device_code.LINK_FLAGS,
                                 check=lambda so: device_code.check_host_calls(so, src, INCLUDE))
            lib = ctypes.CDLL(str(so))
            rt.clemu_module_loaded(str(so).encode())   # its __constant__ and __device__ data are the kernels'
            return lib
        uses_barriers = bool(_BARRIER_RE.search(src.all_text()))
        uses_async = bool(_ASYNC_RE.search(strip_comments(src.all_text())))
        return EmuModule(self, rt, build, src, uses_barriers, uses_async=uses_async)

    def compile_cpu(self, src: Source, functions: dict, defines: dict, options: list[str]) -> "EmuModule":
        """Plain C++ (chapter 1): run each call as a one-thread launch, so a crash or an endless loop
        in it becomes an error message instead of a dead notebook."""
        rt = _Runtime.get()
        wrappers = []
        for name, params in functions.items():
            args = []
            for i, p in enumerate(params):
                if p.pointer:
                    args.append(f"(({p.ctype.replace('__restrict__', '')})((clemu_buf*)a[{i}])->p)")
                else:
                    args.append(f"*({_scalar_type(p)}*)a[{i}]")
            wrappers.append(f'extern "C" void __clemu_body_{name}(void** a) {{ {name}({", ".join(args)}); }}')
        text = (f'#include "clemu_abi.h"\n#line 1 "{src.path}"\n{src.text}\n#line 1 "<convlab wrappers>"\n'
                + "\n".join(wrappers) + "\n")
        flags = ["-I", str(INCLUDE), "-I", str(src.path.parent), "-O3"]
        flags += [f"-D{k}" if v is None else f"-D{k}={v}" for k, v in defines.items()] + list(options)
        key = src.path.stem + "-cpu-" + hashlib.sha256((text + " ".join(flags + CXXFLAGS)).encode()).hexdigest()[:20]
        so = compile_library(text, key, flags, display_name(src.path), source=src)
        return EmuModule(self, rt, ctypes.CDLL(str(so)), src, False, cpu=True)


class EmuModule:
    """A compiled kernel file. Two builds of it, each made when first needed: with the per-access
    hooks (launches under the race detector) and without (launches at full speed). The hooked
    build is made first, so compile errors show when the file is loaded; a kernel the hooked
    build cannot compile runs without the detector."""

    def __init__(self, backend, rt, build, src, uses_barriers, cpu: bool = False, uses_async: bool = False):
        self.backend, self.rt, self.src = backend, rt, src
        self.uses_barriers = uses_barriers
        self.uses_async = uses_async      # Hopper's async path: the runtime records ordinary shared stores too
        self._constants = {}
        self._cpu = cpu
        if cpu:   # plain C++ (cl.load_cpu): one build, no hooks
            self._build, self._libs = None, {False: build}
            return
        self._build, self._libs = build, {}
        try:
            self._libs[True] = build(True)
        except CompileError as e:
            self._libs[False] = build(False)   # raises the student's own compile error
            self._libs[True] = None
            # said out loud: a file that silently lost its race checks could pass with a race in it
            first = next((line for line in str(e).splitlines() if "error" in line), str(e).splitlines()[0])
            warnings.warn(
                f"{display_name(src.path)}: the race detector cannot build this file, so its launches run "
                f"WITHOUT race checks. g++ said: {first.strip()}\nThe usual cause: an element of a buffer "
                "passed to a `T&` parameter (under the detector an element is a checked object, not a "
                "plain reference): pass the value and return the result, or take the parameter as a "
                "template (`template <class E> __device__ void f(E&& e)`).", RaceDetectorOff, stacklevel=2)

    @property
    def can_detect(self) -> bool:
        return self._libs.get(True) is not None

    def _lib(self, hooks: bool):
        if hooks and self.can_detect:
            return self._libs[True]
        if False not in self._libs:
            self._libs[False] = self._build(False)
            for name, data in self._constants.items():
                self._write_constant(self._libs[False], name, data)
        return self._libs[False]

    def body(self, name: str, hooks: bool = False) -> int:
        return ctypes.cast(getattr(self._lib(hooks), f"__clemu_body_{name}"), ctypes.c_void_p).value

    def set_constant(self, name: str, data: bytes):
        for lib in self._libs.values():
            if lib is not None:
                self._write_constant(lib, name, data)
        self._constants[name] = data

    def _write_constant(self, lib, name: str, data: bytes):
        n = ctypes.c_longlong()
        try:
            f = getattr(lib, f"__clemu_const_{name}")
        except AttributeError:
            raise ArgumentError(f"__constant__ {name} is not in this build of {self.src.path.name}: is it inside "
                                f"an #if that the defines turned off?") from None
        f.restype = ctypes.c_void_p
        f.argtypes = [ctypes.POINTER(ctypes.c_longlong)]
        addr = f(ctypes.byref(n))
        if len(data) > n.value:
            raise ArgumentError(f"__constant__ {name} holds {n.value} bytes, but {len(data)} were given")
        ctypes.memmove(addr, data, len(data))

    def launch(self, name, checked, grid, block, shared, order="forward", timeout=10.0, seed=0, fibers=None,
               shared_limit: int = 0, total: float | None = None):
        """checked: [(param, ctype, value)] from _args.check_args. timeout: how long the launch may go
        without a CUDA thread finishing; total: how long it may run at all (None: as long as it moves)."""
        n = len(checked)
        argv = (ctypes.c_void_p * max(n, 1))()
        keep = []
        # the buffer arguments: the kernel's pointer parameters read these very structs, which the
        # runtime points at its staged copies for the launch (guard.cpp)
        pointers = [(i, v) for i, (p, t, v) in enumerate(checked) if p.pointer]
        buf_arr = (_Buf * max(len(pointers), 1))(*[_Buf(v.data_ptr(), v.numel() * v.element_size()) for _, v in pointers])
        name_arr = (ctypes.c_char_p * max(len(pointers), 1))(*[checked[i][0].name.encode() for i, _ in pointers])
        elem_arr = (ctypes.c_longlong * max(len(pointers), 1))(*[v.element_size() for _, v in pointers])
        for j, (i, _) in enumerate(pointers):
            argv[i] = ctypes.addressof(buf_arr[j])
        for i, (p, t, v) in enumerate(checked):
            if p.pointer:
                continue
            elif t.kind == "m":      # a CUtensorMap by value: 128 bytes, 64-byte aligned as the struct is
                raw = ctypes.create_string_buffer(128 + 64)
                addr = (ctypes.addressof(raw) + 63) & ~63
                ctypes.memmove(addr, v.encoded, 128)
                keep.append(raw)
                argv[i] = addr
            else:
                if p.base == "half":
                    c = ctypes.c_uint16(int(torch.tensor(v, dtype=torch.float16).view(torch.int16).item()) & 0xFFFF)
                else:
                    c = t.ctype(v)
                keep.append(c)
                argv[i] = ctypes.addressof(c)
        L = _Launch()
        L.grid[:] = grid
        L.block[:] = block
        L.shared_bytes = shared
        L.shared_limit = shared_limit          # 0: no limit (a CPU function)
        L.order = {"forward": 0, "reverse": 1, "shuffled": 2}[order]
        L.seed = seed & 0xFFFFFFFF
        L.timeout_s = float(timeout)
        L.n_workers = self.backend.threads
        L.use_fibers = int(self.uses_barriers if fibers is None else fibers)
        L.stack_bytes = STACK_BYTES
        small = grid[0] * grid[1] * grid[2] * block[0] * block[1] * block[2] <= AUTO_DETECT_THREADS
        detect = detect_setting()
        detect = bool(small if detect is None else detect) and self.can_detect
        # cl.profile and cl.trace count through the same hooks (convlab/gpu/emu/profile.cpp)
        rec = recorder()
        profiling = rec is not None and not self._cpu
        if profiling and not self.can_detect:
            raise ProfileUnavailable(f"{name}: this file compiles only without the emulator's per-access hooks, "
                                     f"so the emulator cannot count its memory accesses")
        # a small launch without the detector takes the hooked build when the plain one is not made
        # yet (hooks off cost little there), so it compiles no second build
        hooked = detect or profiling or (small and self.can_detect and False not in self._libs)
        L.body = self.body(name, hooks=hooked)
        L.args = argv
        L.n_bufs = len(pointers)
        L.bufs = buf_arr
        L.buf_names = name_arr
        L.buf_elem = elem_arr
        L.detect = int(detect)
        L.profile = int(profiling)
        L.async_proxy = int(self.uses_async)
        with _one_launch:
            if profiling:
                rec.arm(self.rt)
            status, watch = self._run(L, name, grid, block, timeout, total)
            if profiling and not status:      # the runtime keeps the counts until the next launch
                rec.record(self.rt, name, grid, block, self.src, checked)
        _flush_printf(self.rt)
        if status:
            text = locate(resolve_sites(L.message.decode(errors="replace")), self.src)
            # a race between two accesses of one line: a statement that reads what other lanes of its warp
            # write needs its read and its write split around the __syncwarp(); elsewhere the barrier
            # goes after the line, inside its loop
            text = re.sub(r"put a (__syncwarp\([^)]*\)) between (.+?) and \2 \((.+?) must reach it\), so the "
                          r"(?:write|read) at \2 is finished in every lane before the (?:write|read) at \2 starts\.",
                          r"the statement at \2 both reads an element other lanes write and writes one they read: "
                          r"read into a register, then \1, then write (`v += s[t + k]; \1; s[t] = v; \1;`); "
                          r"\3 must reach each \1.", text)
            # one line's two accesses: in a loop, the barrier ends the iteration; in one statement, a barrier
            # cannot go inside it, so its read and its write are split around one
            text = re.sub(r"between (.+?) and \1\{\{loop\}\} \(", r"right after \1, inside its loop (", text)
            text = re.sub(r"Put a (__syncthreads\(\)) between (.+?) and \2 \((.+?) must reach it\), so the "
                          r"(?:write|read) at \2 is finished in every thread before the (?:write|read) at \2 starts\.",
                          r"The statement at \2 both reads an element another thread writes and writes one another "
                          r"thread reads, and a barrier cannot go inside one statement: read into a register, then \1, "
                          r"then write (`float v = ...; \1; ... = v;`); \3 must reach it.", text)
            text = text.replace("{{loop}}", "")
            if status == RACE:
                text = _one_report_per_fix(text)
            if status == TIMEOUT:
                text = watch.message(text)
            elif status == INTERRUPT:
                raise KernelInterrupted(
                    f"{name}: interrupted after {watch.elapsed:.1f} s and stopped ({text or 'no running thread identified'}; "
                    f"{watch.work()}). Nothing is left running; the notebook can go on.")
            cls = _STATUS.get(status, KernelFault)
            raise cls(f"{name}: " + text)

    def _run(self, L, name, grid, block, stall, total):
        """Start the launch and wait for it in slices of 0.1 s: a progress line after 2 s (in an
        interactive session), the interrupt, and the watchdog, which stops a launch in which no CUDA
        thread has finished for `stall` seconds (a loop that never ends), or that has run `total`
        seconds (a limit of its own, e.g. an exercise check's). (status, Watch)."""
        watch = _Watch(grid, block, stall, total)
        status = self.rt.clemu_start(ctypes.byref(L))
        if status:
            return status, watch
        progress = _Progress()
        started, blocks, threads = ctypes.c_longlong(), ctypes.c_longlong(), ctypes.c_longlong()
        try:
            while not self.rt.clemu_wait(ctypes.byref(L), 0.1):
                self.rt.clemu_progress(ctypes.byref(started), ctypes.byref(blocks), ctypes.byref(threads))
                watch.saw(blocks.value, threads.value)
                if watch.stop_why():
                    self.rt.clemu_stop(ctypes.byref(L), TIMEOUT)
                    break
                if watch.elapsed > PROGRESS_AFTER_S:
                    progress.show(f"{name}: {watch.blocks:,} of {watch.n_blocks:,} blocks done, "
                                  f"{watch.elapsed:.0f} s{watch.eta()} (interrupt to stop it)")
        except KeyboardInterrupt:
            self.rt.clemu_stop(ctypes.byref(L), INTERRUPT)
        self.rt.clemu_progress(ctypes.byref(started), ctypes.byref(blocks), ctypes.byref(threads))
        watch.saw(blocks.value, threads.value)
        progress.end(f"{name}: {'done' if L.status == 0 else 'stopped'} after {watch.elapsed:.1f} s")
        return L.status, watch


class _Watch:
    """The watchdog's view of a running launch: its work, how far it got, and when it last moved
    (a CUDA thread finished). A launch that moves is never stopped for being long, unless it has a
    total limit of its own; one in which no thread finishes for `stall` seconds is stuck."""

    def __init__(self, grid, block, stall: float, total: float | None):
        self.n_blocks = grid[0] * grid[1] * grid[2]
        self.per_block = block[0] * block[1] * block[2]
        self.stall, self.total = stall, total
        self.t0 = self.moved = time.monotonic()
        self.elapsed, self.blocks, self.threads, self.why = 0.0, 0, 0, None

    def saw(self, blocks: int, threads: int):
        now = time.monotonic()
        if threads != self.threads:
            self.moved = now
        self.blocks, self.threads, self.elapsed = blocks, threads, now - self.t0

    def stop_why(self):
        now = time.monotonic()
        if self.total is not None and self.elapsed > self.total:
            self.why = "total"
        elif now - self.moved > self.stall:
            self.why = "stall"
        return self.why

    def rate(self) -> float:
        """Blocks a second so far (from the threads that finished while no block had yet)."""
        done = self.blocks or self.threads / self.per_block
        return done / self.elapsed if self.elapsed > 0 else 0.0

    def need(self) -> float | None:
        r = self.rate()
        return self.n_blocks / r if r > 0 else None

    def eta(self) -> str:
        need = self.need()
        return f", about {need - self.elapsed:,.0f} s to go" if need and need > self.elapsed else ""

    def work(self) -> str:
        return (f"{self.n_blocks:,} blocks of {self.per_block:,} threads; {self.blocks:,} finished "
                f"in {self.elapsed:.1f} s")

    def message(self, where: str) -> str:
        where = where or "no running thread identified"
        moving = time.monotonic() - self.moved < min(self.stall, 1.0)
        if self.why == "total" and moving:
            need = self.need()
            at = f", about {self.rate():.3g} blocks a second: it would need about {need:,.0f} s" if need else ""
            return (f"the launch ran out of the {self.total:g} s it may take here and was stopped ({where}). It was "
                    f"not stuck, only long for the emulator: {self.work()}{at} on this CPU. Run a smaller shape (the "
                    f"checks' shapes take well under a second), or allow more time with cl.set_timeout(seconds).")
        quiet = time.monotonic() - self.moved
        return (f"no CUDA thread finished in the last {quiet:.0f} s, so the kernel was stopped ({where}); "
                f"{self.work()}. Look for a loop whose end condition never becomes true (a grid-stride loop that "
                f"does not advance, a wait on a value no thread writes). If one thread really works this long, allow "
                f"more: cl.set_timeout(60) (how long a launch may go without a thread finishing), or timeout=60 in "
                f"this launch.")


class _Progress:
    """A long launch's progress line: on a terminal one stderr line rewritten with \\r, ended by the
    final one; in a notebook a display updated in place and emptied at the end, so a saved notebook
    keeps no trace of it (a stream keeps every \\r update, and its times differ on every run)."""

    def __init__(self):
        # CONVLAB_PROGRESS=0 (make test, and pytest through conftest.py): none, so that no output a
        # test compares depends on how fast the machine is
        self.off = os.environ.get("CONVLAB_PROGRESS", "1") == "0"
        ip = sys.modules.get("IPython")
        shell = ip.get_ipython() if ip and hasattr(ip, "get_ipython") else None
        self.notebook = shell is not None and hasattr(shell, "kernel")
        self.handle, self.shown = None, False

    def show(self, text: str):
        if self.off:
            return
        if self.notebook:
            from IPython.display import display
            if self.handle is None:
                self.handle = display({"text/plain": text}, raw=True, display_id=True)
            else:
                self.handle.update({"text/plain": text}, raw=True)
        else:
            sys.stderr.write(f"\r{text} ")
            sys.stderr.flush()
        self.shown = True

    def end(self, text: str):
        if not self.shown:
            return
        if self.handle is not None:
            self.handle.update({"text/plain": ""}, raw=True)
        else:
            sys.stderr.write(f"\r{text}" + " " * 60 + "\n")
            sys.stderr.flush()
