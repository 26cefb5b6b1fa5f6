"""Checking a launch's arguments against the kernel's signature, the same way on both backends:
a float64 tensor for a `float*`, a Python float for an `int`, a CPU tensor for a GPU kernel are
errors with a message that says what to pass instead."""
from __future__ import annotations

import ctypes
import numbers
from dataclasses import dataclass

import numpy as np
import torch

from . import _limits
from ._errors import ArgumentError, LaunchError
from ._source import Param
from ._tensor_map import TensorMap


@dataclass(frozen=True)
class CType:
    kind: str                     # "f" float, "i" signed int, "u" unsigned int, "b" bool, "v" vector/void,
                                  # "m" a tensor map (passed by value)
    dtypes: tuple                 # tensor dtypes a pointer to it accepts (empty: any)
    ctype: object                 # ctypes type of a scalar of it (None: pointer only)
    code: str                     # struct code of a scalar of it (how the GPU backend packs it)


_F32, _F64, _F16 = (torch.float32,), (torch.float64,), (torch.float16,)
_I32 = (torch.int32,)
_I64 = (torch.int64,)
TYPES = {
    "float": CType("f", _F32, ctypes.c_float, "f"),
    "double": CType("f", _F64, ctypes.c_double, "d"),
    "half": CType("f", _F16, ctypes.c_uint16, "H"),
    "half2": CType("v", _F16, None, ""),
    "__nv_bfloat16": CType("f", (torch.bfloat16,), ctypes.c_uint16, "H"),
    "nv_bfloat16": CType("f", (torch.bfloat16,), ctypes.c_uint16, "H"),
    "__nv_bfloat162": CType("v", (torch.bfloat16,), None, ""),
    "int": CType("i", _I32, ctypes.c_int32, "i"),
    "int32_t": CType("i", _I32, ctypes.c_int32, "i"),
    "unsigned int": CType("u", (torch.int32, torch.uint32), ctypes.c_uint32, "I"),
    "uint32_t": CType("u", (torch.int32, torch.uint32), ctypes.c_uint32, "I"),
    "long": CType("i", _I64, ctypes.c_int64, "q"),
    "long long": CType("i", _I64, ctypes.c_int64, "q"),
    "int64_t": CType("i", _I64, ctypes.c_int64, "q"),
    "ptrdiff_t": CType("i", _I64, ctypes.c_int64, "q"),
    "size_t": CType("u", _I64, ctypes.c_uint64, "Q"),
    "unsigned long": CType("u", _I64, ctypes.c_uint64, "Q"),
    "unsigned long long": CType("u", (torch.int64, torch.uint64), ctypes.c_uint64, "Q"),
    "uint64_t": CType("u", (torch.int64, torch.uint64), ctypes.c_uint64, "Q"),
    "short": CType("i", (torch.int16,), ctypes.c_int16, "h"),
    "int16_t": CType("i", (torch.int16,), ctypes.c_int16, "h"),
    "unsigned short": CType("u", (torch.int16, torch.uint16), ctypes.c_uint16, "H"),
    "uint16_t": CType("u", (torch.int16, torch.uint16), ctypes.c_uint16, "H"),
    "char": CType("i", (torch.int8, torch.uint8), ctypes.c_int8, "b"),
    "signed char": CType("i", (torch.int8,), ctypes.c_int8, "b"),
    "int8_t": CType("i", (torch.int8,), ctypes.c_int8, "b"),
    "unsigned char": CType("u", (torch.uint8, torch.bool), ctypes.c_uint8, "B"),
    "uint8_t": CType("u", (torch.uint8, torch.bool), ctypes.c_uint8, "B"),
    "bool": CType("b", (torch.bool,), ctypes.c_bool, "?"),
    "float2": CType("v", _F32, None, ""),
    "float4": CType("v", _F32, None, ""),
    "double2": CType("v", _F64, None, ""),
    "int2": CType("v", _I32, None, ""),
    "int4": CType("v", _I32, None, ""),
    "uchar4": CType("v", (torch.uint8,), None, ""),
    "void": CType("v", (), None, ""),
    "CUtensorMap": CType("m", (), None, "128s"),
}

_INT_RANGE = {"i": {1: 7, 2: 15, 4: 31, 8: 63}, "u": {1: 8, 2: 16, 4: 32, 8: 64}}


def ctype_of(p: Param, kernel: str) -> CType:
    if " | " in p.base:                  # a typedef with a type per #if branch: a pointer to any of them
        alts = [TYPES.get(b) for b in p.base.split(" | ")]
        if p.pointer and all(alts) and len({a.kind for a in alts}) == 1:
            return CType(alts[0].kind, tuple(d for a in alts for d in a.dtypes), alts[0].ctype, alts[0].code)
    t = TYPES.get(p.base)
    if t is None:
        raise ArgumentError(f"{kernel}: parameter `{p}` has the type `{p.base}`, which convlab cannot pass "
                            f"from Python; use one of: " + ", ".join(sorted(k for k in TYPES if "_t" not in k)))
    return t


def check_args(kernel: str, params: list[Param], args: tuple, device: str) -> list:
    """Returns [(param, ctype, value)] where value is a tensor or a Python number; raises
    ArgumentError with a message that names the argument and what to pass instead."""
    if len(args) != len(params):
        sig = ", ".join(str(p) for p in params)
        raise ArgumentError(f"{kernel} takes {len(params)} arguments ({sig}), but {len(args)} were given")
    out = []
    for i, (p, a) in enumerate(zip(params, args)):
        t = ctype_of(p, kernel)
        what = f"argument {i + 1} `{p.name}` of {kernel} ({p})"
        if p.pointer:
            if isinstance(a, np.ndarray):
                raise ArgumentError(f"{what} got a numpy array: pass a torch tensor on the {device} "
                                    f"(cl.to_device(torch.from_numpy(a)))")
            if not isinstance(a, torch.Tensor):
                raise ArgumentError(f"{what} is a pointer, so it needs a tensor; got {type(a).__name__} {a!r}")
            if a.device.type != device:
                fix = "cl.to_device(t)" if device == "cuda" else "t.cpu()"
                raise ArgumentError(f"{what} is a tensor on '{a.device}', but this backend runs kernels on "
                                    f"'{device}': move it with {fix}, or make it with cl.randn / cl.empty")
            if t.dtypes and a.dtype not in t.dtypes:
                want = " or ".join(str(d) for d in t.dtypes)
                hint = {torch.float32: ".float()", torch.float16: ".half()", torch.float64: ".double()",
                        torch.int32: ".int()", torch.int64: ".long()"}.get(t.dtypes[0], "")
                raise ArgumentError(f"{what} needs a {want} tensor, but got {a.dtype}"
                                    + (f": convert it with `{p.name}{hint}`" if hint else ""))
            if not a.is_contiguous():
                raise ArgumentError(f"{what} is not contiguous (a transposed or sliced view): pass "
                                    f"`{p.name}.contiguous()`")
            out.append((p, t, a))
            continue
        if t.kind == "m":
            if not isinstance(a, TensorMap):
                raise ArgumentError(f"{what} needs a tensor map: pass cl.tensor_map(t, box), got "
                                    f"{type(a).__name__}")
            out.append((p, t, a))
            continue
        if isinstance(a, torch.Tensor):
            raise ArgumentError(f"{what} is a scalar, but got a tensor: pass a Python number"
                                + (" (t.item())" if a.numel() == 1 else ""))
        if t.kind in "iub":
            if isinstance(a, (bool, np.bool_)) and t.kind != "b":
                a = int(a)
            if isinstance(a, numbers.Integral):
                a = int(a)
                bits = _INT_RANGE.get(t.kind, {}).get(ctypes.sizeof(t.ctype))
                lo = -(1 << bits) if t.kind == "i" else 0
                hi = (1 << bits) - 1 if bits else 1
                if bits and not lo <= a <= hi:
                    raise ArgumentError(f"{what} got {a}, which does not fit in a {p.base} "
                                        f"({lo}..{hi})")
            elif isinstance(a, numbers.Real):
                raise ArgumentError(f"{what} is an integer parameter but got the float {a!r}: pass an int "
                                    f"(e.g. int({p.name}) or {p.name} // 1), or change the parameter's type")
            else:
                raise ArgumentError(f"{what} needs an int, got {type(a).__name__}")
        elif t.kind == "f":
            if not isinstance(a, numbers.Real):
                raise ArgumentError(f"{what} needs a number, got {type(a).__name__}")
            a = float(a)
        else:
            raise ArgumentError(f"{what}: a {p.base} can only be passed through a pointer")
        out.append((p, t, a))
    return out


def dim3(v, what: str) -> tuple[int, int, int]:
    if isinstance(v, numbers.Integral):
        v = (int(v),)
    try:
        v = tuple(int(x) for x in v)
    except TypeError:
        raise LaunchError(f"{what} must be an int or a tuple of up to 3 ints, got {v!r}") from None
    if not 1 <= len(v) <= 3:
        raise LaunchError(f"{what} must have 1 to 3 dimensions, got {v!r}")
    return v + (1,) * (3 - len(v))


def check_launch(kernel: str, grid, block, shared: int, *, max_shared: int = _limits.SHARED_DEFAULT_MAX,
                 max_threads: int = _limits.BLOCK_THREADS_MAX, static_shared: int = 0,
                 max_grid=_limits.MAX_GRID):
    """(grid, block) as 3-tuples, or cl.LaunchError naming the limit a GPU would refuse the launch for."""
    g, b = dim3(grid, "grid"), dim3(block, "block")
    _limits.check_grid(kernel, g, max_grid)
    if min(b) < 1:
        raise LaunchError(f"{kernel}: block {b} has a zero or negative dimension")
    threads = b[0] * b[1] * b[2]
    if threads > max_threads:
        raise LaunchError(f"{kernel}: a block of {b[0]}x{b[1]}x{b[2]} = {threads} threads is over the "
                          f"{max_threads} threads a block may have: use smaller blocks and more of them")
    if any(b[i] > _limits.BLOCK_DIM_MAX[i] for i in range(3)):
        raise LaunchError(f"{kernel}: block {b} is over the per-dimension limits {_limits.BLOCK_DIM_MAX}")
    if shared < 0:
        raise LaunchError(f"{kernel}: shared={shared} bytes is negative")
    if shared + static_shared > max_shared:
        raise LaunchError(
            f"{kernel}: the block asks for {shared + static_shared:,} bytes of shared memory "
            f"({shared:,} dynamic + {static_shared:,} static), over the {max_shared:,} a launch may use "
            f"without opting in: use a smaller tile, or pass max_shared=<bytes> to opt in (up to 232,448 on "
            f"an H100/H200)")
    return g, b


class ArgPlan:
    """A kernel's argument checks, worked out once from its signature. values(args) checks a call's
    arguments with a few comparisons each and returns them as they are (tensors and Python
    numbers); anything unusual (a numpy integer, a wrong dtype, a half scalar, ...) goes to
    check_args, which converts what it can and otherwise raises with its message, so messages are
    built only when something is wrong."""

    def __init__(self, kernel: str, params: list[Param], device: str):
        self.kernel, self.params, self.device = kernel, params, device
        self.ctypes = [ctype_of(p, kernel) for p in params]
        self.n = len(params)
        self.on_cuda = device == "cuda"
        self.pointers, self.ints, self.floats, self.maps, self.others = [], [], [], [], 0
        for i, (p, t) in enumerate(zip(params, self.ctypes)):
            if p.pointer:
                self.pointers.append((i, tuple(t.dtypes) or None))
            elif t.kind == "m":
                self.maps.append(i)
            elif t.kind in "iu" and t.ctype is not None:
                bits = _INT_RANGE[t.kind][ctypes.sizeof(t.ctype)]
                self.ints.append((i, -(1 << bits) if t.kind == "i" else 0, (1 << bits) - 1))
            elif t.kind == "f" and p.base != "half":
                self.floats.append(i)          # a Python int passes too: struct and ctypes take it
            else:
                self.others += 1

    def values(self, args: tuple):
        if len(args) == self.n and not self.others:
            on_cuda = self.on_cuda
            try:
                for i, dtypes in self.pointers:      # a contiguous tensor of an accepted dtype on the device
                    a = args[i]
                    if not ((a.is_cuda if on_cuda else a.is_cpu) and (dtypes is None or a.dtype in dtypes)
                            and a.is_contiguous() and isinstance(a, torch.Tensor)):
                        break
                else:
                    for i, lo, hi in self.ints:      # a Python int in the type's range
                        a = args[i]
                        if type(a) is not int or not lo <= a <= hi:
                            break
                    else:
                        for i in self.floats:        # a Python float or int
                            if type(args[i]) is not float and type(args[i]) is not int:
                                break
                        else:
                            for i in self.maps:      # a tensor map
                                if type(args[i]) is not TensorMap:
                                    break
                            else:
                                return args
            except AttributeError:                   # not a tensor where a pointer goes
                pass
        return [v for _, _, v in check_args(self.kernel, self.params, args, self.device)]
