"""What a chapter page shows from book/data alone, and whether a run of the page on the emulator (which
reads the committed results and measures nothing) shows the same: each glue record's text and HTML,
and each ladder table. The nbval stage of `make test` runs every page once; the repository's
conftest.py hands each page's fresh outputs to stale() as its last cell ends, so the page is executed
once for both checks (tests/test_prose_numbers.py explains why the numbers must agree)."""
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted((ROOT / "book").glob("[0-9]*.ipynb")) + [ROOT / "book" / "gpu_numbers.ipynb"]
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


def checks(page: Path) -> bool:
    """Whether the nbval stage compares this notebook's glued values: the chapters and page 0."""
    return Path(page).resolve() in PAGES


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else value


def data_outputs(cells) -> dict:
    """What a page shows from book/data alone, from its code cells (dicts with "source" and
    "outputs", as stored or as just run): each glue record's text (and HTML), by key, and the HTML of
    each cell that draws the ladder table, by its cell's position among those cells."""
    out = {}
    ladders = 0
    for cell in cells:
        if cell.get("cell_type", "code") != "code":
            continue
        for o in cell.get("outputs") or []:
            name = (o.get("metadata") or {}).get("scrapbook", {}).get("name")
            if name:
                data = o.get("data", {})
                for mime in ("text/plain", "text/html"):
                    if GLUE_MIME + mime in data:
                        out[f"{name} ({mime})"] = _text(data[GLUE_MIME + mime])
        if "ladder.show(" in _text(cell["source"]):
            ladders += 1
            html = [_text(o["data"]["text/html"]) for o in cell.get("outputs") or []
                    if "text/html" in o.get("data", {})]
            out[f"ladder table #{ladders}"] = "\n".join(html)
    return out


def stale(page: Path, committed_cells, ran_cells) -> list:
    """Lines naming each value the committed page shows that a run on the emulator does not."""
    want, got = data_outputs(committed_cells), data_outputs(ran_cells)
    here = set(MEASURED_HERE.get(page.stem, set()))
    kept_by, keys = KEPT_BY_THE_NEXT_GPU_RUN.get(page.stem, (None, set()))
    if kept_by and not (ROOT / kept_by).exists():
        here |= keys
    return [f"  {k}: the page shows {want.get(k, '(nothing)')!r}, book/data gives {got.get(k, '(nothing)')!r}"
            for k in sorted(set(want) | set(got)) if k.split(" (")[0] not in here and want.get(k) != got.get(k)]


def message(page: Path, lines: list) -> str:
    return (f"{page.name} shows numbers that are not those of the committed data (execute it again on a "
            "GPU: scripts/execute_notebooks.py; or glue them from book/data):\n"
            + "\n".join(s if len(s) < 400 else s[:400] + " ..." for s in lines))
