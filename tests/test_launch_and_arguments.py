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


def test_a_module_keeps_one_kernel_object(features):
    mod = cl.load(features / "atomics_warp.cu")
    assert mod.kernel("scale_by_constant") is mod.kernel("scale_by_constant") is mod.scale_by_constant
    assert cl.load(features / "atomics_warp.cu") is mod          # the same text: the same module


def test_unusual_arguments_go_through_the_full_checks(scale):
    """numpy integers, a list grid, an int block: not the quick path, but accepted as before; the
    quick path then still checks every call (a wrong dtype after good calls is still refused)."""
    import numpy as np
    x, y = cl.randn(8), cl.empty(8)
    scale(x, y, np.int64(8), grid=[1], block=8)
    cl.sync()
    cl.check(y, x)
    scale(x, y, 8, grid=(1, 1, 1), block=(8, 1, 1))
    with pytest.raises(cl.ArgumentError, match="torch.float32"):
        scale(x.double(), y, 8, grid=(1, 1, 1), block=(8, 1, 1))
    with pytest.raises(cl.LaunchError, match="grid y = 65,536"):
        scale(x, y, 8, grid=(1, 65536, 1), block=(8, 1, 1))


def _conv_inputs():
    x, w = cl.randn(2, 3, 9, 11), cl.randn(4, 3, 3, 3)
    return x, w, cl.ref.conv2d(x, w, padding=1)


def _naive_from(monkeypatch, path):
    """Chapter 2's launchers, pointed at another copy of their .cu file."""
    from convlab.ops import naive
    monkeypatch.setattr(naive, "KERNEL_FILE", str(path))
    monkeypatch.setattr(naive, "_plans", {})
    return naive


def test_debug_poisons_what_launchers_allocate(tmp_path, monkeypatch):
    """A launcher whose kernel leaves an output unwritten fails cl.check under cl.debug (and on the
    emulator always): its new output was NaN, not whatever memory torch.empty handed out."""
    src = (cl.book.repo_root() / "kernels/02_naive/conv2d_naive.cu").read_text()
    broken = src.replace("        y[i] = acc;", "        if (i != total - 1) y[i] = acc;   // forgets the last one")
    assert broken != src
    (tmp_path / "conv2d_naive.cu").write_text(broken)
    naive = _naive_from(monkeypatch, tmp_path / "conv2d_naive.cu")
    x, w, ref = _conv_inputs()
    assert cl.poisoning() == (cl.backend() == "emu")
    with cl.debug():
        assert cl.poisoning()
        with pytest.raises(cl.CheckError, match="1 of 792 outputs were never written"):
            cl.check(naive.conv2d_naive_flat(x, w, padding=1), ref)
    assert cl.poisoning() == (cl.backend() == "emu")
    if cl.backend() == "emu":        # the students' checks run here: poisoned without asking
        with pytest.raises(cl.CheckError, match="never written"):
            cl.check(naive.conv2d_naive_flat(x, w, padding=1), ref)
    cl.debug(True)
    try:
        assert cl.poisoning()
    finally:
        cl.debug(False)
    assert cl.poisoning() == (cl.backend() == "emu")


def test_an_edited_kernel_file_recompiles_through_its_launcher(tmp_path, monkeypatch):
    """Launchers find their module again on every call: edit the .cu (as in a live notebook) and the
    next call runs the new code; put the old text back and the module compiled for it is used again."""
    from convlab.ops import _kernels
    path = tmp_path / "conv2d_naive.cu"
    src = (cl.book.repo_root() / "kernels/02_naive/conv2d_naive.cu").read_text()
    path.write_text(src)
    naive = _naive_from(monkeypatch, path)
    x, w, ref = _conv_inputs()
    cl.check(naive.conv2d_naive_flat(x, w, padding=1), ref)
    first = _kernels.module(str(path))
    path.write_text(src.replace("        y[i] = acc;", "        y[i] = 2.0f * acc;"))
    cl.check(naive.conv2d_naive_flat(x, w, padding=1), 2 * ref, name="the edited kernel")
    assert _kernels.module(str(path)) is not first
    path.write_text(src)
    cl.check(naive.conv2d_naive_flat(x, w, padding=1), ref, name="the first text again")
    assert _kernels.module(str(path)) is first


def test_the_gpu_launcher_packs_what_pycuda_needs():
    """The cuda backend's launch function with a stand-in for PyCUDA (no GPU needed): the struct
    format, the packed values (addresses, floats, half bits), the shared-memory opt-in set once."""
    import threading
    from convlab import _args, _source
    from convlab.backend_cuda import CudaBackend, CudaModule

    calls = []

    class Function:
        def prepare(self, fmt):
            self.fmt = fmt

        def prepared_call(self, grid, block, *args, shared_size=0):
            calls.append((grid, block, args, shared_size))

        def set_attribute(self, attr, value):
            calls.append((attr, value))

    class Driver:
        class Context:
            get_current = staticmethod(lambda: "the primary context")

        class function_attribute:
            MAX_DYNAMIC_SHARED_SIZE_BYTES = "max dynamic shared"

    f = Function()
    backend = object.__new__(CudaBackend)       # no GPU: only what a launch uses
    backend.drv, backend._threads, backend.max_shared_optin = Driver, threading.local(), 100_000
    src = _source.parse("__global__ void k(const float* x, half* y, int n, float a, half h) {}", "k.cu", [])
    params = src.kernels["k"].params
    mod = CudaModule(backend, type("Mod", (), {"get_function": lambda self, name: f})(), src)
    launch = mod.launcher("k", params, [_args.ctype_of(p, "k") for p in params])
    assert f.fmt == "PPifH"
    x, y = torch.ones(4), torch.ones(4, dtype=torch.float16)
    launch((x, y, 4, 2, 1.5), (3, 1, 1), (32, 1, 1), 0)
    assert calls[-1] == ((3, 1, 1), (32, 1, 1), (x.data_ptr(), y.data_ptr(), 4, 2.0, 0x3E00), 0)
    assert type(calls[-1][2][3]) is float
    launch((x, y, 4, 2.0, 1.5), (3, 1, 1), (32, 1, 1), 64 * 1024)
    launch((x, y, 4, 2.0, 1.5), (3, 1, 1), (32, 1, 1), 64 * 1024)
    assert [c for c in calls if c[0] == "max dynamic shared"] == [("max dynamic shared", 64 * 1024)]
    with pytest.raises(cl.LaunchError, match="opt-in maximum of 100,000"):
        launch((x, y, 4, 2.0, 1.5), (3, 1, 1), (32, 1, 1), 200_000)
