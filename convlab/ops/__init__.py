"""Launchers: the grid and block computation for each kernel of the course, in one place.

Notebooks, tests and benchmarks call these, so a chapter's figure times exactly the launch its
tests check. The package imports one way: shapes.py (the one shape type, convlab.measuring.workloads.Workload,
from torch's argument forms) -> one launcher module per kernel family (naive.py for chapter 2, ...,
general.py, depthwise.py, igemm.py, tensor_core.py for chapter 9, layers.py for chapter 10) ->
dispatch.py (which kernel runs a layer: forward, dX, dW) -> dropin.py (conv2d, Conv2d).
Every launcher keeps one contract:

    conv2d (and conv2d_fp16, with half tensors):
        f(x, w, y=None, *, stride=1, padding=0, **tunables) -> y
    conv3d: the same, x (1, 1, D, H, W) or (D, H, W), w (1, 1, KD, KH, KW) or (KD, KH, KW)
    conv2d_dx: f(dy, w, dx=None, *, stride=1, padding=0, input_size=(H, W), **tunables) -> dx
    conv2d_dw: f(x, dy, dw=None, *, stride=1, padding=0, kernel_size=K, **tunables) -> dw

Tunables default to None: the kernel's config function fills them in for the shape (the same
function the chapter's pick() uses). An output not given is allocated with torch.empty, like
torch's own ops; under cl.debug and on the emulator it is filled with NaN first, so an output
a kernel never writes shows in cl.check. A launcher works out its launch (grid, block, defines,
scalar arguments) once per shape and keeps it, so a repeated call costs little Python.

Each module lists its kernels once, as IMPLEMENTATIONS (Impl records: the key code, rules and
CSV files join on, the label figures show, the launcher, the shapes it takes, its tunables, and
what a route reads instead of guessing from the launcher: its dtypes, the layouts it reads and
returns, whether its epilogue takes a bias, how it adds); dispatch.registered() finds them all.
Chapters 2-8's modules have pick(shape), the Impl a plain layer gets among the chapter's kernels.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..gpu import runtime
from .shapes import conv2d_shapes, out_size  # noqa: F401 (the launchers' shape helpers, re-exported)


def _always(shape) -> bool:
    return True


def _no_tunables(shape) -> dict:
    return {}


#: x's memory formats, by the names records, rules and result rows use (torch's memory format of each)
FORMATS = {"nchw": torch.contiguous_format, "channels_last": torch.channels_last}
#: ops of the three passes a route runs (forward, dE/dX, dE/dW), by their calling contract above
FORWARD_OPS = ("conv2d", "conv2d_fp16")
DX_OPS = ("conv2d_dx", "conv2d_dx_fp16")
DW_OPS = ("conv2d_dw", "conv2d_dw_fp16")


@dataclass(frozen=True)
class Impl:
    """One implementation: called like its launcher. config(shape) gives the tunables it uses
    for a convlab.measuring.workloads.Workload when none are passed (the same function pick() uses; the
    launcher fills in the same ones when none are passed).

    any_layer: the launcher takes every layer torch's conv2d takes (groups, dilation, non-square
    masks, per-axis stride and padding, as keywords: Workload.conv_kwargs). Without it an Impl is
    offered only the chapters' plain layers (Workload.plain), whatever its `applies` says, and is
    called with int stride and padding.

    What a route (convlab.ops.dispatch) reads instead of guessing from the launcher:
    dtypes: the dtypes it takes and returns, by the names of shapes.DTYPE ("fp32", "fp16",
    "bf16"; None: its op's, "fp16" for an op ending in _fp16, else "fp32"). layouts: the memory
    formats of its tensor input (x; dy for dX; x and dy for dW) and of w that it reads without a
    copy of its own ("nchw", "channels_last"; the first is what a route converts another layout to);
    out_layout: the memory format of what it returns. bias: it takes bias= and adds it in its
    epilogue; activations: the epilogue's activations it takes as keywords (relu=True). accumulation:
    how its sums are kept ("half" or "float"; fp16.fp16_tolerance's bound depends on it);
    accumulation_of: a dispatcher's (one launcher, a kernel per shape), Workload -> "half" or "float"
    (accumulation_on reads both). precision:
    None where it computes in its dtype's own precision; "tf32" or "3xtf32" for a float32 kernel whose
    products are TF32's (or the split's, convlab.ops.tf32): the dispatcher runs it only where
    dispatch.fp32_precision() asks for that precision (dispatch.PRECISION_RULES)."""

    name: str                   # the label figures and tables show (free to change; never an identity)
    launcher: Callable          # the contract above
    op: str = "conv2d"          # "conv2d" | "conv2d_fp16" | "conv3d" | "conv2d_dx" | "conv2d_dw" | "conv2d_train"
                                # | "conv2d_dx_fp16" | "conv2d_dw_fp16" (16-bit in and out: fp16 or bf16, as
                                # dtypes says) | "conv2d_stage"
    applies: Callable = _always         # Workload -> bool: which shapes it can take
    config: Callable = _no_tunables     # Workload -> dict: its default tunables
    any_layer: bool = False
    key: str = ""               # the identity code, rules and CSV files join on (short, never changes)
    candidate: bool = True      # one the dispatcher may choose (False: a teaching step, or a float32 path that
                                # is not fp32's and says no precision)
    dtypes: tuple | None = None
    layouts: tuple = ("nchw",)
    out_layout: str = "nchw"
    bias: bool = False
    activations: tuple = ()
    accumulation: str = "float"
    accumulation_of: Callable | None = None
    precision: str | None = None

    def __post_init__(self):
        if self.dtypes is None:
            object.__setattr__(self, "dtypes", ("fp16",) if self.op.endswith("_fp16") else ("fp32",))
        bad = [v for v in (*self.layouts, self.out_layout) if v not in FORMATS]
        if bad or not self.layouts:
            raise ValueError(f"{self.name}: layouts {self.layouts} and out_layout {self.out_layout!r} are some of "
                             f"{', '.join(FORMATS)}")
        if self.accumulation not in ("half", "float"):
            raise ValueError(f"{self.name}: accumulation {self.accumulation!r} is 'half' or 'float'")
        if self.precision not in (None, "tf32", "3xtf32") or (self.precision and self.dtypes != ("fp32",)):
            raise ValueError(f"{self.name}: precision {self.precision!r} is None, or 'tf32' or '3xtf32' for a "
                             "float32 kernel")

    def __call__(self, *args, **kwargs):
        return self.launcher(*args, **kwargs)

    def accumulation_on(self, shape=None) -> str:
        """'half' or 'float': how the kernel it runs on shape keeps its sums (fp16.fp16_tolerance's
        bound depends on it). A dispatcher's (accumulation_of) without a shape: 'half', the looser."""
        if self.accumulation_of is None:
            return self.accumulation
        return self.accumulation_of(shape) if shape is not None else "half"

    def takes(self, shape) -> bool:
        """Whether it can run this Workload: a plain layer (or any, for an any_layer Impl) it applies to."""
        return (self.any_layer or getattr(shape, "plain", True)) and bool(self.applies(shape))


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def new_output(shape, like: torch.Tensor, dtype=None) -> torch.Tensor:
    """An output on like's device: torch.empty, or NaN-filled under cl.debug and on the emulator."""
    dtype = dtype or like.dtype
    if runtime.poisoning():
        return torch.full(shape, float("nan"), dtype=dtype, device=like.device)
    return like.new_empty(shape, dtype=dtype)        # torch.empty(..., device=) parses more: slower per call


def output(y, shape, like: torch.Tensor, dtype=None, name: str = "y") -> torch.Tensor:
    """y when given (checked: its shape, dtype and layout), else a new output (new_output). The one
    place a launcher gets its output."""
    if y is None:
        return new_output(shape, like, dtype)
    if tuple(y.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(y.shape)}, expected {tuple(shape)}")
    if y.dtype != (dtype or like.dtype):
        raise TypeError(f"{name} is {y.dtype}, expected {dtype or like.dtype}: convert it, or leave it out")
    if not y.is_contiguous():
        raise ValueError(f"{name} must be contiguous: pass {name}.contiguous(), or leave it out")
    return y
