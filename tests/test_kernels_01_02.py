"""Every kernel of chapters 1 and 2 against the fp64 reference, on the active backend.

Outputs are poisoned with NaN first (cl.empty), inputs are fresh random numbers each run, and the
shapes are awkward: sizes no multiple of a block, C=1, B=1, odd and even K, stride 2, padding.
"""
import pytest
import torch

import convlab as cl
from convlab.gpu import _limits
from convlab.measuring import workloads
from convlab.ops import naive
from convlab.teach.checks import AWKWARD_SHAPES, VALID_SHAPES

MORE_SHAPES = [
    # a block's worth plus one, wide masks, more channels
    dict(B=1, C=1, M=1, H=17, W=17, K=1),
    dict(B=2, C=5, M=3, H=33, W=9, K=7),
    dict(B=1, C=2, M=2, H=7, W=7, K=7, padding=3),
    dict(B=2, C=3, M=2, H=19, W=22, K=3, stride=3, padding=1),
]


def _ascii(shape) -> str:
    return str(shape).replace("×", "x")


def _cases():
    for s in AWKWARD_SHAPES:
        yield pytest.param(dict(B=s.B, C=s.C, M=s.M, H=s.H, W=s.W, K=s.K, stride=s.stride, padding=s.padding), id=_ascii(s))
    for d in MORE_SHAPES:
        yield pytest.param(d, id=" ".join(f"{k}={v}" for k, v in d.items()))


def _inputs(B, C, M, H, W, K, stride=1, padding=0):
    x, w = cl.randn(B, C, H, W), cl.randn(M, C, K, K)
    assert not torch.all(x == 0)  # never zeros: a kernel that writes 0 must not pass
    return x, w, cl.ref.conv2d(x, w, stride=stride, padding=padding)


@pytest.fixture(scope="module")
def conv2d_cpu():
    return cl.load_cpu("kernels/01_sequential/conv2d_cpu.cpp").function("conv2d_cpu")


@pytest.mark.parametrize("shape", [
    pytest.param(dict(B=s.B, C=s.C, M=s.M, H=s.H, W=s.W, K=s.K, stride=s.stride), id=_ascii(s)) for s in VALID_SHAPES
] + [pytest.param(dict(B=2, C=5, M=3, H=33, W=9, K=7, stride=3), id="stride 3")])
def test_chapter1_cpu_loop_nest(conv2d_cpu, shape):
    x, w, ref = _inputs(**shape)
    x, w = x.cpu(), w.cpu()
    B, C, M, H, W, K, stride = (shape[k] for k in "B C M H W K stride".split())
    y = torch.full(tuple(ref.shape), float("nan"))
    conv2d_cpu(x, w, y, B, C, M, H, W, K, stride)
    cl.check(y, ref)


@pytest.mark.parametrize("shape", list(_cases()))
@pytest.mark.parametrize("impl", naive.IMPLEMENTATIONS, ids=lambda i: i.name)
def test_chapter2_naive_kernels(impl, shape):
    x, w, ref = _inputs(**shape)
    y = impl(x, w, stride=shape.get("stride", 1), padding=shape.get("padding", 0))
    cl.check(y, ref, name=impl.name)


@pytest.mark.parametrize("max_blocks", [1, 3])
def test_flat_kernel_grid_stride_loop_covers_every_output(max_blocks):
    x, w, ref = _inputs(B=2, C=2, M=3, H=21, W=15, K=5, stride=2, padding=2)
    y = naive.conv2d_naive_flat(x, w, stride=2, padding=2, block=64, max_blocks=max_blocks)
    cl.check(y, ref)


def test_flat_kernel_at_a_small_workload():
    wl = workloads.get("fa17").small()
    x, w, ref = _inputs(wl.B, wl.C, wl.M, wl.H, wl.W, wl.K, wl.stride, wl.padding)
    cl.check(naive.conv2d_naive_flat(x, w, stride=wl.stride, padding=wl.padding), ref)


def test_z_mapping_cannot_launch_past_65535():
    B, M = 1024, 65  # B·M = 66,560, tiny images: the launch is refused before anything runs
    assert B * M > _limits.GRID_YZ_MAX
    x, w = cl.randn(B, 1, 3, 3), cl.randn(M, 1, 3, 3)
    with pytest.raises(cl.LaunchError, match="65,?535"):
        naive.conv2d_naive_z(x, w)
    # the backend is still fine afterwards, and the flat and textbook maps launch the same problem
    cl.check(naive.conv2d_naive_flat(x, w), cl.ref.conv2d(x, w))
    cl.check(naive.conv2d_naive_textbook(x, w), cl.ref.conv2d(x, w), name="textbook map, B·M = 66,560")


def test_textbook_mapping_covers_every_tile():
    # 3 x 4 tiles of 8 x 4: a tile's first row is its row of tiles times the tile height (the
    # textbook's formula without that factor would leave rows 2.. of the output unwritten)
    x, w, ref = _inputs(B=3, C=2, M=2, H=14, W=19, K=3, stride=1, padding=1)
    assert naive.grid_textbook(3, 2, 14, 19, block=(8, 4)) == ((3, 2, 3 * 4), (8, 4, 1))
    cl.check(naive.conv2d_naive_textbook(x, w, padding=1, block=(8, 4)), ref)


def test_z_mapping_at_the_limit_launches():
    B, M = 65_535, 1
    x, w = cl.randn(B, 1, 2, 2), cl.randn(M, 1, 2, 2)
    cl.check(naive.conv2d_naive_z(x, w), cl.ref.conv2d(x, w))


def test_grids():
    assert naive.grid_z(B=10_000, M=50, Ho=24, Wo=24) == ((2, 2, 500_000), (16, 16, 1))
    assert naive.grid_flat(1000, 256) == ((4, 1, 1), (256, 1, 1))
    assert naive.grid_flat(1000, 256, max_blocks=2) == ((2, 1, 1), (256, 1, 1))


def test_launchers_refuse_shapes_that_do_not_fit():
    with pytest.raises(ValueError, match="does not fit"):
        naive.conv2d_naive_flat(cl.randn(1, 2, 8, 8), cl.randn(1, 3, 3, 3))
    with pytest.raises(ValueError, match="no output"):
        naive.conv2d_naive_flat(cl.randn(1, 1, 2, 2), cl.randn(1, 1, 3, 3))
    with pytest.raises(ValueError, match="shape"):
        naive.conv2d_naive_flat(cl.randn(1, 1, 8, 8), cl.randn(1, 1, 3, 3), cl.empty(1, 1, 5, 5))


def test_pick_and_implementations():
    from convlab.measuring.workloads import Workload
    assert naive.pick(workloads.get("fa17")) is naive.NAIVE_FLAT
    assert not naive.NAIVE_Z.applies(workloads.get("fa17")) and naive.NAIVE_Z.applies(workloads.get("lenet_c1"))
    assert [i.name for i in naive.IMPLEMENTATIONS] == ["naive z (B·M on grid z)", "naive flat (1D grid)",
                                                        "naive textbook (B, M, tiles)"]
    assert naive.NAIVE_TEXTBOOK.applies(workloads.get("fa17"))
    x, w = cl.randn(2, 3, 9, 8), cl.randn(4, 3, 3, 3)
    best = naive.pick(Workload.of(x, w, padding=1))
    cl.check(best(x, w, padding=1), cl.ref.conv2d(x, w, padding=1), name=best.name)
