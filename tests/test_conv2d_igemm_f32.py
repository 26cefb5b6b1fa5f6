"""Chapter 9's fp32 implicit GEMM (kernels/09_general/conv2d_igemm_f32.cu, convlab.ops.igemm):
every loader (MODE 0 general, 1 one tap per step, 2 plain GEMM, scalar and float4), split-K on
and off, bias, the tiles igemm_config gives, against an fp64 reference, into NaN-filled outputs.
Shapes are small (the emulator runs every thread on the CPU) and awkward: pixels and maps not a
multiple of a tile, C = 1 and odd, odd and even K, stride 2, padding, B = 1, non-square.
Then any layer, forward, dX and dW against torch's float64 conv2d and its gradients: groups 2 to 32
with C/g and M/g not multiples of a tile, dilation 2 and 3 with stride 2, 1x7, 7x1 and 3x5 masks,
per-axis stride and padding, dX phases that no tap reaches, tiny planes."""
import pytest
import torch

import convlab as cl
from convlab.gpu import _limits
from convlab.gpu._args import check_launch
from convlab.measuring.workloads import Workload
from convlab.ops import igemm

SMALL = {"BM": 32, "BN": 128}       # 64 threads: the cheapest tile on the emulator

# (B, C, M, H, W, K, stride, padding, what it exercises)
SHAPES = [
    (1, 1, 3, 7, 9, 3, 1, 1, "MODE 0: C=1, B=1, non-square"),
    (2, 3, 7, 13, 10, 4, 2, 1, "MODE 0: odd C, even K, stride 2"),
    (2, 5, 6, 11, 9, 5, 1, 2, "MODE 0: odd K, reduction 125 (not a multiple of BK)"),
    (2, 8, 5, 9, 11, 3, 1, 1, "MODE 1: C = BK, odd M"),
    (1, 16, 9, 10, 7, 2, 2, 0, "MODE 1: even K, stride 2, no padding"),
    (2, 16, 6, 5, 6, 3, 1, 0, "MODE 1: K = 3 unpadded"),
    (2, 10, 6, 6, 6, 1, 1, 0, "MODE 2 float4: P=36, C=10 not a multiple of BK"),
    (3, 5, 6, 5, 7, 1, 1, 0, "MODE 2 scalar: P=35"),
    (2, 8, 5, 9, 9, 1, 2, 0, "1x1 stride 2: MODE 1"),
    (1, 3, 4, 8, 8, 1, 1, 1, "1x1 padded: MODE 0"),
]


def _id(s):
    return s[-1]


def _case(B, C, M, H, W, K, stride, padding, bias=False):
    x, w = cl.randn(B, C, H, W), cl.randn(M, C, K, K)
    b = cl.randn(M) if bias else None
    y = cl.empty(B, M, cl.out_size(H, K, stride, padding), cl.out_size(W, K, stride, padding))   # NaN until written
    return x, w, b, y, cl.ref.conv2d(x, w, b, stride=stride, padding=padding)


def _run(shape, bias=False, **tunables):
    *dims, _ = shape
    x, w, b, y, ref = _case(*dims, bias=bias)
    out = igemm.conv2d_igemm_f32(x, w, y, stride=dims[6], padding=dims[7], bias=b, **tunables)
    assert out is y
    cl.check(y, ref, name=f"conv2d_igemm_f32 {shape[-1]} {tunables}")


@pytest.mark.parametrize("shape", SHAPES, ids=_id)
def test_every_loader(shape):
    _run(shape, **SMALL)


@pytest.mark.parametrize("shape", [SHAPES[1], SHAPES[3], SHAPES[7]], ids=_id)
def test_bias_and_split_k(shape):
    steps = -(-shape[1] * shape[5] ** 2 // 8)
    _run(shape, bias=True, **SMALL, SPLIT=1)
    _run(shape, bias=True, **SMALL, SPLIT=min(3, steps))
    _run(shape, **SMALL, SPLIT=64)            # more splits than steps: one step per split


@pytest.mark.parametrize("tunables", [
    {"BM": 64, "BN": 128, "BK": 16},                       # 2x2 warps
    {"BM": 128, "BN": 64, "BK": 8},                        # 4x1 warps, 2 float4 of Wt per thread
    {"BM": 64, "BN": 64, "BK": 8, "WM": 64, "WN": 32},     # 64x32 warp tiles
    {"BM": 64, "BN": 64, "BK": 4},                         # 2x1 warps, the shortest step
], ids=lambda t: " ".join(f"{k}={v}" for k, v in t.items()))
def test_tiles(tunables):
    for shape in (SHAPES[2], SHAPES[4], SHAPES[6]):
        _run(shape, bias=True, **tunables)


def test_default_config_on_a_layer_of_many_maps():
    """igemm_config's own choice (BM 128: 256 threads, MIN_BLOCKS 2), M and pixels ragged."""
    _run((1, 16, 130, 9, 7, 3, 1, 1, "M=130"))


def test_the_tile_of_layers_with_many_maps_and_pixels():
    """More than 64 maps and MANY_PIXELS outputs: 128 maps x 64 pixels, 16 deep on a reduction of
    DEEP_K or more (8 below); that tile, run on a small ragged layer of 32 channels (MODE 1 at BK 16)."""
    deep = Workload("vgg", 16, 256, 256, 56, 56, 3, 1, 1)
    short = Workload("pw", 32, 64, 256, 56, 56, 1, 1, 0)
    few = Workload("late", 32, 512, 512, 7, 7, 3, 1, 1)
    c = igemm.igemm_config(deep, sms=132)
    assert (c["BM"], c["BN"], c["BK"]) == (128, 64, 16)
    assert igemm.igemm_config(short, sms=132)["BK"] == 8
    assert igemm.igemm_config(few, sms=132)["BN"] == 128            # few pixels: the wide tile, split
    _run((2, 32, 130, 9, 7, 3, 1, 1, "M=130, 128x64x16"), bias=True, **c)


def test_the_mask_is_made_again_when_the_weights_change():
    x, w, _, _, _ = _case(1, 8, 4, 6, 6, 3, 1, 1)
    igemm.conv2d_igemm_f32(x, w, padding=1, **SMALL)
    w.mul_(-2.0)                                            # in place: the tensor's _version moves
    cl.check(igemm.conv2d_igemm_f32(x, w, padding=1, **SMALL), cl.ref.conv2d(x, w, padding=1))


def test_modes():
    def mode(K, stride, padding, C, BK=8):
        return igemm.igemm_mode(Workload("", 1, C, 1, 9, 9, K, stride, padding), BK)
    assert mode(1, 1, 0, 5) == 2
    assert mode(1, 2, 0, 8) == 1 and mode(3, 1, 1, 64) == 1 and mode(3, 1, 1, 64, BK=16) == 1
    assert mode(3, 1, 1, 12) == 0 and mode(7, 2, 3, 3) == 0 and mode(1, 1, 1, 3) == 0


def test_config_splits_layers_with_few_pixels():
    """Few pixels and a long reduction (7x7x512): the tile grid fills a fraction of the SMs, so
    the reduction is split; a layer with plenty of tiles (56x56x64) is not."""
    late = Workload("late", 32, 512, 512, 7, 7, 3, 1, 1)
    early = Workload("early", 32, 64, 64, 56, 56, 3, 1, 1)
    assert igemm.igemm_config(late, sms=132)["SPLIT"] > 1
    assert igemm.igemm_config(early, sms=132)["SPLIT"] == 1
    for wl in (late, early):
        c = igemm.igemm_config(wl, sms=132)
        igemm.check_tunables(c["BM"], c["BN"], c["BK"], c["WM"], c["WN"])


def test_refusals():
    x, w = cl.randn(1, 2, 8, 8), cl.randn(3, 2, 3, 3)
    with pytest.raises(ValueError, match="split evenly"):
        igemm.conv2d_igemm_f32(x, w, WM=16, WN=64)
    with pytest.raises(ValueError, match="48 KB"):
        igemm.conv2d_igemm_f32(x, w, BM=256, BN=256, BK=32, WM=64, WN=32)
    with pytest.raises(TypeError, match="float32"):
        igemm.conv2d_igemm_f32(x.double(), w.double())
    with pytest.raises(ValueError, match="contiguous"):
        igemm.conv2d_igemm_f32(x.transpose(2, 3), w)
    with pytest.raises(ValueError, match="bias"):
        igemm.conv2d_igemm_f32(x, w, bias=cl.randn(4))


def test_impl_and_pick():
    wl = Workload("t", 2, 8, 5, 9, 11, 3, 1, 1)
    impl = igemm.pick(wl)
    assert impl in igemm.IMPLEMENTATIONS and impl.applies(wl)
    x, w = cl.randn(*wl.x_shape), cl.randn(*wl.w_shape)
    cl.check(impl(x, w, padding=1, **{**impl.config(wl), **SMALL}), cl.ref.conv2d(x, w, padding=1))


# ---- launch limits at full sizes (meta tensors: no data, nothing runs) ----------------------------

FULL = [(32, 3, 64, 224, 224, 7, 2, 3), (32, 64, 64, 56, 56, 3, 1, 1), (32, 512, 512, 7, 7, 3, 1, 1),
        (32, 256, 64, 56, 56, 1, 1, 0), (16, 256, 256, 56, 56, 3, 1, 1), (256, 64, 256, 56, 56, 1, 1, 0)]


@pytest.mark.parametrize("dims", FULL, ids=str)
def test_launch_limits_at_full_size(record_launches, dims):
    B, C, M, H, W, K, s, p = dims
    launches = record_launches()
    x, w = torch.empty(B, C, H, W, device="meta"), torch.empty(M, C, K, K, device="meta")
    igemm.conv2d_igemm_f32(x, w, stride=s, padding=p)
    if s == 1:                                   # dX and dW at stride 1 on the same kernel
        dy = torch.empty(B, M, cl.out_size(H, K, s, p), cl.out_size(W, K, s, p), device="meta")
        igemm.conv2d_igemm_f32_dx(dy, w, padding=p)
        igemm.conv2d_igemm_f32_dw(x, dy, padding=p)
    assert {name for name, *_ in launches} >= {"conv2d_igemm_f32"}
    for name, grid, block, shared, _ in launches:
        check_launch(name, grid, block, shared)
        assert grid[2] <= _limits.GRID_YZ_MAX


@pytest.mark.emu_only
def test_no_race_under_other_thread_orders():
    x, w, b, y, ref = _case(2, 8, 5, 9, 11, 3, 1, 1, bias=True)
    problem = cl.find_race(lambda: igemm.conv2d_igemm_f32(x, w, y, padding=1, bias=b, **SMALL, SPLIT=2), y)
    assert problem is None, problem
    cl.check(y, ref)


# ---- dE/dX at stride 1: the same kernel on the flipped, transposed mask ------------------------------

@pytest.mark.parametrize("dims", [
    (1, 1, 3, 7, 9, 3, 1, "C=1, B=1, non-square"),
    (2, 8, 5, 9, 8, 3, 1, "dX's channels M=5: MODE 0"),
    (2, 3, 16, 8, 9, 4, 2, "even K, M=16: MODE 1"),
    (2, 5, 8, 6, 7, 5, 0, "no padding: dX pads K-1"),
    (2, 6, 10, 6, 6, 1, 0, "1x1: MODE 2"),
], ids=lambda d: d[-1])
def test_dx(dims):
    B, C, M, H, W, K, p, _ = dims
    w = cl.randn(M, C, K, K)
    dy = cl.randn(B, M, cl.out_size(H, K, 1, p), cl.out_size(W, K, 1, p))
    dx = cl.empty(B, C, H, W)
    for split in (1, 2):
        dx.fill_(float("nan"))
        out = igemm.conv2d_igemm_f32_dx(dy, w, dx, padding=p, input_size=(H, W), **SMALL, SPLIT=split)
        assert out is dx
        cl.check(dx, cl.ref.conv2d_input_grad((B, C, H, W), w, dy, padding=p), name=f"dx {dims[-1]} split {split}")


def test_dx_refusals_and_mask_kept_apart_from_the_forward():
    w, dy = cl.randn(4, 4, 3, 3), cl.randn(1, 4, 6, 6)
    with pytest.raises(ValueError, match="does not fit"):
        igemm.conv2d_igemm_f32_dx(cl.randn(1, 5, 6, 6), w)
    with pytest.raises(ValueError, match="input_size"):
        igemm.conv2d_igemm_f32_dx(dy, w, padding=1, input_size=(7, 7))
    with pytest.raises(RuntimeError, match="rejects"):     # torch's own error: 4 maps in 3 groups
        igemm.conv2d_igemm_f32_dx(dy, w, padding=1, groups=3)
    x = cl.randn(1, 4, 6, 6)                 # forward and dX on one weight tensor: two masks, both right
    cl.check(igemm.conv2d_igemm_f32(x, w, padding=1, **SMALL), cl.ref.conv2d(x, w, padding=1))
    cl.check(igemm.conv2d_igemm_f32_dx(dy, w, padding=1, **SMALL),
             cl.ref.conv2d_input_grad((1, 4, 6, 6), w, dy, padding=1))


# ---- dE/dW at stride 1: the same kernel over the batch -------------------------------------------------

@pytest.mark.parametrize("dims", [
    (1, 1, 2, 7, 7, 3, 1, "B=1, C=1"),
    (2, 2, 3, 9, 9, 5, 0, "odd K, no padding: dy 5x5"),
    (3, 2, 5, 8, 8, 3, 1, "B=3: MODE 0"),
    (8, 3, 4, 7, 7, 4, 1, "B=8: MODE 1, even K"),
    (2, 4, 3, 6, 6, 1, 0, "1x1"),
], ids=lambda d: d[-1])
def test_dw(dims):
    B, C, M, H, W, K, p, _ = dims
    Ho, Wo = cl.out_size(H, K, 1, p), cl.out_size(W, K, 1, p)
    x, dy = cl.randn(B, C, H, W), cl.randn(B, M, Ho, Wo)
    ref = cl.ref.conv2d_weight_grad(x, (M, C, K, K), dy, padding=p)
    for split in (1, 3):
        dw = cl.empty(M, C, K, K)
        assert igemm.conv2d_igemm_f32_dw(x, dy, dw, padding=p, kernel_size=K, **SMALL, SPLIT=split) is dw
        cl.check(dw, ref, name=f"dw {dims[-1]} split {split}")
    cl.check(igemm.conv2d_igemm_f32_dw(x, dy, padding=p), ref, name="dw, igemm_config's choice")


def test_dw_refusals():
    x = cl.randn(2, 3, 8, 8)
    with pytest.raises(ValueError, match="pass kernel_size"):     # K = 1 and 2 both give 4x4 at stride 2
        igemm.conv2d_igemm_f32_dw(x, cl.randn(2, 4, 4, 4), stride=2, padding=0)
    with pytest.raises(ValueError, match="kernel_size"):
        igemm.conv2d_igemm_f32_dw(x, cl.randn(2, 4, 6, 6), kernel_size=5)
    with pytest.raises(ValueError, match="need"):
        igemm.conv2d_igemm_f32_dw(x, cl.randn(3, 4, 6, 6))


# ---- any layer: groups, dilation, non-square masks, per-axis stride and padding -----------------------

def _ref64(x, w, bias=None, **conv):
    """torch's conv2d in float64 on the CPU, and its dX and dW for a dy: the reference of every route."""
    import torch.nn.functional as F
    x64 = x.detach().cpu().double().requires_grad_()
    w64 = w.detach().cpu().double().requires_grad_()
    b64 = None if bias is None else bias.detach().cpu().double()
    return x64, w64, F.conv2d(x64, w64, b64, **conv)


# (B, C, M, H, W, (Kh, Kw), stride, padding, dilation, groups, what it exercises); M/g and C/g not
# multiples of any tile, planes a few pixels wide
ANY = [
    (2, 6, 10, 7, 9, 3, 1, 1, 1, 2, "groups 2: C/g=3, M/g=5, MODE 0"),
    (1, 32, 12, 6, 5, 3, 1, 1, 1, 4, "groups 4: C/g=8 (MODE 1), M/g=3"),
    (3, 24, 40, 5, 6, (3, 5), (2, 1), (1, 2), 1, 8, "groups 8, 3x5, stride (2, 1), padding (1, 2), B=3"),
    (1, 64, 96, 6, 7, 3, 2, 1, 2, 32, "groups 32 (C/g=2, M/g=3), dilation 2, stride 2"),
    (2, 4, 40, 5, 4, 3, 1, 1, 1, 2, "groups 2: M/g=20"),
    (2, 5, 7, 11, 10, 3, 2, 3, 2, 1, "dilation 2, stride 2, odd padding 3"),
    (1, 8, 6, 12, 13, 3, 2, 1, 3, 1, "dilation 3, stride 2, padding 1: MODE 1"),
    (2, 8, 5, 5, 11, (1, 7), 1, (0, 3), 1, 1, "1x7, padding (0, 3): MODE 1"),
    (1, 3, 6, 11, 5, (7, 1), 1, (3, 0), 1, 1, "7x1, padding (3, 0), B=1"),
    (3, 4, 6, 7, 11, (3, 5), (1, 2), (1, 2), 1, 1, "3x5, stride (1, 2), padding (1, 2), B=3"),
    (1, 16, 9, 9, 8, 3, (2, 1), (1, 2), (1, 2), 1, "stride (2, 1), dilation (1, 2): MODE 1"),
    (2, 4, 3, 2, 3, 3, 1, 1, 1, 1, "tiny 2x3 plane"),
    (2, 8, 12, 4, 4, 1, 1, 0, 1, 2, "1x1 grouped: MODE 2, float4"),
    (2, 6, 4, 7, 5, 1, 2, 0, 1, 2, "1x1 stride 2 grouped: dX's odd phases get no tap"),
    (2, 3, 4, 10, 9, 2, 3, 0, 1, 1, "K=2 < stride 3: phases with no tap, rows left over"),
    (1, 4, 5, 5, 6, 3, 1, (3, 2), 1, 1, "padding 3 > K-1: dX's padding -1"),
    (2, 4, 8, 6, 7, 3, 2, 1, 1, 4, "depthwise x2: runs, though applies() leaves it to its own kernels"),
]


def _any(case):
    B, C, M, H, W, K, s, p, d, g, _ = case
    Kh, Kw = (K, K) if isinstance(K, int) else K
    conv = dict(stride=s, padding=p, dilation=d, groups=g)
    return cl.randn(B, C, H, W), cl.randn(M, C // g, Kh, Kw), conv


@pytest.mark.parametrize("case", ANY, ids=_id)
def test_any_layer_forward(case):
    x, w, conv = _any(case)
    b = cl.randn(int(w.shape[0]))
    _, _, ref = _ref64(x, w, b, **conv)
    for split in (1, 3):
        y = cl.empty(*ref.shape)                               # NaN until written
        assert igemm.conv2d_igemm_f32(x, w, y, bias=b, **conv, **SMALL, SPLIT=split) is y
        cl.check(y, ref, name=f"forward {case[-1]} split {split}")
    cl.check(igemm.conv2d_igemm_f32(x, w, bias=b, **conv), ref, name=f"forward {case[-1]}, igemm_config's tile")


@pytest.mark.parametrize("case", ANY, ids=_id)
def test_any_layer_dx(case):
    x, w, conv = _any(case)
    x64, w64, y64 = _ref64(x, w, **conv)
    dy = cl.randn(*y64.shape)
    y64.backward(dy.detach().cpu().double())
    for split in (1, 2):
        dx = cl.empty(*x.shape)
        out = igemm.conv2d_igemm_f32_dx(dy, w, dx, input_size=tuple(x.shape[2:]), **conv, **SMALL, SPLIT=split)
        assert out is dx
        cl.check(dx, x64.grad, name=f"dx {case[-1]} split {split}")
    cl.check(igemm.conv2d_igemm_f32_dx(dy, w, input_size=tuple(x.shape[2:]), **conv), x64.grad,
             name=f"dx {case[-1]}, igemm_config's tile")


@pytest.mark.parametrize("case", ANY, ids=_id)
def test_any_layer_dw(case):
    x, w, conv = _any(case)
    x64, w64, y64 = _ref64(x, w, **conv)
    dy = cl.randn(*y64.shape)
    y64.backward(dy.detach().cpu().double())
    for split in (1, 3):
        dw = cl.empty(*w.shape)
        assert igemm.conv2d_igemm_f32_dw(x, dy, dw, kernel_size=tuple(w.shape[2:]), **conv, **SMALL,
                                         SPLIT=split) is dw
        cl.check(dw, w64.grad, name=f"dw {case[-1]} split {split}", index=("m", "c", "ky", "kx"))
    cl.check(igemm.conv2d_igemm_f32_dw(x, dy, kernel_size=tuple(w.shape[2:]), **conv), w64.grad,
             name=f"dw {case[-1]}, igemm_config's tile", index=("m", "c", "ky", "kx"))


def test_the_one_warp_tile_of_thin_groups():
    """Groups of 16 maps or fewer get igemm_config's 16x128 one-warp tile, more maps the wider ones;
    that tile checked on a layer with 2 warps' worth of work in M and pixels ragged."""
    thin = Workload("g", 2, 32, 24, 7, 9, 3, 1, 1, groups=2)           # M/g = 12
    wide = Workload("g", 2, 32, 80, 7, 9, 3, 1, 1, groups=2)           # M/g = 40
    c = igemm.igemm_config(thin, sms=132)
    assert (c["BM"], c["WM"], c["WN"]) == (16, 16, 128)
    assert igemm.igemm_config(wide, sms=132)["BM"] == 64
    x, w = cl.randn(*thin.x_shape), cl.randn(*thin.w_shape)
    _, _, ref = _ref64(x, w, padding=1, groups=2)
    cl.check(igemm.conv2d_igemm_f32(x, w, padding=1, groups=2, **c), ref)


@pytest.mark.emu_only
def test_no_race_in_the_grouped_strided_routes():
    """The one-warp tile on a grouped layer, and dX's phases of a stride-2 dilated one, split."""
    x, w, conv = _any(ANY[3])
    y = cl.empty(*igemm.conv2d_igemm_f32(x, w, **conv).shape)
    problem = cl.find_race(lambda: igemm.conv2d_igemm_f32(x, w, y, **conv, BM=16, BN=128, SPLIT=2), y)
    assert problem is None, problem
    x, w, conv = _any(ANY[5])
    dy = cl.randn(*igemm.conv2d_igemm_f32(x, w, **conv).shape)
    dx = cl.empty(*x.shape)
    problem = cl.find_race(lambda: igemm.conv2d_igemm_f32_dx(dy, w, dx, input_size=tuple(x.shape[2:]), **conv,
                                                             **SMALL, SPLIT=2), dx)
    assert problem is None, problem


def test_phases():
    """dX's stride phases along one axis: which taps reach each input position, and where from."""
    # stride 2, K 3, padding 1: even positions take tap 1, odd ones taps 0 and 2 (dy rows i+1 and i)
    assert igemm._phase(0, 2, 1, 1, 3, 8) == (4, 1, 1, 2, 1, 0)
    assert igemm._phase(1, 2, 1, 1, 3, 8) == (4, 2, 0, 2, 1, 0)
    # stride 2, dilation 2: every tap reaches phase 1 (padding 1 odd), dy rows 1 apart; none phase 0
    assert igemm._phase(1, 2, 1, 2, 3, 9)[1:4] == (3, 0, 1) and igemm._phase(0, 2, 1, 2, 3, 9)[1] == 0
    # stride 1: one phase, the whole mask, padding d*(K-1)-p
    assert igemm._phase(0, 1, 1, 3, 3, 9) == (9, 3, 0, 1, 3, 5)


def test_applies_and_any_layer():
    """Every non-depthwise 2D layer of LAYERS is taken by all three routes; depthwise ones are not."""
    from convlab.measuring.workloads import LAYERS
    for impl in igemm.IMPLEMENTATIONS:
        assert impl.any_layer
        for wl in LAYERS:
            assert impl.takes(wl) == (wl.family != "depthwise"), (impl.name, wl.name)
    assert not igemm.IGEMM_F32.applies(Workload("3d", 1, 1, 1, 8, 8, 3, D=8))
    huge = Workload("huge", 1024, 1024, 64, 64, 64, 3, 1, 1)           # 4.3e9 inputs: past int indices
    assert not igemm.IGEMM_F32.applies(huge)


@pytest.mark.parametrize("wl", [w for w in __import__("convlab.measuring.workloads", fromlist=["LAYERS"]).LAYERS
                                if w.family != "depthwise"], ids=lambda w: w.name)
def test_any_layer_launch_limits_at_full_size(record_launches, wl):
    """The routes' launches on LAYERS at full size (meta tensors: nothing runs), and their configs."""
    launches = record_launches()
    x, w = torch.empty(wl.x_shape, device="meta"), torch.empty(wl.w_shape, device="meta")
    dy = torch.empty(wl.y_shape, device="meta")
    kw = wl.conv_kwargs()
    igemm.conv2d_igemm_f32(x, w, **kw)
    igemm.conv2d_igemm_f32_dx(dy, w, input_size=(wl.H, wl.W), **kw)
    igemm.conv2d_igemm_f32_dw(x, dy, kernel_size=(wl.K, wl.Kw), **kw)
    assert {name for name, *_ in launches} >= {"conv2d_igemm_f32", "igemm_mask_kmajor"}
    for name, grid, block, shared, _ in launches:
        check_launch(name, grid, block, shared)
    for impl in igemm.IMPLEMENTATIONS:
        c = impl.config(wl)
        igemm.check_tunables(c["BM"], c["BN"], c["BK"], c["WM"], c["WN"])


def test_pairs_as_lists_and_a_repeat_call():
    """stride, padding, dilation as lists (torch takes them) and ints; a repeat call finds its plan."""
    x, w = cl.randn(1, 4, 7, 8), cl.randn(6, 2, 3, 2)
    _, _, ref = _ref64(x, w, stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=2)
    for _ in range(2):
        cl.check(igemm.conv2d_igemm_f32(x, w, stride=[2, 1], padding=[1, 0], dilation=[1, 2], groups=2, **SMALL), ref)
    plans = len(igemm._plans)
    igemm.conv2d_igemm_f32(x, w, stride=[2, 1], padding=[1, 0], dilation=[1, 2], groups=2, **SMALL)
    assert len(igemm._plans) == plans
