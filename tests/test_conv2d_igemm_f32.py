"""Chapter 9's fp32 implicit GEMM (kernels/09_general/conv2d_igemm_f32.cu, convlab.ops.igemm):
every loader (MODE 0 general, 1 one tap per step, 2 plain GEMM, scalar and float4), split-K on
and off, bias, the tiles igemm_config gives, against an fp64 reference, into NaN-filled outputs.
Shapes are small (the emulator runs every thread on the CPU) and awkward: pixels and maps not a
multiple of a tile, C = 1 and odd, odd and even K, stride 2, padding, B = 1, non-square."""
import pytest
import torch

import convlab as cl
from convlab import _limits
from convlab._args import check_launch
from convlab.ops import igemm
from convlab.workloads import Workload

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
        igemm.conv2d_igemm_f32(x, w, WM=16)
    with pytest.raises(ValueError, match="48 KB"):
        igemm.conv2d_igemm_f32(x, w, BM=256, BN=256, BK=32, WM=64, WN=32)
    with pytest.raises(ValueError, match="float32"):
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
    with pytest.raises(ValueError, match="stride 1 only"):
        igemm.conv2d_igemm_f32_dx(dy, w, stride=2)
    with pytest.raises(ValueError, match="padding"):
        igemm.conv2d_igemm_f32_dx(dy, w, padding=3)
    with pytest.raises(ValueError, match="input_size"):
        igemm.conv2d_igemm_f32_dx(dy, w, padding=1, input_size=(7, 7))
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
    with pytest.raises(ValueError, match="stride 1 only"):
        igemm.conv2d_igemm_f32_dw(x, cl.randn(2, 4, 3, 3), stride=2, padding=0)
    with pytest.raises(ValueError, match="square"):
        igemm.conv2d_igemm_f32_dw(cl.randn(2, 3, 8, 9), cl.randn(2, 4, 6, 7))
    with pytest.raises(ValueError, match="kernel_size"):
        igemm.conv2d_igemm_f32_dw(x, cl.randn(2, 4, 6, 6), kernel_size=5)
