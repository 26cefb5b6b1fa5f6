#!/usr/bin/env python3
"""Generate exercises/ from solutions/, the single source of the exercises (and likewise the
warm-up puzzles: puzzles/ from puzzles/solutions/).

In code cells, a solution region is replaced by a TODO that says how long the answer is:
    ### BEGIN SOLUTION [hint]          (Python)       ->  # TODO: hint (about N lines)  + a stub
    ###+ [more of the hint]                               (the stub: `name = None` when the answer
    ### END SOLUTION                                       ends by assigning `name`, else `pass`)
    // BEGIN SOLUTION [hint]           (CUDA, in a %%cuda cell)  ->  // TODO: hint (about N lines)
    //+ [more of the hint]
    // END SOLUTION
The TODO is wrapped to 88 columns (the site's code box). The solution shows only its answer: the
exercise's stub (`grid = None`) comes from the answer, so the solution needs none.
In markdown cells, <!-- BEGIN SOLUTION --> … <!-- END SOLUTION --> becomes "*Your answer here.*"
(for written answers). A leading "# Solution N" heading becomes "# Exercise N" ("# Solutions to
puzzles" becomes "# Puzzles"). Outputs and
execution counts are cleared, and the "nbval-check-output" cell tag dropped (there is no output
to compare with). Cell ids are kept, so the output is the same every time.

    python scripts/make_exercises.py          # write exercises/
    python scripts/make_exercises.py --check  # exit 1 when exercises/ differs from what it would write
"""
from __future__ import annotations

import argparse
import re
import sys
import textwrap
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = ROOT / "solutions"
EXERCISES = ROOT / "exercises"
#: (source folder, generated folder): each notebook of the first gives the one of the same name in the second
PAIRS = [(SOLUTIONS, EXERCISES), (ROOT / "puzzles" / "solutions", ROOT / "puzzles")]

CODE_REGION = re.compile(
    r"^(?P<indent>[ \t]*)(?P<marker>###|//)[ \t]*BEGIN SOLUTION[ \t]*(?P<hint>[^\n]*)\n"
    r"(?P<more>(?:[ \t]*(?P=marker)\+[^\n]*\n)*)"
    r"(?P<body>.*?)"
    r"^[ \t]*(?P=marker)[ \t]*END SOLUTION[ \t]*(?:\n|$)",
    re.MULTILINE | re.DOTALL,
)
MARKDOWN_REGION = re.compile(r"<!--\s*BEGIN SOLUTION\s*-->.*?<!--\s*END SOLUTION\s*-->", re.DOTALL)
TITLE = re.compile(r"\A(#\s+)Solution(\s+\d+)")
PUZZLE_TITLE = re.compile(r"\A(#\s+)Solutions to p(uzzles)")


class SolutionMarkerError(ValueError):
    pass


#: The width of the site's code box: a TODO longer than this is cut off there.
WIDTH = 88
NBSP = "\u00a0"


def _stub(body: str, indent: str) -> str:
    """What the exercise gets in place of a Python answer: `name = None` (`a, b = None, None`) when
    the answer ends by assigning `name` at its own indent (the check then finds the name unset), else `pass` (which
    keeps a block that held only the answer valid, so the cell still runs)."""
    targets = re.findall(rf"^{re.escape(indent)}([A-Za-z_]\w*(?:[ \t]*,[ \t]*[A-Za-z_]\w*)*)[ \t]*=[^=]", body,
                         re.MULTILINE)
    if not targets:
        return f"{indent}pass\n"
    names = [n.strip() for n in targets[-1].split(",")]
    return f"{indent}{', '.join(names)} = {', '.join(['None'] * len(names))}\n"


def _todo(match: re.Match) -> str:
    indent, marker = match["indent"], match["marker"]
    more = [ln.strip()[len(marker) + 1:].strip() for ln in match["more"].splitlines()]
    hint = " ".join([match["hint"].strip(), *more]).strip() or "your code here"
    lines = [ln for ln in match["body"].splitlines() if ln.strip()]
    size = f"about {len(lines)} line{'s' if len(lines) != 1 else ''}"
    comment = "//" if marker == "//" else "#"
    first, rest = f"{indent}{comment} TODO: ", f"{indent}{comment}       "
    # "(about N lines)" stays on one line: the checks find the stub by it
    text = textwrap.fill(f"{hint} ({size.replace(' ', NBSP)})", width=WIDTH, initial_indent=first,
                         subsequent_indent=rest, break_on_hyphens=False).replace(NBSP, " ") + "\n"
    return text if marker == "//" else text + _stub(match["body"], indent)


def strip_code(source: str, where: str) -> str:
    out = CODE_REGION.sub(_todo, source)
    if not source.endswith("\n"):
        out = out.rstrip("\n")          # a region that ended the cell leaves no empty last line
    if re.search(r"(###|//)[ \t]*(BEGIN|END) SOLUTION|^[ \t]*(###|//)\+", out, re.MULTILINE):
        raise SolutionMarkerError(f"{where}: a BEGIN/END SOLUTION marker without its partner")
    return out


def strip_markdown(source: str, where: str) -> str:
    out = MARKDOWN_REGION.sub("*Your answer here.*", source)
    if re.search(r"<!--\s*(BEGIN|END) SOLUTION", out):
        raise SolutionMarkerError(f"{where}: a BEGIN/END SOLUTION comment without its partner")
    return PUZZLE_TITLE.sub(r"\1P\2", TITLE.sub(r"\1Exercise\2", out))


def make_exercise(solution: nbformat.NotebookNode, name: str) -> nbformat.NotebookNode:
    """name: the solution's path under the root's solutions/ (or relative to the root)."""
    nb = nbformat.v4.new_notebook()
    # Fixed metadata: the solution's language_info records the Python that last executed it,
    # which would make the exercises drift after every GPU run.
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
        "language_info": {"name": "python", "pygments_lexer": "ipython3"},
    }
    source = name if "/" in name else f"solutions/{name}"
    nb.metadata["convlab"] = {"generated_from": source, "by": "scripts/make_exercises.py"}
    for i, cell in enumerate(solution.cells):
        where = f"{source}, cell {i}"
        if cell.cell_type == "code":
            new = nbformat.v4.new_code_cell(strip_code(cell.source, where))
        elif cell.cell_type == "markdown":
            new = nbformat.v4.new_markdown_cell(strip_markdown(cell.source, where))
        else:
            new = nbformat.v4.new_raw_cell(cell.source)
        if "id" in cell:
            new.id = cell.id
        tags = [t for t in cell.get("metadata", {}).get("tags", []) if t != "nbval-check-output"]
        if tags:
            new.metadata["tags"] = list(tags)
        nb.cells.append(new)
    return nb


def render(nb: nbformat.NotebookNode) -> str:
    nbformat.validate(nb)
    return nbformat.writes(nb) + "\n"


def _name(path: Path) -> str:
    """How make_exercise names a solution: solutions/'s by file name, others by path from the root."""
    return path.name if path.parent == SOLUTIONS else path.relative_to(ROOT).as_posix()


def expected_exercises(source: Path = SOLUTIONS) -> dict[str, str]:
    """<name> -> the text the generated notebook of that name should have."""
    out = {}
    for path in sorted(source.glob("*.ipynb")):
        solution = nbformat.read(path, as_version=4)
        out[path.name] = render(make_exercise(solution, _name(path)))
    return out


def drift() -> list[str]:
    """What differs between each generated folder and its source (empty when in sync)."""
    problems = []
    for source, target_dir in PAIRS:
        src, dst = source.relative_to(ROOT).as_posix(), target_dir.relative_to(ROOT).as_posix()
        expected = expected_exercises(source)
        for name, text in expected.items():
            target = target_dir / name
            if not target.is_file():
                problems.append(f"{dst}/{name} is missing")
            elif target.read_text() != text:
                problems.append(f"{dst}/{name} differs from what {src}/{name} generates")
        for target in sorted(target_dir.glob("*.ipynb")):
            if target.name not in expected:
                problems.append(f"{dst}/{target.name} has no {src}/{target.name}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only report drift; exit 1 if any")
    args = parser.parse_args()
    if args.check:
        problems = drift()
        for p in problems:
            print(p)
        if problems:
            print("run `make exercises` to regenerate exercises/ from solutions/")
            return 1
        print(f"{', '.join(d.relative_to(ROOT).as_posix() + '/' for _, d in PAIRS)} in sync with their solutions")
        return 0
    for source, target_dir in PAIRS:
        dst = target_dir.relative_to(ROOT).as_posix()
        target_dir.mkdir(exist_ok=True)
        expected = expected_exercises(source)
        for name, text in expected.items():
            (target_dir / name).write_text(text)
            print(f"wrote {dst}/{name}")
        for stale in sorted(target_dir.glob("*.ipynb")):
            if stale.name not in expected:
                stale.unlink()
                print(f"removed {dst}/{stale.name} (no solution)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
