"""Chapter 2 launchers: kernels/02_naive/conv2d_naive.cu, one thread per output element.

- conv2d_naive_z: the course's mapping, grid (⌈Wo/bx⌉, ⌈Ho/by⌉, B·M). It cannot launch once
  B·M > 65,535 (grid z limit); the backend raises cl.LaunchError, as the GPU refuses the launch.
- conv2d_naive_flat: a flat 1D grid over all B·M·Ho·Wo outputs with a grid-stride loop; it scales
  to every workload of the course.
"""
from __future__ import annotations

import functools

from . import GRID_X_LIMIT, ceil_div, check_output, conv2d_shapes

KERNEL_FILE = "kernels/02_naive/conv2d_naive.cu"


@functools.lru_cache(maxsize=None)
def module():
    """The compiled kernels/02_naive/conv2d_naive.cu on the active backend (compiled once)."""
    import convlab as cl
    from convlab import book

    return cl.load(book.path(KERNEL_FILE))


def grid_z(B: int, M: int, Ho: int, Wo: int, block=(16, 16)):
    """The course's mapping: x over output columns, y over output rows, z over (image, map) pairs."""
    bx, by = block
    return (ceil_div(Wo, bx), ceil_div(Ho, by), B * M), (bx, by, 1)


def grid_flat(outputs: int, block: int = 256, max_blocks: int | None = None):
    """One thread per output, in 1D; with max_blocks the grid-stride loop covers the rest."""
    blocks = min(ceil_div(outputs, block), GRID_X_LIMIT)
    if max_blocks is not None:
        blocks = min(blocks, max_blocks)
    return (blocks, 1, 1), (block, 1, 1)


def conv2d_naive_z(x, w, y=None, *, stride: int = 1, pad: int = 0, block=(16, 16)):
    import convlab as cl

    B, C, M, H, W, K, Ho, Wo = conv2d_shapes(x, w, stride, pad)
    if y is None:
        y = cl.empty(B, M, Ho, Wo)
    check_output(y, (B, M, Ho, Wo))
    grid, blk = grid_z(B, M, Ho, Wo, block)
    module().kernel("conv2d_naive_z")(x, w, y, B, C, M, H, W, K, stride, pad, grid=grid, block=blk)
    return y


def conv2d_naive_flat(x, w, y=None, *, stride: int = 1, pad: int = 0, block: int = 256,
                      max_blocks: int | None = None):
    import convlab as cl

    B, C, M, H, W, K, Ho, Wo = conv2d_shapes(x, w, stride, pad)
    if y is None:
        y = cl.empty(B, M, Ho, Wo)
    check_output(y, (B, M, Ho, Wo))
    grid, blk = grid_flat(B * M * Ho * Wo, block, max_blocks)
    module().kernel("conv2d_naive_flat")(x, w, y, B, C, M, H, W, K, stride, pad, grid=grid, block=blk)
    return y


#: The chapter's implementations by the name the figures use.
IMPLEMENTATIONS = {
    "naive z (B·M on grid z)": conv2d_naive_z,
    "naive flat (1D grid)": conv2d_naive_flat,
}
