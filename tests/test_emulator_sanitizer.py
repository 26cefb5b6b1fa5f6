"""The emulator as a sanitizer: static shared memory poisoned and checked, races found by a
deterministic detector, every report at a source line, a hung launch stoppable. A mistake that
passes as correct fails here; each named mistake gives the same verdict ten times in a row."""
import os
import signal
import threading
import time

import pytest
import torch

import convlab as cl
import convlab.teach.checks as ex
import convlab.teach.verdict as vd

pytestmark = pytest.mark.emu_only

RUNS = 10


def same_every_time(fn):
    """fn() -> text, run RUNS times: the one text it always gives."""
    texts = {fn() for _ in range(RUNS)}
    assert len(texts) == 1, texts
    return texts.pop()


def good_launch_still_works(features):
    mod = cl.load(features / "atomics_warp.cu")
    x, y = cl.randn(100), cl.empty(100)
    mod.set_constant("c_scale", torch.tensor([1.0, 2.0, 3.0, 4.0]))
    mod.scale_by_constant(x, y, 100, grid=1, block=128)
    cl.check(y, x.double() * torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64).repeat(25))


# ---- static __shared__ arrays -----------------------------------------------------------------

def test_static_shared_is_poisoned_for_every_block(faults):
    mod = cl.load(faults / "static_shared.cu")
    y, yi = cl.zeros(3 * 32), cl.zeros(3 * 32, dtype=torch.int32)
    with cl.detect_races(False):
        mod.leftovers(y, yi, grid=3, block=32)
    assert bool(torch.isnan(y).all()), "a block saw an earlier block's shared values"
    assert bool((yi == -1).all())
    assert bool((y.view(torch.int32) == -1).all())   # all bits set: the poison exercise.verdict recognises


def test_pointers_into_static_shared_keep_working(faults):
    mod = cl.load(faults / "static_shared.cu")
    x, y = cl.randn(32), cl.empty(32)
    mod.through_pointers(x, y, grid=1, block=32)
    cl.check(y, 2 * x.double().flip(0))


def test_shared_index_past_the_end_names_array_index_thread_and_line(faults, features):
    mod = cl.load(faults / "reduce_mistakes.cu", defines={"MISTAKE": 2})
    x, out = cl.randn(3 * 200), cl.empty(3)

    def run():
        with pytest.raises(cl.OutOfBoundsError) as e:
            mod.sum_tree(x, out, 200, grid=3, block=128)
        return str(e.value)
    msg = same_every_time(run)
    assert "at tests/faults/reduce_mistakes.cu:32" in msg
    assert "__shared__ partial[128]" in msg and "outside its 128 elements (valid 0..127)" in msg
    assert "by thread (0,0,0) of block (0,0,0)" in msg and "one past the end" in msg
    good_launch_still_works(features)


def test_tree_reading_its_neighbour_is_a_race(faults):
    # partial[tid + 1]: thread 0 reads the element thread 1 updates in the same round
    mod = cl.load(faults / "reduce_mistakes.cu", defines={"MISTAKE": 3})
    x, out = cl.randn(3 * 200), cl.empty(3)

    def run():
        with pytest.raises(cl.RaceError) as e:
            mod.sum_tree(x, out, 200, grid=3, block=128)
        return str(e.value)
    msg = same_every_time(run)
    assert "data race on __shared__ partial[1]" in msg and "reduce_mistakes.cu:30" in msg


def test_shared_index_checked_per_dimension(faults):
    mod = cl.load(faults / "static_shared.cu")
    with pytest.raises(cl.OutOfBoundsError) as e:
        mod.row_past_the_end(cl.empty(64), grid=1, block=(8, 8))
    msg = str(e.value)
    assert "__shared__ t[0][9]" in msg and "index 9 of dimension 2 is outside its 9 elements" in msg
    assert "static_shared.cu:38" in msg and "thread (0,7,0) of block (0,0,0)" in msg


def test_tile_rows_never_loaded_is_named(faults):
    mod = cl.load(faults / "static_shared.cu")

    def run():
        x, y = cl.randn(12, 12), cl.empty(8, 8)
        mod.halo_rows_missing(x, y, 12, 12, grid=1, block=(8, 8))
        return vd.verdict(y, cl.randn(8, 8))[1]
    msg = same_every_time(run)
    assert "computed from __shared__ memory that no thread wrote" in msg and "stay inside what was written" in msg


# ---- the race detector ------------------------------------------------------------------------

def test_missing_barrier_in_a_loop_is_a_race_at_its_line(faults):
    mod = cl.load(faults / "racy_reduction.cu")
    x, out = cl.randn(4 * 128), cl.empty(4)
    msg = same_every_time(lambda: cl.find_race(lambda: mod.racy_reduction(x, out, grid=4, block=128), out))
    assert msg.startswith("racy_reduction: data race on __shared__ s[")
    assert "tests/faults/racy_reduction.cu:8" in msg
    assert "__syncthreads() right after tests/faults/racy_reduction.cu:8, inside its loop" in msg
    assert cl.find_race(lambda: mod.good_reduction(x, out, grid=4, block=128), out) is None


def _tiled_launch(mod):
    def launch(x, w, y, stride, pad):
        B, C, H, W = x.shape
        M, _, K, _ = w.shape
        Ho, Wo = cl.out_size(H, K, stride, pad), cl.out_size(W, K, stride, pad)
        in_w = 7 * stride + K
        tiles = ((Ho + 7) // 8) * ((Wo + 7) // 8)
        mod.conv2d_tiled(x, w, y, B, C, M, H, W, K, stride, pad, grid=(tiles, M, B), block=(8, 8),
                         shared=4 * in_w * in_w)
    return launch


def _check_text(launch, capsys):
    ex.check_kernel(launch)
    return capsys.readouterr().out


def test_the_two_missing_barriers_of_a_tile_are_told_apart(faults, capsys):
    first = same_every_time(lambda: _check_text(_tiled_launch(cl.load(faults / "tiled_mistakes.cu",
                                                                          defines={"MISTAKE": 1})), capsys))
    second = same_every_time(lambda: _check_text(_tiled_launch(cl.load(faults / "tiled_mistakes.cu",
                                                                           defines={"MISTAKE": 2})), capsys))
    assert first.startswith("✗") and "RaceError" in first and "data race on __shared__ tile[" in first
    # the load (line 25) writes, the multiply-add (line 33) reads: a barrier between them
    assert "writes it at tests/faults/tiled_mistakes.cu:25" in first
    assert "reads it at tests/faults/tiled_mistakes.cu:33" in first
    assert first.count("Put a __syncthreads() between tests/faults/tiled_mistakes.cu:25 and "
                       "tests/faults/tiled_mistakes.cu:33") == 1   # each race once
    # the next channel's load overwrites what others still read
    assert "reads it at tests/faults/tiled_mistakes.cu:33" in second
    assert "writes it at tests/faults/tiled_mistakes.cu:25" in second
    assert "between tests/faults/tiled_mistakes.cu:33 and tests/faults/tiled_mistakes.cu:25" in second
    assert first != second


def test_tile_load_that_does_not_cover_the_tile(faults, capsys):
    mod = cl.load(faults / "tiled_mistakes.cu", defines={"MISTAKE": 3})
    out = same_every_time(lambda: _check_text(_tiled_launch(mod), capsys))
    assert out.startswith("✗") and "computed from __shared__ memory that no thread wrote" in out


def test_correct_tiled_kernel_passes(faults, capsys):
    mod = cl.load(faults / "tiled_mistakes.cu", defines={"MISTAKE": 0})
    assert ex.check_kernel(_tiled_launch(mod))
    assert capsys.readouterr().out.startswith("✓ correct")


def test_plus_equals_where_atomic_belongs_fails_every_time(faults, features):
    mod = cl.load(faults / "reduce_mistakes.cu", defines={"MISTAKE": 1})
    x = cl.randn(1000)

    def run():
        out = cl.zeros(4)
        with pytest.raises(cl.RaceError) as e:
            mod.sum_atomic(x, out, 1000, grid=4, block=256)   # small: the detector is on by itself
        return str(e.value)
    msg = same_every_time(run)
    assert "data race on out[" in msg and "tests/faults/reduce_mistakes.cu:11" in msg
    assert "use atomicAdd at tests/faults/reduce_mistakes.cu:11" in msg
    good_launch_still_works(features)


def test_correct_atomics_are_never_a_race(faults):
    mod = cl.load(faults / "reduce_mistakes.cu", defines={"MISTAKE": 0})
    x = cl.randn(20000)
    out = cl.zeros(4)

    def launch():
        out.zero_()
        mod.sum_atomic(x, out, 20000, grid=79, block=256)
    for _ in range(RUNS):
        assert cl.find_race(launch, out) is None
    cl.check(out, x.double().view(-1, 4).sum(0))


def test_detector_off_for_large_launches_unless_asked(faults):
    mod = cl.load(faults / "reduce_mistakes.cu", defines={"MISTAKE": 1})
    x = cl.randn(1 << 15)
    mod.sum_atomic(x, cl.zeros(4), 1 << 15, grid=128, block=256)      # 32768 threads: a plain launch
    with cl.detect_races(), pytest.raises(cl.RaceError):
        mod.sum_atomic(x, cl.zeros(4), 1 << 15, grid=128, block=256)


def test_warp_shuffle_naming_lanes_that_returned(faults):
    mod = cl.load(faults / "static_shared.cu")
    with pytest.raises(cl.BarrierError) as e:
        mod.shuffle_with_gone_lanes(cl.empty(32), grid=1, block=32)
    msg = str(e.value)
    assert isinstance(e.value, cl.WarpMaskError)
    assert "names lanes 16-31 of warp 0" in msg and "already returned" in msg and "static_shared.cu:44" in msg


# ---- reports at the line a student sees -------------------------------------------------------

@pytest.fixture(scope="module")
def shell():
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "convlab.gpu.magic")
    return ip


CELL = """__global__ void k(const float* x, float* y, int n)
{
    __shared__ float s[32];
    s[threadIdx.x] = x[threadIdx.x];
    __syncthreads();
    if (threadIdx.x < n)
        y[threadIdx.x] = s[threadIdx.x + 1];
}
__global__ void bar(float* y)
{
    if (threadIdx.x < 16) return;
    __syncthreads();
    y[threadIdx.x] = 1.0f;
}
"""


def test_cell_reports_count_lines_as_jupyter_does(shell, capsys):
    shell.run_cell_magic("cuda", "mycell", CELL)
    assert "mycell: compiled" in capsys.readouterr().out
    mod = shell.user_ns["mycell"]
    with pytest.raises(cl.OutOfBoundsError) as e:
        mod.k(cl.randn(32), cl.empty(32), 32, grid=1, block=32)
    # `y[...] = s[threadIdx.x + 1]` is the source's line 7, the cell's line 8 (%%cuda is line 1)
    assert "at cell mycell, line 8:" in str(e.value) and "__shared__ s[32]" in str(e.value)
    with pytest.raises(cl.BarrierError) as e:
        mod.bar(cl.empty(32), grid=1, block=32)
    assert "cell mycell, line 13" in str(e.value) and ".cu" not in str(e.value)


def test_global_out_of_range_names_the_line(faults):
    mod = cl.load(faults / "out_of_range.cu")
    with pytest.raises(cl.OutOfBoundsError) as e:
        mod.past_end(cl.randn(100), cl.empty(100), 100, grid=4, block=32)
    assert "at tests/faults/out_of_range.cu:4:" in str(e.value)


# ---- stoppable launches -----------------------------------------------------------------------

def test_default_timeout_says_how_to_raise_it(faults, features):
    mod = cl.load(faults / "never_returns.cu")
    old = cl.default_timeout()
    cl.set_timeout(1.0)
    t0 = time.monotonic()
    try:
        with pytest.raises(cl.KernelTimeout) as e:
            mod.never_returns(cl.empty(64), 64, grid=2, block=32)
    finally:
        cl.set_timeout(old)
    assert time.monotonic() - t0 < 5
    msg = str(e.value)
    assert "no CUDA thread finished in the last" in msg and "cl.set_timeout(60)" in msg and "never_returns.cu:" in msg
    good_launch_still_works(features)


def test_long_launch_shows_progress(faults, capsys, monkeypatch):
    mod = cl.load(faults / "never_returns.cu")
    monkeypatch.setenv("CONVLAB_PROGRESS", "1")      # an interactive session (the tests turn it off)
    with pytest.raises(cl.KernelTimeout):
        mod.never_returns(cl.empty(64), 64, grid=2, block=32, timeout=2.6)
    err = capsys.readouterr().err
    assert "never_returns: " in err and "of 2 blocks done" in err and "interrupt to stop it" in err
    assert "never_returns: stopped after 2." in err


def test_no_progress_line_where_outputs_are_compared(faults, capsys):
    """make test and pytest (conftest.py) run with CONVLAB_PROGRESS=0: a slow machine prints nothing more."""
    mod = cl.load(faults / "never_returns.cu")
    with pytest.raises(cl.KernelTimeout):
        mod.never_returns(cl.empty(64), 64, grid=2, block=32, timeout=2.6)
    out = capsys.readouterr()
    assert out.err == "" and out.out == ""


def test_interrupt_stops_a_launch_within_a_second(faults, features):
    mod = cl.load(faults / "never_returns.cu")
    timer = threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT))
    t0 = time.monotonic()
    timer.start()
    with pytest.raises(cl.KernelInterrupted) as e:
        mod.never_returns(cl.empty(64), 64, grid=2, block=32, timeout=30)
    assert time.monotonic() - t0 < 2.0
    msg = str(e.value)
    assert msg.startswith("never_returns: interrupted after") and "never_returns.cu:" in msg
    assert isinstance(e.value, KeyboardInterrupt)
    good_launch_still_works(features)


def test_thousands_of_faulting_launches_leave_the_process_healthy(faults, features):
    oob = cl.load(faults / "out_of_range.cu")
    racy = cl.load(faults / "reduce_mistakes.cu", defines={"MISTAKE": 1})
    tree = cl.load(faults / "reduce_mistakes.cu", defines={"MISTAKE": 3})
    x, y, out = cl.randn(100), cl.empty(100), cl.zeros(4)
    for i in range(3000):
        kind = i % 3
        with pytest.raises(cl.KernelFault):
            if kind == 0:
                oob.past_end(x, y, 100, grid=4, block=32)
            elif kind == 1:
                racy.sum_atomic(x, out, 100, grid=1, block=128)
            else:
                tree.sum_tree(x, out[:1], 100, grid=1, block=128)
    good_launch_still_works(features)


# ---- verdicts that name the mistake -----------------------------------------------------------

NAIVE = r"""
__global__ void conv2d_flat(const float* x, const float* k, float* y,
                            int B, int C, int M, int H, int W, int K, int stride, int pad)
{
    const int Ho = (H + 2 * pad - K) / stride + 1, Wo = (W + 2 * pad - K) / stride + 1;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= B * M * Ho * Wo) return;
    const int w = i % Wo, h = (i / Wo) % Ho, m = (i / (Wo * Ho)) % M, b = i / (Wo * Ho * M);
    float acc = 0.0f;
    for (int c = 0; c < C; ++c)
        for (int p = 0; p < K; ++p)
            for (int q = 0; q < K; ++q) {
                const int ih = h * stride + p - pad, iw = w * stride + q - pad;
                if (ih >= 0 && ih < H && iw >= 0 && iw < W)
                    acc += x[((b * C + c) * H + ih) * W + iw] * k[((m * C + c) * K + p) * K + q];
            }
    y[i] = acc;
}
"""
MISTAKES = {
    "the mask is flipped": ("k[((m * C + c) * K + p) * K + q]", "k[((m * C + c) * K + K - 1 - p) * K + K - 1 - q]"),
    "the mask's axes are swapped": ("k[((m * C + c) * K + p) * K + q]", "k[((m * C + c) * K + q) * K + p]"),
    "h and w are swapped in the input's index": ("x[((b * C + c) * H + ih) * W + iw]", "x[((b * C + c) * H + iw) * W + ih]"),
    "h and w are swapped in the output's index": ("y[i] = acc", "y[((b * M + m) * Ho + w) * Wo + h] = acc"),
    "the padding is ignored": ("h * stride + p - pad, iw = w * stride + q - pad", "h * stride + p, iw = w * stride + q"),
    "the stride is ignored": ("h * stride + p - pad, iw = w * stride + q - pad", "h + p - pad, iw = w + q - pad"),
}


def _naive(source):
    mod = cl.load_source(source, name="naive_mistake")

    def launch(x, w, y, stride, pad):
        B, C, H, W = x.shape
        M, _, K, _ = w.shape
        n = y.numel()
        mod.conv2d_flat(x, w, y, B, C, M, H, W, K, stride, pad, grid=(n + 127) // 128, block=128)
    return launch


@pytest.mark.parametrize("name", list(MISTAKES))
def test_common_mistakes_are_named(name, capsys):
    old, new = MISTAKES[name]
    assert old in NAIVE
    launch = _naive(NAIVE.replace(old, new))
    out = same_every_time(lambda: _check_text(launch, capsys))
    assert out.startswith("✗") and name in out, out


def test_correct_naive_kernel_is_not_taken_for_a_mistake(capsys):
    assert ex.check_kernel(_naive(NAIVE))
    assert capsys.readouterr().out.startswith("✓ correct")


def test_result_rebound_instead_of_written(capsys):
    def launch(x, w, y, stride, pad):
        y = cl.ref.conv2d(x, w, stride=stride, padding=pad).float()  # noqa: F841 (the mistake)
    out = same_every_time(lambda: _check_text(launch, capsys))
    assert "assigns to `y`" in out and "y.copy_(" in out


def test_a_launch_that_writes_nothing_is_told_so(capsys):
    # no TODO stub in it: written code, so not "not done yet" but what it did not do
    assert not ex.check_kernel(lambda x, w, y, stride, pad: None)
    out = capsys.readouterr().out
    assert "none of the 9 outputs was written" in out and "not done" not in out
