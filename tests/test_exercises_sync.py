"""exercises/ is generated from solutions/ by scripts/make_exercises.py and must not drift."""
import importlib.util
import json
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("make_exercises", ROOT / "scripts" / "make_exercises.py")
make_exercises = importlib.util.module_from_spec(spec)
spec.loader.exec_module(make_exercises)


def test_exercises_are_in_sync_with_solutions():
    problems = make_exercises.drift()
    assert not problems, "\n".join(problems) + "\nrun `make exercises`"


def test_every_solution_has_an_exercise_in_the_toc():
    toc = (ROOT / "_toc.yml").read_text()
    for path in sorted((ROOT / "solutions").glob("*.ipynb")):
        assert f"solutions/{path.stem}" in toc and f"exercises/{path.stem}" in toc, path.name


@pytest.mark.parametrize("path", sorted((ROOT / "exercises").glob("*.ipynb")), ids=lambda p: p.name)
def test_exercises_hold_no_solution_and_no_output(path):
    nb = nbformat.read(path, as_version=4)
    text = json.dumps(nb)
    assert "BEGIN SOLUTION" not in text and "END SOLUTION" not in text
    assert "NBVAL_CHECK_OUTPUT" not in text and "nbval-check-output" not in text
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None
    assert nb.cells[0].source.startswith("# Exercise")


def _solution(*cells):
    nb = nbformat.v4.new_notebook()
    nb.cells = list(cells)
    for i, c in enumerate(nb.cells):
        c.id = f"c{i}"
    return nb


def test_python_regions_become_a_todo_that_still_runs():
    cell = nbformat.v4.new_code_cell(
        "def f(x):\n    y = None\n    ### BEGIN SOLUTION square it\n"
        "    y = x * x\n    y += 0\n    ### END SOLUTION\n    return y\nprint(f(3))")
    cell.metadata["tags"] = ["nbval-check-output", "hide-input"]  # no output to check in an exercise
    cell.outputs = [nbformat.v4.new_output("stream", text="9\n")]
    cell.execution_count = 4
    ex = make_exercises.make_exercise(_solution(nbformat.v4.new_markdown_cell("# Solution 3: x"), cell), "x.ipynb")
    title, code = ex.cells
    assert title.source == "# Exercise 3: x"
    assert code.source == ("def f(x):\n    y = None\n    # TODO: square it (about 2 lines)\n    y = None\n"
                           "    return y\nprint(f(3))")
    assert code.outputs == [] and code.execution_count is None and code.id == "c1"
    assert code.metadata["tags"] == ["hide-input"]
    namespace = {}
    exec(code.source.replace("print", "result = "), namespace)  # the unfinished cell runs
    assert namespace["result"] is None


def test_cuda_and_markdown_regions():
    cuda = nbformat.v4.new_code_cell("%%cuda m\n__global__ void k(float* y) {\n    // BEGIN SOLUTION\n"
                                     "    y[0] = 1;\n    // END SOLUTION\n}")
    answer = nbformat.v4.new_markdown_cell("Why?\n\n<!-- BEGIN SOLUTION -->\nBecause.\n<!-- END SOLUTION -->")
    ex = make_exercises.make_exercise(_solution(cuda, answer), "x.ipynb")
    assert ex.cells[0].source == "%%cuda m\n__global__ void k(float* y) {\n    // TODO: your code here (about 1 line)\n}"
    assert ex.cells[1].source == "Why?\n\n*Your answer here.*"


def test_the_exercise_gets_the_stub_the_solution_needs_none():
    cell = nbformat.v4.new_code_cell("def launch(x):\n    ### BEGIN SOLUTION one block\n    grid = 1\n"
                                     "    ### END SOLUTION\n    run(grid)\n### BEGIN SOLUTION\nprint(1)\n"
                                     "### END SOLUTION\n### BEGIN SOLUTION\nn = 2\nflops, nbytes = (n,\n"
                                     "                 4 * n)\n### END SOLUTION\n")
    code = make_exercises.make_exercise(_solution(cell), "x.ipynb").cells[0].source
    assert code == ("def launch(x):\n    # TODO: one block (about 1 line)\n    grid = None\n    run(grid)\n"
                    "# TODO: your code here (about 1 line)\npass\n"
                    "# TODO: your code here (about 3 lines)\nflops, nbytes = None, None\n")


def test_long_hints_continue_on_marker_lines_and_wrap_to_the_code_box():
    hint = "load the tile, halo included, in passes of TILE*TILE threads; zeros outside the image"
    cell = nbformat.v4.new_code_cell(f"%%cuda m\n    // BEGIN SOLUTION {hint}\n    //+ then wait for the "
                                     f"whole block\n    y[0] = 1;\n    // END SOLUTION\n")
    code = make_exercises.make_exercise(_solution(cell), "x.ipynb").cells[0].source
    todo = code.splitlines()[1:]
    assert all(len(line) <= make_exercises.WIDTH for line in todo) and len(todo) == 2
    assert todo[1].startswith("    //       ") and code.rstrip().endswith("wait for the whole block (about 1 line)")


def test_an_unpaired_marker_is_an_error():
    cell = nbformat.v4.new_code_cell("### BEGIN SOLUTION\nx = 1\n")
    with pytest.raises(make_exercises.SolutionMarkerError):
        make_exercises.make_exercise(_solution(cell), "x.ipynb")


@pytest.mark.parametrize("path", sorted((ROOT / "exercises").glob("*.ipynb")), ids=lambda p: p.name)
def test_exercise_comments_fit_the_code_box(path):
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type == "code":
            for line in cell.source.splitlines():
                assert len(line) <= make_exercises.WIDTH or not ("//" in line or "#" in line), line


def test_exercise_pages_show_no_answer():
    import importlib
    import pkgutil

    import convlab.chapters

    modules = [importlib.import_module(f"convlab.chapters.{m.name}") for m in pkgutil.iter_modules(convlab.chapters.__path__)]
    answers = {key: answer for m in modules for key, answer in getattr(m, "ANSWERS", {}).items()}
    assert len(answers) == 17
    code = "\n".join(c.source for path in sorted((ROOT / "exercises").glob("*.ipynb"))
                     for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")
    for key, (_, answer) in answers.items():
        if answer.__code__.co_argcount:
            continue                        # a workload's own numbers (wl.flops): nothing to hide
        value = answer()
        shown = [repr(v) for v in value] if isinstance(value, list) else [f"{value:_}", f"{value}", f"{value:,}"]
        assert not any(s in code for s in shown), (key, shown)
    assert "check_value(" not in code.replace('check_value("largest error', "")
