"""convlab.gpu.native: the C extension that calls cuLaunchKernel in one C call. No GPU needed: it is
handed the address of a C-callable stand-in with cuLaunchKernel's signature, which records what
arrives."""
import ctypes

import pytest

from convlab.gpu import native

LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p,
                          ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p))


def test_the_extension_passes_every_argument_and_returns_the_drivers_code():
    launch = native.fast_launch()
    if launch is None:
        pytest.skip(f"convlab.gpu.native cannot be built here: {native.why_not()}")
    seen = []

    def stand_in(func, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        seen.append((func, gx, gy, gz, bx, by, bz, shared, stream, ctypes.cast(params, ctypes.c_void_p).value,
                     bool(extra)))
        return 719                      # an error code, handed back as it is

    cb = LAUNCH(stand_in)
    address = ctypes.cast(cb, ctypes.c_void_p).value
    params = (ctypes.c_void_p * 2)(0x10, 0x20)
    big = 2**40 + 5                     # a function handle and a stream are 64-bit pointers
    err = launch(address, big, 70000, 2, 3, 256, 1, 1, 232448, big + 1, ctypes.addressof(params))
    assert err == 719
    assert seen == [(big, 70000, 2, 3, 256, 1, 1, 232448, big + 1, ctypes.addressof(params), False)]


def test_the_extension_refuses_what_is_not_eleven_ints():
    launch = native.fast_launch()
    if launch is None:
        pytest.skip(f"convlab.gpu.native cannot be built here: {native.why_not()}")
    with pytest.raises(TypeError, match="11 integer arguments"):
        launch(1, 2, 3)
    with pytest.raises(TypeError):
        launch(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, "eleven")
    with pytest.raises(OverflowError):
        launch(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, -1)


def test_the_ctypes_fallback_passes_the_same_arguments():
    """Where convlab.gpu.native cannot be built the driver launches through ctypes: the same eleven
    values must reach cuLaunchKernel (a stand-in with its C signature records them)."""
    from convlab.gpu.backend_cuda import Driver

    seen = []

    def stand_in(func, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        seen.append((func, gx, gy, gz, bx, by, bz, shared, stream, ctypes.cast(params, ctypes.c_void_p).value,
                     bool(extra)))
        return 0

    cb = LAUNCH(stand_in)
    # called as libcuda's is: a C function without argtypes, each argument as its ctypes object says
    c_function = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.cast(cb, ctypes.c_void_p).value)
    c_function.argtypes = None
    driver = object.__new__(Driver)                  # no libcuda: only the launch is used
    driver.lib = type("Lib", (), {"cuLaunchKernel": c_function})()
    params = (ctypes.c_void_p * 1)(0x10)
    big = 2**40 + 5
    args = (big, 70000, 2, 3, 256, 1, 1, 232448, big + 1, ctypes.addressof(params))
    assert driver._ctypes_launch(*args) == 0
    assert seen == [(*args, False)]


# ---- Route: a kept route's GPU work in one C call ------------------------------------------------

COPY = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_ulonglong, ctypes.c_ulonglong, ctypes.c_size_t, ctypes.c_void_p)
ENCODE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p,
                          ctypes.POINTER(ctypes.c_ulonglong), ctypes.POINTER(ctypes.c_ulonglong),
                          ctypes.POINTER(ctypes.c_uint), ctypes.POINTER(ctypes.c_uint), ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_int)


class Driver:
    """Stand-ins for cuLaunchKernel, cuMemcpyDtoDAsync and cuTensorMapEncodeTiled that record what a
    Route hands them: each launch's function, dims, stream and its argument buffer's words."""

    def __init__(self, nargs: int, err: int = 0):
        self.launches, self.copies, self.encodes, self.err = [], [], [], err

        def launch(func, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
            words = [ctypes.c_uint64.from_address(params[i]).value for i in range(nargs)]
            self.launches.append((func, (gx, gy, gz, bx, by, bz, shared), stream, words))
            return self.err

        def copy(dst, src, n, stream):
            self.copies.append((dst, src, n, stream))
            return 0

        def encode(out, dtype, rank, address, dims, strides, box, steps, interleave, swizzle, l2, fill):
            self.encodes.append((out % 64, dtype, rank, address, [dims[i] for i in range(rank)],
                                 [strides[i] for i in range(rank - 1)], [box[i] for i in range(rank)],
                                 [steps[i] for i in range(rank)], swizzle))
            ctypes.memset(out, 0xAB, 128)
            return 0
        self._keep = (LAUNCH(launch), COPY(copy), ENCODE(encode))
        self.addresses = tuple(ctypes.cast(f, ctypes.c_void_p).value for f in self._keep)


def _route(driver, expires=None, checks=None):
    """A Route of one launch (args: x, w, None; a (2, 3) output allocated), the argument buffer: x's
    address, w's plus 8 bytes, the output's, a scalar 77, a tensor map of w at 64 (element strides
    1 and 2: a strided layer's); then a copy of x into __constant__ memory at 0x1000."""
    import torch

    Route = native.route_type()
    buf = bytearray(192)
    buf[24:32] = (77).to_bytes(8, "little")
    offsets = (0, 8, 16, 24, 64)
    launch = (0, 0x5EED, (2, 1, 1, 128, 1, 1, 512), bytes(buf), offsets, ((0, 0, 0), (8, 1, 8), (16, 3, 0)),
              ((64, 1, 0, 6, 3, (8, 4), (16,), (8, 2), (1, 2)),))
    copy = (1, 0x1000, 64, 0, 0)
    checks = checks or ((0, (4, 1)), (0, (1,)), None)
    return Route(*driver.addresses, lambda: 42, lambda: True, checks, (lambda: torch.zeros(2, 3),), (launch, copy), 3,
                 native.now_ns() + 10**12 if expires is None else expires)


def _aligned(*shapes):
    import torch

    out = []
    for shape in shapes:
        t = torch.empty(int(torch.tensor(shape).prod()) + 16)
        skip = (-t.data_ptr() % 16) // 4
        out.append(t[skip:skip + int(torch.tensor(shape).prod())].view(shape))
    return out


def test_a_route_writes_the_calls_addresses_and_launches_in_one_call():
    if native.route_type() is None:
        pytest.skip(f"convlab.gpu.native cannot be built here: {native.why_not()}")
    d = Driver(5)
    r = _route(d)
    x, w = _aligned((3, 4), (8,))
    before = native.launched()
    y = r(x, w, None)
    assert tuple(y.shape) == (2, 3) and native.launched() == before + 1, "Routes count their launches"
    ((func, dims, stream, words),) = d.launches
    assert (func, dims, stream) == (0x5EED, (2, 1, 1, 128, 1, 1, 512), 42)
    assert words[:4] == [x.data_ptr(), w.data_ptr() + 8, y.data_ptr(), 77]
    assert words[4] == int.from_bytes(b"\xab" * 8, "little"), "the map encoded into its slot"
    assert d.encodes == [(0, 6, 2, w.data_ptr(), [8, 4], [16], [8, 2], [1, 2], 3)], "encoded with its element strides"
    assert d.copies == [(0x1000, x.data_ptr(), 64, 42)]
    x2, w2 = _aligned((3, 4), (8,))
    r(x2, w2, None)
    r(x2, w2, None)
    assert [e[3] for e in d.encodes] == [w.data_ptr(), w2.data_ptr()], "a map is encoded again only for a new address"
    assert d.launches[-1][3][:3] == [x2.data_ptr(), w2.data_ptr() + 8, d.launches[-1][3][2]]


def test_a_route_answers_notimplemented_where_a_call_is_not_as_recorded():
    import torch

    if native.route_type() is None:
        pytest.skip(f"convlab.gpu.native cannot be built here: {native.why_not()}")
    d = Driver(5)
    r = _route(d)
    x, w = _aligned((3, 4), (8,))
    assert r(x.t().contiguous().t(), w, None) is NotImplemented        # other strides
    assert r(x, torch.empty(9)[1:], None) is NotImplemented            # w's address 4 bytes past 16
    assert r(x, w, x) is NotImplemented                                # the output given
    assert r(x, None, None) is NotImplemented and r(x, w) is NotImplemented
    r.expires = native.now_ns() - 1
    assert r(x, w, None) is NotImplemented and not d.launches
    r.expires = native.now_ns() + 10**12
    assert r(x, w, None) is not NotImplemented and len(d.launches) == 1
    r.slow = "any attribute"                                            # a caller keeps what it needs on it
    assert r.slow == "any attribute"


def test_a_route_raises_the_drivers_error():
    if native.route_type() is None:
        pytest.skip(f"convlab.gpu.native cannot be built here: {native.why_not()}")
    r = _route(Driver(5, err=700))
    x, w = _aligned((3, 4), (8,))
    with pytest.raises(RuntimeError, match="CUDA error 700"):
        r(x, w, None)


def test_a_route_refuses_a_malformed_recording():
    if native.route_type() is None:
        pytest.skip(f"convlab.gpu.native cannot be built here: {native.why_not()}")
    Route, d = native.route_type(), Driver(1)
    with pytest.raises(ValueError):      # a step reads argument 1, which must be None
        Route(*d.addresses, lambda: 0, lambda: True, ((0, (1,)), None), (lambda: None,),
              ((0, 1, (1,) * 7, bytes(8), (0,), ((0, 1, 0),), ()),), 2, 0)
    with pytest.raises(ValueError):      # the result must be an allocation
        Route(*d.addresses, lambda: 0, lambda: True, ((0, (1,)),), (), (), 0, 0)

    def with_steps(steps):
        return Route(*d.addresses, lambda: 0, lambda: True, ((0, (1,)),), (lambda: None,),
                     ((0, 1, (1,) * 7, bytes(192), (0,), (), ((64, 0, 0, 6, 3, (8, 4), (16,), (8, 2), steps),)),), 1, 0)
    with_steps((1, 8))
    for steps in ((1,), (1, 9), (0, 1)):    # a map's element strides: one per dimension, 1 to 8
        with pytest.raises(ValueError):
            with_steps(steps)


def test_the_gpu_backend_records_a_calls_launches_as_the_driver_gets_them():
    """CudaBackend.record on the cuda backend's launch path with a stand-in driver (no GPU): a kept
    launch and a full one, each as its function, dims, argument buffer (the words the driver reads)
    and the tensors its pointers came from; another thread's launches, and launches after, not."""
    import threading

    import torch
    from test_launch_and_arguments import _OnGpu, _stand_in_cuda_module

    from convlab.gpu import _args, backend_cuda

    source = "__global__ void k(const float* x, float* y, int n, float a) {}"
    launches, attributes, streams = [], [], {}
    mod, params = _stand_in_cuda_module(source, "k", launches, attributes, streams)
    launcher = mod.launcher("k", params, [_args.ctype_of(p, "k") for p in params])
    bound = launcher.bind((7, 0.5), (2, 3, 1), (64, 1, 1), 0, None)
    x, y = torch.ones(4).as_subclass(_OnGpu), torch.ones(8).as_subclass(_OnGpu)

    def call():
        bound((x, y))
        launcher((y, x, 9, 1.5), (1, 1, 1), (32, 1, 1), 0)
        t = threading.Thread(target=lambda: (streams.__setitem__(threading.get_ident(), 1), bound((y, y))))
        t.start()
        t.join()
        return "done"
    out, rec = backend_cuda.CudaBackend.record(mod.backend, call)
    assert out == "done" and rec.why is None and len(launches) == 3
    assert [s[0] for s in rec.steps] == ["launch", "launch"], "only the recording thread's launches"
    for step, (func, grid, block, shared, _, words) in zip(rec.steps, launches):
        _, f, dims, buf, offsets, pointers, maps = step
        assert (f, dims) == (func, (*grid, *block, shared)) and maps == []
        assert [t for _, t in pointers] == ([x, y] if step is rec.steps[0] else [y, x])
        assert [int.from_bytes(buf[o:o + 8], "little") for o, _ in pointers] == words[:2]
        assert int.from_bytes(buf[offsets[2]:offsets[2] + 4], "little", signed=True) == words[2]
    bound((x, y))
    assert len(rec.steps) == 2 and backend_cuda._recording is None
