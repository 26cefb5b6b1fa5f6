"""The drop-in: torch.nn.functional.conv2d and torch.nn.Conv2d on the course's kernels, the top layer
of convlab.ops (shapes -> launchers -> dispatch -> here).

- conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, *, precision=None): the
  same arguments, results, gradients (dX, dW, dbias) and errors as torch.nn.functional.conv2d; the
  kernels are dispatch.forward's, dispatch.input_grad's and dispatch.weight_grad's. A float32
  forward's precision is dispatch.fp32_precision's: precision= ('fp32', 'tf32', '3xtf32') or, left
  None, torch's switches (set_float32_matmul_precision 'high': 3xTF32, 'medium': TF32 where
  torch.backends.cudnn.allow_tf32 allows it); by default fp32.
- Conv2d: an nn.Conv2d (same parameters, initialisation, state dict, padding modes) whose forward
  runs conv2d above, with its precision (a keyword of the constructor and of
  Conv2d.from_torch(m), which copies an nn.Conv2d).
- DropInFunction, InputGradFunction, WeightGradFunction: the autograd Functions behind them,
  differentiable to any order.

What the kernels do not take is computed by torch itself, so conv2d gives torch's result or
torch's error for every input (kernel_fallback_reason() says which inputs, and why):
- a dtype the kernels do not take (float32 and float16 always; bfloat16 where a kernel whose record
  takes it takes the layer, forward and, when a gradient is wanted, dX and dW), or x, w and bias of
  different dtypes (torch raises on the mix) or not on the backend's device;
- an empty x or w (a zero-size batch, zero channels or maps: no arithmetic, and torch's own shape
  rules in those corner cases);
- a plane too large for the kernels' int indices (H*W, Ho*Wo or a map's C/groups*Kh*Kw over 2^31 - 1).
Arguments are checked by torch: the meta-tensor twin of the call (no data, no arithmetic) gives
torch's error and the output's shape; the few checks meta tensors skip (non-positive stride,
dilation or groups, negative padding, too many values, maps not divisible by groups, the bias's
shape) are made in shapes.py, and those inputs go to torch, which raises its own error.

The output has x's memory format, as torch's. A route adds no work to its kernel's where the
kernel reads x's layout (dispatch's routes: no copy of x, the bias in the kernel's epilogue where
it has one); a kernel of the other layout gets x converted once, inside the call. The bias
gradient is a torch sum over dy (in float32, then rounded to the dtype: torch's sum of half and
bfloat16). Gradients of gradients (double backward, Hessian-vector products) run
on the same kernels.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..gpu import runtime
from . import dispatch
from ._kernels import Kept
from .shapes import DTYPE, DTYPE_NAME, TorchMustAnswer, plain_arg, plane_too_large, resolve


def kernel_fallback_reason(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1,
                           grad: bool | None = None) -> str | None:
    """Why conv2d hands this call to torch.nn.functional.conv2d instead of the kernels (torch then
    gives its result or its error); None when the kernels run. grad: whether the call needs dX and
    dW kernels too (None: as conv2d decides, from grad mode and requires_grad)."""
    ts = (input, weight) if bias is None else (input, weight, bias)
    if not all(isinstance(t, torch.Tensor) for t in ts):
        return "not all tensors"
    if any(t.dtype != input.dtype for t in ts):
        return "mixed dtypes"
    if input.dtype not in DTYPE_NAME:
        return f"dtype {input.dtype} (the kernels take {', '.join(map(str, DTYPE.values()))})"
    where = runtime.device().torch_device
    if any(t.device.type != where for t in ts):
        return f"not on the backend's device ({where})"
    if input.numel() == 0 or weight.numel() == 0:
        return "an empty input or mask"
    if input.dim() not in (3, 4):
        return f"a {input.dim()}-D input"
    try:
        s = resolve(input.shape, weight.shape, None if bias is None else bias.shape, stride, padding, dilation, groups)
    except (TorchMustAnswer, TypeError) as e:
        return f"torch rejects the arguments ({e})"
    if grad is None:
        grad = _needs_grad(input, weight, bias)
    return plane_too_large(s) or dispatch.no_kernel(s, DTYPE_NAME[input.dtype], dispatch.layout_of(input),
                                                    ("forward", "dX", "dW") if grad else ("forward",))


def _needs_grad(x, w, bias) -> bool:
    """Grad mode on and a tensor that requires a gradient (anything else among them: False)."""
    return torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) is True for t in (x, w, bias))


class DropInFunction(torch.autograd.Function):
    """y = conv2d(x, w, bias) by run (dispatch.forward_route's route for the call, kept: a
    _kernels.Kept, or None: dispatch.forward); its backward: dx by InputGradFunction
    (dispatch.input_grad), dw by WeightGradFunction (dispatch.weight_grad), dbias a torch sum over
    dy. x 4-D; stride, padding, dilation in any form torch takes (checked before). grads: the call
    signature's kept gradient routes, a one-item list (None until the first backward fills it with
    dispatch.grad_routes' pair, kept), or None (worked out per call).

    Differentiable to any order, like torch's conv2d: the gradients of dx and dw are again a
    forward, a dX and a dW of the same layer (dx = dX(dy, w): d/d(dy) is conv2d(g, w) and d/dw is
    dW(g, dy); dw = dW(x, dy): d/dx is dX(dy, G) and d/d(dy) is conv2d(x, G))."""

    @staticmethod
    def forward(ctx, x, w, bias, stride, padding, dilation, groups, run=None, grads=None):
        # x and w as given: the route converts only what its kernel does not read
        b = None if bias is None else bias.contiguous()
        if run is None:
            y = dispatch.forward(x, w, stride=stride, padding=padding, dilation=dilation, groups=groups, bias=b)
        else:
            y = run(x, w, None, b)
        ctx.save_for_backward(x, w)          # the inputs themselves: second derivatives flow back to them
        ctx.conf = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
        ctx.has_bias = bias is not None
        ctx.grads = grads
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        dx = dw = db = None
        # create_graph=True (grad mode on here): differentiable gradients; otherwise the kernels
        # straight away, without the cost of two more autograd nodes per backward
        graph = torch.is_grad_enabled()
        if graph:
            if ctx.needs_input_grad[0]:
                dx = InputGradFunction.apply(dy, w, tuple(x.shape[-2:]), ctx.conf)
            if ctx.needs_input_grad[1]:
                dw = WeightGradFunction.apply(x, dy, tuple(w.shape[-2:]), ctx.conf)
        else:
            # the routes run straight away: this runs on autograd's device thread, where every
            # microsecond of Python adds to the caller's wait
            kept = ctx.grads or [None]
            if kept[0] is None:
                kept[0] = tuple(map(Kept, dispatch.grad_routes(x.shape, w.shape, dy.shape, DTYPE_NAME[dy.dtype],
                                                               **ctx.conf)))
            dx_run, dw_run = kept[0]
            if ctx.needs_input_grad[0] and ctx.needs_input_grad[1] and dx_run.reads is dw_run.reads:
                dy = dy.contiguous(memory_format=dx_run.reads)      # converted once for both, where needed
            if ctx.needs_input_grad[0]:
                dx = dx_run(dy, w, None)
            if ctx.needs_input_grad[1]:
                dw = dw_run(x, dy, None)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = dy.sum(dim=(0, 2, 3))         # torch sums half and bfloat16 in float, rounds once
        return dx, dw, db, None, None, None, None, None, None


def _conv(x, w, conf):
    return DropInFunction.apply(x, w, None, conf["stride"], conf["padding"], conf["dilation"], conf["groups"])


class InputGradFunction(torch.autograd.Function):
    """dx = dispatch.input_grad(dy, w) for an input of input_size, as a differentiable function."""

    @staticmethod
    def forward(ctx, dy, w, input_size, conf):
        ctx.save_for_backward(dy, w)
        ctx.conf = conf
        return dispatch.input_grad(dy, w, input_size=input_size, **conf)

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
    """dw = dispatch.weight_grad(x, dy) for a mask of kernel_size, as a differentiable function."""

    @staticmethod
    def forward(ctx, x, dy, kernel_size, conf):
        ctx.save_for_backward(x, dy)
        ctx.conf = conf
        return dispatch.weight_grad(x, dy, kernel_size=kernel_size, **conf)

    @staticmethod
    def backward(ctx, g):
        x, dy = ctx.saved_tensors
        gx = gdy = None
        if ctx.needs_input_grad[0]:
            gx = InputGradFunction.apply(dy, g, tuple(x.shape[-2:]), ctx.conf)
        if ctx.needs_input_grad[1]:
            gdy = _conv(x, g, ctx.conf)
        return gx, gdy, None, None


# call signature (with the float32 precision, and whether cl.debug poisons outputs) ->
# (kernel_fallback_reason's answer, the route kept (_kernels.Kept), [its gradient routes]): a repeated
# call's one lookup, then, on a GPU, the route's one C call
_routes: dict = {}


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, *, precision=None):
    """torch.nn.functional.conv2d, on the course's kernels: the same arguments (ints or tuples,
    'same'/'valid', unbatched (C, H, W) inputs, bias None or (M,)), results, gradients and errors.
    A float32 forward runs in dispatch.fp32_precision(precision) (the module's docstring).
    Where nothing needs a gradient (grad mode off, or no input that requires one) the forward runs
    without an autograd node, as torch's does. What to do for a call signature (shapes, dtypes,
    devices, layout, arguments, precision) is worked out once and kept."""
    # 1.0 and True equal 1 and hash alike, but torch rejects them: only plain arguments key the cache
    plain = plain_arg(stride) and plain_arg(padding) and plain_arg(dilation) and plain_arg(groups)
    key = None                                      # none where an argument is not a tensor
    try:
        grad = torch.is_grad_enabled() and (input.requires_grad or weight.requires_grad
                                            or (bias is not None and bias.requires_grad))
        p = dispatch.fp32_precision(precision) if input.dtype == torch.float32 else "fp32"
        key = (input.shape, weight.shape, input.dtype, weight.dtype, input.device, weight.device,
               None if bias is None else (bias.shape, bias.dtype, bias.device),
               1 if input.is_contiguous() else 2 if input.is_contiguous(memory_format=torch.channels_last) else 0,
               p, stride, padding, dilation, groups, grad, runtime.debugging)
        reason, run, grads = _routes[key] if plain else _decide(input, weight, bias, stride, padding, dilation, groups,
                                                                grad, p)
    except (AttributeError, KeyError):              # not tensors, or a first call
        grad = _needs_grad(input, weight, bias)
        p = dispatch.fp32_precision(precision)
        reason, run, grads = _decide(input, weight, bias, stride, padding, dilation, groups, grad, p)
        if plain and key is not None:
            _routes[key] = (reason, run, grads)
    if reason is not None:
        # only what differs from the defaults, as keywords: torch's argument errors then read as
        # for F.conv2d(x, w[, b], name=value), the usual way to call it
        given = {k: v for k, v, d in zip(("stride", "padding", "dilation", "groups"),
                                         (stride, padding, dilation, groups), (1, 0, 1, 1))
                 if type(v) is not type(d) or v != d}
        return F.conv2d(input, weight, *([] if bias is None else [bias]), **given)
    x = input if input.dim() == 4 else input.unsqueeze(0)
    if grad:
        y = DropInFunction.apply(x, weight, bias, stride, padding, dilation, groups, run, grads)
    else:
        b = bias if bias is None or bias.is_contiguous() else bias.contiguous()
        y = run.run(x, weight, None, b)         # the kept route: one C call on a GPU after its second call
        if y is NotImplemented:
            y = run.slow(x, weight, None, b)
    return y if input.dim() == 4 else y.squeeze(0)


def _decide(input, weight, bias, stride, padding, dilation, groups, grad: bool, precision: str = "fp32") -> tuple:
    """(kernel_fallback_reason's answer, dispatch's route for the kernels or None, a place for the
    gradient routes: filled by the first backward, so a forward-only caller plans no dX or dW).
    precision: dispatch.fp32_precision's answer (a float32 forward's)."""
    reason = kernel_fallback_reason(input, weight, bias, stride, padding, dilation, groups, grad)
    if reason is not None:
        return reason, None, None
    x = input if input.dim() == 4 else input.unsqueeze(0)
    return None, Kept(dispatch.forward_route(x, weight, bias, stride=stride, padding=padding, dilation=dilation,
                                             groups=groups,
                                             precision=precision if x.dtype == torch.float32 else "fp32")), [None]


class Conv2d(torch.nn.Conv2d):
    """torch.nn.Conv2d (its constructor, parameters, initialisation, state dict and padding modes)
    with the forward pass, and so the gradients, of the drop-in conv2d; precision (a keyword): as
    conv2d's."""

    def __init__(self, *args, precision=None, **kwargs):
        super().__init__(*args, **kwargs)
        dispatch.fp32_precision(precision)          # a wrong value fails here, not at the first forward
        self.precision = precision

    def _conv_forward(self, input, weight, bias):
        # as nn.Conv2d._conv_forward, with conv2d in place of F.conv2d
        if self.padding_mode != "zeros":
            return conv2d(F.pad(input, self._reversed_padding_repeated_twice, mode=self.padding_mode),
                          weight, bias, self.stride, 0, self.dilation, self.groups, precision=self.precision)
        return conv2d(input, weight, bias, self.stride, self.padding, self.dilation, self.groups,
                      precision=self.precision)

    @classmethod
    def from_torch(cls, conv: torch.nn.Conv2d, *, precision=None) -> "Conv2d":
        """A Conv2d with the same configuration as an nn.Conv2d and a copy of its parameters."""
        m = cls(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding, conv.dilation,
                conv.groups, conv.bias is not None, conv.padding_mode, device=conv.weight.device,
                dtype=conv.weight.dtype, precision=precision)
        m.load_state_dict(conv.state_dict())
        return m
