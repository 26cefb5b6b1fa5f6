"""Each exercise's check against realistic mistakes: every mutant of a solution fails WITH the
mistake named in the verdict, every correct alternative passes. The kernels and launch helpers
come from solutions/*.ipynb (the %%cuda cells compiled with cl.load_source after a textual
mutation, the launch cells executed with the module bound), and go through convlab.exercise's
checks directly: no notebook is executed."""
import re
from pathlib import Path

import nbformat
import pytest
import torch

import convlab as cl
import convlab.exercise as ex
from convlab import magic

pytestmark = pytest.mark.emu_only

ROOT = Path(__file__).resolve().parent.parent
_counter = iter(range(10 ** 6))


def _nb(name):
    return nbformat.read(ROOT / "solutions" / f"{name}.ipynb", as_version=4)


def _cuda_cell(nb, module):
    for cell in nb.cells:
        if cell.cell_type == "code" and cell.source.startswith(f"%%cuda {module}"):
            line, _, body = cell.source.partition("\n")
            return magic.parse_line(line[len("%%cuda "):])[1], body
    raise KeyError(module)


def _mutate(text, changes):
    for old, new in changes:
        assert old in text, f"the mutation's text is not in the solution: {old!r}"
        text = text.replace(old, new, 1)
    return text


def _strip_markers(text):
    return re.sub(r"^[ \t]*(//|###)(\+| *(BEGIN|END) SOLUTION)[^\n]*\n", "", text, flags=re.M)


def _exercise(name, module, cuda=(), python=(), launch_cell="def launch"):
    """The namespace of exercise `name` after its %%cuda cell `module` (mutated by `cuda`) and the
    cells that define its launch helpers (mutated by `python`): (old, new) text pairs."""
    nb = _nb(name)
    defines, body = _cuda_cell(nb, module)
    body = _mutate(_strip_markers(body), cuda)
    ns = {"cl": cl, "ex": ex, "torch": torch}
    ns[module] = cl.load_source(body, name=f"{module}_m{next(_counter)}", defines=defines or None)
    for cell in nb.cells:
        if cell.cell_type == "code" and cell.source.startswith(launch_cell):
            src = _mutate(_strip_markers(cell.source), python)
            # the cell's own check (02's launch_4_blocks) is the test's to run
            src = re.sub(r"^ex\.check\w*\(.*$", "", src, flags=re.M)
            exec(compile(src, f"<{name} launch>", "exec"), ns)
    return ns


def _fails_with(verdict, capsys, *words):
    out = capsys.readouterr().out
    assert not verdict, f"a mutant passed: {out}"
    for word in words:
        assert word in out, f"{word!r} not in the verdict: {out}"
    assert "not done yet" not in out, out
    return out


def _passes(verdict, capsys):
    out = capsys.readouterr().out
    assert verdict, out
    return out


# ---- 02: the naive kernel on a flat grid ------------------------------------------------------

X_02 = "x[((b * C + c) * H + ih) * W + iw]"
K_02 = "k[((m * C + c) * K + p) * K + q]"
MUTANTS_02 = {
    "flipped mask": ([(K_02, "k[((m * C + c) * K + (K - 1 - p)) * K + (K - 1 - q)]")], (), "flipped"),
    "swapped mask axes": ([(K_02, "k[((m * C + c) * K + q) * K + p]")], (), "axes are swapped"),
    "padding ignored": ([("h * stride + p - pad", "h * stride + p"), ("w * stride + q - pad", "w * stride + q")],
                        (), "padding is ignored"),
    "stride ignored": ([("h * stride + p - pad", "h + p - pad"), ("w * stride + q - pad", "w + q - pad")], (),
                       "stride is ignored"),
    "= for +=": ([("acc += x", "acc = x")], (), "`=` where `+=` belongs"),
    "off-by-one bound": ([("iw < W)", "iw <= W)")], (), "bounds"),
    "rebinding y": ((), [("    conv = my_conv", "    y = torch.zeros_like(y)\n    conv = my_conv")],
                    "assigns to `y`"),
    "wrong pointer": ([("        y[i] = acc;", "        y[i + total] = acc;")], (), "out-of-range"),
}


@pytest.mark.parametrize("mistake", MUTANTS_02)
def test_02_mistakes_are_named(mistake, capsys):
    cuda, python, words = MUTANTS_02[mistake]
    ns = _exercise("02_naive_kernel", "my_conv", cuda, python)
    _fails_with(ex.check_kernel(ns["launch"]), capsys, words)


def test_02_no_grid_stride_loop_leaves_outputs_of_a_capped_grid_unwritten(capsys):
    ns = _exercise("02_naive_kernel", "my_conv", [("i += gridDim.x * blockDim.x", "i += 1 << 30")],
                   launch_cell="def launch_4_blocks")
    _fails_with(ex.check_kernel(ns["launch_4_blocks"]), capsys, "never written", "does every output get a thread")


@pytest.mark.parametrize("alternative", [
    [("acc += x[((b * C + c) * H + ih) * W + iw]\n                             * k[((m * C + c) * K + p) * K + q];",
      "acc = fmaf(k[((m * C + c) * K + p) * K + q], x[((b * C + c) * H + ih) * W + iw], acc);")],
    [("const int first = blockIdx.x * blockDim.x + threadIdx.x;",
      "const int first = threadIdx.x + blockDim.x * blockIdx.x;")],
])
def test_02_correct_alternatives_pass(alternative, capsys):
    ns = _exercise("02_naive_kernel", "my_conv", alternative)
    _passes(ex.check_kernel(ns["launch"]), capsys)


def test_02_counters_grade_coalescing(capsys):
    ns = _exercise("02_naive_kernel", "my_conv")
    out = _passes(ex.check_counters(ns["launch"], ex.check_targets("02"), shape=ex.COUNTER_SHAPE), capsys)
    assert "sectors per load request (target ≤ 2.8)" in out and "the line that moves the most" in out
    # lanes down a column: right, but a warp's loads are Ho rows apart
    ns = _exercise("02_naive_kernel", "my_conv", [
        ("const int w = i % Wo;\n        const int h = (i / Wo) % Ho;",
         "const int h = i % Ho;\n        const int w = (i / Ho) % Wo;"),
        ("        y[i] = acc;", "        y[((b * M + m) * Ho + h) * Wo + w] = acc;")])
    out = capsys.readouterr().out
    verdict = ex.check_counters(ns["launch"], ex.check_targets("02"), shape=ex.COUNTER_SHAPE)
    out = capsys.readouterr().out
    assert not verdict and "correct, but not within the targets" in out and "sectors per load request" in out


# ---- 03: the halo load and the barriers -------------------------------------------------------

def _check_03(ns):
    return ex.check_kernel(ns["launch"], name="conv2d_tiled")


MUTANTS_03 = {
    "missing barrier after the load": ([("        __syncthreads();\n\n        if (active)", "\n        if (active)")],
                                       (), "__syncthreads"),
    "missing barrier after the reads": ([("                         * c_mask[((m * C + c) * K + p) * K + q];\n\n"
                                          "        __syncthreads();", "                         * c_mask[((m * C + c) * K + p) * K + q];\n")],
                                        (), "__syncthreads"),
    "tile loaded in one pass": ([("i < in_w * in_w; i += TILE * TILE", "i < TILE * TILE; i += TILE * TILE")], (),
                                "__shared__ memory that no thread wrote"),
    "swapped h/w in the input": ([("? x[xbase + iy * W + ix]", "? x[xbase + ix * W + iy]")], (), "swapped"),
    "off-by-one bound": ([("ix >= 0 && ix < W)", "ix >= 0 && ix <= W)")], (), "bound"),
    "shared size in floats": ((), [("shared = 4 * in_w * in_w", "shared = in_w * in_w")], "shared="),
    "padding zeros missing": ([("(iy >= 0 && iy < H && ix >= 0 && ix < W) ? x[xbase + iy * W + ix] : 0.0f",
                                "x[xbase + iy * W + ix]")], (), "out-of-range"),
}


@pytest.mark.parametrize("mistake", MUTANTS_03)
def test_03_mistakes_are_named(mistake, capsys):
    cuda, python, words = MUTANTS_03[mistake]
    _fails_with(_check_03(_exercise("03_tiled_halo", "my_tiled", cuda, python)), capsys, words)


def test_03_a_two_dimensional_load_passes(capsys):
    two_d = """        for (int r = threadIdx.y; r < in_w; r += TILE)
            for (int s = threadIdx.x; s < in_w; s += TILE) {
                const int iy = iy0 + r, ix = ix0 + s;
                tile[r * in_w + s] = (iy >= 0 && iy < H && ix >= 0 && ix < W) ? x[xbase + iy * W + ix] : 0.0f;
            }"""
    ns = _exercise("03_tiled_halo", "my_tiled", [(
        """        for (int i = tid; i < in_w * in_w; i += TILE * TILE) {
            const int iy = iy0 + i / in_w, ix = ix0 + i % in_w;
            tile[i] = (iy >= 0 && iy < H && ix >= 0 && ix < W) ? x[xbase + iy * W + ix] : 0.0f;
        }""", two_d)])
    _passes(_check_03(ns), capsys)


def test_03_counters_pass_the_solution(capsys):
    ns = _exercise("03_tiled_halo", "my_tiled")
    out = _passes(ex.check_counters(ns["launch"], ex.check_targets("03"), shape=ex.COUNTER_SHAPE), capsys)
    assert "global load bytes per multiply-add (target ≤ 0.61)" in out


def test_03_counters_fail_a_load_per_multiply_add(capsys):
    # right, but every multiply-add loads x from global memory: the tile saves nothing
    ns = _exercise("03_tiled_halo", "my_tiled", [(
        "acc += tile[(threadIdx.y * stride + p) * in_w + threadIdx.x * stride + q]",
        "acc += ((iy0 + threadIdx.y * stride + p) >= 0 && (iy0 + threadIdx.y * stride + p) < H && "
        "(ix0 + threadIdx.x * stride + q) >= 0 && (ix0 + threadIdx.x * stride + q) < W ? "
        "x[xbase + (iy0 + threadIdx.y * stride + p) * W + ix0 + threadIdx.x * stride + q] : 0.0f)")])
    verdict = ex.check_counters(ns["launch"], ex.check_targets("03"), shape=ex.COUNTER_SHAPE)
    out = capsys.readouterr().out
    assert not verdict and "not within the targets" in out and "global load bytes per multiply-add" in out


# ---- 06: the half2 inner loop -----------------------------------------------------------------

W2_06 = "w2[((p * C + c) * K + ky) * K + kx]"
MUTANTS_06 = {
    "flipped mask": ([(W2_06, "w2[((p * C + c) * K + (K - 1 - ky)) * K + (K - 1 - kx)]")], (), "flipped"),
    "swapped mask axes": ([(W2_06, "w2[((p * C + c) * K + kx) * K + ky]")], (), "axes are swapped"),
    "padding ignored": ([("oy * stride - pad + ky, ix = ox * stride - pad + kx", "oy * stride + ky, ix = ox * stride + kx")],
                        (), "padding is ignored"),
    "stride ignored": ([("oy * stride - pad + ky, ix = ox * stride - pad + kx", "oy - pad + ky, ix = ox - pad + kx")],
                       (), "stride is ignored"),
    "= for +=": ([("acc = __hfma2(" + W2_06 + ", __half2half2(v), acc);", "acc = __hmul2(" + W2_06 + ", __half2half2(v));")],
                 (), "`=` where `+=` belongs"),
    "odd M's last pair left out": ((), [("(M + 1) // 2, 1)", "M // 2, 1)")], "ceil division"),
    "rebinding y": ((), [("    my_half2.kernel", "    y = torch.zeros_like(y)\n    my_half2.kernel")], "assigns to `y`"),
}


@pytest.mark.parametrize("mistake", MUTANTS_06)
def test_06_half2_mistakes_are_named(mistake, capsys):
    cuda, python, words = MUTANTS_06[mistake]
    ns = _exercise("06_half2", "my_half2", cuda, python, launch_cell="def pack_pairs")
    _fails_with(ex.check_kernel(ns["launch"], fp16="half"), capsys, words)


def test_06_half2_with_the_padding_as_a_skip_passes(capsys):
    ns = _exercise("06_half2", "my_half2", [(
        "const half v = (iy >= 0 && iy < H && ix >= 0 && ix < W) ? x[((b * C + c) * H + iy) * W + ix] : zero;\n"
        "                acc = __hfma2(",
        "if (iy < 0 || iy >= H || ix < 0 || ix >= W) continue;\n"
        "                const half v = x[((b * C + c) * H + iy) * W + ix];\n"
        "                acc = __hfma2(")], launch_cell="def pack_pairs")
    _passes(ex.check_kernel(ns["launch"], fp16="half"), capsys)


# ---- 07: the z-coarsened 3D loop --------------------------------------------------------------

MASK_07 = "c_mask[((KS - 1 - j) * KS + ky) * KS + kx]"
MUTANTS_07 = {
    "flipped mask": ([(MASK_07, "c_mask[(j * KS + (KS - 1 - ky)) * KS + (KS - 1 - kx)]")], (), "flipped"),
    "planes in the wrong order": ([(MASK_07, "c_mask[(j * KS + ky) * KS + kx]")], (), "planes are in the wrong order"),
    "swapped row and column": ([(MASK_07, "c_mask[((KS - 1 - j) * KS + kx) * KS + ky]")], (), "swapped"),
    "tile bound missing": ([("(gy < H && gx < W) ? x[((size_t)iz * H + gy) * W + gx] : 0.0f",
                             "x[((size_t)iz * H + gy) * W + gx]")], (), "out-of-range"),
    "grid short of planes": ((), [("(Do + ZC - 1) // ZC)", "Do // ZC)")], "ceil division"),
    "window not shifted": ([("for (int j = 0; j < KS - 1; ++j) acc[j] = acc[j + 1];", "")], (), "wrong at"),
}


@pytest.mark.parametrize("mistake", MUTANTS_07)
def test_07_mistakes_are_named(mistake, capsys):
    cuda, python, words = MUTANTS_07[mistake]
    ns = _exercise("07_conv3d_coarse", "my_coarse", cuda, python, launch_cell="KS, ZC, BY")
    _fails_with(ex.check_conv3d(ns["launch"], 3), capsys, words)


def test_07_a_tile_loaded_by_rows_passes(capsys):
    ns = _exercise("07_conv3d_coarse", "my_coarse", [(
        """        for (int i = tid; i < TR * TC; i += 32 * BY) {
            const int r = i / TC, c = i % TC, gy = y0 + r, gx = x0 + c;""",
        """        for (int r = row; r < TR; r += BY)
        for (int c = lane; c < TC; c += 32) {
            const int gy = y0 + r, gx = x0 + c;""")], launch_cell="KS, ZC, BY")
    _passes(ex.check_conv3d(ns["launch"], 3), capsys)


# ---- 08: dW with atomics, then a reduction ----------------------------------------------------

DW_08 = "atomicAdd(&dw[((m * C + c) * K + ky) * K + kx], g * x[((b * C + c) * H + iy) * W + ix]);"
MUTANTS_08 = {
    "+= instead of atomicAdd": ([(DW_08, "dw[((m * C + c) * K + ky) * K + kx] += g * x[((b * C + c) * H + iy) * W + ix];")],
                                (), "atomicAdd"),
    "flipped dw index": ([("atomicAdd(&dw[((m * C + c) * K + ky) * K + kx]",
                           "atomicAdd(&dw[((m * C + c) * K + (K - 1 - ky)) * K + (K - 1 - kx)]")], (), "flipped"),
    "swapped ky/kx": ([("atomicAdd(&dw[((m * C + c) * K + ky) * K + kx]", "atomicAdd(&dw[((m * C + c) * K + kx) * K + ky]")],
                      (), "swapped"),
    "stride ignored": ([("const int iy = oy * stride + ky - pad;", "const int iy = oy + ky - pad;"),
                        ("const int ix = ox * stride + kx - pad;", "const int ix = ox + kx - pad;")], (),
                       "stride is ignored"),
    "dw not zeroed": ((), [("    dw.zero_()          # the atomics add into dw\n", "")], "dw.zero_()"),
}


@pytest.mark.parametrize("mistake", MUTANTS_08)
def test_08_atomic_mistakes_are_named(mistake, capsys):
    cuda, python, words = MUTANTS_08[mistake]
    ns = _exercise("08_dw_atomics", "my_dw_atomic", cuda, python, launch_cell="def launch_atomic")
    _fails_with(ex.check_dw(ns["launch_atomic"]), capsys, words)


@pytest.mark.parametrize("mistake, cuda, words", [
    ("missing barrier in the tree", [("            partial[threadIdx.x] += partial[threadIdx.x + s];\n        __syncthreads();",
                                      "            partial[threadIdx.x] += partial[threadIdx.x + s];")], "__syncthreads"),
    ("padding ignored", [("const int iy = oy * stride + ky - pad, ix = ox * stride + kx - pad;",
                          "const int iy = oy * stride + ky, ix = ox * stride + kx;")], "padding is ignored"),
])
def test_08_reduction_mistakes_are_named(mistake, cuda, words, capsys):
    ns = _exercise("08_dw_atomics", "my_dw_reduce", cuda, launch_cell="def launch_reduce")
    _fails_with(ex.check_dw(ns["launch_reduce"]), capsys, words)


def test_08_both_solutions_pass(capsys):
    _passes(ex.check_dw(_exercise("08_dw_atomics", "my_dw_atomic", launch_cell="def launch_atomic")["launch_atomic"]),
            capsys)
    _passes(ex.check_dw(_exercise("08_dw_atomics", "my_dw_reduce", launch_cell="def launch_reduce")["launch_reduce"]),
            capsys)


# ---- 10: the fused epilogue -------------------------------------------------------------------

BEST_10 = "best = fmaxf(fmaxf(acc[0][0], acc[0][1]), fmaxf(acc[1][0], acc[1][1])) + bias[m];"
MUTANTS_10 = {
    "flipped mask": ([("w[((m * C + c) * K + ky) * K + kx]", "w[((m * C + c) * K + (K - 1 - ky)) * K + (K - 1 - kx)]")],
                     "flipped"),
    "swapped mask axes": ([("w[((m * C + c) * K + ky) * K + kx]", "w[((m * C + c) * K + kx) * K + ky]")], "swapped"),
    "ReLU missing": ([("    best = fmaxf(best, 0.0f);\n", "")], "ReLU is missing"),
    "bias missing": ([(BEST_10, BEST_10.replace(" + bias[m]", ""))], "bias is missing"),
    "bias after the ReLU": ([(BEST_10, BEST_10.replace(" + bias[m]", "")),
                             ("    best = fmaxf(best, 0.0f);", "    best = fmaxf(best, 0.0f) + bias[m];")],
                            "bias comes after the ReLU"),
    "average pooling": ([(BEST_10, "best = (acc[0][0] + acc[0][1] + acc[1][0] + acc[1][1]) / 4 + bias[m];")],
                        "average pooling"),
    "one corner of the window": ([(BEST_10, "best = acc[0][0] + bias[m];")], "only (2py, 2px)"),
    "output never written": ([("    y[i] = best;", "    if (best < -1e30f) y[i] = best;")], "none of the"),
}


@pytest.mark.parametrize("mistake", MUTANTS_10)
def test_10_mistakes_are_named(mistake, capsys):
    cuda, words = MUTANTS_10[mistake]
    ns = _exercise("10_fused_epilogue", "my_epilogue", cuda, launch_cell="def launch_epilogue")
    _fails_with(ex.check_stage(ns["launch_epilogue"]), capsys, words)


def test_10_rebinding_y_is_told(capsys):
    ns = _exercise("10_fused_epilogue", "my_epilogue", launch_cell="def launch_epilogue")

    def launch(x, w, bias, y):
        y = torch.empty_like(y)
        ns["launch_epilogue"](x, w, bias, y)
    _fails_with(ex.check_stage(launch), capsys, "assigns to `y`")


def test_10_relu_on_each_of_the_four_passes(capsys):
    ns = _exercise("10_fused_epilogue", "my_epilogue", [(
        BEST_10, "for (int i = 0; i < 4; ++i) best = fmaxf(best, fmaxf(acc[i / 2][i % 2] + bias[m], 0.0f));")],
        launch_cell="def launch_epilogue")
    _passes(ex.check_stage(ns["launch_epilogue"]), capsys)
