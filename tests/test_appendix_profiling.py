"""The profiling appendix defines every row a profile card can show, in plain words, and has the
method heading that chapters link to."""
import json
from pathlib import Path

from convlab.measuring.cards import ROWS, STALL_MEANING, STALL_REASONS

PAGE = Path(__file__).resolve().parent.parent / "book" / "appendix_profiling.ipynb"


def _markdown() -> str:
    nb = json.loads(PAGE.read_text())
    return "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")


def test_every_card_row_is_defined():
    text = _markdown()
    missing = [label for label, _ in ROWS if f"**{label}**" not in text]
    assert not missing, f"appendix_profiling defines no row named {missing}"


def test_every_stall_reason_has_a_meaning():
    assert set(STALL_MEANING) == set(STALL_REASONS)


def test_the_method_has_an_anchor():
    assert "(profiling-method)=\n## The method" in _markdown()
