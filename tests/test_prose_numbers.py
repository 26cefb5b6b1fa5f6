"""Every measured number in the chapters' prose comes from the data: a time, a rate or a speedup in a
markdown cell is written as a {glue:text} role filled by a code cell from book/data, never typed in.
A typed-in time would go stale at the next GPU run (it did: chapter 7 once quoted a cuDNN time no
file held).

And the glued numbers are the data's: each page, run again on the emulator (which reads the committed
results in book/data and measures nothing), glues the very text the committed page shows, and draws
the same ladder. A page whose numbers were computed from another run's files (a ladder read before
the chapter saved its new results, a chapter re-measured after the page that quotes it) fails here
until it is executed again."""
import json
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "book").glob("[0-9]*.ipynb"))
PAGES = CHAPTERS + [ROOT / "book" / "gpu_numbers.ipynb"]
GLUE_MIME = "application/papermill.record/"

# Glued numbers measured on the machine that runs the page, by design, with no GPU involved: chapter
# 1 times its loop nest, numpy and torch on this machine's CPU ("on the CPU that ran it"). A GPU run
# saves them to book/data/01_sequential.csv; any other machine shows its own.
MEASURED_HERE = {"01_sequential": {"ch1_loop_gflops", "ch1_loop_full_s", "ch1_loop_gflops_min",
                                   "ch1_loop_gflops_max", "ch1_torch_over_loop_min",
                                   "ch1_torch_over_loop_max", "ch1_numpy_over_loop_resnet",
                                   "ch1_numpy_over_loop_c1", "ch1_floor_below_loops"}}

# Glued numbers a GPU run keeps in book/data from the next GPU execution of the page on, and until then
# only in the page as that run left it: chapter 8 trains LeNet on the GPU that runs it (elsewhere a short
# run) and now saves the run it shows. While the file is missing, the page's numbers are its last GPU
# run's; once the file is there they must be the file's.
KEPT_BY_THE_NEXT_GPU_RUN = {"08_backprop": ("book/data/details/08_backprop_lenet.csv", {
    "ch8_lenet_acc_ours", "ch8_lenet_acc_torch", "ch8_lenet_epoch_ours_ms", "ch8_lenet_epoch_torch_ms",
    "ch8_lenet_loss_last", "ch8_lenet_steps", "ch8_lenet_where"})}

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


def _data_outputs(nb) -> dict:
    """What a page shows from book/data alone: each glue record's text (and HTML), by key, and the
    HTML of each cell that draws the ladder table, by its cell's position among those cells."""
    out = {}
    ladders = 0
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        for o in cell.get("outputs", []):
            name = o.get("metadata", {}).get("scrapbook", {}).get("name")
            if name:
                data = o.get("data", {})
                for mime in ("text/plain", "text/html"):
                    if GLUE_MIME + mime in data:
                        out[f"{name} ({mime})"] = "".join(data[GLUE_MIME + mime])
        if "ladder.show(" in source:
            ladders += 1
            html = ["".join(o["data"]["text/html"]) for o in cell.get("outputs", []) if "text/html" in o.get("data", {})]
            out[f"ladder table #{ladders}"] = "\n".join(html)
    return out


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.stem)
def test_the_page_glues_what_book_data_holds(path, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    committed = nbformat.read(path, as_version=4)
    ran = nbformat.read(path, as_version=4)
    # the emulator: it reads the committed results and saves nothing (results.save refuses there)
    monkeypatch.setenv("CONVLAB_BACKEND", "emu")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    NotebookClient(ran, timeout=3600, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    want, got = _data_outputs(committed), _data_outputs(ran)
    here = set(MEASURED_HERE.get(path.stem, set()))
    kept_by, keys = KEPT_BY_THE_NEXT_GPU_RUN.get(path.stem, (None, set()))
    if kept_by and not (ROOT / kept_by).exists():
        here |= keys
    stale = [f"  {k}: the page shows {want.get(k, '(nothing)')!r}, book/data gives {got.get(k, '(nothing)')!r}"
             for k in sorted(set(want) | set(got)) if k.split(" (")[0] not in here and want.get(k) != got.get(k)]
    assert not stale, (f"{path.name} shows numbers that are not those of the committed data (execute it again "
                       "on a GPU: scripts/execute_notebooks.py; or glue them from book/data):\n"
                       + "\n".join(s if len(s) < 400 else s[:400] + " ..." for s in stale))
