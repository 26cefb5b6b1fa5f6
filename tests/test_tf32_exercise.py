"""Exercise 12.1 (solutions/12_tf32_split.ipynb) against realistic mistakes, in
tests/test_exercise_mutants.py's way: each mutant of the solution fails with its mistake named,
each correct alternative passes, and the untouched exercise is "not done yet"."""
import pytest

from convlab.chapters import ch12_tf32 as ch12
from test_exercise_mutants import _exercise, _exercise_cells, _fails_with, _passes

pytestmark = pytest.mark.emu_only

HI = "    hi = __uint_as_float(cvt_rna_tf32(a) & 0xffffe000u);"
LO = "    lo = __uint_as_float(cvt_rna_tf32(a - hi) & 0xffffe000u);"
CROSS = "        mma_1688_tf32(part, ah, bl);\n"


def _split(cuda=()):
    return _exercise("12_tf32_split", "split", cuda, launch_cell=("ch12.check_tf32_split(split, 1)",))


@pytest.mark.parametrize("cuda, part, words", [
    ([(HI, "    hi = __uint_as_float(__float_as_uint(a) & 0xffffe000u);")], 1, "hi is a truncated"),
    ([(HI, "    hi = a;")], 1, "hi is a itself"),
    ([(LO, "    lo = a - hi;")], 1, "not rounded"),
    ([(LO, "    lo = __uint_as_float(__float_as_uint(a - hi) & 0xffffe000u);")], 1, "lo is truncated"),
    ([(LO, "    lo = __uint_as_float(cvt_rna_tf32(hi - a) & 0xffffe000u);")], 1, "wrong sign"),
    ([(CROSS, "")], 2, "a_hi * b_lo is missing"),
    ([("        mma_1688_tf32(part, al, bh);\n", "")], 2, "a_lo * b_hi is missing"),
    ([("        mma_1688_tf32(part, al, bh);\n" + CROSS, "")], 2, "only a_hi * b_hi"),
    ([(LO, "    lo = 0.0f;")], 2, "D is only a_hi * b_hi"),
])
def test_12_mistakes_are_named(cuda, part, words, capsys):
    _fails_with(ch12.check_tf32_split(_split(cuda)["split"], part), capsys, words)


@pytest.mark.parametrize("cuda", [
    (),
    # the big product first: the same bound holds
    [("        mma_1688_tf32(part, al, bh);\n" + CROSS + "        mma_1688_tf32(part, ah, bh);\n",
      "        mma_1688_tf32(part, ah, bh);\n        mma_1688_tf32(part, al, bh);\n" + CROSS)],
    # the fourth product too: more work, no harm to the result
    [(CROSS, CROSS + "        mma_1688_tf32(part, al, bl);\n")],
    # CUTLASS's rounding in integer arithmetic (the same as cvt.rna for finite values)
    [(HI, "    hi = __uint_as_float((__float_as_uint(a) + 0x1000u) & 0xffffe000u);")],
])
def test_12_solution_and_alternatives_pass(cuda, capsys):
    mod = _split(cuda)["split"]
    _passes(ch12.check_tf32_split(mod, 1), capsys)
    _passes(ch12.check_tf32_split(mod, 2), capsys)


def test_12_untouched_is_not_done_yet(capsys):
    mod = _exercise_cells("12_tf32_split", "split", ("ch12.check_tf32_split(split, 1)",))["split"]
    assert not ch12.check_tf32_split(mod, 1) and not ch12.check_tf32_split(mod, 2)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(line.startswith("not done yet: the TODO in cell split") for line in lines), lines
