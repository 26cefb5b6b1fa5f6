"""The GPU launch path (cuLaunchKernel on torch's current stream): every kind of argument reaches
the kernel, and kernels run on the caller's stream, in order with its torch work: on a side
stream, under CUDA graph capture, and in autograd's backward. Each test first keeps the stream
busy (torch.cuda._sleep) and only then writes the inputs on it, so a kernel launched on any other
stream would run early, on the poisoned inputs, and fail the check."""
import pytest
import torch

import convlab as cl
from convlab.ops import backprop, fused

pytestmark = pytest.mark.gpu_only

SLEEP = 50_000_000        # ~25 ms of GPU time at 2 GHz: far longer than queueing what follows takes

ECHO = r"""
#include <cuda_fp16.h>
__global__ void echo(const float* x, const half* hin, float* fout, double* dout, half* hout, long long* iout,
                     int i, unsigned int u, long long q, float f, double d, half h, bool b, short s, char c,
                     size_t z) {
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        fout[0] = x[0] + f;
        fout[1] = __half2float(h);
        dout[0] = d;
        hout[0] = hin[0];
        iout[0] = i; iout[1] = u; iout[2] = q; iout[3] = b; iout[4] = s; iout[5] = c; iout[6] = (long long)z;
    }
}
"""


def _poisoned_like(t):
    return torch.full_like(t, float("nan")) if t.dtype.is_floating_point else torch.full_like(t, -1)


def test_every_kind_of_argument_reaches_the_kernel_on_a_side_stream():
    echo = cl.load_source(ECHO, "echo").kernel("echo")
    x, hin = torch.tensor([2.0], device="cuda"), torch.tensor([-0.375], dtype=torch.float16, device="cuda")
    fout, dout = torch.empty(2, device="cuda"), torch.empty(1, dtype=torch.float64, device="cuda")
    hout, iout = torch.empty(1, dtype=torch.float16, device="cuda"), torch.empty(7, dtype=torch.int64, device="cuda")
    scalars = (-123456, 4_000_000_000, -(2**40) - 3, 0.25, 1 / 3, 1.5, True, -300, -7, 2**40 + 9)
    echo(x, hin, fout, dout, hout, iout, *scalars, grid=1, block=32)       # compile and plan
    xs, hs = _poisoned_like(x), _poisoned_like(hin)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP)
        for t in (fout, dout, hout, iout):
            t.copy_(_poisoned_like(t))
        xs.copy_(x)
        hs.copy_(hin)
        echo(xs, hs, fout, dout, hout, iout, *scalars, grid=(1, 1, 1), block=(32, 1, 1))
    side.synchronize()
    assert fout.tolist() == [2.25, 1.5]
    assert dout.item() == 1 / 3
    assert hout.item() == -0.375
    assert iout.tolist() == [-123456, 4_000_000_000, -(2**40) - 3, 1, -300, -7, 2**40 + 9]


def test_launchers_run_on_the_callers_stream():
    """The kept launches of the chapters' best launchers (chapter 5's forward, a kernel with its
    mask in __constant__ memory, chapter 8's dX and dW with their second pass) on a side stream."""
    x, w, dy = cl.randn(3, 5, 17, 23), cl.randn(7, 5, 3, 3), cl.randn(3, 7, 17, 23)
    runs = {"conv2d_best": lambda x, w, dy: fused.conv2d_best(x, w, padding=1),
            "direct_coarse": lambda x, w, dy: fused.conv2d_direct_coarse(x, w, padding=1),
            "dX best": lambda x, w, dy: backprop.conv2d_input_grad_best(dy, w, padding=1),
            "dW best": lambda x, w, dy: backprop.conv2d_weight_grad_best(x, dy, padding=1)}
    refs = {"conv2d_best": cl.ref.conv2d(x, w, padding=1), "direct_coarse": cl.ref.conv2d(x, w, padding=1),
            "dX best": cl.ref.conv2d_input_grad(x.shape, w, dy, padding=1),
            "dW best": cl.ref.conv2d_weight_grad(x, w.shape, dy, padding=1)}
    side = torch.cuda.Stream()
    for name, run in runs.items():
        run(x, w, dy)                                   # compile and keep the launch
        xs, ws, dys = _poisoned_like(x), _poisoned_like(w), _poisoned_like(dy)
        torch.cuda.synchronize()
        with torch.cuda.stream(side):
            torch.cuda._sleep(SLEEP)
            xs.copy_(x)
            ws.copy_(w)
            dys.copy_(dy)
            out = run(xs, ws, dys)
        side.synchronize()
        cl.check(out, refs[name], name=f"{name} on a side stream")


def test_a_launcher_under_cuda_graph_capture():
    """Graph capture records the capturing stream's work only: a launch on another stream would
    be an error, or missing from the replay."""
    x, w = cl.randn(2, 4, 19, 21), cl.randn(6, 4, 5, 5)
    xs, y = x.clone(), fused.conv2d_best(x, w, padding=2)       # compile and keep the launch
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fused.conv2d_best(xs, w, y, padding=2)
    x2 = cl.randn(2, 4, 19, 21)
    xs.copy_(x2)
    y.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    cl.check(y, cl.ref.conv2d(x2, w, padding=2), name="the replayed graph")


def test_conv2d_function_trains_on_a_side_stream():
    """Autograd runs the backward on its own thread, on the forward's stream: dX and dW launched
    from there land on it."""
    x, w, dy = cl.randn(2, 3, 13, 15), cl.randn(4, 3, 3, 3), cl.randn(2, 4, 13, 15)
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    backprop.Conv2dFunction.apply(xg, wg, None, 1, 1).backward(dy)     # compile and keep the launches
    xg.grad = wg.grad = None
    dys = _poisoned_like(dy)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP)
        dys.copy_(dy)
        backprop.Conv2dFunction.apply(xg, wg, None, 1, 1).backward(dys)
    side.synchronize()
    cl.check(xg.grad, cl.ref.conv2d_input_grad(x.shape, w, dy, padding=1), name="dx")
    cl.check(wg.grad, cl.ref.conv2d_weight_grad(x, w.shape, dy, padding=1), name="dw")
