"""Chapter 8: the backward kernels against the fp64 reference, the autograd Function against torch,
and a short LeNet training run, on the active backend.

Gradients are checked against cl.ref.conv2d_input_grad / conv2d_weight_grad (torch.nn.grad in
fp64). Outputs are poisoned with NaN first (cl.empty; the kernels with atomics zero them, the
partial sums of the reductions are NaN-poisoned on the emulator), inputs are fresh random numbers,
shapes are awkward: B=1, C=1, odd and even K, sizes no multiple of a tile, stride 2 and 3 with
and without padding.
"""
import gzip
import struct

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import convlab as cl
from convlab.ops import backprop as bp
from convlab.ops import dropin
from convlab.programs import lenet

# (B, C, M, H, W, K, stride, padding)
SHAPES = [
    dict(B=1, C=1, M=1, H=17, W=19, K=3),                       # B=1, C=1, M=1
    dict(B=2, C=3, M=5, H=19, W=21, K=5, padding=2),                # "same" padding, odd sizes
    dict(B=2, C=2, M=3, H=23, W=18, K=7, padding=1),                # K=7, C=2 (two channels, two maps per load)
    dict(B=3, C=4, M=6, H=15, W=16, K=4),                       # even K
    dict(B=2, C=2, M=3, H=21, W=20, K=3, stride=2, padding=1),      # stride 2
    dict(B=1, C=3, M=2, H=26, W=17, K=5, stride=3),             # stride 3, no padding
    dict(B=2, C=1, M=4, H=30, W=27, K=7),                       # lenet_c1's character
    dict(B=1, C=33, M=6, H=9, W=10, K=3, padding=1),                # many channels, C no multiple of 8
]


def _id(d):
    return " ".join(f"{k}={v}" for k, v in d.items())


def _unpack(shape):
    B, C, M, H, W, K = (shape[k] for k in "B C M H W K".split())
    return B, C, M, H, W, K, shape.get("stride", 1), shape.get("padding", 0)


def _case(shape):
    B, C, M, H, W, K, s, p = _unpack(shape)
    x, w = cl.randn(B, C, H, W), cl.randn(M, C, K, K)
    dy = cl.randn(B, M, cl.out_size(H, K, s, p), cl.out_size(W, K, s, p))
    assert not torch.all(dy == 0)
    return x, w, dy, s, p


def _dx(fn, shape, **tunables):
    x, w, dy, s, p = _case(shape)
    dx = cl.empty(*x.shape)                         # NaN until written
    out = fn(dy, w, dx, stride=s, padding=p, input_size=x.shape[2:], **tunables)
    assert out is dx
    cl.check(dx, cl.ref.conv2d_input_grad(x.shape, w, dy, stride=s, padding=p), name=f"dx {fn.__name__} {tunables}")


def _dw(fn, shape, **tunables):
    x, w, dy, s, p = _case(shape)
    dw = cl.empty(*w.shape)
    out = fn(x, dy, dw, stride=s, padding=p, kernel_size=w.shape[2], **tunables)
    assert out is dw
    cl.check(dw, cl.ref.conv2d_weight_grad(x, w.shape, dy, stride=s, padding=p), name=f"dw {fn.__name__} {tunables}")


# ---- dE/dX ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", SHAPES, ids=_id)
def test_input_grad_scatter(shape):
    _dx(bp.conv2d_input_grad_scatter, shape)


@pytest.mark.parametrize("shape", SHAPES, ids=_id)
def test_input_grad_gather(shape):
    _dx(bp.conv2d_input_grad_gather, shape)


@pytest.mark.parametrize("shape, tunables", [
    (SHAPES[1], dict(CT=4, MV=1, ROWS=3, BLOCK=64, mchunk=2)),   # three mask chunks (5 maps, 2 at a time)
    (SHAPES[4], dict(CT=1, MV=4, ROWS=5, BLOCK=32, mchunk=4)),   # 16-byte loads of 4 maps, stride 2
    (SHAPES[6], dict(CT=1, MV=2, ROWS=16)),                      # more rows than the image has per strip
    (SHAPES[5], dict(CT=8, MV=1, ROWS=2, mchunk=1)),             # C=3 in a group of 8, one map per chunk
], ids=["chunks", "MV=4 stride 2", "MV=2 ROWS=16", "CT=8 stride 3"])
def test_input_grad_gather_tunables(shape, tunables):
    _dx(bp.conv2d_input_grad_gather, shape, **tunables)


@pytest.mark.parametrize("shape", [s for s in SHAPES if s.get("stride", 1) == 1], ids=_id)
def test_input_grad_forward_of_flipped_mask(shape):
    _dx(bp.conv2d_input_grad_forward, shape)


def test_flip_transpose():
    w = cl.randn(3, 2, 5, 5)
    cl.check(bp.flip_transpose(w), w.cpu().double().flip(2, 3).transpose(0, 1))


# ---- dE/dW ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", SHAPES, ids=_id)
def test_weight_grad_atomic(shape):
    _dw(bp.conv2d_weight_grad_atomic, shape)


@pytest.mark.parametrize("shape", SHAPES[:7], ids=_id)
@pytest.mark.parametrize("final", ["partials", "atomic"])
def test_weight_grad_direct(shape, final):
    _dw(bp.conv2d_weight_grad_direct, shape, final=final)


@pytest.mark.parametrize("shape", SHAPES, ids=_id)
@pytest.mark.parametrize("final", ["partials", "atomic"])
def test_weight_grad_gemm(shape, final):
    _dw(bp.conv2d_weight_grad_gemm, shape, final=final)


@pytest.mark.parametrize("fn, tunables", [
    (bp.conv2d_weight_grad_direct, dict(MT=3, ROWS=5, BLOCK=64, chunks=3)),     # maps 5 = 3 + 2 (a ragged group)
    (bp.conv2d_weight_grad_direct, dict(MT=1, ROWS=1, BLOCK=32, chunks=1)),     # one block per (map, channel)
    (bp.conv2d_weight_grad_gemm, dict(BM=32, BN=64, BK=8, TM=4, TN=4, splits=3)),
    (bp.conv2d_weight_grad_gemm, dict(BM=16, BN=32, BK=16, TM=4, TN=4, splits=1000)),  # more splits than steps
], ids=["direct MT=3", "direct MT=1 one chunk", "gemm 32x64", "gemm 16x32 many splits"])
def test_weight_grad_tunables(fn, tunables):
    _dw(fn, SHAPES[1], **tunables)


def test_weight_grad_second_pass_is_deterministic():
    """The two-pass reductions add in a fixed order: the same bits on every run."""
    x, w, dy, s, p = _case(SHAPES[1])
    for fn in (bp.conv2d_weight_grad_direct, bp.conv2d_weight_grad_gemm):
        a = fn(x, dy, stride=s, padding=p).clone()
        b = fn(x, dy, stride=s, padding=p)
        assert torch.equal(a, b), fn.__name__


def test_reduce_partials():
    parts, n = 37, 70
    partial = cl.randn(parts * n)
    out = cl.empty(n)
    bp.reduce_partials(partial, out, parts, n, PARTS_Y=8)
    cl.check(out, partial.cpu().double().view(parts, n).sum(0))


# ---- the picks ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["lenet_c1", "lenet_c3", "fa17", "days100", "resnet"])
def test_best_at_the_small_twins(name):
    from convlab.measuring import workloads
    wl = workloads.get(name).small()
    shape = dict(B=wl.B, C=wl.C, M=wl.M, H=wl.H, W=wl.W, K=wl.K, stride=wl.stride, padding=wl.padding)
    _dx(bp.conv2d_input_grad_best, shape)
    _dw(bp.conv2d_weight_grad_best, shape)


def test_pick_rules_for_the_course_layers():
    from convlab.measuring import workloads
    from convlab.measuring.workloads import Workload
    dx = {wl.name: bp.pick_input_grad(wl) for wl in workloads.WORKLOADS_2D}
    dw = {wl.name: bp.pick_weight_grad(wl) for wl in workloads.WORKLOADS_2D}
    for name in ("lenet_c1", "lenet_c3", "fa17"):
        assert dx[name] is bp.DX_GATHER, name
    for name in ("resnet", "days100"):
        assert dx[name] is bp.DX_FORWARD, name
    for name in ("lenet_c1", "fa17"):
        assert dw[name] is bp.DW_DIRECT, name
    for name in ("lenet_c3", "resnet", "days100"):
        assert dw[name] is bp.DW_GEMM, name
    # stride 2 never goes to the forward kernel
    assert bp.pick_input_grad(Workload("", B=1, C=64, M=64, H=20, W=20, K=3, stride=2, padding=1)) is bp.DX_GATHER
    assert {i.op for i in bp.IMPLEMENTATIONS} == {"conv2d_dx", "conv2d_dw"}


@pytest.mark.parametrize("impl", bp.IMPLEMENTATIONS, ids=lambda i: i.name)
def test_implementations_with_their_config(impl):
    """Each implementation by its one name, with the tunables its config gives, stride 2 included."""
    from convlab.measuring.workloads import Workload
    shape = dict(B=2, C=3, M=5, H=13, W=12, K=3, stride=1 if impl is bp.DX_FORWARD else 2, padding=1)
    x, w, dy, s, p = _case(shape)
    tunables = impl.config(Workload("", **shape))
    if impl.op == "conv2d_dx":
        got = impl(dy, w, stride=s, padding=p, input_size=(13, 12), **tunables)
        cl.check(got, cl.ref.conv2d_input_grad(x.shape, w, dy, stride=s, padding=p), name=impl.name)
    else:
        got = impl(x, dy, stride=s, padding=p, kernel_size=3, **tunables)
        cl.check(got, cl.ref.conv2d_weight_grad(x, w.shape, dy, stride=s, padding=p), name=impl.name)


def test_sizes_follow_from_dy_at_stride_1_only():
    x, w, dy, s, p = _case(SHAPES[1])
    cl.check(bp.conv2d_input_grad_best(dy, w, padding=p), cl.ref.conv2d_input_grad(x.shape, w, dy, padding=p))
    cl.check(bp.conv2d_weight_grad_best(x, dy, padding=p), cl.ref.conv2d_weight_grad(x, w.shape, dy, padding=p))
    x, w, dy, s, p = _case(SHAPES[4])
    with pytest.raises(ValueError, match="input_size"):
        bp.conv2d_input_grad_gather(dy, w, stride=s, padding=p)
    with pytest.raises(ValueError, match="kernel_size"):
        bp.conv2d_weight_grad_gemm(x, dy, stride=s, padding=p)


def test_refusals():
    x, w = cl.randn(1, 2, 9, 9), cl.randn(3, 2, 3, 3)
    dy = cl.randn(1, 3, 7, 7)
    with pytest.raises(ValueError, match="dy has shape"):
        bp.conv2d_input_grad_gather(dy, w, padding=1, input_size=(9, 9))
    with pytest.raises(ValueError, match="stride 1"):
        bp.conv2d_input_grad_forward(cl.randn(1, 3, 4, 4), w, stride=2, input_size=(9, 9))
    with pytest.raises(TypeError, match="float32"):
        bp.conv2d_weight_grad_direct(x.double(), dy)
    with pytest.raises(ValueError, match="final"):
        bp.conv2d_weight_grad_gemm(x, dy, final="tree")
    with pytest.raises(ValueError, match="does not split"):
        bp.conv2d_weight_grad_gemm(x, dy, TM=6)
    with pytest.raises(ValueError, match="mchunk"):
        bp.conv2d_input_grad_gather(dy, w, MV=2, mchunk=3)


# ---- launch limits at the course's full sizes (meta tensors: nothing runs) ------------------------

FULL = {"lenet_c1": (10000, 1, 4, 86, 86, 7, 1, 0), "lenet_c3": (10000, 4, 16, 40, 40, 7, 1, 0),
        "fa17": (10000, 1, 50, 28, 28, 5, 1, 0), "days100": (1, 32, 128, 256, 256, 3, 1, 1),
        "resnet": (64, 64, 64, 56, 56, 3, 1, 1), "strided": (64, 64, 128, 57, 57, 3, 2, 1)}


@pytest.mark.parametrize("name", list(FULL))
def test_launchers_respect_the_launch_limits(record_launches, name):
    from convlab.gpu._args import check_launch

    launches = record_launches()
    B, C, M, H, W, K, s, p = FULL[name]
    Ho, Wo = cl.out_size(H, K, s, p), cl.out_size(W, K, s, p)
    x = torch.empty(B, C, H, W, device="meta")
    w = torch.empty(M, C, K, K, device="meta")
    dy = torch.empty(B, M, Ho, Wo, device="meta")
    calls = [lambda: bp.conv2d_input_grad_scatter(dy, w, stride=s, padding=p, input_size=(H, W)),
             lambda: bp.conv2d_input_grad_gather(dy, w, stride=s, padding=p, input_size=(H, W)),
             lambda: bp.conv2d_input_grad_best(dy, w, stride=s, padding=p, input_size=(H, W)),
             lambda: bp.conv2d_weight_grad_atomic(x, dy, stride=s, padding=p, kernel_size=K),
             lambda: bp.conv2d_weight_grad_direct(x, dy, stride=s, padding=p, kernel_size=K),
             lambda: bp.conv2d_weight_grad_gemm(x, dy, stride=s, padding=p, kernel_size=K),
             lambda: bp.conv2d_weight_grad_best(x, dy, stride=s, padding=p, kernel_size=K)]
    for call in calls:
        launches.clear()
        call()
        assert launches
        for kname, grid, block, shared, _ in launches:
            check_launch(kname, grid, block, shared)       # raises cl.LaunchError past a limit


# ---- races: kernels with barriers give the same bits whatever order a block's threads run in -------

@pytest.mark.emu_only
@pytest.mark.parametrize("what", ["gather", "direct", "gemm"])
def test_no_race_under_other_thread_orders(what):
    x, w, dy, s, p = _case(SHAPES[1])
    if what == "gather":
        out = cl.empty(*x.shape)
        launch = lambda: bp.conv2d_input_grad_gather(dy, w, out, padding=p, BLOCK=64, mchunk=2)  # noqa: E731
        ref = cl.ref.conv2d_input_grad(x.shape, w, dy, padding=p)
    else:
        out = cl.empty(*w.shape)
        fn = bp.conv2d_weight_grad_direct if what == "direct" else bp.conv2d_weight_grad_gemm
        launch = lambda: fn(x, dy, out, padding=p)  # noqa: E731
        ref = cl.ref.conv2d_weight_grad(x, w.shape, dy, padding=p)
    problem = cl.find_race(launch, out)
    assert problem is None, problem
    cl.check(out, ref)


# ---- autograd --------------------------------------------------------------------------------------

AUTOGRAD_SHAPES = [SHAPES[0], SHAPES[2], SHAPES[4], SHAPES[6], SHAPES[7]]


@pytest.mark.parametrize("shape", AUTOGRAD_SHAPES, ids=_id)
@pytest.mark.parametrize("bias", [False, True], ids=["no bias", "bias"])
def test_function_matches_fp64_autograd(shape, bias):
    """Conv2dFunction's y, dx, dw (and db) against torch autograd in fp64, with cl.check's float32
    tolerance; torch's own float32 conv must meet the same tolerance (the yardstick)."""
    B, C, M, H, W, K, s, p = _unpack(shape)
    x, w = cl.randn(B, C, H, W), cl.randn(M, C, K, K)
    b = cl.randn(M) if bias else None
    leaves = [t.clone().requires_grad_() for t in (x, w) + ((b,) if bias else ())]
    y = bp.Conv2dFunction.apply(leaves[0], leaves[1], leaves[2] if bias else None, s, p)
    dy = cl.randn(*y.shape)
    y.backward(dy)

    ref_leaves = [t.detach().cpu().double().requires_grad_() for t in leaves]
    y64 = torch.nn.functional.conv2d(ref_leaves[0], ref_leaves[1], ref_leaves[2] if bias else None, stride=s, padding=p)
    y64.backward(dy.cpu().double())
    cl.check(y, y64, name="y")
    for name, ours, ref in zip(("dx", "dw", "db"), leaves, ref_leaves):
        cl.check(ours.grad, ref.grad, name=name)

    # the yardstick: torch's float32 conv against the same reference, same tolerance
    t_leaves = [t.detach().cpu().clone().requires_grad_() for t in leaves]
    yt = torch.nn.functional.conv2d(t_leaves[0], t_leaves[1], t_leaves[2] if bias else None, stride=s, padding=p)
    yt.backward(dy.cpu())
    for name, theirs, ref in zip(("dx", "dw", "db"), t_leaves, ref_leaves):
        cl.check(theirs.grad, ref.grad, name=f"torch {name}")


@pytest.mark.parametrize("shape", [SHAPES[1], SHAPES[5]], ids=_id)
def test_function_adjoint(shape):
    """gradcheck's question, exactly, for a linear map: <dy, J u> = <J^T dy, u> for random u, dy,
    with J the convolution in x (or in w). Sums in fp64 of our float32 results."""
    B, C, M, H, W, K, s, p = _unpack(shape)
    x, w, u_x, u_w = cl.randn(B, C, H, W), cl.randn(M, C, K, K), cl.randn(B, C, H, W), cl.randn(M, C, K, K)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = dropin.conv2d(xr, wr, None, s, p)
    dy = cl.randn(*y.shape)
    y.backward(dy)
    d = lambda a, b: float((a.cpu().double() * b.cpu().double()).sum())  # noqa: E731
    lhs_x = d(dy, dropin.conv2d(u_x, w, None, s, p))
    lhs_w = d(dy, dropin.conv2d(x, u_w, None, s, p))
    assert abs(lhs_x - d(xr.grad, u_x)) <= 1e-4 * (abs(lhs_x) + 1)
    assert abs(lhs_w - d(wr.grad, u_w)) <= 1e-4 * (abs(lhs_w) + 1)


@pytest.mark.filterwarnings("ignore:Input #")
@pytest.mark.parametrize("stride, pad", [(1, 0), (2, 1)])
def test_function_gradcheck(stride, pad):
    """torch.autograd.gradcheck itself, in float32 (our kernels' precision): the Jacobians from our
    backward kernels against central differences of our forward kernel. The map is linear, so the
    differences are exact up to float32 rounding: eps 1e-2, tolerance 1e-2 relative."""
    x = cl.randn(1, 2, 7, 6).requires_grad_()
    w = cl.randn(3, 2, 3, 3).requires_grad_()
    b = cl.randn(3).requires_grad_()
    assert torch.autograd.gradcheck(lambda x, w, b: dropin.conv2d(x, w, b, stride, pad), (x, w, b),
                                    eps=1e-2, atol=1e-2, rtol=1e-2)


def test_function_computes_only_the_gradients_asked_for(monkeypatch):
    x, w, b = cl.randn(2, 1, 12, 12), cl.randn(3, 1, 3, 3).requires_grad_(), cl.randn(3).requires_grad_()
    called = []
    real = bp.conv2d_input_grad_best
    monkeypatch.setattr(bp, "conv2d_input_grad_best", lambda *a, **k: called.append(1) or real(*a, **k))
    y = dropin.conv2d(x, w, b, 1, 1)
    y.sum().backward()
    assert not called, "dx was computed for an input that needs no gradient"
    assert x.grad is None and w.grad is not None and b.grad is not None
    cl.check(b.grad, torch.full((3,), 2 * 12 * 12.0, dtype=torch.float64), name="db")   # dy = 1 everywhere


def test_course_conv2d_is_nn_conv2d():
    torch.manual_seed(3)
    ours = dropin.Conv2d(2, 5, 3, stride=2, padding=1)
    torch.manual_seed(3)
    theirs = torch.nn.Conv2d(2, 5, 3, stride=2, padding=1)
    assert torch.equal(ours.weight, theirs.weight) and torch.equal(ours.bias, theirs.bias), "not the same init"
    assert set(ours.state_dict()) == set(theirs.state_dict())
    dev = cl.device().torch_device
    twin = dropin.Conv2d.from_torch(theirs.to(dev))
    x = cl.randn(3, 2, 11, 10)
    with torch.no_grad():
        cl.check(twin(x), torch.nn.functional.conv2d(x.cpu().double(), theirs.weight.cpu().double(),
                                                    theirs.bias.cpu().double(), stride=2, padding=1))


# ---- LeNet ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def digits():
    pytest.importorskip("sklearn")
    return lenet.load_digits()


def test_lenet_twins_agree_on_a_forward_pass(digits):
    ours, theirs = lenet.twins(digits.image_size, seed=1)
    assert isinstance(ours.conv1, dropin.Conv2d) and isinstance(theirs.conv1, torch.nn.Conv2d)
    xb = digits.x_test[:40].to(cl.device().torch_device)
    with torch.no_grad():
        a, b = ours(xb), theirs(xb)
    cl.check(a, b.double(), name="logits")
    assert torch.equal(a.argmax(1), b.argmax(1))



def test_lenet_twins_agree_on_the_gradients_of_one_batch(digits):
    """The course network's convolution gradients (dX and dW kernels) match torch's on one batch."""
    from convlab.measuring import baselines

    ours, theirs = lenet.twins(digits.image_size, seed=0)
    dev = ours.fc1.weight.device
    xb, yb = digits.x_train[:64].to(dev), digits.y_train[:64].to(dev)
    with baselines.strict_fp32():
        out_ours, out_theirs = ours(xb), theirs(xb)
        F.cross_entropy(out_ours, yb).backward()
        F.cross_entropy(out_theirs, yb).backward()
    cl.check(out_ours.detach(), out_theirs.detach().double(), name="logits")
    mine, torchs = dict(ours.named_parameters()), dict(theirs.named_parameters())
    for name in ("conv1.weight", "conv2.weight", "conv1.bias", "conv2.bias"):
        cl.check(mine[name].grad, torchs[name].grad.double(), rtol=1e-3, name=f"grad {name}")

def test_lenet_trains_on_the_digits(digits):
    """A short run: the loss falls, and the course network follows the torch network step by step."""
    ours, theirs = lenet.twins(digits.image_size, seed=0, activation="tanh")
    kw = dict(epochs=1, batch_size=32, lr=0.2, momentum=0.9, max_steps=20)
    r1 = lenet.train(ours, digits, **kw)
    r2 = lenet.train(theirs, digits, **kw)
    assert len(r1.losses) == 20
    first, last = sum(r1.losses[:4]) / 4, sum(r1.losses[-4:]) / 4
    assert last < 0.8 * first, f"loss did not fall: {first:.3f} -> {last:.3f}"
    assert np.allclose(r1.losses, r2.losses, rtol=2e-3, atol=2e-3), (r1.losses, r2.losses)
    assert r1.test_accuracy > 0.4


def _write_idx(path, array, gz):
    codes = {np.uint8: 0x08, np.int32: 0x0C}
    arr = np.ascontiguousarray(array)
    header = bytes([0, 0, codes[arr.dtype.type], arr.ndim]) + struct.pack(f">{arr.ndim}i", *arr.shape)
    data = header + arr.astype(arr.dtype.newbyteorder(">")).tobytes()
    path.write_bytes(gzip.compress(data) if gz else data)


@pytest.mark.parametrize("gz", [True, False], ids=["gzip", "raw"])
def test_fashion_mnist_loader(tmp_path, gz):
    rng = np.random.default_rng(0)
    files = {"x_train": rng.integers(0, 256, (7, 28, 28), dtype=np.uint8),
             "y_train": rng.integers(0, 10, 7, dtype=np.uint8),
             "x_test": rng.integers(0, 256, (3, 28, 28), dtype=np.uint8),
             "y_test": rng.integers(0, 10, 3, dtype=np.uint8)}
    for key, arr in files.items():
        _write_idx(tmp_path / (lenet.FASHION_FILES[key] + (".gz" if gz else "")), arr, gz)
    data = lenet.load_fashion_mnist(tmp_path)
    assert data.x_train.shape == (7, 1, 28, 28) and data.x_test.shape == (3, 1, 28, 28)
    assert data.y_train.tolist() == files["y_train"].tolist() and data.y_test.dtype == torch.int64
    raw = torch.as_tensor(files["x_train"], dtype=torch.float32) / 255
    assert torch.allclose(data.x_train[:, 0] * raw.std() + raw.mean(), raw, atol=1e-5)   # normalised, same pixels
    ints = rng.integers(-5, 5, (4, 3), dtype=np.int32)
    _write_idx(tmp_path / "ints", ints, gz)
    assert lenet.read_idx(tmp_path / "ints").tolist() == ints.tolist()
    (tmp_path / "bad").write_bytes(b"\x00\x00\x07\x01\x00\x00\x00\x01x")
    with pytest.raises(ValueError, match="not an IDX"):
        lenet.read_idx(tmp_path / "bad")
    with pytest.raises(FileNotFoundError, match="no such folder"):
        lenet.load_fashion_mnist(tmp_path / "nowhere")
    (tmp_path / (lenet.FASHION_FILES["y_test"] + (".gz" if gz else ""))).unlink()
    with pytest.raises(FileNotFoundError, match="t10k-labels"):
        lenet.load_fashion_mnist(tmp_path)


def test_direct_dw_takes_one_chunk_and_no_second_pass_where_each_thread_has_at_most_4_tasks():
    assert bp.direct_dw_chunks(4 * 128, pairs=8, block=128, min_blocks=3, sms=132) == 1
    assert bp.direct_dw_chunks(4 * 128 + 1, pairs=8, block=128, min_blocks=3, sms=132) == 5
    # the layer of benchmarks/launch_overhead.py (2 images, 4 -> 8 maps, 20x20): dW in one launch, exact
    cfg = bp.direct_dw_config(4, 8, 3, 1, 20)
    tasks = 2 * -(-20 // cfg["ROWS"]) * 20
    assert bp.direct_dw_chunks(tasks, -(-8 // cfg["MT"]) * 4, cfg["BLOCK"], cfg["MIN_BLOCKS"], 132) == 1
    x, dy = cl.randn(2, 4, 20, 20), cl.randn(2, 8, 20, 20)
    xd = x.double().requires_grad_()
    wd = torch.zeros(8, 4, 3, 3, dtype=torch.float64, device=x.device, requires_grad=True)
    F.conv2d(xd, wd, padding=1).backward(dy.double())
    with cl.debug():
        cl.check(bp.conv2d_weight_grad_best(x, dy, padding=1, kernel_size=3), wd.grad, name="dw")
