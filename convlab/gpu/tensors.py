"""Tensors on the backend's device: random inputs that repeat on both backends, and outputs
poisoned with NaN, so an element a kernel never writes shows in cl.check."""
from __future__ import annotations

import torch

from .runtime import device

_gen = torch.Generator().manual_seed(20261121)


def seed(n: int):
    """Make the next cl.randn calls repeat (they are fresh random numbers otherwise)."""
    _gen.manual_seed(int(n))


def _dev():
    return device().torch_device


def _shape(shape):
    return tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)) else shape


def randn(*shape, dtype=torch.float32) -> torch.Tensor:
    """Standard normal values (never zeros), made on the CPU so both backends see the same numbers."""
    return torch.randn(_shape(shape), generator=_gen, dtype=torch.float64).to(dtype).to(_dev())


def empty(*shape, dtype=torch.float32) -> torch.Tensor:
    """An output buffer poisoned with NaN (or -1 for integers): anything never written shows."""
    if dtype.is_floating_point:
        return torch.full(_shape(shape), float("nan"), dtype=dtype, device=_dev())
    return torch.full(_shape(shape), -1, dtype=dtype, device=_dev())


def zeros(*shape, dtype=torch.float32) -> torch.Tensor:
    return torch.zeros(_shape(shape), dtype=dtype, device=_dev())


def to_device(t) -> torch.Tensor:
    t = t if isinstance(t, torch.Tensor) else torch.as_tensor(t)
    return t.to(_dev()).contiguous()


def out_size(n: int, k: int, stride: int = 1, padding: int = 0) -> int:
    """Output extent of a convolution along one axis: (n + 2p - k) // s + 1."""
    return (n + 2 * padding - k) // stride + 1
