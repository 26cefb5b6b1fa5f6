"""Listings name what they show (convlab.display.listings): a function or a marked region, never line
numbers. Every region marker in the repository is paired, and every listing a notebook shows
resolves, so a kernel edit that breaks one fails here rather than shifting a page."""
import ast
import json
from pathlib import Path

import pytest

from convlab.display import book, listings

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted(p for ext in ("cu", "cuh", "cpp", "h") for p in (ROOT / "kernels").rglob(f"*.{ext}")) + \
    sorted((ROOT / "convlab").rglob("*.py"))
NOTEBOOKS = sorted(p for d in ("book", "solutions", "puzzles", "exercises") for p in (ROOT / d).glob("*.ipynb"))
CALLS = {"show_listing", "listing", "show_diff", "diff"}

KERNEL = """\
// a file
__device__ int f(int a)   // listing: head
{
    return a;              // a comment  // listing: inner
}                          // end listing: inner  // end listing: head

__global__ void __launch_bounds__(64)
g(int* y)
{
    // listing: alone
    y[0] = f(1);
    // end listing: alone
}
"""


@pytest.fixture
def kernel(tmp_path):
    path = tmp_path / "k.cu"
    path.write_text(KERNEL)
    return str(path)


def test_a_region_is_its_marked_lines_shown_without_markers(kernel):
    src = listings.Source(f"{kernel}::head")
    assert (src.first, src.last) == (2, 5)
    assert src.lines == ["__device__ int f(int a)", "{", "    return a;              // a comment", "}"]
    assert listings.Source(f"{kernel}::inner").lines[0].endswith("// a comment")
    assert listings.Source(f"{kernel}::alone").lines == ["", "    y[0] = f(1);", ""]
    whole = listings.Source(kernel)
    assert whole.lines == [listings.strip_marks(ln, kernel) for ln in KERNEL.splitlines()]
    assert not any("listing:" in ln for ln in whole.lines)


def test_a_function_is_found_by_name_and_emphasis_by_name_or_text(kernel):
    src = listings.Source(f"{kernel}::g")
    assert (src.first, src.last) == (7, 13)
    assert src.emphasized(["::alone"]) == [10, 11, 12]
    assert src.emphasized("y[0]") == [11]
    b = book.listing(f"{kernel}::g", emphasize=["y[0]"], caption="{where}: g")
    assert ":emphasize-lines: 5" in b["text/markdown"] and "// k.cu, lines 7–13: g" in b["text/plain"]


def test_an_unknown_name_lists_the_files_names(kernel):
    with pytest.raises(ValueError, match=r"k.cu has no marked region or function named 'nope'; "
                                         r"its regions: head, inner, alone; its functions: f, g"):
        listings.Source(f"{kernel}::nope")


def test_line_numbers_are_refused(kernel):
    with pytest.raises(ValueError, match="names what it shows, not line numbers"):
        listings.Source(f"{kernel}:2-5")
    with pytest.raises(TypeError, match="never by line number"):
        listings.Source(f"{kernel}::g").emphasized([11])
    with pytest.raises(ValueError, match="names no line of the listing"):
        listings.Source(f"{kernel}::f").emphasized(["y[0]"])


@pytest.mark.parametrize("text, error", [
    ("int a;  // listing: a\n", "region 'a' is never closed"),
    ("int a;  // end listing: a\n", "without a 'listing: a' above it"),
    ("int a;  // listing: a\nint b;  // end listing: a\nint c;  // listing: a\n", "marked a second time"),
])
def test_a_malformed_marker_pair_is_an_error_naming_its_line(tmp_path, text, error):
    path = tmp_path / "bad.cu"
    path.write_text(text)
    with pytest.raises(ValueError, match=error):
        listings.Source(str(path))


def test_python_definitions_by_qualified_name(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("import x\n\n\nclass A:\n    @staticmethod\n    def run(self):\n        return 1\n\n\n"
                    "def top():\n    pass\n")
    assert (listings.Source(f"{path}::A.run").first, listings.Source(f"{path}::A.run").last) == (5, 7)
    assert listings.Source(f"{path}::top").lines == ["def top():", "    pass"]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_region_marker_is_paired(path):
    rel = str(path.relative_to(ROOT))
    listings.regions(path.read_text().splitlines(), rel)


def _calls(path: Path):
    """(cell number, call node, namespace) of every listing call of a notebook, with the names its
    cells import or bind to plain strings (a listing's arguments must be evaluable from those)."""
    ns = {}
    nb = json.loads(path.read_text())
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code" or "".join(cell["source"]).startswith("%%"):
            continue   # a cell magic (%%cuda) holds no Python
        code = "".join(ln for ln in "".join(cell["source"]).splitlines(keepends=True)
                       if not ln.lstrip().startswith(("%", "!")))
        tree = ast.parse(code)
        for stmt in tree.body:
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                exec(compile(ast.Module([stmt], []), str(path), "exec"), ns)
            elif isinstance(stmt, ast.Assign) and isinstance(stmt.value, (ast.Constant, ast.JoinedStr, ast.BinOp)):
                try:
                    exec(compile(ast.Module([stmt], []), str(path), "exec"), ns)
                except Exception:   # not a plain string: no listing may depend on it
                    pass
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in CALLS \
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "book":
                yield i, node, ns


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_listing_in_the_notebooks_resolves(path):
    for i, call, ns in _calls(path):
        where = f"{path.relative_to(ROOT)}, cell {i}: {ast.unparse(call)[:120]}"
        try:
            args = [eval(compile(ast.Expression(a), str(path), "eval"), ns) for a in call.args]
            kwargs = {k.arg: eval(compile(ast.Expression(k.value), str(path), "eval"), ns)
                      for k in call.keywords if k.arg == "emphasize"}
        except NameError as e:
            pytest.fail(f"{where}: its arguments must name the file and what to show directly ({e})")
        if call.func.attr in ("show_diff", "diff"):
            book.diff(*args[:2])
        else:
            try:
                book.listing(args[0], **kwargs)
            except (ValueError, TypeError) as e:
                pytest.fail(f"{where}: {e}")


def _stored_plain(cell) -> list:
    return ["".join(o["data"]["text/plain"]) if isinstance(o["data"]["text/plain"], list)
            else o["data"]["text/plain"] for o in cell.get("outputs", [])
            if "text/plain" in o.get("data", {})]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_stored_listing_is_the_file_as_it_stands(path):
    """A listing's stored output (what the page shows) is what the file holds now: an edit to a
    kernel or a module that moves or changes what a page lists fails here until the cell is run
    again. Calls whose arguments need the notebook's own variables are checked by nbval instead."""
    cells = json.loads(path.read_text())["cells"]
    stale = []
    for i, call, ns in _calls(path):
        try:
            args = [eval(compile(ast.Expression(a), str(path), "eval"), ns) for a in call.args]
            kwargs = {k.arg: eval(compile(ast.Expression(k.value), str(path), "eval"), ns)
                      for k in call.keywords}
        except NameError:
            continue
        render = book.diff if call.func.attr in ("show_diff", "diff") else book.listing
        shown = render(*args, **kwargs)["text/plain"]
        if call.func.attr.startswith("show") and shown not in _stored_plain(cells[i]):
            stale.append(f"cell {i}: {ast.unparse(call)[:100]}")
    assert not stale, (f"{path.relative_to(ROOT)}: listings that no longer show what their files "
                       f"hold (run these cells again): {stale}")
