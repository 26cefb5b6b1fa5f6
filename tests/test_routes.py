"""Every route the drop-in runs adds no work to its kernel's: for each record a rule names
(dispatch.routed(), found from dispatch.registered()), its route on a small layer launches the
kernel's own launches, allocates the kernel's outputs and workspaces, and has torch do nothing
else where x (dy) comes in a layout the record says the kernel reads; from the other layout, the
conversions the record implies (x in, y out) and nothing more. Counted per call on the active
backend: our launches (convlab.measuring.bench.count_launches) and every aten op that is not a view
(convlab.measuring.bench.Work: allocations, and torch's passes over memory by name). Then the drop-in as a
user calls it: a channels_last fp16 or bf16 layer launches only its kernels, forward and backward.

The routes' results against fp64 are checked here too, for every routed record in both layouts."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import convlab as cl
from convlab.measuring.bench import work_of
from convlab.measuring.workloads import Workload
from convlab.ops import FORMATS, dispatch, dropin, wgmma
from convlab.ops.shapes import DTYPE
from convlab.ops.tf32 import check_tf32

#: The layers a record's route is counted on: the first one it takes.
POOL = (
    Workload("plain", B=2, C=16, M=16, H=6, W=5, K=3, padding=1),
    Workload("one_channel", B=2, C=1, M=4, H=6, W=5, K=3, padding=1),
    Workload("rgb", B=2, C=3, M=8, H=6, W=5, K=3, padding=1),
    Workload("depthwise", B=2, C=8, M=8, H=6, W=5, K=3, padding=1, groups=8),
)

#: Per routed record, on its POOL layer: (launches, allocations, torch's ops from NCHW x (dy),
#: torch's ops from channels_last x (dy)), w in x's layout. What the ops are:
#: - "add_": the bias added by torch after a kernel without a bias epilogue (forward only);
#: - "clone": a conversion of layout: of x (dy, and x for dW) to the one the kernel reads, of w to
#:   NCHW for a kernel that reads NCHW (the NHWC kernels reorder an NCHW w themselves: one clone),
#:   of y back to x's layout;
#: - the kernels' own: chapter 9's dX of a depthwise layer flips its mask ("flip"); mma.sync's dX
#:   flips and reorders its mask ("flip", "clone"); the fp32 implicit GEMM's dW copies dy into
#:   its K-major mask ("copy_") and zeroes that mask's padding ("zero_" twice).
#: Allocations: the output and any workspace (split-K partials, a reordered mask).
EXPECTED = {
    "dx_gather": (1, 1, (), ("clone", "clone")),
    "dx_forward": (2, 2, (), ("clone", "clone")),
    "dw_direct": (1, 1, (), ("clone", "clone")),
    "dw_gemm": (1, 1, (), ("clone", "clone")),
    "depthwise": (1, 1, (), ("clone",)),                 # C=1: x is both layouts; y converted back
    "depthwise_fp16": (1, 1, (), ("clone",)),
    "depthwise_nhwc": (1, 1, ("clone", "clone"), ()),
    "depthwise_nhwc_fp16": (1, 1, ("clone", "clone"), ()),
    "depthwise_dx": (1, 1, ("flip",), ("clone", "flip")),
    "half": (1, 1, ("add_",), ("clone", "clone", "add_", "clone")),
    "half2": (1, 1, ("add_",), ("clone", "clone", "add_", "clone")),
    "wmma": (2, 2, ("add_",), ("clone", "clone", "add_", "clone")),
    "wmma_smallc": (2, 2, ("add_",), ("add_", "clone")),  # C=1: x and w are both layouts
    "direct_regtile": (1, 1, ("add_",), ("clone", "clone", "add_", "clone")),
    "general": (1, 1, (), ("clone", "clone", "clone")),
    "general_fp16": (1, 1, (), ("clone", "clone", "clone")),
    "general_dx": (1, 1, (), ("clone", "clone")),
    "general_dw": (2, 2, (), ("clone", "clone")),
    "igemm_f32": (3, 3, (), ("clone", "clone", "clone")),
    "igemm_f32_dx": (3, 3, (), ("clone", "clone")),
    "igemm_f32_dw": (2, 3, ("zero_", "zero_", "copy_"), ("clone", "clone", "zero_", "zero_", "copy_")),
    "mma": (1, 1, ("clone", "clone", "clone"), ()),
    "mma_dx": (1, 1, ("clone", "flip", "clone"), ("flip", "clone")),
    "mma_dw": (2, 2, ("clone", "clone"), ()),
    "wgmma": (1, 1, ("clone", "clone", "clone"), ()),
    # The Hopper layers' kernels: this small layer's few tiles are split over K (SPLIT_K > 1: fp32
    # partials, a workspace, and the kernel that sums them: a second launch), but dW's; from NCHW the
    # route converts x (dy) and the result, and the launcher copies w (dW: x and dy) to NHWC.
    "hopper": (2, 2, ("clone", "clone", "clone"), ()),
    "hopper_bf16": (2, 2, ("clone", "clone", "clone"), ()),
    "hopper_dx": (2, 2, ("clone", "clone"), ()),
    "hopper_dx_bf16": (2, 2, ("clone", "clone"), ()),
    "hopper_dw": (1, 1, ("clone", "clone"), ()),
    "hopper_dw_bf16": (1, 1, ("clone", "clone"), ()),
    # TF32 (precision= or torch's switches): y NCHW. mma.sync reads x channels_last as it lies (C % 4 == 0)
    # and lays out the mask in its own pass (a launch and an allocation); wgmma's pass rounds (TF32) or
    # splits (3xTF32: hi and lo, two allocations each) x and the mask, from either layout, and this small
    # layer's few tiles get split-K partials and their sum (a launch and an allocation).
    "tf32_mma": (2, 2, ("clone",), ("clone",)),
    "tf32x3_mma": (2, 2, ("clone",), ("clone",)),
    "tf32_wgmma": (4, 4, (), ("clone",)),
    "tf32x3_wgmma": (4, 6, (), ("clone",)),
}


def _layer(impl):
    s = next((s for s in POOL if impl.takes(s)), None)
    assert s is not None, f"{impl.key}: no layer of POOL that it takes: add one"
    return s


def _tensors(s: Workload, dtype: str, layout: str):
    fmt, t = FORMATS[layout], DTYPE[dtype]
    x, w, dy = (cl.randn(*shape, dtype=t).contiguous(memory_format=fmt) for shape in (s.x_shape, s.w_shape, s.y_shape))
    return x, w, dy, cl.randn(s.M, dtype=t)


def _route(impl, s: Workload, layout: str, x, w, dy, b):
    """The route's one call, as fn() with no arguments."""
    direction = dispatch.direction_of(impl)
    if direction == "forward":
        run = dispatch.forward_runner(impl, s, layout, bias=True)
        return lambda: run(x, w, None, b)
    run = dispatch.grad_runner(impl, s, direction)
    return (lambda: run(dy, w, None)) if direction == "dX" else (lambda: run(x, dy, None))


@pytest.mark.parametrize("impl", dispatch.routed(), ids=lambda i: i.key)
def test_a_route_adds_no_work_to_its_kernels(impl):
    s = _layer(impl)
    measured = {}
    for layout in dispatch.LAYOUTS:
        x, w, dy, b = _tensors(s, impl.dtypes[0], layout)
        measured[layout] = work_of(_route(impl, s, layout, x, w, dy, b), run=False)
    got = (measured["nchw"].launches, measured["nchw"].allocations, measured["nchw"].ops, measured["channels_last"].ops)
    assert impl.key in EXPECTED, f"{impl.key} has no row in EXPECTED: measured {got}; check it and add it"
    assert got == EXPECTED[impl.key], (f"{impl.key} on {s}: {got}, expected {EXPECTED[impl.key]} (launches, "
                                       "allocations, torch's ops from NCHW, from channels_last): a route that copies "
                                       "what its kernel reads, or a launcher's new work")
    # a conversion is never a kernel of ours, nor a tensor the route keeps
    assert measured["channels_last"].launches == measured["nchw"].launches
    assert measured["channels_last"].allocations == measured["nchw"].allocations
    if dispatch.direction_of(impl) == "forward":
        assert measured["nchw"].ops.count("add_") == (not impl.bias), "the bias: in the epilogue, or one add"


@pytest.mark.parametrize("impl", dispatch.routed(), ids=lambda i: i.key)
def test_a_route_gives_the_fp64_result_from_either_layout(impl):
    s = _layer(impl)
    direction = dispatch.direction_of(impl)
    for dtype in impl.dtypes:
        for layout in dispatch.LAYOUTS:
            x, w, dy, b = _tensors(s, dtype, layout)
            with cl.debug():
                out = _route(impl, s, layout, x, w, dy, b)()
            xd, wd, bd = (t.detach().double().cpu().requires_grad_() for t in (x, w, b))
            ref = F.conv2d(xd, wd, bd if direction == "forward" else None, **s.conv_kwargs())
            if direction == "forward":
                assert out.is_contiguous(memory_format=FORMATS[layout]), "y comes back in x's layout"
                want, n = ref.detach(), s.reduction + 1
            else:
                (want,) = torch.autograd.grad(ref, xd if direction == "dX" else wd, dy.double().cpu())
                n = s.M // s.groups * s.K * s.Kw if direction == "dX" else s.B * s.Ho * s.Wo
            name = f"{impl.key} {direction} {dtype} from {layout} on {s}"
            if impl.precision:                  # TF32 or 3xTF32 products: the bound derived for them
                check_tf32(out, want, s, impl, name=name)
            elif dtype == "fp32":
                cl.check(out, want, name=name)
            elif direction == "forward":
                dispatch.check_fp16_forward(out, want, s.x_shape, s.w_shape, b, **s.conv_kwargs(), name=name,
                                            dtype=dtype, layout=layout, impl=impl)
            else:
                rtol, atol_rms = dispatch.tolerance(n, impl.accumulation, dtype)
                cl.check(out, want, rtol=rtol, atol=atol_rms * float(want.pow(2).mean().sqrt()), name=name)


# ---- the drop-in, as a user calls it --------------------------------------------------------------

#: A strided ResNet layer with tiles enough for the SMs (no split over K): the Hopper kernel's one launch
RESNET_S2 = Workload("3x3 s2", B=32, C=64, M=64, H=56, W=56, K=3, stride=2, padding=1)

#: channels_last 16-bit layers, each with the kernel the rules give it (on an H100/H200 or the
#: emulator) and its launches; the drop-in allocates only the output
CHANNELS_LAST_16BIT = (
    (Workload("3x3", B=2, C=16, M=16, H=6, W=5, K=3, padding=1), "fp16", "wgmma", 1),
    (Workload("1x1 from 64", B=2, C=64, M=32, H=4, W=3, K=1), "fp16", "mma", 1),
    (Workload("depthwise", B=2, C=8, M=8, H=6, W=5, K=3, padding=1, groups=8), "fp16", "depthwise_nhwc_fp16", 1),
    (RESNET_S2, "fp16", "hopper", 1),
    (RESNET_S2, "bf16", "hopper_bf16", 1),
    (Workload("1x1 from 256", B=32, C=256, M=64, H=28, W=28, K=1), "bf16", "hopper_bf16", 1),
)
ON_HOPPER = wgmma.runs_here()      # an H100/H200, or the emulator: where the rules give these kernels


def _model(s: Workload, layout: str, requires_grad: bool = False, dtype: str = "fp16"):
    """16-bit x, w, bias as a model in that layout holds them (model.to(memory_format=...) makes w
    channels_last too)."""
    x, w, _, b = _tensors(s, dtype, layout)
    return tuple(t.requires_grad_(requires_grad) for t in (x, w, b))


@pytest.mark.skipif(not ON_HOPPER, reason="the rules give these layers their kernels on an H100/H200")
@pytest.mark.parametrize("s, dtype, key, launches", CHANNELS_LAST_16BIT,
                         ids=[f"{s.name} {d}" for s, d, _, _ in CHANNELS_LAST_16BIT])
def test_a_channels_last_16_bit_call_of_the_drop_in_launches_only_its_kernel(s, dtype, key, launches):
    x, w, b = _model(s, "channels_last", dtype=dtype)
    kw = s.conv_kwargs()
    assert dispatch.forward_impl(x, w, b, **kw).key == key
    work = work_of(lambda: dropin.conv2d(x, w, b, **kw), run=False)
    assert (work.launches, work.allocations, work.ops) == (launches, 1, ()), \
        f"dropin.conv2d from channels_last {dtype} ({key}): {work}; only the kernel and its output"
    with torch.no_grad():          # the same without an autograd node
        assert work_of(lambda: dropin.conv2d(x, w, b, **kw), run=False).ops == ()


@pytest.mark.skipif(not ON_HOPPER, reason="the rules give this layer's gradients the Hopper kernels on an H100/H200")
@pytest.mark.parametrize("dtype, keys", [("fp16", ("wgmma", "hopper_dx", "hopper_dw")),
                                         ("bf16", ("hopper_bf16", "hopper_dx_bf16", "hopper_dw_bf16"))])
def test_a_channels_last_16_bit_training_step_adds_only_the_bias_gradients_sum(dtype, keys):
    """Forward, dX and dW from channels_last on an H100/H200 (Hopper's kernels; fp16's forward chapter
    11's wgmma): the kernels, their outputs and their split-K partials (EXPECTED's counts, on the same
    layer); torch's only pass is dbias's sum (the dX kernel reads the mask as it lies). The
    gradients against fp64, with the bound of float sums over each pass's reduction."""
    s = POOL[0]
    x, w, b = _model(s, "channels_last", requires_grad=True, dtype=dtype)
    dy = cl.randn(*s.y_shape, dtype=DTYPE[dtype]).contiguous(memory_format=torch.channels_last)
    kw = s.conv_kwargs()
    assert (dispatch.forward_impl(x, w, b, **kw).key, dispatch.dx_impl(dy, w, input_size=(s.H, s.W), **kw).key,
            dispatch.dw_impl(x, dy, kernel_size=s.K, **kw).key) == keys

    def step():
        x.grad = w.grad = b.grad = None
        dropin.conv2d(x, w, b, **kw).backward(dy)
    work = work_of(step, run=False)
    assert work.ops == ("sum",), work
    assert (work.launches, work.allocations) == tuple(sum(EXPECTED[k][i] for k in keys) for i in (0, 1)), work
    with cl.debug():
        step()
    xd, wd, bd = (t.detach().double().cpu().requires_grad_() for t in (x, w, b))
    F.conv2d(xd, wd, bd, **kw).backward(dy.double().cpu())
    for got, want, n in ((x.grad, xd.grad, s.M * s.K * s.Kw), (w.grad, wd.grad, s.B * s.Ho * s.Wo)):
        rtol, atol_rms = dispatch.tolerance(n, "float", dtype)
        cl.check(got, want, rtol=rtol, atol=atol_rms * float(want.pow(2).mean().sqrt()), name=f"{dtype} gradient")


def test_an_nchw_call_converts_x_once_inside_the_call():
    """NCHW fp16 on a layer WMMA does not take (dilated): mma.sync reads NHWC, so the route converts x
    and the result (and the kernel reorders w): three copies inside the call, no more."""
    s = Workload("dilated", B=2, C=16, M=24, H=9, W=8, K=3, padding=2, dilation=2)
    x, w, b = _model(s, "nchw")
    route = dispatch.forward_route(x, w, b, **s.conv_kwargs())
    assert route.impl.key == "mma" and route.adds == ("x", "y")
    work = work_of(lambda: dropin.conv2d(x, w, b, **s.conv_kwargs()), run=False)
    assert work.ops == ("clone", "clone", "clone") and work.launches == 1, work
    with cl.debug():
        y = dropin.conv2d(x, w, b, **s.conv_kwargs())
    assert y.is_contiguous()
    dispatch.check_fp16_forward(y, F.conv2d(x.double(), w.double(), b.double(), **s.conv_kwargs()), x.shape, w.shape,
                                b, **s.conv_kwargs())


def test_the_count_sees_a_copy_of_x_made_before_the_kernel():
    """What the counts above guard against: x.contiguous() on the channels_last path (x made NCHW,
    then the NHWC kernel's launcher copies it back) shows as two copies."""
    s, _, key, _ = CHANNELS_LAST_16BIT[0]
    x, w, b = _model(s, "channels_last")
    run = dispatch.forward_runner(dispatch.by_key(key), s, "channels_last", True)
    clean = work_of(lambda: run(x, w, None, b), run=False)
    copying = work_of(lambda: run(x.contiguous(), w, None, b), run=False)
    assert clean.ops == () and copying.ops.count("clone") >= 2, (clean, copying)


# ---- a kept route: its GPU work again, in one C call --------------------------------------------

def _stand_in_driver(nargs: int):
    """A C-callable cuLaunchKernel that records each launch's argument words (and no-op copy and
    encode functions): what a convlab.gpu.native Route calls."""
    import ctypes

    words = []
    launch = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p,
                              ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p))(
        lambda f, gx, gy, gz, bx, by, bz, sh, stream, params, extra:
        words.append([ctypes.c_uint64.from_address(params[i]).value for i in range(nargs)]) or 0)
    nothing = ctypes.CFUNCTYPE(ctypes.c_int)(lambda: 0)
    keep = (launch, nothing)
    return words, keep, tuple(ctypes.cast(f, ctypes.c_void_p).value for f in (launch, nothing, nothing))


def test_a_kept_route_replays_its_recorded_call_with_the_calls_tensors(monkeypatch):
    """compiled(): the second call of a route is recorded (here by a stand-in backend, on the CPU);
    later calls write their own tensors' addresses (and a new output's) where the recorded ones
    were, at the same offsets into them, and return an output shaped as the route's."""
    from convlab.gpu import backend_cuda, native, runtime
    from convlab.ops import _kernels

    if native.route_type() is None:
        pytest.skip(f"convlab.gpu.native cannot be built here: {native.why_not()}")
    words, keep, addresses = _stand_in_driver(5)
    HELD = torch.zeros(1)                     # a launcher's own tensor, kept from call to call
    HELD_AT_32 = bytes(32) + HELD.data_ptr().to_bytes(8, "little")

    class Backend:
        name = "cuda"

        def record(self, fn):
            rec = backend_cuda._recording = backend_cuda.Recording()
            try:
                return fn(), rec
            finally:
                backend_cuda._recording = None

        def driver_functions(self):
            return addresses

        raw_stream, has_context = staticmethod(lambda: 5), staticmethod(lambda: True)

    monkeypatch.setattr(_kernels, "recording_backend", Backend)
    monkeypatch.setattr(runtime, "poisoning", lambda: False)

    def route(x, w, y, b):                    # an NHWC kernel's route: its output a permuted allocation
        out = x.new_empty((2, 5, 3)).permute(0, 2, 1)
        rec = backend_cuda._recording
        if rec is not None:
            rec.steps.append(("launch", 0xF, (1,) * 7, HELD_AT_32, (0, 8, 16, 24, 32),
                              [(0, x), (8, w[1:]), (16, out), (24, b), (32, HELD)], []))
        return out

    def inputs():
        return torch.randn(2, 3, 5), torch.randn(6), torch.randn(3)

    kept = _kernels.Kept(route)
    x, w, b = inputs()
    kept.run(x, w, None, b)
    first = kept.run(x, w, None, b)                      # recorded
    assert isinstance(kept.run, native.route_type()), "a call of allocations and launches only is kept"
    x, w, b = inputs()
    y = kept.run(x, w, None, b)
    assert words[-1] == [x.data_ptr(), w.data_ptr() + 4, y.data_ptr(), b.data_ptr(), HELD.data_ptr()]
    assert kept.run.holds == [HELD], "the Route keeps the launcher's own tensor alive"
    assert (y.shape, y.stride()) == (first.shape, first.stride())
    other = x.transpose(1, 2).contiguous().transpose(1, 2)         # the same shape, other strides
    assert kept.run(other, w, None, b) is NotImplemented and kept(other, w, None, b).shape == first.shape
    del keep

    computing = _kernels.Kept(lambda x, w, y, b: route(x, w, y, b).add_(1))     # torch computes: never kept
    for _ in range(3):
        computing.run(x, w, None, b)
    assert computing.run is computing.route


class _StandInGpu:
    """Real routes kept as convlab.gpu.native Routes on the CPU: the GPU backend as far as compiled() needs
    it, each kernel call of the emulator's launchers recorded as the GPU backend records a launch
    (pointers in 8-byte slots, tensor maps in 128-byte ones; nothing runs), and C stand-ins for the
    driver's launch and encode that note what a Route hands them: the kernel each launch names
    (`launched`) and the element strides each tensor map is encoded with (`encodes`)."""

    def __init__(self, monkeypatch):
        import ctypes

        from convlab.gpu import backend_cuda, native, runtime
        from convlab.gpu._tensor_map import TensorMap
        from convlab.ops import _kernels

        if native.route_type() is None:
            pytest.skip(f"convlab.gpu.native cannot be built here: {native.why_not()}")
        self.kernels, self.launched, self.encodes = [], [], []
        launch = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p,
                                  ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p))(
            lambda f, gx, gy, gz, bx, by, bz, sh, stream, params, extra: self.launched.append(self.kernels[f - 1]) or 0)
        copy = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_ulonglong, ctypes.c_ulonglong, ctypes.c_size_t,
                                ctypes.c_void_p)(lambda *a: 0)
        encode = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p,
                                  *[ctypes.POINTER(ctypes.c_ulonglong)] * 2, *[ctypes.POINTER(ctypes.c_uint)] * 2,
                                  *[ctypes.c_int] * 4)(
            lambda out, dtype, rank, address, dims, strides, box, steps, *rest:
            self.encodes.append(tuple(steps[i] for i in range(rank))) or 0)
        self._keep = (launch, copy, encode)
        addresses = tuple(ctypes.cast(f, ctypes.c_void_p).value for f in self._keep)

        class Backend:
            name = "cuda"
            raw_stream, has_context = staticmethod(lambda: 0), staticmethod(lambda: True)

            def record(self, fn):
                rec = backend_cuda._recording = backend_cuda.Recording()
                try:
                    return fn(), rec
                finally:
                    backend_cuda._recording = None

            def driver_functions(self):
                return addresses

        kernels = self.kernels

        def kernel_call(kernel, *args, grid, block, shared=0, max_shared=None, **kw):
            rec = backend_cuda._recording
            if rec is None:
                return
            if kernel.name not in kernels:
                kernels.append(kernel.name)
            at = tuple(128 * (i + 1) if isinstance(a, TensorMap) else 8 * i for i, a in enumerate(args))
            ptrs = [(8 * i, a) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
            maps = [(128 * (i + 1), a) for i, a in enumerate(args) if isinstance(a, TensorMap)]
            rec.steps.append(("launch", kernels.index(kernel.name) + 1, (*grid, *block, shared),
                              bytes(128 * (len(args) + 2)), at, ptrs, maps))

        monkeypatch.setattr(_kernels, "recording_backend", Backend)
        monkeypatch.setattr(_kernels, "LOOK_EVERY_NS", 10**15)     # no Route expires inside a test
        monkeypatch.setattr(runtime.Kernel, "__call__", kernel_call)
        monkeypatch.setattr(runtime, "poisoning", lambda: False)
        self.Route = native.route_type()

    def replay(self, fn):
        """The kernels fn()'s kept Route launches, and the element strides its maps are encoded with."""
        self.launched.clear()
        self.encodes.clear()
        fn()
        return list(self.launched), list(self.encodes)


@pytest.mark.emu_only   # a stand-in GPU driver: on a GPU the real one is in the way
def test_a_precision_switch_between_calls_changes_the_kept_routes_kernel(monkeypatch):
    """The drop-in keeps a route per call signature and, from its third call, replays it in C; the
    float32 precision is part of the signature: torch.set_float32_matmul_precision between calls
    changes the kernel the replayed Route launches, and going back finds the first Route again."""
    gpu = _StandInGpu(monkeypatch)
    s = POOL[0]
    x, w, _, b = _tensors(s, "fp32", "nchw")
    kw = s.conv_kwargs()
    before = torch.get_float32_matmul_precision()
    dropin._routes.clear()
    try:
        launched = {}
        for matmul in ("highest", "high", "highest"):
            torch.set_float32_matmul_precision(matmul)
            for _ in range(2):                           # a first call, then the recorded one
                dropin.conv2d(x, w, b, **kw)
            x, w, b = (t.clone() for t in (x, w, b))     # new addresses: written into the Route's buffers
            launched.setdefault(matmul, []).append(gpu.replay(lambda: dropin.conv2d(x, w, b, **kw))[0])
    finally:
        torch.set_float32_matmul_precision(before)
        routes = list(dropin._routes.values())
        dropin._routes.clear()
    assert len(routes) == 2 and all(isinstance(r[1].run, gpu.Route) for r in routes), "one Route per precision"
    assert {r[1].impl.key for r in routes} == {dispatch.pick(s, "fp32").key, "tf32x3_wgmma"}
    assert "conv2d_wgmma_tf32" in launched["high"][0] and "conv2d_wgmma_tf32" not in launched["highest"][0]
    assert launched["highest"][0] == launched["highest"][1] and launched["highest"][0], launched


@pytest.mark.emu_only   # a stand-in GPU driver: on a GPU the real one is in the way
def test_a_kept_route_encodes_its_tensor_maps_with_their_element_strides(monkeypatch):
    """A strided layer's Hopper kernel reads x through a tensor map that steps over the input (TMA
    element strides): a kept Route encodes that map again for a new x with the same strides."""
    from convlab.ops import _kernels, hopper

    gpu = _StandInGpu(monkeypatch)
    s = Workload("strided", B=2, C=16, M=16, H=9, W=11, K=3, stride=(2, 3), padding=1)
    x, w, _, b = _tensors(s, "fp16", "channels_last")
    kept = _kernels.Kept(dispatch.forward_runner(hopper.HOPPER, s, "channels_last", True))
    for _ in range(2):
        kept(x, w, None, b)
    assert isinstance(kept.run, gpu.Route)
    x = x.clone()
    launched, encodes = gpu.replay(lambda: kept(x, w, None, b))
    assert "conv2d_hopper" in launched
    assert (1, 3, 2, 1) in encodes, f"x's map (C, W, H, B innermost first) steps 3 columns and 2 rows: {encodes}"
    assert (1, 1, 1, 1) in encodes, "the mask's map steps by one"


@pytest.mark.gpu_only
@pytest.mark.skipif(not ON_HOPPER, reason="the rules give these layers their kernels on an H100/H200")
@pytest.mark.parametrize("s, dtype, key, launches", CHANNELS_LAST_16BIT,
                         ids=[f"{s.name} {d}" for s, d, _, _ in CHANNELS_LAST_16BIT])
def test_on_a_gpu_the_drop_ins_repeated_call_is_its_kept_route(s, dtype, key, launches):
    """From the third call the drop-in runs a convlab.gpu.native Route: the same launches, the same result."""
    from convlab.gpu import native

    if native.route_type() is None:
        pytest.skip(f"convlab.gpu.native cannot be built here: {native.why_not()}")
    x, w, b = _model(s, "channels_last", dtype=dtype)
    kw = s.conv_kwargs()
    dropin._routes.clear()
    first = dropin.conv2d(x, w, b, **kw)
    dropin.conv2d(x, w, b, **kw)
    (entry,) = dropin._routes.values()
    assert isinstance(entry[1].run, native.route_type()), f"a channels_last {dtype} route is kept as one C call"
    work = work_of(lambda: dropin.conv2d(x, w, b, **kw))
    assert (work.launches, work.ops) == (launches, ()), work
    torch.testing.assert_close(dropin.conv2d(x, w, b, **kw), first, rtol=0, atol=0)
