"""What a student sees: the exercise checks' verdicts, the %%cuda magic, and the figures' labels."""
import math

import numpy as np
import pytest
import torch

import convlab as cl
import convlab.teach.checks as ex
import convlab.teach.verdict as vd
from convlab.chapters import ch02_naive as ch2
from convlab.chapters import ch05_fused as ch5
from convlab.chapters import ch09_general as ch9
from convlab.display import plots
from convlab.measuring import results, workloads

GOOD_KERNEL = r"""
__global__ void conv2d_flat(const float* x, const float* k, float* y,
                            int B, int C, int M, int H, int W, int K, int stride, int pad)
{
    const int Ho = (H + 2 * pad - K) / stride + 1, Wo = (W + 2 * pad - K) / stride + 1;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < B * M * Ho * Wo; i += gridDim.x * blockDim.x) {
        const int w = i % Wo, h = (i / Wo) % Ho, m = (i / (Wo * Ho)) % M, b = i / (Wo * Ho * M);
        float acc = 0.0f;
        for (int c = 0; c < C; ++c)
            for (int p = 0; p < K; ++p)
                for (int q = 0; q < K; ++q) {
                    const int ih = h * stride + p - pad, iw = w * stride + q - pad;
                    if (ih >= 0 && ih < H && iw >= 0 && iw < W)
                        acc += x[((b * C + c) * H + ih) * W + iw] * k[((m * C + c) * K + p) * K + q];
                }
        y[i] = acc BUG;
    }
}
"""


def _launcher(source, blocks=None):
    module = cl.load_source(source, name="student")

    def launch(x, w, y, stride, pad):
        B, C, H, W = x.shape
        M, _, K, _ = w.shape
        n = B * M * cl.out_size(H, K, stride, pad) * cl.out_size(W, K, stride, pad)
        module.kernel("conv2d_flat")(x, w, y, B, C, M, H, W, K, stride, pad,
                                     grid=blocks or (n + 127) // 128, block=128)
    return launch


def test_correct_kernel(capsys):
    assert ex.check_kernel(_launcher(GOOD_KERNEL.replace("BUG", "")))
    assert capsys.readouterr().out.startswith("✓ correct")


def test_wrong_values_name_the_first_bad_output(capsys):
    assert not ex.check_kernel(_launcher(GOOD_KERNEL.replace("BUG", "+ (h == 2 ? 1.0f : 0.0f)")))
    out = capsys.readouterr().out
    assert "wrong at (b=0,m=0,h=2,w=0): expected" in out and " got " in out


def test_outputs_never_written(capsys):
    # without the grid-stride loop, 1 block of 128 threads leaves most outputs untouched
    no_loop = GOOD_KERNEL.replace("BUG", "").replace("i += gridDim.x * blockDim.x", "i += 1 << 30")
    assert not ex.check_kernel(_launcher(no_loop, blocks=1), shapes=[ex.AWKWARD_SHAPES[1]])
    assert "outputs never written, the first at (b=" in capsys.readouterr().out


def test_unfinished_kernel_is_not_done_yet(capsys):
    empty = "__global__ void conv2d_flat(const float* x, const float* k, float* y, int B, int C, int M, " \
            "int H, int W, int K, int stride, int pad) {\n    // TODO: (about 20 lines)\n}"
    assert not ex.check_kernel(_launcher(empty))
    assert capsys.readouterr().out.startswith("not done yet: the TODO in cell student, line 3 is still there")


def test_written_code_that_writes_nothing_is_not_told_not_done_yet(capsys):
    wrong_pointer = GOOD_KERNEL.replace("BUG", "").replace("y[i] = acc", "if (i < 0) y[i] = acc")
    assert not ex.check_kernel(_launcher(wrong_pointer))
    out = capsys.readouterr().out
    assert "not done" not in out and "none of the 9 outputs was written" in out


def test_fault_messages_are_printed_not_raised(capsys):
    past_the_end = GOOD_KERNEL.replace("BUG", "").replace("y[i] = acc", "y[i + 1] = acc")
    assert not ex.check_kernel(_launcher(past_the_end))
    out = capsys.readouterr().out
    if cl.device().backend == "emu":
        assert "OutOfBoundsError" in out
    assert out.startswith("✗")


def test_python_errors_are_printed_not_raised(capsys):
    def broken(x, w, stride, pad):
        return x @ w  # wrong shapes: numpy raises
    assert not ex.check_function(broken)
    assert "your code raised ValueError" in capsys.readouterr().out


def _untouched_exercise(x, w, stride, pad):
    y = None
    # TODO: pad x, then add up the shifted windows (about 6 lines)
    pass
    return y


def test_check_function_and_values(capsys):
    assert not ex.check_function(_untouched_exercise)
    assert capsys.readouterr().out.startswith("not done yet: the TODO in _untouched_exercise")
    assert not ex.check_function(lambda x, w, stride, pad: None)
    assert "returned None" in capsys.readouterr().out

    def reference(x, w, stride, pad):
        return cl.ref.conv2d(torch.from_numpy(x), torch.from_numpy(w), stride=stride, padding=pad).numpy()
    assert ex.check_function(reference)

    assert ex.check_value("FLOPs", 100, 100)
    assert not ex.check_value("FLOPs", 50, 100)
    assert "off by a factor of 0.5" in capsys.readouterr().out.splitlines()[-1]
    assert not ex.check_value("FLOPs", None, 100)
    assert ex.check_value("names", ["b", "a"], ("a", "b"))
    assert not ex.check_value("names", ["a"], ("a", "b"))
    assert "1 missing" in capsys.readouterr().out.splitlines()[-1]


def test_verdict_wrong_shape():
    ok, text = vd.verdict(np.zeros((1, 1, 2, 2)), np.zeros((1, 1, 3, 3)))
    assert not ok and text.startswith("wrong shape")


def _torch_launch(*, half=False, change=None):
    """A launch computed by torch (no kernel), optionally changed after the fact."""
    def launch(x, w, y, stride, pad):
        out = torch.nn.functional.conv2d(x.double(), w.double(), stride=stride, padding=pad)
        y.copy_(out.to(y.dtype))
        if change is not None:
            change(y)
    return launch


def test_all_zero_outputs_say_nothing_was_added_up(capsys):
    assert not ex.check_kernel(_torch_launch(change=lambda y: y.zero_()))
    out = capsys.readouterr().out
    assert out.startswith("✗ ") and "outputs are 0, as if nothing was added up" in out


def test_locate_names_who_computes_the_first_wrong_output(capsys):
    def bump(y):
        y[0, 0, 1, 2] += 1.0

    def where(shape, index):
        return f"thread {index[2] * shape.Wo + index[3]}"
    assert not ex.check_kernel(_torch_launch(change=bump), locate=where)
    assert "wrong at (b=0,m=0,h=1,w=2) [thread 5]: expected" in capsys.readouterr().out


def test_fp16_checks_half_kernels_against_chapter_6s_bound(capsys):
    assert ex.check_kernel(_torch_launch(), fp16="float")
    assert "within the fp16 bound" in capsys.readouterr().out
    # a relative error of 1% is far outside the bound of float accumulation
    assert not ex.check_kernel(_torch_launch(change=lambda y: y.mul_(1.01)), fp16="float")
    assert capsys.readouterr().out.startswith("✗")
    with pytest.raises(ValueError):
        ex.check_kernel(_torch_launch(), fp16="fp16")


def _untouched_rule(shape):
    # TODO: conditions on the shape that say which kernel wins (about 2 lines)
    choice = None
    return choice


def test_check_pick_says_where_a_rule_loses_and_by_how_much(capsys):
    small, big = workloads.get("fa17"), workloads.get("resnet")
    times = {"fa17": {"gemm": 1.0, "direct": 0.5}, "resnet": {"gemm": 0.5}}
    layers = {"fa17": small, "resnet": big}
    assert ch5.check_pick(lambda s: "direct" if s.M <= 50 else "gemm", times, layers, device="GPU X")
    assert "fastest kernel measured on GPU X on all 2 layers" in capsys.readouterr().out
    assert not ch5.check_pick(lambda s: "gemm", times, layers, device="GPU X")
    out = capsys.readouterr().out
    assert "on 1 of 2 layers" in out and "fa17 (C=1, K=5, M=50" in out and "2.00×" in out
    assert not ch5.check_pick(lambda s: "direct", times, layers, device="GPU X")
    assert "'direct', which does not take this layer" in capsys.readouterr().out
    assert not ch5.check_pick(lambda s: "fft", times, layers, device="GPU X")
    assert "none of the kernels" in capsys.readouterr().out
    assert not ch5.check_pick(lambda s: None, times, layers, device="GPU X")
    assert "your rule returned None for fa17" in capsys.readouterr().out
    assert not ch5.check_pick(_untouched_rule, times, layers, device="GPU X")
    assert capsys.readouterr().out.startswith("not done yet: the TODO in _untouched_rule")
    assert not ch5.check_pick(lambda s: s.nothing, times, layers, device="GPU X")
    assert "your code raised AttributeError" in capsys.readouterr().out


# ---- the %%cuda magic ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def shell():
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "convlab.gpu.magic")
    return ip


def test_magic_binds_the_module(shell, capsys):
    shell.run_cell_magic("cuda", "good -D SCALE=2", "__global__ void k(float* y) { y[threadIdx.x] = SCALE; }")
    assert "good: compiled, kernels k" in capsys.readouterr().out
    y = cl.empty(4)
    shell.user_ns["good"].kernel("k")(y, grid=1, block=4)
    cl.sync()
    assert torch.all(y.cpu() == 2)


def test_magic_prints_compile_errors_at_the_cell_line(shell, capsys):
    shell.run_cell_magic("cuda", "bad", "__global__ void k(float* y)\n{\n    y[0] = undefined_name;\n}")
    out = capsys.readouterr().out
    assert "did not compile" in out and "cell bad, line 4" in out   # Jupyter counts the %%cuda line
    bad = shell.user_ns["bad"]
    from convlab.gpu.magic import CellNotCompiled
    with pytest.raises(CellNotCompiled, match="did not compile"):
        bad.kernel("k")(cl.empty(1), grid=1, block=1)
    # the checks report it like any other fault
    assert not ex.check_kernel(lambda x, w, y, s, p: bad.kernel("k")(y, grid=1, block=1))
    assert "CellNotCompiled" in capsys.readouterr().out


def test_magic_usage_errors(shell, capsys):
    shell.run_cell_magic("cuda", "", "__global__ void k() {}")
    assert "usage" in capsys.readouterr().out


# ---- figures and the README table ---------------------------------------------------------------

def _rows(gpu="NVIDIA H200"):
    class T:
        def __init__(self, ms):
            self.ms, self.p25, self.p75 = ms, ms * 0.9, ms * 1.1

    from convlab.measuring import roofline
    return [results.row(wl, impl, T(ms), roof=roofline.REFERENCE_H200, device=gpu)
            for wl in workloads.WORKLOADS_2D for impl, ms in (("naive", 5.0), ("torch default", 0.5))]


def test_figure_says_what_it_was_measured_on():
    import matplotlib
    matplotlib.use("Agg")
    fig = plots.plot_times(results.frame(_rows()), title="t")
    texts = " ".join(t.get_text() for t in fig.texts)
    assert "NVIDIA H200" in texts and "TF32 off" in texts and "fp32" in texts and "cuDNN" in texts
    assert fig.axes[0].get_yscale() == "log"  # 5 ms vs floors of 0.01-0.5 ms


def test_figure_refuses_to_mix_devices():
    with pytest.raises(ValueError, match="several devices"):
        plots.plot_times(results.frame(_rows("A") + _rows("B")))


def test_results_round_trip_and_readme_table(tmp_path, monkeypatch):
    import importlib.util
    from pathlib import Path

    monkeypatch.setenv("CONVLAB_ROOT", str(tmp_path))
    (tmp_path / "book" / "data").mkdir(parents=True)
    assert results.load("02_naive") is None
    results.save(results.frame(_rows()), "02_naive", force=True)
    df = results.load("02_naive")
    assert list(df.columns) == results.COLUMNS and len(df) == 10

    root = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("results_table", root / "scripts" / "results_table.py")
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    readme = tmp_path / "README.md"
    readme.write_text("# x\n\n## Results\n\n<!-- results:begin -->\nold\n<!-- results:end -->\n\nafter\n")
    assert table.rewrite(readme, table.section(tmp_path / "book" / "data"))
    text = readme.read_text()
    assert "old" not in text and text.endswith("<!-- results:end -->\n\nafter\n")
    assert "| workload | shape | naive | torch default | roofline floor |" in text
    assert "| lenet_c1 | B=10000, C=1→M=4, 86×86, K=7×7 | 5 | 0.5 | 0.492 |" in text
    assert "NVIDIA H200" in text


def test_save_refuses_on_the_emulator(tmp_path, monkeypatch, capsys):
    if cl.device().backend != "emu":
        pytest.skip("emulator only")
    monkeypatch.setenv("CONVLAB_ROOT", str(tmp_path))
    monkeypatch.delenv("CONVLAB_SAVE_RESULTS", raising=False)
    assert results.save(_rows(), "02_naive") is None
    assert not (tmp_path / "book" / "data" / "02_naive.csv").exists()
    assert "not a GPU run" in capsys.readouterr().out
    assert math.isfinite(_rows()[0]["floor_frac"])


# ---- check_general_kernel (exercise 9a.1): groups and dilation --------------------------------------

def _general(mistake=None):
    """A launch(x, w, y, stride, pad, dilation, groups) through torch, right or with one mistake."""
    import torch.nn.functional as F

    def launch(x, w, y, stride, pad, dilation, groups):
        if mistake == "nothing":
            return
        if mistake == "no dilation":
            y.copy_(F.conv2d(x, w, stride=stride, padding=pad, groups=groups)[..., :y.shape[2], :y.shape[3]])
        elif mistake == "first group":
            y.copy_(F.conv2d(x[:, :x.shape[1] // groups], w, stride=stride, padding=pad, dilation=dilation))
        else:
            y.copy_(F.conv2d(x, w, stride=stride, padding=pad, dilation=dilation, groups=groups))
    return launch


def test_check_general_kernel_passes_a_right_kernel(capsys):
    assert ch9.check_general_kernel(_general())
    assert "correct" in capsys.readouterr().out


@pytest.mark.parametrize("mistake, said", [("no dilation", "the dilation is missing"),
                                           ("first group", "every map reads the first group's channels"),
                                           ("nothing", "none of the 288 outputs was written")])
def test_check_general_kernel_names_the_mistake(mistake, said, capsys):
    assert not ch9.check_general_kernel(_general(mistake))
    assert said in capsys.readouterr().out


def test_general_shapes_cover_groups_dilation_and_stride():
    shapes = ch9.GENERAL_SHAPES
    assert any(s.groups == s.C for s in shapes) and any(1 < s.groups < s.C for s in shapes)
    assert any(s.dilation > 1 and s.stride > 1 for s in shapes) and any(s.K % 2 == 0 for s in shapes)
    assert all(s.C % s.groups == 0 and s.M % s.groups == 0 for s in shapes)


def _micro_tile(shape, index):
    # a made-up owner: thread t of each row computes 4 consecutive columns, acc[0][w % 4]
    return f"thread {index[3] // 4} of row {index[2]}, in acc[0][{index[3] % 4}]"


def test_values_one_column_over_name_the_index_that_is_off(capsys):
    # each output holds its right neighbour's value (the last column of a row keeps its own):
    # within a thread's micro-tile, acc[0][j] holds acc[0][j+1]'s
    def shift(y):
        y[..., :-1] = y[..., 1:].clone()
    assert not ex.check_kernel(_torch_launch(change=shift), locate=_micro_tile)
    out = capsys.readouterr().out
    assert "acc[i][j] holds the value of acc[i][j+1]: its index j is off by +1 (the same thread, row)" in out, out


def test_values_in_other_places_by_a_row_length_name_the_leading_dimension(capsys):
    # a 4 x 8 output tile, rows 8 apart, written by a store that took its rows 5 apart: output
    # (r, c) holds what (r', c') computes where r * 8 + c = r' * 5 + c'
    def relaid(y):
        old = y.clone()
        for f in range(20):
            y[..., f // 8, f % 8] = old[..., f // 5, f % 5]
    where = lambda shape, index: f"row {index[2]}, column {index[3]}"  # noqa: E731
    shape = ex.Shape(2, 2, 3, 6, 10, 3)     # 4 x 8 outputs
    assert not ex.check_kernel(_torch_launch(change=relaid), [shape], locate=where)
    out = capsys.readouterr().out
    assert "8·row + column holds what 5·row' + column' computes" in out, out
    assert "a leading dimension of 5 where a row of the array holds 8" in out, out


@pytest.mark.emu_only
def test_counters_on_the_emulator_say_the_gpu_comparison_needs_a_gpu(capsys):
    launch = _launcher(GOOD_KERNEL.replace("BUG", ""))
    assert ch2.check_counters(launch, ch2.check_targets("02"), shape=ch2.COUNTER_SHAPE)
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "  (timing your kernel against the chapter's kernel and torch best on lenet_c1 needs a GPU)"
    # targets without an exercise's key (a dict of one's own) compare with nothing
    ch2.check_counters(launch, {"sectors per load request": 99}, shape=ch2.COUNTER_SHAPE)
    assert "needs a GPU" not in capsys.readouterr().out


def test_the_gpu_comparison_shows_three_times_side_by_side():
    from convlab.measuring.bench import Timing

    name, impl = ch2.check_targets("02").compare
    wl = workloads.get(name)
    assert (wl.name, impl.name) == ("lenet_c1", "naive flat (1D grid)")
    yours = Timing(30.0, 29.5, 30.4, 29.0, 31.0, [], True, "NVIDIA H100")     # faked: no GPU here
    theirs = Timing(20.0, 19.9, 20.2, 19.8, 20.5, [], True, "NVIDIA H100")
    row = ch2.torch_best_row("lenet_c1")
    assert row is not None and row["gpu"] == "NVIDIA H200"
    text = ch2.side_by_side(wl, "NVIDIA H100", impl.name, yours, theirs, row)
    lines = text.splitlines()
    assert lines[0].startswith("  on NVIDIA H100, lenet_c1 (B=10000") and len(lines) == 4
    assert lines[1] == "    your kernel                  30 ms (29.5–30.4), 1.50× the chapter's"
    assert lines[2] == "    the chapter's kernel         20 ms (19.9–20.2): naive flat (1D grid)"
    # torch.csv's best row of lenet_c1, its kernel named, and the GPU it was measured on said
    assert lines[3].startswith(f"    {'torch best':<22}{float(row['ms']):>9.4g} ms") and "FFT (DSE::" in lines[3]
    assert lines[3].endswith("measured on NVIDIA H200, not this GPU")
    same_gpu = ch2.side_by_side(wl, "NVIDIA H200", impl.name, yours, theirs, row)
    assert "not this GPU" not in same_gpu


EDGE_ADVICE = "only outputs at the image's edge are wrong"


def _edge_verdict(shape, wrong):
    """verdict's text for the reference of shape with the outputs where wrong(h, w, Ho, Wo) off by a
    different amount each (no common offset, no other output's value)."""
    x, w = cl.randn(shape.B, shape.C, shape.H, shape.W).cpu(), cl.randn(shape.M, shape.C, shape.K, shape.K).cpu()
    ref = cl.ref.conv2d(x, w, stride=shape.stride, padding=shape.padding)
    y = ref.clone().float()
    for h in range(shape.Ho):
        for c in range(shape.Wo):
            if wrong(h, c, shape.Ho, shape.Wo):
                y[..., h, c] += 100.0 + 10 * h + c
    return vd.verdict(y, ref, inputs=(x, w, shape.stride, shape.padding))


def test_edge_advice_only_where_the_wrong_outputs_are_those_whose_windows_reach_outside():
    padded = ex.Shape(1, 2, 2, 16, 16, 3, pad=1)
    border = lambda h, c, Ho, Wo: h in (0, Ho - 1) or c in (0, Wo - 1)  # noqa: E731
    ok, text = _edge_verdict(padded, border)
    assert not ok and EDGE_ADVICE in text, text
    # a wrong output whose window lies inside the image: not the bounds test
    ok, text = _edge_verdict(padded, lambda h, c, Ho, Wo: border(h, c, Ho, Wo) or (h, c) == (5, 5))
    assert not ok and EDGE_ADVICE not in text, text
    # every output wrong, and no padding (no window reaches outside): never the bounds test
    for shape in (padded, ex.AWKWARD_SHAPES[0], ex.Shape(2, 1, 3, 12, 12, 3)):
        ok, text = _edge_verdict(shape, lambda h, c, Ho, Wo: True)
        assert not ok and EDGE_ADVICE not in text, (shape, text)
    smallest = ex.AWKWARD_SHAPES[0]                          # 5 x 5, K = 3, no padding
    ok, text = _edge_verdict(smallest, border)
    assert not ok and EDGE_ADVICE not in text and "(8 of 9 outputs wrong)" in text, text


def test_a_sum_that_starts_off_zero_is_named_by_its_offset():
    x, w = cl.randn(1, 2, 9, 9).cpu(), cl.randn(3, 2, 3, 3).cpu()
    ref = cl.ref.conv2d(x, w)
    ok, text = vd.verdict(ref + 0.5, ref, inputs=(x, w, 1, 0))
    assert not ok and text.startswith("every output is +0.5 off the reference") and "start at 0" in text, text
    ok, text = vd.verdict(ref + torch.rand_like(ref) + 0.5, ref, inputs=(x, w, 1, 0))
    assert not ok and "off the reference" not in text, text
