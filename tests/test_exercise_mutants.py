"""Each exercise's check against realistic mistakes: every mutant of a solution fails WITH the
mistake named in the verdict, every correct alternative passes. The kernels and launch helpers
come from solutions/*.ipynb (the %%cuda cells compiled with cl.load_source after a textual
mutation, the launch cells executed with the module bound), and go through the exercise checks
(convlab.teach.checks and the chapters' modules) directly: no notebook is executed."""
import linecache
import math
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import nbformat
import pytest
import torch

import convlab as cl
import convlab.teach.checks as ex
from convlab.chapters import ch02_naive as ch2
from convlab.chapters import ch03_tiled as ch3
from convlab.chapters import ch03b_tiling_loses as ch3b
from convlab.chapters import ch04_im2col as ch4
from convlab.chapters import ch05_fused as ch5
from convlab.chapters import ch07_conv3d as ch7
from convlab.chapters import ch08_backprop as ch8
from convlab.chapters import ch09_general as ch9
from convlab.chapters import ch09b_tensor_cores as ch9b
from convlab.chapters import ch10_network as ch10
from convlab.chapters import ch11_hopper as ch11
from convlab.chapters import ch12_tf32 as ch12
from convlab.gpu import magic

pytestmark = pytest.mark.emu_only

#: The names an exercise notebook's first cell binds, which its other cells use.
NAMES = {"cl": cl, "ex": ex, "ch2": ch2, "ch3": ch3, "ch3b": ch3b, "ch4": ch4, "ch5": ch5, "ch7": ch7, "ch8": ch8,
         "ch9": ch9, "ch9b": ch9b, "ch10": ch10, "ch11": ch11, "ch12": ch12}

ROOT = Path(__file__).resolve().parent.parent
_counter = iter(range(10 ** 6))


def _nb(name):
    return nbformat.read(ROOT / "solutions" / f"{name}.ipynb", as_version=4)


def _cuda_cell(nb, module, ns):
    for cell in nb.cells:
        if cell.cell_type == "code" and cell.source.startswith(f"%%cuda {module}"):
            line, _, body = cell.source.partition("\n")
            # IPython expands {NAME} in a magic's line from the namespace
            return magic.parse_line(line[len("%%cuda "):].format(**ns))[1], body
    raise KeyError(module)


def _mutate(text, changes):
    for old, new in changes:
        assert old in text, f"the mutation's text is not in the solution: {old!r}"
        text = text.replace(old, new, 1)
    return text


def _strip_markers(text):
    return re.sub(r"^[ \t]*(//|###)(\+| *(BEGIN|END) SOLUTION)[^\n]*\n", "", text, flags=re.M)


def _run_cells(nb, ns, prefixes, changes=()):
    """Execute the code cells that start with one of prefixes, each change applied in the cell
    that holds its text (every change in one of them)."""
    unused = list(changes)
    for cell in nb.cells:
        if cell.cell_type == "code" and cell.source.startswith(prefixes):
            src = _strip_markers(cell.source)
            here = [c for c in unused if c[0] in src]
            src = _mutate(src, here)
            unused = [c for c in unused if c not in here]
            # the cell's own check (02's launch_4_blocks) is the test's to run: it ends the cell
            src = re.sub(r"^(?:ex|ch\d+b?)\.check\w*\(.*", "", src, flags=re.M | re.S)
            # as IPython does, the cell's source goes to linecache (the checks read a function's source)
            filename = f"<exercise cell {next(_counter)}>"
            linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
            exec(compile(src, filename, "exec"), ns)
    assert not unused, f"the mutation's text is in no cell: {unused}"


def _exercise(name, module, cuda=(), python=(), launch_cell="def launch", setup=()):
    """The namespace of exercise `name` after its setup cells, its %%cuda cell `module` (mutated by
    `cuda`) and the cells that define its launch helpers (mutated by `python`): (old, new) pairs."""
    nb = _nb(name)
    ns = {**NAMES, "torch": torch, "np": __import__("numpy")}
    if setup:
        _run_cells(nb, ns, tuple(setup))
    defines, body = _cuda_cell(nb, module, ns)
    body = _mutate(_strip_markers(body), cuda)
    ns[module] = cl.load_source(body, name=f"{module}_m{next(_counter)}", defines=defines or None)
    _run_cells(nb, ns, launch_cell if isinstance(launch_cell, tuple) else (launch_cell,), python)
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


LOOP_02 = """        for (int c = 0; c < C; ++c)
            for (int p = 0; p < K; ++p)
                for (int q = 0; q < K; ++q) {
                    const int ih = h * stride + p - pad;
                    const int iw = w * stride + q - pad;
                    if (ih >= 0 && ih < H && iw >= 0 && iw < W)
                        acc += x[((b * C + c) * H + ih) * W + iw]
                             * k[((m * C + c) * K + p) * K + q];
                }"""
UNPICK_02 = "const int w = i % Wo;\n        const int h = (i / Wo) % Ho;\n        const int m = (i / (Wo * Ho)) % M;"
#: right, and coalesced: a warp's lanes are consecutive output columns
COALESCED_02 = {
    "solution": [],
    # the valid taps' range worked out once: lanes at the image's edge start their loops elsewhere,
    # so a few requests span two rows (2.88 sectors per load request where the chapter's kernel has 2.8)
    "taps clamped to the image": [(LOOP_02, """        const int h0 = h * stride - pad, w0 = w * stride - pad;
        const int p0 = max(0, -h0), p1 = min(K, H - h0);
        const int q0 = max(0, -w0), q1 = min(K, W - w0);
        for (int c = 0; c < C; ++c)
            for (int p = p0; p < p1; ++p)
                for (int q = q0; q < q1; ++q)
                    acc += x[((b * C + c) * H + h0 + p) * W + w0 + q]
                         * k[((m * C + c) * K + p) * K + q];""")],
    "channels innermost": [(LOOP_02, LOOP_02.replace("for (int c = 0; c < C; ++c)\n            for (int p = 0; p < K; ++p)\n"
                                                     "                for (int q = 0; q < K; ++q) {",
                                                     "for (int p = 0; p < K; ++p)\n            for (int q = 0; q < K; ++q)\n"
                                                     "                for (int c = 0; c < C; ++c) {"))],
}
#: right, but uncoalesced: a warp's lanes are not consecutive output columns
UNCOALESCED_02 = {
    "lanes down a column": [(UNPICK_02, "const int h = i % Ho;\n        const int w = (i / Ho) % Wo;\n"
                                        "        const int m = (i / (Wo * Ho)) % M;"),
                            ("        y[i] = acc;", "        y[((b * M + m) * Ho + h) * Wo + w] = acc;")],
    "lanes over the maps": [(UNPICK_02, "const int m = i % M;\n        const int w = (i / M) % Wo;\n"
                                        "        const int h = (i / (M * Wo)) % Ho;"),
                            ("        y[i] = acc;", "        y[((b * M + m) * Ho + h) * Wo + w] = acc;")],
}


@pytest.mark.parametrize("variant", COALESCED_02)
def test_02_counters_pass_coalesced_kernels(variant, capsys):
    ns = _exercise("02_naive_kernel", "my_conv", COALESCED_02[variant])
    out = _passes(ch2.check_counters(ns["launch"], ch2.check_targets("02"), shape=ch2.FLAT_SHAPE), capsys)
    assert "sectors per load request (target ≤ 5.77)" in out and "the line that moves the most" in out, out
    assert "halfway between chapter 2's conv2d_naive_flat" in out, out


@pytest.mark.parametrize("variant", UNCOALESCED_02)
def test_02_counters_fail_uncoalesced_kernels(variant, capsys):
    ns = _exercise("02_naive_kernel", "my_conv", UNCOALESCED_02[variant])
    verdict = ch2.check_counters(ns["launch"], ch2.check_targets("02"), shape=ch2.FLAT_SHAPE)
    out = _fails_with(verdict, capsys, "correct, but not within the targets", "sectors per load request")
    assert "(global load:" in out.split("the line that moves the most: ")[1], out


def test_02_targets_separate_coalesced_from_uncoalesced_with_margin():
    """The targets lie between the two kinds with a factor of at least 1.5 on either side, and come from
    the chapter's kernel and the uncoalesced reference measured on the same shape (2.8 and 11.9
    sectors per load request on it)."""
    s = ch2.FLAT_SHAPE
    targets = ch2.check_targets("02")
    assert targets.key == "02" and "conv2d_naive_z in blocks of 1 × 32: 11.9, 24.0" in targets.source
    measured = {}
    for kind, variants in (("coalesced", COALESCED_02), ("uncoalesced", UNCOALESCED_02)):
        for name, changes in variants.items():
            ns = _exercise("02_naive_kernel", "my_conv", changes)
            x, w = cl.randn(s.B, s.C, s.H, s.W), cl.randn(s.M, s.C, s.K, s.K)
            y = cl.empty(s.B, s.M, s.Ho, s.Wo)
            k = cl.profile(lambda: ns["launch"](x, w, y, s.stride, s.padding)).kernels[-1]
            measured[kind, name] = ch2.quantity("sectors per load request", k, None)
    most = targets["sectors per load request"]
    assert all(v * 1.5 <= most for (kind, _), v in measured.items() if kind == "coalesced"), measured
    assert all(v >= 1.5 * most for (kind, _), v in measured.items() if kind == "uncoalesced"), measured
    # on another shape the targets are measured again on it
    again = targets.derive(ch2.COUNTER_SHAPE)
    assert again.shape == ch2.COUNTER_SHAPE and set(again) == set(targets) and again.key == "02"
    assert ch2.check_counters(_exercise("02_naive_kernel", "my_conv")["launch"], targets, shape=ch2.COUNTER_SHAPE)


# ---- advice only where its premise holds: wrong everywhere is not "check the bounds test" -------

EDGE_ADVICE = "only outputs at the image's edge are wrong"


@pytest.mark.parametrize("exercise, cuda, check, words", [
    ("02", [("float acc = 0.0f;", "float acc = 1.0f;")], None, ("every output is +1 off the reference",)),
    ("06", [("acc = __hfma2(pair, __half2half2(v), acc);", "acc = __hfma2(acc, pair, __half2half2(v));")], None,
     ("(9 of 9 outputs wrong)",)),
    ("05.2", [("acc[i][j] += a[i] * b[j];", "acc[j % TM][i] += a[i] * b[j];")], None, ("wrong at",)),
    ("05.2", [("            acc[i][j] = 0.0f;", "            acc[i][j] = 0.5f;")], None,
     ("every output is +0.5 off the reference",)),
], ids=["02 sum starts at 1", "06 __hfma2 arguments in the wrong order", "05.2 acc index swapped",
        "05.2 sum starts at 0.5"])
def test_wrong_everywhere_is_not_told_to_check_the_bounds(exercise, cuda, check, words, capsys):
    if exercise == "02":
        verdict = ex.check_kernel(_exercise("02_naive_kernel", "my_conv", cuda)["launch"])
    elif exercise == "06":
        verdict = ex.check_kernel(_exercise("06_half2", "my_half2", cuda, launch_cell="def pack_pairs")["launch"],
                                  fp16="half")
    else:
        ns = _regtile(cuda)
        verdict = ex.check_kernel(ns["launch"], ns["SHAPES"], locate=ns["where"])
    out = _fails_with(verdict, capsys, *words)
    assert EDGE_ADVICE not in out, out


# ---- 03: the halo load and the barriers -------------------------------------------------------

def _check_03(ns):
    return ex.check_kernel(ns["launch"], name="conv2d_tiled", thread_orders=True)


MUTANTS_03 = {
    "missing barrier after the load": ([("        __syncthreads();\n\n        if (active)", "\n        if (active)")],
                                       (), "__syncthreads"),
    "missing barrier after the reads": ([("                         * c_mask[((m * C + c) * K + p) * K + q];\n\n"
                                          "        __syncthreads();", "                         * c_mask[((m * C + c) * K + p) * K + q];\n")],
                                        (), "__syncthreads"),
    "tile loaded in one pass": ([("i < in_w * in_w; i += TILE * TILE", "i < TILE * TILE; i += TILE * TILE")], (),
                                "__shared__ memory that no thread wrote"),
    "swapped h/w in the input": ([("? x[xbase + iy * W + ix]", "? x[xbase + ix * W + iy]")], (), "swapped"),
    "off-by-one bound": ([("ix >= 0 && ix < W;", "ix >= 0 && ix <= W;")], (), "bound"),
    "shared size in floats": ((), [("shared = 4 * in_w * in_w", "shared = in_w * in_w")], "shared="),
    "padding zeros missing": ([("inside ? x[xbase + iy * W + ix] : 0.0f", "x[xbase + iy * W + ix]")], (),
                              "out-of-range"),
}


@pytest.mark.parametrize("mistake", MUTANTS_03)
def test_03_mistakes_are_named(mistake, capsys):
    cuda, python, words = MUTANTS_03[mistake]
    _fails_with(_check_03(_exercise("03a_tiled_halo", "my_tiled", cuda, python)), capsys, words)


def test_03_a_two_dimensional_load_passes(capsys):
    two_d = """        for (int r = threadIdx.y; r < in_w; r += TILE)
            for (int s = threadIdx.x; s < in_w; s += TILE) {
                const int iy = iy0 + r, ix = ix0 + s;
                tile[r * in_w + s] = (iy >= 0 && iy < H && ix >= 0 && ix < W) ? x[xbase + iy * W + ix] : 0.0f;
            }"""
    ns = _exercise("03a_tiled_halo", "my_tiled", [(
        """        for (int i = tid; i < in_w * in_w; i += TILE * TILE) {
            const int iy = iy0 + i / in_w, ix = ix0 + i % in_w;
            const bool inside = iy >= 0 && iy < H && ix >= 0 && ix < W;
            tile[i] = inside ? x[xbase + iy * W + ix] : 0.0f;
        }""", two_d)])
    _passes(_check_03(ns), capsys)


def test_03_counters_pass_the_solution(capsys):
    ns = _exercise("03a_tiled_halo", "my_tiled")
    out = _passes(ch2.check_counters(ns["launch"], ch3.check_targets("03a"), shape=ch2.COUNTER_SHAPE), capsys)
    assert "global load bytes per multiply-add (target ≤ 0.61)" in out


def test_03_counters_fail_a_load_per_multiply_add(capsys):
    # right, but every multiply-add loads x from global memory: the tile saves nothing
    ns = _exercise("03a_tiled_halo", "my_tiled", [(
        "acc += tile[(threadIdx.y * stride + p) * in_w\n                                + threadIdx.x * stride + q]",
        "acc += ((iy0 + threadIdx.y * stride + p) >= 0 && (iy0 + threadIdx.y * stride + p) < H && "
        "(ix0 + threadIdx.x * stride + q) >= 0 && (ix0 + threadIdx.x * stride + q) < W ? "
        "x[xbase + (iy0 + threadIdx.y * stride + p) * W + ix0 + threadIdx.x * stride + q] : 0.0f)")])
    verdict = ch2.check_counters(ns["launch"], ch3.check_targets("03a"), shape=ch2.COUNTER_SHAPE)
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
    "= for +=": ([("acc = __hfma2(pair, __half2half2(v), acc);", "acc = __hmul2(pair, __half2half2(v));")],
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
        "const bool inside = iy >= 0 && iy < H && ix >= 0 && ix < W;\n"
        "                const half v = inside ? x[((b * C + c) * H + iy) * W + ix] : zero;",
        "if (iy < 0 || iy >= H || ix < 0 || ix >= W) continue;\n"
        "                const half v = x[((b * C + c) * H + iy) * W + ix];")], launch_cell="def pack_pairs")
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
    _fails_with(ch7.check_conv3d(ns["launch"], 3), capsys, words)


def test_07_a_tile_loaded_by_rows_passes(capsys):
    ns = _exercise("07_conv3d_coarse", "my_coarse", [(
        """        for (int i = tid; i < TR * TC; i += 32 * BY) {
            const int r = i / TC, c = i % TC, gy = y0 + r, gx = x0 + c;""",
        """        for (int r = row; r < TR; r += BY)
        for (int c = lane; c < TC; c += 32) {
            const int gy = y0 + r, gx = x0 + c;""")], launch_cell="KS, ZC, BY")
    _passes(ch7.check_conv3d(ns["launch"], 3), capsys)


# ---- 08: dW with atomics, then a reduction ----------------------------------------------------

DW_08 = "atomicAdd(&dw[((m * C + c) * K + ky) * K + kx],\n                          g * x[((b * C + c) * H + iy) * W + ix]);"
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
    _fails_with(ch8.check_dw(ns["launch_atomic"]), capsys, words)


@pytest.mark.parametrize("mistake, cuda, words", [
    ("missing barrier in the tree", [("            partial[threadIdx.x] += partial[threadIdx.x + s];\n        __syncthreads();",
                                      "            partial[threadIdx.x] += partial[threadIdx.x + s];")], "__syncthreads"),
    ("padding ignored", [("const int iy = oy * stride + ky - pad, ix = ox * stride + kx - pad;",
                          "const int iy = oy * stride + ky, ix = ox * stride + kx;")], "padding is ignored"),
])
def test_08_reduction_mistakes_are_named(mistake, cuda, words, capsys):
    ns = _exercise("08_dw_atomics", "my_dw_reduce", cuda, launch_cell="def launch_reduce")
    _fails_with(ch8.check_dw(ns["launch_reduce"]), capsys, words)


def test_08_both_solutions_pass(capsys):
    _passes(ch8.check_dw(_exercise("08_dw_atomics", "my_dw_atomic", launch_cell="def launch_atomic")["launch_atomic"]),
            capsys)
    _passes(ch8.check_dw(_exercise("08_dw_atomics", "my_dw_reduce", launch_cell="def launch_reduce")["launch_reduce"]),
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
    _fails_with(ch10.check_stage(ns["launch_epilogue"]), capsys, words)


def test_10_rebinding_y_is_told(capsys):
    ns = _exercise("10_fused_epilogue", "my_epilogue", launch_cell="def launch_epilogue")

    def launch(x, w, bias, y):
        y = torch.empty_like(y)
        ns["launch_epilogue"](x, w, bias, y)
    _fails_with(ch10.check_stage(launch), capsys, "assigns to `y`")


def test_10_relu_on_each_of_the_four_passes(capsys):
    ns = _exercise("10_fused_epilogue", "my_epilogue", [(
        BEST_10, "for (int i = 0; i < 4; ++i) best = fmaxf(best, fmaxf(acc[i / 2][i % 2] + bias[m], 0.0f));")],
        launch_cell="def launch_epilogue")
    _passes(ch10.check_stage(ns["launch_epilogue"]), capsys)


# ---- 01: padding and stride in numpy ----------------------------------------------------------

def _padded(changes=()):
    ns = {"np": __import__("numpy")}
    _run_cells(_nb("01_conv2d_padding"), ns, ("def conv2d_padded",), changes)
    return ns["conv2d_padded"]


@pytest.mark.parametrize("change, words", [
    (("w[:, :, p, q]", "w[:, :, K - 1 - p, K - 1 - q]"), "flipped"),
    (("w[:, :, p, q]", "w[:, :, q, p]"), "axes are swapped"),
    ((("slice(p, p + stride * (Ho - 1) + 1, stride)", "slice(p, p + Ho)"),
      ("slice(q, q + stride * (Wo - 1) + 1, stride)", "slice(q, q + Wo)")), "stride is ignored"),
    (("y += np.einsum", "y = np.einsum"), "`=` where `+=` belongs"),
])
def test_01_mistakes_are_named(change, words, capsys):
    changes = change if isinstance(change[0], tuple) else [change]
    _fails_with(ex.check_function(_padded(changes)), capsys, words)


def test_01_solution_passes_and_a_missing_return_is_told(capsys):
    _passes(ex.check_function(_padded()), capsys)
    _fails_with(ex.check_function(_padded([("    return y", "    y")])), capsys, "returned None")


# ---- 04: im2col -------------------------------------------------------------------------------

ROW_04 = "const int row = (c * K + ky) * K + kx;"


@pytest.mark.parametrize("cuda, python, words", [
    ([(ROW_04, "const int row = (c * K + (K - 1 - ky)) * K + (K - 1 - kx);")], (), "flipped"),
    ([(ROW_04, "const int row = (c * K + kx) * K + ky;")], (), "axes are swapped"),
    ([("const int iy0 = oy * stride - pad, ix0 = ox * stride - pad;", "const int iy0 = oy * stride, ix0 = ox * stride;")],
     (), "padding is ignored"),
    ([("const int iy0 = oy * stride - pad, ix0 = ox * stride - pad;", "const int iy0 = oy - pad, ix0 = ox - pad;")],
     (), "stride is ignored"),
    ((), [("    torch.matmul(w.reshape(M, C * K * K), u, out=y.view(y.shape[0], M, -1))",
           "    y = torch.matmul(w.reshape(M, C * K * K), u)")], "assigns to `y`"),
])
def test_04_mistakes_are_named(cuda, python, words, capsys):
    ns = _exercise("04_im2col_unroll", "my_unroll", cuda, python, launch_cell=("def unroll", "def conv2d_im2col"),
                   )
    _fails_with(ex.check_kernel(ns["conv2d_im2col"]), capsys, words)


def test_04_solution_passes(capsys):
    ns = _exercise("04_im2col_unroll", "my_unroll", launch_cell=("def unroll", "def conv2d_im2col"))
    _passes(ex.check_kernel(ns["conv2d_im2col"]), capsys)


# ---- 05: implicit GEMM and register tiles -----------------------------------------------------

KXY_05 = "const int c = k / (K * K), ky = k % (K * K) / K, kx = k % K;"


@pytest.mark.parametrize("cuda, python, words", [
    ([(KXY_05, "const int c = k / (K * K), ky = K - 1 - k % (K * K) / K, kx = K - 1 - k % K;")], (), "flipped"),
    ([(KXY_05, "const int c = k / (K * K), kx = k % (K * K) / K, ky = k % K;")], (), "axes are swapped"),
    ([("(p / Wo) * stride - pad + ky;", "(p / Wo) - pad + ky;"), ("(p % Wo) * stride - pad + kx;", "(p % Wo) - pad + kx;")],
     (), "stride is ignored"),
    ((), [("(M + T - 1) // T, B)", "M // T, B)")], "ceil division"),
])
def test_05_implicit_gemm_mistakes_are_named(cuda, python, words, capsys):
    ns = _exercise("05_implicit_gemm", "my_fused", cuda, python)
    _fails_with(ex.check_kernel(ns["launch"]), capsys, words)


def test_05_implicit_gemm_solution_passes(capsys):
    _passes(ex.check_kernel(_exercise("05_implicit_gemm", "my_fused")["launch"]), capsys)


def _regtile(cuda=(), python=(), **tunables):
    """Exercise 5.2 mutated by `cuda` and `python`, at the tunables given (BM, BN, BK, TM, TN: the
    notebook's own for those left out)."""
    if not tunables:
        return _exercise("05_register_tiles", "my_regtile", cuda, python, setup=("BM, BN",))
    ns = {**NAMES, "torch": torch, "np": __import__("numpy")}
    nb = _nb("05_register_tiles")
    _run_cells(nb, ns, ("BM, BN",))
    ns.update(tunables)
    ns["THREADS"] = (ns["BM"] // ns["TM"]) * (ns["BN"] // ns["TN"])
    defines, body = _cuda_cell(nb, "my_regtile", ns)
    ns["my_regtile"] = cl.load_source(_mutate(_strip_markers(body), cuda), name=f"my_regtile_m{next(_counter)}",
                                      defines=defines)
    _run_cells(nb, ns, ("def launch",), python)
    return ns


def _regtile_targets(ns):
    return ch5.check_targets("05_register_tiles", **{k: ns[k] for k in ("BM", "BN", "BK", "TM", "TN")})


@pytest.mark.parametrize("cuda, python, words", [
    ([("acc[i][j] += a[i] * b[j];", "acc[i][j] = a[i] * b[j];")], (), "+="),
    ((), [("    my_regtile.kernel", "    y = torch.zeros_like(y)\n    my_regtile.kernel")], "assigns to `y`"),
    # the emulator stops at Bs[0][64]; read on as a GPU does, the outputs name the index that is off
    ([("b[j] = Bs[kk][tn * TN + j];", "b[j] = Bs[kk][tn * TN + j + 1];")], (),
     ("Bs[0][64]", "acc[i][j] holds the value of acc[i][j+1]: its index j is off by +1 (the same thread")),
])
def test_05_register_tile_mistakes_are_named(cuda, python, words, capsys):
    ns = _regtile(cuda, python)
    words = (words,) if isinstance(words, str) else words
    _fails_with(ex.check_kernel(ns["launch"], ns["SHAPES"], locate=ns["where"]), capsys, *words)


def test_05_register_tiles_solution_passes(capsys):
    ns = _regtile()
    _passes(ex.check_kernel(ns["launch"], ns["SHAPES"], locate=ns["where"]), capsys)


def _dispatch(change=()):
    ns = {}
    _run_cells(_nb("05_dispatch_rule"), ns, ("from convlab", "def pick"), change)
    return ns


def test_05_dispatch_rules(capsys):
    ns = _dispatch()
    _passes(ch5.check_pick(ns["pick"], ns["times"], ns["layers"], device=ns["gpu"]), capsys)
    always = _dispatch([("choice = fused.DIRECT_REGTILE.name if small else fused.IMPLICIT_GEMM_REG.name",
                         "choice = fused.IMPLICIT_GEMM_REG.name")])
    _fails_with(ch5.check_pick(always["pick"], ns["times"], ns["layers"], device=ns["gpu"]), capsys, "slower kernel")
    typo = _dispatch([("choice = fused.DIRECT_REGTILE.name if small", "choice = 'direct' if small")])
    _fails_with(ch5.check_pick(typo["pick"], ns["times"], ns["layers"], device=ns["gpu"]), capsys, "none of the kernels")


# ---- 06: the WMMA loop ------------------------------------------------------------------------

def _wmma(cuda=()):
    return _exercise("06_wmma_loop", "my_wmma", cuda)


@pytest.mark.parametrize("cuda, words", [
    ([("wmma::load_matrix_sync(a, &As[0][0], LDA);", "wmma::load_matrix_sync(a, &As[0][0], 16);")], "leading dimension"),
    # every warp reads warp 0's columns: the outputs of warp 1 are warp 0's (derived from the values)
    ([("wmma::load_matrix_sync(b, &Bs[0][warp * 16], LDB);", "wmma::load_matrix_sync(b, &Bs[0][0], LDB);")],
     "warp 1 holds what warp 0 computes, as if an offset by warp were left out (the same block, row, column); "
     "every wrong output is warp 1's"),
    # a legal store with the tile's width as its leading dimension: right values in the wrong places
    ([("wmma::store_matrix_sync(&Cs[0][warp * 16], acc, LDC,", "wmma::store_matrix_sync(&Cs[0][warp * 16], acc, 16,")],
     "a leading dimension of 16 where a row of the array holds 36"),
])
def test_06_wmma_mistakes_are_named(cuda, words, capsys):
    ns = _wmma(cuda)
    _fails_with(ex.check_kernel(ns["launch"], ns["SHAPES"], fp16="float", locate=ns["where"]), capsys, words)


def test_06_wmma_solution_passes(capsys):
    ns = _wmma()
    _passes(ex.check_kernel(ns["launch"], ns["SHAPES"], fp16="float", locate=ns["where"]), capsys)


# ---- 09: profiling ----------------------------------------------------------------------------

def _scale_check(changes=()):
    ns = _exercise("03b_profiling", "scale", changes, launch_cell="H = W")
    x, y, H, W = ns["x"], ns["y"], ns["H"], ns["W"]
    return ch2.check_counters(lambda: ns["scale"].kernel("scale")(x, y, H, W, 2.0, grid=(1, H), block=W),
                             ch3b.check_targets("03b.scale"), result=lambda: (y, 2 * x), name="scale")


def test_09_scale(capsys):
    _passes(_scale_check(), capsys)
    # the mapping left as it was: right, but a warp's loads are W floats apart
    _fails_with(_scale_check([("    w = blockIdx.x * blockDim.x + threadIdx.x;\n    h = blockIdx.y;\n", "")]),
                capsys, "not within the targets", "sectors per load request")
    # a fault is a message, not a traceback
    _fails_with(_scale_check([("y[h * W + w] = a * x[h * W + w];", "y[h * W + w] = a * x[h * W + w + 1];")]),
                capsys, "out-of-range")


def _colsum_check(changes=()):
    ns = _exercise("03b_profiling", "colsum", changes, launch_cell="x, sums")
    x, sums = ns["x"], ns["sums"]
    return ch2.check_counters(lambda: ns["colsum"].kernel("column_sums")(x, sums, grid=1, block=32),
                             ch3b.check_targets("03b.colsum"), result=lambda: (sums, x.sum(0)), name="column_sums")


def test_09_column_sums(capsys):
    _passes(_colsum_check(), capsys)
    _fails_with(_colsum_check([("#define ROW 33", "#define ROW 32")]), capsys, "shared bank conflicts (target 0) ✗")
    _fails_with(_colsum_check([("    sums[tx] = s;", "    sums[tx] = s + tile[tx][0];")]), capsys, "wrong at")


# ---- 11: mma fragments ------------------------------------------------------------------------

def _fragments(cuda=()):
    return _exercise("09b_mma_fragments", "frag", cuda, launch_cell=("def a_element", "def labelled"))


@pytest.mark.parametrize("cuda, check, words", [
    ([("    col = 8 * (l / 16);", "    col = 8 * (l % 2);")], "a", "lane 0, register 2 holds A[0][0]"),
    ([("    row = l / 4 + 8 * (i / 2);\n    col = 2 * (l % 4) + i % 2;", "    row = l / 4 + 8 * (i % 2);\n    col = 2 * (l % 4) + i / 2;")],
     "d", "the layout puts lane"),
])
def test_11_fragment_mistakes_name_the_lane(cuda, check, words, capsys):
    ns = _fragments(cuda)
    if check == "a":
        regs = ns["load"]("load_a", 16, 16, 4)
        verdict = ch9b.check_fragment("ldmatrix_x4 -> A fragment", regs, ns["a_element"], "A")
    else:
        D = cl.empty(16, 8)
        ns["frag"].kernel("store_d")(D, grid=1, block=32)
        verdict = ch9b.check_placement("D", D.cpu(), ns["d_element"])
    _fails_with(verdict, capsys, words)


def test_06_wmma_misaligned_pointer_names_the_array_and_the_line(capsys):
    ns = _wmma([("wmma::load_matrix_sync(b, &Bs[0][warp * 16], LDB);",
                 "wmma::load_matrix_sync(b, &Bs[0][warp * 16 + 4], LDB);")])
    out = _fails_with(ex.check_kernel(ns["launch"], ns["SHAPES"], fp16="float"), capsys,
                      "32-byte (256-bit) aligned, but it points at __shared__ Bs[4]", "8 bytes past")
    assert "0x7" not in out and re.search(r"my_wmma_m\d+\.cu:\d+", out), out


#: correct micro-tiles whose shared loads nvcc compiles as the solution's: the products straight
#: from shared memory (nvcc keeps each As and Bs value of a step in a register: the same 12
#: ld.shared a step), the loads inside the product loop, the loops in the other order
REGTILE_SAME_LOADS = {
    "products from shared memory": [("acc[i][j] += a[i] * b[j];", "acc[i][j] += As[kk][tm * TM + i] * Bs[kk][tn * TN + j];")],
    "j outer": [("""            for (int i = 0; i < TM; ++i)
                for (int j = 0; j < TN; ++j)
                    acc[i][j] += a[i] * b[j];""", """            for (int j = 0; j < TN; ++j)
                for (int i = 0; i < TM; ++i)
                    acc[i][j] = fmaf(a[i], b[j], acc[i][j]);""")],
}


@pytest.mark.parametrize("cuda, tunables", [
    ((), {}),
    (REGTILE_SAME_LOADS["products from shared memory"], {}),
    (REGTILE_SAME_LOADS["j outer"], {}),
    ((), {"BM": 64, "BN": 32, "TM": 8, "TN": 4}),     # a tile taller than the shape's 32 maps
    ((), {"TM": 8, "TN": 8, "BK": 4}),
], ids=["solution", "products from shared memory", "j outer", "BM=64 BN=32 TM=8 TN=4", "TM=8 TN=8 BK=4"])
def test_05_register_tile_counters_pass_correct_tiles(cuda, tunables, capsys):
    ns = _regtile(cuda, **tunables)
    assert _passes(ex.check_kernel(ns["launch"], ns["SHAPES"], locate=ns["where"]), capsys)
    out = _passes(ch2.check_counters(ns["launch"], _regtile_targets(ns), shape=ch5.counter_shape("05_register_tiles")),
                  capsys)
    if not tunables:
        assert "0.375 shared loads per multiply-add (target ≤ 0.375)" in out, out
    assert f"BM={ns['BM']}, BN={ns['BN']}, BK={ns['BK']}, TM={ns['TM']}, TN={ns['TN']}" in out, out


def test_05_register_tile_shared_loads_agree_with_nvcc():
    """The rule the counters grade by (ch2.shared_values) against nvcc itself: the variants it counts
    as the solution compile to as many shared loads per multiply-add, counted in 4-byte values
    (ld.shared.v4 and LDS.128 are 4): in PTX wherever nvcc is (no GPU needed), and in SASS too
    where cuobjdump is."""
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)
    if nvcc is None:
        pytest.skip("needs nvcc")
    cuobjdump = shutil.which("cuobjdump") or shutil.which("cuobjdump", path=str(Path(nvcc).resolve().parent))
    counts = [_ptx_shared_values] + ([lambda *a: _sass_shared_values(cuobjdump, *a)] if cuobjdump else [])
    for count in counts:
        def values(nb, module, changes, defines):
            _, body = _cuda_cell(_nb(nb), module, defines)
            return count(nvcc, _mutate(_strip_markers(body), changes), defines)

        regtile = dict(BM=32, BN=64, BK=8, TM=4, TN=8)
        want = values("05_register_tiles", "my_regtile", (), regtile)
        for name, changes in REGTILE_SAME_LOADS.items():
            assert values("05_register_tiles", "my_regtile", changes, regtile) == want, name
        direct = dict(MT=4, ROWS=3, BLOCK=64, M_OUT=4, C_IN=2, KSIZE=5, STRIDE=1)
        want = values("05_direct_regtile", "my_direct", (), direct)
        for name, changes in {"scalar mask loads": SCALAR_05D, "rows outer": ROWS_OUTER_05D}.items():
            assert values("05_direct_regtile", "my_direct", changes, direct) == want, name


def _compiled(nvcc, source, defines, kind):
    """source compiled by nvcc: PTX for sm_80 (kind "ptx") or a cubin for sm_90 ("cubin"), as bytes."""
    with tempfile.TemporaryDirectory() as tmp:
        cu, out = Path(tmp) / "k.cu", Path(tmp) / f"k.{kind}"
        cu.write_text(source)
        subprocess.run([nvcc, f"-{kind}", "-arch=sm_80" if kind == "ptx" else "-arch=sm_90",
                        *(f"-D{k}={v}" for k, v in defines.items()), str(cu), "-o", str(out)],
                       check=True, capture_output=True)
        return out.read_bytes()


def _ptx_shared_values(nvcc, source, defines):
    """4-byte values loaded by the ld.shared instructions of source compiled by nvcc to PTX (sm_80),
    per fused multiply-add (the same ratio however far nvcc unrolls a loop)."""
    text = _compiled(nvcc, source, defines, "ptx").decode()
    loads = re.findall(r"ld\.shared(?:\.v(\d))?\.[bfsu]\d+", text)
    return sum(int(v or 1) for v in loads) / len(re.findall(r"\bfma\.rn\.f32\b", text))


def _sass_shared_values(cuobjdump, nvcc, source, defines):
    """The same in the SASS of an sm_90 cubin (LDS, LDS.64, LDS.128 per FFMA), read by cuobjdump."""
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(_compiled(nvcc, source, defines, "cubin"))
        text = subprocess.run([cuobjdump, "-sass", str(cubin)], check=True, capture_output=True, text=True).stdout
    loads = re.findall(r"\bLDS(?:\.U)?(?:\.(64|128))?\b", text)
    return sum({"": 1, "64": 2, "128": 4}[w] for w in loads) / len(re.findall(r"\bFFMA\b", text))


# ---- untouched exercises: "not done yet", and only there -----------------------------------------

def _exercise_cells(name, module, launch_cell="def launch", setup=()):
    """Exercise `name` as scripts/make_exercises.py generates it: its TODO stubs in place."""
    spec = __import__("importlib.util").util.spec_from_file_location("make_exercises",
                                                                     ROOT / "scripts" / "make_exercises.py")
    make = __import__("importlib.util").util.module_from_spec(spec)
    spec.loader.exec_module(make)
    nb = make.make_exercise(_nb(name), f"{name}.ipynb")
    ns = {**NAMES, "torch": torch, "np": __import__("numpy")}
    _run_cells(nb, ns, tuple(setup)) if setup else None
    defines, body = _cuda_cell(nb, module, ns)
    ns[module] = cl.load_source(body, name=f"{module}_x{next(_counter)}", defines=defines or None)
    _run_cells(nb, ns, launch_cell if isinstance(launch_cell, tuple) else (launch_cell,))
    return ns


@pytest.mark.parametrize("name, module, launch_cell, check", [
    ("02_naive_kernel", "my_conv", "def launch_4_blocks", lambda ns: ex.check_kernel(ns["launch_4_blocks"])),
    ("02_naive_kernel", "my_conv", "def launch", lambda ns: ex.check_kernel(ns["launch"])),
    ("03a_tiled_halo", "my_tiled", "def launch", lambda ns: ex.check_kernel(ns["launch"], thread_orders=True)),
    ("06_half2", "my_half2", "def pack_pairs", lambda ns: ex.check_kernel(ns["launch"], fp16="half")),
    ("07_conv3d_coarse", "my_coarse", "KS, ZC, BY", lambda ns: ch7.check_conv3d(ns["launch"], 3)),
    ("08_dw_atomics", "my_dw_atomic", "def launch_atomic", lambda ns: ch8.check_dw(ns["launch_atomic"])),
    ("10_fused_epilogue", "my_epilogue", "def launch_epilogue", lambda ns: ch10.check_stage(ns["launch_epilogue"])),
])
def test_untouched_exercises_are_not_done_yet(name, module, launch_cell, check, capsys):
    assert not check(_exercise_cells(name, module, launch_cell))
    out = capsys.readouterr().out
    assert out.startswith("not done yet: the TODO in ") and out.count("\n") == 1, out


def test_untouched_functions_unroll_and_fragments_are_not_done_yet(capsys):
    ns = {"np": __import__("numpy")}
    spec = __import__("importlib.util").util.spec_from_file_location("make_exercises",
                                                                     ROOT / "scripts" / "make_exercises.py")
    make = __import__("importlib.util").util.module_from_spec(spec)
    spec.loader.exec_module(make)
    _run_cells(make.make_exercise(_nb("01_conv2d_padding"), "01.ipynb"), ns, ("def conv2d_padded",))
    assert not ex.check_function(ns["conv2d_padded"])
    assert not ch4.check_unroll(_exercise_cells("04_im2col_unroll", "my_unroll", "def unroll")["unroll"])
    frag = _exercise_cells("09b_mma_fragments", "frag", ("def a_element", "def labelled"))
    assert not ch9b.check_fragment("A", frag["load"]("load_a", 16, 16, 4), frag["a_element"], "A", todo=frag["frag"])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and all(line.startswith("not done yet: the TODO in ") for line in lines), lines


@pytest.mark.parametrize("cuda, words", [
    ([(ROW_04, "const int row = (c * K + kx) * K + ky;")], "row 1 = (c=0, ky=0, kx=1)"),
    ([("inside ? x[((b * C + c) * H + iy) * W + ix] : 0.0f", "x[((b * C + c) * H + iy) * W + ix]")], "out-of-range"),
])
def test_04_unroll_mistakes_name_the_entry(cuda, words, capsys):
    ns = _exercise("04_im2col_unroll", "my_unroll", cuda, launch_cell="def unroll")
    _fails_with(ch4.check_unroll(ns["unroll"]), capsys, words)


@pytest.mark.parametrize("cuda", [(), [("    col = 8 * (l / 16);", "    col = l < 16 ? 0 : 8;")]])
def test_11_solution_and_an_alternative_pass(cuda, capsys):
    ns = _fragments(cuda)
    assert ch9b.check_fragment("A", ns["load"]("load_a", 16, 16, 4), ns["a_element"], "A", todo=ns["frag"])
    assert ch9b.check_fragment("B", ns["load"]("load_b", 16, 8, 2), ns["b_element"], "B", todo=ns["frag"])
    D = cl.empty(16, 8)
    ns["frag"].kernel("store_d")(D, grid=1, block=32)
    assert ch9b.check_placement("D", D.cpu(), ns["d_element"], todo=ns["frag"])
    _passes(True, capsys)


def test_07_counters_grade_the_tile_loads(capsys):
    ns = _exercise("07_conv3d_coarse", "my_coarse", launch_cell="KS, ZC, BY")
    out = _passes(ch7.check_conv3d_counters(ns["launch"], 3, ch7.check_targets("07")), capsys)
    assert "0 shared bank conflicts (target 0)" in out
    # the tile loaded down its columns: right, but a warp's loads are rows apart
    ns = _exercise("07_conv3d_coarse", "my_coarse", [("const int r = i / TC, c = i % TC,", "const int r = i % TR, c = i / TR,")],
                   launch_cell="KS, ZC, BY")
    verdict = ch7.check_conv3d_counters(ns["launch"], 3, ch7.check_targets("07"))
    out = capsys.readouterr().out
    assert not verdict and "not within the targets" in out and "sectors per load request" in out, out


def test_08_tree_with_assignment_is_named(capsys):
    ns = _exercise("08_dw_atomics", "my_dw_reduce", [("partial[threadIdx.x] += partial[threadIdx.x + s];",
                                                      "partial[threadIdx.x] = partial[threadIdx.x + s];")],
                   launch_cell="def launch_reduce")
    _fails_with(ch8.check_dw(ns["launch_reduce"]), capsys, "with `=` partial[0] holds one thread's sum")
    # on a shape where that thread has pixels, the mistake is named by its output
    _fails_with(ch8.check_dw(ns["launch_reduce"], ex.AWKWARD_SHAPES[1:]), capsys, "`=` where `+=` belongs in the tree")


# ---- 02: an honest timing (graded on the simulated GPU) ----------------------------------------

EVENTS_02T = ("        start, end = gpu.event(), gpu.event()\n        start.record()\n        fn()\n        end.record()\n"
              "        end.synchronize()       # the host waits until the GPU has passed `end`\n"
              "        times.append(start.elapsed_time(end))")


def _time_it(changes=()):
    ns = {}
    _run_cells(_nb("02_timing"), ns, ("import statistics", "def time_it"), changes)
    return ns["time_it"]


MUTANTS_02T = {
    "host clock, no synchronize": ([(EVENTS_02T, "        t0 = gpu.now()\n        fn()\n        times.append(gpu.now() - t0)")],
                                   ("host's clock times only the launch", "synchronize")),
    "no warm-up": ([("warmup=3", "warmup=0")], ("no warm-up", "compiles the kernel")),
    "no L2 flush": ([("        gpu.flush_l2()          # a cold L2, as a layer finds it in a network\n", "")],
                    ("hot-cache time", "flush L2")),
    "flush inside the timed interval": ([("        gpu.flush_l2()          # a cold L2, as a layer finds it in a network\n", ""),
                                         ("        start.record()\n", "        start.record()\n        gpu.flush_l2()\n")],
                                        ("the L2 flush is inside the timed interval", "before recording the start event")),
    "the mean": ([("    return median, p25, p75", "    return statistics.mean(times), p25, p75")],
                 ("is the mean of your 20 runs", "other work", "the median")),
    "events not waited for": ([("        end.synchronize()       # the host waits until the GPU has passed `end`\n", "")],
                              ("events recorded but not waited for", "cudaErrorNotReady")),
    "too few runs": ([("runs=20", "runs=4")], ("4 timed runs: too few to say a spread",)),
    "min(times) as the median": ([("    return median, p25, p75", "    return min(times), p25, p75")],
                                 ("the fastest of your 20 runs (min(times)), not their median", "statistics.median")),
    "max(times) as the median": ([("    return median, p25, p75", "    return max(times), p25, p75")],
                                 ("the slowest of your 20 runs (max(times)), not their median",)),
    "the quartiles' order mixed up": ([("    p25, median, p75 = statistics.quantiles(times, n=4)",
                                        "    median, p25, p75 = statistics.quantiles(times, n=4)")],
                                      ("the first quartile of your runs", "[p25, median, p75], in that order")),
    "one interval around all runs": ([(
        "    for _ in range(runs):\n        gpu.flush_l2()          # a cold L2, as a layer finds it in a network\n" + EVENTS_02T,
        "    start, end = gpu.event(), gpu.event()\n    start.record()\n    for _ in range(runs):\n        gpu.flush_l2()\n"
        "        fn()\n    end.record()\n    end.synchronize()\n    times = [start.elapsed_time(end) / runs] * 3")],
        ("1 timed run (20 calls in one interval: their mean, with no spread)",)),
}


@pytest.mark.parametrize("mistake", MUTANTS_02T)
def test_02_timing_mistakes_are_named(mistake, capsys):
    changes, words = MUTANTS_02T[mistake]
    out = _fails_with(ch2.check_timing(_time_it(changes), seed=7), capsys, *words)
    if "median" in mistake:
        assert "the quartiles" not in out and "the mean" not in out, out


@pytest.mark.parametrize("alternative", [
    [],
    # its own flush buffer, zeroed before each run
    [("        gpu.flush_l2()          # a cold L2, as a layer finds it in a network\n", "        buf.zero_()\n"),
     ("    times = []\n", "    times = []\n    buf = gpu.empty(2 * gpu.L2_BYTES)\n")],
    # the host's clock, the GPU idle before and done after; the median by statistics.median
    [(EVENTS_02T, "        gpu.synchronize()\n        t0 = gpu.now()\n        fn()\n        gpu.synchronize()\n"
                  "        times.append(gpu.now() - t0)"),
     ("    p25, median, p75 = statistics.quantiles(times, n=4)",
      "    p25, _, p75 = statistics.quantiles(times, n=4)\n    median = statistics.median(times)")],
    # numpy's percentiles; the upper of the two middle runs as the median
    [("    p25, median, p75 = statistics.quantiles(times, n=4)",
      "    import numpy as np\n    p25, median, p75 = np.percentile(times, [25, 50, 75])")],
    [("    p25, median, p75 = statistics.quantiles(times, n=4)",
      "    p25, _, p75 = statistics.quantiles(times, n=4)\n    median = sorted(times)[len(times) // 2]")],
])
def test_02_timing_correct_alternatives_pass(alternative, capsys):
    out = _passes(ch2.check_timing(_time_it(alternative), seed=7), capsys)
    assert "on the emulator: comparing time_it with cl.bench on the chapter's kernel needs a GPU" in out


def test_02_timing_untouched_is_not_done_yet_and_the_quartiles_answer(capsys):
    spec = __import__("importlib.util").util.spec_from_file_location("make_exercises",
                                                                     ROOT / "scripts" / "make_exercises.py")
    make = __import__("importlib.util").util.module_from_spec(spec)
    spec.loader.exec_module(make)
    ns = {}
    _run_cells(make.make_exercise(_nb("02_timing"), "02_timing.ipynb"), ns, ("import statistics", "def time_it"))
    assert not ch2.check_timing(ns["time_it"])
    out = capsys.readouterr().out
    assert "not done yet: the TODO in time_it" in out and "✗" not in out, out
    assert ch2.check_answer("02_timing.quartiles", ["a", "c", "d"])
    assert not ch2.check_answer("02_timing.quartiles", ["a", "b", "c", "d"])
    assert "1 that should not be there" in capsys.readouterr().out


def test_simulated_gpu_models_what_the_harness_must_handle():
    from convlab.measuring import simgpu
    gpu = simgpu.SimGPU(ms=1.0, seed=0)
    k = gpu.kernel()
    t0 = gpu.now(); k(); first = gpu.now() - t0
    t0 = gpu.now(); k(); launch = gpu.now() - t0
    assert first >= simgpu.COMPILE_MS and launch == pytest.approx(simgpu.LAUNCH_MS)   # compile, then queue only
    start, end = gpu.event(), gpu.event()
    start.record(); k(); end.record()
    with pytest.raises(simgpu.NotReady):
        start.elapsed_time(end)
    end.synchronize()
    hot = start.elapsed_time(end)                  # the run before left its data in L2
    gpu.flush_l2(); start.record(); k(); end.record(); gpu.synchronize()
    # launch 3 waited behind other work, after its start event: in its time, beside the cold run
    other = gpu.log.launches[3].other_ms
    assert [L.other_ms > 0 for L in gpu.log.launches] == [False, False, False, True] and other >= 2.0
    assert start.elapsed_time(end) - other == pytest.approx(1.0, rel=0.05)
    assert hot == pytest.approx(simgpu.HOT, rel=0.05)


# ---- 8.2: dX as a gather ----------------------------------------------------------------------

def _dx_gather(cuda=(), python=()):
    return _exercise("08_dx_gather", "my_dx_gather", cuda, python)


DY_08 = "acc += dy[((b * M + m) * Ho + oy) * Wo + ox]"
MUTANTS_08_DX = {
    "mask flipped twice": ([("w[((m * C + c) * K + ky) * K + kx]",
                             "w[((m * C + c) * K + (K - 1 - ky)) * K + (K - 1 - kx)]")], (), "flipped twice"),
    "forward index, mask not flipped": ([("iy + pad - ky", "iy - pad + ky"), ("ix + pad - kx", "ix - pad + kx")], (),
                                        "not flipped"),
    "stride divisibility ignored": ([("ty < 0 || ty % stride != 0 ||", "ty < 0 ||"),
                                     ("tx < 0 || tx % stride != 0 ||", "tx < 0 ||")], (), "stride test is missing"),
    "divided before the sign test": ([("if (ty < 0 || ty % stride != 0 || ty / stride >= Ho)\n                continue;\n"
                                       "            const int oy = ty / stride;",
                                       "const int oy = ty / stride;\n            if (oy < 0 || oy >= Ho)\n"
                                       "                continue;"),
                                      ("if (tx < 0 || tx % stride != 0 || tx / stride >= Wo)\n                    continue;\n"
                                       "                const int ox = tx / stride;",
                                       "const int ox = tx / stride;\n                if (ox < 0 || ox >= Wo)\n"
                                       "                    continue;")], (), "stride test is missing"),
    "padding ignored": ([("iy + pad - ky", "iy - ky"), ("ix + pad - kx", "ix - kx")], (), "padding is ignored"),
    "padding with the wrong sign": ([("iy + pad - ky", "iy - pad - ky"), ("ix + pad - kx", "ix - pad - kx")], (),
                                    "padding has the wrong sign"),
    "dy's upper bounds missing": ([(" || ty / stride >= Ho", ""), (" || tx / stride >= Wo", "")], (),
                                  "dy's bounds"),
    "dy's lower bounds missing": ([("ty < 0 || ", ""), ("tx < 0 || ", "")], (), "dy's bounds"),
    "= for +=": ([(DY_08, DY_08.replace("+=", "="))], (), "`=` where `+=` belongs"),
    "atomicAdd into dx that starts as NaN": ([("    dx[i] = acc;", "    atomicAdd(&dx[i], acc);")], (),
                                             "with += or atomicAdd, adds to that NaN"),
}


@pytest.mark.parametrize("mistake", MUTANTS_08_DX)
def test_08_dx_gather_mistakes_are_named(mistake, capsys):
    cuda, python, words = MUTANTS_08_DX[mistake]
    _fails_with(ch8.check_dx(_dx_gather(cuda, python)["launch"]), capsys, words)


@pytest.mark.parametrize("alternative", [
    # one test per axis: the division first, its remainder checked by multiplying back
    [("if (ty < 0 || ty % stride != 0 || ty / stride >= Ho)\n                continue;\n"
      "            const int oy = ty / stride;",
      "const int oy = ty / stride;\n            if (ty < 0 || oy * stride != ty || oy >= Ho)\n"
      "                continue;")],
    # the maps innermost: the same sum in another order
    [("    for (int m = 0; m < M; ++m)\n        for (int ky = 0; ky < K; ++ky) {",
      "    for (int ky = 0; ky < K; ++ky)\n        for (int m = 0; m < M; ++m) {")],
])
def test_08_dx_gather_correct_alternatives_pass(alternative, capsys):
    ns = _dx_gather(alternative)
    _passes(ch8.check_dx(ns["launch"]), capsys)
    _passes(ch8.check_dx_counters(ns["launch"], ch8.check_targets("08_dx_gather")), capsys)


def test_08_dx_gather_counters_grade_atomics_and_coalescing(capsys):
    out = _passes(ch8.check_dx_counters(_dx_gather()["launch"], ch8.check_targets("08_dx_gather")), capsys)
    assert "0 global atomics (target 0)" in out and "sectors per load request (target ≤ 4.33)" in out
    # atomics where none are needed: right once dx is zeroed, but one atomic per element
    ns = _dx_gather([("    dx[i] = acc;", "    atomicAdd(&dx[i], acc);")],
                    [("    n = dx.numel()", "    n = dx.numel()\n    dx.zero_()")])
    _passes(ch8.check_dx(ns["launch"]), capsys)
    verdict = ch8.check_dx_counters(ns["launch"], ch8.check_targets("08_dx_gather"))
    out = capsys.readouterr().out
    assert not verdict and "not within the targets" in out and "global atomics (target 0) ✗" in out, out
    # lanes down a column: right, but a warp's loads of dy are rows apart
    ns = _dx_gather([("const int ix = i % W, iy = (i / W) % H;", "const int iy = i % H, ix = (i / H) % W;"),
                     ("    dx[i] = acc;", "    dx[((b * C + c) * H + iy) * W + ix] = acc;")])
    verdict = ch8.check_dx_counters(ns["launch"], ch8.check_targets("08_dx_gather"))
    out = capsys.readouterr().out
    assert not verdict and "sectors per load request (target ≤ 4.33) ✗" in out, out


def test_08_dx_gather_targets_come_from_the_chapters_kernel(capsys):
    from convlab.ops import backprop as bp

    chapter = lambda dy, w, dx, stride, pad: bp.conv2d_input_grad_gather(  # noqa: E731
        dy, w, dx, stride=stride, padding=pad, input_size=dx.shape[-2:])
    out = _passes(ch8.check_dx_counters(chapter, ch8.check_targets("08_dx_gather")), capsys)
    assert "0 global atomics" in out and "4.33 sectors per load request" in out, out
    # the scatter needs its atomics
    scatter = lambda dy, w, dx, stride, pad: bp.conv2d_input_grad_scatter(  # noqa: E731
        dy, w, dx, stride=stride, padding=pad, input_size=dx.shape[-2:])
    assert not ch8.check_dx_counters(scatter, ch8.check_targets("08_dx_gather"))
    capsys.readouterr()


def test_08_dx_gather_prediction_is_checked_against_the_counters(capsys):
    ns = _dx_gather()
    dy, w, dx = cl.randn(1, 4, 8, 8), cl.randn(4, 2, 3, 3), cl.empty(1, 2, 10, 10)
    from convlab.ops import backprop as bp

    measured = {"scatter": ch8.count_atomics(bp.conv2d_input_grad_scatter, dy, w, dx),
                "gather": ch8.count_atomics(ns["launch"], dy, w, dx, 1, 0)}
    assert measured == {"scatter": 8 * 18, "gather": 0}
    # the notebook's call: the kernel itself, as cl.profile takes it on a GPU too
    assert ch8.count_atomics(ns["my_dx_gather"].kernel("dx_gather"), dy, w, dx, 1, 2, 4, 10, 10, 3, 0, 1,
                            grid=(2, 1, 1), block=(128, 1, 1)) == 0
    # a fault is printed, not raised
    assert math.isnan(ch8.count_atomics(ns["launch"], dy, w, cl.empty(1, 2, 12, 10), 1, 0))   # reads past dy
    assert "OutOfBoundsError" in capsys.readouterr().out
    # one atomic per product, not per warp instruction
    _fails_with(ex.check_prediction("atomics", {"scatter": 256 * 18, "gather": 0}, measured), capsys, "scatter")


# ---- 10.2: streams and pinned copies ----------------------------------------------------------

def _streamed(changes=()):
    """Exercise 10.2's run_streamed, mutated by (old, new) pairs."""
    ns = {**NAMES, "torch": torch}
    _run_cells(_nb("10_streams"), ns, ("def run_streamed",), changes)
    return ns["run_streamed"]


LOOP_10 = "    for b0 in range(0, n, step):\n        b1 = min(b0 + step, n)\n"
BODY_10 = ("        with g.on(s):\n            g.copy(x_dev[b0:b1], x_host[b0:b1])\n"
           "            g.forward(x_dev[b0:b1], out_dev[b0:b1])\n            g.copy(out_host[b0:b1], out_dev[b0:b1])\n")
MUTANTS_10_STREAMS = {
    "pageable images": ([("x_host = g.pinned(images)", "x_host = images")], ("not within the target", "copies in (the images)", "pageable")),
    "pageable logits": ([("pinned=True)", "pinned=False)")], ("not within the target", "copies back (the logits)", "pageable")),
    "all chunks on one stream": ([(LOOP_10 + "        s = g.stream()\n", "    s = g.stream()\n" + LOOP_10)],
                                 ("not within the target", "all chunks are on one stream")),
    "a synchronize inside the loop": ([("            g.copy(out_host[b0:b1], out_dev[b0:b1])\n",
                                        "            g.copy(out_host[b0:b1], out_dev[b0:b1])\n        g.synchronize()\n")],
                                      ("not within the target", "a synchronize inside the loop")),
    "copy back before the compute": ([("            g.forward(x_dev[b0:b1], out_dev[b0:b1])\n"
                                       "            g.copy(out_host[b0:b1], out_dev[b0:b1])",
                                       "            g.copy(out_host[b0:b1], out_dev[b0:b1])\n"
                                       "            g.forward(x_dev[b0:b1], out_dev[b0:b1])")],
                                     ("copy out of images 0..1", "nothing has been written into yet")),
    "copy back on another stream, no event": ([("    step = -(-n // chunks)\n", "    step = -(-n // chunks)\n    back = g.stream()\n"),
                                               ("            g.copy(out_host[b0:b1], out_dev[b0:b1])\n",
                                                "        with g.on(back):\n            g.copy(out_host[b0:b1], out_dev[b0:b1])\n")],
                                              ("nothing ordering the two", "record an event")),
    "compute on its own stream, no event": ([(BODY_10, "        with g.on(s):\n            g.copy(x_dev[b0:b1], x_host[b0:b1])\n"
                                                       "        with g.on(g.stream()):\n"
                                                       "            g.forward(x_dev[b0:b1], out_dev[b0:b1])\n"
                                                       "            g.copy(out_host[b0:b1], out_dev[b0:b1])\n")],
                                            ("the compute of images 0..1", "nothing ordering the two")),
    "the remainder dropped": ([("    step = -(-n // chunks)\n" + LOOP_10,
                                "    step = n // chunks\n    for i in range(chunks):\n        b0, b1 = i * step, (i + 1) * step\n")],
                              ("images 8..9 never came back", "the last taking what is left")),
    "no synchronize before returning": ([("    g.synchronize()\n", "")], ("may still be running", "g.synchronize()")),
    "the device's logits returned": ([("    return out_host", "    return out_dev")], ("returned device memory",)),
}


@pytest.mark.parametrize("mistake", MUTANTS_10_STREAMS)
def test_10_streams_mistakes_are_named(mistake, capsys):
    changes, words = MUTANTS_10_STREAMS[mistake]
    _fails_with(ch10.check_streams(_streamed(changes)), capsys, *words)


@pytest.mark.parametrize("alternative", [
    # the chapter's pipeline: copies in, computes and copies back on three streams, events between
    [(LOOP_10 + "        s = g.stream()\n" + BODY_10,
      "    s_in, s_run, s_out = g.stream(), g.stream(), g.stream()\n" + LOOP_10 +
      "        copied, computed = g.event(), g.event()\n"
      "        with g.on(s_in):\n            g.copy(x_dev[b0:b1], x_host[b0:b1])\n            copied.record(s_in)\n"
      "        s_run.wait_event(copied)\n"
      "        with g.on(s_run):\n            g.forward(x_dev[b0:b1], out_dev[b0:b1])\n            computed.record(s_run)\n"
      "        s_out.wait_event(computed)\n"
      "        with g.on(s_out):\n            g.copy(out_host[b0:b1], out_dev[b0:b1])\n")],
    # two streams taking turns, chunks from tensor_split (sizes differ by at most one)
    [("    step = -(-n // chunks)\n" + LOOP_10 + "        s = g.stream()\n",
      "    pair = [g.stream(), g.stream()]\n"
      "    for i, idx in enumerate(torch.arange(n).tensor_split(chunks)):\n"
      "        b0, b1 = int(idx[0]), int(idx[-1]) + 1\n        s = pair[i % 2]\n")],
])
def test_10_streams_correct_alternatives_pass(alternative, capsys):
    out = _passes(ch10.check_streams(_streamed(alternative)), capsys)
    assert "no races" in out


def test_10_streams_solution_passes_and_the_target_is_the_chapters(capsys):
    from convlab.programs import streams

    out = _passes(ch10.check_streams(_streamed()), capsys)
    assert "target ≤ 1.2" in out
    # the target: the chapter's own 8 chunks on streams, measured, rounded up
    model = streams.Model.from_chapter()
    chapter = model.against_chapter().set_index("plan")
    measured = chapter.loc["streams, 8 chunks", "measured / longer"]
    assert measured <= ch10.TARGETS["10_streams"]["time over the longer of copy and compute"] < measured + 0.05


def test_10_streams_model_orders_and_overlaps_as_a_gpu_does():
    """The model on hand-made records: one stream serialises, a stream per chunk overlaps the next
    copy with the compute, a pageable copy makes the host wait."""
    from convlab.programs import streams

    def record(per_chunk_stream, pinned=True, chunks=4, n=8):
        g = streams.Recorder(lambda xb, out: out.copy_(xb.view(len(xb), -1)[:, :2]), classes=2)
        x = torch.randn(n, 1, 2, 1)
        x_host = g.pinned(x) if pinned else x
        x_dev, out_dev = g.empty(x.shape), g.empty((n, 2))
        out_host = g.host_empty((n, 2), pinned=pinned)
        one = g.stream()
        for b0 in range(0, n, n // chunks):
            b1 = b0 + n // chunks
            with g.on(g.stream() if per_chunk_stream else one):
                g.copy(x_dev[b0:b1], x_host[b0:b1])
                g.forward(x_dev[b0:b1], out_dev[b0:b1])
                g.copy(out_host[b0:b1], out_dev[b0:b1])
        g.synchronize()
        assert not g.problems and torch.equal(out_host, x.view(n, -1)[:, :2])
        return g

    model = streams.Model.from_chapter()
    serial = model.time(record(False).ops, 8)
    overlapped = model.time(record(True).ops, 8)
    pageable = model.time(record(True, pinned=False).ops, 8)
    per_chunk = {k: model.per_call[k] + model.per_image[k] * streams.CHAPTER_IMAGES / 4 for k in streams.KINDS}
    assert serial == pytest.approx(4 * sum(per_chunk.values()))
    # overlapped: the copies in back to back, each compute after its copy and the compute before it
    assert overlapped < serial
    assert overlapped >= max(4 * per_chunk["copy in"], 4 * per_chunk["compute"]) + per_chunk["copy out"]
    assert pageable > serial


def test_10_streams_recorder_knows_what_each_synchronize_covers():
    from convlab.programs import streams

    g = streams.Recorder(lambda xb, out: out.copy_(xb.view(len(xb), -1)[:, :2]), classes=2)
    x = torch.randn(4, 1, 2, 1)
    x_host, x_dev = g.pinned(x), g.empty(x.shape)
    out_dev, out_host = g.empty((4, 2)), g.host_empty((4, 2), pinned=True)
    s1, s2 = g.stream(), g.stream()
    for s, (a, b) in ((s1, (0, 2)), (s2, (2, 4))):
        with g.on(s):
            g.copy(x_dev[a:b], x_host[a:b])
            g.forward(x_dev[a:b], out_dev[a:b])
            g.copy(out_host[a:b], out_dev[a:b])
    assert [op.what for op in g.unfinished(out_host)] == ["the copy out of images 0..1", "the copy out of images 2..3"]
    s1.synchronize()            # one stream: the other's copy back may still run
    assert [op.what for op in g.unfinished(out_host)] == ["the copy out of images 2..3"]
    done = g.event()
    done.record(s2)
    done.synchronize()
    assert not g.unfinished(out_host) and not g.problems and not g.syncs_inside()
    assert g.where(x_host) == "pinned" and g.where(x) == "pageable" and g.where(out_dev) == "device"


# ---- 3a.2: the mask in constant memory ----------------------------------------------------------

def _check_03a_constant(cuda=(), python=()):
    ns = _exercise("03a_constant_mask", "my_const", cuda, python)
    return ch3.check_constant_mask(ns["launch"], ns["my_const"], ch3.check_targets("03a_constant_mask"),
                                  name="conv2d_tiled")


TAP_03A = "acc += pixel * c_mask[((m * C + c) * K + p) * K + q];"
SET_03A = '    my_const.set_constant("c_mask", w)\n'
MUTANTS_03A_CONSTANT = {
    "mask never copied": ((), [(SET_03A, "")], ("never copied into `c_mask`", "set_constant")),
    "copied after the launch": ((), [(SET_03A, ""), ("shared=4 * in_w * in_w)",
                                                     'shared=4 * in_w * in_w)\n    my_const.set_constant("c_mask", w)')],
                                ("never copied", "before the kernel's launch")),
    "array too small": ([("__constant__ float c_mask[MASK_MAX];", "__constant__ float c_mask[64];")], (),
                        ("too small for this layer's mask", "4×3×5×5 = 300 floats")),
    "wrong name in the fill": ((), [('set_constant("c_mask", w)', 'set_constant("mask", w)')],
                               ("no __constant__ `mask`", "c_mask")),
    "index without m and c": ([(TAP_03A, "acc += pixel * c_mask[p * K + q];")], (),
                              ("leaves out m and c",)),
    "index without c": ([(TAP_03A, "acc += pixel * c_mask[(m * K + p) * K + q];")], (),
                        ("leaves out the channel c",)),
    "flipped mask": ([(TAP_03A, "acc += pixel * c_mask[((m * C + c) * K + K - 1 - p) * K + K - 1 - q];")], (),
                     ("flipped",)),
    # right, but each lane starts the taps at its own column (a bank-conflict trick for shared
    # memory): a warp's lanes read K different taps of c_mask at once
    "lanes read different taps": ([("                for (int q = 0; q < K; ++q) {\n"
                                     "                    const float pixel",
                                     "                for (int qq = 0; qq < K; ++qq) {\n"
                                     "                    const int q = (qq + threadIdx.x) % K;\n"
                                     "                    const float pixel")], (),
                                  ("not within the targets", "constant addresses per request (target ≤ 1) ✗",
                                   "different elements of `c_mask`")),
    "mask read from w": ([(TAP_03A, "acc += pixel * w[((m * C + c) * K + p) * K + q];")], (),
                         ("not within the targets", "global load bytes per multiply-add",
                          "still read from global memory", "reads `w`")),
}


@pytest.mark.parametrize("mistake", MUTANTS_03A_CONSTANT)
def test_03a_constant_mask_mistakes_are_named(mistake, capsys):
    cuda, python, words = MUTANTS_03A_CONSTANT[mistake]
    _fails_with(_check_03a_constant(cuda, python), capsys, *words)


@pytest.mark.parametrize("cuda, python", [
    ((), ()),
    # the array sized by a literal, the map and channel's taps found once per channel
    ([("__constant__ float c_mask[MASK_MAX];", "__constant__ float c_mask[16384];"),
      (TAP_03A, "const float* taps = &c_mask[(m * C + c) * K * K];\n"
                "                    acc += pixel * taps[p * K + q];")], ()),
    # the fill from a flat copy of the mask
    ((), [('set_constant("c_mask", w)', 'set_constant("c_mask", w.reshape(-1).contiguous())')]),
])
def test_03a_constant_mask_solution_and_alternatives_pass(cuda, python, capsys):
    out = _passes(_check_03a_constant(cuda, python), capsys)
    assert "global load bytes per multiply-add (target ≤ 0.61)" in out, out
    # reads through a pointer taken into c_mask are not counted (the emulator cannot tell its memory)
    assert ("1 constant addresses per request (target ≤ 1)" in out) == ("taps[" not in str(cuda)), out


def test_03a_constant_mask_target_and_answer_come_from_the_chapters_kernel():
    # chapter 3's multi-pass kernel (TILE=8), the mask in constant and in global memory, on the
    # counters' shape: the target is the first, and the answer of part 3 the difference
    from convlab.ops import tiled

    s = ch2.COUNTER_SHAPE
    x, w = cl.randn(s.B, s.C, s.H, s.W), cl.randn(s.M, s.C, s.K, s.K)
    per_mac = {}
    for mask in ("constant", "global"):
        card = cl.profile(lambda: tiled.conv2d_tiled_halo_multi_pass(x, w, padding=s.padding, mask=mask, TILE=8))
        per_mac[mask] = ch2.quantity("global load bytes per multiply-add", card.kernels[-1], ch2.multiply_adds(s))
    target = ch3.check_targets("03a_constant_mask")["global load bytes per multiply-add"]
    assert per_mac["constant"] <= target < per_mac["constant"] + 0.01
    assert per_mac["global"] > target
    assert per_mac["global"] - per_mac["constant"] == pytest.approx(ch3.ANSWERS["03a_constant_mask.saved"][1]())
    assert ch2.quantity("constant addresses per request", card.kernels[-1], None) is None   # the global build
    card = cl.profile(lambda: tiled.conv2d_tiled_halo_multi_pass(x, w, padding=s.padding, mask="constant", TILE=8))
    assert ch2.quantity("constant addresses per request", card.kernels[-1], None) == \
        ch3.check_targets("03a_constant_mask")["constant addresses per request"]


# ---- 5.3: direct register tiles ------------------------------------------------------------------

def _direct(cuda=(), **tunables):
    """Exercise 5.3 with its %%cuda cell mutated by `cuda`, at the tunables given (MT, ROWS, BLOCK:
    the notebook's own for those left out), as a student who edits the tunables' cell runs it."""
    ns = {**NAMES, "torch": torch, "np": __import__("numpy")}
    nb = _nb("05_direct_regtile")
    _run_cells(nb, ns, ("MT, ROWS",))
    ns.update(tunables)
    defines, body = _cuda_cell(nb, "my_direct", ns)
    ns["my_direct"] = cl.load_source(_mutate(_strip_markers(body), cuda), name=f"my_direct_m{next(_counter)}",
                                     defines=defines)
    _run_cells(nb, ns, ("def build",))
    return ns


def _check_direct(ns, counters=True):
    ok = ex.check_kernel(ns["launch"], name="direct register-tiled kernel", locate=ns["where"])
    if ok and counters:
        targets = ch5.check_targets("05_direct_regtile", MT=ns["MT"], ROWS=ns["ROWS"], BLOCK=ns["BLOCK"])
        return ch2.check_counters(ns["launch"], targets, shape=ch5.counter_shape("05_direct_regtile"),
                                 name="direct register tiles")
    return ok


XV_05D = "xv[j] = inside ? __ldg(&x[xbase + iy * W + ix]) : 0.0f;"
MAC_05D = """                for (int q = 0; q < MT / 4; ++q) {
                    const float4 wv = *(const float4*)&wrow[4 * q];
                    for (int r = 0; r < ROWS; ++r) {
                        const float v = xv[r * STRIDE + ky];"""
#: right, but a tap's 4 maps in 4 scalar loads: nvcc merges them into one 16-byte load (Ws is
#: __align__(16)), as it does with the float4 read again for every row (it keeps it in registers)
SCALAR_05D = [("const float4 wv = *(const float4*)&wrow[4 * q];",
               "const float4 wv = make_float4(wrow[4 * q], wrow[4 * q + 1], wrow[4 * q + 2], wrow[4 * q + 3]);")]
ROWS_OUTER_05D = [(MAC_05D, """                for (int r = 0; r < ROWS; ++r)
                for (int q = 0; q < MT / 4; ++q) {
                    const float4 wv = *(const float4*)&wrow[4 * q];
                    {
                        const float v = xv[r * STRIDE + ky];""")]
MUTANTS_05_DIRECT = {
    "= for +=": ([("acc[4 * q + 0][r] += wv.x * v;", "acc[4 * q + 0][r] = wv.x * v;"),
                  ("acc[4 * q + 1][r] += wv.y * v;", "acc[4 * q + 1][r] = wv.y * v;"),
                  ("acc[4 * q + 2][r] += wv.z * v;", "acc[4 * q + 2][r] = wv.z * v;"),
                  ("acc[4 * q + 3][r] += wv.w * v;", "acc[4 * q + 3][r] = wv.w * v;")],
                 ("`=` where `+=` belongs",)),
    "no bounds check on the input column": ([(XV_05D, "xv[j] = x[xbase + iy * W + ix];")], ("out-of-range",)),
    "off-by-one row bound": ([("col_in && iy >= 0 && iy < H;", "col_in && iy >= 0 && iy <= H;")],
                             ("out-of-range", "off by one")),
    "stride left out of the register index": ([("const float v = xv[r * STRIDE + ky];", "const float v = xv[r + ky];")],
                                              ("stride 2", "thread ", "acc[")),
    "float4 fields to the wrong maps": ([("acc[4 * q + 1][r] += wv.y * v;", "acc[4 * q + 1][r] += wv.x * v;")],
                                        ("thread ", "in acc[1]")),
    "rows and taps swapped in the register index": ([("const float v = xv[r * STRIDE + ky];",
                                                      "const float v = xv[ky * STRIDE + r];")],
                                                    ("stride 2", "thread ", "acc[")),
    # right, but x loaded for every (ky, r) instead of once per (c, kx): each load under its own
    # bounds test, which nvcc does not merge (15 loads a column where the solution has 7)
    "input loaded per tap": ([("const float v = xv[r * STRIDE + ky];",
                               "const int iy = iy0 + r * STRIDE + ky;\n"
                               "                        const float v = (col_in && iy >= 0 && iy < H) ? "
                               "x[xbase + iy * W + ix] : 0.0f;")],
                             ("not within the targets", "global load bytes per multiply-add (target ≤ 0.524) ✗",
                              "chapter 5's conv2d_direct_regtile with MT=4, ROWS=3, BLOCK=64",
                              "the line that moves the most: my_direct_m")),
    # the input column's row never advances: every row of the window reads row iy0
    "input row not advanced": ([(XV_05D, "xv[j] = (col_in && iy0 >= 0 && iy0 < H) ? x[xbase + iy0 * W + ix] : 0.0f;")],
                               ("wrong at",)),
}


@pytest.mark.parametrize("mistake", MUTANTS_05_DIRECT)
def test_05_direct_regtile_mistakes_are_named(mistake, capsys):
    cuda, words = MUTANTS_05_DIRECT[mistake]
    out = _fails_with(_check_direct(_direct(cuda)), capsys, *words)
    assert "only outputs at the image's edge" not in out, out


def test_05_direct_regtile_a_missed_shared_target_names_the_shared_load(capsys):
    # a target no kernel meets: the line named under it is the mask's shared load, not the input's global one
    ns = _direct()
    verdict = ch2.check_counters(ns["launch"], {"shared loads per multiply-add": 0.01},
                                shape=ch5.counter_shape("05_direct_regtile"))
    out = _fails_with(verdict, capsys, "the line that loads the most from shared memory: my_direct_m")
    line = int(re.search(r"loads the most from shared memory: my_direct_m\d+\.cu:(\d+)", out)[1])
    assert "wrow[4 * q]" in ns["my_direct"].src.text.splitlines()[line - 1], out
    assert "global load" not in out, out


def test_05_direct_regtile_per_tap_loads_name_the_load_that_moves_the_most(capsys):
    out = _fails_with(_check_direct(_direct(MUTANTS_05_DIRECT["input loaded per tap"][0])), capsys)
    line = out.split("the line that moves the most: ")[1]
    assert "(global load:" in line, out


@pytest.mark.parametrize("cuda, tunables", [
    ((), {}),
    # other tunables the exercise lets a student choose: targets from the chapter's kernel with the same
    ((), {"MT": 8, "ROWS": 2, "BLOCK": 128}),
    ((), {"MT": 4, "ROWS": 1, "BLOCK": 32}),
    (SCALAR_05D, {}),
    (ROWS_OUTER_05D, {}),
    (ROWS_OUTER_05D, {"MT": 8, "ROWS": 2, "BLOCK": 128}),
    # a plain load instead of __ldg, the float4's fields by a loop, fmaf
    ([("__ldg(&x[xbase + iy * W + ix])", "x[xbase + iy * W + ix]"),
      ("""                for (int q = 0; q < MT / 4; ++q) {
                    const float4 wv = *(const float4*)&wrow[4 * q];
                    for (int r = 0; r < ROWS; ++r) {
                        const float v = xv[r * STRIDE + ky];
                        acc[4 * q + 0][r] += wv.x * v;
                        acc[4 * q + 1][r] += wv.y * v;
                        acc[4 * q + 2][r] += wv.z * v;
                        acc[4 * q + 3][r] += wv.w * v;
                    }
                }""",
       """                for (int q = 0; q < MT / 4; ++q) {
                    const float4 wv = *(const float4*)&wrow[4 * q];
                    const float t[4] = {wv.x, wv.y, wv.z, wv.w};
                    for (int r = 0; r < ROWS; ++r)
                        for (int e = 0; e < 4; ++e)
                            acc[4 * q + e][r] = fmaf(t[e], xv[r * STRIDE + ky], acc[4 * q + e][r]);
                }""")], {}),
    # the input column with the bounds folded into the loop's start and end
    ([("""            for (int j = 0; j < XROWS; ++j) {
                const int iy = iy0 + j;
                const bool inside = col_in && iy >= 0 && iy < H;
                xv[j] = inside ? __ldg(&x[xbase + iy * W + ix]) : 0.0f;
            }""", """            for (int j = 0; j < XROWS; ++j)
                xv[j] = 0.0f;
            if (col_in)
                for (int j = max(0, -iy0); j < XROWS && iy0 + j < H; ++j)
                    xv[j] = x[xbase + (iy0 + j) * W + ix];""")], {}),
], ids=["solution", "MT=8 ROWS=2 BLOCK=128", "ROWS=1 BLOCK=32", "scalar mask loads", "rows outer",
        "rows outer MT=8", "fmaf", "bounds in the loop"])
def test_05_direct_regtile_solution_and_alternatives_pass(cuda, tunables, capsys):
    ns = _direct(cuda, **tunables)
    out = _passes(_check_direct(ns), capsys)
    assert f"chapter 5's conv2d_direct_regtile with MT={ns['MT']}, ROWS={ns['ROWS']}, BLOCK={ns['BLOCK']}" in out


def test_05_direct_regtile_float4_at_q_not_4q_shows_with_two_groups_of_maps(capsys):
    # with MT = 4 there is one group (q = 0), so &wrow[q] is &wrow[4 * q]; with MT = 8 maps 4-7 read
    # the values of maps 1-4
    cuda = [("*(const float4*)&wrow[4 * q]", "*(const float4*)&wrow[q]")]
    _passes(_check_direct(_direct(cuda)), capsys)
    # maps 4-7's float4 at wrow[1]: 4 bytes past a 16-byte boundary, which stops a GPU (misaligned address)
    _fails_with(_check_direct(_direct(cuda, MT=8, ROWS=2, BLOCK=128)), capsys,
                "misaligned access", "4 bytes past a multiple of 16")


def test_05_direct_regtile_targets_come_from_the_chapters_kernel():
    from convlab.ops import fused

    s = ch5.counter_shape("05_direct_regtile")
    x, w = cl.randn(s.B, s.C, s.H, s.W), cl.randn(s.M, s.C, s.K, s.K)
    for tunables in ({"MT": 4, "ROWS": 3, "BLOCK": 64}, {"MT": 8, "ROWS": 2, "BLOCK": 128}):
        call = lambda: fused.conv2d_direct_regtile(x, w, padding=s.padding, **tunables)  # noqa: E731
        card = cl.profile(call)
        k = {"global load bytes per multiply-add": card.kernels[-1],
             "shared loads per multiply-add": ch2.traced_profile(call, card)}
        targets = ch5.check_targets("05_direct_regtile", **tunables)
        assert set(targets) == set(k) and targets.key == "05_direct_regtile"
        for what, most in targets.items():
            got = ch2.quantity(what, k[what], ch2.multiply_adds(s))
            assert got <= most < got * 1.01, (tunables, what, got, most)
    # the shared values: each thread's MT mask values once per (c, ky, kx) for MT × ROWS multiply-adds
    assert ch5.check_targets("05_direct_regtile")["shared loads per multiply-add"] == pytest.approx(1 / 3, rel=0.01)
    with pytest.raises(TypeError, match="MT, ROWS, BLOCK"):
        ch5.check_targets("05_direct_regtile", TM=4)


def test_untouched_constant_mask_and_direct_regtile_are_not_done_yet(capsys):
    ns = _exercise_cells("03a_constant_mask", "my_const")
    assert not ch3.check_constant_mask(ns["launch"], ns["my_const"], ch3.check_targets("03a_constant_mask"))
    ns = _exercise_cells("05_direct_regtile", "my_direct", "def build", setup=("MT, ROWS",))
    assert not ex.check_kernel(ns["launch"], locate=ns["where"])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(line.startswith("not done yet: the TODO in ") for line in lines), lines


# ---- 11.1: the ring of mbarriers ---------------------------------------------------------------

WAIT_FULL_11 = "mbar_wait(&full[s], round & 1);"
WAIT_EMPTY_11 = "if (round > 0) mbar_wait(&empty[s], (round - 1) & 1);"
RELEASE_11 = """            wgmma_wait<1>();
            if (k > 0 && t == 0) mbar_arrive(&empty[(k - 1) % STAGES]);"""
LAST_11 = "        if (t == 0) mbar_arrive(&empty[(steps - 1) % STAGES]);"
LOADS_11 = """                mbar_arrive_expect_tx(&full[s], A_BYTES + B_BYTES);
                tma_load_2d(a, &a_map, &full[s], 64 * k, 0);
                tma_load_2d(b, &b_map, &full[s], 64 * k, 0);"""

MUTANTS_11 = {
    "consumer's parity flipped": ([(WAIT_FULL_11, "mbar_wait(&full[s], (round + 1) & 1);")],
                                  ("BarrierError", "deadlock", "wait on full[s] has the wrong parity")),
    "producer waits in the first round too": (
        [(WAIT_EMPTY_11, "mbar_wait(&empty[s], round & 1);")],
        ("deadlock", "first round", "need no wait")),
    "producer's parity flipped": ([(WAIT_EMPTY_11, "if (round > 0) mbar_wait(&empty[s], round & 1);")],
                                  ("refilled stage 0 before the consumers released it", "returns at once")),
    "no wait on empty": ([(WAIT_EMPTY_11, "")], ("refilled stage 0 before the consumers released it",)),
    "release before wgmma_wait": (
        [(RELEASE_11, """            if (k > 0 && t == 0) mbar_arrive(&empty[(k - 1) % STAGES]);
            wgmma_wait<1>();""")],
        ("RaceError", "still reads", "released (mbar_arrive on empty[s]) before the wgmma_wait")),
    "this step's stage released after wgmma_wait<1>": (
        [("if (k > 0 && t == 0) mbar_arrive(&empty[(k - 1) % STAGES]);", "if (t == 0) mbar_arrive(&empty[s]);"),
         (LAST_11, "")],
        ("still reads", "release the previous stage")),
    "release once per thread": (
        [("if (k > 0 && t == 0) mbar_arrive", "if (k > 0) mbar_arrive"),
         (LAST_11, "        mbar_arrive(&empty[(steps - 1) % STAGES]);")],
        ("too many arrivals", "one thread of each arrives")),
    "expect_tx of one box": ([("A_BYTES + B_BYTES);", "A_BYTES);")],
                             ("BarrierError", "would go negative", "BOTH boxes")),
    "expect_tx after the copies": (
        [(LOADS_11, """                tma_load_2d(a, &a_map, &full[s], 64 * k, 0);
                tma_load_2d(b, &b_map, &full[s], 64 * k, 0);
                mbar_arrive_expect_tx(&full[s], A_BYTES + B_BYTES);""")],
        ("BarrierError", "before the tma_load calls")),
    "wgmma_wait<1> at the end": ([("        wgmma_wait<0>();", "        wgmma_wait<1>();")],
                                 ("read of a wgmma accumulator", "wgmma_wait<0>()")),
    "consumers wait on empty": ([(WAIT_FULL_11, "mbar_wait(&empty[s], round & 1);")],
                                ("deadlock", "a consumer waits on empty[s]")),
    "one expect_tx per box": (
        [("mbar_arrive_expect_tx(&full[s], A_BYTES + B_BYTES);", "mbar_arrive_expect_tx(&full[s], A_BYTES);"),
         ("tma_load_2d(b, &b_map", "mbar_arrive_expect_tx(&full[s], B_BYTES);\n                tma_load_2d(b, &b_map")],
        ("deadlock", "more than one arrival a round")),
    "coordinates swapped": ([("&a_map, &full[s], 64 * k, 0)", "&a_map, &full[s], 0, 64 * k)"),
                             ("&b_map, &full[s], 64 * k, 0)", "&b_map, &full[s], 0, 64 * k)")],
                            ("only the first step's 64 columns of K count", "coordinates swapped")),
    "every step at column 0": ([("&a_map, &full[s], 64 * k, 0)", "&a_map, &full[s], 0, 0)"),
                               ("&b_map, &full[s], 64 * k, 0)", "&b_map, &full[s], 0, 0)")],
                              ("boxes at column 0",)),
}


def _ring(cuda=()):
    return _exercise("11_mbarrier_ring", "my_ring", cuda)


@pytest.mark.parametrize("mistake", MUTANTS_11)
def test_11_ring_mistakes_are_named(mistake, capsys):
    cuda, words = MUTANTS_11[mistake]
    _fails_with(ch11.check_ring(_ring(cuda)["my_ring"]), capsys, *words)


@pytest.mark.parametrize("cuda", [
    (),
    # the consumer's parity kept in a variable that flips after the last stage
    [("for (int i = 0; i < 32; i++) acc[i] = 0.f;", "for (int i = 0; i < 32; i++) acc[i] = 0.f;\n"
      "        unsigned phase = 0;"),
     (WAIT_FULL_11, "mbar_wait(&full[s], phase);\n            if (s == STAGES - 1) phase ^= 1;")],
    # another thread of each warpgroup arrives
    [("k > 0 && t == 0", "k > 0 && t == 127"), ("if (t == 0) mbar_arrive", "if (t == 127) mbar_arrive")],
    # the producer waits in every round, from the parity a fresh barrier has completed (1)
    [(WAIT_EMPTY_11, "mbar_wait(&empty[s], (round & 1) ^ 1);")],
    # no MMAs kept in flight: each stage released after wgmma_wait<0>
    [(RELEASE_11, """            wgmma_wait<0>();
            if (t == 0) mbar_arrive(&empty[s]);"""), (LAST_11, "")],
])
def test_11_ring_solution_and_alternatives_pass(cuda, capsys):
    out = _passes(ch11.check_ring(_ring(cuda)["my_ring"]), capsys)
    assert "K of 1, 2, 5 rounds" in out, out


def test_11_untouched_ring_is_not_done_yet(capsys):
    assert not ch11.check_ring(_exercise_cells("11_mbarrier_ring", "my_ring")["my_ring"])
    out = capsys.readouterr().out
    assert out.startswith("not done yet: the TODO in ") and out.count("\n") == 1, out


def test_11_ring_diagnosis_names_nothing_it_does_not_know():
    assert ch11.ring_diagnosis(cl.KernelFault("ring_gemm: something else at my_ring.cu:3"), 4) == ""


def test_11_ring_on_a_gpu_without_wgmma_says_so_in_one_line(monkeypatch, capsys):
    from convlab.gpu.runtime import DeviceInfo

    monkeypatch.setattr(cl, "backend", lambda: "cuda")
    monkeypatch.setattr(cl, "device", lambda: DeviceInfo("cuda", "NVIDIA A100", (8, 0), 108, "cuda"))
    assert not ch11.check_ring(_ring()["my_ring"])
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "H100 or H200 (sm_90a)" in out and "CONVLAB_BACKEND=emu" in out, out


@pytest.mark.parametrize("releaser", ["t == 0", "t == 127"])
def test_11_ring_release_before_the_wait_is_caught_whichever_thread_releases(releaser, capsys):
    """The refill shows only if the producer runs before the releasing warpgroup has all reached
    its wgmma_wait: the emulator's forward order does, whichever thread releases; its reverse order
    does not, so the check keeps forward order whatever order is set around it."""
    cuda = [(RELEASE_11, f"""            if (k > 0 && {releaser}) mbar_arrive(&empty[(k - 1) % STAGES]);
            wgmma_wait<1>();""")]
    with cl.thread_order("reverse"):
        _fails_with(ch11.check_ring(_ring(cuda)["my_ring"]), capsys, "still reads", "before the wgmma_wait")


# ---- one more mistake and one more correct variant for every exercise, as a student writes them --

def _coarse(cuda=(), python=(), defines=None):
    """Exercise 7.1 mutated by `cuda` and `python`, its %%cuda cell's defines overridden by `defines`."""
    ns = {**NAMES, "torch": torch, "np": __import__("numpy")}
    nb = _nb("07_conv3d_coarse")
    line_defines, body = _cuda_cell(nb, "my_coarse", ns)
    ns["my_coarse"] = cl.load_source(_mutate(_strip_markers(body), cuda), name=f"my_coarse_m{next(_counter)}",
                                     defines=dict(line_defines, **(defines or {})))
    _run_cells(nb, ns, ("KS, ZC, BY",), python)
    return ns


def _im2col(cuda=(), python=()):
    return _exercise("04_im2col_unroll", "my_unroll", cuda, python, launch_cell=("def unroll", "def conv2d_im2col"))


def _pick(change):
    ns, measured = _dispatch(change), _dispatch()
    return ch5.check_pick(ns["pick"], measured["times"], measured["layers"], device=measured["gpu"])


def _fragment(kernel, cuda):
    ns = _fragments(cuda)
    element, rows, cols, n = {"load_a": ("a_element", 16, 16, 4), "load_b": ("b_element", 16, 8, 2)}[kernel]
    regs = ex.attempt(ns["load"], kernel, rows, cols, n)
    return ch9b.check_fragment(kernel, regs, ns[element], element[0].upper(), todo=ns["frag"])


MORE_MISTAKES = {
    "01 the padding counted once in the output size": (
        lambda: ex.check_function(_padded([("Ho = (H + 2 * pad - K) // stride + 1", "Ho = (H + pad - K) // stride + 1"),
                                           ("Wo = (W + 2 * pad - K) // stride + 1", "Wo = (W + pad - K) // stride + 1")])),
        ("wrong shape: your output is (1, 2, 15, 15), expected (1, 2, 16, 16)",)),
    "03a the tile's rows TILE long in the load": (
        lambda: _check_03(_exercise("03a_tiled_halo", "my_tiled", [(
            "const int iy = iy0 + i / in_w, ix = ix0 + i % in_w;", "const int iy = iy0 + i / TILE, ix = ix0 + i % TILE;")])),
        ("wrong at", "(9 of 9 outputs wrong)")),
    "3a.2 the channel before the map in the mask's index": (
        lambda: _check_03a_constant([(TAP_03A, "acc += pixel * c_mask[((c * M + m) * K + p) * K + q];")]),
        ("the index into the mask puts the channel before the map",)),
    "3b.1 the tile's rows 34 floats long": (
        lambda: _colsum_check([("#define ROW 33", "#define ROW 34")]),
        ("shared bank conflicts (target 0) ✗", "bank conflicts)")),
    "4.1 the image's index inside the row's": (
        lambda: ch4.check_unroll(_im2col([("u[((size_t)b * C * K * K + row) * P + p]", "u[((size_t)row * C + b) * P + p]")])
                                ["unroll"]),
        ("out-of-range", "u[")),
    "5.1 the pixel unpicked with Ho": (
        lambda: ex.check_kernel(_exercise("05_implicit_gemm", "my_fused", [
            ("const int iy = (p / Wo) * stride - pad + ky;", "const int iy = (p / Ho) * stride - pad + ky;"),
            ("const int ix = (p % Wo) * stride - pad + kx;", "const int ix = (p % Ho) * stride - pad + kx;")])["launch"]),
        ("wrong at",)),
    "5.4 the rule the wrong way round": (
        lambda: _pick([("choice = fused.DIRECT_REGTILE.name if small else fused.IMPLICIT_GEMM_REG.name",
                        "choice = fused.IMPLICIT_GEMM_REG.name if small else fused.DIRECT_REGTILE.name")]),
        ("does not take this layer",)),
    "6.1 the pairs indexed channel first": (
        lambda: ex.check_kernel(_exercise("06_half2", "my_half2", [(
            "const half2 pair = w2[((p * C + c) * K + ky) * K + kx];",
            "const half2 pair = w2[((c * (M / 2) + p) * K + ky) * K + kx];")], launch_cell="def pack_pairs")["launch"],
            fp16="half"),
        ("wrong at",)),
    "6.2 the accumulator stored column-major": (
        lambda: (lambda ns: ex.check_kernel(ns["launch"], ns["SHAPES"], fp16="float", locate=ns["where"]))(_wmma([(
            "acc, LDC, wmma::mem_row_major);", "acc, LDC, wmma::mem_col_major);")])),
        ("wrong at",)),
    "7.1 the output plane one too low": (
        lambda: ch7.check_conv3d(_coarse([("        const int oz = iz - (KS - 1);\n", "        const int oz = iz - KS;\n")])
                                ["launch"], 3),
        ("nothing was written, though on 9×13×37 some outputs are", "z n holds the value of z n+1")),
    "8.1 x read without stride and padding": (
        lambda: ch8.check_dw(_exercise("08_dw_atomics", "my_dw_atomic", [(
            "g * x[((b * C + c) * H + iy) * W + ix]", "g * x[((b * C + c) * H + oy + ky) * W + ox + kx]")],
            launch_cell="def launch_atomic")["launch_atomic"]),
        ("the stride is ignored",)),
    "8.1 the reduction launched with fewer threads than THREADS": (
        lambda: ch8.check_dw(_exercise("08_dw_atomics", "my_dw_reduce", (), [(
            "block=(threads, 1, 1))", "block=(64, 1, 1))")], launch_cell="def launch_reduce")["launch_reduce"]),
        ("no thread wrote", "a block of fewer threads than the array leaves the rest unwritten")),
    "8.2 dy's upper bounds off by one": (
        lambda: ch8.check_dx(_dx_gather([(" || ty / stride >= Ho", " || ty / stride > Ho"),
                                        (" || tx / stride >= Wo", " || tx / stride > Wo")])["launch"]),
        ("out-of-range", "dy's bounds")),
    "9a.1 the group's first channel without C/groups": (
        lambda: ch9.check_general_kernel(_exercise("09a_groups_dilation", "my_igemm", [(
            "xg += ((size_t)b * C + (size_t)g * Cg) * H * W;", "xg += ((size_t)b * C + (size_t)g) * H * W;")])["launch"]),
        ("wrong at",)),
    "9b.1 the A rows of lanes 8-15 and 16-23 swapped": (
        lambda: _fragment("load_a", [("    row = l % 16;\n    col = 8 * (l / 16);",
                                      "    row = l % 8 + 8 * (l / 16);\n    col = 8 * (l / 8 % 2);")]),
        ("lane 0, register 1 holds A[0][8], A[0][9]; the layout needs A[8][0], A[8][1]",)),
    "10.1 the windows overlapping": (
        lambda: ch10.check_stage(_exercise("10_fused_epilogue", "my_epilogue", [(
            "const float* xr = x + ((b * C + c) * H + 2 * py + ky) * W + 2 * px + kx;",
            "const float* xr = x + ((b * C + c) * H + py + ky) * W + px + kx;")],
            launch_cell="def launch_epilogue")["launch_epilogue"]),
        ("the windows overlap",)),
    "10.2 the whole batch copied in first": (
        lambda: ch10.check_streams(_streamed([("    step = -(-n // chunks)\n", "    g.copy(x_dev, x_host)\n    step = -(-n // chunks)\n"),
                                            ("            g.copy(x_dev[b0:b1], x_host[b0:b1])\n", "")])),
        ("reads what the copy in of images 0..15 (the default stream) writes", "nothing ordering the two")),
    "11.1 the warpgroup's rows of A left out": (
        lambda: ch11.check_ring(_ring([("uint64_t da = smem_desc_128b(a + row0 * 128);",
                                      "uint64_t da = smem_desc_128b(a);")])["my_ring"]),
        ("warpgroup 2 holds what warpgroup 1 computes",)),
}


@pytest.mark.parametrize("mistake", MORE_MISTAKES)
def test_one_more_mistake_of_each_exercise_is_told(mistake, capsys):
    check, words = MORE_MISTAKES[mistake]
    out = _fails_with(check(), capsys, *words)
    assert EDGE_ADVICE not in out, out


MORE_CORRECT = {
    "01 the windows by tensordot": lambda: ex.check_function(_padded([(
        '            y += np.einsum("bchw,mc->bmhw", x[:, :, rows, cols], w[:, :, p, q],\n                           optimize=True)',
        "            y += np.tensordot(x[:, :, rows, cols], w[:, :, p, q], axes=([1], [1])).transpose(0, 3, 1, 2)")])),
    "2.1 the taps clamped to the image": lambda: ex.check_kernel(
        _exercise("02_naive_kernel", "my_conv", COALESCED_02["taps clamped to the image"])["launch"]),
    "3a.1 the barrier at the top of the channel loop": lambda: _check_03(_exercise("03a_tiled_halo", "my_tiled", [
        ("    for (int c = 0; c < C; ++c) {\n        // x[b][c][iy][ix] = x[xbase + iy * W + ix]\n",
         "    for (int c = 0; c < C; ++c) {\n        __syncthreads();\n"),
        ("                         * c_mask[((m * C + c) * K + p) * K + q];\n\n        __syncthreads();\n    }",
         "                         * c_mask[((m * C + c) * K + p) * K + q];\n    }")])),
    "3a.2 the index multiplied out": lambda: _check_03a_constant([(
        TAP_03A, "acc += pixel * c_mask[(m * C + c) * K * K + p * K + q];")]),
    "3b.1 the column first in the index": lambda: _scale_check([(
        "    w = blockIdx.x * blockDim.x + threadIdx.x;\n    h = blockIdx.y;\n",
        "    h = blockIdx.y;\n    w = threadIdx.x + blockDim.x * blockIdx.x;\n")]),
    "3b.1 rows 35 floats long (any odd length)": lambda: _colsum_check([("#define ROW 33", "#define ROW 35")]),
    "4.1 one loop over the taps, the product by copy_": lambda: (lambda ns: ch4.check_unroll(ns["unroll"])
                                                             and ex.check_kernel(ns["conv2d_im2col"]))(_im2col([(
        "    for (int ky = 0; ky < K; ++ky)\n        for (int kx = 0; kx < K; ++kx) {\n",
        "    for (int r = 0; r < K * K; ++r) {\n            const int ky = r / K, kx = r % K;\n")], [(
        "    torch.matmul(w.reshape(M, C * K * K), u, out=y.view(y.shape[0], M, -1))",
        "    y.copy_((w.reshape(M, -1) @ u).view_as(y))")])),
    "5.1 the tap unpicked by subtraction": lambda: ex.check_kernel(_exercise("05_implicit_gemm", "my_fused", [(
        "const int c = k / (K * K), ky = k % (K * K) / K, kx = k % K;",
        "const int c = k / (K * K), r = k - c * K * K, ky = r / K, kx = r - ky * K;")])["launch"]),
    "5.4 other thresholds, the Impl returned": lambda: _pick([
        ("small = shape.C * shape.K ** 2 <= 256 and shape.M <= 64",
         "small = shape.C * shape.K * shape.K < 300 and shape.M < 100"),
        ("choice = fused.DIRECT_REGTILE.name if small else fused.IMPLICIT_GEMM_REG.name",
         "choice = fused.DIRECT_REGTILE if small else fused.IMPLICIT_GEMM_REG")]),
    "6.1 __hfma2's factors the other way round": lambda: ex.check_kernel(_exercise("06_half2", "my_half2", [(
        "acc = __hfma2(pair, __half2half2(v), acc);", "acc = __hfma2(__half2half2(v), pair, acc);")],
        launch_cell="def pack_pairs")["launch"], fp16="half"),
    "6.2 B's columns by pointer arithmetic": lambda: (lambda ns: ex.check_kernel(
        ns["launch"], ns["SHAPES"], fp16="float", locate=ns["where"]))(_wmma([(
            "wmma::load_matrix_sync(b, &Bs[0][warp * 16], LDB);", "wmma::load_matrix_sync(b, Bs[0] + 16 * warp, LDB);")])),
    "7.1 the window shifted and cleared in one loop": lambda: ch7.check_conv3d(_coarse([(
        "        for (int j = 0; j < KS - 1; ++j) acc[j] = acc[j + 1];\n        acc[KS - 1] = 0.0f;",
        "        for (int j = 0; j < KS; ++j) acc[j] = j + 1 < KS ? acc[j + 1] : 0.0f;")])["launch"], 3),
    "7.1 ZC=2, BY=8, counters too": lambda: (lambda ns: ch7.check_conv3d(ns["launch"], 3) and ch7.check_conv3d_counters(
        ns["launch"], 3, ch7.check_targets("07")))(_coarse((), [("KS, ZC, BY = 3, 4, 4", "KS, ZC, BY = 3, 2, 8")],
                                                          {"ZC": 2, "BY": 8})),
    "8.1 the atomic's address by pointer arithmetic": lambda: ch8.check_dw(_exercise("08_dw_atomics", "my_dw_atomic", [(
        "atomicAdd(&dw[((m * C + c) * K + ky) * K + kx],", "atomicAdd(dw + ((m * C + c) * K + ky) * K + kx,")],
        launch_cell="def launch_atomic")["launch_atomic"]),
    "8.1 the tree halved by a shift": lambda: ch8.check_dw(_exercise("08_dw_atomics", "my_dw_reduce", [(
        "    for (int s = THREADS / 2; s > 0; s /= 2) {", "    for (int s = THREADS / 2; s >= 1; s >>= 1) {")],
        launch_cell="def launch_reduce")["launch_reduce"]),
    "8.2 fmaf": lambda: ch8.check_dx(_dx_gather([(
        "acc += dy[((b * M + m) * Ho + oy) * Wo + ox]\n                     * w[((m * C + c) * K + ky) * K + kx];",
        "acc = fmaf(dy[((b * M + m) * Ho + oy) * Wo + ox], w[((m * C + c) * K + ky) * K + kx], acc);")])["launch"]),
    "9a.1 the channel counted from 0 of the image": lambda: ch9.check_general_kernel(_exercise(
        "09a_groups_dilation", "my_igemm", [
            ("xg += ((size_t)b * C + (size_t)g * Cg) * H * W;", "xg += (size_t)b * C * H * W;"),
            ("v = xg[(c * H + iy) * W + ix];", "v = xg[((g * Cg + c) * H + iy) * W + ix];")])["launch"]),
    "9b.1 B's row by a mask": lambda: _fragment("load_b", [("    row = l % 16;\n    return row;",
                                                            "    row = l & 15;\n    return row;")]),
    "10.1 the four in another order, the bias first": lambda: ch10.check_stage(_exercise(
        "10_fused_epilogue", "my_epilogue", [(BEST_10, "best = bias[m] + fmaxf(fmaxf(acc[0][0], acc[1][1]), "
                                                       "fmaxf(acc[1][0], acc[0][1]));")],
        launch_cell="def launch_epilogue")["launch_epilogue"]),
    "10.2 the streams made before the loop": lambda: ch10.check_streams(_streamed([(
        LOOP_10 + "        s = g.stream()\n",
        "    made = [g.stream() for _ in range(chunks)]\n" + LOOP_10 + "        s = made[b0 // step]\n")])),
    "11.1 three stages": lambda: ch11.check_ring(_ring([("#define STAGES 2", "#define STAGES 3")])["my_ring"]),
}


@pytest.mark.parametrize("variant", MORE_CORRECT)
def test_one_more_correct_variant_of_each_exercise_passes(variant, capsys):
    _passes(MORE_CORRECT[variant](), capsys)
