"""Chapter 3 launchers: shared-memory tiles with halo (kernels/03_tiled/).

Three ways to get the (TILE+K-1)² input tile into shared memory, each with the mask in __constant__
memory (mask="constant", the default) or read from the global pointer w (mask="global"; needed
when M·C·K² > 16,384 floats, e.g. resnet and days100):

- conv2d_tiled_halo_multi_pass: output-tile-sized blocks (TILE×TILE) that load the larger input
  tile in several passes; dynamic shared memory; any padding and stride.
- conv2d_tiled_input_block: input-tile-sized blocks (IN_TILE×IN_TILE) where only the top-left
  (IN_TILE−K)/stride+1 square computes; any padding and stride (IN_TILE ≥ K).
- conv2d_tiled_cached_halo: TILE×TILE blocks that keep only the interior in shared memory and read
  the halo from global memory (L1/L2); any padding, stride 1 only.

conv2d_tiled_early_return is strategy 3 as the PyCUDA blog wrote it (32×32 blocks, out-of-range
threads return before the barrier): a BarrierError where a block has such threads, for the chapter
to show; it is no implementation of the chapter.

All three: grid (tiles, M, B) with one output map of one image per block. The batch goes on
gridDim.z, so batches over 65,535 images are launched in chunks.
"""
from __future__ import annotations

from ..gpu._limits import GRID_YZ_MAX, SHARED_DEFAULT_MAX
from . import Impl, ceil_div, conv2d_shapes, output
from ._kernels import Launch, batch_chunks, remember

MULTI_PASS_FILE = "kernels/03_tiled/conv2d_tiled_halo_multi_pass.cu"
INPUT_BLOCK_FILE = "kernels/03_tiled/conv2d_tiled_input_block.cu"
CACHED_HALO_FILE = "kernels/03_tiled/conv2d_tiled_cached_halo.cu"
EARLY_RETURN_FILE = "kernels/03_tiled/conv2d_tiled_early_return.cu"   # the blog's form: wrong, to show why

MASK_MAX = 16384          # floats in c_mask (64 KB, all of constant memory); the .cu files' default


def mask_place(M: int, C: int, K: int) -> str:
    """Where the mask goes by default: 'constant' when its M·C·K² floats fit in 64 KB, else 'global'."""
    return "constant" if M * C * K * K <= MASK_MAX else "global"


def _check_mask(mask: str, w) -> None:
    if mask not in ("constant", "global"):
        raise ValueError(f"mask must be 'constant' or 'global', not {mask!r}")
    if mask == "constant" and w.numel() > MASK_MAX:
        raise ValueError(f"the mask has {w.numel():,} floats, more than the {MASK_MAX:,} (64 KB) of constant "
                         f"memory: use mask='global' for this layer")


def _launches(path, kernel, defines, B, scalars, grid_xy, block, shared=0):
    """One launch per chunk of at most 65,535 images (the batch is on gridDim.z): [(b0, b1, Launch)]."""
    return [(b0, b1, Launch(path, kernel, defines, (b1 - b0, *scalars), grid=(*grid_xy, b1 - b0), block=block,
                            shared=shared))
            for b0, b1 in batch_chunks(B, GRID_YZ_MAX)]


def _run(plan, x, w, y, mask):
    shape, launches = plan
    y = output(y, shape, x)
    for b0, b1, launch in launches:
        xs, ys = (x, y) if len(launches) == 1 else (x[b0:b1], y[b0:b1])
        if mask == "constant":
            launch.with_mask(w, xs, w, ys)
        else:
            launch(xs, w, ys)
    return y


_plans: dict = {}


def conv2d_tiled_halo_multi_pass(x, w, y=None, *, stride: int = 1, padding: int = 0, mask: str | None = None,
                                 TILE: int | None = None):
    def build():
        B, C, M, H, W, K, Ho, Wo = conv2d_shapes(x, w, stride, padding)
        _check_mask(mask_, w)
        in_w = (TILE_ - 1) * stride + K
        shared = in_w * in_w * 4
        if shared > SHARED_DEFAULT_MAX:
            raise ValueError(f"the input tile is {in_w}×{in_w} floats = {shared:,} bytes, over 48 KB: use a smaller TILE")
        tiles = ceil_div(Ho, TILE_) * ceil_div(Wo, TILE_)
        defines = {"TILE": TILE_, "MASK_IN_CONSTANT": int(mask_ == "constant")}
        return (B, M, Ho, Wo), _launches(MULTI_PASS_FILE, "conv2d_tiled_halo_multi_pass", defines, B,
                                         (C, M, H, W, K, padding, stride), (tiles, M), (TILE_, TILE_), shared)

    mask_ = mask or mask_place(int(w.shape[0]), int(w.shape[1]), int(w.shape[2]))
    TILE_ = int(TILE or 16)
    return _run(remember(_plans, ("multi", x.shape, w.shape, stride, padding, mask_, TILE_), build), x, w, y, mask_)


def input_block_out_tile(IN_TILE: int, K: int, stride: int) -> int:
    """Outputs per block edge of the input-block strategy: (IN_TILE − K)/stride + 1."""
    return (IN_TILE - K) // stride + 1


def conv2d_tiled_input_block(x, w, y=None, *, stride: int = 1, padding: int = 0, mask: str | None = None,
                             IN_TILE: int | None = None):
    def build():
        B, C, M, H, W, K, Ho, Wo = conv2d_shapes(x, w, stride, padding)
        _check_mask(mask_, w)
        if IN_TILE_ < K:
            raise ValueError(f"IN_TILE={IN_TILE_} is smaller than the mask (K={K}): no thread would compute")
        if IN_TILE_ * IN_TILE_ > 1024:
            raise ValueError(f"IN_TILE={IN_TILE_} gives {IN_TILE_ * IN_TILE_} threads per block, over 1024")
        out_tile = input_block_out_tile(IN_TILE_, K, stride)
        tiles = ceil_div(Ho, out_tile) * ceil_div(Wo, out_tile)
        defines = {"IN_TILE": IN_TILE_, "MASK_IN_CONSTANT": int(mask_ == "constant")}
        return (B, M, Ho, Wo), _launches(INPUT_BLOCK_FILE, "conv2d_tiled_input_block", defines, B,
                                         (C, M, H, W, K, padding, stride), (tiles, M), (IN_TILE_, IN_TILE_))

    mask_ = mask or mask_place(int(w.shape[0]), int(w.shape[1]), int(w.shape[2]))
    IN_TILE_ = int(IN_TILE or 32)
    return _run(remember(_plans, ("input", x.shape, w.shape, stride, padding, mask_, IN_TILE_), build), x, w, y, mask_)


def _halo_from_cache(path, kernel, key, x, w, y, stride, padding, mask, TILE):
    def build():
        if stride != 1:
            raise ValueError(f"{kernel} supports stride 1 only (its interior is the block's own pixels)")
        B, C, M, H, W, K, Ho, Wo = conv2d_shapes(x, w, stride, padding)
        _check_mask(mask_, w)
        tiles = ceil_div(Ho, TILE) * ceil_div(Wo, TILE)
        defines = {"TILE": TILE, "MASK_IN_CONSTANT": int(mask_ == "constant")}
        return (B, M, Ho, Wo), _launches(path, kernel, defines, B, (C, M, H, W, K, padding), (tiles, M),
                                         (TILE, TILE))

    mask_ = mask or mask_place(int(w.shape[0]), int(w.shape[1]), int(w.shape[2]))
    return _run(remember(_plans, (key, x.shape, w.shape, stride, padding, mask_, TILE), build), x, w, y, mask_)


def conv2d_tiled_cached_halo(x, w, y=None, *, stride: int = 1, padding: int = 0, mask: str | None = None,
                             TILE: int | None = None):
    return _halo_from_cache(CACHED_HALO_FILE, "conv2d_tiled_cached_halo", "cached", x, w, y, stride, padding,
                            mask, int(TILE or 16))


def conv2d_tiled_early_return(x, w, y=None, *, stride: int = 1, padding: int = 0, mask: str | None = None,
                              TILE: int | None = None):
    """The PyCUDA blog's form of strategy 3, for the chapter to show its fault: TILE×TILE blocks (32 by
    default) whose out-of-range threads return before the barrier. Correct only where TILE divides
    both output sides; elsewhere the emulator stops it with a BarrierError (a GPU's behaviour is
    undefined). Not among IMPLEMENTATIONS: conv2d_tiled_cached_halo with TILE=32 is its fix."""
    return _halo_from_cache(EARLY_RETURN_FILE, "conv2d_tiled_early_return", "early", x, w, y, stride, padding,
                            mask, int(TILE or 32))


def _mask_config(s) -> dict:
    return {"mask": mask_place(s.M, s.C, s.K)}


#: The chapter's implementations, by the name the figures use (the mask in constant memory where it
#: fits, else read from global memory).
IMPLEMENTATIONS = (
    Impl("tiled, multi-pass halo load", conv2d_tiled_halo_multi_pass, config=lambda s: {**_mask_config(s), "TILE": 16}, key="tiled_multi_pass", candidate=False),
    Impl("tiled, input-sized blocks", conv2d_tiled_input_block,
         applies=lambda s: s.K <= 32, config=lambda s: {**_mask_config(s), "IN_TILE": 32}, key="tiled_input_block", candidate=False),
    Impl("tiled, halo from cache", conv2d_tiled_cached_halo,
         applies=lambda s: s.stride == 1, config=lambda s: {**_mask_config(s), "TILE": 16}, key="tiled_cached_halo", candidate=False),
)


def pick(shape) -> Impl:
    """Chapter 3's best for a layer shape, by the chapter's H200 measurements (book/data/03_tiled.csv,
    2026-11-22): the multi-pass halo load for few maps (M <= 16: lenet_c1 5.7 ms against 11.5 for
    input-sized blocks, lenet_c3 23.8 against 30.3), input-sized blocks for more (fa17, days100,
    resnet: 7.2, 1.7, 5.2 ms against 7.5, 2.0, 7.2), where a block's 1,024 threads share each load."""
    multi_pass, input_block, _ = IMPLEMENTATIONS
    return multi_pass if shape.M <= 16 or not input_block.applies(shape) else input_block
