"""The built website (make book, which `make test` runs before pytest): every page of _toc.yml is
there, and a chapter whose GPU results are committed shows its figure."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HTML = ROOT / "_build" / "html"

pytestmark = pytest.mark.skipif(not (HTML / "index.html").is_file(),
                                reason="no built site: run `make book` first (make test does)")


def toc_files():
    return re.findall(r"^\s*(?:root|- file):\s*(\S+)", (ROOT / "_toc.yml").read_text(), re.MULTILINE)


@pytest.mark.parametrize("page", toc_files())
def test_every_toc_page_is_built(page):
    built = HTML / f"{page}.html"
    assert built.is_file(), f"{page} is in _toc.yml but {built.relative_to(ROOT)} was not built"
    source = next(ROOT.glob(f"{page}.*"))
    assert built.stat().st_mtime >= source.stat().st_mtime - 1, f"{built.name} is older than {source.name}: rebuild"


def _current_results():
    """The chapters whose book/data CSV holds results of the current harness (an older file is
    rewritten by the next GPU run; until then its chapter says there are none)."""
    from convlab import results

    return [p for p in sorted((ROOT / "book" / "data").glob("[0-9]*.csv")) if results.load(p.stem, quiet=True) is not None]


@pytest.mark.parametrize("csv", _current_results(), ids=lambda p: p.stem)
def test_chapters_with_gpu_results_show_a_figure(csv):
    page = HTML / "book" / f"{csv.stem}.html"
    assert page.is_file()
    html = page.read_text()
    assert re.search(r"<img[^>]+src=\"[^\"]+\.png\"", html), f"{page.name} shows no figure"


def test_intro_lists_the_chapters():
    html = (HTML / "book" / "intro.html").read_text()
    assert "Sequential convolution" in html and "Naive CUDA" in html
