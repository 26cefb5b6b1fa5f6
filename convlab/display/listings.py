"""What a listing names: a file, a function of it, or a region marked in it, and the lines to
emphasize in it, found by name or text, never by line number, so that editing a kernel cannot
shift a page. The line numbers a listing shows are computed from the file.

A marked region: its first line ends with `// listing: NAME` and its last with
`// end listing: NAME` (`#` instead of `//` in Python), comments after the code, so that marking
a region moves no line. The book shows every line without its markers.

    Source("kernels/05_fused/conv2d_implicit_gemm.cu")                  # the whole file
    Source("kernels/05_fused/conv2d_implicit_gemm.cu::tile_loop")       # a marked region
    Source("kernels/03_tiled/conv2d_tiled_cached_halo.cu::conv2d_tiled_cached_halo")  # a function
    Source("convlab/ops/fused.py::pick")                                # a Python def (Class.method)
"""
from __future__ import annotations

import ast
import os
import re
from pathlib import Path

from ..gpu._paths import path

_COMMENT = {".py": "#"}      # every other file (.cu, .cuh, .cpp, .h) comments with //


def _marks(file: str) -> re.Pattern:
    """The trailing markers of a line of `file`: group 1 "end " or None, group 2 the name."""
    lead = re.escape(_COMMENT.get(Path(file).suffix, "//"))
    return re.compile(rf"[ \t]*{lead} (end )?listing: ([\w-]+)")


def strip_marks(line: str, file: str) -> str:
    """`line` without the listing markers at its end."""
    return _trailing(line, _marks(file))[0]


def _trailing(line: str, marks: re.Pattern) -> tuple[str, list[tuple[bool, str]]]:
    """(the line without its trailing markers, [(is an end marker, name)] in the order written)."""
    found, rest = [], line.rstrip()
    while True:
        m = None
        for m in marks.finditer(rest):   # the last marker on the line
            pass
        if m is None or rest[m.end():].strip():
            break
        found.insert(0, (m.group(1) is not None, m.group(2)))
        rest = rest[:m.start()]
    return (rest if found else line), found


def regions(lines: list[str], file: str) -> dict[str, tuple[int, int]]:
    """{name: (first, last)} (1-based, inclusive) of the regions marked in `lines` of `file`.
    ValueError names the line of a marker without its pair, or a name marked twice."""
    marks, out, open_at = _marks(file), {}, {}
    for n, line in enumerate(lines, 1):
        for end, name in _trailing(line, marks)[1]:
            if not end:
                if name in open_at or name in out:
                    raise ValueError(f"{file}:{n}: region {name!r} is marked a second time")
                open_at[name] = n
            elif name not in open_at:
                raise ValueError(f"{file}:{n}: 'end listing: {name}' without a 'listing: {name}' above it")
            else:
                out[name] = (open_at.pop(name), n)
    if open_at:
        name, n = next(iter(open_at.items()))
        raise ValueError(f"{file}:{n}: region {name!r} is never closed (an 'end listing: {name}' "
                         "at the end of its last line)")
    return dict(sorted(out.items(), key=lambda kv: kv[1]))


# ---- functions -------------------------------------------------------------------------------

_C_FUNCTION = re.compile(r"(?:__global__|__device__)[^;{}]*?\b(?!__launch_bounds__\b)(\w+)\s*\(")


def _c_functions(text: str) -> list[str]:
    return list(dict.fromkeys(m.group(1) for m in _C_FUNCTION.finditer(text)))


def _c_function_lines(text: str, name: str) -> tuple[int, int] | None:
    """First and last line (1-based) of the __global__/__device__ function `name`, from its
    qualifier (and a `template <...>` line just above) to its matching closing brace."""
    head = re.search(r"(?:__global__|__device__)[^;{}]*?\b" + re.escape(name) + r"\s*\(", text)
    if head is None:
        return None
    line_start = text.rfind("\n", 0, head.start()) + 1
    before = text[:line_start].rstrip("\n").rsplit("\n", 1)[-1]
    if before.lstrip().startswith("template"):
        line_start = text.rfind("\n", 0, line_start - 1) + 1
    depth, i = 0, text.index("{", head.end())
    while i < len(text):
        if text.startswith("//", i):
            i = text.find("\n", i)
            i = len(text) if i < 0 else i
            continue
        if text.startswith("/*", i):
            i = text.find("*/", i) + 2
            continue
        c = text[i]
        if c in "\"'":   # a string or character literal: skip to its closing quote
            j = i + 1
            while text[j] != c:
                j += 2 if text[j] == "\\" else 1
            i = j
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                break
        i += 1
    return text.count("\n", 0, line_start) + 1, text.count("\n", 0, i) + 1


def _py_defs(text: str) -> dict[str, tuple[int, int]]:
    """{qualified name: (first, last)} of the functions and classes of a Python file (decorators
    included), methods as Class.method."""
    out = {}

    def walk(body, prefix):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                out[prefix + node.name] = (first, node.end_lineno)
                if isinstance(node, ast.ClassDef):
                    walk(node.body, prefix + node.name + ".")

    walk(ast.parse(text).body, "")
    return out


def functions(text: str, file: str) -> list[str]:
    """The names a `file::name` spec can give for a function of `file` (its text)."""
    return list(_py_defs(text)) if Path(file).suffix == ".py" else _c_functions(text)


def _function_lines(text: str, name: str, file: str) -> tuple[int, int] | None:
    if Path(file).suffix == ".py":
        return _py_defs(text).get(name)
    return _c_function_lines(text, name)


# ---- specs -----------------------------------------------------------------------------------


def parse_spec(spec) -> tuple[str, str | None]:
    """'file' or 'file::name' -> (file, name or None). A line range is refused: a listing names
    what it shows."""
    spec = Path(spec).as_posix() if isinstance(spec, os.PathLike) else str(spec)
    file, sep, name = spec.partition("::")
    if re.search(r":\d+-\d+$", file):
        raise ValueError(f"{spec}: a listing names what it shows, not line numbers: mark the lines in "
                         f"the file (`// listing: NAME` at the end of the first, `// end listing: NAME` "
                         f"at the end of the last) and show '{file.rsplit(':', 1)[0]}::NAME'")
    return file, (name if sep else None)


class Source:
    """Lines of a workbook file as the book shows them (markers stripped): `lines[i]` is line
    `first + i` of `file`; `all_lines` is the whole file."""

    def __init__(self, spec):
        file, name = parse_spec(spec)
        text = path(file).read_text()
        raw = text.splitlines()
        self.spec_file = file
        self.file = Path(file).name
        self.regions = regions(raw, file)
        self.all_lines = [strip_marks(ln, file) for ln in raw]
        self.whole = name is None
        self.first, self.last = (1, len(raw)) if name is None else self.span(name, text)
        self.lines = self.all_lines[self.first - 1:self.last]

    def span(self, name: str, text: str | None = None) -> tuple[int, int]:
        """(first, last) line of the marked region or function `name`; ValueError names the file's."""
        if name in self.regions:
            return self.regions[name]
        text = path(self.spec_file).read_text() if text is None else text
        found = _function_lines(text, name, self.spec_file)
        if found is None:
            raise ValueError(f"{self.spec_file} has no marked region or function named {name!r}; its "
                             f"regions: {', '.join(self.regions) or 'none'}; its functions: "
                             f"{', '.join(functions(text, self.spec_file)) or 'none'}")
        return found

    def emphasized(self, emphasize) -> list[int]:
        """The file line numbers that `emphasize` names in this listing: "::NAME" is every line of the
        marked region or function NAME, any other text every line shown that contains it. A name or
        text that names no line shown is a ValueError (a kernel edit made it stale)."""
        if isinstance(emphasize, str):
            emphasize = [emphasize]
        out = set()
        for item in emphasize:
            if not isinstance(item, str):
                raise TypeError(f"emphasize={item!r}: emphasis names lines, by '::REGION' or by a text "
                                "they contain, never by line number")
            if item.startswith("::"):
                a, b = self.span(item[2:])
                hit = [n for n in range(a, b + 1) if self.first <= n <= self.last]
            else:
                hit = [self.first + i for i, ln in enumerate(self.lines) if item in ln]
            if not hit:
                raise ValueError(f"{self.spec_file}, lines {self.first}-{self.last}: emphasize={item!r} "
                                 "names no line of the listing")
            out.update(hit)
        return sorted(out)

    def describe(self) -> str:
        return f"{self.file}, lines {self.first}–{self.last}"
