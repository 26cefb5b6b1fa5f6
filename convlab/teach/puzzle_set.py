"""The warm-up puzzles, chapter by chapter: each one's kernel, the cases it is launched on (small
awkward sizes, outputs poisoned with NaN, or 0 where the kernel adds into them), their numpy
reference, the mistakes it names, what its faults usually mean and its counter targets.
convlab.teach.puzzles checks a kernel against them; expected values live here, never in the
notebook.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

import convlab as cl


@dataclass
class Launch:
    """One case of a puzzle: the kernel's arguments, its grid, the outputs and their expected values."""

    args: list
    grid: tuple
    block: tuple
    outputs: dict                      # name -> the tensor the kernel writes (poisoned or zeroed)
    want: dict                         # name -> expected numpy array
    what: str = ""                     # the case in words ("n=100, 4 blocks of 32")
    constants: dict = field(default_factory=dict)   # __constant__ name -> values
    index: str = "i"                   # how to name an output's position: "i" or "row,col"


@dataclass
class Puzzle:
    name: str
    chapter: str
    kernel: str                        # the __global__ function's name in the stub
    checks: str                        # what the check looks at, in a few words (the report's table)
    cases: Callable[[], list]          # -> [Launch]
    rtol: float = 1e-5
    # what a fault usually means here, by its kind (_fault_kind): "OutOfBoundsError" on a kernel
    # argument, "OutOfBoundsError shared" on a __shared__ array, "RaceError" (a read against a
    # write); a kind with no entry gets no advice (two stores to one element: describe_error says it)
    faults: dict = field(default_factory=dict)
    mistakes: list = field(default_factory=list)    # (text, test(launch, got) -> bool), tried in order
    sectors_max: float | None = None   # every global access: sectors per request at most this
    conflicts_max: int | None = None   # every shared access: bank conflicts at most this
    picture: dict | None = None        # cl.draw keywords for the picture shown when right ("case": which)
    halo: bool = False                 # its shared tile has a halo (the unwritten-tile verdict says so)


PUZZLES: dict[str, Puzzle] = {}


def _add(p: Puzzle) -> Puzzle:
    PUZZLES[p.name] = p
    return p


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _dev(a: np.ndarray) -> torch.Tensor:
    # a fresh torch allocation: aligned as cudaMalloc's are (WMMA loads need 32 bytes), numpy's may not be
    return cl.to_device(torch.from_numpy(np.ascontiguousarray(a)).clone())


def _floats(n, seed, *shape):
    return _rng(seed + n).standard_normal(shape or (n,)).astype(np.float32)


def _blocks(n: int, block: int) -> int:
    return (n + block - 1) // block


def _count(k: int, what: str) -> str:
    return f"{k} {what}{'s' if k != 1 else ''}"


def never_written(got) -> np.ndarray:
    """Where an output still holds its poison: NaN (floats), -1 (integers)."""
    if got.dtype.kind == "f":
        return np.isnan(got)
    return got == -1


def _only_first_block(launch: Launch, got: np.ndarray) -> bool:
    written = ~never_written(got)
    b = launch.block[0]
    return written.size > b and written[:b].all() and not written[b:].any()


def _only_first_grid(launch: Launch, got: np.ndarray) -> bool:
    threads = launch.grid[0] * launch.block[0]
    written = ~never_written(got)
    return written.size > threads and written[:threads].all() and not written[threads:].any()


# ---- chapter 2: threads and grids ------------------------------------------------------------

_OOB_GUARD = ("the last block has threads past the end of the data: each thread must check its "
              "index (`if (i < n)`) before it reads or writes")

_add(Puzzle(
    "map", "ch2", "add_ten", "out[i] = a[i] + 10, one thread per element, several blocks",
    lambda: [_map_case(n, 32) for n in (96, 160)],
    mistakes=[("only the first block's elements were written: every block used the same indices. "
               "The element of a thread is blockIdx.x * blockDim.x + threadIdx.x", _only_first_block)],
    faults={"OutOfBoundsError": "is the element index blockIdx.x * blockDim.x + threadIdx.x?",
            "RaceError stores": "several blocks wrote the same elements: the element of a thread is "
                         "blockIdx.x * blockDim.x + threadIdx.x, different in every block"},
    picture={"what": "threads", "block_id": (1, 0, 0), "shape": (6, 16), "height": 3.2},
))


def _map_case(n, block):
    a = _floats(n, 1)
    out = cl.empty(n)
    return Launch([_dev(a), out], (n // block,), (block,), {"out": out}, {"out": a + 10},
                  f"n={n}, {n // block} blocks of {block}")


_add(Puzzle(
    "guard", "ch2", "add_ten_guard", "out[i] = a[i] + 10 where n is no multiple of the block",
    lambda: [_guard_case(n, 32) for n in (100, 37, 1)],
    mistakes=[("only the first block's elements were written: every block used the same indices",
               _only_first_block)],
    faults={"OutOfBoundsError": _OOB_GUARD},
))


def _guard_case(n, block):
    a = _floats(n, 2)
    out = cl.empty(n)
    return Launch([_dev(a), out, n], (_blocks(n, block),), (block,), {"out": out}, {"out": a + 10},
                  f"n={n}, {_count(_blocks(n, block), 'block')} of {block}")


def _axes_swapped(launch: Launch, got: np.ndarray) -> bool:
    """What a 2D kernel that takes its row from x and its column from y writes: the elements with
    row < gridDim.x * blockDim.x and col < gridDim.y * blockDim.y, each right, and no other."""
    rows, cols = got.shape
    swapped = (np.arange(rows)[:, None] < launch.grid[0] * launch.block[0]) & \
              (np.arange(cols)[None, :] < launch.grid[1] * launch.block[1])
    want = launch.want["out"]
    return not swapped.all() and bool((~never_written(got) == swapped).all()) and \
        _matches(np.where(swapped, got, 0), np.where(swapped, want, 0))


_add(Puzzle(
    "map_2d", "ch2", "add_bias_2d",
    "out[r][c] = a[r][c] + bias[c] on a 2D grid of 2D blocks, rows and columns no multiple of the block",
    lambda: [_map2d_case(13, 21, 1), _map2d_case(9, 40, 2), _map2d_case(1, 5, 3)],
    mistakes=[("bias is indexed by the row: out[r][c] adds bias[c], the bias of its column",
               lambda launch, got: _matches(got, _bias_by_row(launch))),
              ("the rows are read `rows` apart: a row of the row-major matrix is `cols` elements long, "
               "so element (row, col) is at row * cols + col",
               lambda launch, got: _matches(got, _row_stride_rows(launch))),
              ("row and col come from the wrong axes: the threads cover rows up to gridDim.x * blockDim.x and "
               "columns up to gridDim.y * blockDim.y, and the rest is never written. col is the x index "
               "(blockIdx.x * blockDim.x + threadIdx.x), row the y index", _axes_swapped)],
    faults={"OutOfBoundsError": "an index past the end: is col the x index and row the y index, is a row "
                                "`cols` elements long (a[row * cols + col]), and does the guard check "
                                "both row < rows and col < cols?"},
    picture={"what": "threads", "block_id": (1, 0, 0)},
))


def _map2d_case(rows, cols, seed):
    a, bias = _floats(rows * cols, seed, rows, cols), _floats(cols, seed + 7)
    out = cl.empty(rows, cols)
    block = (16, 8)
    grid = (_blocks(cols, 16), _blocks(rows, 8))
    return Launch([_dev(a), _dev(bias), out, rows, cols], grid, block, {"out": out}, {"out": a + bias},
                  f"{rows}×{cols}, blocks of 16×8", index="row,col")


def _bias_by_row(launch: Launch) -> np.ndarray:
    a, bias = (t.cpu().numpy() for t in launch.args[:2])
    rows = a.shape[0]
    return a + bias[:rows, None] if rows <= bias.size else np.full_like(a, np.nan)


def _row_stride_rows(launch: Launch) -> np.ndarray:
    a, bias = (t.cpu().numpy() for t in launch.args[:2])
    rows, cols = a.shape
    index = np.arange(rows)[:, None] * rows + np.arange(cols)[None, :]
    return a.reshape(-1)[np.minimum(index, a.size - 1)] + bias[None, :]


def _matches(got, want) -> bool:
    return got.shape == want.shape and np.allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=False)


_add(Puzzle(
    "grid_stride", "ch2", "scale", "out[i] = alpha * a[i] for n far larger than the grid (2 blocks of 32)",
    lambda: [_stride_case(n) for n in (1000, 45, 64, 320)],
    mistakes=[("only the first gridDim.x * blockDim.x elements were written: a grid-stride loop "
               "(i += gridDim.x * blockDim.x) lets the few threads cover all n", _only_first_grid)],
    faults={"OutOfBoundsError": "does the loop stop at n (`i < n`)?"},
    picture={"what": "threads", "block_id": (0, 0, 0), "shape": (20, 16), "case": 3},
))


def _stride_case(n):
    a = _floats(n, 4)
    out = cl.empty(n)
    return Launch([_dev(a), out, 0.5, n], (2,), (32,), {"out": out}, {"out": 0.5 * a},
                  f"n={n}, 2 blocks of 32")


# ---- chapter 3: shared memory, halos, barriers, constant memory -------------------------------

_RACE = ("a thread read a shared element that another thread writes, with no barrier between: every "
         "store to the tile must be done (__syncthreads()) before any thread reads it")

_add(Puzzle(
    "reverse_block", "ch3", "reverse_chunks",
    "each block reverses its 64 elements through shared memory: the barrier between store and read",
    lambda: [_reverse_case(k) for k in (3, 1)],
    faults={"RaceError": _RACE},
    picture={"what": "shared", "block_id": (0, 0, 0), "height": 2.2},
))


def _reverse_case(chunks):
    n = 64 * chunks
    a = _floats(n, 5)
    out = cl.empty(n)
    want = a.reshape(chunks, 64)[:, ::-1].reshape(-1).copy()
    return Launch([_dev(a), out], (chunks,), (64,), {"out": out}, {"out": want},
                  f"n={n}, {_count(chunks, 'block')} of 64")


def _blur(a):
    p = np.pad(a.astype(np.float64), 1)
    return ((p[:-2] + p[1:-1] + p[2:]) / 3).astype(np.float32)


def _edges_unwritten(launch: Launch, got: np.ndarray) -> bool:
    """The outputs that are wrong are the first and last of each block: the halo was not loaded."""
    bad = np.argwhere(~np.isclose(got, launch.want["out"], rtol=1e-4, atol=1e-5) | np.isnan(got)).ravel()
    b = launch.block[0]
    n = got.size
    return bool(len(bad)) and all(i % b in (0, b - 1) or i == n - 1 for i in bad)


_add(Puzzle(
    "halo", "ch3", "blur3",
    "out[i] = (a[i-1] + a[i] + a[i+1]) / 3 from a shared tile: its two halo cells, zeros past the ends",
    lambda: [_blur_case(n) for n in (100, 32, 5)],
    mistakes=[("the first and last output of each block are wrong: their neighbours are the halo, "
               "tile[0] and tile[BLOCK + 1], which a thread of the block must load (0 outside the array)",
               _edges_unwritten)],
    faults={"OutOfBoundsError": "a read past either end of the array: a thread past the end (i >= n) loads 0 "
                                "into tile[1 + t], and the halo cells of the first and last block, a[i - 1] "
                                "and a[i + 1], are 0 outside 0 .. n-1",
            "RaceError": _RACE},
    halo=True,
    picture={"what": "shared", "block_id": (1, 0, 0), "shape": (1, 34), "height": 1.6},
))


def _blur_case(n):
    a = _floats(n, 6)
    out = cl.empty(n)
    return Launch([_dev(a), out, n], (_blocks(n, 32),), (32,), {"out": out}, {"out": _blur(a)},
                  f"n={n}, blocks of 32")


def _box3x3(a):
    p = np.pad(a.astype(np.float64), 1)
    rows, cols = a.shape
    return sum(p[dy:dy + rows, dx:dx + cols] for dy in range(3) for dx in range(3)).astype(np.float32)


_add(Puzzle(
    "tile_2d", "ch3", "box3x3",
    "a 3×3 box sum from a 10×10 shared tile loaded by 64 threads: halo ring included, zeros outside",
    lambda: [_box_case(13, 21, 21), _box_case(8, 8, 22), _box_case(3, 17, 23)],
    rtol=1e-5,
    faults={"OutOfBoundsError": "a halo cell outside the image: load 0 there (check 0 <= r < rows and "
                                "0 <= c < cols for the image pixel of each tile cell)",
            "OutOfBoundsError shared": "an index past the tile: a row of the tile is TILE = BLOCK + 2 cells "
                                       "wide, so cell k is row k / TILE, column k % TILE",
            "RaceError": _RACE},
    halo=True,
    picture={"what": "shared", "block_id": (1, 0, 0), "shape": (10, 10)},
))


def _box_case(rows, cols, seed):
    a = _floats(rows * cols, seed, rows, cols)
    out = cl.empty(rows, cols)
    return Launch([_dev(a), out, rows, cols], (_blocks(cols, 8), _blocks(rows, 8)), (8, 8), {"out": out},
                  {"out": _box3x3(a)}, f"{rows}×{cols}, blocks of 8×8", index="row,col")


_MASK5 = np.array([0.5, -1.25, 2.0, 0.75, -0.25], np.float32)


def _conv1d(a, mask, shift=0):
    r = len(mask) // 2
    p = np.pad(a.astype(np.float64), r + abs(shift))
    out = np.zeros(len(a))
    for j, m in enumerate(mask):
        start = j + abs(shift) + shift
        out += m * p[start:start + len(a)]
    return out.astype(np.float32)


_add(Puzzle(
    "constant_mask", "ch3", "conv1d_const",
    "a 5-tap 1D correlation whose mask is in __constant__ memory, zeros past the ends",
    lambda: [_conv1d_case(n) for n in (100, 7, 3)],
    mistakes=[("the window is shifted: tap j belongs to a[i + j - R] (R = 2), centred on i",
               lambda launch, got: any(_matches(got, _conv1d(launch.args[0].cpu().numpy(), _MASK5, s))
                                       for s in (2, -2, 1, -1))),
              ("the mask is flipped: c_mask[j] goes with a[i + j - R] (a correlation), not c_mask[4 - j]",
               lambda launch, got: _matches(got, _conv1d(launch.args[0].cpu().numpy(), _MASK5[::-1]))),
              ("a tap is left out: j runs over the 2R + 1 taps, 0 to 2R inclusive (j <= 2 * R)",
               lambda launch, got: any(_matches(got, _conv1d(launch.args[0].cpu().numpy(), _MASK5 * keep))
                                       for keep in (np.arange(5) < 4, np.arange(5) > 0)))],
    faults={"OutOfBoundsError": "a tap past the ends of the array: count it as 0 (check 0 <= i + j - R < n)"},
))


def _conv1d_case(n):
    a = _floats(n, 7)
    out = cl.empty(n)
    return Launch([_dev(a), out, n], (_blocks(n, 32),), (32,), {"out": out}, {"out": _conv1d(a, _MASK5)},
                  f"n={n}, blocks of 32", constants={"c_mask": _MASK5})


# ---- chapters 3b and 5: coalescing, bank conflicts, a reduction in shared memory --------------

def _transpose_case(rows, cols, seed):
    a = _floats(rows * cols, seed, rows, cols)
    out = cl.empty(cols, rows)
    return Launch([_dev(a), out, rows, cols], (_blocks(cols, 32), _blocks(rows, 32)), (32, 8),
                  {"out": out}, {"out": a.T.copy()}, f"{rows}×{cols}, tiles of 32×32, blocks of 32×8",
                  index="row,col")


_TRANSPOSE_OOB = ("an index past the end: out is cols × rows, so out[(y + j) * rows + x] with x < rows "
                  "and y + j < cols, where x and y come from the swapped block indices")

_add(Puzzle(
    "coalesced_transpose", "ch3b", "transpose",
    "out = aᵀ with every global load and store coalesced: at most 4 sectors per request",
    lambda: [_transpose_case(40, 70, 8), _transpose_case(33, 32, 9), _transpose_case(1, 3, 10)],
    rtol=0.0,
    faults={"OutOfBoundsError": _TRANSPOSE_OOB, "RaceError": _RACE},
    sectors_max=4.0,
    picture={"what": "sectors", "line": "out["},
))

_add(Puzzle(
    "padded_tile", "ch3b", "transpose_padded",
    "the coalesced transpose with no shared-memory bank conflicts (0 on every line)",
    lambda: [_transpose_case(40, 70, 11), _transpose_case(33, 32, 12)],
    rtol=0.0,
    faults={"OutOfBoundsError": _TRANSPOSE_OOB, "RaceError": _RACE},
    sectors_max=4.0, conflicts_max=0,
    picture={"what": "banks", "line": "out["},
))


def _sums(a, block):
    pad = (-len(a)) % block
    return np.pad(a.astype(np.float64), (0, pad)).reshape(-1, block).sum(1).astype(np.float32)


_add(Puzzle(
    "block_reduce", "ch5", "block_sum",
    "out[b] = the sum of block b's 128 elements, a tree in shared memory; n no multiple of 128",
    lambda: [_reduce_case(n) for n in (1000, 128, 77)],
    rtol=1e-5,
    faults={"OutOfBoundsError": _OOB_GUARD + " (a thread past n adds 0)", "RaceError": _RACE + " (inside "
            "the tree too: each level reads what the level before wrote)",
            "BarrierError": "a __syncthreads() that only some threads reach (inside `if (i < n)` or after a "
                            "`return`): every thread of the block must reach every barrier"},
))


def _reduce_case(n):
    a = _floats(n, 13)
    out = cl.empty(_blocks(n, 128))
    return Launch([_dev(a), out, n], (_blocks(n, 128),), (128,), {"out": out}, {"out": _sums(a, 128)},
                  f"n={n}, {_count(_blocks(n, 128), 'block')} of 128")


# ---- chapters 5 and 8: atomics and warp shuffles ----------------------------------------------

_ATOMIC = ("two threads added to the same element at once and one update was lost: "
           "use atomicAdd(&x, v) for a += that many threads make")

_add(Puzzle(
    "histogram", "ch8", "histogram",
    "bins[v] counts the values v (0..15) of data: atomicAdd from every thread",
    lambda: [_hist_case(n) for n in (1000, 31)],
    rtol=0.0,
    faults={"RaceError": _ATOMIC, "OutOfBoundsError": _OOB_GUARD},
))


def _hist_case(n):
    data = _rng(n).integers(0, 16, n).astype(np.int32)
    bins = cl.zeros(16, dtype=torch.int32)
    return Launch([_dev(data), bins, n], (_blocks(n, 64),), (64,), {"bins": bins},
                  {"bins": np.bincount(data, minlength=16).astype(np.int32)}, f"n={n}, blocks of 64")


def _some_lanes(launch: Launch, got: np.ndarray) -> bool:
    """The sums a shuffle tree with a step missing gives: lanes 0-15 (no offset 16), the even lanes
    (no offset 1), lanes 0-7 (neither 16 nor 8)."""
    a = launch.args[0].cpu().numpy()
    padded = np.pad(a.astype(np.float64), (0, (-a.size) % 32)).reshape(-1, 32)
    lanes = np.arange(32)
    return any(_matches(got, (padded * keep).sum(1).astype(np.float32))
               for keep in (lanes < 16, lanes % 2 == 0, lanes < 8))


_add(Puzzle(
    "warp_sum", "ch5", "warp_sums",
    "out[w] = the sum of warp w's 32 elements by __shfl_down_sync; n no multiple of 32",
    lambda: [_warp_case(n) for n in (100, 64, 5)],
    mistakes=[("each warp's sum holds only some lanes: the shuffle offsets are 16, 8, 4, 2, 1 (five steps), "
               "and lane 0 ends with the whole sum",
               lambda launch, got: _some_lanes(launch, got))],
    faults={"WarpMaskError": "every lane named in the mask (0xffffffff: all 32) must reach the shuffle: a lane "
                             "past n must not return early; let it add 0 instead",
            "OutOfBoundsError": _OOB_GUARD + " (a lane past n adds 0)",
            "RaceError stores": "warps of two blocks wrote the same out[w]: a warp's number counts across the "
                                "whole grid, (blockIdx.x * blockDim.x + threadIdx.x) / 32, not within its block"},
))


def _warp_case(n):
    a = _floats(n, 14)
    blocks = _blocks(n, 64)
    out = cl.empty(2 * blocks)
    want = _sums(np.pad(a, (0, 64 * blocks - n)), 32)
    return Launch([_dev(a), out, n], (blocks,), (64,), {"out": out}, {"out": want},
                  f"n={n}, {blocks} block{'s' if blocks > 1 else ''} of 64 ({2 * blocks} warps)")


_add(Puzzle(
    "dot", "ch8", "dot",
    "*out = a · b: a warp sum of the products, then one atomicAdd per warp",
    lambda: [_dot_case(n) for n in (1000, 33)],
    rtol=1e-4,
    faults={"RaceError": _ATOMIC,
            "WarpMaskError": "every lane named in the mask must reach the shuffle: a lane past n adds 0 "
                             "instead of returning",
            "OutOfBoundsError": _OOB_GUARD},
    mistakes=[("every lane added to *out, but after the shuffles down only lane 0 holds the warp's sum "
               "(the others hold partial sums): one atomicAdd per warp, from lane 0",
               lambda launch, got: _matches(got, _every_lane_adds(launch)))],
))


def _every_lane_adds(launch: Launch) -> np.ndarray:
    """*out when every lane adds its value after the shfl_down tree (a lane whose source is past
    lane 31 gets its own value back, as __shfl_down_sync gives it)."""
    a, b = (t.cpu().numpy().astype(np.float64) for t in launch.args[:2])
    blocks = launch.grid[0] * launch.block[0]
    v = np.pad(a * b, (0, blocks - a.size)).reshape(-1, 32)
    for offset in (16, 8, 4, 2, 1):
        src = np.arange(32) + offset
        v = v + np.where(src < 32, v[:, np.minimum(src, 31)], v)
    return np.array([v.sum()], np.float32)


def _dot_case(n):
    a, b = _floats(n, 15), _floats(n, 16)
    out = cl.zeros(1)
    want = np.array([np.dot(a.astype(np.float64), b.astype(np.float64))], np.float32)
    return Launch([_dev(a), _dev(b), out, n], (_blocks(n, 128),), (128,), {"out": out}, {"out": want},
                  f"n={n}, blocks of 128")


# ---- chapters 6 and 9: half2 and tensor cores --------------------------------------------------

def _odd_halves_wrong(launch: Launch, got: np.ndarray) -> bool:
    want = launch.want["out"]
    ok = np.isclose(got, want, rtol=2e-3, atol=2e-3)
    return bool(ok[0::2].all() and (~ok[1::2]).mean() > 0.5)


_add(Puzzle(
    "half2_axpy", "ch6", "axpy_half2",
    "out = a·x + y on half2 pairs, two results per instruction (__hfma2); n2 pairs no multiple of the block",
    lambda: [_axpy_case(n2) for n2 in (100, 17)],
    rtol=2e-3,
    mistakes=[("every second element (the high half of each half2) is wrong: __hfma2 computes both halves "
               "of a pair; a is needed in both (__float2half2_rn(a))", _odd_halves_wrong)],
    faults={"OutOfBoundsError": _OOB_GUARD + " (n2 counts pairs: the last index is n2 - 1)"},
))


def _axpy_case(n2):
    x, y = _floats(2 * n2, 17).astype(np.float16), _floats(2 * n2, 18).astype(np.float16)
    out = cl.empty(2 * n2, dtype=torch.float16)
    want = (1.5 * x.astype(np.float64) + y.astype(np.float64)).astype(np.float32)
    return Launch([_dev(x), _dev(y), out, 1.5, n2], (_blocks(n2, 32),), (32,), {"out": out}, {"out": want},
                  f"n2={n2} pairs, blocks of 32")


def _matmul(a, b):
    return (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32)


_add(Puzzle(
    "wmma_tile", "ch6", "wmma_gemm",
    "C = A·B in fp16 with float sums, one warp per 16×16 tile of C, K in steps of 16 (WMMA fragments)",
    lambda: [_wmma_case(32, 48, 32, 19), _wmma_case(16, 16, 16, 20)],
    rtol=1e-3,
    mistakes=[("C is A·Bᵀ: B was read transposed. B is row-major (N columns a row): its fragment is "
               "wmma::row_major and its leading dimension N",
               lambda launch, got: _matches(got, _b_col_major(launch))),
              ("A's tiles were read with a leading dimension of 16: A is row-major with K columns, so the "
               "fragment's ldm is K (B's is N, C's N)", lambda launch, got: _matches(got, _lead_dim(launch, "a", 16))),
              ("B's tiles were read with a leading dimension of 16: B is row-major with N columns, so the "
               "fragment's ldm is N (A's is K, C's N)", lambda launch, got: _matches(got, _lead_dim(launch, "b", 16))),
              ("only the first 16 of K were summed: loop over K in steps of 16, accumulating in one fragment",
               lambda launch, got: _matches(got, _matmul(launch.args[0].cpu().numpy()[:, :16],
                                                         launch.args[1].cpu().numpy()[:16])))],
    faults={"OutOfBoundsError": "a fragment load past the end: the tile of A starts at row 16 * blockIdx.y, "
                                "column k (leading dimension K); B's at row k, column 16 * blockIdx.x "
                                "(leading dimension N)",
            "BarrierError": "every lane of the warp must execute each load, mma and store"},
))


def _b_col_major(launch: Launch) -> np.ndarray:
    """C when each 16×16 tile of B is loaded as wmma::col_major from its row-major place (ldm N):
    element (kk, nn) of the tile read from b[k0 + kk + nn * N] past the tile's corner."""
    a, b = (t.cpu().numpy() for t in launch.args[:2])
    K, N = b.shape
    flat = b.reshape(-1).astype(np.float64)
    read = np.empty((K, N))
    kk, nn = np.meshgrid(np.arange(16), np.arange(16), indexing="ij")
    for k0 in range(0, K, 16):
        for n0 in range(0, N, 16):
            index = k0 * N + n0 + kk + nn * N
            read[k0:k0 + 16, n0:n0 + 16] = flat[np.minimum(index, flat.size - 1)]
    return (a.astype(np.float64) @ read).astype(np.float32)


def _lead_dim(launch: Launch, which: str, ldm: int) -> np.ndarray:
    """C when the 16×16 tiles of A (which="a") or B ("b") are loaded with leading dimension ldm from
    their row-major corners: element (r, c) of a tile read from corner + r * ldm + c."""
    a, b = (t.cpu().numpy().astype(np.float64) for t in launch.args[:2])
    m = a if which == "a" else b
    rows, cols = m.shape
    flat, read = m.reshape(-1), np.empty_like(m)
    r, c = np.meshgrid(np.arange(16), np.arange(16), indexing="ij")
    for r0 in range(0, rows, 16):
        for c0 in range(0, cols, 16):
            read[r0:r0 + 16, c0:c0 + 16] = flat[np.minimum(r0 * cols + c0 + r * ldm + c, flat.size - 1)]
    return ((read if which == "a" else a) @ (b if which == "a" else read)).astype(np.float32)


def _wmma_case(M, N, K, seed):
    a = _floats(M * K, seed, M, K).astype(np.float16)
    b = _floats(K * N, seed + 1, K, N).astype(np.float16)
    c = cl.empty(M, N)
    return Launch([_dev(a), _dev(b), c, M, N, K], (N // 16, M // 16), (32,), {"c": c}, {"c": _matmul(a, b)},
                  f"M={M} N={N} K={K}, a warp per 16×16 tile", index="row,col")
