"""Chapter 2 launchers: kernels/02_naive/conv2d_naive.cu, one thread per output element.

- conv2d_naive_z: the ECE408 project's mapping, grid (⌈Wo/bx⌉, ⌈Ho/by⌉, B·M). It cannot launch once
  B·M > 65,535 (grid z limit): the launch raises cl.LaunchError, as the GPU refuses it.
- conv2d_naive_flat: a flat 1D grid over all B·M·Ho·Wo outputs with a grid-stride loop; it scales
  to every workload of the course.
- conv2d_naive_textbook: the textbook's mapping, grid (B, M, tiles of the output): the images on x
  (up to 2^31 - 1), so it launches on every workload of the course too.
"""
from __future__ import annotations

from ..gpu._limits import GRID_X_MAX, GRID_YZ_MAX
from . import Impl, ceil_div, conv2d_shapes, output
from ._kernels import Launch, remember

KERNEL_FILE = "kernels/02_naive/conv2d_naive.cu"


def grid_z(B: int, M: int, Ho: int, Wo: int, block=(16, 16)):
    """The ECE408 project's mapping: x over output columns, y over output rows, z over (image, map) pairs."""
    bx, by = block
    return (ceil_div(Wo, bx), ceil_div(Ho, by), B * M), (bx, by, 1)


def grid_textbook(B: int, M: int, Ho: int, Wo: int, block=(16, 16)):
    """The textbook's mapping: x over images, y over output maps, z over the output's tiles."""
    bx, by = block
    return (B, M, ceil_div(Wo, bx) * ceil_div(Ho, by)), (bx, by, 1)


def grid_flat(outputs: int, block: int = 256, max_blocks: int | None = None):
    """One thread per output, in 1D; with max_blocks the grid-stride loop covers the rest."""
    blocks = min(ceil_div(outputs, block), GRID_X_MAX)
    if max_blocks is not None:
        blocks = min(blocks, max_blocks)
    return (blocks, 1, 1), (block, 1, 1)


_plans: dict = {}


def _plan(kernel, x, w, stride, padding, grid_of):
    B, C, M, H, W, K, Ho, Wo = conv2d_shapes(x, w, stride, padding)
    grid, block = grid_of(B, M, Ho, Wo)
    return (B, M, Ho, Wo), Launch(KERNEL_FILE, kernel, None, (B, C, M, H, W, K, padding, stride),
                                  grid=grid, block=block)


def conv2d_naive_z(x, w, y=None, *, stride: int = 1, padding: int = 0, block=None):
    block = tuple(block or (16, 16))
    shape, launch = remember(_plans, ("z", x.shape, w.shape, stride, padding, block), lambda: _plan(
        "conv2d_naive_z", x, w, stride, padding, lambda B, M, Ho, Wo: grid_z(B, M, Ho, Wo, block)))
    y = output(y, shape, x)
    launch(x, w, y)
    return y


def conv2d_naive_textbook(x, w, y=None, *, stride: int = 1, padding: int = 0, block=None):
    block = tuple(block or (16, 16))
    shape, launch = remember(_plans, ("textbook", x.shape, w.shape, stride, padding, block), lambda: _plan(
        "conv2d_naive_textbook", x, w, stride, padding, lambda B, M, Ho, Wo: grid_textbook(B, M, Ho, Wo, block)))
    y = output(y, shape, x)
    launch(x, w, y)
    return y


def conv2d_naive_flat(x, w, y=None, *, stride: int = 1, padding: int = 0, block: int | None = None,
                      max_blocks: int | None = None):
    block = int(block or 256)
    shape, launch = remember(_plans, ("flat", x.shape, w.shape, stride, padding, block, max_blocks), lambda: _plan(
        "conv2d_naive_flat", x, w, stride, padding,
        lambda B, M, Ho, Wo: grid_flat(B * M * Ho * Wo, block, max_blocks)))
    y = output(y, shape, x)
    launch(x, w, y)
    return y


#: The chapter's implementations, by the name the figures use.
NAIVE_Z = Impl("naive z (B·M on grid z)", conv2d_naive_z, applies=lambda s: s.B * s.M <= GRID_YZ_MAX,
               config=lambda s: {"block": (16, 16)}, key="naive_z", candidate=False)
NAIVE_FLAT = Impl("naive flat (1D grid)", conv2d_naive_flat, config=lambda s: {"block": 256}, key="naive_flat", candidate=False)
NAIVE_TEXTBOOK = Impl("naive textbook (B, M, tiles)", conv2d_naive_textbook,
                      applies=lambda s: s.M <= GRID_YZ_MAX and grid_textbook(s.B, s.M, s.Ho, s.Wo)[0][2] <= GRID_YZ_MAX,
                      config=lambda s: {"block": (16, 16)}, key="naive_textbook", candidate=False)
IMPLEMENTATIONS = (NAIVE_Z, NAIVE_FLAT, NAIVE_TEXTBOOK)


def pick(shape) -> Impl:
    """Chapter 2's best for any shape: the flat grid (the z map cannot launch past B·M = 65,535)."""
    return NAIVE_FLAT
