"""The one harness: measure.run checks before it times, its rows have one schema, torch's rows come
from a fresh process per layout (mocked here) and "torch best" is the faster."""
import json
import math

import pytest
import torch
import torch.nn.functional as F

import convlab as cl
from convlab.display import book
from convlab.measuring import baselines, results
from convlab.measuring.workloads import Workload
from convlab.ops import Impl
from convlab.programs import measure

LAYER = Workload("t", B=5, C=3, M=4, H=11, W=9, K=3, stride=2, padding=1)


def torch_conv(x, w, y=None, *, stride=1, padding=0):
    return F.conv2d(x, w, stride=stride, padding=padding)


def flipped(x, w, y=None, *, stride=1, padding=0):
    return F.conv2d(x, w.flip(-1, -2), stride=stride, padding=padding)


def last_image_skipped(x, w, y=None, *, stride=1, padding=0):
    y = F.conv2d(x, w, stride=stride, padding=padding)
    y[-1] = float("nan")      # an output never written, in the last image
    return y


def test_rows_of_a_correct_implementation():
    df = measure.run([Impl("torch inline", torch_conv)], [LAYER], torch_baseline=False)
    assert list(df.columns) == results.COLUMNS
    (row,) = df.to_dict("records")
    assert row["impl"] == "torch inline" and row["kind"] == "ours" and row["pass"] == "forward"
    assert row["ms"] > 0 and row["dtype"] == "fp32"
    assert row["shape"] == LAYER.small().shape_text or cl.backend() == "cuda"


@pytest.mark.parametrize("launcher", [flipped, last_image_skipped])
def test_a_wrong_output_is_never_timed(launcher):
    with pytest.raises(cl.CheckError):
        measure.run([Impl("wrong", launcher)], [LAYER], torch_baseline=False)


def test_the_sample_always_holds_the_first_and_last_image():
    for B in (1, 2, 3, 10000):
        s = measure.sample_images(B)
        assert s[0] == 0 and s[-1] == B - 1 and all(0 <= b < B for b in s)


def test_shapes_an_implementation_cannot_take_are_skipped():
    never = Impl("never", flipped, applies=lambda wl: False)
    df = measure.run([never, Impl("ok", torch_conv)], [LAYER], torch_baseline=False)
    assert list(df["impl"]) == ["ok"]


def test_tunables_come_from_the_config_function():
    seen = []

    def launcher(x, w, y=None, *, stride=1, padding=0, TILE=None):
        seen.append(TILE)
        return torch_conv(x, w, stride=stride, padding=padding)

    measure.run([Impl("tiled", launcher, config=lambda wl: {"TILE": wl.K * 10})], [LAYER], torch_baseline=False)
    assert seen and set(seen) == {30}


def test_dx_and_dw_are_checked_by_their_own_references():
    def dx(dy, w, dx=None, *, stride=1, padding=0, input_size=None):
        return torch.nn.grad.conv2d_input((dy.shape[0], w.shape[1], *input_size), w, dy, stride=stride,
                                          padding=padding)

    def dw(x, dy, out=None, *, stride=1, padding=0, kernel_size=None):
        return torch.nn.grad.conv2d_weight(x, (dy.shape[1], x.shape[1], kernel_size, kernel_size), dy,
                                           stride=stride, padding=padding)

    def dw_wrong(x, dy, out=None, **kw):
        return dw(x, dy, **kw) * 1.01

    df = measure.run([Impl("dx", dx, op="conv2d_dx"), Impl("dw", dw, op="conv2d_dw")], [LAYER], torch_baseline=False)
    assert list(df["pass"]) == ["dX", "dW"]
    with pytest.raises(cl.CheckError):
        measure.run([Impl("dw wrong", dw_wrong, op="conv2d_dw")], [LAYER], torch_baseline=False)


def test_sweep_reports_a_setting_that_cannot_run_and_keeps_the_others(capsys):
    def launcher(x, w, y=None, *, stride=1, padding=0, BLOCK=None):
        if BLOCK > 1024:
            raise cl.LaunchError(f"a block of {BLOCK} threads is over the 1024 a block may have")
        return torch_conv(x, w, stride=stride, padding=padding)

    df = measure.sweep(Impl("k", launcher), LAYER, [{"BLOCK": 128}, {"BLOCK": 2048}])
    assert list(df["BLOCK"]) == [128]
    assert "cannot run" in capsys.readouterr().out


def test_the_tolerance_widens_with_the_reduction_only_past_the_default():
    ref = torch.ones(10, dtype=torch.float64)
    assert measure._atol(ref, "fp32", 49) == pytest.approx(1e-4)
    assert measure._atol(ref, "fp32", 10 ** 8) == pytest.approx(8 * 2.0 ** -24 * 1e4)
    assert measure._atol(ref, "fp16", 1) == pytest.approx(1e-2)
    assert measure._atol(ref, "fp16", 49) > measure._atol(ref, "fp32", 49)


def test_cost_of_each_pass():
    flops, nbytes = results.cost(LAYER, "forward")
    assert flops == LAYER.flops and nbytes == LAYER.bytes
    assert results.cost(LAYER, "forward+dX+dW")[0] == 3 * LAYER.flops
    assert results.cost(LAYER, "dW", "fp16")[1] == nbytes // 2
    with pytest.raises(ValueError):
        results.cost(LAYER, "sideways")


def _fake_torch(calls):
    def measure_torch(wl, op="conv2d", dtype="fp32", layout="nchw", reps=20):
        calls.append((wl.name, op, dtype, layout))
        ms = {"nchw": 2.0, "channels_last": 1.5}[layout]
        return [{"pass": "forward", "ms": ms, "p25": ms, "p75": ms, "caller_ms": ms + 0.01, "wall_ms": ms,
                 "kernels": [f"cudnn_kernel_{layout}"]}]
    return measure_torch


def test_torch_best_is_the_faster_layout_and_is_kept_for_the_run(tmp_path, monkeypatch):
    monkeypatch.setenv("CONVLAB_ROOT", str(tmp_path))
    monkeypatch.setenv("CONVLAB_SAVE_RESULTS", "1")
    calls = []
    monkeypatch.setattr(baselines, "measure_torch", _fake_torch(calls))
    rows = baselines.torch_rows(LAYER)
    assert [r["impl"] for r in rows] == ["torch (NCHW)", "torch (channels_last)", "torch best"]
    best = rows[-1]
    assert best["kind"] == "torch best" and best["ms"] == 1.5 and best["layout"] == "channels_last"
    assert best["torch_kernels"] == "cudnn_kernel_channels_last"
    assert len(calls) == 2            # one fresh process per layout
    again = baselines.torch_rows(LAYER)
    assert len(calls) == 2            # the second chapter reads book/data/torch.csv
    assert [r["ms"] for r in again] == [r["ms"] for r in rows]


def test_glue_writes_what_myst_nb_reads(monkeypatch):
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda data, raw, metadata: shown.append((data, metadata)))
    assert book.glue("k", 2.3456, ".2f") == 2.3456
    book.glue("missing", math.nan)
    (data, meta), (data2, _) = shown
    assert data == {"application/papermill.record/text/plain": "2.35"}
    assert meta["scrapbook"] == {"name": "k", "mime_prefix": "application/papermill.record/"}
    assert data2["application/papermill.record/text/plain"] == "—"


def test_the_torch_worker_spec_round_trips():
    spec = baselines._spec(LAYER, "conv2d", "fp16", "channels_last", 7)
    assert json.loads(json.dumps(spec))["shape"]["padding"] == 1
    assert spec["shape"]["D"] is None and spec["reps"] == 7


def test_the_torch_baseline_gets_every_field_of_a_general_layer():
    """The fresh process's tensors and arguments (torch_baseline) give the workload's output shape."""
    from convlab.measuring import torch_baseline, workloads

    for wl in (LAYER, *workloads.LAYERS):
        spec = baselines._spec(wl, "conv2d", "fp32", "nchw", 20)
        s = json.loads(json.dumps(spec))["shape"]
        x = torch.empty(s["B"], s["C"], s["H"], s["W"], device="meta")
        w = torch.empty(s["M"], s["C"] // s["groups"], s["K"], s["Kw"], device="meta")
        assert tuple(F.conv2d(x, w, **torch_baseline.conv_kwargs(s)).shape) == wl.y_shape, wl.name
    old = {"B": 1, "C": 2, "M": 3, "H": 9, "W": 8, "K": 3, "stride": 2, "padding": 1, "D": None}   # an older spec
    assert torch_baseline.conv_kwargs(old) == {"stride": (2, 2), "padding": (1, 1), "dilation": (1, 1), "groups": 1}


def test_general_layers_go_through_the_harness():
    """groups, dilation, a non-square mask and per-axis stride reach the launcher and the reference;
    a kernel that is not any_layer is never offered such a layer."""
    from convlab.measuring.workloads import Workload

    wl = Workload("g", B=3, C=6, M=4, H=12, W=11, K=(3, 2), stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=2)
    seen = []

    def general(x, w, y=None, *, stride=1, padding=0, dilation=1, groups=1):
        seen.append((stride, padding, dilation, groups))
        return F.conv2d(x, w, stride=stride, padding=padding, dilation=dilation, groups=groups)

    df = measure.run([Impl("plain only", torch_conv), Impl("any", general, any_layer=True)], [wl],
                     torch_baseline=False)
    assert list(df["impl"]) == ["any"] and seen[0] == ((2, 1), (1, 0), (1, 2), 2)
    assert df["shape"].iloc[0].endswith("dilation (1, 2), groups 2")


def test_fp16_rows_are_checked_by_the_derived_bound():
    """An fp16 result off by 0.5% of the output's RMS passes the generic fp16 bound (1%) but not
    chapter 6's derived one for float sums (fp16.fp16_tolerance): the harness uses the derived one."""
    def off(x, w, y=None, *, stride=1, padding=0):
        y = F.conv2d(x.float(), w.float(), stride=stride, padding=padding)
        return (y + 5e-3 * y.pow(2).mean().sqrt()).half()

    def right(x, w, y=None, *, stride=1, padding=0):
        return F.conv2d(x.float(), w.float(), stride=stride, padding=padding).half()

    measure.run([Impl("right", right, op="conv2d_fp16")], [LAYER], dtype="fp16", torch_baseline=False)
    with pytest.raises(cl.CheckError):
        measure.run([Impl("off", off, op="conv2d_fp16")], [LAYER], dtype="fp16", torch_baseline=False)


def test_channels_last_inputs_reach_the_launcher_and_the_row():
    """layout="channels_last": x and w come in that memory format (an NHWC kernel's inputs, as torch's
    channels_last row gets them), in run and in sweep, and the rows say so."""
    seen = []

    def nhwc_only(x, w, y=None, *, stride=1, padding=0, **tunables):
        seen.append(x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
                    and w.is_contiguous(memory_format=torch.channels_last) and not w.is_contiguous())
        return F.conv2d(x, w, stride=stride, padding=padding)

    impl = Impl("nhwc", nhwc_only)
    df = measure.run([impl], [LAYER], layout="channels_last", torch_baseline=False)
    swept = measure.sweep(impl, LAYER, [{"T": 1}, {"T": 2}], layout="channels_last")
    assert seen and all(seen) and list(df["layout"]) == ["channels_last"]
    assert list(swept["layout"]) == ["channels_last"] * 2 and list(swept["T"]) == [1, 2]
    measure.run([impl], [LAYER], torch_baseline=False)
    assert seen[-1] is False
    with pytest.raises(ValueError, match="layout"):
        measure.run([impl], [LAYER], layout="nhwc", torch_baseline=False)


def test_torch_algorithm_names_what_the_kernels_show():
    fft = ("void fft2d_r2c_32x32<float, false, 1u, false>(float2*, float const*, int) | "
           "sm80_xmma_gemm_cf32cf32_f32f32_cf32_nt_n_tilesize64x32x8_execute_kernel__5x_cublas | "
           "void fft2d_c2r_32x32<float, false>(float*, float2 const*)")
    assert baselines.torch_algorithm(fft) == ("FFT", "fft2d_r2c_32x32")
    wino = ("void cudnn::winograd_nonfused::winogradWgradData4x4<float, float>(int) | "
            "sm80_xmma_gemm_f32f32_f32f32_f32_nt_n_tilesize32x32x8_execute_kernel__5x_cublas")
    assert baselines.torch_algorithm(wino) == ("Winograd", "cudnn::winograd_nonfused::winogradWgradData4x4")
    igemm = "sm80_xmma_fprop_implicit_gemm_f32f32_f32f32_f32_nchwkcrs_nchw_tilesize256x64x8_execute_kernel__5x_cudnn"
    assert baselines.torch_algorithm(igemm) == ("implicit GEMM", "sm80_xmma_fprop_implicit_gemm")
    assert baselines.torch_algorithm("void wgrad_alg0_engine<float, 128, 5>(int, float*)")[0] == "implicit GEMM, atomics (wgrad_alg0)"
    assert baselines.torch_algorithm("void at::native::elementwise_kernel<4>(int)") == (
        "other", "at::native::elementwise_kernel")
    assert baselines.torch_algorithm("") == ("", "") and baselines.torch_algorithm(float("nan")) == ("", "")


def test_a_kernel_in_an_anonymous_namespace_keeps_its_name():
    from convlab.measuring.cards import KernelProfile
    name = "void at::native::(anonymous namespace)::conv_depthwise2d_forward_kernel<3, float>(float*, int)"
    assert baselines.kernel_base_name(name) == "at::native::conv_depthwise2d_forward_kernel"
    assert KernelProfile(name).short_name == "conv_depthwise2d_forward_kernel"
