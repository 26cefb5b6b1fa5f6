"""The one C extension convlab builds for itself (launch.c: cuLaunchKernel in one C call, and Route:
a kept route's GPU work, its allocations, copies and launches, in one C call), compiled on first use
with the machine's C compiler against this Python's headers, into convlab's cache. Where it cannot
be built (no compiler, no Python headers), fast_launch() and route_type() are None: the GPU backend
launches through ctypes and routes run through Python, as correct and a few microseconds slower
per call."""
from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

_SOURCE = Path(__file__).with_name("launch.c")
_loaded: list = []


def _cache() -> Path:
    return Path(os.environ.get("CONVLAB_CACHE") or Path.home() / ".cache" / "convlab") / "native"


def build() -> Path:
    """The compiled extension for this Python (built once per source text and interpreter)."""
    text = _SOURCE.read_bytes()
    tag = hashlib.sha256(text + sys.version.encode() + sys.executable.encode()).hexdigest()[:16]
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    out = _cache() / f"convlab_launch_{tag}{suffix}"
    if out.exists():
        return out
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    include = sysconfig.get_paths()["include"]
    if cc is None or not (Path(include) / "Python.h").exists():
        raise OSError("no C compiler or no Python headers")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    r = subprocess.run([cc, "-O2", "-Wall", "-shared", "-fPIC", f"-I{include}", str(_SOURCE), "-o", str(tmp)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise OSError(f"{cc} failed: {r.stderr.strip()[:500]}")
    os.replace(tmp, out)          # another process building the same file at once: either copy will do
    return out


def fast_launch():
    """launch(address, function, gx, gy, gz, bx, by, bz, shared, stream, params) -> error code, or
    None where the extension cannot be built here (the reason is in why_not())."""
    if not _loaded:
        try:
            path = build()
            spec = importlib.util.spec_from_file_location("convlab_launch", path)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            _loaded[:] = [mod.launch, None, mod]
        except (OSError, ImportError) as e:
            _loaded[:] = [None, str(e), None]
    return _loaded[0]


def route_type():
    """convlab_launch.Route (see launch.c), or None where the extension cannot be built."""
    fast_launch()
    return None if _loaded[2] is None else _loaded[2].Route


def launched() -> int:
    """How many kernels Routes have launched so far, all together (0 where none can be made)."""
    fast_launch()
    return 0 if _loaded[2] is None else _loaded[2].launched()


def now_ns() -> int:
    """The monotonic clock a Route's expiry is read against (ns); only where route_type() is not None."""
    return _loaded[2].now()


def why_not() -> str | None:
    """Why fast_launch() is None (None when it is not)."""
    fast_launch()
    return _loaded[1]
