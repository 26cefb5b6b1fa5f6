"""The bottom layer of the launchers: a layer's sizes as the one shape type, convlab.measuring.workloads.Workload,
from the forms torch's conv2d takes its arguments in, and the checks every launcher makes of its
tensors.

- out_size(n, K, stride, padding): the output size along one axis (convlab.gpu.tensors', re-exported).
- conv2d_shapes(x, w, stride, padding, dy=None) -> (B, C, M, H, W, K, Ho, Wo): the chapters' plain
  layers, a gradient's dy checked against them too.
- layer(x_shape, w_shape, stride, padding, dilation, groups, bias_shape=None) -> Workload: any
  layer, with torch's argument forms resolved (ints, 1- and 2-sequences, 'same' and 'valid'); an
  argument torch rejects gives torch's own error. Cached by the arguments' values and types.
- plain_arg(v): whether an argument's value alone says what torch makes of it (so it can key a cache).
- check_tensors(dtypes, layout="nchw", device=False, **tensors) -> torch dtype: the launchers' one
  check of their tensors' dtypes (TypeError), layout and device (ValueError); check_inputs(x, w,
  bias): a chapter-9 forward's.
- plane_too_large(s) / check_plane_sizes(s): the kernels index inside a plane with int.
- suffix(dtype): the entry point of a kernel file for a dtype (_f32, _f16).
- DTYPE / DTYPE_NAME: the one dtype vocabulary ("fp32", "fp16", "bf16") and its torch dtypes.
"""
from __future__ import annotations

import functools
import warnings

import torch
import torch.nn.functional as F

from ..gpu import runtime
from ..gpu._limits import INT32_MAX
from ..gpu.tensors import out_size  # noqa: F401 (the launchers' shape helper, re-exported)
from ..measuring.workloads import Workload

#: The one dtype vocabulary of convlab.ops: records (Impl.dtypes), rule tables and result rows name
#: a dtype by one of these strings; the torch dtype of each.
DTYPE = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
DTYPE_NAME = {t: name for name, t in DTYPE.items()}


def dims(t_or_shape) -> tuple:
    """A tensor's shape, or a shape, as a tuple of ints."""
    return tuple(int(v) for v in (t_or_shape.shape if isinstance(t_or_shape, torch.Tensor) else t_or_shape))


def conv2d_shapes(x, w, stride: int = 1, padding: int = 0, dy=None):
    """(B, C, M, H, W, K, Ho, Wo) of a chapters' plain layer from x (B, C, H, W) and w (M, C, K, K),
    tensors or shapes; checks that they fit, that there is an output, that dy (a gradient's, when
    given) has its shape, and that x and the output stay within int indices."""
    x, w = dims(x), dims(w)
    if len(x) != 4 or len(w) != 4:
        raise ValueError(f"expected x (B, C, H, W) and w (M, C, K, K), got {x} and {w}")
    B, C, H, W = x
    M, Cw, K, K2 = w
    if Cw != C or K2 != K:
        raise ValueError(f"w {w} does not fit x {x}: need (M, {C}, K, K)")
    if stride < 1 or padding < 0:
        raise ValueError(f"stride {stride} and padding {padding}: need stride >= 1, padding >= 0")
    Ho, Wo = out_size(H, K, stride, padding), out_size(W, K, stride, padding)
    if Ho < 1 or Wo < 1:
        raise ValueError(f"no output: input {H}×{W}, K={K}, stride {stride}, padding {padding}")
    if dy is not None and dims(dy) != (B, M, Ho, Wo):
        raise ValueError(f"dy has shape {dims(dy)}, but x {x}, w {w}, stride {stride}, padding "
                         f"{padding} give y the shape {(B, M, Ho, Wo)}")
    for name, n in (("x", B * C * H * W), ("y" if dy is None else "dy", B * M * Ho * Wo)):
        if n > INT32_MAX // 2:  # the kernels index with int; keep headroom for the grid stride
            raise ValueError(f"{name} has {n:,} elements: too many for int indices")
    return B, C, M, H, W, K, Ho, Wo


# ---- torch's argument forms --------------------------------------------------------------------

def two(v) -> tuple:
    """torch's expansion of an int or a 1-sequence to both axes."""
    v = tuple(v) if isinstance(v, (list, tuple)) else (v,)
    return v * 2 if len(v) == 1 else v


def _key(v):
    """v as a cache key that keeps every type: torch takes padding=1 but not 1.0 or True, which are
    equal to 1 and hash alike."""
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, tuple(_key(e) for e in v))
    return (type(v).__name__, v)


def _unkey(k):
    t, v = k
    if t in ("list", "tuple", "Size"):
        return (list if t == "list" else tuple)(_unkey(e) for e in v)
    return v


class TorchMustAnswer(Exception):
    """An argument torch rejects but its meta tensors let through (or that meta tensors reject
    with an error of their own): the drop-in asks torch itself, which raises its real error."""


@functools.lru_cache(maxsize=4096)
def _layer_of(key: tuple) -> Workload:
    x_shape, w_shape, b_shape, stride, padding, dilation, groups = (_unkey(k) for k in key)
    x_shape, w_shape = tuple(x_shape), tuple(w_shape)
    b_shape = None if b_shape is None else tuple(b_shape)
    meta = dict(device="meta")
    try:
        with warnings.catch_warnings():   # torch's note on 'same' copying the input is about its own kernels
            warnings.simplefilter("ignore", UserWarning)
            y = F.conv2d(torch.empty(x_shape, **meta), torch.empty(w_shape, **meta),
                         None if b_shape is None else torch.empty(b_shape, **meta), stride, padding, dilation, groups)
    except Exception as e:     # torch's message for the meta call; the drop-in re-asks torch on the real tensors
        raise TorchMustAnswer(str(e)) from e
    s, d = two(stride), two(dilation)
    if len(s) != 2 or len(d) != 2 or min(s) < 1 or min(d) < 1 or groups < 1 or w_shape[0] % groups:
        raise TorchMustAnswer(f"stride {stride}, dilation {dilation}, groups {groups}: torch rejects these")
    if b_shape is not None and b_shape != (w_shape[0],):
        raise TorchMustAnswer(f"a bias of shape {b_shape} for {w_shape[0]} maps: torch rejects it")
    M, Cg, Kh, Kw = w_shape
    if isinstance(padding, str):
        # torch: 'same' pads d*(k-1) in all, the smaller half before; 'valid' pads nothing
        total = tuple(d[i] * (k - 1) for i, k in enumerate((Kh, Kw))) if padding == "same" else (0, 0)
        p = tuple(t // 2 for t in total)
        end = tuple(t - t // 2 for t in total)
    else:
        p = end = two(padding)
        if len(p) != 2 or min(p) < 0:
            raise TorchMustAnswer(f"padding {padding}: torch rejects it")
    B, C, H, W = x_shape if len(x_shape) == 4 else (1, *x_shape)
    s_ = Workload("", B=B, C=C, M=M, H=H, W=W, K=(Kh, Kw), stride=s, padding=p, dilation=d, groups=groups,
                  padding_end=end[0], padding_w_end=end[1])
    assert (s_.Ho, s_.Wo) == tuple(y.shape[-2:]), (s_, y.shape)
    return s_


def plain_arg(v) -> bool:
    """An argument whose value alone says what torch makes of it: an int, a str, None, a shape, a
    tuple of ints (True or 1.0 equal 1 and hash alike, but torch takes them differently)."""
    t = type(v)
    return t is int or t is str or v is None or t is torch.Size or (t is tuple and all(type(e) is int for e in v))


_plain_layers: dict = {}      # plain arguments, as given -> Workload: a repeated call's one lookup


def resolve(x_shape, w_shape, b_shape, stride, padding, dilation, groups) -> Workload:
    """layer(), raising TorchMustAnswer (or TypeError for unhashable arguments) where torch must
    answer: what the drop-in uses to decide between the kernels and torch."""
    args = (x_shape, w_shape, b_shape, stride, padding, dilation, groups)
    plain = all(map(plain_arg, args))
    if plain:
        s = _plain_layers.get(args)
        if s is not None:
            return s
    s = _layer_of(tuple(_key(v) for v in args))
    if plain:
        _plain_layers[args] = s
    return s


def layer(x_shape, w_shape, stride=1, padding=0, dilation=1, groups=1, bias_shape=None) -> Workload:
    """The Workload of conv2d(x, w, bias, stride, padding, dilation, groups) for an input of x_shape
    (4-D, or 3-D unbatched), a mask of w_shape and a bias of bias_shape (None: no bias); torch's
    error (a RuntimeError) for arguments it rejects."""
    try:
        return resolve(x_shape, w_shape, bias_shape, stride, padding, dilation, groups)
    except TorchMustAnswer as e:
        raise RuntimeError(f"torch.nn.functional.conv2d rejects these arguments: {e}") from None
    except TypeError as e:       # unhashable or ill-typed arguments: torch's own TypeError
        raise TypeError(f"torch.nn.functional.conv2d rejects these arguments: {e}") from None


def plane_too_large(s: Workload) -> str | None:
    """Indices inside one plane (and a map's reduction) are int in the kernels."""
    for what, n in (("an input plane H*W", s.H * s.W), ("an output plane Ho*Wo", s.Ho * s.Wo),
                    ("a map's mask C/groups*Kh*Kw", s.reduction)):
        if n > INT32_MAX:
            return f"{what} has {n:,} elements, over the kernels' int indices (2^31 - 1)"
    return None


def check_plane_sizes(s: Workload) -> None:
    why = plane_too_large(s)
    if why:
        raise ValueError(why + ": split the input, or use torch.nn.functional.conv2d (the drop-in does)")


# ---- tensors -----------------------------------------------------------------------------------

def _torch_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def check_tensors(dtypes=("fp32", "fp16"), *, layout: str | None = "nchw", device: bool = False,
                  **tensors) -> torch.dtype:
    """The launchers' one check of their tensors: every one given (None skipped) a torch.Tensor, all
    of one dtype among `dtypes` (names of DTYPE), else a TypeError naming each one's; with
    layout="nchw", contiguous (None: a launcher that reads any layout, or copies); with device=True,
    on the backend's device (a kept launch checks it as it launches). Both ValueErrors. Returns the
    dtype."""
    given = {n: t for n, t in tensors.items() if t is not None}
    kinds = {t.dtype if isinstance(t, torch.Tensor) else None for t in given.values()}
    dtype = next(iter(kinds))
    if len(kinds) != 1 or DTYPE_NAME.get(dtype) not in dtypes:
        want = " or ".join(_torch_name(DTYPE[d]) for d in dtypes)
        got = ", ".join(f"{n} {_torch_name(t.dtype) if isinstance(t, torch.Tensor) else type(t).__name__}"
                        for n, t in given.items())
        one = ", all of one dtype" if len(given) > 1 else ""
        raise TypeError(f"{', '.join(given)}: this launcher takes {want} tensors{one}; got {got} "
                        f"(convert with .to(torch.{_torch_name(DTYPE[dtypes[0]])}))")
    for n, t in given.items():
        if device and t.device.type not in (runtime.device().torch_device, "meta"):   # meta: recorded, not run
            raise ValueError(f"{n} is on {t.device}, the {runtime.backend()} backend runs on "
                             f"{runtime.device().torch_device}: move it with cl.to_device({n})")
        if layout == "nchw" and not t.is_contiguous():
            raise ValueError(f"{n} must be contiguous (NCHW): call {n}.contiguous() first")
    return dtype


def check_inputs(x, w, bias=None) -> None:
    """A forward's tensors: x 4-D; x, w and bias float32 or float16, of one dtype, on the device,
    contiguous (check_tensors)."""
    check_tensors(x=x, w=w, bias=bias, device=True)
    if x.dim() != 4:
        raise ValueError(f"x must be (B, C, H, W), got {tuple(x.shape)} (the drop-in takes unbatched inputs)")


def suffix(dtype) -> str:
    """Each chapter-9 kernel file has a float entry point (_f32) and a half one (_f16) around one body."""
    return "_f16" if dtype == torch.float16 else "_f32"
