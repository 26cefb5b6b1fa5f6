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

All three: grid (tiles, M, B) with one output map of one image per block. The batch goes on
gridDim.z, so batches over 65,535 images are launched in chunks.
"""
from __future__ import annotations

from . import ceil_div, conv2d_shapes
from ._kernels import batch_chunks, module, output, padding, set_mask

MULTI_PASS_FILE = "kernels/03_tiled/conv2d_tiled_halo_multi_pass.cu"
INPUT_BLOCK_FILE = "kernels/03_tiled/conv2d_tiled_input_block.cu"
CACHED_HALO_FILE = "kernels/03_tiled/conv2d_tiled_cached_halo.cu"

MASK_MAX = 16384          # floats in c_mask (64 KB, all of constant memory); the .cu files' default
MAX_SHARED = 48 * 1024    # bytes of shared memory a block may use without opting in


def _mask_module(path: str, mask: str, defines: dict):
    if mask not in ("constant", "global"):
        raise ValueError(f"mask must be 'constant' or 'global', not {mask!r}")
    return module(path, {**defines, "MASK_IN_CONSTANT": int(mask == "constant")})


def _fill_mask(mod, w, mask: str) -> None:
    if mask != "constant":
        return
    if w.numel() > MASK_MAX:
        raise ValueError(f"the mask has {w.numel():,} floats, more than the {MASK_MAX:,} (64 KB) of constant "
                         f"memory: use mask='global' for this layer")
    set_mask(mod, w)


def _launch(kern, x, w, y, B, extra_args, grid_xy, block, shared=0):
    """Launch over the batch in chunks of at most 65,535 images (gridDim.z)."""
    if B <= 65_535:
        kern(x, w, y, B, *extra_args, grid=(*grid_xy, B), block=block, shared=shared)
        return
    for b0, b1 in batch_chunks(B):
        kern(x[b0:b1], w, y[b0:b1], b1 - b0, *extra_args, grid=(*grid_xy, b1 - b0), block=block, shared=shared)


def conv2d_tiled_halo_multi_pass(x, w, y=None, *, stride: int = 1, pad: int = 0, padding: int | None = None,
                                 mask: str = "constant", TILE: int = 16):
    pad_ = _pad(pad, padding)
    B, C, M, H, W, K, Ho, Wo = conv2d_shapes(x, w, stride, pad_)
    y = output(y, (B, M, Ho, Wo))
    in_w = (TILE - 1) * stride + K
    shared = in_w * in_w * 4
    if shared > MAX_SHARED:
        raise ValueError(f"the input tile is {in_w}×{in_w} floats = {shared:,} bytes, over 48 KB: use a smaller TILE")
    mod = _mask_module(MULTI_PASS_FILE, mask, {"TILE": TILE})
    _fill_mask(mod, w, mask)
    tiles = ceil_div(Ho, TILE) * ceil_div(Wo, TILE)
    _launch(mod.kernel("conv2d_tiled_halo_multi_pass"), x, w, y, B, (C, M, H, W, K, pad_, stride),
            (tiles, M), (TILE, TILE), shared)
    return y


def input_block_out_tile(IN_TILE: int, K: int, stride: int) -> int:
    """Outputs per block edge of the input-block strategy: (IN_TILE − K)/stride + 1."""
    return (IN_TILE - K) // stride + 1


def conv2d_tiled_input_block(x, w, y=None, *, stride: int = 1, pad: int = 0, padding: int | None = None,
                             mask: str = "constant", IN_TILE: int = 32):
    pad_ = _pad(pad, padding)
    B, C, M, H, W, K, Ho, Wo = conv2d_shapes(x, w, stride, pad_)
    y = output(y, (B, M, Ho, Wo))
    if IN_TILE < K:
        raise ValueError(f"IN_TILE={IN_TILE} is smaller than the mask (K={K}): no thread would compute")
    if IN_TILE * IN_TILE > 1024:
        raise ValueError(f"IN_TILE={IN_TILE} gives {IN_TILE * IN_TILE} threads per block, over 1024")
    out_tile = input_block_out_tile(IN_TILE, K, stride)
    mod = _mask_module(INPUT_BLOCK_FILE, mask, {"IN_TILE": IN_TILE})
    _fill_mask(mod, w, mask)
    tiles = ceil_div(Ho, out_tile) * ceil_div(Wo, out_tile)
    _launch(mod.kernel("conv2d_tiled_input_block"), x, w, y, B, (C, M, H, W, K, pad_, stride),
            (tiles, M), (IN_TILE, IN_TILE))
    return y


def conv2d_tiled_cached_halo(x, w, y=None, *, stride: int = 1, pad: int = 0, padding: int | None = None,
                             mask: str = "constant", TILE: int = 16):
    pad_ = _pad(pad, padding)
    if stride != 1:
        raise ValueError("conv2d_tiled_cached_halo supports stride 1 only (its interior is the block's own pixels)")
    B, C, M, H, W, K, Ho, Wo = conv2d_shapes(x, w, stride, pad_)
    y = output(y, (B, M, Ho, Wo))
    mod = _mask_module(CACHED_HALO_FILE, mask, {"TILE": TILE})
    _fill_mask(mod, w, mask)
    tiles = ceil_div(Ho, TILE) * ceil_div(Wo, TILE)
    _launch(mod.kernel("conv2d_tiled_cached_halo"), x, w, y, B, (C, M, H, W, K, pad_),
            (tiles, M), (TILE, TILE))
    return y


def _pad(pad, padding_alias):
    return padding(pad, padding_alias)


#: The chapter's implementations by the name the figures use (mask in constant memory).
IMPLEMENTATIONS = {
    "tiled, multi-pass halo load": conv2d_tiled_halo_multi_pass,
    "tiled, input-sized blocks": conv2d_tiled_input_block,
    "tiled, halo from cache": conv2d_tiled_cached_halo,
}
