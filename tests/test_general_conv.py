"""Chapter 9's general kernels (kernels/09_general/, convlab.ops.general) on awkward shapes, and the
drop-in conv2d / Conv2d's contract with torch: the same results, gradients and errors.

The launchers write into outputs poisoned with NaN first, so a value never written fails the check.
References: torch in float64 on the same values. Tolerances as in test_conformance.py.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import convlab as cl
from convlab.ops import depthwise, dispatch, dropin, general, shapes
from convlab.ops.fp16 import check_fp16

DTYPES = [torch.float32, torch.float16]

# (B, C, H, W, M, Kh, Kw, stride, padding, dilation, groups): odd sizes, C=1, B=1, groups,
# depthwise (with a channel multiplier), dilation 2-3, stride (2, 1), 3x5 masks, 'same' with an even mask
SHAPES = [
    (2, 6, 11, 13, 4, 3, 5, (2, 1), (1, 2), 1, 2),
    (1, 1, 9, 7, 3, 3, 3, 1, 1, 1, 1),
    (3, 5, 10, 9, 5, 3, 3, 1, 1, 1, 5),                # depthwise
    (2, 4, 13, 11, 8, 7, 7, 2, 3, 1, 4),               # depthwise x2, 7x7, stride 2
    (2, 6, 15, 14, 9, 3, 2, (1, 2), (3, 0), (3, 2), 3),
    (1, 3, 17, 12, 2, 5, 3, (3, 2), 0, (2, 3), 1),
    (2, 4, 9, 10, 6, 2, 4, 1, "same", (1, 3), 2),      # 'same', even masks: one more row/column at the end
    (2, 8, 7, 9, 8, 1, 1, 1, 0, 1, 1),                 # 1x1
]


def _ids(s):
    B, C, H, W, M, Kh, Kw, st, pad, dil, g = s
    return f"B{B}C{C}M{M}-{H}x{W}-k{Kh}x{Kw}-s{st}-p{pad}-d{dil}-g{g}".replace(" ", "")


def _check(out, ref, dtype, n, name):
    if dtype == torch.float16:
        return check_fp16(out, ref, C=max(n, 1), K=1, accumulate="float", rounded_inputs=True, name=name)
    return cl.check(out, ref, name=name)


def _tensors(shape, dtype):
    B, C, H, W, M, Kh, Kw, st, pad, dil, g = shape
    x = cl.randn(B, C, H, W, dtype=dtype)
    w = cl.randn(M, C // g, Kh, Kw, dtype=dtype)
    b = cl.randn(M, dtype=dtype)
    return x, w, b, dict(stride=st, padding=pad, dilation=dil, groups=g)


@pytest.mark.filterwarnings("ignore:Using padding='same'")     # torch's note about its own reference call
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16"])
@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
def test_launchers_on_awkward_shapes(shape, dtype):
    x, w, b, kw = _tensors(shape, dtype)
    xd, wd, bd = (t.double().cpu().requires_grad_() for t in (x, w, b))
    ref = F.conv2d(xd, wd, bd, **kw)
    M, Cg, Kh, Kw = w.shape

    y = general.conv2d_general(x, w, cl.empty(*ref.shape, dtype=dtype), bias=b, **kw)
    _check(y, ref.detach(), dtype, Cg * Kh * Kw + 1, "y")

    dy = cl.randn(*ref.shape, dtype=dtype)
    rdx, rdw = torch.autograd.grad(ref, (xd, wd), dy.double().cpu())
    dx = general.conv2d_general_dx(dy, w, cl.empty(*x.shape, dtype=dtype), input_size=x.shape[-2:], **kw)
    _check(dx, rdx, dtype, M // kw["groups"] * Kh * Kw, "dx")
    pixels = dy.numel() // M
    for splits in (None, 3):     # the default slices, and 3 slices added by the second kernel
        dw = general.conv2d_general_dw(x, dy, cl.empty(*w.shape, dtype=dtype), kernel_size=(Kh, Kw),
                                       splits=splits, **kw)
        _check(dw, rdw, dtype, pixels, f"dw (splits={splits})")


DEPTHWISE = [s for s in SHAPES if s[10] == s[1]] + [
    (2, 3, 37, 45, 3, 5, 5, (2, 1), (2, 1), (1, 2), 3),     # tiles that cross the plane's edges
    # W a multiple of 8: 16-byte loads of the tile (fp32 and fp16), from left of the tile's first column
    (1, 3, 9, 16, 3, 3, 3, 1, 1, 1, 3),
    (2, 2, 11, 24, 2, 7, 7, 1, 3, 1, 2),
    (1, 1, 10, 40, 1, 3, 3, 2, 1, 1, 1),                   # C=1, stride 2
    (2, 2, 8, 32, 4, 3, 5, (1, 2), (2, 4), (1, 2), 2),     # a multiplier, dilation, padding past a vector
]


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16"])
@pytest.mark.parametrize("shape", DEPTHWISE, ids=_ids)
def test_depthwise_kernel(shape, dtype):
    x, w, b, kw = _tensors(shape, dtype)
    ref = F.conv2d(x.double().cpu(), w.double().cpu(), b.double().cpu(), **kw)
    g = shapes.layer(x.shape, w.shape, **kw)
    assert depthwise.depthwise_applies(g)
    assert depthwise.depthwise_vec(g, x) == (16 // x.element_size() if g.W % 8 == 0 else 1)
    n = w[0].numel() + 1
    y = depthwise.conv2d_depthwise(x, w, cl.empty(*ref.shape, dtype=dtype), bias=b, **kw)
    _check(y, ref, dtype, n, "y")
    # other blocks (blockDim, no new compile): many per plane, strips cut by the bottom edge, and
    # 4 planes a block (the last block's partly past the planes); one plane a block
    y = depthwise.conv2d_depthwise(x, w, cl.empty(*ref.shape, dtype=dtype), bias=b, BX=4, BY=2, BZ=4, **kw)
    _check(y, ref, dtype, n, "y (BX=4, BY=2, BZ=4)")
    y = depthwise.conv2d_depthwise(x, w, cl.empty(*ref.shape, dtype=dtype), bias=b, BZ=1, **kw)
    _check(y, ref, dtype, n, "y (BZ=1)")
    y = depthwise.conv2d_depthwise(x, w, cl.empty(*ref.shape, dtype=dtype), bias=b, BX=5, BY=3, vec=1, **kw)
    _check(y, ref, dtype, n, "y (BX=5, BY=3, one element per load)")
    y = depthwise.conv2d_depthwise(x, w, cl.empty(*ref.shape, dtype=dtype), **kw)
    _check(y, F.conv2d(x.double().cpu(), w.double().cpu(), None, **kw), dtype, n, "y (no bias)")


def test_implementation_records():
    """Each Impl runs through its record, and says which of the course's workloads it takes."""
    from convlab.measuring import workloads

    records = general.IMPLEMENTATIONS + depthwise.IMPLEMENTATIONS
    ops = {impl.op for impl in records}
    assert ops == {"conv2d", "conv2d_fp16", "conv2d_dx", "conv2d_dw"}
    lenet_c1, resnet = workloads.get("lenet_c1"), workloads.get("resnet")
    for impl in records:
        assert impl.applies(resnet) == ("depthwise" not in impl.key)
        # C=1: a depthwise layer too (NHWC and dX as a forward: M = C too)
        assert impl.applies(lenet_c1) == (impl.key not in ("depthwise_nhwc", "depthwise_nhwc_fp16", "depthwise_dx"))
        assert impl.config(resnet) == {}
    x, w = cl.randn(2, 1, 9, 9), cl.randn(3, 1, 3, 3)
    for impl in (general.GENERAL, depthwise.DEPTHWISE):
        cl.check(impl(x, w, padding=1), F.conv2d(x, w, padding=1), name=impl.name)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16"])
@pytest.mark.parametrize("case", [
    ((2, 5, 10, 9), (5, 1, 3, 3), dict(padding=1, groups=5), True),
    ((1, 3, 12, 11), (3, 1, 3, 5), dict(padding=(2, 4), dilation=(1, 2), groups=3), True),
    ((2, 4, 9, 9), (4, 1, 3, 3), dict(padding="same", dilation=2, groups=4), True),
    ((2, 4, 9, 9), (4, 1, 2, 2), dict(padding="same", groups=4), False),    # 'same', even mask: asymmetric
    ((2, 4, 9, 9), (8, 1, 3, 3), dict(padding=1, groups=4), False),         # a channel multiplier
    ((2, 4, 9, 9), (4, 1, 3, 3), dict(padding=1, stride=2, groups=4), False),
    ((2, 4, 9, 9), (4, 1, 3, 3), dict(padding=3, groups=4), False),         # padding past the mask's span
], ids=lambda c: str(c) if isinstance(c, tuple) else None)
def test_input_grad_of_depthwise_layers(case, dtype):
    """dx of a stride-1 depthwise layer runs the depthwise forward on the flipped mask; the rest the gather."""
    x_shape, w_shape, kw, flipped = case
    g = shapes.layer(x_shape, w_shape, **kw)
    assert (depthwise.depthwise_dx_padding(g) is not None) == flipped
    w = cl.randn(*w_shape, dtype=dtype)
    dy = cl.randn(x_shape[0], w_shape[0], g.Ho, g.Wo, dtype=dtype)
    dx = dispatch.input_grad(dy, w, cl.empty(*x_shape, dtype=dtype), input_size=x_shape[-2:], **kw)
    x64 = torch.randn(x_shape, dtype=torch.float64, requires_grad=True)
    (ref,) = torch.autograd.grad(F.conv2d(x64, w.double().cpu(), **kw), x64, dy.double().cpu())
    _check(dx, ref, dtype, w_shape[0] // kw["groups"] * w[0].numel(), "dx")


def test_forward_dispatch():
    """The drop-in's forward takes the depthwise kernel for groups == C, the general one otherwise."""
    assert depthwise.depthwise_applies(shapes.layer((2, 8, 9, 9), (16, 1, 7, 7), padding=3, groups=8))
    assert not depthwise.depthwise_applies(shapes.layer((2, 8, 9, 9), (8, 2, 3, 3), groups=4))
    assert not depthwise.depthwise_applies(shapes.layer((2, 8, 19, 19), (8, 1, 9, 9), groups=8))   # 81 taps


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16"])
def test_conv2d_autograd_unbatched_and_without_bias(dtype):
    x, w, _, kw = _tensors(SHAPES[0], dtype)
    x = x[0].clone().requires_grad_()             # (C, H, W)
    w.requires_grad_()
    y = dropin.conv2d(x, w, None, **kw)
    xd, wd = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    ref = F.conv2d(xd, wd, None, **kw)
    assert y.shape == ref.shape and y.dtype == dtype
    if dtype == torch.float16:
        dispatch.check_fp16_forward(y, ref, x.shape, w.shape, **kw)
    else:
        _check(y, ref.detach(), dtype, w[0].numel(), "y")
    dy = cl.randn(*ref.shape, dtype=dtype)
    gx, gw = torch.autograd.grad(y, (x, w), dy)
    rx, rw = torch.autograd.grad(ref, (xd, wd), dy.double())
    _check(gx, rx, dtype, w.shape[0] // kw["groups"] * w[0, 0].numel(), "dx")
    _check(gw, rw, dtype, dy[0].numel(), "dw")


@pytest.mark.parametrize("shape", [SHAPES[0], SHAPES[3]], ids=_ids)
def test_second_derivatives(shape):
    """Double backward (gradients of dx, dw and dbias with respect to x, w, bias and dy), as torch's."""
    x, w, b, kw = _tensors(shape, torch.float32)
    dy = cl.randn(*F.conv2d(x, w, **kw).shape)
    vx, vw, vb = cl.randn(*x.shape), cl.randn(*w.shape), cl.randn(*b.shape)

    def second(conv, dtype):
        leaves = [t.detach().to(dtype).requires_grad_() for t in (x, w, b, dy)]
        xx, ww, bb, dd = leaves
        gx, gw, gb = torch.autograd.grad(conv(xx, ww, bb, **kw), (xx, ww, bb), dd, create_graph=True)
        loss = (gx * vx.to(dtype)).sum() + (gw * vw.to(dtype)).sum() + (gb * vb.to(dtype)).sum()
        return torch.autograd.grad(loss, leaves, allow_unused=True)

    ours, ref = second(dropin.conv2d, torch.float32), second(F.conv2d, torch.float64)
    for name, o, r in zip(("d/dx", "d/dw", "d/dbias", "d/ddy"), ours, ref):
        if r is None:
            assert o is None or not o.any(), name      # bias enters the gradients only through dy
        else:
            cl.check(o, r, name=name)


def test_conv2d_module_is_nn_conv2d():
    """Conv2d: nn.Conv2d's parameters and state dict; forward and gradients as nn.Conv2d's,
    padding modes included."""
    torch.manual_seed(3)
    for mode in ("zeros", "reflect", "circular"):
        theirs = torch.nn.Conv2d(4, 6, (3, 2), stride=(1, 2), padding=(1, 1), dilation=(2, 1), groups=2,
                                 padding_mode=mode).to(cl.device().torch_device)
        ours = dropin.Conv2d.from_torch(theirs)
        assert isinstance(ours, torch.nn.Conv2d) and ours.state_dict().keys() == theirs.state_dict().keys()
        x = cl.randn(2, 4, 9, 8).requires_grad_()
        y, ref = ours(x), theirs(x)
        cl.check(y, ref, name=f"y ({mode})")
        dy = cl.randn(*y.shape)
        for a, r, name in zip(torch.autograd.grad(y, [x, *ours.parameters()], dy),
                              torch.autograd.grad(ref, [x, *theirs.parameters()], dy), ("dx", "dw", "dbias")):
            cl.check(a, r, name=f"{name} ({mode})")


def test_inputs_the_kernels_do_not_take_get_torchs_result():
    """float64, mixed with nothing else, and a zero-size batch: torch computes, bit for bit."""
    x, w, b = cl.randn(2, 4, 7, 7, dtype=torch.float64), cl.randn(6, 2, 3, 3, dtype=torch.float64), None
    assert dropin.kernel_fallback_reason(x, w, b, groups=2) is not None
    assert torch.equal(dropin.conv2d(x, w, b, groups=2), F.conv2d(x, w, b, groups=2))
    x0, w0 = cl.randn(0, 4, 7, 7), cl.randn(6, 4, 3, 3)
    y0 = dropin.conv2d(x0, w0, padding=1)
    assert y0.shape == F.conv2d(x0, w0, padding=1).shape == (0, 6, 7, 7)


def _torch_error(fn, *a, **kw):
    try:
        fn(*a, **kw)
    except Exception as e:
        return type(e), str(e)
    return None


@pytest.mark.parametrize("case", [
    dict(stride=0), dict(padding=-1), dict(padding=(1, 2, 3)), dict(dilation=0), dict(groups=0),
    dict(groups=3), dict(padding="foo"), dict(padding="same", stride=2), dict(stride=(1, 2, 3)),
    dict(padding=1.5), dict(w_shape=(5, 2, 3, 3), groups=2), dict(w_shape=(6, 4, 9, 3)),
    dict(bias_shape=(5,)), dict(bias_shape=(6, 1)), dict(x_shape=(1, 2, 4, 7, 7)), dict(x_shape=(7, 7)),
    dict(w_dtype=torch.float16), dict(bias_dtype=torch.float64), dict(bias_list=True),
], ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_invalid_arguments_raise_torchs_error(case):
    case = dict(case)
    x = cl.randn(*case.pop("x_shape", (2, 4, 7, 7)))
    w = cl.randn(*case.pop("w_shape", (6, 4, 3, 3)), dtype=case.pop("w_dtype", torch.float32))
    b = cl.randn(*case.pop("bias_shape", (6,)), dtype=case.pop("bias_dtype", torch.float32))
    if case.pop("bias_list", False):             # not a tensor: the call is keyed by nothing
        b = b.tolist()
    want = _torch_error(F.conv2d, x, w, b, **case)
    assert want is not None, f"torch takes {case}: not an invalid case"
    assert _torch_error(dropin.conv2d, x, w, b, **case) == want


def test_equal_arguments_of_other_types_get_torchs_answer():
    """padding=1 runs; 1.0 and (1.0, 1) equal it and hash alike, but torch rejects them."""
    x, w = cl.randn(2, 4, 7, 7), cl.randn(6, 4, 3, 3)
    cl.check(dropin.conv2d(x, w, padding=1), F.conv2d(x, w, padding=1))
    for bad in (1.0, (1.0, 1)):
        want = _torch_error(F.conv2d, x, w, padding=bad)
        assert want is not None and _torch_error(dropin.conv2d, x, w, padding=bad) == want


def test_launchers_reject_what_they_cannot_take():
    x, w = cl.randn(2, 4, 7, 7), cl.randn(6, 4, 3, 3)
    with pytest.raises(TypeError, match="float32 or float16"):
        general.conv2d_general(x.double(), w.double())
    with pytest.raises(TypeError, match="convert with"):
        general.conv2d_general(x, w.half())
    with pytest.raises(ValueError, match="contiguous"):
        general.conv2d_general(x.transpose(2, 3), w)
    with pytest.raises(ValueError, match="dy has shape"):
        general.conv2d_general_dx(cl.randn(2, 6, 5, 5), w, input_size=(9, 9))
    with pytest.raises(RuntimeError, match="rejects"):
        general.conv2d_general(x, w, stride=0)


# ---- launch limits at full size (meta tensors: nothing runs), races ----------------------------------

FULL = [   # (B, C, H, W, M, Kh, Kw, stride, padding, dilation, groups)
    (32, 144, 56, 56, 144, 3, 3, 1, 1, 1, 144),          # MobileNetV2 depthwise
    (32, 512, 14, 14, 512, 7, 7, 1, 3, 1, 512),          # ConvNeXt depthwise
    (70000, 1, 8, 8, 1, 3, 3, 1, 1, 1, 1),               # more planes than gridDim.z takes at once
    (32, 256, 28, 28, 256, 3, 3, 1, 1, 1, 32),           # ResNeXt grouped
    (16, 256, 28, 28, 256, 3, 3, 1, 4, 4, 1),            # dilated
    (32, 3, 224, 224, 64, 7, 7, 2, 3, 1, 1),             # a stem
    (9, 64, 2048, 2048, 64, 3, 3, 1, 1, 1, 1),           # 2.4e9 outputs, over 2^31 (64-bit flat indices)
]


@pytest.mark.parametrize("shape", FULL, ids=_ids)
def test_launchers_respect_the_launch_limits(record_launches, shape):
    from convlab.gpu._args import check_launch

    B, C, H, W, M, Kh, Kw, st, pad, dil, g = shape
    kw = dict(stride=st, padding=pad, dilation=dil, groups=g)
    x, w = torch.empty(B, C, H, W, device="meta"), torch.empty(M, C // g, Kh, Kw, device="meta")
    geo = shapes.layer(x.shape, w.shape, **kw)
    dy = torch.empty(B, M, geo.Ho, geo.Wo, device="meta")
    launches = record_launches()
    calls = [lambda: general.conv2d_general(x, w, **kw), lambda: dispatch.forward(x, w, **kw),
             lambda: general.conv2d_general_dx(dy, w, input_size=(H, W), **kw),
             lambda: general.conv2d_general_dw(x, dy, kernel_size=(Kh, Kw), **kw)]
    for call in calls:
        launches.clear()
        call()
        assert launches
        for kname, grid, block, shared, _ in launches:
            check_launch(kname, grid, block, shared)       # raises cl.LaunchError past a limit
    if depthwise.depthwise_applies(geo):
        launches.clear()
        depthwise.conv2d_depthwise(x, w, **kw)
        blocks = [(grid[2], block[2]) for _, grid, block, _, _ in launches]   # gridDim.z <= 65,535 per launch
        covered = sum(gz * bz for gz, bz in blocks)
        assert B * M <= covered < B * M + blocks[-1][1], f"{covered} plane slots for {B * M} planes"


@pytest.mark.emu_only
@pytest.mark.parametrize("what", ["dw", "depthwise"])
def test_no_race_under_other_thread_orders(what):
    """The kernels with barriers give the same bits whatever order a block's threads run in."""
    x, w, b, kw = _tensors(SHAPES[2], torch.float32)
    if what == "dw":
        dy = cl.randn(*general.conv2d_general(x, w, **kw).shape)
        out = cl.empty(*w.shape)
        launch = lambda: general.conv2d_general_dw(x, dy, out, kernel_size=w.shape[-2:], splits=2, **kw)  # noqa: E731
    else:
        out = cl.empty(*F.conv2d(x, w, **kw).shape)
        launch = lambda: depthwise.conv2d_depthwise(x, w, out, bias=b, BX=4, BY=2, BZ=2, **kw)  # noqa: E731
    problem = cl.find_race(launch, out)
    assert problem is None, problem


def test_chapter_9_launchers_keep_their_plan(monkeypatch):
    """A repeated call with the same signature reuses the launch worked out the first time (plain
    arguments); a list argument, whose value alone torch reads differently, is never kept."""
    built = []
    for module, name in ((general, "_forward_plan"), (general, "_dx_plan"), (depthwise, "_nchw_plan")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, real=real, name=name: built.append(name) or real(*a))
    x, w, wd = cl.randn(2, 4, 9, 8), cl.randn(6, 2, 3, 3), cl.randn(4, 1, 3, 3)
    dy = cl.randn(2, 6, 9, 8)
    for _ in range(3):
        general.conv2d_general(x, w, padding=1, groups=2)
        general.conv2d_general_dx(dy, w, padding=1, groups=2, input_size=(9, 8))
        depthwise.conv2d_depthwise(x, wd, padding=(1, 1), groups=4)
    assert built == ["_forward_plan", "_dx_plan", "_nchw_plan"], built
    general.conv2d_general(x, w, padding=[1, 1], groups=2)
    general.conv2d_general(x, w, padding=[1, 1], groups=2)
    assert built.count("_forward_plan") == 3
