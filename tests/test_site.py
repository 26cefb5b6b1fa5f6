"""The website: every page of _toc.yml is built (make book, which `make test` runs before pytest),
a chapter whose GPU results are committed shows its figure, and the notebooks are as
scripts/tidy_notebooks.py leaves them (no test markers, harness code folded, no progress bars).
tests/test_site_browser.py looks at the built pages in a real browser."""
import ast
import importlib.util
import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
HTML = ROOT / "_build" / "html"

needs_site = pytest.mark.skipif(not (HTML / "index.html").is_file(),
                                reason="no built site: run `make book` first (make test does)")


def toc_files():
    return re.findall(r"^\s*(?:root|- file):\s*(\S+)", (ROOT / "_toc.yml").read_text(), re.MULTILINE)


@needs_site
@pytest.mark.parametrize("page", toc_files())
def test_every_toc_page_is_built(page):
    built = HTML / f"{page}.html"
    assert built.is_file(), f"{page} is in _toc.yml but {built.relative_to(ROOT)} was not built"
    source = next(ROOT.glob(f"{page}.*"))
    assert built.stat().st_mtime >= source.stat().st_mtime - 1, f"{built.name} is older than {source.name}: rebuild"


def _current_results():
    """The chapters whose book/data CSV holds results of the current harness (an older file is
    rewritten by the next GPU run; until then its chapter says there are none)."""
    from convlab.measuring import results

    return [p for p in sorted((ROOT / "book" / "data").glob("[0-9]*.csv")) if results.load(p.stem, quiet=True) is not None]


@needs_site
@pytest.mark.parametrize("csv", _current_results(), ids=lambda p: p.stem)
def test_chapters_with_gpu_results_show_a_figure(csv):
    page = HTML / "book" / f"{csv.stem}.html"
    assert page.is_file()
    html = page.read_text()
    assert re.search(r"<img[^>]+src=\"[^\"]+\.png\"", html), f"{page.name} shows no figure"


@needs_site
def test_intro_lists_the_chapters():
    html = (HTML / "book" / "intro.html").read_text()
    assert "Sequential convolution" in html and "Naive CUDA" in html


# ---- the notebooks as the site shows them: scripts/tidy_notebooks.py keeps them so ----------

def _tidy_module():
    spec = importlib.util.spec_from_file_location("tidy_notebooks", ROOT / "scripts" / "tidy_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tidy_notebooks = _tidy_module()
SITE_NOTEBOOKS = [p.relative_to(ROOT).as_posix() for p in tidy_notebooks.notebooks()]


@pytest.mark.parametrize("name", SITE_NOTEBOOKS)
def test_notebook_has_no_test_markers_and_folds_its_harness(name):
    nb = nbformat.read(ROOT / name, as_version=4)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        marker = tidy_notebooks.NBVAL_MARKER.search(cell.source)
        assert marker is None, (f"{name}, cell {i}: '{marker.group(0).strip()}' would show on the page; "
                                "run `python scripts/tidy_notebooks.py` (it becomes a cell tag)")
        tags = cell.metadata.get("tags", [])
        if tidy_notebooks.is_harness(cell.source):
            assert {"hide-input", "remove-input", "show-input"} & set(tags), (
                f"{name}, cell {i}: a long plotting or timing cell shown in full on the page; "
                "run `python scripts/tidy_notebooks.py` (it tags it hide-input), or tag it show-input")


@pytest.mark.parametrize("name", SITE_NOTEBOOKS)
def test_notebook_is_tidy(name):
    path = ROOT / name
    nb = nbformat.read(path, as_version=4)
    tidy_notebooks.tidy(nb)
    assert nbformat.writes(nb) + "\n" == path.read_text(), (
        f"{name} is not as scripts/tidy_notebooks.py leaves it (progress bars or save notes in its "
        "outputs, or lines it would wrap): run `python scripts/tidy_notebooks.py` and commit the result")


def test_tidy_rules_catch_what_they_name():
    cell = nbformat.v4.new_code_cell("# NBVAL_CHECK_OUTPUT\nprint(1)")
    cell.outputs = [nbformat.v4.new_output("stream", name="stderr", text="sweep:   0%|          | 0/5 [00:00<?, ?it/s]"),
                    nbformat.v4.new_output("stream", name="stdout", text="saved 18 rows to book/data/x.csv\n1\n")]
    long_line = "value = some_function(" + ", ".join(f"argument_{i}" for i in range(12)) + ")"
    harness = nbformat.v4.new_code_cell("\n".join([f"x{i} = {i}" for i in range(9)] + ["plt.plot(x1)", long_line]))
    harness.outputs = [nbformat.v4.new_output("display_data", data={"image/png": "AAAA", "text/plain": "<Figure>"})]
    original = harness.source
    nb = nbformat.v4.new_notebook(cells=[cell, harness])
    tidy_notebooks.tidy(nb)
    assert cell.source == "print(1)" and cell.metadata["tags"] == ["nbval-check-output"]
    assert [o.text for o in cell.outputs] == ["1\n"]
    assert harness.metadata["tags"] == ["hide-input"]
    assert max(len(ln) for ln in harness.source.splitlines()) <= tidy_notebooks.MAX_WIDTH
    assert harness.source != original and ast.dump(ast.parse(harness.source)) == ast.dump(ast.parse(original))


# ---- one reading order: the intro's, the menu's, prev/next's -------------------------------------

def _toc_chapters() -> list[tuple[str, list[str]]]:
    """(chapter, its sections) in _toc.yml's order, for the part that holds the chapters."""
    out = []
    for line in (ROOT / "_toc.yml").read_text().splitlines():
        m = re.match(r"^(\s*)- file:\s*(\S+)", line)
        if not m:
            continue
        if len(m.group(1)) == 6:
            out.append((m.group(2), []))
        elif out:
            out[-1][1].append(m.group(2))
    return out


def test_the_menu_follows_the_intros_order():
    """prev/next walks _toc.yml: its chapters come in the order book/intro.md lists them (chapter 1,
    page 0, chapter 2, ...), with nothing before chapter 1."""
    intro = (ROOT / "book" / "intro.md").read_text()
    listed = intro.split("## The chapters", 1)[1].split("\n## ", 1)[0]
    order = list(dict.fromkeys(re.findall(r"\]\(([\w]+)\.(?:ipynb|md)\)", listed)))
    chapters = [c.removeprefix("book/") for c, _ in _toc_chapters() if c.startswith("book/")
                and not c.startswith(("book/appendix", "book/hosted"))]
    assert chapters[:len(order)] == order, f"_toc.yml's chapters {chapters} are not in the intro's order {order}"
    assert _toc_chapters()[0][0] == "book/01_sequential", "the first page after the intro must be chapter 1"


def test_each_puzzle_page_sits_under_the_chapter_that_links_it():
    """A puzzle page is a section of one chapter in the menu, and that chapter (only that one) links
    it: a reader meets the puzzles where the chapter uses what they practise."""
    for chapter, sections in _toc_chapters():
        for page in (s for s in sections if s.startswith("puzzles/")):
            name = page.split("/")[-1]
            linking = sorted(p.stem for p in (ROOT / "book").glob("*.ipynb") if f"puzzles/{name}.ipynb" in p.read_text())
            assert linking == [chapter.split("/")[-1]], (
                f"{page} sits under {chapter} in _toc.yml but is linked from {linking}")


def _ends_in_a_glue(source: str) -> bool:
    """Whether a cell's last statement is a bare book.glue(...) call, whose value Jupyter would
    show a second time, below the cell, besides storing it for the prose."""
    if source.rstrip().endswith(";"):
        return False
    try:
        body = ast.parse(source).body
    except SyntaxError:
        return False
    last = body[-1] if body else None
    return (isinstance(last, ast.Expr) and isinstance(last.value, ast.Call)
            and isinstance(last.value.func, ast.Attribute) and last.value.func.attr == "glue")


@pytest.mark.parametrize("name", SITE_NOTEBOOKS)
def test_a_glued_value_is_not_shown_again(name):
    """book.glue returns its value; as a cell's last line that value is the cell's result and the
    page shows it (a whole glued table did once, in the main line). End such a line with ';'."""
    nb = nbformat.read(ROOT / name, as_version=4)
    shown = [i for i, cell in enumerate(nb.cells) if cell.cell_type == "code"
             and any(o.output_type == "execute_result" for o in cell.get("outputs", []))
             and _ends_in_a_glue(cell.source)]
    assert not shown, (f"{name}, cells {shown}: the glued value is shown again as the cell's "
                       "result; end the book.glue(...) line with ';'")


def test_the_glue_check_sees_a_trailing_glue():
    assert _ends_in_a_glue('x = 1\nbook.glue("k", x)')
    assert not _ends_in_a_glue('book.glue("k", 1);')
    assert not _ends_in_a_glue('_ = book.glue("k", 1)')
