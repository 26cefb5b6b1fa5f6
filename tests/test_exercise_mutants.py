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
