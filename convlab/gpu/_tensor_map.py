"""A CUtensorMap as convlab passes it to a kernel's `const __grid_constant__ CUtensorMap`
parameter: what the copy engine needs to fetch boxes of a tensor (its address, sizes, strides,
the box and the swizzle), encoded by the backend that runs the kernel (runtime.tensor_map)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

#: the swizzles a map may have, in bytes: 0 (none), 32, 64, 128
SWIZZLES = (0, 32, 64, 128)


@dataclass(frozen=True, eq=False)
class TensorMap:
    tensor: torch.Tensor      # the tensor it describes, kept alive as long as the map
    dims: tuple               # sizes in elements, innermost first (the reverse of a contiguous tensor's shape)
    strides: tuple            # bytes between consecutive indices of dims[1:]
    box: tuple                # the box one copy fetches, in elements, innermost first
    swizzle: int              # bytes: 0, 32, 64 or 128
    encoded: bytes            # the 128 bytes the kernel receives (the GPU driver's or the emulator's record)
    element_strides: tuple = ()   # the copy's step through each dimension, innermost first (() : all 1)

    def __repr__(self):
        steps = tuple(reversed(self.element_strides))
        return (f"<TensorMap of {self.tensor.dtype} {tuple(reversed(self.dims))}, box "
                f"{tuple(reversed(self.box))}, swizzle {self.swizzle}"
                + (f", element strides {steps}" if any(e != 1 for e in steps) else "") + ">")
