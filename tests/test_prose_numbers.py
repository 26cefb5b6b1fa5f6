"""Every measured number in the chapters' prose comes from the data: a time, a rate or a speedup in a
markdown cell is written as a {glue:text} role filled by a code cell from book/data, never typed in.
A typed-in time would go stale at the next GPU run (it did: chapter 7 once quoted a cuDNN time no
file held).

And the glued numbers are the data's: each page, run again on the emulator (which reads the committed
results in book/data and measures nothing), glues the very text the committed page shows, and draws
the same ladder. A page whose numbers were computed from another run's files (a ladder read before
the chapter saved its new results, a chapter re-measured after the page that quotes it) fails the
nbval stage of `make test` until it is executed again: that stage runs each page once, and
conftest.py compares what it glued with what the page shows (tests/page_data.py)."""
import copy
import json
import re
from pathlib import Path

import pytest

import page_data

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "book").glob("[0-9]*.ipynb"))
# a number followed by a unit of time or rate, or a speedup "2.5×" / "12x faster" (not a size: 8×8)
MEASURED = re.compile(r"(?<![\w.$^_{])(\d[\d,]*(?:\.\d+)?)\s*(ms\b|µs|us\b|s\b|TFLOP/s|GFLOP/s|TB/s|GB/s|"
                      r"×(?!\s*\d)|x faster|x slower)")
GLUE = re.compile(r"\{glue(?::\w+)?\}`[^`]+`")
MATH = re.compile(r"\$\$.*?\$\$|\$[^$\n]+\$", re.S)
CODE = re.compile(r"```.*?```|`[^`\n]+`", re.S)


def _prose(cell) -> str:
    text = "".join(cell["source"])
    for pattern in (GLUE, MATH, CODE):
        text = pattern.sub(" ", text)
    return text


def _glue_keys(nb) -> set:
    keys = set()
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            name = out.get("metadata", {}).get("scrapbook", {}).get("name")
            if name:
                keys.add(name)
    return keys


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_no_measured_number_is_typed_into_the_prose(path):
    nb = json.loads(path.read_text())
    found = []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        for m in MEASURED.finditer(_prose(cell)):
            found.append(f"cell {i}: '{m.group(0)}'")
    assert not found, (f"{path.name} types measured numbers into its prose; compute them in a cell and "
                       "write {glue:text}`name` instead:\n" + "\n".join(found))


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_every_glued_number_is_defined_in_its_notebook(path):
    """The site is built with warnings as errors, so a missing key fails there too; this names it."""
    nb = json.loads(path.read_text())
    used = {m.split("`")[1].split(":")[0] for cell in nb["cells"] if cell["cell_type"] == "markdown"
            for m in GLUE.findall("".join(cell["source"]))}
    sources = "".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    defined = _glue_keys(nb) | set(re.findall(r"glue\(\s*f?[\"']([^\"'{]+)[\"']", sources))
    # keys built with f-strings (glue(f"ch5_{wl}_ms", ...)) are matched by their prefix
    prefixes = [p.split("{")[0] for p in re.findall(r"glue\(\s*f[\"']([^\"']+)[\"']", sources)]
    missing = sorted(k for k in used if k not in defined and not any(k.startswith(p) for p in prefixes if p))
    assert not missing, f"{path.name} uses glue keys no cell defines: {missing}"


def test_a_page_run_again_must_glue_what_it_shows():
    """The check the nbval stage makes of each page (conftest.py, tests/page_data.py): the committed
    page against itself is clean; a glued value or a ladder table that a run no longer gives is named;
    a number measured on the machine that runs the page is left out."""
    page = page_data.ROOT / "book" / "05_fused.ipynb"
    cells = json.loads(page.read_text())["cells"]
    assert page_data.data_outputs(cells), "chapter 5 glues numbers from book/data"
    assert page_data.stale(page, cells, cells) == []
    ran = copy.deepcopy(cells)
    glued = next(o for c in ran if c["cell_type"] == "code" for o in c.get("outputs", [])
                 if o.get("metadata", {}).get("scrapbook"))
    key = glued["metadata"]["scrapbook"]["name"]
    glued["data"][page_data.GLUE_MIME + "text/plain"] = "9.99"
    lines = page_data.stale(page, cells, ran)
    assert len(lines) == 1 and key in lines[0] and "'9.99'" in lines[0]
    one = page_data.ROOT / "book" / "01_sequential.ipynb"
    first = json.loads(one.read_text())["cells"]
    moved = copy.deepcopy(first)
    for c in moved:
        for o in c.get("outputs", []):
            if o.get("metadata", {}).get("scrapbook", {}).get("name") == "ch1_loop_gflops":
                o["data"][page_data.GLUE_MIME + "text/plain"] = "0.001"
    assert page_data.stale(one, first, moved) == []


def test_the_nbval_stage_checks_every_page_and_only_the_pages():
    """conftest.py's hook checks the notebooks page_data.checks names: each chapter and page 0."""
    assert all(page_data.checks(p) for p in page_data.PAGES) and len(page_data.PAGES) >= 15
    assert not page_data.checks(page_data.ROOT / "solutions" / "02_timing.ipynb")
    assert not page_data.checks(page_data.ROOT / "book" / "appendix_profiling.ipynb")
