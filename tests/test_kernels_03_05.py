"""Every kernel of chapters 3–5 against the fp64 reference, on the active backend.

Outputs are poisoned with NaN first (cl.empty), inputs are fresh random numbers each run, and the
shapes are awkward: sizes no multiple of a tile, C=1, B=1, odd and even K, padding, stride where
the kernel takes one. A last group of tests replays the launchers at the course's full sizes on
meta tensors (no data, no launch) and checks every grid against the GPU's limits.
"""
import pytest
import torch

import convlab as cl
from convlab.gpu import _limits
from convlab.gpu._args import check_launch
from convlab.ops import fused, im2col, tiled

# (B, C, M, H, W, K, stride, padding)
SHAPES = [
    dict(B=1, C=1, M=1, H=17, W=19, K=3),                       # B=1, C=1, M=1
    dict(B=2, C=3, M=5, H=19, W=21, K=5, padding=2),                # "same" padding, odd sizes
    dict(B=2, C=2, M=3, H=23, W=18, K=7, padding=1),                # K=7, two tiles per side, ragged
    dict(B=3, C=4, M=6, H=15, W=16, K=4),                       # even K
    dict(B=1, C=2, M=7, H=9, W=40, K=1),                        # K=1, a wide image
    dict(B=2, C=2, M=3, H=21, W=20, K=3, stride=2, padding=1),      # stride 2
    dict(B=1, C=3, M=2, H=26, W=17, K=5, stride=3),             # stride 3, no padding
]


def _id(d):
    return " ".join(f"{k}={v}" for k, v in d.items())


def _strided(d):
    return d.get("stride", 1) != 1


def _case(shape):
    B, C, M, H, W, K = (shape[k] for k in "B C M H W K".split())
    s, p = shape.get("stride", 1), shape.get("padding", 0)
    x, w = cl.randn(B, C, H, W), cl.randn(M, C, K, K)
    assert not torch.all(x == 0)
    y = cl.empty(B, M, cl.out_size(H, K, s, p), cl.out_size(W, K, s, p))   # NaN until written
    return x, w, y, s, p, cl.ref.conv2d(x, w, stride=s, padding=p)


def _run(fn, shape, **tunables):
    x, w, y, s, p, ref = _case(shape)
    out = fn(x, w, y, stride=s, padding=p, **tunables)
    assert out is y
    cl.check(y, ref, name=f"{fn.__name__} {tunables}")


# ---- chapter 3 -----------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", SHAPES, ids=_id)
@pytest.mark.parametrize("mask", ["constant", "global"])
def test_tiled_halo_multi_pass(shape, mask):
    _run(tiled.conv2d_tiled_halo_multi_pass, shape, mask=mask)


@pytest.mark.parametrize("shape", SHAPES, ids=_id)
@pytest.mark.parametrize("mask", ["constant", "global"])
def test_tiled_input_block(shape, mask):
    _run(tiled.conv2d_tiled_input_block, shape, mask=mask, IN_TILE=16)


@pytest.mark.parametrize("shape", [s for s in SHAPES if not _strided(s)], ids=_id)
@pytest.mark.parametrize("mask", ["constant", "global"])
def test_tiled_cached_halo(shape, mask):
    _run(tiled.conv2d_tiled_cached_halo, shape, mask=mask, TILE=8)


@pytest.mark.parametrize("fn, tunables", [
    (tiled.conv2d_tiled_halo_multi_pass, {"TILE": 8}),          # more tiles, more passes per thread
    (tiled.conv2d_tiled_input_block, {"IN_TILE": 32}),          # the default: 1,024-thread blocks
    (tiled.conv2d_tiled_input_block, {"IN_TILE": 7}),           # IN_TILE == K: one output per block
    (tiled.conv2d_tiled_cached_halo, {"TILE": 16}),
])
def test_tiled_tunables(fn, tunables):
    _run(fn, dict(B=2, C=2, M=3, H=23, W=18, K=7, padding=1), **tunables)


def test_tiled_mask_update_is_seen():
    """The launcher skips re-filling c_mask for the same weights, but not after they change."""
    shape = dict(B=1, C=2, M=2, H=12, W=13, K=3)
    x, w, y, s, p, _ = _case(shape)
    tiled.conv2d_tiled_halo_multi_pass(x, w, y)
    w.mul_(-2.0)                                    # in place: same tensor, new values
    tiled.conv2d_tiled_halo_multi_pass(x, w, y)
    cl.check(y, cl.ref.conv2d(x, w))


def test_tiled_refusals():
    x, w = cl.randn(1, 1, 12, 12), cl.randn(1, 1, 3, 3)
    with pytest.raises(ValueError, match="stride 1"):
        tiled.conv2d_tiled_cached_halo(x, w, stride=2)
    with pytest.raises(ValueError, match="smaller than the mask"):
        tiled.conv2d_tiled_input_block(x, cl.randn(1, 1, 5, 5), IN_TILE=4)
    big_x, big_w = cl.randn(1, 64, 5, 5), cl.randn(64, 64, 3, 3)    # 36,864 floats: over constant memory
    with pytest.raises(ValueError, match="mask='global'"):
        tiled.conv2d_tiled_halo_multi_pass(big_x, big_w, mask="constant")
    cl.check(tiled.conv2d_tiled_halo_multi_pass(big_x, big_w), cl.ref.conv2d(big_x, big_w))   # the default: global
    with pytest.raises(ValueError, match="mask must be"):
        tiled.conv2d_tiled_halo_multi_pass(x, w, mask="texture")


def _barrier_line(path):
    lines = (cl.book.path(path)).read_text().splitlines()
    return next(n for n, line in enumerate(lines, 1) if "__syncthreads();" in line)


@pytest.mark.emu_only
def test_tiled_early_return_stops_at_its_barrier_on_a_ragged_shape():
    """The blog's form of strategy 3: Wo = 35 leaves 29 of the second block's 32 columns past the
    image, and those threads return before the barrier. The fix, strategy 3 at TILE=32, is right."""
    shape = dict(B=1, C=2, M=1, H=34, W=37, K=3)                 # Ho = 32, Wo = 35: one ragged block
    x, w, y, s, p, ref = _case(shape)
    with pytest.raises(cl.BarrierError) as e:
        tiled.conv2d_tiled_early_return(x, w, y)
    msg = str(e.value)
    assert f"conv2d_tiled_early_return.cu:{_barrier_line(tiled.EARLY_RETURN_FILE)}" in msg
    assert "reached by only 96 of the 1024 threads of block (1,0,0)" in msg
    _run(tiled.conv2d_tiled_cached_halo, shape, TILE=32)


@pytest.mark.parametrize("shape", [
    dict(B=2, C=3, M=2, H=32, W=64, K=3, padding=1),            # "same": 32×64 outputs
    dict(B=1, C=2, M=3, H=36, W=68, K=5),                       # valid: 32×64 outputs
], ids=_id)
@pytest.mark.parametrize("mask", ["constant", "global"])
def test_tiled_early_return_is_right_where_no_thread_returns(shape, mask):
    """Where 32 divides both output sides every thread reaches the barriers: the bug stays hidden."""
    _run(tiled.conv2d_tiled_early_return, shape, mask=mask)


# ---- chapter 4 -----------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", SHAPES[:3] + SHAPES[5:], ids=_id)
def test_unroll_matches_torch_unfold(shape):
    """Our U (B, C·K·K, Ho·Wo) has exactly the layout of torch's unfold: same values, bit for bit."""
    B, C, H, W, K = (shape[k] for k in "B C H W K".split())
    s, p = shape.get("stride", 1), shape.get("padding", 0)
    x = cl.randn(B, C, H, W)
    u = im2col.unroll(x, K, stride=s, padding=p)
    want = torch.nn.functional.unfold(x.cpu(), K, padding=p, stride=s)
    assert tuple(u.shape) == tuple(want.shape) == im2col.unrolled_shape(B, C, H, W, K, s, p)
    assert torch.equal(u.cpu(), want), "unrolled matrix differs from torch.nn.functional.unfold"
    assert im2col.unrolled_bytes(B, C, H, W, K, s, p) == 4 * want.numel()


@pytest.mark.parametrize("M, N, K", [(1, 1, 1), (5, 33, 17), (16, 16, 16), (17, 40, 3), (3, 7, 50)])
def test_gemm_tiled_2d(M, N, K):
    a, b = cl.randn(M, K), cl.randn(K, N)
    c = cl.empty(M, N)
    assert im2col.gemm_tiled(a, b, c) is c
    cl.check(c, cl.ref.matmul(a, b))


def test_gemm_tiled_batched_shared_and_per_batch_a():
    a, b = cl.randn(5, 9), cl.randn(3, 9, 21)
    cl.check(im2col.gemm_tiled(a, b, TILE=8), cl.ref.matmul(a.unsqueeze(0).expand(3, 5, 9), b))
    a3 = cl.randn(3, 5, 9)
    cl.check(im2col.gemm_tiled(a3, b), cl.ref.matmul(a3, b))
    b2 = cl.randn(9, 4)
    cl.check(im2col.gemm_tiled(a3, b2), cl.ref.matmul(a3, b2.unsqueeze(0).expand(3, 9, 4)))


@pytest.mark.parametrize("shape", SHAPES, ids=_id)
def test_im2col_gemm(shape):
    _run(im2col.conv2d_im2col_gemm, shape)


@pytest.mark.parametrize("shape", SHAPES[1:3], ids=_id)
def test_im2col_gemm_in_chunks(shape):
    """A workspace too small for two images: one im2col + GEMM per image, all written."""
    _run(im2col.conv2d_im2col_gemm, shape, workspace_mb=1e-6, TILE=8)


@pytest.mark.parametrize("shape", SHAPES[:3], ids=_id)
def test_im2col_matmul(shape):
    _run(im2col.conv2d_im2col_matmul, shape)


# ---- chapter 5 -----------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", SHAPES, ids=_id)
@pytest.mark.parametrize("fixed_k", [False, True], ids=["K at run time", "K compiled in"])
def test_implicit_gemm(shape, fixed_k):
    _run(fused.conv2d_implicit_gemm, shape, KSIZE=shape["K"] if fixed_k else 0)


@pytest.mark.parametrize("shape", SHAPES, ids=_id)
def test_implicit_gemm_reg(shape):
    _run(fused.conv2d_implicit_gemm_reg, shape)


@pytest.mark.parametrize("tunables", [
    dict(BM=32, BN=128, BK=8, TM=4, TN=8),     # 128 threads, one U-tile column each
    dict(BM=64, BN=64, BK=16, TM=8, TN=4),     # 128 threads, two reduction rows per pass
    dict(BM=16, BN=256, BK=8, TM=4, TN=8),     # 128 threads, two U-tile columns each
    dict(BM=128, BN=64, BK=8, TM=8, TN=8),
    dict(BM=128, BN=128, BK=16, TM=8, TN=8),   # 256 threads, the days100 pick
], ids=lambda t: " ".join(f"{k}={v}" for k, v in t.items()))
@pytest.mark.parametrize("shape", [
    dict(B=3, C=5, M=9, H=13, W=11, K=3, padding=1),        # P = 143: scalar stores, N ragged
    dict(B=2, C=3, M=20, H=12, W=12, K=5, padding=2),       # P = 144: 16-byte stores
], ids=_id)
def test_implicit_gemm_reg_tunables(shape, tunables):
    _run(fused.conv2d_implicit_gemm_reg, shape, **tunables)


def test_implicit_gemm_reg_refuses_uneven_tiles():
    with pytest.raises(ValueError, match="does not split"):
        fused.conv2d_implicit_gemm_reg(cl.randn(1, 1, 8, 8), cl.randn(1, 1, 3, 3), TM=6)


@pytest.mark.parametrize("shape", [s for s in SHAPES if s["M"] * s["C"] * s["K"] ** 2 <= 300], ids=_id)
@pytest.mark.parametrize("rows", [1, 3])
def test_direct_coarse(shape, rows):
    _run(fused.conv2d_direct_coarse, shape, ROWS=rows, BLOCK=64)


@pytest.mark.parametrize("shape", SHAPES, ids=_id)
@pytest.mark.parametrize("tunables", [dict(), dict(MT=4, ROWS=3, BLOCK=64), dict(MT=8, ROWS=1, BLOCK=32)],
                         ids=["default", "MT=4 ROWS=3", "MT=8 ROWS=1"])
def test_direct_regtile(shape, tunables):
    _run(fused.conv2d_direct_regtile, shape, **tunables)


def test_direct_refusals():
    with pytest.raises(ValueError, match="constant memory"):
        fused.conv2d_direct_coarse(cl.randn(1, 64, 5, 5), cl.randn(64, 64, 3, 3))
    with pytest.raises(ValueError, match="multiple of 4"):
        fused.conv2d_direct_regtile(cl.randn(1, 1, 8, 8), cl.randn(5, 1, 3, 3), MT=6)


def test_pick_rules_for_the_course_layers():
    from convlab.measuring import workloads
    from convlab.measuring.workloads import Workload
    picks = {wl.name: fused.pick(wl) for wl in workloads.WORKLOADS_2D}
    for name in ("lenet_c1", "lenet_c3", "fa17"):
        assert picks[name] is fused.DIRECT_REGTILE, name
    mt = fused.DIRECT_REGTILE.config(workloads.get("fa17"))["MT"]
    assert mt == 28 and mt * ((50 + mt - 1) // mt) >= 50
    for name in ("resnet", "days100"):
        assert picks[name] is fused.IMPLICIT_GEMM_REG, name
    assert picks["days100"].config(workloads.get("days100"))["BM"] == 128
    assert picks["resnet"].config(workloads.get("resnet"))["BM"] == 64
    assert fused.pick("fa17") is fused.DIRECT_REGTILE                           # by name too
    assert fused.pick(Workload("", B=1, C=3, M=8, H=9, W=9, K=3)) is fused.DIRECT_REGTILE
    # the one GEMM tile rule: 32 maps or fewer get a 32-map tile
    assert fused.gemm_config(32)["BM"] == 32 and fused.gemm_config(33)["BM"] == 64
    for M in (1, 32, 64, 127, 128, 256):
        fused.check_reg_tunables(**fused.gemm_config(M))


@pytest.mark.parametrize("module", [tiled, im2col, fused], ids=lambda m: m.__name__.split(".")[-1])
def test_implementations_and_pick(module):
    """Each implementation under its one name, called as pick() returns it: best(x, w) with the
    tunables of best.config(shape), on an awkward shape."""
    from convlab.measuring.workloads import Workload
    x, w = cl.randn(2, 3, 13, 11), cl.randn(5, 3, 3, 3)
    shape = Workload.of(x, w, padding=1)
    names = [impl.name for impl in module.IMPLEMENTATIONS]
    assert len(set(names)) == len(names)
    best = module.pick(shape)
    assert best in module.IMPLEMENTATIONS and best.applies(shape)
    ref = cl.ref.conv2d(x, w, padding=1)
    cl.check(best(x, w, padding=1), ref, name=best.name)
    cl.check(best(x, w, padding=1, **best.config(shape)), ref, name=f"{best.name} {best.config(shape)}")


@pytest.mark.parametrize("name", ["lenet_c1", "lenet_c3", "fa17", "days100", "resnet"])
def test_best_at_the_small_twins(name):
    from convlab.measuring import workloads
    wl = workloads.get(name).small()
    shape = dict(B=wl.B, C=wl.C, M=wl.M, H=wl.H, W=wl.W, K=wl.K, stride=wl.stride, padding=wl.padding)
    _run(fused.conv2d_best, shape)


# ---- launch limits at the course's full sizes (meta tensors: no data, nothing runs) ------------------

@pytest.fixture
def recorded(record_launches):
    return record_launches()


FULL = {
    "lenet_c1": (10000, 1, 4, 86, 86, 7, 1, 0), "lenet_c3": (10000, 4, 16, 40, 40, 7, 1, 0),
    "fa17": (10000, 1, 50, 28, 28, 5, 1, 0), "days100": (1, 32, 128, 256, 256, 3, 1, 1),
    "resnet": (64, 64, 64, 56, 56, 3, 1, 1), "big_batch": (70000, 1, 2, 8, 8, 3, 1, 0),
}


@pytest.mark.parametrize("name", list(FULL))
def test_every_launcher_respects_the_launch_limits(recorded, name):
    B, C, M, H, W, K, s, p = FULL[name]
    x = torch.empty(B, C, H, W, device="meta")
    w = torch.empty(M, C, K, K, device="meta")
    y = torch.empty(B, M, cl.out_size(H, K, s, p), cl.out_size(W, K, s, p), device="meta")
    calls = [
        (tiled.conv2d_tiled_halo_multi_pass, {"mask": "global"}),
        (tiled.conv2d_tiled_input_block, {"mask": "global"}),
        (tiled.conv2d_tiled_cached_halo, {"mask": "global"}),
        (im2col.conv2d_im2col_gemm, {}),
        (fused.conv2d_implicit_gemm, {}),
        (fused.conv2d_implicit_gemm_reg, {}),
        (fused.conv2d_best, {}),
    ]
    if M * C * K * K <= tiled.MASK_MAX:
        calls.append((tiled.conv2d_tiled_halo_multi_pass, {"mask": "constant"}))
    if fused.direct_fits(M, C, K):
        calls.append((fused.conv2d_direct_coarse, {}))
    if fused.regtile_fits(M, C, K):
        calls.append((fused.conv2d_direct_regtile, {}))
    for fn, tunables in calls:
        recorded.clear()
        fn(x, w, y, stride=s, padding=p, **tunables)
        assert recorded, fn.__name__
        covered = 0
        for kname, grid, block, shared, defines in recorded:
            check_launch(kname, grid, block, shared)          # raises cl.LaunchError past a limit
            assert grid[1] <= _limits.GRID_YZ_MAX and grid[2] <= _limits.GRID_YZ_MAX
            if kname in ("conv2d_tiled_halo_multi_pass", "conv2d_tiled_input_block", "conv2d_tiled_cached_halo",
                         "conv2d_implicit_gemm"):
                covered += grid[2]                            # images on gridDim.z, chunk by chunk
        if covered:
            assert covered == B, f"{fn.__name__}: the chunks cover {covered} of {B} images"


# ---- races: every kernel with a barrier gives the same output whatever order a block's threads run --

@pytest.mark.emu_only
@pytest.mark.parametrize("fn, tunables", [
    (tiled.conv2d_tiled_halo_multi_pass, {"TILE": 8}),
    (tiled.conv2d_tiled_input_block, {"IN_TILE": 16}),
    (tiled.conv2d_tiled_cached_halo, {"TILE": 8}),
    (im2col.conv2d_im2col_gemm, {"TILE": 8}),
    (fused.conv2d_implicit_gemm, {"TILE": 8}),
    (fused.conv2d_implicit_gemm_reg, {"BM": 32, "BN": 64, "BK": 8, "TM": 4, "TN": 4}),
    (fused.conv2d_direct_regtile, {"MT": 8, "ROWS": 2, "BLOCK": 64}),
], ids=lambda v: getattr(v, "__name__", None) or " ".join(f"{k}={x}" for k, x in v.items()))
def test_no_race_under_other_thread_orders(fn, tunables):
    x, w, y, s, p, ref = _case(dict(B=2, C=3, M=5, H=19, W=21, K=5, padding=2))
    problem = cl.find_race(lambda: fn(x, w, y, stride=s, padding=p, **tunables), y)
    assert problem is None, problem
    cl.check(y, ref)
