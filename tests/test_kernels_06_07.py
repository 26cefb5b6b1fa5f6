"""Every kernel of chapters 6 (FP16, half2, WMMA) and 7 (3D convolution) against the fp64
reference, on the active backend.

Outputs are poisoned with NaN first (cl.empty), inputs are fresh random numbers each run, and the
shapes are awkward: sizes no multiple of a tile, C=1, B=1, odd and even K, padding, stride where
the kernel takes one. The fp16 kernels are checked with the bound fp16.fp16_tolerance derives from
the precision and the reduction length C·K², against the reference of the float32 inputs; the
tensor-core kernels (float accumulation) also against the reference of their half inputs, where
only the output's rounding is left; the half-accumulating kernels also against a numpy model of
their own sums (float16, one rounding per multiply-add, in the kernel's order). A last group
replays the launchers at the course's full sizes on meta tensors (nothing runs) and checks every
grid, and the emulator runs each shared-memory kernel in several thread orders to find races.
"""
import numpy as np
import pytest
import torch

import convlab as cl
from convlab.gpu._args import check_launch
from convlab.ops import conv3d, fp16

# ==== chapter 6 ======================================================================================

# (B, C, M, H, W, K, stride, padding)
SHAPES = [
    dict(B=1, C=1, M=1, H=17, W=19, K=3),                       # B=1, C=1, M=1
    dict(B=2, C=3, M=5, H=13, W=11, K=3, padding=1),                # "same" padding, odd sizes
    dict(B=1, C=4, M=16, H=14, W=13, K=7),                      # lenet_c3's channels and mask, small
    dict(B=2, C=2, M=3, H=15, W=12, K=7, padding=2),                # K=7, ragged
    dict(B=2, C=5, M=6, H=11, W=10, K=4),                       # even K, C=5 (padded to 8 channels)
    dict(B=1, C=32, M=20, H=9, W=10, K=3, padding=1),               # C a multiple of 32: one tap per tile
    dict(B=1, C=3, M=4, H=17, W=15, K=5, stride=2, padding=2),      # stride 2
    dict(B=2, C=16, M=9, H=11, W=12, K=3, stride=2, padding=1),     # stride 2 on WMMA's one-tap path
    dict(B=1, C=32, M=70, H=6, W=7, K=3, padding=1),                # maps over several blocks / groups
]


def _id(d):
    return " ".join(f"{k}={v}" for k, v in d.items())


def _unpack(shape):
    B, C, M, H, W, K = (shape[k] for k in "B C M H W K".split())
    return B, C, M, H, W, K, shape.get("stride", 1), shape.get("padding", 0)


def _case(shape):
    """float32 inputs, their half versions (by our conversion kernel), a poisoned half output."""
    B, C, M, H, W, K, s, p = _unpack(shape)
    x, w = cl.randn(B, C, H, W), cl.randn(M, C, K, K)
    assert not torch.all(x == 0)
    xh, wh = fp16.to_half(x), fp16.to_half(w)
    y = cl.empty(B, M, cl.out_size(H, K, s, p), cl.out_size(W, K, s, p), dtype=torch.float16)
    return x, w, xh, wh, y, s, p


def _run(fn, shape, accumulate, **tunables):
    x, w, xh, wh, y, s, p = _case(shape)
    out = fn(xh, wh, y, stride=s, padding=p, **tunables)
    assert out is y and y.dtype == torch.float16
    C, K = shape["C"], shape["K"]
    fp16.check_fp16(y, cl.ref.conv2d(x, w, stride=s, padding=p), C, K, accumulate, name=f"{fn.__name__} {tunables}")
    return x, w, xh, wh, y, s, p


def half_model(xh, wh, stride, pad):
    """The half-accumulating kernels' sums, computed with numpy: acc = fp16(w·x + acc) for c, then
    kx, then ky (their loop order), each step rounded once (float64 holds w·x + acc exactly)."""
    x = xh.detach().cpu().double().numpy()
    w = wh.detach().cpu().double().numpy()
    B, C, H, W = x.shape
    M, _, K, _ = w.shape
    Ho, Wo = cl.out_size(H, K, stride, pad), cl.out_size(W, K, stride, pad)
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    acc = np.zeros((B, M, Ho, Wo), np.float16)
    for c in range(C):
        for kx in range(K):
            for ky in range(K):
                patch = xp[:, c, ky:ky + stride * (Ho - 1) + 1:stride, kx:kx + stride * (Wo - 1) + 1:stride]
                prod = w[:, c, ky, kx][None, :, None, None] * patch[:, None]
                acc = (prod + acc.astype(np.float64)).astype(np.float16)
    return torch.from_numpy(acc)


# ---- step 0: conversions -------------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 3, 4, 37, 1000, 4099])
def test_to_half_is_torch_half_bit_for_bit(n):
    x = cl.randn(n) * 3
    special = torch.tensor([0.0, -0.0, 65504.0, 65520.0, 1e6, -1e6, 1e-8, 6e-8, 3e-5, float("inf"), 0.1, 1 / 3])
    x[: min(n, len(special))] = special[: min(n, len(special))].to(x.device)
    h = fp16.to_half(x)
    assert h.dtype == torch.float16
    assert torch.equal(h.cpu().view(torch.int16), x.cpu().half().view(torch.int16)), "to_half differs from .half()"
    f = fp16.to_float(h)
    assert f.dtype == torch.float32 and torch.equal(f.cpu(), h.cpu().float()), "to_float is not exact"


def test_to_half_keeps_the_shape_and_refuses_wrong_dtypes():
    x = cl.randn(2, 3, 5, 7)
    h = fp16.to_half(x)
    assert tuple(h.shape) == (2, 3, 5, 7)
    with pytest.raises(TypeError, match="float32"):
        fp16.to_half(h)
    with pytest.raises(TypeError, match="float16"):
        fp16.to_float(x)


def test_mask_to_tap_major():
    wh = fp16.to_half(cl.randn(5, 3, 4, 4))
    wt = fp16.mask_to_tap_major(wh)
    assert torch.equal(wt.cpu(), wh.cpu().permute(0, 2, 3, 1).contiguous())


# ---- steps 1 and 2: half and half2 direct convolutions ------------------------------------------------

@pytest.mark.parametrize("shape", SHAPES, ids=_id)
@pytest.mark.parametrize("fn", [fp16.conv2d_half, fp16.conv2d_half2], ids=["half", "half2"])
def test_half_direct(fn, shape):
    _run(fn, shape, "half")


@pytest.mark.parametrize("tunables", [dict(MT=2, ROWS=3, BLOCK=32), dict(MT=4, ROWS=1, BLOCK=64),
                                      dict(MT=6, ROWS=2, BLOCK=64), dict(MT=8, ROWS=5, BLOCK=128)],
                         ids=lambda t: " ".join(f"{k}={v}" for k, v in t.items()))
@pytest.mark.parametrize("fn", [fp16.conv2d_half, fp16.conv2d_half2], ids=["half", "half2"])
def test_half_direct_tunables(fn, tunables):
    _run(fn, dict(B=2, C=3, M=7, H=13, W=12, K=5, padding=1), "half", **tunables)


@pytest.mark.parametrize("shape", [SHAPES[1], SHAPES[2], SHAPES[6]], ids=_id)
@pytest.mark.parametrize("fn", [fp16.conv2d_half, fp16.conv2d_half2], ids=["half", "half2"])
def test_half_direct_computes_the_sums_it_claims(fn, shape):
    """Against a numpy float16 model of the very same sums: nearly every output identical bit for
    bit. (Not all: the emulator's __hfma rounds twice, to float then to half, and so differs from a
    single rounding by one unit in ~1 of 20,000 operations; a GPU rounds once.)"""
    x, w, xh, wh, y, s, p = _case(shape)
    fn(xh, wh, y, stride=s, padding=p)
    model = half_model(xh, wh, s, p)
    got = y.cpu()
    same = (got.view(torch.int16) == model.view(torch.int16)).double().mean().item()
    assert same >= 0.95, f"only {same:.1%} of the outputs equal the float16 model bit for bit"
    ulp8 = 8 * 2.0 ** (np.floor(np.log2(float(model.abs().max()))) - 10)
    assert float((got.double() - model.double()).abs().max()) <= ulp8


# ---- step 3: WMMA implicit GEMM ---------------------------------------------------------------------

def _wmma_checks(shape, **tunables):
    """Float accumulation: against the fp64 reference of the float32 inputs (the fp16 bound), and of
    the half inputs themselves (only the output's rounding and float sums left: a tight bound)."""
    x, w, xh, wh, y, s, p = _run(fp16.conv2d_wmma, shape, "float", **tunables)
    C, K = shape["C"], shape["K"]
    fp16.check_fp16(y, cl.ref.conv2d(xh.float(), wh.float(), stride=s, padding=p), C, K, "float",
                    rounded_inputs=True, name=f"conv2d_wmma {tunables} (half inputs)")


@pytest.mark.parametrize("shape", SHAPES, ids=_id)
def test_wmma(shape):
    _wmma_checks(shape)


@pytest.mark.parametrize("tunables", [
    dict(BM=16, BN=32, BK=16, WARPS_M=1, WARPS_N=1),     # one warp, one fragment of maps
    dict(BM=32, BN=64, BK=32, WARPS_M=2, WARPS_N=1),     # RSTEP 2: two U-tile rows per pass
    dict(BM=64, BN=32, BK=16, WARPS_M=2, WARPS_N=1),     # 64 threads, 16 column pairs: RSTEP 4
], ids=lambda t: " ".join(f"{k}={v}" for k, v in t.items()))
@pytest.mark.parametrize("shape", [dict(B=2, C=16, M=20, H=7, W=9, K=3, padding=1),    # one tap per tile (BK=16)
                                   dict(B=1, C=3, M=17, H=9, W=8, K=5, padding=2)],      # the general path, P even
                         ids=_id)
def test_wmma_tunables(shape, tunables):
    _wmma_checks(shape, **tunables)


def test_wmma_refuses_uneven_tiles():
    xh, wh = fp16.to_half(cl.randn(1, 1, 8, 8)), fp16.to_half(cl.randn(1, 1, 3, 3))
    with pytest.raises(ValueError, match="does not split"):
        fp16.conv2d_wmma(xh, wh, BM=24)
    with pytest.raises(ValueError, match="48 KB"):
        fp16.conv2d_wmma(xh, wh, BM=64, BN=256, BK=64, WARPS_M=2, WARPS_N=4)


# ---- step 4: WMMA for few channels --------------------------------------------------------------------

SMALLC = [s for s in SHAPES if s["C"] <= 8 and s.get("stride", 1) == 1]


@pytest.mark.parametrize("shape", SMALLC, ids=_id)
def test_wmma_smallc(shape):
    x, w, xh, wh, y, s, p = _run(fp16.conv2d_wmma_smallc, shape, "float")
    fp16.check_fp16(y, cl.ref.conv2d(xh.float(), wh.float(), padding=p), shape["C"], shape["K"], "float",
                    rounded_inputs=True, name="conv2d_wmma_smallc (half inputs)")


@pytest.mark.parametrize("tunables", [dict(WARPS=1), dict(WARPS=2, BAND=3), dict(BAND=1)],
                         ids=["one warp", "bands of 3 rows", "bands of 1 row"])
@pytest.mark.parametrize("shape", [dict(B=2, C=4, M=19, H=12, W=11, K=5, padding=1),    # two map groups, Wo odd
                                   dict(B=1, C=8, M=3, H=10, W=14, K=3)],            # 8 channels: no phases
                         ids=_id)
def test_wmma_smallc_tunables(shape, tunables):
    _run(fp16.conv2d_wmma_smallc, shape, "float", **tunables)


def test_wmma_smallc_refusals():
    xh, wh = fp16.to_half(cl.randn(1, 9, 8, 8)), fp16.to_half(cl.randn(2, 9, 3, 3))
    with pytest.raises(ValueError, match="1 to 8 channels"):
        fp16.conv2d_wmma_smallc(xh, wh)
    xh, wh = fp16.to_half(cl.randn(1, 2, 8, 8)), fp16.to_half(cl.randn(2, 2, 3, 3))
    with pytest.raises(ValueError, match="stride 1"):
        fp16.conv2d_wmma_smallc(xh, wh, stride=2)
    with pytest.raises(TypeError, match="float16"):
        fp16.conv2d_wmma_smallc(xh.float(), wh)


# ---- accuracy: the chapter's claims -------------------------------------------------------------------

def test_fp16_tolerance_grows_with_the_reduction_for_half_sums_only():
    small, big = fp16.fp16_tolerance(4, 7, "half"), fp16.fp16_tolerance(64, 3, "half")
    assert big[1] > 1.5 * small[1]                                  # ~ sqrt(C·K²): 576 vs 196
    f_small, f_big = fp16.fp16_tolerance(4, 7, "float"), fp16.fp16_tolerance(64, 3, "float")
    # rtol: the output's rounding, and for half sums the drift of large partial sums ~ sqrt(C·K²)
    assert f_small[0] == f_big[0] == 2.0 ** -11
    assert big[0] - 2.0 ** -11 > 1.5 * (small[0] - 2.0 ** -11) > 0
    assert abs(f_big[1] - f_small[1]) < 0.1 * f_small[1]            # float sums: the inputs' rounding only
    assert f_big[1] < big[1] / 5
    assert fp16.fp16_tolerance(64, 3, "float", rounded_inputs=True)[1] < f_big[1] / 5
    with pytest.raises(ValueError):
        fp16.fp16_tolerance(4, 7, "bf16")


def test_tensor_cores_are_more_accurate_on_a_long_reduction():
    """resnet's reduction length (C·K² = 576): half sums err several times more than float sums of
    the same half inputs."""
    shape = dict(B=1, C=64, M=16, H=6, W=7, K=3, padding=1)
    x, w, xh, wh, y, s, p = _case(shape)
    ref = cl.ref.conv2d(x, w, padding=1)
    err_half = (fp16.conv2d_half2(xh, wh, padding=1).cpu().double() - ref).abs().max().item()
    err_wmma = (fp16.conv2d_wmma(xh, wh, padding=1).cpu().double() - ref).abs().max().item()
    assert err_wmma * 2 < err_half, (err_wmma, err_half)


# ---- the whole path and the dispatcher ----------------------------------------------------------------

@pytest.mark.parametrize("impl", [None, fp16.conv2d_half2, fp16.conv2d_wmma], ids=["best", "half2", "wmma"])
def test_conv2d_fp16_float32_in_and_out(impl):
    shape = dict(B=2, C=4, M=6, H=12, W=13, K=5, padding=2)
    B, C, M, H, W, K, s, p = _unpack(shape)
    x, w = cl.randn(B, C, H, W), cl.randn(M, C, K, K)
    y = cl.empty(B, M, H, W)
    assert fp16.conv2d_fp16(x, w, y, padding=p, impl=impl) is y and y.dtype == torch.float32
    fp16.check_fp16(y, cl.ref.conv2d(x, w, padding=p), C, K, "half" if impl is fp16.conv2d_half2 else "float")


def test_pick_rules_for_the_course_layers():
    from convlab.measuring import workloads
    picks = {wl.name: fp16.pick(wl) for wl in workloads.WORKLOADS_2D}
    for name in ("lenet_c1", "lenet_c3", "fa17"):
        assert picks[name] is fp16.WMMA_SMALLC, name
    for name in ("resnet", "days100"):
        assert picks[name] is fp16.WMMA, name
    assert picks["resnet"].config(workloads.get("resnet")) == {"BM": 64, "BN": 128, "BK": 32, "WARPS_M": 2, "WARPS_N": 2}
    assert fp16.HALF2.config(workloads.get("lenet_c3")) == {"MT": 16, "ROWS": 4, "BLOCK": 128}
    assert fp16.direct_config(16, 4, 7) == {"MT": 16, "ROWS": 4, "BLOCK": 128}
    cfg = fp16.smallc_config(4, 7, 40, 40)
    assert cfg == {"RP": 40, "BAND": 34, "WARPS": 4}                # lenet_c3: the whole image per block
    assert fp16.smallc_shared(4, 7, **cfg) <= 48 * 1024
    assert [i.accumulation_on() for i in fp16.IMPLEMENTATIONS[:4]] == ["half", "half", "float", "float"]


@pytest.mark.parametrize("name", ["lenet_c1", "lenet_c3", "fa17", "days100", "resnet"])
@pytest.mark.parametrize("best", ["pick", "half2"])
def test_best_at_the_small_twins(name, best):
    from convlab.measuring import workloads
    wl = workloads.get(name).small()
    shape = dict(B=wl.B, C=wl.C, M=wl.M, H=wl.H, W=wl.W, K=wl.K, stride=wl.stride, padding=wl.padding)
    x, w, xh, wh, y, s, p = _case(shape)
    impl = fp16.pick(wl) if best == "pick" else fp16.HALF2
    assert (fp16.conv2d_fp16_best if best == "pick" else impl)(xh, wh, y, stride=s, padding=p) is y
    fp16.check_fp16(y, cl.ref.conv2d(x, w, stride=s, padding=p), wl.C, wl.K, impl.accumulation_on())


# ==== chapter 7 ======================================================================================

# (D, H, W, (KD, KH, KW))
SHAPES_3D = [
    (13, 11, 37, (5, 5, 5)),        # the challenge's mask, sizes no multiple of any tile
    (7, 9, 10, (3, 3, 3)),
    (6, 5, 33, (1, 1, 1)),          # K=1
    (9, 12, 41, (3, 4, 5)),         # a mask of three different sizes, W % 4 != 0
    (5, 8, 70, (5, 5, 5)),          # D = K: a single output plane; two warps' worth of columns
    (8, 6, 12, (2, 3, 4)),          # even sizes
]


def _id3(s):
    D, H, W, k = s
    return f"{D}x{H}x{W} mask {'x'.join(map(str, k))}"


def _case3(shape, five_d=False):
    D, H, W, k = shape
    x, w = cl.randn(D, H, W), cl.randn(*k)
    Do, Ho, Wo = D - k[0] + 1, H - k[1] + 1, W - k[2] + 1
    y = cl.empty(Do, Ho, Wo)
    if five_d:
        x, w, y = x.view(1, 1, *x.shape), w.view(1, 1, *w.shape), y.view(1, 1, *y.shape)
    return x, w, y, cl.ref.conv3d(x, w)


def _check3(y, ref, name):
    cl.check(y, ref, rtol=1e-5, atol=1e-5, name=name)      # the challenge's tolerance (allclose)


@pytest.mark.parametrize("shape", SHAPES_3D, ids=_id3)
@pytest.mark.parametrize("fn, tunables", [
    (conv3d.conv3d_naive, {}),
    (conv3d.conv3d_tiled, {"TX": 16, "TY": 2, "TZ": 2}),
    (conv3d.conv3d_cube, {}),
    (conv3d.conv3d_cube, {"TX": 8, "TY": 2, "TZ": 3, "CX": 3, "CY": 1, "CZ": 2}),   # odd, uneven cubes
    (conv3d.conv3d_coarse, {}),
], ids=["naive", "tiled", "cube", "cube 3x1x2", "coarse"])
def test_conv3d(fn, tunables, shape):
    x, w, y, ref = _case3(shape)
    assert fn(x, w, y, **tunables) is y
    _check3(y, ref, f"{fn.__name__} {tunables}")


@pytest.mark.parametrize("tunables", [
    dict(TX=1, TY=1, BY=2, ZC=3, MASK_REGS=0),     # scalar shared loads, the mask in constant memory
    dict(TX=2, TY=2, BY=2, ZC=2),                  # float2 loads, two rows per thread
    dict(TX=4, TY=3, BY=1, ZC=4, MASK_REGS=0),
    dict(TX=8, TY=1, BY=3, ZC=1),                  # ZC=1: every block all prologue
    dict(TX=4, TY=1, BY=4, ZC=5, MASK_REGS=1),
], ids=lambda t: " ".join(f"{k}={v}" for k, v in t.items()))
@pytest.mark.parametrize("shape", [SHAPES_3D[0], SHAPES_3D[3]], ids=_id3)
def test_conv3d_coarse_tunables(shape, tunables):
    x, w, y, ref = _case3(shape)
    conv3d.conv3d_coarse(x, w, y, **tunables)
    _check3(y, ref, f"conv3d_coarse {tunables}")


@pytest.mark.parametrize("fn", [conv3d.conv3d_naive, conv3d.conv3d_tiled, conv3d.conv3d_cube, conv3d.conv3d_coarse,
                                conv3d.conv3d_best])
def test_conv3d_takes_torch_5d_shapes(fn):
    x, w, y, ref = _case3((7, 10, 13, (3, 3, 3)), five_d=True)
    assert fn(x, w, y) is y and y.dim() == 5
    _check3(y, ref, fn.__name__)


def test_conv3d_coarse_on_views_that_are_not_16_byte_aligned():
    """W % 4 == 0 and Wo % 4 == 0, but x and y start 4 bytes into their buffers: the launcher must
    fall back to the scalar loads and stores (on a GPU a misaligned float4 access is a fault)."""
    D, H, W, k = 9, 10, 40, (5, 5, 5)
    x = cl.randn(D * H * W + 1)[1:].view(D, H, W)
    w = cl.randn(*k)
    y = cl.empty(5 * 6 * 36 + 1)[1:].view(5, 6, 36)
    assert x.data_ptr() % 16 and y.data_ptr() % 16
    conv3d.conv3d_coarse(x, w, y)
    _check3(y, cl.ref.conv3d(x, w), "conv3d_coarse (unaligned views)")


def test_conv3d_constant_mask_update_is_seen():
    """The launchers skip re-filling c_mask for the same weights, but not after they change."""
    for kw in ({"fn": conv3d.conv3d_tiled}, {"fn": conv3d.conv3d_cube}, {"fn": conv3d.conv3d_coarse, "MASK_REGS": 0}):
        fn = kw.pop("fn")
        x, w, y, _ = _case3((6, 7, 9, (3, 3, 3)))
        fn(x, w, y, **kw)
        w.mul_(-2.0)
        fn(x, w, y, **kw)
        _check3(y, cl.ref.conv3d(x, w), fn.__name__)


def test_conv3d_refusals():
    x = cl.randn(6, 6, 6)
    with pytest.raises(ValueError, match="no output"):
        conv3d.conv3d_naive(x, cl.randn(7, 3, 3))
    with pytest.raises(ValueError, match="one channel"):
        conv3d.conv3d_coarse(x.view(1, 1, 6, 6, 6).expand(1, 2, 6, 6, 6).contiguous(), cl.randn(1, 2, 3, 3, 3))
    with pytest.raises(ValueError, match="TX must be"):
        conv3d.conv3d_coarse(x, cl.randn(3, 3, 3), TX=3)
    with pytest.raises(ValueError, match="48 KB"):
        conv3d.conv3d_tiled(cl.randn(16, 16, 16), cl.randn(15, 15, 15), TX=32, TY=8, TZ=4)
    with pytest.raises(ValueError, match="48 KB"):
        conv3d.conv3d_cube(cl.randn(16, 16, 16), cl.randn(5, 5, 5), CZ=4)
    with pytest.raises(ValueError, match="at least one output"):
        conv3d.conv3d_cube(x, cl.randn(3, 3, 3), CX=0)
    with pytest.raises(ValueError, match="registers"):
        conv3d.conv3d_coarse(cl.randn(9, 9, 9), cl.randn(7, 7, 7), MASK_REGS=1)
    with pytest.raises(ValueError, match="stride 1 and padding 0"):
        conv3d.conv3d_best(x, cl.randn(3, 3, 3), padding=1)


def test_conv3d_pick_and_small_twin():
    from convlab.measuring import workloads
    wl = workloads.get("conv3d")
    best = conv3d.pick(wl)
    assert best is conv3d.COARSE and best.config(wl) == {"TX": 4, "TY": 1, "BY": 8, "ZC": 32, "MASK_REGS": 1}
    assert all(impl.applies(wl) and impl.op == "conv3d" for impl in conv3d.IMPLEMENTATIONS)
    small = wl.small()
    x, w, y, ref = _case3((small.D, small.H, small.W, (wl.K,) * 3))
    conv3d.conv3d_best(x, w, y)
    _check3(y, ref, "conv3d_best")


# ==== launch limits at the course's full sizes (meta tensors: no data, nothing runs) ===================

@pytest.fixture
def recorded(record_launches):
    return record_launches()


FULL = {
    "lenet_c1": (10000, 1, 4, 86, 86, 7, 1, 0), "lenet_c3": (10000, 4, 16, 40, 40, 7, 1, 0),
    "fa17": (10000, 1, 50, 28, 28, 5, 1, 0), "days100": (1, 32, 128, 256, 256, 3, 1, 1),
    "resnet": (64, 64, 64, 56, 56, 3, 1, 1), "big_batch": (70000, 1, 2, 8, 8, 3, 1, 0),
}


@pytest.mark.parametrize("name", list(FULL))
def test_fp16_launchers_respect_the_launch_limits(recorded, name):
    B, C, M, H, W, K, s, p = FULL[name]
    xh = torch.empty(B, C, H, W, device="meta", dtype=torch.float16)
    wh = torch.empty(M, C, K, K, device="meta", dtype=torch.float16)
    y = torch.empty(B, M, cl.out_size(H, K, s, p), cl.out_size(W, K, s, p), device="meta", dtype=torch.float16)
    calls = [(fp16.conv2d_wmma, {}), (fp16.conv2d_fp16_best, {})]
    if fp16.direct_fits(M, C, K):
        calls += [(fp16.conv2d_half, {}), (fp16.conv2d_half2, {})]
    if fp16.smallc_fits(C, K, H, W, p, s):
        calls.append((fp16.conv2d_wmma_smallc, {}))
    for fn, kw in calls:
        recorded.clear()
        fn(xh, wh, y, stride=s, padding=p, **kw)
        assert recorded, fn.__name__
        for kname, grid, block, shared, defines in recorded:
            check_launch(kname, grid, block, shared)


def test_conv3d_launchers_respect_the_launch_limits(recorded):
    from convlab.measuring import workloads
    wl = workloads.get("conv3d")
    x = torch.empty(wl.D, wl.H, wl.W, device="meta")
    w = torch.empty(wl.K, wl.K, wl.K, device="meta")
    y = torch.empty(wl.Do, wl.Ho, wl.Wo, device="meta")
    for fn in (conv3d.conv3d_naive, conv3d.conv3d_tiled, conv3d.conv3d_coarse, conv3d.conv3d_best):
        recorded.clear()
        fn(x, w, y)
        for kname, grid, block, shared, defines in recorded:
            check_launch(kname, grid, block, shared)
    recorded.clear()
    conv3d.conv3d_coarse(x, w, y)
    assert recorded[0][1] == (1, 16, 8)          # 124 output rows in blocks of 8 warps, 8 groups of 32 planes


# ==== races: every kernel with shared memory, whatever order a block's threads run in ==================

@pytest.mark.emu_only
@pytest.mark.parametrize("fn, tunables", [
    (fp16.conv2d_half, {"MT": 4, "ROWS": 2, "BLOCK": 64}),
    (fp16.conv2d_half2, {"MT": 4, "ROWS": 2, "BLOCK": 64}),
    (fp16.conv2d_wmma, {"BM": 16, "BN": 32, "BK": 16, "WARPS_M": 1, "WARPS_N": 2}),
    (fp16.conv2d_wmma_smallc, {"WARPS": 2, "BAND": 4}),
], ids=lambda v: getattr(v, "__name__", None) or " ".join(f"{k}={x}" for k, x in v.items()))
def test_no_race_fp16(fn, tunables):
    shape = dict(B=1, C=3, M=5, H=9, W=11, K=3, padding=1)
    x, w, xh, wh, y, s, p = _case(shape)
    problem = cl.find_race(lambda: fn(xh, wh, y, stride=s, padding=p, **tunables), y)
    assert problem is None, problem
    fp16.check_fp16(y, cl.ref.conv2d(x, w, padding=p), 3, 3, "half" if "half" in fn.__name__ else "float")


@pytest.mark.emu_only
@pytest.mark.parametrize("fn, tunables", [
    (conv3d.conv3d_tiled, {"TX": 8, "TY": 2, "TZ": 2}),
    (conv3d.conv3d_coarse, {"TX": 1, "BY": 2, "ZC": 3}),
    (conv3d.conv3d_coarse, {"TX": 4, "TY": 2, "BY": 2, "ZC": 4, "MASK_REGS": 0}),
], ids=lambda v: getattr(v, "__name__", None) or " ".join(f"{k}={x}" for k, x in v.items()))
def test_no_race_conv3d(fn, tunables):
    x, w, y, ref = _case3((9, 8, 21, (3, 3, 3)))
    problem = cl.find_race(lambda: fn(x, w, y, **tunables), y)
    assert problem is None, problem
    _check3(y, ref, fn.__name__)
