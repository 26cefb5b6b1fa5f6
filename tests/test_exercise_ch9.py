"""Chapter 9's new exercises against realistic mistakes, as tests/test_exercise_mutants.py does for
the others: each mutant of a solution fails with its mistake named, the solution passes. The kernels
come from solutions/09a_groups_dilation.ipynb and solutions/09b_swizzle_stages.ipynb (their %%cuda
cells, compiled after a textual mutation); the checks are convlab.chapters.ch09_general's and
ch09b_tensor_cores's, run directly (no notebook is executed)."""
import re
from pathlib import Path

import nbformat
import pytest

import convlab as cl
from convlab.chapters import ch09_general as ch9
from convlab.chapters import ch09b_tensor_cores as ch9b

pytestmark = pytest.mark.emu_only

ROOT = Path(__file__).resolve().parent.parent


def _cuda(notebook: str, module: str, changes=()):
    nb = nbformat.read(ROOT / "solutions" / f"{notebook}.ipynb", as_version=4)
    cell = next(c for c in nb.cells if c.cell_type == "code" and c.source.startswith(f"%%cuda {module}"))
    body = re.sub(r"^[ \t]*(//|###)(\+| *(BEGIN|END) SOLUTION)[^\n]*\n", "", cell.source.partition("\n")[2],
                  flags=re.M)
    for old, new in changes:
        assert old in body, old
        body = body.replace(old, new, 1)
    return cl.load_source(body, name=f"{module}_{abs(hash(tuple(changes))) % 10**8}")


def _igemm_launch(module):
    def launch(x, w, y, stride, pad, dilation, groups):
        B, C, H, W = x.shape
        M, _, K, _ = w.shape
        Ho, Wo = y.shape[2], y.shape[3]
        grid = ((Ho * Wo + 15) // 16, (M // groups + 15) // 16, B * groups)
        module.kernel("conv2d_igemm_grouped")(x, w, y, B, C, M, H, W, K, stride, pad, dilation, groups,
                                              grid=grid, block=(16, 16, 1))
    return launch


IGEMM_MUTANTS = {
    "dilation left out of the input's row": [("iy0 + ky * dilation", "iy0 + ky")],
    "every map reads the first group": [("(size_t)g * Cg) * H * W", "0) * H * W")],
    "the mask of the first group": [("wg += (size_t)g * Mg * KD;", "")],
}


def test_the_grouped_implicit_gemm_passes(capsys):
    assert ch9.check_general_kernel(_igemm_launch(_cuda("09a_groups_dilation", "my_igemm")), name="igemm")
    assert "✓ correct" in capsys.readouterr().out


@pytest.mark.parametrize("mistake", IGEMM_MUTANTS)
def test_the_grouped_implicit_gemm_mistakes_fail(mistake, capsys):
    launch = _igemm_launch(_cuda("09a_groups_dilation", "my_igemm", IGEMM_MUTANTS[mistake]))
    assert not ch9.check_general_kernel(launch, name="igemm")
    out = capsys.readouterr().out
    assert "✗" in out or "wrong" in out, out


def test_the_swizzle_passes_and_its_targets_are_the_chapters(capsys):
    assert ch9b.check_swizzle(_cuda("09b_swizzle_stages", "my_swizzle"), name="swz")
    assert "✓ correct" in capsys.readouterr().out
    assert all(most == 0 for _, most in ch9b.swizzle_targets().values())


SWIZZLE_MUTANTS = {   # mistake -> (change, what the verdict says)
    "no swizzle": ([("slot = CHUNKS == 8 ? chunk ^ (row & 7) : chunk ^ ((row >> 1) & 3);", "")],
                   "not within the targets"),
    "BK=64's XOR for every BK": ([(": chunk ^ ((row >> 1) & 3)", ": chunk ^ (row & 7)")], "must stay below CHUNKS"),
    "the row's line ignored at BK=32": ([(": chunk ^ ((row >> 1) & 3)", ": chunk ^ (row & 3)")],
                                        "not within the targets"),
    "two chunks in one slot": ([("chunk ^ (row & 7)", "(chunk | (row & 7)) & 7")], "not the tile's"),
}


@pytest.mark.parametrize("mistake", SWIZZLE_MUTANTS)
def test_the_swizzle_mistakes_fail_with_the_reason(mistake, capsys):
    changes, said = SWIZZLE_MUTANTS[mistake]
    assert not ch9b.check_swizzle(_cuda("09b_swizzle_stages", "my_swizzle", changes), name="swz")
    assert said in capsys.readouterr().out


def test_the_stage_budget(capsys):
    want = ch9b.stage_budget()
    assert ch9b.check_stage_budget(want["stage bytes"], want["stages that fit"], want["blocks per SM"])
    assert not ch9b.check_stage_budget(want["stage bytes"] // 2, want["stages that fit"], want["blocks per SM"])
    assert not ch9b.check_stage_budget(None, None, None)
    assert "not done yet" in capsys.readouterr().out
