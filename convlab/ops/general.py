"""Chapter 9 launchers: the general direct convolution (kernels/09_general/), forward, dE/dX and
dE/dW, for every layer torch.nn.functional.conv2d takes, and a drop-in conv2d / Conv2d on them.

Launchers (the course's contract, convlab.ops: outputs allocated with torch.empty, NaN-poisoned
under cl.debug and on the emulator; float32 or float16 tensors, NCHW, contiguous, on the backend's
device):
- conv2d_general(x, w, y=None, *, stride=1, padding=0, dilation=1, groups=1, bias=None) -> y
- conv2d_general_dx(dy, w, dx=None, *, stride=1, padding=0, input_size=(H, W), dilation=1, groups=1) -> dx
- conv2d_general_dw(x, dy, dw=None, *, stride=1, padding=0, kernel_size=(Kh, Kw), dilation=1, groups=1) -> dw
- conv2d_depthwise(x, w, y=None, *, ..., bias=None): the forward for groups == C (depthwise_applies);
  conv2d_forward picks it or conv2d_general; conv2d_input_grad runs dx of a stride-1 depthwise
  layer on it (the flipped mask), else conv2d_general_dx.
stride, padding and dilation as torch takes them: an int, or a 1- or 2-sequence; padding also
'same' or 'valid'. x and dy are 4-D here; conv2d() below adds unbatched inputs.

The drop-in:
- conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1): the same arguments,
  results, gradients (dX, dW, dbias) and errors as torch.nn.functional.conv2d.
- Conv2d: an nn.Conv2d (same parameters, initialisation, state dict, padding modes) whose forward
  runs conv2d above. Conv2d.from_torch(m) copies an nn.Conv2d.

What the kernels do not take is computed by torch itself, so conv2d gives torch's result or
torch's error for every input (kernel_fallback_reason() says which inputs, and why):
- a dtype other than float32/float16, or x, w and bias of different dtypes (torch raises on the
  mix) or not on the backend's device;
- an empty x or w (a zero-size batch, zero channels or maps: no arithmetic, and torch's own shape
  rules in those corner cases);
- a plane too large for the kernels' int indices (H*W, Ho*Wo or a map's C/groups*Kh*Kw over 2^31 - 1).
Arguments are checked by torch: the meta-tensor twin of the call (no data, no arithmetic) gives
torch's error and the output's shape; the few checks meta tensors skip (non-positive stride,
dilation or groups, negative padding, too many values, maps not divisible by groups, the bias's
shape) are made here, and those inputs go to torch, which raises its own error.

The output is NCHW contiguous, whatever the input's memory format (torch keeps channels_last).
The bias gradient is a torch sum over dy (in float32, then rounded to the dtype). Gradients of
gradients (double backward, Hessian-vector products) run on the same kernels.
"""
from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .._limits import GRID_X_MAX, GRID_YZ_MAX, INT32_MAX, SHARED_DEFAULT_MAX
from . import Impl, ceil_div, new_output
from ._kernels import module

FWD_FILE = "kernels/09_general/conv2d_general.cu"
DX_FILE = "kernels/09_general/conv2d_general_dx.cu"
DW_FILE = "kernels/09_general/conv2d_general_dw.cu"
DEPTHWISE_FILE = "kernels/09_general/conv2d_depthwise.cu"

DTYPES = (torch.float32, torch.float16)
BLOCK = 256
MAX_SHARED = SHARED_DEFAULT_MAX     # bytes of shared memory a block may use without opting in


# ---- geometry ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Geometry:
    """One convolution's sizes, with torch's argument forms resolved. ph, pw: the padding at the
    top and left (torch's 'same' with an even mask pads one more at the bottom/right, which the
    output size carries)."""
    B: int
    C: int
    H: int
    W: int
    M: int
    Kh: int
    Kw: int
    Ho: int
    Wo: int
    sh: int
    sw: int
    ph: int
    pw: int
    dh: int
    dw: int
    groups: int

    def kernel_args(self) -> tuple:
        """The integer arguments the conv2d_general*.cu kernels take, in their order."""
        return (self.B, self.C, self.H, self.W, self.M, self.Kh, self.Kw, self.Ho, self.Wo,
                self.sh, self.sw, self.ph, self.pw, self.dh, self.dw, self.groups)


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


def _two(v) -> tuple:
    """torch's expansion of an int or a 1-sequence to both axes."""
    v = tuple(v) if isinstance(v, (list, tuple)) else (v,)
    return v * 2 if len(v) == 1 else v


class _TorchMustAnswer(Exception):
    """An argument torch rejects but its meta tensors let through (or that meta tensors reject
    with an error of their own): conv2d asks torch itself, which raises its real error."""


@functools.lru_cache(maxsize=4096)
def _geometry_of(key: tuple) -> Geometry:
    x_shape, w_shape, b_shape, stride, padding, dilation, groups = (_unkey(k) for k in key)
    x_shape, w_shape = tuple(x_shape), tuple(w_shape)
    b_shape = None if b_shape is None else tuple(b_shape)
    meta = dict(device="meta")
    try:
        with warnings.catch_warnings():   # torch's note on 'same' copying the input is about its own kernels
            warnings.simplefilter("ignore", UserWarning)
            y = F.conv2d(torch.empty(x_shape, **meta), torch.empty(w_shape, **meta),
                         None if b_shape is None else torch.empty(b_shape, **meta), stride, padding, dilation, groups)
    except Exception as e:     # torch's message for the meta call; conv2d re-asks torch on the real tensors
        raise _TorchMustAnswer(str(e)) from e
    s, d = _two(stride), _two(dilation)
    if len(s) != 2 or len(d) != 2 or min(s) < 1 or min(d) < 1 or groups < 1 or w_shape[0] % groups:
        raise _TorchMustAnswer(f"stride {stride}, dilation {dilation}, groups {groups}: torch rejects these")
    if b_shape is not None and b_shape != (w_shape[0],):
        raise _TorchMustAnswer(f"a bias of shape {b_shape} for {w_shape[0]} maps: torch rejects it")
    M, Cg, Kh, Kw = w_shape
    if isinstance(padding, str):
        # torch: 'same' pads d*(k-1) in all, the smaller half before; 'valid' pads nothing
        p = tuple(d[i] * (k - 1) // 2 for i, k in enumerate((Kh, Kw))) if padding == "same" else (0, 0)
    else:
        p = _two(padding)
        if len(p) != 2 or min(p) < 0:
            raise _TorchMustAnswer(f"padding {padding}: torch rejects it")
    x4 = x_shape if len(x_shape) == 4 else (1, *x_shape)
    Ho, Wo = y.shape[-2:]
    return Geometry(x4[0], x4[1], x4[2], x4[3], M, Kh, Kw, int(Ho), int(Wo), s[0], s[1], p[0], p[1],
                    d[0], d[1], groups)


def _plain(v) -> bool:
    """An argument whose value alone says what torch makes of it: an int, a str, None, a shape, a
    tuple of ints (True or 1.0 equal 1 and hash alike, but torch takes them differently)."""
    t = type(v)
    return t is int or t is str or v is None or t is torch.Size or (t is tuple and all(type(e) is int for e in v))


_plain_geometry: dict = {}      # plain arguments, as given -> Geometry: a repeated call's one lookup


def _geometry(x_shape, w_shape, b_shape, stride, padding, dilation, groups) -> Geometry:
    """Geometry, cached by the arguments' values and types; _TorchMustAnswer (or TypeError for
    unhashable arguments) where torch must answer."""
    args = (x_shape, w_shape, b_shape, stride, padding, dilation, groups)
    plain = all(map(_plain, args))
    if plain:
        g = _plain_geometry.get(args)
        if g is not None:
            return g
    g = _geometry_of(tuple(_key(v) for v in args))
    if plain:
        _plain_geometry[args] = g
    return g


def geometry(x_shape, w_shape, stride=1, padding=0, dilation=1, groups=1, bias_shape=None) -> Geometry:
    """The Geometry of conv2d(x, w, bias, stride, padding, dilation, groups) for an input of x_shape
    (4-D, or 3-D unbatched), a mask of w_shape and a bias of bias_shape (None: no bias); torch's
    error (a RuntimeError) for arguments it rejects."""
    try:
        return _geometry(x_shape, w_shape, bias_shape, stride, padding, dilation, groups)
    except _TorchMustAnswer as e:
        raise RuntimeError(f"torch.nn.functional.conv2d rejects these arguments: {e}") from None
    except TypeError as e:       # unhashable or ill-typed arguments: torch's own TypeError
        raise TypeError(f"torch.nn.functional.conv2d rejects these arguments: {e}") from None


def _plane_too_large(g: Geometry) -> str | None:
    """Indices inside one plane (and a map's reduction) are int in the kernels."""
    for what, n in (("an input plane H*W", g.H * g.W), ("an output plane Ho*Wo", g.Ho * g.Wo),
                    ("a map's mask C/groups*Kh*Kw", g.C // g.groups * g.Kh * g.Kw)):
        if n > INT32_MAX:
            return f"{what} has {n:,} elements, over the kernels' int indices (2^31 - 1)"
    return None


def _check_plane_sizes(g: Geometry) -> None:
    why = _plane_too_large(g)
    if why:
        raise ValueError(why + ": split the input, or use torch.nn.functional.conv2d (conv2d() does)")


# ---- tensors -----------------------------------------------------------------------------------

def _check_in(t, name: str, dtype=None) -> None:
    import convlab as cl

    if not isinstance(t, torch.Tensor) or t.dtype not in DTYPES:
        raise TypeError(f"{name} must be a float32 or float16 tensor, got {getattr(t, 'dtype', type(t).__name__)}")
    if dtype is not None and t.dtype != dtype:
        raise TypeError(f"{name} is {t.dtype} but x is {dtype}: convert it with .to({dtype})")
    if t.device.type not in (cl.device().torch_device, "meta"):     # meta: launches recorded, nothing runs
        raise ValueError(f"{name} is on {t.device}, the {cl.backend()} backend runs on "
                         f"{cl.device().torch_device}: move it with cl.to_device({name})")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (NCHW): call {name}.contiguous() first")


def _output(out, shape, like: torch.Tensor, name: str) -> torch.Tensor:
    if out is None:
        return new_output(shape, like)
    _check_in(out, name, like.dtype)
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(out.shape)}, expected {tuple(shape)}")
    return out


def _suffix(dtype) -> str:
    """Each kernel file has a float entry point (_f32) and a half one (_f16) around one body."""
    return "_f16" if dtype == torch.float16 else "_f32"


def _blocks(n: int) -> int:
    return max(1, min(ceil_div(n, BLOCK), GRID_X_MAX))


def _sms() -> int:
    """SMs on a GPU, OS threads on the emulator: how many blocks keep the device busy."""
    import convlab as cl

    return max(1, int(cl.device().threads))


# ---- forward -----------------------------------------------------------------------------------

def conv2d_general(x, w, y=None, *, stride=1, padding=0, dilation=1, groups: int = 1, bias=None):
    """y = conv2d(x, w, bias) by kernels/09_general/conv2d_general.cu: one thread per output."""
    _check_in(x, "x")
    _check_in(w, "w", x.dtype)
    if bias is not None:
        _check_in(bias, "bias", x.dtype)
    if x.dim() != 4:
        raise ValueError(f"x must be (B, C, H, W), got {tuple(x.shape)} (conv2d() takes unbatched inputs)")
    g = geometry(x.shape, w.shape, stride, padding, dilation, groups, None if bias is None else bias.shape)
    _check_plane_sizes(g)
    y = _output(y, (g.B, g.M, g.Ho, g.Wo), x, "y")
    if y.numel() == 0:
        return y
    kern = module(FWD_FILE, {"BLOCK": BLOCK}).kernel("conv2d_general" + _suffix(x.dtype))
    # no bias: any tensor of the dtype fills the slot, has_bias=0 keeps the kernel from reading it
    kern(x, w, w if bias is None else bias, y, *g.kernel_args(), int(bias is not None),
         grid=(_blocks(y.numel()), 1, 1), block=(BLOCK, 1, 1))
    return y


# ---- forward, depthwise (groups == C) ------------------------------------------------------------

DEPTHWISE_MAX_TAPS = 64      # the mask lives in registers: up to 8x8 (3x3, 5x5, 7x7 layers)


def depthwise_vec(g: Geometry, x: torch.Tensor) -> int:
    """Elements per global load of conv2d_depthwise's tile: 16 bytes (4 floats, 8 halves) where
    every row of x starts 16-byte aligned (W a multiple of that, x's storage aligned), else 1."""
    v = 16 // x.element_size()
    return v if g.W % v == 0 and x.data_ptr() % 16 == 0 else 1


def _depthwise_tile(g: Geometry, OY: int, BX: int | None = None, BY: int | None = None,
                    BZ: int | None = None, vec: int = 1) -> tuple:
    """(BX, BY, BZ, shared bytes) of conv2d_depthwise's block: BX output columns (the row in as few
    tiles of at most 32 as it takes, split evenly), BY strips of OY rows (about 256 threads, the
    rows split evenly; fewer while one plane's input tile is over 48 KB), BZ planes (up to 256
    threads in all and 48 KB; more than 1 where one plane's tile is small). vec: elements per load
    (the tile's rows are whole vectors, from the multiple of vec at or left of the first column)."""
    if BX is None:
        BX = ceil_div(g.Wo, ceil_div(g.Wo, 32))
    strips = ceil_div(g.Ho, OY)
    if BY is None:
        most = max(1, min(256 // BX, strips))
        BY = ceil_div(strips, ceil_div(strips, most))
    IW = (BX - 1) * g.sw + (g.Kw - 1) * g.dw + 1
    IWS = (IW + 2 * (vec - 1)) // vec * vec                       # as the kernel's IWS

    def shared(by):
        return ((by * OY - 1) * g.sh + (g.Kh - 1) * g.dh + 1) * IWS * 4

    while BY > 1 and shared(BY) > MAX_SHARED:
        BY -= 1
    if BZ is None:
        BZ = max(1, min(256 // (BX * BY), MAX_SHARED // shared(BY), 64, g.B * g.M))
    return BX, BY, BZ, BZ * shared(BY)


#: Output maps of at least TALL_MAP rows take OY=16 rows a thread, others OY=8. From
#: benchmarks/depthwise_layers.py on an H200 (MobileNetV2 and ConvNeXt depthwise layers, fp32 and
#: fp16): OY=16 was the fastest on the 3x3 layers of 56x56 outputs, OY=8 on 14x14 maps and at
#: stride 2 (28x28 outputs); between the two at 28x28 and on the 7x7 masks (float32 and float16
#: disagreeing); both well ahead of OY=4 (each strip re-reads Kh-1 input rows: a taller strip
#: re-reads fewer, but cuts a short map into too few blocks).
TALL_MAP = 48


def depthwise_config(g: Geometry) -> dict:
    """Default tunables of conv2d_depthwise: OY output rows per thread (16 on maps of TALL_MAP
    rows or more, else 8), and the block of _depthwise_tile. OY is compiled in: one variant per
    mask and map height class serves every plane size."""
    OY = 16 if g.Ho >= TALL_MAP else 8
    BX, BY, BZ, _ = _depthwise_tile(g, OY)
    return {"OY": OY, "BX": BX, "BY": BY, "BZ": BZ}


def depthwise_applies(g: Geometry) -> bool:
    """Depthwise (every map reads one channel: groups == C), the mask fits in registers and the
    input tile of one strip in 48 KB of shared memory (with 16-byte loads' widest rows)."""
    if g.groups != g.C or g.Kh * g.Kw > DEPTHWISE_MAX_TAPS:
        return False
    return _depthwise_tile(g, depthwise_config(g)["OY"], BY=1, BZ=1, vec=8)[3] <= MAX_SHARED


def conv2d_depthwise(x, w, y=None, *, stride=1, padding=0, dilation=1, groups: int = 1, bias=None,
                     OY: int | None = None, BX: int | None = None, BY: int | None = None, BZ: int | None = None,
                     vec: int | None = None):
    """y = conv2d(x, w, bias, groups=C) by kernels/09_general/conv2d_depthwise.cu: a block per tile
    of BZ output planes, their input in shared memory (16-byte loads where depthwise_vec allows;
    vec=1 forces single elements), OY outputs down a column per thread.
    Compiled per mask size, stride, dilation, OY and load width."""
    _check_in(x, "x")
    _check_in(w, "w", x.dtype)
    if bias is not None:
        _check_in(bias, "bias", x.dtype)
    if x.dim() != 4:
        raise ValueError(f"x must be (B, C, H, W), got {tuple(x.shape)}")
    g = geometry(x.shape, w.shape, stride, padding, dilation, groups, None if bias is None else bias.shape)
    _check_plane_sizes(g)
    if not depthwise_applies(g):
        raise ValueError(f"conv2d_depthwise takes groups == C (here {g.groups} groups of {g.C} channels) and masks "
                         f"of at most {DEPTHWISE_MAX_TAPS} taps (here {g.Kh}x{g.Kw}): use conv2d_general")
    OY = int(OY or depthwise_config(g)["OY"])
    best = depthwise_vec(g, x)
    if vec not in (None, 1, best):
        raise ValueError(f"vec={vec}: this x takes {best} element(s) per load (depthwise_vec), or vec=1")
    vec = best if vec is None else 1
    BX, BY, BZ, shared = _depthwise_tile(g, OY, BX, BY, BZ, vec)
    if BX * BY * BZ > 1024 or BZ > 64 or shared > MAX_SHARED:
        raise ValueError(f"block BX={BX} x BY={BY} strips of OY={OY} rows x BZ={BZ} planes: {BX * BY * BZ} threads, "
                         f"{shared:,} bytes of shared memory; at most 1,024 threads, BZ <= 64 and 48 KB: "
                         "lower BX, BY, BZ or OY")
    y = _output(y, (g.B, g.M, g.Ho, g.Wo), x, "y")
    if y.numel() == 0:
        return y
    defines = {"KH": g.Kh, "KW": g.Kw, "SH": g.sh, "SW": g.sw, "DH": g.dh, "DW": g.dw, "OY": OY,
               "VEC16": int(vec > 1)}
    kern = module(DEPTHWISE_FILE, defines).kernel("depthwise" + _suffix(x.dtype))
    grid_xy = (ceil_div(g.Wo, BX), ceil_div(g.Ho, BY * OY))
    if grid_xy[1] > GRID_YZ_MAX:
        raise ValueError(f"Ho={g.Ho}: {grid_xy[1]:,} row tiles, over gridDim.y's 65,535: raise BY or OY")
    planes = g.B * g.M
    per_launch = GRID_YZ_MAX * BZ                  # gridDim.z holds at most 65,535 blocks of BZ planes
    for z0 in range(0, planes, per_launch):
        kern(x, w, w if bias is None else bias, y, g.C, g.H, g.W, g.M, g.Ho, g.Wo, g.ph, g.pw,
             int(bias is not None), z0, planes, grid=(*grid_xy, ceil_div(min(per_launch, planes - z0), BZ)),
             block=(BX, BY, BZ), shared=shared)
    return y


def course_applies(g: Geometry, dtype) -> bool:
    """Whether the chapters' own kernels take the layer (chapter 5's pick forward, chapter 8's best
    dX and dW): float32, one group, no dilation, a square mask, one stride and one padding for both
    axes (torch's 'same' with an even mask pads one more at the end: not theirs), and tensors their
    int indices reach (the general kernels index with 64 bits)."""
    from . import out_size

    small = max(g.B * g.C * g.H * g.W, g.B * g.M * g.Ho * g.Wo) <= INT32_MAX // 2
    return (dtype == torch.float32 and g.groups == 1 and g.dh == g.dw == 1 and g.Kh == g.Kw and g.sh == g.sw
            and g.ph == g.pw and out_size(g.H, g.Kh, g.sh, g.ph) == g.Ho and out_size(g.W, g.Kw, g.sw, g.pw) == g.Wo
            and small)


def conv2d_forward(x, w, y=None, *, stride=1, padding=0, dilation=1, groups: int = 1, bias=None):
    """The forward pass the drop-in runs: the kernel convlab.ops.dispatch.pick() chooses for the
    layer and dtype, among chapters 5, 6 and 9's (dispatch.dispatch_rule() prints the rule)."""
    from .dispatch import conv2d

    return conv2d(x, w, y, stride=stride, padding=padding, dilation=dilation, groups=groups, bias=bias)


# ---- dE/dX -------------------------------------------------------------------------------------

# (the gradient's tensors' shapes and dtype, the plain arguments as given) -> the function that
# runs its kernel (conv2d_input_grad's and conv2d_weight_grad's choice): a repeated backward's one lookup
_grad_routes: dict = {}


def _backprop():
    from . import backprop      # imports this module: imported on first use

    return backprop


def conv2d_general_dx(dy, w, dx=None, *, stride=1, padding=0, input_size, dilation=1, groups: int = 1):
    """dx of conv2d by kernels/09_general/conv2d_general_dx.cu (a gather: one thread per dx
    element, no atomics). input_size=(H, W): with stride > 1 several input sizes give dy's size."""
    _check_in(dy, "dy")
    _check_in(w, "w", dy.dtype)
    if dy.dim() != 4:
        raise ValueError(f"dy must be (B, M, Ho, Wo), got {tuple(dy.shape)}")
    H, W = (int(s) for s in _two(input_size))
    x_shape = (dy.shape[0], w.shape[1] * groups, H, W)
    g = geometry(x_shape, w.shape, stride, padding, dilation, groups)
    if tuple(dy.shape) != (g.B, g.M, g.Ho, g.Wo):
        raise ValueError(f"dy has shape {tuple(dy.shape)}, but an input of {x_shape} and w {tuple(w.shape)} give "
                         f"outputs of {(g.B, g.M, g.Ho, g.Wo)}: check input_size, stride, padding, dilation")
    _check_plane_sizes(g)
    dx = _output(dx, x_shape, dy, "dx")
    if dx.numel() == 0:
        return dx
    kern = module(DX_FILE, {"BLOCK": BLOCK}).kernel("conv2d_general_dx" + _suffix(dy.dtype))
    kern(dy, w, dx, *g.kernel_args(), grid=(_blocks(dx.numel()), 1, 1), block=(BLOCK, 1, 1))
    return dx


def depthwise_dx_padding(g: Geometry) -> tuple | None:
    """For a stride-1 depthwise layer with one map per channel, dx is itself a depthwise forward:
    dy convolved with the flipped mask, padded d*(k-1) - p before, which gives the input's size
    back when the padding was symmetric. That padding (ph, pw), or None where this does not hold
    (strides, channel multipliers, 'same' with an even mask, padding past the mask's span)."""
    if (g.sh, g.sw) != (1, 1) or not g.M == g.C == g.groups:
        return None
    pad = (g.dh * (g.Kh - 1) - g.ph, g.dw * (g.Kw - 1) - g.pw)
    if min(pad) < 0 or (g.Ho + 2 * pad[0] - g.dh * (g.Kh - 1), g.Wo + 2 * pad[1] - g.dw * (g.Kw - 1)) != (g.H, g.W):
        return None
    return pad


def conv2d_input_grad(dy, w, dx=None, *, stride=1, padding=0, input_size, dilation=1, groups: int = 1):
    """The dx the drop-in runs: the fp32 implicit GEMM's dX where igemm_dx_applies, chapter 8's best
    dX where course_applies, conv2d_depthwise on dy with the flipped mask where depthwise_dx_padding
    allows (MobileNet/ConvNeXt layers), else conv2d_general_dx. The choice is kept per layer (plain
    arguments): a repeated backward makes it with one lookup."""
    key = ("dx", dy.shape, w.shape, dy.dtype, input_size, stride, padding, dilation, groups)
    return _grad_route(key, lambda: _dx_route(dy, w, stride, padding, input_size, dilation, groups))(dy, w, dx)


def _grad_route(key: tuple, build):
    """_grad_routes[key], built by build() the first time; kept only when the arguments after the
    tensors' shapes and dtype (key[4:]) are plain (their values alone say what torch makes of them)."""
    if not all(map(_plain, key[4:])):        # a list, a float, ...: maybe unhashable, and never kept
        return build()
    route = _grad_routes.get(key)
    if route is None:
        route = _grad_routes[key] = build()
    return route


def _dx_route(dy, w, stride, padding, input_size, dilation, groups):
    """f(dy, w, dx): conv2d_input_grad's kernel for this layer, with its arguments resolved."""
    H, W = (int(s) for s in _two(input_size))
    g = geometry((dy.shape[0], w.shape[1] * groups, H, W), w.shape, stride, padding, dilation, groups)
    if dy.dtype == torch.float32 and igemm_dx_applies(g):
        from .igemm import conv2d_igemm_f32_dx

        return lambda dy, w, dx: conv2d_igemm_f32_dx(dy, w, dx, padding=g.ph, input_size=(H, W))
    if course_applies(g, dy.dtype):
        best = _backprop().conv2d_input_grad_best
        return lambda dy, w, dx: best(dy, w, dx, stride=g.sh, padding=g.ph, input_size=(H, W))
    pad = depthwise_dx_padding(g)
    if pad is not None and depthwise_applies(g):
        return lambda dy, w, dx: conv2d_depthwise(dy, torch.flip(w, (2, 3)), dx, padding=pad,
                                                  dilation=(g.dh, g.dw), groups=g.C)
    return lambda dy, w, dx: conv2d_general_dx(dy, w, dx, stride=stride, padding=padding, input_size=(H, W),
                                               dilation=dilation, groups=groups)


def igemm_dx_applies(g: Geometry) -> bool:
    """A stride-1 plain layer (padding at most K-1) whose dX, itself a convolution of dy by the
    flipped mask (M channels to C maps), the dispatcher gives to the fp32 implicit GEMM. Its dX was
    faster than torch's on the layers benchmarks/f32_layers.py measured; its dW was not, so dW
    stays on conv2d_weight_grad's kernels."""
    from . import dispatch, igemm

    shape = dispatch._workload_of(g)
    if not (shape.plain and (shape.Ho, shape.Wo) == (g.Ho, g.Wo) and igemm.IGEMM_F32_DX.applies(shape)):
        return False
    return dispatch.pick(igemm.dx_workload(shape), "fp32") is igemm.IGEMM_F32


# ---- dE/dW -------------------------------------------------------------------------------------

DW_TAPS = 12     # taps per block of conv2d_general_dw (its TAPS)


def dw_splits(g: Geometry, taps: int = DW_TAPS) -> int:
    """How many slices of the B*Ho*Wo pixels conv2d_general_dw splits each weight's sum into: enough
    blocks for about 4 waves of 8 resident blocks per SM, each thread still summing 8 pixels or more."""
    blocks = g.M * (g.C // g.groups) * ceil_div(g.Kh * g.Kw, taps)
    pixels = g.B * g.Ho * g.Wo
    want = ceil_div(4 * 8 * _sms(), max(blocks, 1))
    return max(1, min(want, ceil_div(pixels, 8 * BLOCK), GRID_YZ_MAX))


def conv2d_general_dw(x, dy, dw=None, *, stride=1, padding=0, kernel_size, dilation=1, groups: int = 1,
                      splits: int | None = None):
    """dw of conv2d by kernels/09_general/conv2d_general_dw.cu: a block per (map, channel, 12 taps,
    pixel slice), sums in registers then shared memory, the slices added in order by a second
    kernel (deterministic). kernel_size: Kh or (Kh, Kw). splits: pixel slices (default dw_splits)."""
    _check_in(x, "x")
    _check_in(dy, "dy", x.dtype)
    if x.dim() != 4 or dy.dim() != 4:
        raise ValueError(f"x and dy must be 4-D, got {tuple(x.shape)} and {tuple(dy.shape)}")
    Kh, Kw = (int(s) for s in _two(kernel_size))
    B, C = (int(s) for s in x.shape[:2])
    M = int(dy.shape[1])
    if groups < 1 or C % groups:
        raise ValueError(f"groups={groups} must divide the input's {C} channels")
    w_shape = (M, C // groups, Kh, Kw)
    g = geometry(x.shape, w_shape, stride, padding, dilation, groups)
    if tuple(dy.shape) != (g.B, g.M, g.Ho, g.Wo):
        raise ValueError(f"dy has shape {tuple(dy.shape)}, but x {tuple(x.shape)} and a mask of {w_shape} give "
                         f"outputs of {(g.B, g.M, g.Ho, g.Wo)}: check kernel_size, stride, padding, dilation")
    _check_plane_sizes(g)
    dw = _output(dw, w_shape, x, "dw")
    n = dw.numel()
    if n == 0:
        return dw
    splits = dw_splits(g) if splits is None else int(splits)
    if not 1 <= splits <= GRID_YZ_MAX:
        raise ValueError(f"splits={splits}: between 1 and {GRID_YZ_MAX:,} (gridDim.z)")
    pixels = g.B * g.Ho * g.Wo
    per_split = max(1, ceil_div(pixels, splits))
    splits = max(1, ceil_div(pixels, per_split))          # no empty slice
    partial = new_output((splits * n,), x, torch.float32)       # float sums, whatever the dtype
    pairs = g.M * (g.C // g.groups)
    if pairs > GRID_X_MAX or ceil_div(g.Kh * g.Kw, DW_TAPS) > GRID_YZ_MAX:
        raise ValueError(f"{pairs:,} (map, channel) pairs or {g.Kh}x{g.Kw} taps: over the grid's limits")
    mod = module(DW_FILE, {"BLOCK": BLOCK, "TAPS": DW_TAPS})
    mod.kernel("conv2d_general_dw" + _suffix(x.dtype))(x, dy, partial, *g.kernel_args(), per_split,
                                    grid=(pairs, ceil_div(g.Kh * g.Kw, DW_TAPS), splits), block=(BLOCK, 1, 1))
    mod.kernel("conv2d_general_dw_finish" + _suffix(x.dtype))(partial, dw, splits, n, grid=(_blocks(n), 1, 1), block=(BLOCK, 1, 1))
    return dw


def conv2d_weight_grad(x, dy, dw=None, *, stride=1, padding=0, kernel_size, dilation=1, groups: int = 1):
    """The dw the drop-in runs: chapter 8's best dW where course_applies, else conv2d_general_dw
    (kept per layer, as conv2d_input_grad's choice)."""
    key = ("dw", x.shape, dy.shape, x.dtype, kernel_size, stride, padding, dilation, groups)
    return _grad_route(key, lambda: _dw_route(x, dy, stride, padding, kernel_size, dilation, groups))(x, dy, dw)


def _dw_route(x, dy, stride, padding, kernel_size, dilation, groups):
    """f(x, dy, dw): conv2d_weight_grad's kernel for this layer, with its arguments resolved."""
    Kh, Kw = (int(k) for k in _two(kernel_size))
    g = geometry(x.shape, (dy.shape[1], x.shape[1] // groups, Kh, Kw), stride, padding, dilation, groups)
    if course_applies(g, x.dtype):
        best = _backprop().conv2d_weight_grad_best
        return lambda x, dy, dw: best(x, dy, dw, stride=g.sh, padding=g.ph, kernel_size=Kh)
    return lambda x, dy, dw: conv2d_general_dw(x, dy, dw, stride=stride, padding=padding, kernel_size=(Kh, Kw),
                                               dilation=dilation, groups=groups)


# ---- the drop-in -------------------------------------------------------------------------------

def kernel_fallback_reason(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1) -> str | None:
    """Why conv2d hands this call to torch.nn.functional.conv2d instead of the kernels (torch then
    gives its result or its error); None when the kernels run."""
    import convlab as cl

    ts = (input, weight) if bias is None else (input, weight, bias)
    if not all(isinstance(t, torch.Tensor) for t in ts):
        return "not all tensors"
    if any(t.dtype != input.dtype for t in ts):
        return "mixed dtypes"
    if input.dtype not in DTYPES:
        return f"dtype {input.dtype} (the kernels take float32 and float16)"
    where = cl._get_backend().device_type
    if any(t.device.type != where for t in ts):
        return f"not on the backend's device ({where})"
    if input.numel() == 0 or weight.numel() == 0:
        return "an empty input or mask"
    if input.dim() not in (3, 4):
        return f"a {input.dim()}-D input"
    try:
        g = _geometry(input.shape, weight.shape, None if bias is None else bias.shape, stride, padding, dilation, groups)
    except (_TorchMustAnswer, TypeError) as e:
        return f"torch rejects the arguments ({e})"
    return _plane_too_large(g)


class Conv2dFunction(torch.autograd.Function):
    """y = conv2d(x, w, bias) on the chapter's kernels (conv2d_forward: depthwise or general); its
    backward: dx by InputGradFunction (conv2d_input_grad), dw by WeightGradFunction, dbias a torch
    sum over dy. x 4-D;
    stride, padding, dilation in any form torch takes (checked before).

    Differentiable to any order, like torch's conv2d: the gradients of dx and dw are again a
    forward, a dX and a dW of the same layer (dx = dX(dy, w): d/d(dy) is conv2d(g, w) and d/dw is
    dW(g, dy); dw = dW(x, dy): d/dx is dX(dy, G) and d/d(dy) is conv2d(x, G))."""

    @staticmethod
    def forward(ctx, x, w, bias, stride, padding, dilation, groups):
        # x as given: the dispatcher makes it NCHW contiguous, or keeps channels_last for its NHWC kernels
        y = conv2d_forward(x, w.contiguous(), stride=stride, padding=padding, dilation=dilation,
                           groups=groups, bias=None if bias is None else bias.contiguous())
        ctx.save_for_backward(x, w)          # the inputs themselves: second derivatives flow back to them
        ctx.conf = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
        ctx.has_bias = bias is not None
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        dx = dw = db = None
        # create_graph=True (grad mode on here): differentiable gradients; otherwise the kernels
        # straight away, without the cost of two more autograd nodes per backward
        graph = torch.is_grad_enabled()
        if ctx.needs_input_grad[0]:
            size = tuple(x.shape[-2:])
            dx = (InputGradFunction.apply(dy, w, size, ctx.conf) if graph
                  else conv2d_input_grad(dy.contiguous(), w.contiguous(), input_size=size, **ctx.conf))
        if ctx.needs_input_grad[1]:
            size = tuple(w.shape[-2:])
            dw = (WeightGradFunction.apply(x, dy, size, ctx.conf) if graph
                  else conv2d_weight_grad(x.contiguous(), dy.contiguous(), kernel_size=size, **ctx.conf))
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = dy.sum(dim=(0, 2, 3), dtype=torch.float32).to(x.dtype)
        return dx, dw, db, None, None, None, None


def _conv(x, w, conf):
    return Conv2dFunction.apply(x, w, None, conf["stride"], conf["padding"], conf["dilation"], conf["groups"])


class InputGradFunction(torch.autograd.Function):
    """dx = conv2d_input_grad(dy, w) for an input of input_size, as a differentiable function."""

    @staticmethod
    def forward(ctx, dy, w, input_size, conf):
        ctx.save_for_backward(dy, w)
        ctx.conf = conf
        return conv2d_input_grad(dy.contiguous(), w.contiguous(), input_size=input_size, **conf)

    @staticmethod
    def backward(ctx, g):
        dy, w = ctx.saved_tensors
        gdy = gw = None
        if ctx.needs_input_grad[0]:
            gdy = _conv(g, w, ctx.conf)
        if ctx.needs_input_grad[1]:
            gw = WeightGradFunction.apply(g, dy, tuple(w.shape[-2:]), ctx.conf)
        return gdy, gw, None, None


class WeightGradFunction(torch.autograd.Function):
    """dw = conv2d_weight_grad(x, dy) for a mask of kernel_size, as a differentiable function."""

    @staticmethod
    def forward(ctx, x, dy, kernel_size, conf):
        ctx.save_for_backward(x, dy)
        ctx.conf = conf
        return conv2d_weight_grad(x.contiguous(), dy.contiguous(), kernel_size=kernel_size, **conf)

    @staticmethod
    def backward(ctx, g):
        x, dy = ctx.saved_tensors
        gx = gdy = None
        if ctx.needs_input_grad[0]:
            gx = InputGradFunction.apply(dy, g, tuple(x.shape[-2:]), ctx.conf)
        if ctx.needs_input_grad[1]:
            gdy = _conv(x, g, ctx.conf)
        return gx, gdy, None, None


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """torch.nn.functional.conv2d, on the chapter's kernels: the same arguments (ints or tuples,
    'same'/'valid', unbatched (C, H, W) inputs, bias None or (M,)), results, gradients and errors."""
    args = (stride, padding, dilation, groups)
    if kernel_fallback_reason(input, weight, bias, *args) is not None:
        # only what differs from the defaults, as keywords: torch's argument errors then read as
        # for F.conv2d(x, w[, b], name=value), the usual way to call it
        given = {k: v for k, v, d in zip(("stride", "padding", "dilation", "groups"), args, (1, 0, 1, 1))
                 if type(v) is not type(d) or v != d}
        return F.conv2d(input, weight, *([] if bias is None else [bias]), **given)
    x = input if input.dim() == 4 else input.unsqueeze(0)
    y = Conv2dFunction.apply(x, weight, bias, stride, padding, dilation, groups)
    return y if input.dim() == 4 else y.squeeze(0)


class Conv2d(torch.nn.Conv2d):
    """torch.nn.Conv2d (its constructor, parameters, initialisation, state dict and padding modes)
    with the forward pass, and so the gradients, of the chapter's conv2d."""

    def _conv_forward(self, input, weight, bias):
        # as nn.Conv2d._conv_forward, with conv2d in place of F.conv2d
        if self.padding_mode != "zeros":
            return conv2d(F.pad(input, self._reversed_padding_repeated_twice, mode=self.padding_mode),
                          weight, bias, self.stride, 0, self.dilation, self.groups)
        return conv2d(input, weight, bias, self.stride, self.padding, self.dilation, self.groups)

    @classmethod
    def from_torch(cls, conv: torch.nn.Conv2d) -> "Conv2d":
        """A Conv2d with the same configuration as an nn.Conv2d and a copy of its parameters."""
        m = cls(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding, conv.dilation,
                conv.groups, conv.bias is not None, conv.padding_mode, device=conv.weight.device,
                dtype=conv.weight.dtype)
        m.load_state_dict(conv.state_dict())
        return m


def _is_2d(shape) -> bool:
    return getattr(shape, "D", None) is None


def workload_geometry(shape) -> Geometry:
    """The Geometry of a 2D convlab.workloads.Workload."""
    return geometry(shape.x_shape, shape.w_shape, **shape.conv_kwargs())


def _depthwise_workload(shape) -> bool:
    """groups == C (one input channel per map; C = 1 counts), and conv2d_depthwise's tile fits."""
    return _is_2d(shape) and shape.groups == shape.C and depthwise_applies(workload_geometry(shape))


GENERAL = Impl("general direct (any layer)", conv2d_general, "conv2d", _is_2d, any_layer=True)
GENERAL_FP16 = Impl("general direct fp16 (any layer)", conv2d_general, "conv2d_fp16", _is_2d, any_layer=True)
DEPTHWISE = Impl("depthwise (input tile in shared, column strips)", conv2d_depthwise, "conv2d", _depthwise_workload,
                 any_layer=True)
DEPTHWISE_FP16 = Impl("depthwise fp16 (input tile in shared, column strips)", conv2d_depthwise, "conv2d_fp16",
                      _depthwise_workload, any_layer=True)
#: The chapter's general kernels, by the names the figures use. Their tunables default to None and
#: are resolved by the launchers (depthwise_config, dw_splits), so config() is empty.
IMPLEMENTATIONS: tuple[Impl, ...] = (
    GENERAL, GENERAL_FP16, DEPTHWISE, DEPTHWISE_FP16,
    Impl("general dX gather (any layer)", conv2d_general_dx, "conv2d_dx", _is_2d, any_layer=True),
    Impl("general dW (blocks, second pass)", conv2d_general_dw, "conv2d_dw", _is_2d, any_layer=True),
)
