"""cl.check: compare a kernel's output with the fp64 reference and say precisely what is wrong."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ._errors import CheckError

# (rtol, atol as a fraction of the reference's RMS) by output dtype
_TOL = {torch.float64: (1e-10, 1e-10), torch.float32: (1e-4, 1e-4), torch.float16: (1e-2, 1e-2),
        torch.bfloat16: (2e-2, 2e-2)}


@dataclass
class CheckResult:
    name: str
    n: int
    max_abs: float
    max_rel: float
    rtol: float
    atol: float

    def __bool__(self):
        return True

    def __str__(self):
        return (f"{self.name}: OK, all {self.n:,} values match the fp64 reference "
                f"(max abs err {self.max_abs:.1e}, max rel err {self.max_rel:.1e})")

    __repr__ = __str__


# The index names of an output, by its number of dimensions. A weight gradient is 4-D too but has
# no image axes: pass index=DW_INDEX (its wrong elements are no pixels near an edge).
INDEX = {4: ("b", "m", "h", "w"), 5: ("b", "m", "d", "h", "w"), 3: ("d", "h", "w"), 2: ("row", "col")}
DW_INDEX = ("m", "c", "ky", "kx")


def _where(idx, names):
    return f"{tuple(idx)}" + (f" ({','.join(names)})" if names else "")


def _edge_hint(bad: torch.Tensor, shape, names) -> str:
    """A student's most common bug is at the border: say so when the bad outputs are all there
    (outputs whose last two axes are an image's rows and columns only)."""
    if len(shape) < 2 or bad.shape[0] == 0 or tuple(names or ())[-2:] != ("h", "w"):
        return ""
    h, w = bad[:, -2], bad[:, -1]
    H, W = shape[-2], shape[-1]
    if bool((w == W - 1).all()) or bool((h == H - 1).all()):
        return " All of them are in the last row or column: look at the bounds check / the halo at the far edge."
    if bool(((h >= H - 8) | (w >= W - 8)).all()) and bad.shape[0] < 0.5 * torch.Size(shape).numel():
        return " They are all near the bottom or right edge: a tile that crosses the edge of the image?"
    return ""


def check(out, ref, rtol: float | None = None, atol: float | None = None, name: str = "y",
          raise_on_error: bool = True, index: tuple | None = None):
    """Raise CheckError (or return it, with raise_on_error=False) unless |out-ref| <= atol + rtol*|ref|
    everywhere. atol defaults to a fraction of the reference's RMS, by the output's dtype. index
    names the output's axes in messages (default by its dimensions: (b,m,h,w) for 4-D; a weight
    gradient takes index=("m", "c", "ky", "kx"), convlab.gpu.check.DW_INDEX)."""
    if not isinstance(out, torch.Tensor):
        out = torch.as_tensor(out)
    dt = out.dtype
    o = out.detach().to("cpu", torch.float64)
    r = (ref if isinstance(ref, torch.Tensor) else torch.as_tensor(ref)).detach().to("cpu", torch.float64)
    err = None
    if o.shape != r.shape:
        err = CheckError(f"{name}: shape {tuple(o.shape)} but the reference has shape {tuple(r.shape)}")
    else:
        names = tuple(index) if index is not None else INDEX.get(o.dim())
        if names is not None and len(names) != o.dim():
            raise ValueError(f"index={names} names {len(names)} axes, but {name} has {o.dim()}")
        d_rtol, d_atol = _TOL.get(dt, (1e-4, 1e-4))
        rtol = d_rtol if rtol is None else rtol
        scale = float(r.pow(2).mean().sqrt()) if r.numel() else 1.0
        atol = d_atol * max(scale, 1e-30) if atol is None else atol
        n = o.numel()
        unwritten = torch.isnan(o) & ~torch.isnan(r)
        diff = (o - r).abs()
        bad = unwritten | ~(diff <= atol + rtol * r.abs())
        bad &= ~(torch.isnan(o) & torch.isnan(r))
        n_bad = int(bad.sum())
        if n_bad == 0:
            rel = (diff / r.abs().clamp_min(atol)).max() if n else torch.tensor(0.0)
            return CheckResult(name, n, float(diff.max()) if n else 0.0, float(rel), rtol, atol)
        n_nan = int(unwritten.sum())
        if n_nan:
            idx = unwritten.nonzero()
            first = idx[0].tolist()
            msg = (f"{name}: {n_nan:,} of {n:,} outputs were never written (still NaN, as cl.empty left them), "
                   f"first at {_where(first, names)}. Does the grid cover every output, and does every "
                   f"thread that should write reach its store?" + _edge_hint(idx, o.shape, names))
            if n_bad > n_nan:
                msg += f" Besides, {n_bad - n_nan:,} written outputs are wrong."
        else:
            idx = bad.nonzero()
            first = idx[0].tolist()
            worst = torch.where(bad, diff.nan_to_num(float("inf")), torch.zeros_like(diff))
            wi = list(divmod_index(int(worst.argmax()), o.shape))
            msg = (f"{name}: {n_bad:,} of {n:,} outputs are wrong. First at {_where(first, names)}: expected "
                   f"{r[tuple(first)].item():.6g}, got {o[tuple(first)].item():.6g}. Largest error "
                   f"{float(worst.max()):.3g} at {_where(wi, names)}: expected {r[tuple(wi)].item():.6g}, "
                   f"got {o[tuple(wi)].item():.6g}. (tolerance |err| <= {atol:.2g} + {rtol:.0e}*|expected|)"
                   + _edge_hint(idx, o.shape, names))
        err = CheckError(msg)
    if raise_on_error:
        raise err
    return err


def divmod_index(flat: int, shape) -> tuple:
    idx = []
    for s in reversed(shape):
        flat, i = divmod(flat, s)
        idx.append(i)
    return tuple(reversed(idx))
