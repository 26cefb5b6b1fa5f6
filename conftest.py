"""pytest's settings for every test of the repository, the notebooks (nbval) included."""
import importlib.util
import json
import os
from pathlib import Path

import pytest

# No progress line from long emulator launches: it appears only on a slow machine, so an output
# that nbval compares would depend on the machine's speed (the notebooks' kernels inherit this).
os.environ["CONVLAB_PROGRESS"] = "0"
# One cache of compiled kernels for the suite and the notebooks (nbval), so a kernel the tests built
# is not built again for a page.
os.environ.setdefault("CONVLAB_CACHE", str(Path(__file__).resolve().parent / ".convlab-cache"))

_spec = importlib.util.spec_from_file_location("page_data", Path(__file__).parent / "tests" / "page_data.py")
page_data = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(page_data)

_last_cell = {}    # page -> the node id of its last cell nbval runs
_ran = {}          # page -> its cells as just run: source and fresh outputs


def pytest_collection_modifyitems(config, items):
    for item in items:
        if hasattr(item, "cell") and page_data.checks(Path(str(item.fspath))):
            _last_cell[Path(str(item.fspath)).resolve()] = item.nodeid


def _on_the_emulator() -> bool:
    from convlab.gpu import runtime
    return runtime.backend() == "emu"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """As nbval runs a page on the emulator, keep each cell's fresh outputs; after its last cell,
    compare what the page glues from book/data with what the committed page shows (page_data)."""
    outcome = yield
    if call.when != "call" or not hasattr(item, "test_outputs"):
        return
    page = Path(str(item.fspath)).resolve()
    if page not in _last_cell:
        return
    _ran.setdefault(page, []).append({"source": item.cell.source, "outputs": item.test_outputs or []})
    if item.nodeid != _last_cell[page] or not _on_the_emulator():
        return
    committed = json.loads(page.read_text())["cells"]
    lines = page_data.stale(page, committed, _ran.pop(page))
    report = outcome.get_result()
    if lines and report.passed:
        report.outcome = "failed"
        report.longrepr = page_data.message(page, lines)
