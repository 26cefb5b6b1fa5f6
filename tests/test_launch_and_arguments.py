"""Launch limits and argument checks: the same on both backends, so a student gets the same
message whether or not a GPU is there."""
import pytest
import torch

import convlab as cl


@pytest.fixture
def scale(features):
    mod = cl.load(features / "atomics_warp.cu")
    mod.set_constant("c_scale", torch.ones(4))
    return mod.kernel("scale_by_constant")


@pytest.mark.parametrize("grid, block, shared, words", [
    (1, 1025, 0, "1025 threads is over the 1024"),
    ((1, 65536), 32, 0, "grid y = 65,536 is over the limit of 65,535"),
    ((1, 1, 70000), 32, 0, "grid z = 70,000"),
    (1, 32, 48 * 1024 + 4, "over the 49,152 a launch may use without opting in"),
    (0, 32, 0, "zero or negative dimension"),
    ((4, 0), 32, 0, "zero or negative dimension"),
    (1, (1, 1, 65), 0, "per-dimension limits"),
])
def test_launch_over_the_limits(scale, grid, block, shared, words):
    with pytest.raises(cl.LaunchError) as e:
        scale(cl.randn(8), cl.empty(8), 8, grid=grid, block=block, shared=shared)
    assert words in str(e.value)


def test_wrong_dtype(scale):
    with pytest.raises(cl.ArgumentError) as e:
        scale(cl.randn(8, dtype=torch.float64), cl.empty(8), 8, grid=1, block=8)
    assert "`x`" in str(e.value) and "torch.float32" in str(e.value) and "x.float()" in str(e.value)


def test_python_float_for_int(scale):
    with pytest.raises(cl.ArgumentError) as e:
        scale(cl.randn(8), cl.empty(8), 8.0, grid=1, block=8)
    assert "`n`" in str(e.value) and "pass an int" in str(e.value)


def test_wrong_number_of_arguments(scale):
    with pytest.raises(cl.ArgumentError) as e:
        scale(cl.randn(8), cl.empty(8), grid=1, block=8)
    assert "takes 3 arguments" in str(e.value) and "int n" in str(e.value)


def test_scalar_for_pointer_and_tensor_for_scalar(scale):
    with pytest.raises(cl.ArgumentError, match="needs a tensor"):
        scale(3, cl.empty(8), 8, grid=1, block=8)
    with pytest.raises(cl.ArgumentError, match="is a scalar"):
        scale(cl.randn(8), cl.empty(8), cl.randn(1), grid=1, block=8)


def test_non_contiguous_and_wrong_device(scale):
    with pytest.raises(cl.ArgumentError, match="contiguous"):
        scale(cl.randn(8, 2).t(), cl.empty(16), 16, grid=1, block=16)
    other = "cpu" if cl.device().is_gpu else "meta"
    with pytest.raises(cl.ArgumentError, match="on '"):
        scale(torch.empty(8, device=other), cl.empty(8), 8, grid=1, block=8)


def test_unknown_kernel_and_constant(features):
    mod = cl.load(features / "atomics_warp.cu")
    with pytest.raises(cl.ArgumentError, match="no __global__ function `nope`"):
        mod.kernel("nope")
    with pytest.raises(cl.ArgumentError, match="no __constant__ `c_nope`"):
        mod.set_constant("c_nope", torch.ones(1))


def test_int_out_of_range(scale):
    with pytest.raises(cl.ArgumentError, match="does not fit"):
        scale(cl.randn(8), cl.empty(8), 2**31, grid=1, block=8)


def test_device_and_backend_forcing(monkeypatch):
    d = cl.device()
    assert d.backend in ("emu", "cuda") and str(d)
    if d.backend == "emu":
        assert "CPU emulator" in str(d)


def test_forcing_cuda_without_gpu_says_why(monkeypatch):
    from convlab import backend_cuda
    if backend_cuda._why_not() is None:
        pytest.skip("a GPU is here")
    with pytest.raises(cl.BackendUnavailable) as e:
        backend_cuda.CudaBackend()
    assert "cannot run here" in str(e.value)


def test_launch_from_another_thread(features):
    # torch runs autograd's backward on a thread of its own: a launch from there must work
    import threading
    mod = cl.load(features / "atomics_warp.cu")
    x, y = cl.randn(64), cl.empty(64)
    errors = []

    def work():
        try:
            mod.set_constant("c_scale", torch.ones(4))
            mod.scale_by_constant(x, y, 64, grid=1, block=64)
            cl.sync()
        except Exception as e:   # noqa: BLE001 - reported below
            errors.append(e)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert not errors, errors
    cl.check(y, x)
