"""convlab.display.book's page outputs: diffs and listings of kernels (MyST code-blocks with the files' own
line numbers), tables without an index column at three significant figures, compact profile cards,
and the tidy rule that removes the input bar of cells that show nothing."""
import importlib
import importlib.util
import re
from pathlib import Path

import nbformat
import pandas as pd
import pytest

from convlab.display import book
from convlab.measuring import results

ROOT = Path(__file__).resolve().parent.parent
P = importlib.import_module("convlab.measuring.profile")   # the module (convlab.measuring.profile the attribute is cl.profile)


def blocks(markdown, folded=False):
    """(lineno-start, emphasized relative lines, code lines, caption) of each code-block (with
    folded=False, those not in a dropdown)."""
    out = []
    if not folded:
        markdown = re.sub(r"::::\{dropdown\}.*?\n::::", "", markdown, flags=re.S)
    for m in re.finditer(r"```+\{code-block\} \w+\n(.*?)\n\n(.*?)\n```", markdown, re.S):
        opts = dict(re.findall(r":([\w-]+): (.*)", m.group(1)))
        emph = [int(x) for x in opts.get("emphasize-lines", "").split(",") if x]
        out.append((int(opts["lineno-start"]), emph, m.group(2).split("\n"), opts.get("caption", "")))
    return out


def test_diff_of_two_small_files_emphasizes_exactly_the_changed_lines(tmp_path):
    old = [f"line {i}" for i in range(1, 21)]
    new = list(old)
    new[9] = "line 10 changed"              # line 10
    new.insert(13, "an inserted line")      # becomes line 14
    (tmp_path / "a.cu").write_text("\n".join(old) + "\n")
    (tmp_path / "b.cu").write_text("\n".join(new) + "\n")
    d = book.diff(str(tmp_path / "a.cu"), str(tmp_path / "b.cu"), context=2)
    assert [h[2] for h in d["hunks"]] == [[10, 14]]           # 3 lines apart: one merged hunk
    (start, emph, code, caption), = blocks(d["text/markdown"])
    assert start == 8 and code[0] == "line 8"
    assert [start + e - 1 for e in emph] == [10, 14]
    assert "b.cu, lines 8–16" in caption and "a.cu" in caption
    assert "::::{dropdown}" in d["text/markdown"] and "line 10\n" in d["text/markdown"]
    assert "-line 10\n+line 10 changed" in d["text/plain"] and "@@ -8," in d["text/plain"]


def test_diff_of_two_real_kernels():
    old, new = ("kernels/03_tiled/conv2d_tiled_input_block.cu", "kernels/03_tiled/conv2d_tiled_cached_halo.cu")
    d = book.diff(old, new)
    new_lines = book.Source(new).all_lines       # as shown: without the listing markers
    old_lines = set(book.Source(old).all_lines)
    shown = blocks(d["text/markdown"])
    assert len(shown) == len(d["hunks"]) >= 1
    for (start, emph, code, _), (first, last, changed) in zip(shown, d["hunks"]):
        assert start == first and code == new_lines[first - 1:last]
        assert [start + e - 1 for e in emph] == changed
        # every emphasized line is new, every line shown plain is in the old file
        for n in range(first, last + 1):
            assert (n in changed) or new_lines[n - 1] in old_lines
    assert d["text/plain"].startswith("--- conv2d_tiled_input_block.cu\n+++ conv2d_tiled_cached_halo.cu")


def test_function_extraction_is_brace_matched():
    src = book.Source("kernels/03_tiled/conv2d_tiled_cached_halo.cu::conv2d_tiled_cached_halo")
    assert src.lines[0].startswith("__global__ void conv2d_tiled_cached_halo(")
    assert src.lines[-1] == "}" and sum(ln.count("{") - ln.count("}") for ln in src.lines) == 0
    with pytest.raises(ValueError, match="no marked region or function named 'no_such_kernel'"):
        book.Source("kernels/03_tiled/conv2d_tiled_cached_halo.cu::no_such_kernel")


def test_function_extraction_skips_braces_in_comments_and_strings(tmp_path):
    (tmp_path / "k.cu").write_text('// a {\ntemplate <int N>\n__device__ int f(int a)\n{\n'
                                   '    /* } */ const char* s = "}";\n    return a;\n}\nint g;\n')
    src = book.Source(f"{tmp_path / 'k.cu'}::f")
    assert (src.first, src.last) == (2, 7)


def test_listing_keeps_real_line_numbers_and_folds():
    b = book.listing("kernels/03_tiled/conv2d_tiled_cached_halo.cu::conv2d_tiled_cached_halo",
                     emphasize=["__shared__ float tile", "const int Ho ="])
    assert b["text/markdown"].startswith("::::{dropdown} conv2d_tiled_cached_halo.cu, lines 39–87")
    (start, emph, code, _), = blocks(b["text/markdown"], folded=True)
    assert start == 39 and emph == [5, 7] and len(code) == 49
    assert b["text/plain"].splitlines()[1].startswith("39  __global__")
    whole = book.listing("kernels/03_tiled/conv2d_tiled_cached_halo.cu", fold=False)
    assert not whole["text/markdown"].startswith("::::") and ":caption: conv2d_tiled_cached_halo.cu" in whole["text/markdown"]


def test_sig_and_table_have_no_index_and_three_significant_figures():
    assert [book.sig(v) for v in (0.012345, 12.345, 1234.5, 99.96, 7, None)] == \
        ["0.0123", "12.3", "1,230", "100", "7", "—"]
    df = pd.DataFrame({"workload": ["a", "b"], "impl": ["x", "y"], "ms": [0.123456, 12.3456]}).set_index(["workload", "impl"])
    html = book.table(df, caption="GPU time")._repr_html_()
    assert html.startswith('<div class="table-wrap">') and "<caption>GPU time</caption>" in html
    heads = re.findall(r"<th>(.*?)</th>", html)
    assert heads == ["workload", "impl", "ms"]                 # no index column, not even an empty head
    assert "<td>0.123</td>" in html and "<td>12.3</td>" in html and "0.1235" not in html
    assert '<td class="text">a</td>' in html                  # text left-aligned by the stylesheet
    plain = book.table(pd.DataFrame({"ms": [1.23456]}))._repr_html_()
    assert re.findall(r"<th>(.*?)</th>", plain) == ["ms"]       # a 0..n-1 row number is no column


def test_report_keeps_its_index_and_shows_no_index_column():
    rows = results.load("03_tiled")
    r = results.report(rows)
    assert r.index.names == ["workload", "impl"] and "GPU ms" in r.columns
    html = r._repr_html_()
    assert re.findall(r"<th>(.*?)</th>", html)[:2] == ["workload", "impl"]
    ms = re.findall(r"<td>([\d.,]+)</td>", html)[0]
    assert len(ms.replace(",", "").replace(".", "").lstrip("0")) <= 3


def card():
    c = P.committed("ch3_conv2d_tiled_cached_halo")
    assert c is not None
    return c


def test_card_html_puts_metric_names_only_in_tooltips():
    c = card()
    html = c._repr_html_()
    text = re.sub(r'title="[^"]*"', "", html)
    for _, metric in c.rows:
        assert metric not in text
    df = c.table()
    row_cells = re.findall(r'<tr><th title="([^"]*)">([^<]*)</th>((?:<td>[^<]*</td>)+)</tr>', html)
    assert len(row_cells) == len(df)
    for (metric, label, cells), key in zip(row_cells, df.index):
        assert (label, metric) == key and len(re.findall("<td>", cells)) == len(df.columns)
    assert "<caption>" in html and c.table().shape == df.shape


def test_card_show_and_cards_side_by_side():
    c, other = card(), P.committed("ch3_conv2d_tiled_input_block")
    small = c.show(["duration (us)", "l1tex__t_sector_hit_rate.pct"]).data
    assert re.findall(r'<tr><th title="[^"]*">([^<]*)</th>', small) == ["duration (us)", "L1 hit rate (%)"]
    with pytest.raises(KeyError, match="not a row"):
        c.show(["no such row"])
    both = book.cards({"cached halo": c, "input-sized blocks": other}, ["duration (us)"])
    html = both._repr_html_()
    assert "<caption>cached halo, input-sized blocks</caption>" in html
    assert '<th colspan="1">cached halo</th>' in html and "<details><summary>" in html
    assert len(re.findall(r"<tr><th title=\"[^\"]*\">[^<]*</th><td>", html.split("<details>")[0])) == 1


def _tidy():
    spec = importlib.util.spec_from_file_location("tidy_notebooks", ROOT / "scripts" / "tidy_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tidy_removes_the_input_of_cells_that_show_nothing():
    tidy = _tidy()
    glue_only = nbformat.v4.new_code_cell("book.glue('x', 1)", metadata={"tags": ["hide-input"]})
    glue_only.outputs = [nbformat.v4.new_output("display_data", data={book.GLUE_PREFIX + "text/plain": "1"})]
    silent = nbformat.v4.new_code_cell("x = 1", metadata={"tags": ["hide-input"]})
    shows = nbformat.v4.new_code_cell("print(1)", metadata={"tags": ["hide-input"]})
    shows.outputs = [nbformat.v4.new_output("stream", name="stdout", text="1\n")]
    figure = nbformat.v4.new_code_cell("plot()", metadata={"tags": ["hide-input"]})
    figure.outputs = [nbformat.v4.new_output("display_data", data={"image/png": "AAAA", "text/plain": "<Figure>"})]
    open_cell = nbformat.v4.new_code_cell("x = 2")
    tidy.tidy(nbformat.v4.new_notebook(cells=[glue_only, silent, shows, figure, open_cell]))
    assert glue_only.metadata["tags"] == ["remove-input"] and silent.metadata["tags"] == ["remove-input"]
    assert shows.metadata["tags"] == ["hide-input"] and figure.metadata["tags"] == ["hide-input"]
    assert "tags" not in open_cell.metadata


def test_glued_text_reads_back_as_written():
    """myst-nb literal_evals a glue's text/plain: "2,304" would show as (2, 304)."""
    format_plain_text = pytest.importorskip("myst_nb.core.variables",
                                            reason="myst-nb builds the site: not in the GPU kit").format_plain_text

    for text in ("2,304", "65,536", "3,920,000", "1.12", "4.5", "57", "—", "1e-04", "TX=4 TY=1 BY=8, ZC=32",
                 "none of its 125 FFMAs read the mask", "(2, 3)"):
        stored = book._as_glue_text(text)
        assert format_plain_text(stored, "") == text, (text, stored)
    assert book._as_glue_text("57") == "57" and book._as_glue_text("2,304") == "'2,304'"


def test_glue_stores_a_tables_html(monkeypatch):
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda data, **kw: shown.append((data, kw)))
    book.glue("t", book.table(pd.DataFrame({"ms": [1.23456]})))
    book.glue("n", 1.5, ".1f")
    (table, kw), (number, _) = shown
    assert kw["metadata"]["scrapbook"]["name"] == "t"
    assert "<table" in table[book.GLUE_PREFIX + "text/html"] and "1.23" in table[book.GLUE_PREFIX + "text/plain"]
    assert number == {book.GLUE_PREFIX + "text/plain": "1.5"}


def test_a_figure_made_in_a_fresh_process_imports_a_chapters_function():
    """figure_on_emulator on a GPU runs `make` in a process of its own: a chapter's figure by its
    module's import, a notebook's function by its source."""
    from convlab.chapters import ch12_tf32

    assert book.defining_source(ch12_tf32.error_sweep) == "from convlab.chapters.ch12_tf32 import error_sweep\n"

    def made_here():
        return 1
    assert book.defining_source(made_here).startswith("def made_here():")
