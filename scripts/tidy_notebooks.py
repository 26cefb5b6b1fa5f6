#!/usr/bin/env python3
"""Tidy the chapters and solutions for the website: run it after editing or executing them.

Idempotent; it changes only what the rules below name, and never what a cell computes:
  1. nbval markers: a "# NBVAL_CHECK_OUTPUT" line (or NBVAL_IGNORE_OUTPUT, NBVAL_SKIP,
     NBVAL_RAISES_EXCEPTION) becomes the cell tag nbval reads ("nbval-check-output", ...),
     so the page shows no test marker.
  2. Harness code folded: a code cell gets the tag "hide-input" (the page shows its output and a
     "show code" toggle) when it draws a figure or times something (matplotlib, seaborn, plots.*,
     cl.bench, baselines.time_torch, results.save, progress) and has more than
     HARNESS_MIN_LINES lines of code. %%cuda cells never fold. To keep such a cell open, tag it
     "show-input"; to fold any other cell, tag it "hide-input" by hand.
  3. Debris out of the outputs: tqdm progress bars, "saved N rows to ..." lines, and the stream
     outputs left empty by that.
  4. Lines past MAX_WIDTH columns in code (what scrolls sideways on the page): comment lines are
     re-wrapped, a trailing comment moves onto its own line above, and a long Python line is
     broken after the commas of a bracket it opens (aligned with the bracket, or indented under
     a break just after it). Each change is checked: the cell's syntax tree must stay the same.
     In %%cuda cells only comments move. What still does not fit is reported, to shorten by hand.
  5. A "hide-input" cell with nothing to show (no output, or only glue records, which the prose
     shows) becomes "remove-input": the page then shows nothing of it, not an empty "show code" bar.
BEGIN/END SOLUTION markers stay in solutions/ (scripts/make_exercises.py reads them); the website
hides them when it renders the page (_ext/convlab_site.py).

    python scripts/tidy_notebooks.py            # tidy book/ and solutions/, then regenerate exercises/
    python scripts/tidy_notebooks.py --check    # exit 1 and say what is untidy; change nothing
"""
from __future__ import annotations

import argparse
import ast
import io
import re
import subprocess
import sys
import textwrap
import tokenize
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("book", "solutions", "puzzles/solutions")
MAX_WIDTH = 88
HARNESS_MIN_LINES = 8

NBVAL_MARKER = re.compile(r"^[ \t]*#[ \t]*(NBVAL_CHECK_OUTPUT|NBVAL_IGNORE_OUTPUT|NBVAL_SKIP|NBVAL_RAISES_EXCEPTION)"
                          r"[ \t]*(?:\n|$)", re.MULTILINE)
SOLUTION_MARKER = re.compile(r"^[ \t]*(###|//)[ \t]*(BEGIN|END) SOLUTION")
DRAWS = re.compile(r"\b(?:plt|fig|ax|ax\d|axes|sns|plots)\.|\bRectangle\(")
TIMES = re.compile(r"\b(?:cl\.bench|time_torch|results\.save|progress)\(")
TQDM_LINE = re.compile(r"\d+%\|.*\|\s*\d+/\d+")
GLUE_MIME = "application/papermill.record/"   # a {glue} record: the page shows it in the prose, not here
SAVED_LINE = re.compile(r"^saved \d+ rows? to \S+\s*$")


def nbval_tag(marker: str) -> str:
    return marker.lower().replace("_", "-")


def add_tag(cell, tag: str) -> None:
    tags = cell.metadata.setdefault("tags", [])
    if tag not in tags:
        tags.append(tag)


def drop_tag(cell, tag: str) -> None:
    tags = cell.metadata.get("tags", [])
    if tag in tags:
        tags.remove(tag)
    if not tags:
        cell.metadata.pop("tags", None)


def is_cuda(source: str) -> bool:
    return source.lstrip().startswith("%%cuda")


def is_harness(source: str) -> bool:
    """Rule 2: draws a figure or times something, and is long."""
    if is_cuda(source):
        return False
    code = [ln for ln in source.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    return len(code) > HARNESS_MIN_LINES and any(DRAWS.search(ln) or TIMES.search(ln) for ln in code)


def shows_output(cell) -> bool:
    """Rule 5: whether the page shows any of the cell's outputs (glue records only feed the prose)."""
    for out in cell.get("outputs", []):
        if out.output_type in ("stream", "error"):
            return True
        if any(not mime.startswith(GLUE_MIME) for mime in out.get("data", {})):
            return True
    return False


def clean_stream(text: str) -> str:
    """Rule 3 on one stream output's text: what is left once bars and save notes are out."""
    kept = []
    for line in text.split("\n"):
        shown = line.split("\r")[-1]  # a terminal shows what follows the last carriage return
        if TQDM_LINE.search(line) or SAVED_LINE.match(shown):
            continue
        kept.append(shown)
    out = "\n".join(kept)
    return out if out.strip() else ""


# ---- rule 4: long lines ----------------------------------------------------------------------

def wrap_comment(line: str, marker: str) -> list[str]:
    """A comment-only line, re-wrapped at MAX_WIDTH with its indentation and marker ('#', '//')."""
    indent = line[: len(line) - len(line.lstrip())]
    body = line.strip()[len(marker):].strip()
    prefix = f"{indent}{marker} "
    return textwrap.wrap(body, width=MAX_WIDTH, initial_indent=prefix, subsequent_indent=prefix,
                         break_long_words=False, break_on_hyphens=False) or [line]


def python_comments(source: str) -> dict[int, int]:
    """Row (0-based) -> column of the comment that ends that line, from Python's tokenizer."""
    out = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            out[tok.start[0] - 1] = tok.start[1]
    return out


def as_python(source: str) -> str:
    """The cell as plain Python, line for line (IPython's magics become calls)."""
    from IPython.core.inputtransformer2 import TransformerManager
    return TransformerManager().transform_cell(source)


def same_tree(a: str, b: str) -> bool:
    try:
        return ast.dump(ast.parse(as_python(a))) == ast.dump(ast.parse(as_python(b)))
    except SyntaxError:
        return False


def move_python_comments(lines: list[str]) -> list[str]:
    """A run of comment lines holding a long one re-wrapped as one paragraph; a long line's
    trailing comment moved above it."""
    try:
        comments = python_comments(as_python("\n".join(lines)))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return lines

    def indent(line: str) -> str:
        return line[: len(line) - len(line.lstrip())]

    def comment_only(row: int) -> bool:
        line = lines[row]
        return comments.get(row) == len(indent(line)) and not SOLUTION_MARKER.match(line) \
            and line.strip() != "#"

    out, row = [], 0
    while row < len(lines):
        line = lines[row]
        if comment_only(row):
            end = row + 1
            while end < len(lines) and comment_only(end) and indent(lines[end]) == indent(line):
                end += 1
            run = lines[row:end]
            if any(len(ln) > MAX_WIDTH for ln in run):
                text = " ".join(ln.strip()[1:].strip() for ln in run)
                out += wrap_comment(f"{indent(line)}# {text}", "#")
            else:
                out += run
            row = end
            continue
        col = comments.get(row)
        if len(line) > MAX_WIDTH and col is not None and line[:col].strip() \
                and not line.lstrip().startswith(("%", "!")):
            code = line[:col].rstrip()
            out += wrap_comment(indent(code) + line[col:], "#") + [code]
        else:
            out.append(line)
        row += 1
    return out


FSTRING_START = getattr(tokenize, "FSTRING_START", -1)
FSTRING_END = getattr(tokenize, "FSTRING_END", -1)


def break_points(source: str, row: int) -> list[tuple[int, list[int], bool]]:
    """On line `row` (0-based): each bracket opened there that holds commas on that line, as
    (its column, the columns where a break may go: just after its top-level commas and just
    before a comprehension's `for`; whether it closes at the end of that line),
    outermost first. Commas of a bracket opened on an earlier line come first, as if that
    bracket stood just before the line's indentation (its continuation lines align there)."""
    line = source.split("\n")[row]
    outer = len(line) - len(line.lstrip()) - 1
    open_at, groups, closed, in_target = [], {}, {}, set()
    in_fstring = 0   # Python 3.12 tokenizes an f-string's fields; 3.11 gives one STRING: the same for both
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == FSTRING_START:
            in_fstring += 1
        elif tok.type == FSTRING_END:
            in_fstring -= 1
        if tok.start[0] - 1 != row or in_fstring or tok.type == FSTRING_END:
            continue
        bracket = open_at[-1] if open_at else outer
        if tok.type == tokenize.NAME and tok.string in ("for", "in"):
            # a comprehension: break before its `for`, never between the names it binds
            if tok.string == "for":
                groups.setdefault(bracket, []).append(tok.start[1])
                in_target.add(bracket)
            else:
                in_target.discard(bracket)
        elif tok.type != tokenize.OP:
            continue
        elif tok.string in "([{":
            open_at.append(tok.start[1])
        elif tok.string in ")]}":
            if open_at:
                closed[open_at.pop()] = tok.end[1]
        elif tok.string == "," and bracket not in in_target:
            groups.setdefault(bracket, []).append(tok.end[1])
    # a hanging break suits a bracket that ends the line (only closers or a colon after it)
    ends = {col for col, end in closed.items() if not line[end:].strip(" )]}:,")}
    return [(col, cuts, col in ends) for col, cuts in sorted(groups.items())]


def fill(line: str, bracket: int, breaks: list[int], hanging: bool) -> list[str]:
    """`line` broken at some of these columns, greedily, each piece as long as fits: the pieces
    continue aligned with the bracket, or (hanging) from a break just after the bracket."""
    indent = line[: len(line) - len(line.lstrip())]
    cuts = ([bracket + 1] if hanging else []) + breaks
    pieces = [line[a:b] for a, b in zip([0] + cuts, cuts + [len(line)])]
    pieces = pieces[:1] + [p for p in pieces[1:] if p.strip()]
    # a compound statement's header indents its continuation further than its body
    cont = indent + " " * (8 if line.rstrip().endswith(":") else 4) if hanging else " " * (bracket + 1)
    out, current = ([pieces[0].rstrip()], "") if hanging else ([], pieces[0])
    for piece in pieces[1:]:
        if current and len(current.rstrip() + piece.rstrip()) > MAX_WIDTH:
            out.append(current.rstrip())
            current = cont + piece.lstrip()
        else:
            current = current + piece if current else cont + piece.lstrip()
    return out + [current.rstrip()]


def overflow(lines: list[str]) -> int:
    return sum(max(0, len(ln) - MAX_WIDTH) for ln in lines)


def wrap_python_code(lines: list[str]) -> list[str]:
    """Each line past MAX_WIDTH broken after the commas of a bracket it opens, in the style of the
    hand-wrapped lines around it; a break is kept only if the cell still means the same."""
    row = 0
    while row < len(lines):
        line = lines[row]
        if len(line) <= MAX_WIDTH or line.lstrip().startswith(("%", "!", "#")):
            row += 1
            continue
        source = "\n".join(lines)
        try:
            groups = break_points(as_python(source), row)
        except (tokenize.TokenError, SyntaxError, IndentationError):
            return lines
        best = None
        for bracket, breaks, closes in groups:
            # a bracket left open continues on lines aligned with it: no hanging break
            # ... and a bracket far to the right leaves its aligned lines too little room
            styles = ((False,) if bracket < MAX_WIDTH * 0.6 else ()) + ((True,) if closes else ())
            for hanging in styles:
                new = fill(line, bracket, breaks, hanging)
                if overflow(new) < overflow(best or [line]) and \
                        same_tree(source, "\n".join(lines[:row] + new + lines[row + 1:])):
                    best = new
            if best is not None and overflow(best) == 0:
                break
        if best is None:
            row += 1
        else:  # look at the new lines again: each pass shrinks the overflow, so this ends
            lines = lines[:row] + best + lines[row + 1:]
    return lines


def wrap_python(source: str) -> str:
    if source.lstrip().startswith("%%") or not any(len(ln) > MAX_WIDTH for ln in source.splitlines()):
        return source  # another cell magic's body is not Python
    new = "\n".join(wrap_python_code(move_python_comments(source.split("\n"))))
    return new if same_tree(source, new) else source


def wrap_cuda(source: str) -> str:
    """%%cuda cells: comment lines re-wrapped, trailing // comments moved above their line. Lines
    with quotes, block comments or a line continuation are left alone."""
    out = []
    lines = source.split("\n")
    for i, line in enumerate(lines):
        after_continuation = i > 0 and lines[i - 1].rstrip().endswith("\\")
        plain = not any(s in line for s in ('"', "'", "/*", "*/")) and not line.rstrip().endswith("\\")
        if len(line) <= MAX_WIDTH or "//" not in line or SOLUTION_MARKER.match(line) \
                or not plain or after_continuation:
            out.append(line)
        elif line.lstrip().startswith("//"):
            out += wrap_comment(line, "//")
        else:
            code, comment = line.split("//", 1)
            code = code.rstrip()
            indent = code[: len(code) - len(code.lstrip())]
            out += wrap_comment(f"{indent}//{comment}", "//") + [code]
    return "\n".join(out)


# ---- the notebook --------------------------------------------------------------------------

def tidy(nb: nbformat.NotebookNode) -> list[str]:
    """Tidy nb in place; returns what remains too wide that the rules may not change."""
    left = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        for marker in NBVAL_MARKER.findall(cell.source):
            add_tag(cell, nbval_tag(marker))
        cell.source = NBVAL_MARKER.sub("", cell.source)
        cell.source = wrap_cuda(cell.source) if is_cuda(cell.source) else wrap_python(cell.source)
        tags = cell.metadata.get("tags", [])
        if "show-input" in tags:
            drop_tag(cell, "hide-input")
        elif is_harness(cell.source):
            add_tag(cell, "hide-input")
        outputs = []
        for out in cell.get("outputs", []):
            if out.output_type == "stream":
                out.text = clean_stream(out.text)
                if not out.text:
                    continue
            outputs.append(out)
        cell.outputs = outputs
        if "hide-input" in cell.metadata.get("tags", []) and not shows_output(cell):
            drop_tag(cell, "hide-input")      # rule 5: nothing to show, so no empty "show code" bar
            add_tag(cell, "remove-input")
        if not {"hide-input", "remove-input"} & set(cell.metadata.get("tags", [])):
            wide = [ln for ln in cell.source.splitlines()
                    if len(ln) > MAX_WIDTH and not SOLUTION_MARKER.match(ln)]
            left += [f"cell {i}: {len(ln)} columns: {ln.strip()[:60]}..." for ln in wide]
    return left


def notebooks() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).glob("*.ipynb"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only report; exit 1 if a notebook is untidy")
    parser.add_argument("paths", nargs="*", type=Path, help="notebooks (default: book/ and solutions/)")
    args = parser.parse_args()
    untidy, solutions_changed = [], False
    for path in [p.resolve() for p in args.paths] or notebooks():
        before = path.read_text()
        nb = nbformat.read(path, as_version=4)
        left = tidy(nb)
        after = nbformat.writes(nb) + "\n"
        name = path.relative_to(ROOT).as_posix()
        for line in left:
            print(f"{name}: still wider than {MAX_WIDTH} (shorten it by hand): {line}")
        if after == before:
            continue
        untidy.append(name)
        if not args.check:
            path.write_text(after)
            solutions_changed |= path.parent.name == "solutions"   # solutions/ and puzzles/solutions/
            print(f"tidied {name}")
    if args.check:
        for name in untidy:
            print(f"{name} is untidy: run `python scripts/tidy_notebooks.py` and commit the result")
        return 1 if untidy else 0
    if solutions_changed:
        return subprocess.call([sys.executable, str(ROOT / "scripts" / "make_exercises.py")])
    return 0


if __name__ == "__main__":
    sys.exit(main())
