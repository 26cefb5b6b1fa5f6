"""fp64 references on the CPU, in torch's convention (cross-correlation: no flip of the mask).
Every kernel in the course is checked against these."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def _f64(t) -> torch.Tensor:
    t = t if isinstance(t, torch.Tensor) else torch.as_tensor(t)
    return t.detach().to("cpu", torch.float64)


def conv2d(x, w, bias=None, stride=1, padding=0) -> torch.Tensor:
    """y[b,m,i,j] = sum_{c,p,q} x[b,c,i*s+p-pad,j*s+q-pad] * w[m,c,p,q] (+ bias[m])."""
    return F.conv2d(_f64(x), _f64(w), None if bias is None else _f64(bias), stride=stride, padding=padding)


def conv3d(x, w, stride=1, padding=0) -> torch.Tensor:
    """x (B,C,D,H,W) or (D,H,W); w (M,C,K,K,K) or (K,K,K) for the single-channel case."""
    x, w = _f64(x), _f64(w)
    single = x.dim() == 3
    if single:
        x, w = x[None, None], w[None, None]
    y = F.conv3d(x, w, stride=stride, padding=padding)
    return y[0, 0] if single else y


def conv2d_input_grad(x_shape, w, dy, stride=1, padding=0) -> torch.Tensor:
    """dL/dx given dL/dy: a transposed convolution with the mask."""
    return torch.nn.grad.conv2d_input(tuple(x_shape), _f64(w), _f64(dy), stride=stride, padding=padding)


def conv2d_weight_grad(x, w_shape, dy, stride=1, padding=0) -> torch.Tensor:
    """dL/dw given dL/dy: summed over the batch and every output pixel."""
    return torch.nn.grad.conv2d_weight(_f64(x), tuple(w_shape), _f64(dy), stride=stride, padding=padding)


def matmul(a, b) -> torch.Tensor:
    return _f64(a) @ _f64(b)
