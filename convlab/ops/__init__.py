"""Launchers: the grid and block computation for each kernel of the course, in one place.

Notebooks, tests and benchmarks call these, so a chapter's figure times exactly the launch its
tests check. One module per chapter (naive.py for chapter 2; later chapters add tiled.py, ...).
A launcher takes torch tensors on the backend's device, allocates the output with cl.empty when
none is given (poisoned with NaN, so an output never written shows), launches, and returns it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

INT32_MAX = 2**31 - 1
GRID_YZ_LIMIT = 65_535  # the most blocks along gridDim.y and gridDim.z
GRID_X_LIMIT = INT32_MAX  # gridDim.x


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def out_size(n: int, K: int, stride: int = 1, pad: int = 0) -> int:
    """(n + 2·pad − K) // stride + 1, the output size of a convolution along one axis."""
    return (n + 2 * pad - K) // stride + 1


def conv2d_shapes(x, w, stride: int = 1, pad: int = 0):
    """(B, C, M, H, W, K, Ho, Wo) from an NCHW input and an MCKK mask; checks that they fit."""
    if x.dim() != 4 or w.dim() != 4:
        raise ValueError(f"expected x (B, C, H, W) and w (M, C, K, K), got {tuple(x.shape)} and {tuple(w.shape)}")
    B, C, H, W = (int(s) for s in x.shape)
    M, Cw, K, K2 = (int(s) for s in w.shape)
    if Cw != C or K2 != K:
        raise ValueError(f"w {tuple(w.shape)} does not fit x {tuple(x.shape)}: need (M, {C}, K, K)")
    Ho, Wo = out_size(H, K, stride, pad), out_size(W, K, stride, pad)
    if Ho < 1 or Wo < 1:
        raise ValueError(f"no output: input {H}×{W}, K={K}, stride {stride}, pad {pad}")
    for name, n in (("x", B * C * H * W), ("y", B * M * Ho * Wo)):
        if n > INT32_MAX // 2:  # the kernels index with int; keep headroom for the grid stride
            raise ValueError(f"{name} has {n:,} elements: too many for int indices")
    return B, C, M, H, W, K, Ho, Wo


def check_output(y, shape) -> None:
    if tuple(y.shape) != tuple(shape):
        raise ValueError(f"y has shape {tuple(y.shape)}, expected {tuple(shape)}")
    if not y.is_contiguous():
        raise ValueError("y must be contiguous")


def nbytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def prod(xs) -> int:
    return math.prod(int(v) for v in xs)


def _always(shape) -> bool:
    return True


def _no_tunables(shape) -> dict:
    return {}


@dataclass(frozen=True)
class Impl:
    """One implementation, named once: what figures, CSVs and text call it, its launcher (the
    contract of its op), which shapes it can take, and its default tunables (the function pick
    uses). Calling it calls the launcher."""

    name: str
    launcher: Callable
    op: str = "conv2d"      # "conv2d" | "conv2d_fp16" | "conv3d" | "conv2d_dx" | "conv2d_dw" | "conv2d_train"
    applies: Callable = _always
    config: Callable = _no_tunables

    def __call__(self, *args, **kwargs):
        return self.launcher(*args, **kwargs)
