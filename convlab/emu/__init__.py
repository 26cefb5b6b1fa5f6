"""The emulator backend: a .cu file compiled by g++ with cuda_emu.h, loaded with ctypes and
launched over the grid by runtime.cpp. The same file runs on a GPU through PyCUDA."""
from __future__ import annotations

import ctypes
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import torch


from .._errors import (ArgumentError, BarrierError, CompileError, KernelFault, KernelTimeout, LaunchError,
                       OutOfBoundsError)
from .._source import Source, map_compiler_output, rewrite_for_emulator

HERE = Path(__file__).resolve().parent
INCLUDE = HERE / "include"
RUNTIME_SRC = HERE / "runtime.cpp"
STACK_BYTES = 128 * 1024          # per CUDA thread (fiber)
CXX = os.environ.get("CXX", "g++")
CXXFLAGS = ["-std=c++17", "-O2", "-fPIC", "-shared", "-fno-strict-aliasing", "-fno-fast-math",
            "-Wno-unknown-pragmas", "-Wno-attributes"]
_BARRIER_RE = re.compile(r"\b(__syncthreads\w*|__syncwarp|__shfl\w*|__ballot_sync|__any_sync|__all_sync)\b")
_STATUS = {1: KernelFault, 2: BarrierError, 3: OutOfBoundsError, 4: KernelTimeout, 5: OutOfBoundsError,
           6: KernelFault, 7: KernelFault, 8: KernelFault, 9: LaunchError}


def cache_dir() -> Path:
    d = Path(os.environ.get("CONVLAB_CACHE") or Path.home() / ".cache" / "convlab") / "emu"
    d.mkdir(parents=True, exist_ok=True)
    return d


class _Buf(ctypes.Structure):
    _fields_ = [("p", ctypes.c_void_p), ("nbytes", ctypes.c_longlong)]


class _Launch(ctypes.Structure):
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared_bytes", ctypes.c_longlong),
                ("order", ctypes.c_int), ("seed", ctypes.c_uint), ("timeout_s", ctypes.c_double),
                ("n_workers", ctypes.c_int), ("use_fibers", ctypes.c_int), ("stack_bytes", ctypes.c_longlong),
                ("body", ctypes.c_void_p), ("args", ctypes.POINTER(ctypes.c_void_p)), ("n_bufs", ctypes.c_int),
                ("bufs", ctypes.POINTER(_Buf)), ("buf_names", ctypes.POINTER(ctypes.c_char_p)),
                ("status", ctypes.c_int), ("message", ctypes.c_char * 4096)]


def _compile(cpp_text: str, key: str, flags: list[str], display: str, libs: list[str] = ()) -> Path:
    """Compile once per content hash; concurrent processes race harmlessly (atomic rename)."""
    out = cache_dir() / f"{key}.so"
    if out.exists():
        return out
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        src = Path(tmp) / "module.cpp"
        src.write_text(cpp_text)
        so = Path(tmp) / "module.so"
        r = subprocess.run([CXX, *CXXFLAGS, *flags, str(src), *libs, "-o", str(so)], capture_output=True, text=True)
        msg = (r.stderr or "") + (r.stdout or "")
        if "stack usage" in msg and r.returncode == 0:
            lines = [l for l in msg.splitlines() if "stack usage" in l]
            raise CompileError(
                f"{display}: a kernel's local variables need more stack than the emulator gives a CUDA thread "
                f"({STACK_BYTES // 1024} KB; a GPU thread has far less fast local memory): make local arrays "
                f"smaller or move them to shared memory.\n" + "\n".join(lines))
        if r.returncode != 0:
            raise CompileError(f"{display} does not compile (g++, emulator):\n" + map_compiler_output(msg))
        os.replace(so, out)
    return out


class _Runtime:
    _lock = threading.Lock()
    _lib = None
    path = None

    @classmethod
    def get(cls):
        with cls._lock:
            if cls._lib is None:
                text = RUNTIME_SRC.read_text() + (INCLUDE / "clemu_abi.h").read_text()
                key = "runtime-" + hashlib.sha256((text + " ".join(CXXFLAGS)).encode()).hexdigest()[:20]
                so = _compile(RUNTIME_SRC.read_text(), key, ["-I", str(INCLUDE), "-pthread", "-fvisibility=hidden",
                                                             "-fvisibility-inlines-hidden"], "emulator runtime")
                # RTLD_LOCAL: kernel modules link against this file by path instead (see compile)
                lib = ctypes.CDLL(str(so), mode=ctypes.RTLD_LOCAL)
                cls.path = so
                lib.clemu_run.argtypes = [ctypes.POINTER(_Launch)]
                lib.clemu_run.restype = ctypes.c_int
                lib.clemu_take_output.argtypes = [ctypes.c_char_p, ctypes.c_longlong]
                lib.clemu_take_output.restype = ctypes.c_longlong
                cls._lib = lib
            return cls._lib


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
    return " ".join(w for w in p.ctype.split() if w not in ("const", "volatile"))


class EmuBackend:
    name = "emu"
    device_type = "cpu"

    def __init__(self):
        self.threads = int(os.environ.get("CONVLAB_EMU_THREADS") or os.cpu_count() or 1)

    def compile(self, src: Source, defines: dict, options: list[str]) -> "EmuModule":
        rt = _Runtime.get()
        body = rewrite_for_emulator(src)
        launchers = []
        for k in src.kernels.values():
            args, nbuf = [], 0
            for i, p in enumerate(k.params):
                if p.pointer and p.base != "pointer":
                    args.append(f"::clemu::ptr<{_elem(p)}>::make(a[{i}], {nbuf})")
                    nbuf += 1
                elif p.pointer:
                    args.append(f"(({_scalar_type(p)})((clemu_buf*)a[{i}])->p)")
                else:
                    args.append(f"*({_scalar_type(p)}*)a[{i}]")
            launchers.append(f'extern "C" void __clemu_body_{k.name}(void** a) {{ {k.name}({", ".join(args)}); }}')
        text = (f'#line 1 "{src.path}"\n{body}\n#line 1 "<convlab launchers>"\n' + "\n".join(launchers) + "\n")
        flags = ["-I", str(INCLUDE), "-include", "cuda_emu.h", f"-Wstack-usage={STACK_BYTES - 16 * 1024}"]
        libs = ["-Wl,--no-as-needed", str(_Runtime.path)]
        from ..book import repo_root
        flags += ["-I", str(src.path.parent), "-I", str(repo_root() / "kernels")]
        flags += [f"-D{k}" if v is None else f"-D{k}={v}" for k, v in defines.items()] + list(options)
        header = "".join(p.read_text() for p in sorted(INCLUDE.iterdir()))
        key = src.path.stem + "-" + hashlib.sha256(
            (text + header + " ".join(flags + libs + CXXFLAGS) + "".join(p.read_text() for p in src.includes)).encode()
        ).hexdigest()[:20]
        so = _compile(text, key, flags, str(src.path), libs)
        lib = ctypes.CDLL(str(so))
        uses_barriers = bool(_BARRIER_RE.search(src.all_text()))
        return EmuModule(self, rt, lib, src, uses_barriers)

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
        so = _compile(text, key, flags, str(src.path))
        return EmuModule(self, rt, ctypes.CDLL(str(so)), src, False)


class EmuModule:
    def __init__(self, backend, rt, lib, src, uses_barriers):
        self.backend, self.rt, self.lib, self.src = backend, rt, lib, src
        self.uses_barriers = uses_barriers

    def body(self, name: str) -> int:
        return ctypes.cast(getattr(self.lib, f"__clemu_body_{name}"), ctypes.c_void_p).value

    def set_constant(self, name: str, data: bytes):
        n = ctypes.c_longlong()
        try:
            f = getattr(self.lib, f"__clemu_const_{name}")
        except AttributeError:
            raise ArgumentError(f"__constant__ {name} is not in this build of {self.src.path.name}: is it inside "
                                f"an #if that the defines turned off?") from None
        f.restype = ctypes.c_void_p
        f.argtypes = [ctypes.POINTER(ctypes.c_longlong)]
        addr = f(ctypes.byref(n))
        if len(data) > n.value:
            raise ArgumentError(f"__constant__ {name} holds {n.value} bytes, but {len(data)} were given")
        ctypes.memmove(addr, data, len(data))

    def launch(self, name, checked, grid, block, shared, order="forward", timeout=60.0, seed=0, fibers=None):
        """checked: [(param, ctype, value)] from _args.check_args."""
        n = len(checked)
        argv = (ctypes.c_void_p * max(n, 1))()
        keep = []
        bufs, names = [], []
        for i, (p, t, v) in enumerate(checked):
            if p.pointer:
                b = _Buf(v.data_ptr(), v.numel() * v.element_size())
                keep.append(b)
                argv[i] = ctypes.addressof(b)
                if p.base != "pointer":
                    bufs.append(b)
                    names.append(p.name.encode())
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
        L.order = {"forward": 0, "reverse": 1, "shuffled": 2}[order]
        L.seed = seed & 0xFFFFFFFF
        L.timeout_s = float(timeout)
        L.n_workers = self.backend.threads
        L.use_fibers = int(self.uses_barriers if fibers is None else fibers)
        L.stack_bytes = STACK_BYTES
        L.body = self.body(name)
        L.args = argv
        buf_arr = (_Buf * max(len(bufs), 1))(*bufs)
        name_arr = (ctypes.c_char_p * max(len(names), 1))(*names)
        L.n_bufs = len(bufs)
        L.bufs = buf_arr
        L.buf_names = name_arr
        status = self.rt.clemu_run(ctypes.byref(L))
        _flush_printf(self.rt)
        if status:
            cls = _STATUS.get(status, KernelFault)
            raise cls(f"{name}: " + L.message.decode(errors="replace"))
