"""cl.check's verdicts, the fp64 references against torch autograd, cl.bench's labels, and the CPU
path of chapter 1."""
import pytest
import torch

import convlab as cl


def test_check_passes_and_reports_error():
    ref = torch.randn(2, 3, 4, 5, dtype=torch.float64)
    r = cl.check(ref.float(), ref)
    assert r and "OK" in str(r) and "120" in str(r)


def test_check_names_unwritten_outputs():
    ref = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    out = ref.float().clone()
    out[:, :, :, 7] = float("nan")
    with pytest.raises(cl.CheckError) as e:
        cl.check(out, ref)
    msg = str(e.value)
    assert "48 of 384 outputs were never written" in msg and "(0, 0, 0, 7) (b,m,h,w)" in msg
    assert "last row or column" in msg


def test_check_names_first_wrong_value():
    ref = torch.randn(1, 1, 4, 4, dtype=torch.float64)
    out = ref.float().clone()
    out[0, 0, 2, 1] += 1.0
    with pytest.raises(cl.CheckError) as e:
        cl.check(out, ref)
    assert "1 of 16 outputs are wrong. First at (0, 0, 2, 1)" in str(e.value)


def test_check_names_a_weight_gradients_axes_and_gives_no_edge_hint():
    # dW (M, C, K, K) is 4-D like an image batch, but its last axes are mask taps, not pixels
    ref = torch.randn(4, 3, 5, 5, dtype=torch.float64)
    out = ref.float().clone()
    out[:, :, 4, :] += 1.0          # the last mask row: a pixel edge in an image, not in a mask
    with pytest.raises(cl.CheckError) as e:
        cl.check(out, ref, index=("m", "c", "ky", "kx"))
    msg = str(e.value)
    assert "(0, 0, 4, 0) (m,c,ky,kx)" in msg and "(b,m,h,w)" not in msg
    assert "edge" not in msg and "last row or column" not in msg
    with pytest.raises(cl.CheckError) as e:
        cl.check(out, ref)          # the same values as an image batch: the edge hint is right there
    assert "(b,m,h,w)" in str(e.value) and "last row or column" in str(e.value)
    with pytest.raises(ValueError, match="names 3 axes"):
        cl.check(out, ref, index=("m", "c", "k"))


def test_the_harness_checks_dw_with_its_own_axes():
    from convlab.measuring import workloads
    from convlab.programs import measure
    from convlab.ops import Impl
    wl = workloads.Workload("t", B=2, C=3, M=4, H=9, W=9, K=3)
    t = measure.inputs(wl, "dW")
    ref = torch.nn.grad.conv2d_weight(t["x"].double(), wl.w_shape, t["dy"].double())
    bad = ref.float().clone()
    bad[1, 2, 0, 1] += 10.0
    impl = Impl("wrong dW", lambda x, dy, **k: bad, op="conv2d_dw")
    with pytest.raises(cl.CheckError, match=r"\(1, 2, 0, 1\) \(m,c,ky,kx\)"):
        measure.check_output(impl, wl, t, bad)


def test_check_shape_and_no_raise():
    err = cl.check(torch.zeros(3), torch.zeros(4, dtype=torch.float64), raise_on_error=False)
    assert isinstance(err, cl.CheckError) and "shape" in str(err)


@pytest.mark.parametrize("stride, padding", [(1, 0), (2, 1), (3, 2)])
def test_references_against_autograd(stride, padding):
    x = torch.randn(2, 3, 11, 9, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, dtype=torch.float64, requires_grad=True)
    y = torch.nn.functional.conv2d(x, w, stride=stride, padding=padding)
    dy = torch.randn_like(y)
    y.backward(dy)
    assert torch.allclose(cl.ref.conv2d(x, w, stride=stride, padding=padding), y)
    assert torch.allclose(cl.ref.conv2d_input_grad(x.shape, w, dy, stride, padding), x.grad)
    assert torch.allclose(cl.ref.conv2d_weight_grad(x, w.shape, dy, stride, padding), w.grad)


def test_conv2d_reference_is_cross_correlation():
    x = torch.arange(16.0).view(1, 1, 4, 4)
    w = torch.zeros(1, 1, 3, 3)
    w[0, 0, 0, 0] = 1.0                          # picks the top-left neighbour, no flip
    assert torch.equal(cl.ref.conv2d(x, w)[0, 0], x[0, 0, :2, :2].double())


def test_conv3d_reference_single_channel():
    x, w = torch.randn(6, 7, 8), torch.randn(3, 3, 3)
    want = torch.zeros(4, 5, 6, dtype=torch.float64)
    for p in range(3):
        for q in range(3):
            for r in range(3):
                want += x[p:p + 4, q:q + 5, r:r + 6].double() * float(w[p, q, r])
    assert torch.allclose(cl.ref.conv3d(x, w), want)


def test_matmul_reference():
    a, b = torch.randn(5, 7), torch.randn(7, 3)
    assert torch.allclose(cl.ref.matmul(a, b), a.double() @ b.double())


def test_bench_labels_its_device():
    t = cl.bench(lambda: torch.ones(10).sum(), reps=3)
    assert t.ms > 0 and t.p25 <= t.ms <= t.p75
    if cl.backend() == "emu":
        assert not t.is_gpu and "not a GPU timing" in str(t)
    else:
        assert t.is_gpu and cl.device().name in str(t)


def test_empty_is_poisoned_and_randn_is_fresh():
    assert torch.isnan(cl.empty(3, 4)).all()
    a, b = cl.randn(1000), cl.randn(1000)
    assert not torch.equal(a, b) and (a != 0).all()


def test_cpu_module(tmp_path):
    f = tmp_path / "saxpy.cpp"
    f.write_text('extern "C" void saxpy(const float* x, float* y, float a, int n) {\n'
                 '    for (int i = 0; i < n; i++) y[i] += a * x[i];\n}\n'
                 'extern "C" void crash(float* y) { float* p = nullptr; p[12] = y[0]; }\n')
    mod = cl.load_cpu(f)
    x, y = torch.randn(100), torch.randn(100)
    want = y.double() + 3 * x.double()
    mod.function("saxpy")(x, y, 3, 100)
    cl.check(y, want)
    with pytest.raises(cl.KernelFault, match="invalid memory access"):
        mod.function("crash")(y)
