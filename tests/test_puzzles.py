"""The warm-up puzzles (convlab/teach/puzzle_set.py, checked by convlab/teach/puzzles.py;
puzzles/solutions/*.ipynb): every solution passes its check, the untouched stub of every puzzle
says "not done yet", and a realistic mistake in each puzzle fails with the mistake named (the emulator's fault, or the puzzle's own diagnosis)."""
import importlib.util
import re
from pathlib import Path

import nbformat
import pytest

import convlab as cl
import convlab.teach.puzzles as pz

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("make_exercises", ROOT / "scripts" / "make_exercises.py")
make_exercises = importlib.util.module_from_spec(spec)
spec.loader.exec_module(make_exercises)

needs_emulator = pytest.mark.skipif(cl.device().backend != "emu", reason="the checks' faults come from the emulator")


def _cells():
    """puzzle name -> (module name, the %%cuda cell's source without its first line), from the solutions."""
    found = {}
    for path in sorted((ROOT / "puzzles" / "solutions").glob("*.ipynb")):
        cells = nbformat.read(path, as_version=4).cells
        for cuda, check in zip(cells, cells[1:]):
            m = re.fullmatch(r'pz\.check\("(\w+)", (\w+)\)', check.source.strip())
            if m and cuda.source.startswith(f"%%cuda {m[2]}\n"):
                found[m[1]] = (m[2], cuda.source.split("\n", 1)[1])
    return found


CELLS = _cells()


def _solution(source: str) -> str:
    return re.sub(r"^[ \t]*// (BEGIN|END) SOLUTION.*\n", "", source, flags=re.MULTILINE)


def _check(name: str, source: str, tag: str):
    module = cl.load_source(source, name=f"pz_{name}_{tag}")
    return pz.check(name, module, draw=False)


def test_every_puzzle_has_a_solution_cell_and_a_check():
    assert sorted(CELLS) == sorted(pz.PUZZLES), "each puzzle of convlab.teach.puzzle_set has one %%cuda cell and its check"
    assert 15 <= len(pz.PUZZLES) <= 25


def test_the_puzzles_are_in_sync_and_hold_no_solution():
    problems = [p for p in make_exercises.drift() if p.startswith("puzzles/")]
    assert not problems, "\n".join(problems) + "\nrun `make exercises`"
    toc = (ROOT / "_toc.yml").read_text()
    for path in sorted((ROOT / "puzzles").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        assert f"puzzles/{path.stem}" in toc and f"puzzles/solutions/{path.stem}" in toc, path.name
        assert nb.cells[0].source.startswith("# Puzzles")
        for cell in nb.cells:
            assert "SOLUTION" not in cell.source
            if cell.cell_type == "code":
                assert cell.outputs == []
                assert all(len(line) <= 88 for line in cell.source.splitlines()), cell.source
            elif cell.source.startswith("## Puzzle"):
                assert ":::{dropdown} Hint" in cell.source


@needs_emulator
@pytest.mark.parametrize("name", sorted(pz.PUZZLES))
def test_the_solution_passes(name, capsys):
    verdict = _check(name, _solution(CELLS[name][1]), "solution")
    assert verdict, verdict.text
    assert verdict.text.startswith("✓ correct")


@needs_emulator
@pytest.mark.parametrize("name", sorted(pz.PUZZLES))
def test_the_untouched_stub_is_not_done_yet(name):
    stub = make_exercises.strip_code(CELLS[name][1], name)
    assert "// TODO" in stub
    verdict = _check(name, stub, "stub")
    assert not verdict and verdict.text.startswith("not done yet"), verdict.text


#: puzzle -> [(the mistake, (solution text, mistaken text), what the verdict must say)]
MUTANTS = {
    "map": [("every block uses threadIdx.x alone", ("blockIdx.x * blockDim.x + threadIdx.x", "threadIdx.x"),
             "different in every block")],
    "guard": [("no bounds check", ("    if (i < n)\n", ""), "OutOfBoundsError")],
    "map_2d": [("bias indexed by row", ("bias[col]", "bias[row]"), "bias is indexed by the row"),
               ("rows and cols swapped in the row stride", ("a[row * cols + col]", "a[row * rows + col]"),
                "the rows are read `rows` apart")],
    "grid_stride": [("one element per thread, no loop",
                     ("for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)",
                      "for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i = n)"),
                     "only the first gridDim.x * blockDim.x")],
    "reverse_block": [("no barrier", ("    __syncthreads();\n", ""), "RaceError")],
    "halo": [("halo never loaded", ("    if (t == 0)\n        tile[0] = i > 0 ? a[i - 1] : 0.0f;\n"
                                    "    if (t == BLOCK - 1)\n        tile[BLOCK + 1] = i + 1 < n ? a[i + 1] : 0.0f;\n",
                                    ""), "the halo"),
             ("halo read past the ends", ("i > 0 ? a[i - 1] : 0.0f", "a[i - 1]"), "OutOfBoundsError")],
    "tile_2d": [("one cell a thread: the halo ring never loaded",
                 ("k < TILE * TILE; k += BLOCK * BLOCK", "k < TILE * TILE; k += TILE * TILE"),
                 "no thread wrote"),
                ("no zero outside the image", ("r >= 0 && r < rows && c >= 0 && c < cols", "true"),
                 "OutOfBoundsError")],
    "constant_mask": [("window not centred", ("i + j - R", "i + j"), "the window is shifted")],
    "coalesced_transpose": [("the obvious kernel: rows read, columns written",
                             ("            tile[threadIdx.y + j][threadIdx.x] = a[(y + j) * cols + x];\n"
                              "    __syncthreads();\n",
                              "            out[x * rows + y + j] = a[(y + j) * cols + x];\n    return;\n"),
                             "sectors per request")],
    "padded_tile": [("unpadded tile", ("tile[TILE][TILE + 1]", "tile[TILE][TILE]"), "bank conflicts")],
    "block_reduce": [("no barrier in the tree", ("            s[t] += s[t + stride];\n        __syncthreads();\n",
                                                 "            s[t] += s[t + stride];\n"), "RaceError"),
                     ("no guard on the load", ("s[t] = i < n ? a[i] : 0.0f;", "s[t] = a[i];"),
                      "OutOfBoundsError")],
    "histogram": [("a plain += instead of atomicAdd", ("atomicAdd(&bins[v], 1);", "bins[v] += 1;"), "RaceError")],
    "warp_sum": [("lanes past n return before the shuffles", ("float v = i < n ? a[i] : 0.0f;",
                                                              "if (i >= n) return;\n    float v = a[i];"),
                  "WarpMaskError"),
                 ("the first shuffle step left out", ("offset = 16", "offset = 8"), "only some lanes")],
    "dot": [("a plain += instead of atomicAdd", ("atomicAdd(out, v);", "*out += v;"), "RaceError"),
            ("every lane adds", ("    if (threadIdx.x % 32 == 0)\n", ""), "only lane 0 holds")],
    "half2_axpy": [("no bounds check", ("    if (i < n2)\n", ""), "OutOfBoundsError"),
                   ("a only in the low half", ("__float2half2_rn(a)", "__floats2half2_rn(a, 0.0f)"),
                    "high half")],
    "wmma_tile": [("B loaded column-major", ("half, wmma::row_major> fb", "half, wmma::col_major> fb"),
                   "B was read transposed"),
                  ("one step of K only", ("k < K; k += 16", "k < 16; k += 16"), "only the first 16 of K")],
}


def test_every_puzzle_has_a_mutant():
    assert sorted(MUTANTS) == sorted(pz.PUZZLES)


@needs_emulator
@pytest.mark.parametrize("name,mistake,edit,says", [
    (name, mistake, edit, says) for name, cases in sorted(MUTANTS.items()) for mistake, edit, says in cases],
    ids=lambda v: v if isinstance(v, str) and " " not in v else None)
def test_a_mistake_is_named(name, mistake, edit, says):
    source = _solution(CELLS[name][1])
    old, new = edit
    assert old in source, f"{name}: the mutant's text is not in the solution: {old!r}"
    verdict = _check(name, source.replace(old, new), "mutant" + str(abs(hash(new)) % 10**6))
    assert not verdict, f"{name}, {mistake}: the mistake passed"
    assert says in verdict.text, f"{name}, {mistake}: {verdict.text}"


@needs_emulator
def test_a_picture_is_drawn_from_the_kernel():
    module = cl.load_source(_solution(CELLS["map_2d"][1]), name="pz_map_2d_solution")
    verdict = pz.check("map_2d", module.kernel("add_bias_2d"), draw=True)
    assert verdict and verdict.figure is not None
    warp = verdict.figure.convlab_data["warp"]          # block (1, 0) of the 13×21 case: columns 16-20
    assert warp.shape == (13, 21) and (warp[:8, 16:] >= 0).all() and (warp[:, :16] < 0).all()


def test_an_unknown_puzzle_and_a_wrong_kernel_name_are_said():
    assert not pz.check("no_such_puzzle", None)
    module = cl.load_source("__global__ void other(float* y) { y[0] = 1; }", name="pz_other")
    verdict = pz.check("map", module)
    assert not verdict and "add_ten" in verdict.text


def test_a_cell_that_did_not_compile_is_said():
    from convlab.gpu.magic import FailedModule

    verdict = pz.check("map", FailedModule("add_ten", "error: expected ';'"), draw=False)
    assert not verdict and "did not compile" in verdict.text


#: puzzle -> [(the mistake, [(solution text, mistaken text)], what the verdict must say, what it must
#: not say)]: advice whose premise does not hold on the fault is not given
ADVICE = {
    "reverse_block": [("two threads store to one cell (t / 2): no loop, no barrier to add",
                       [("tile[t] = a[base + t];", "tile[t / 2] = a[base + t];")],
                       "each element needs exactly one writer", ("inside its loop", "In this puzzle that usually"))],
    "tile_2d": [("the tile's rows BLOCK wide: an index past the tile, not a pixel outside the image",
                 [("tile[k / TILE][k % TILE]", "tile[k / BLOCK][k % BLOCK]")],
                 "a row of the tile is TILE = BLOCK + 2 cells wide", ("load 0 there",))],
    "coalesced_transpose": [("the tile's row j left out: no halo here",
                             [("tile[threadIdx.y + j][threadIdx.x] = a[(y + j) * cols + x];",
                               "tile[threadIdx.y][threadIdx.x] = a[(y + j) * cols + x];")],
                             "does the load cover the whole tile", ("halo",))],
}


@needs_emulator
@pytest.mark.parametrize("name,mistake,edits,says,never", [
    (name, mistake, edits, says, never) for name, cases in sorted(ADVICE.items())
    for mistake, edits, says, never in cases], ids=lambda v: v if isinstance(v, str) and " " not in v else None)
def test_advice_only_where_its_premise_holds(name, mistake, edits, says, never):
    source = _solution(CELLS[name][1])
    for old, new in edits:
        assert old in source, f"{name}: the mutant's text is not in the solution: {old!r}"
        source = source.replace(old, new)
    verdict = _check(name, source, "advice" + str(abs(hash(mistake)) % 10**6))
    assert not verdict, f"{name}, {mistake}: the mistake passed"
    assert says in verdict.text, f"{name}, {mistake}: {verdict.text}"
    for words in never:
        assert words not in verdict.text, f"{name}, {mistake}: {verdict.text}"


#: more mistakes a student makes, one per puzzle at least (the others are in ADVICE): (the mistake,
#: (solution text, mistaken text), what the verdict must say)
MORE_MUTANTS = {
    "map": [("index one past", ("threadIdx.x;", "threadIdx.x + 1;"),
             "is the element index blockIdx.x * blockDim.x + threadIdx.x")],
    "guard": [("guard i <= n", ("if (i < n)", "if (i <= n)"), "each thread must check its index")],
    "map_2d": [("row and col from the wrong axes",
                ("const int col = blockIdx.x * blockDim.x + threadIdx.x;\n"
                 "    const int row = blockIdx.y * blockDim.y + threadIdx.y;",
                 "const int row = blockIdx.x * blockDim.x + threadIdx.x;\n"
                 "    const int col = blockIdx.y * blockDim.y + threadIdx.y;"),
                "row and col come from the wrong axes")],
    "grid_stride": [("a stride of one block", ("gridDim.x * blockDim.x;", "blockDim.x;"), "the step of its loop")],
    "halo": [("its own element read unguarded", ("tile[1 + t] = i < n ? a[i] : 0.0f;", "tile[1 + t] = a[i];"),
              "a thread past the end (i >= n) loads 0")],
    "constant_mask": [("one tap short", ("j <= 2 * R", "j < 2 * R"), "a tap is left out")],
    "coalesced_transpose": [("the tile read by rows on the store",
                             ("= tile[threadIdx.x][threadIdx.y + j];", "= tile[threadIdx.y + j][threadIdx.x];"),
                             "no thread wrote")],
    "padded_tile": [("padded by 2", ("tile[TILE][TILE + 1]", "tile[TILE][TILE + 2]"),
                     "some of its words share a bank")],
    "block_reduce": [("the barrier inside the if",
                      ("        if (t < stride)\n            s[t] += s[t + stride];\n        __syncthreads();",
                       "        if (t < stride) {\n            s[t] += s[t + stride];\n"
                       "            __syncthreads();\n        }"),
                      "BarrierError")],
    "histogram": [("no guard", ("    if (i < n) {\n        const int v = data[i];\n        atomicAdd(&bins[v], 1);\n"
                                "    }", "    atomicAdd(&bins[data[i]], 1);"),
                   "each thread must check its index")],
    "warp_sum": [("the warp's number within its block", ("warp = i / 32", "warp = threadIdx.x / 32"),
                  "a warp's number counts across the whole grid")],
    "dot": [("no guard on the products", ("float v = i < n ? a[i] * b[i] : 0.0f;", "float v = a[i] * b[i];"),
             "each thread must check its index")],
    "half2_axpy": [("pairs indexed as halves", ("x[i], y[i]);", "x[2 * i], y[2 * i]);"), "n2 counts pairs")],
    "wmma_tile": [("A's leading dimension 16", ("a + row * K + k, K)", "a + row * K + k, 16)"),
                   "A's tiles were read with a leading dimension of 16")],
}


#: right kernels written another way, one per puzzle at least: (what, [(solution text, new text)]);
#: each passes
ALTERNATIVES = {
    "map": [("the index's terms in another order, 10 first",
             [("blockIdx.x * blockDim.x + threadIdx.x", "threadIdx.x + blockDim.x * blockIdx.x"),
              ("a[i] + 10.0f", "10.0f + a[i]")])],
    "guard": [("an early return", [("    if (i < n)\n        out[i]", "    if (i >= n)\n        return;\n    out[i]")])],
    "map_2d": [("an early return", [("    if (row < rows && col < cols)\n        out",
                                     "    if (row >= rows || col >= cols)\n        return;\n    out")])],
    "grid_stride": [("a while loop", [("    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)\n"
                                       "        out[i] = alpha * a[i];",
                                       "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n    while (i < n) {\n"
                                       "        out[i] = a[i] * alpha;\n        i += stride;\n    }")])],
    "reverse_block": [("stored mirrored, read in order",
                       [("    tile[t] = a[base + t];\n    __syncthreads();\n    out[base + t] = tile[CHUNK - 1 - t];",
                         "    tile[CHUNK - 1 - t] = a[base + t];\n    __syncthreads();\n    out[base + t] = tile[t];")])],
    "halo": [("the right halo loaded by thread 1",
              [("    if (t == BLOCK - 1)\n        tile[BLOCK + 1] = i + 1 < n ? a[i + 1] : 0.0f;",
                "    if (t == 1) {\n        const int r = blockIdx.x * BLOCK + BLOCK;\n"
                "        tile[BLOCK + 1] = r < n ? a[r] : 0.0f;\n    }")])],
    "tile_2d": [("two loops over the tile's rows and columns",
                 [("""    for (int k = ty * BLOCK + tx; k < TILE * TILE; k += BLOCK * BLOCK) {
        const int r = blockIdx.y * BLOCK + k / TILE - 1;
        const int c = blockIdx.x * BLOCK + k % TILE - 1;
        tile[k / TILE][k % TILE] = r >= 0 && r < rows && c >= 0 && c < cols
                                   ? a[r * cols + c] : 0.0f;
    }""", """    for (int y = ty; y < TILE; y += BLOCK)
        for (int x = tx; x < TILE; x += BLOCK) {
            const int r = blockIdx.y * BLOCK + y - 1, c = blockIdx.x * BLOCK + x - 1;
            tile[y][x] = (r >= 0 && r < rows && c >= 0 && c < cols) ? a[r * cols + c] : 0.0f;
        }""")])],
    "constant_mask": [("the taps' range clamped to the array",
                       [("""    for (int j = 0; j <= 2 * R; ++j)
        if (i + j - R >= 0 && i + j - R < n)
            sum += c_mask[j] * a[i + j - R];""", """    const int lo = max(0, R - i), hi = min(2 * R, n - 1 - i + R);
    for (int j = lo; j <= hi; ++j)
        sum += a[i - R + j] * c_mask[j];""")])],
    "coalesced_transpose": [("a padded tile", [("tile[TILE][TILE]", "tile[TILE][TILE + 1]")])],
    "padded_tile": [("a flat tile with rows TILE + 1 apart",
                     [("__shared__ float tile[TILE][TILE + 1];", "__shared__ float tile[TILE * (TILE + 1)];"),
                      ("tile[threadIdx.y + j][threadIdx.x] = a", "tile[(threadIdx.y + j) * (TILE + 1) + threadIdx.x] = a"),
                      ("= tile[threadIdx.x][threadIdx.y + j];", "= tile[threadIdx.x * (TILE + 1) + threadIdx.y + j];")])],
    "block_reduce": [("neighbours added in pairs, the stride doubling",
                      [("""    for (int stride = BLOCK / 2; stride > 0; stride /= 2) {
        if (t < stride)""", """    for (int stride = 1; stride < BLOCK; stride *= 2) {
        if (t % (2 * stride) == 0)""")])],
    "histogram": [("a block's histogram in shared memory first",
                   [("""    if (i < n) {
        const int v = data[i];
        atomicAdd(&bins[v], 1);
    }""", """    __shared__ int local[16];
    if (threadIdx.x < 16)
        local[threadIdx.x] = 0;
    __syncthreads();
    if (i < n)
        atomicAdd(&local[data[i]], 1);
    __syncthreads();
    if (threadIdx.x < 16)
        atomicAdd(&bins[threadIdx.x], local[threadIdx.x]);""")])],
    "warp_sum": [("a butterfly (xor)", [("__shfl_down_sync(0xffffffff, v, offset)",
                                          "__shfl_xor_sync(0xffffffff, v, offset)")])],
    "dot": [("xor shuffles, lane 0 by a mask", [("__shfl_down_sync(0xffffffff, v, offset)",
                                                 "__shfl_xor_sync(0xffffffff, v, offset)"),
                                                ("if (threadIdx.x % 32 == 0)", "if ((threadIdx.x & 31) == 0)")])],
    "half2_axpy": [("a multiply, then an add", [("out[i] = __hfma2(__float2half2_rn(a), x[i], y[i]);",
                                                 "out[i] = __hadd2(__hmul2(x[i], __float2half2_rn(a)), y[i]);")])],
    "wmma_tile": [("pointers by &a[...]", [("a + row * K + k, K)", "&a[row * K + k], K)"),
                                           ("b + k * N + col, N)", "&b[k * N + col], N)"),
                                           ("c + row * N + col, acc", "&c[row * N + col], acc")])],
}


def test_every_puzzle_has_another_mutant_and_a_correct_alternative():
    assert sorted(set(MORE_MUTANTS) | set(ADVICE)) == sorted(pz.PUZZLES)
    assert sorted(ALTERNATIVES) == sorted(pz.PUZZLES)


@needs_emulator
@pytest.mark.parametrize("name,mistake,edit,says", [
    (name, mistake, edit, says) for name, cases in sorted(MORE_MUTANTS.items()) for mistake, edit, says in cases],
    ids=lambda v: v if isinstance(v, str) and " " not in v else None)
def test_another_mistake_is_named(name, mistake, edit, says):
    test_a_mistake_is_named(name, mistake, edit, says)


@needs_emulator
@pytest.mark.parametrize("name,what,edits", [
    (name, what, edits) for name, cases in sorted(ALTERNATIVES.items()) for what, edits in cases],
    ids=lambda v: v if isinstance(v, str) and " " not in v else None)
def test_a_correct_alternative_passes(name, what, edits):
    source = _solution(CELLS[name][1])
    for old, new in edits:
        assert old in source, f"{name}: the alternative's text is not in the solution: {old!r}"
        source = source.replace(old, new)
    verdict = _check(name, source, "alt" + str(abs(hash(what)) % 10**6))
    assert verdict, f"{name}, {what}: {verdict.text}"
