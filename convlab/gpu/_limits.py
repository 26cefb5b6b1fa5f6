"""The launch limits every CUDA GPU since compute capability 3.0 enforces, in one place: the
argument checks (_args.check_launch, so every launch on either backend), the launchers (to chunk a
batch or cap a grid) and the emulator all read them from here, and all raise cl.LaunchError."""
from __future__ import annotations

from ._errors import LaunchError

INT32_MAX = 2**31 - 1
GRID_X_MAX = INT32_MAX            # blocks along gridDim.x
GRID_YZ_MAX = 65_535              # blocks along gridDim.y and gridDim.z
MAX_GRID = (GRID_X_MAX, GRID_YZ_MAX, GRID_YZ_MAX)
BLOCK_THREADS_MAX = 1024          # threads in one block
BLOCK_DIM_MAX = (1024, 1024, 64)  # threads along each block dimension
SHARED_DEFAULT_MAX = 48 * 1024    # bytes of shared memory a block may use without opting in
CONSTANT_BYTES = 64 * 1024        # __constant__ memory of a module

_AXES = "xyz"


def check_grid(kernel: str, grid: tuple, max_grid: tuple = MAX_GRID) -> None:
    """Raise cl.LaunchError when a dimension of a 3-tuple grid is not in 1..its limit."""
    for i in range(3):
        if grid[i] < 1:
            raise LaunchError(f"{kernel}: grid {tuple(grid)} has a zero or negative dimension; every dimension "
                              f"must be >= 1 (a size rounded down to 0 blocks? use ceil division: (n + b - 1) // b)")
        if grid[i] > max_grid[i]:
            raise LaunchError(
                f"{kernel}: grid {_AXES[i]} = {grid[i]:,} is over the limit of {max_grid[i]:,} blocks for "
                f"gridDim.{_AXES[i]}. Only gridDim.x may go up to 2^31-1: map the large extent (e.g. "
                f"B*M) to x, or loop over it inside the kernel")
