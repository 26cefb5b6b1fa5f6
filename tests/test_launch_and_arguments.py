"""Launch limits and argument checks: the same on both backends, so a student gets the same
message whether or not a GPU is there."""
import time

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
    from convlab.gpu import backend_cuda
    if backend_cuda.why_not() is None:
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
    time.sleep(_kernels.LOOK_EVERY_NS / 1e9)      # a person's edit comes later than a launcher's next look
    cl.check(naive.conv2d_naive_flat(x, w, padding=1), 2 * ref, name="the edited kernel")
    assert _kernels.module(str(path)) is not first
    path.write_text(src)
    time.sleep(_kernels.LOOK_EVERY_NS / 1e9)
    cl.check(naive.conv2d_naive_flat(x, w, padding=1), ref, name="the first text again")
    assert _kernels.module(str(path)) is first


class _OnGpu(torch.Tensor):
    """A CPU tensor that says it is on the GPU: what the cuda backend's launch path checks, with no GPU."""
    is_cuda = True


def _stand_in_cuda_module(source, kernel, launches, attributes, streams):
    """A CudaModule on a stand-in for the CUDA driver (no GPU): cuLaunchKernel reads every argument
    back from the void** array, by the parameter's type, as the driver would."""
    import ctypes
    import threading
    from convlab.gpu import _source
    from convlab.gpu.backend_cuda import CudaBackend, CudaModule

    src = _source.parse(source, "k.cu", [])
    params = src.kernels[kernel].params
    read = {"float": ctypes.c_float, "double": ctypes.c_double, "half": ctypes.c_uint16, "int": ctypes.c_int32,
            "unsigned int": ctypes.c_uint32, "long long": ctypes.c_int64, "bool": ctypes.c_bool,
            "short": ctypes.c_int16, "char": ctypes.c_int8, "size_t": ctypes.c_uint64}

    class Driver:
        def function(self, module, name):
            return 0xF00

        def set_attribute(self, func, attr, value):
            attributes.append((func, attr, value))

        def make_current(self, context):
            pass

        def launch(self, func, gx, gy, gz, bx, by, bz, shared, stream, address):
            args = (ctypes.c_void_p * len(params)).from_address(address)
            values = [ctypes.c_uint64.from_address(args[i]).value if p.pointer
                      else read[p.base].from_address(args[i]).value for i, p in enumerate(params)]
            launches.append((func, (gx, gy, gz), (bx, by, bz), shared, stream, values))
            return 0

    backend = object.__new__(CudaBackend)       # no GPU: only what a launch uses
    backend.cu, backend._threads = Driver(), threading.local()
    backend.ctx = type("Ctx", (), {"handle": 0xC0})()
    backend.max_shared_optin, backend._streams = 100_000, {}
    backend.raw_stream = lambda: streams[threading.get_ident()]    # torch's current stream, per thread
    streams[threading.get_ident()] = 0x5EED
    return CudaModule(backend, 0x40D, src), params


def test_the_gpu_launch_passes_every_kind_of_argument():
    """The cuda backend's launch with a stand-in driver (no GPU needed): pointers as addresses,
    each scalar type in its own size (an int for a float parameter as a float, a half as its 16
    bits), torch's current stream of the launching thread, the shared-memory opt-in set once."""
    from convlab.gpu import _args

    source = ("__global__ void k(const float* x, half* y, int n, float a, half h, double d, unsigned int u, "
              "long long q, bool b, short s, char c, size_t z) {}")
    launches, attributes, streams = [], [], {}
    mod, params = _stand_in_cuda_module(source, "k", launches, attributes, streams)
    launch = mod.launcher("k", params, [_args.ctype_of(p, "k") for p in params])
    x, y = torch.ones(4), torch.ones(4, dtype=torch.float16)
    scalars = [-4, 2, 1.5, 0.1, 2**32 - 1, -(2**40), True, -300, -7, 2**63 + 5]
    launch((x, y, *scalars), (3, 1, 1), (32, 1, 1), 0)
    func, grid, block, shared, stream, values = launches[-1]
    assert (func, grid, block, shared, stream) == (0xF00, (3, 1, 1), (32, 1, 1), 0, 0x5EED)
    assert values[:2] == [x.data_ptr(), y.data_ptr()]
    assert values[2:] == [-4, 2.0, 0x3E00, 0.1, 2**32 - 1, -(2**40), True, -300, -7, 2**63 + 5]
    launch((x, y, *scalars), (3, 1, 1), (32, 1, 1), 64 * 1024)
    launch((x, y, *scalars), (3, 1, 1), (32, 1, 1), 64 * 1024)
    assert [a[2] for a in attributes] == [64 * 1024]
    with pytest.raises(cl.LaunchError, match="opt-in maximum of 100,000"):
        launch((x, y, *scalars), (3, 1, 1), (32, 1, 1), 200_000)


def test_a_bound_gpu_launch_packs_its_scalars_once_and_checks_each_tensor():
    """A launcher's kept launch on the cuda backend (stand-in driver): the scalars packed at bind,
    each call's tensors written in, another thread with its own buffer and its own current stream,
    and a tensor the kernel cannot take sent to the full checks."""
    import threading
    from convlab.gpu import _args

    source = "__global__ void k(const float* x, float* y, int n, float a, half h) {}"
    launches, attributes, streams = [], [], {}
    mod, params = _stand_in_cuda_module(source, "k", launches, attributes, streams)
    slow = []
    bound = mod.launcher("k", params, [_args.ctype_of(p, "k") for p in params]).bind(
        (7, 0.5, 1.5), (2, 3, 1), (64, 1, 1), 0, slow.append)
    x, y = torch.ones(4).as_subclass(_OnGpu), torch.ones(8).as_subclass(_OnGpu)
    bound((x, y))
    bound((y, x))
    assert [v for *_, v in launches] == [[x.data_ptr(), y.data_ptr(), 7, 0.5, 0x3E00],
                                            [y.data_ptr(), x.data_ptr(), 7, 0.5, 0x3E00]]
    assert launches[-1][1:5] == ((2, 3, 1), (64, 1, 1), 0, 0x5EED)

    def other_thread():
        streams[threading.get_ident()] = 0xBEEF
        bound((x, x))
    t = threading.Thread(target=other_thread)
    t.start()
    t.join()
    assert launches[-1][4] == 0xBEEF and launches[-1][5] == [x.data_ptr(), x.data_ptr(), 7, 0.5, 0x3E00]
    n = len(launches)
    transposed = torch.ones(4, 2).as_subclass(_OnGpu).t()
    for wrong in ((x.double().as_subclass(_OnGpu), y), (torch.ones(4), y), (x, transposed), (x, 3), (x,)):
        bound(wrong)
        assert slow[-1] is wrong
    assert len(launches) == n and len(slow) == 5


def test_a_constant_mask_follows_every_change_of_the_weights():
    """The launchers that put the mask in __constant__ memory upload it on every launch: a change
    through w.data (which torch's version counter does not see) or by a kernel of ours shows in the
    next result, as it does with torch's conv."""
    import torch.nn.functional as F

    from convlab.ops import conv3d, fused, layers, tiled

    x, w = cl.randn(1, 2, 12, 12), cl.randn(3, 2, 3, 3)
    x3, w3 = cl.randn(1, 1, 6, 8, 8), cl.randn(1, 1, 3, 3, 3)
    b = cl.randn(3)
    calls = {
        "tiled, constant mask": (lambda: tiled.conv2d_tiled_halo_multi_pass(x, w, padding=1, mask="constant"),
                                 lambda: F.conv2d(x.double(), w.double(), padding=1), w),
        "direct, coarsened": (lambda: fused.conv2d_direct_coarse(x, w, padding=1),
                              lambda: F.conv2d(x.double(), w.double(), padding=1), w),
        "conv3d best": (lambda: conv3d.conv3d_best(x3, w3), lambda: F.conv3d(x3.double(), w3.double()), w3),
        "fused stage": (lambda: layers.conv2d_bias_act_pool(x, w, padding=1, bias=b),
                        lambda: F.max_pool2d(torch.relu(F.conv2d(x.double(), w.double(), b.double(), padding=1)), 2),
                        w),
    }
    for name, (ours, ref, weights) in calls.items():
        cl.check(ours(), ref(), name=name)
        weights.data.mul_(-0.5)                        # invisible to weights._version
        cl.check(ours(), ref(), name=f"{name}, after w.data changed")
        zero = torch.zeros_like(weights)
        layers.sgd_momentum(weights, torch.ones_like(weights), zero, lr=0.25, momentum=0.0)   # a kernel of ours
        cl.check(ours(), ref(), name=f"{name}, after a kernel changed w")


STATIC_SHARED = r"""
__global__ void big(float* out, int n) {
    __shared__ float tile[8192];                 // 32 KB of static shared memory
    extern __shared__ float dyn[];
    tile[threadIdx.x] = 1.0f;
    dyn[threadIdx.x] = 2.0f;
    __syncthreads();
    out[threadIdx.x] = tile[threadIdx.x] + dyn[(threadIdx.x + 1) % blockDim.x] + n;
}
"""


@pytest.mark.emu_only
def test_static_and_dynamic_shared_memory_count_together_against_the_launchs_limit():
    """A GPU refuses a launch whose __shared__ arrays and dynamic bytes together pass 48 KB (or the
    opt-in): the emulator, which learns the arrays' sizes as the block opens them, refuses it too."""
    k = cl.load_source(STATIC_SHARED, "static_shared").kernel("big")
    out = cl.empty(64)
    k(out, 0, grid=1, block=64, shared=8192)                        # 32 KB + 8 KB: fits in 48 KB
    assert out.tolist() == [3.0] * 64
    with pytest.raises(cl.LaunchError, match="52768 bytes of shared memory") as e:
        k(out, 0, grid=1, block=64, shared=20000)                   # 32 KB + 20,000 bytes: over 48 KB
    assert "__shared__ tile 32768" in str(e.value) and "max_shared" in str(e.value)
    k(out, 0, grid=1, block=64, shared=20000, max_shared=65536)     # opted in: fits
    assert out.tolist() == [3.0] * 64
