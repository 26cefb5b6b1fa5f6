"""Reading a .cu file: its kernels' signatures, its __constant__ arrays, and the rewrites each
backend needs. Both backends parse the same way, so argument checks agree on CPU and GPU."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ._errors import CompileError
from ._paths import repo_root


@dataclass(frozen=True)
class Param:
    ctype: str        # as written, e.g. "const float* __restrict__"
    name: str
    base: str         # the element or scalar type, e.g. "float", "unsigned int", "half2"
    pointer: bool
    const: bool       # pointee is const

    def __str__(self):
        return f"{self.ctype} {self.name}".replace(" *", "*")


@dataclass
class KernelDecl:
    name: str
    params: list[Param]
    line: int                       # 1-based line of the name in the file
    param_spans: list[tuple[int, int]] = field(default_factory=list)  # char spans in the source


@dataclass
class Source:
    path: Path                      # the file name reported in messages
    text: str                       # original text
    kernels: dict[str, KernelDecl]
    constants: dict[str, str]       # name -> type
    includes: list[Path]            # resolved quoted includes, recursively

    def all_text(self) -> str:
        return self.text + "".join(p.read_text(errors="replace") for p in self.includes)


def strip_comments(text: str) -> str:
    """Blank out comments and string literals, keeping every offset and newline in place."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"' and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append('"' + " " * (j - i - 2) + '"' if j - i >= 2 else text[i:j])
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


TYPE_ALIASES = {
    "unsigned": "unsigned int", "signed": "int", "signed int": "int", "uint": "unsigned int",
    "__half": "half", "__half2": "half2", "long int": "long", "long long int": "long long",
    "unsigned long int": "unsigned long", "unsigned long long int": "unsigned long long",
    "short int": "short", "unsigned short int": "unsigned short",
}


def _parse_param(text: str, typedefs: dict[str, str]) -> Param:
    t = " ".join(text.replace("*", " * ").replace("&", " & ").split())
    m = re.match(r"^(.*?)([A-Za-z_]\w*)\s*(\[\s*\])?$", t)
    if not m or not m.group(1).strip():
        raise ValueError(f"cannot read the parameter `{text.strip()}`")
    type_part, name, array = m.group(1).strip(), m.group(2), m.group(3)
    pointer = "*" in type_part or bool(array)
    if type_part.count("*") > 1:
        base = "pointer"
    words = type_part.replace("*", " ").split()
    const = pointer and "const" in type_part.split("*")[0].split()
    core = [w for w in words if w not in ("const", "volatile", "__restrict__", "__restrict", "restrict", "struct",
                                         "__grid_constant__")]
    base = " ".join(core)
    base = typedefs.get(base, base)
    base = TYPE_ALIASES.get(base, base)
    if type_part.count("*") > 1:
        base = "pointer"
    return Param(type_part, name, base, pointer, const)


def _matching_paren(text: str, open_idx: int) -> int:
    depth = 0
    for i in range(open_idx, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return i
    return -1


def _split_top(text: str, start: int, end: int) -> list[tuple[int, int]]:
    spans, depth, s = [], 0, start
    for i in range(start, end):
        ch = text[i]
        if ch in "(<[":
            depth += 1
        elif ch in ")>]":
            depth -= 1
        elif ch == "," and depth == 0:
            spans.append((s, i))
            s = i + 1
    if text[s:end].strip():
        spans.append((s, end))
    return spans


_GLOBAL_RE = re.compile(r"__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(?:static\s+)?void\s+"
                        r"(?:__launch_bounds__\s*\([^)]*\)\s*)?([A-Za-z_]\w*)\s*\(")
_CONST_RE = re.compile(r"__constant__\s+([^;=]*?)\b([A-Za-z_]\w*)\s*((?:\[[^\]]*\]\s*)*)(?:=|;)")
# the element types of the __constant__ arrays the emulator's profiler counts (a view, cuda_emu.h)
_CONST_ELEM_RE = re.compile(r"(?:unsigned\s+)?(?:float|double|int|unsigned)")


def parse(text: str, path: Path | str, include_dirs: list[Path]) -> Source:
    path = Path(path)
    clean = strip_comments(text)
    includes = _resolve_includes(text, path, include_dirs, set())
    # the types a kernel's parameters may be spelled in: the file's typedefs and its course headers'
    declared = clean + "".join(strip_comments(p.read_text()) for p in includes)
    found: dict[str, list[str]] = {}
    for m in re.finditer(r"typedef\s+([\w\s]+?)\s+(\w+)\s*;", declared):
        found.setdefault(m.group(2), []).append(" ".join(m.group(1).split()))
    for m in re.finditer(r"using\s+(\w+)\s*=\s*([\w\s]+?)\s*;", declared):
        found.setdefault(m.group(1), []).append(" ".join(m.group(2).split()))
    for m in re.finditer(r"^\s*#\s*define\s+(\w+)\s+(float|double|half|__half|int|unsigned int)\s*$", declared,
                         re.M):
        found.setdefault(m.group(1), []).append(m.group(2))
    # a name given a type in each branch of an #if (a kernel built for fp16 or bf16 by a define): the
    # alternatives, "half | __nv_bfloat16" (_args.ctype_of takes a tensor of any of them)
    typedefs = {name: " | ".join(dict.fromkeys(TYPE_ALIASES.get(t, t) for t in ts)) for name, ts in found.items()}
    kernels = {}
    for m in _GLOBAL_RE.finditer(clean):
        name = m.group(1)
        open_idx = m.end() - 1
        close = _matching_paren(clean, open_idx)
        if close < 0:
            continue
        line = clean.count("\n", 0, m.start(1)) + 1
        spans = _split_top(clean, open_idx + 1, close)
        params = []
        for s, e in spans:
            ptxt = clean[s:e]
            if ptxt.strip() in ("", "void"):
                continue
            try:
                params.append(_parse_param(ptxt, typedefs))
            except ValueError as exc:
                raise CompileError(f"{path}:{clean.count(chr(10), 0, s) + 1}: {exc}") from None
        spans = [sp for sp in spans if clean[sp[0]:sp[1]].strip() not in ("", "void")]
        kernels[name] = KernelDecl(name, params, line, spans)
    constants = {}
    for m in _CONST_RE.finditer(clean):
        constants[m.group(2)] = " ".join(m.group(1).split())
    return Source(path, text, kernels, constants, includes)


def _resolve_includes(text: str, path: Path, include_dirs: list[Path], seen: set) -> list[Path]:
    """The course headers that text (path's source) includes with `#include "..."`, found beside
    path or in include_dirs, and theirs (an #include inside a comment does not count)."""
    found = []
    clean = strip_comments(text)             # blanks the names too: only says where the comments are
    for m in re.finditer(r'^\s*#\s*include\s*"([^"]+)"', text, re.M):
        if clean[m.start():m.start(1) - 1] != text[m.start():m.start(1) - 1]:
            continue
        for d in [path.parent, *include_dirs]:
            p = (d / m.group(1)).resolve()
            if p.is_file():
                if p not in seen:
                    seen.add(p)
                    found.append(p)
                    found += _resolve_includes(p.read_text(errors="replace"), p, include_dirs, seen)
                break
    return found


# ---------------------------------------------------------------------------------------------
# Rewrites. Each keeps every line where it was, so compiler messages point at the .cu line.

_EXTERN_SHARED_RE = re.compile(
    r"extern\s+__shared__\s+((?:__align__\s*\(\s*\d+\s*\)\s*)?)([^;\[]*?)\s*([A-Za-z_]\w*)\s*\[\s*\]\s*;")


_STATIC_SHARED_RE = re.compile(
    r"\b__shared__\s+((?:[^;{}=\[\],]|\([^;{}]*?\))*?)\s*\b([A-Za-z_]\w*)\s*((?:\[[^\[\];]+\]\s*)+);")
_ALIGN_RE = re.compile(r"__align__\s*\(\s*\d+\s*\)")
# `__shared__ uint64_t full[S], empty[S];`: several arrays of one type in one declaration
_DECLARATOR = r"[A-Za-z_]\w*\s*(?:\[[^\[\];]+\]\s*)+"
_STATIC_SHARED_LIST_RE = re.compile(
    rf"\b__shared__\s+((?:[^;{{}}=\[\],]|\([^;{{}}]*?\))*?)\s*\b({_DECLARATOR}(?:,\s*{_DECLARATOR})+);")


# Pointer types the emulator's hooked build turns into clemu::lptr<T> (cuda_emu.h): C's and CUDA's
# element types, and the names a file declares as types (typedef, using, struct, template parameters).
_BUILTIN_TYPES = (r"(?:unsigned\s+|signed\s+)?(?:long\s+long|long|short|int|char)(?:\s+int)?|unsigned|signed|float|double|"
                  r"bool|size_t|u?int(?:8|16|32|64)_t|(?:u?char|u?short|u?int|u?long|u?longlong|float|double)[1-4]|"
                  r"__half2?|half2?|__nv_bfloat162?|nv_bfloat162?")
_KEYWORDS_BEFORE_CAST = {"return", "case", "else", "do", "throw"}


def _declared_types(clean: str) -> list[str]:
    names = set(re.findall(r"\btypedef\b[^;{}]*?\b([A-Za-z_]\w*)\s*;", clean))
    names |= set(re.findall(r"\busing\s+([A-Za-z_]\w*)\s*=", clean))
    names |= set(re.findall(r"\b(?:struct|class|union)\s+([A-Za-z_]\w*)\s*[{:]", clean))
    for m in re.finditer(r"\btemplate\s*<([^<>]*(?:<[^<>]*>[^<>]*)*)>", clean):
        names |= set(re.findall(r"\b(?:class|typename)\s+([A-Za-z_]\w*)", m.group(1)))
    return sorted(names, key=len, reverse=True)


def _local_pointer_edits(clean: str, headers: str = "") -> list[tuple[int, int, str]]:
    """Local pointer variables (`const float* p = ...;`, inside a function), C-style pointer casts
    and reinterpret_/static_casts to a pointer, spelled with cuda_emu.h's CLEMU_P macros: the same
    pointer in the plain build, a clemu::lptr<T> whose elements the profiler counts in the hooked one.
    headers: the course headers' text (comments blanked), whose typedefs name types too."""
    types = "|".join([_BUILTIN_TYPES] + [re.escape(n) for n in _declared_types(clean + headers)])
    elem = rf"(?P<cv>(?:(?:const|volatile)\s+)*)(?P<t>(?:{types}))\b(?P<cv2>(?:\s+(?:const|volatile))*)"
    edits = []
    depth = [0] * (len(clean) + 1)
    for i, ch in enumerate(clean):
        depth[i + 1] = depth[i] + (ch == "{") - (ch == "}")

    def spelled(m):
        return " ".join((m.group("cv") + m.group("t") + m.group("cv2")).split())

    decl = re.compile(rf"(?P<b>^|[;{{}}(])[ \t]*{elem}\s*\*\s*(?P<q>(?:(?:const|__restrict__|__restrict|restrict)\s+)*)"
                      rf"(?P<n>[A-Za-z_]\w*)\s*=(?!=)", re.M)
    for m in decl.finditer(clean):
        start = m.start("cv")
        if depth[start] <= 0:
            continue   # file scope: a global or a parameter list
        # one declarator only (`float *a = x, *b = y;` keeps its plain pointers)
        d, i = 0, m.end()
        while i < len(clean) and not (d == 0 and clean[i] in ";)"):
            d += clean[i] in "([{"
            d -= clean[i] in ")]}"
            if d == 0 and clean[i] == ",":
                break
            i += 1
        if i < len(clean) and clean[i] == ",":
            continue
        q = m.group("q").split()
        after = (" const" if "const" in q else "") + (" CLEMU_RESTRICT" if set(q) - {"const"} else "")
        edits.append((start, m.start("n"), f"CLEMU_P({spelled(m)}){after} "))
    cast = re.compile(rf"\(\s*{elem}\s*\*\s*\)")
    for m in cast.finditer(clean):
        before = clean[:m.start()].rstrip()
        word = re.search(r"[A-Za-z_]\w*$", before)
        if (word and word.group(0) not in _KEYWORDS_BEFORE_CAST) or before.endswith((")", "]")):
            continue   # a call or a declarator: f(float*), sizeof(float*)
        if clean[m.end():].lstrip()[:1] in ("", ")", ",", ";", "{", "="):
            continue
        edits.append((m.start(), m.end(), f"(CLEMU_P({spelled(m)}))"))
    for m in re.finditer(r"\b(reinterpret_cast|static_cast)\s*<\s*([^<>;]*?(?:<[^<>;]*>[^<>;]*?)?)\s*\*\s*>", clean):
        if "*" in m.group(2):
            continue
        macro = "CLEMU_RCAST" if m.group(1) == "reinterpret_cast" else "CLEMU_SCAST"
        edits.append((m.start(), m.end(), f"{macro}({' '.join(m.group(2).split())})"))
    # reinterpret_cast to an integer or a reference: a function that takes the checked pointers too
    for m in re.finditer(r"\breinterpret_cast(\s*<\s*[^<>;]*?(?:<[^<>;]*>[^<>;]*?)?\s*>)", clean):
        if not m.group(1).rstrip(" >").rstrip().endswith("*"):
            edits.append((m.start(), m.end(), "::clemu::rcast" + m.group(1)))
    return edits


def _block_end(clean: str, start: int) -> int:
    """Where the block around `start` closes (its `}`), or the end of the text."""
    depth = 0
    for i in range(start, len(clean)):
        depth += clean[i] == "{"
        depth -= clean[i] == "}"
        if depth < 0:
            return i
    return len(clean)


def _shared_sizeof_edits(clean: str, start: int, name: str) -> list[tuple[int, int, str]]:
    """`sizeof(tile)`, `sizeof(tile[0])`, `sizeof tile` in the rest of the block that declares the
    static __shared__ array `tile`: the array's store (its real size), not its checked view's."""
    end = _block_end(clean, start)
    pattern = re.compile(rf"\bsizeof\s*(?:\(\s*)?\b{re.escape(name)}\b(?!\s*(?:\.|->|\())")
    return [(m.end(), m.end(), "__clemu.data") for m in pattern.finditer(clean, start, end)]


_NOT_CALLS = {"sizeof", "alignof", "decltype", "if", "while", "for", "switch", "return", "typeid"}


def _shared_decay_edits(clean: str, start: int, name: str, rank: int) -> list[tuple[int, int, str]]:
    """A __shared__ array, or a row of it (`As[k]` of a 2D array), passed as a call's argument decays to
    a pointer, as in CUDA, so a template parameter `const T*` deduces T (g++ deduces nothing from the
    checked view, cuda_emu.h): `f(As[k], ...)` becomes `f(::clemu::decay(As[k]), ...)`. A plain
    pointer parameter got the same pointer before (the view converts to one)."""
    end = _block_end(clean, start)
    pattern = re.compile(rf"(?<=[(,])\s*(\b{re.escape(name)}\b((?:\s*\[[^\[\];]*\])*))\s*(?=[,)])")
    edits = []
    for m in pattern.finditer(clean, start, end):
        if m.group(2).count("[") >= rank:
            continue   # an element, not an array
        parens, i = 0, m.start()
        while i > start:   # the parenthesis that opens the argument list: a call's, not sizeof's or if's
            i -= 1
            parens += (clean[i] == ")") - (clean[i] == "(")
            if parens < 0:
                break
        word = re.search(r"([A-Za-z_]\w*)\s*(?:<[^<>;]*>)?\s*$", clean[max(start, i - 80):i])
        if parens >= 0 or not word or word.group(1) in _NOT_CALLS:
            continue
        edits += [(m.start(1), m.start(1), "::clemu::decay("), (m.end(1), m.end(1), ")")]
    return edits


def rewrite_for_emulator(src: Source) -> str:
    """Pointer parameters of kernels become bounds-checked clemu::ptr<T>; `extern __shared__`
    arrays become the block's NaN-filled dynamic buffer; static `__shared__` arrays inside a
    function become a checked view of a per-block store, poisoned for each block (cuda_emu.h);
    `__constant__` arrays of numbers at file scope become a view whose reads the profiler counts;
    local pointers and pointer casts are spelled with CLEMU_P, so the hooked build counts their
    accesses; `#pragma unroll` is dropped (g++ has its own unroller and rejects non-constant counts)."""
    text = src.text
    clean = strip_comments(text)
    headers = "".join(strip_comments(p.read_text(errors="replace")) for p in src.includes)
    edits = _local_pointer_edits(clean, headers)   # (start, end, replacement)
    for k in src.kernels.values():
        for (s, e), p in zip(k.param_spans, k.params):
            if p.pointer and p.base != "pointer":
                elem = p.ctype.split("*")[0]
                elem = " ".join(w for w in elem.split() if w not in ("__restrict__", "__restrict", "restrict"))
                newlines = text[s:e].count("\n")
                edits.append((s, e, f" ::clemu::ptr<{elem}> {p.name}" + "\n" * newlines))
    for m in _EXTERN_SHARED_RE.finditer(clean):
        elem = " ".join(m.group(2).split())
        name = m.group(3)
        edits.append((m.start(), m.end(), f'static const ::clemu::dyn_shared<{elem}> {name}{{"{name}"}};'))
        edits += _shared_decay_edits(clean, m.end(), name, 1)
    shared = [(m, m.group(1), [(m.group(2), m.group(3))]) for m in _STATIC_SHARED_RE.finditer(clean)]
    shared += [(m, m.group(1), re.findall(r"([A-Za-z_]\w*)\s*((?:\[[^\[\];]+\]\s*)+)", m.group(2)))
               for m in _STATIC_SHARED_LIST_RE.finditer(clean)]
    for m, type_part, declarators in shared:
        if re.search(r"\bextern\s*$", clean[max(0, m.start() - 20):m.start()]):
            continue
        if clean.count("{", 0, m.start()) <= clean.count("}", 0, m.start()):
            continue   # at file scope: stays a plain static thread_local array
        elem = " ".join(_ALIGN_RE.sub(" ", type_part).split())
        if not elem or elem in ("static", "extern"):
            continue
        views = []
        for name, dims in declarators:
            dims = "".join(dims.split())
            array = f"{elem}{dims}"
            views.append(f"static thread_local ::clemu::shared_store<{array}> {name}__clemu; "
                         f"const ::clemu::sview<{array}> {name} = ::clemu::shared_open({name}__clemu, \"{name}\");")
            edits += _shared_sizeof_edits(clean, m.end(), name)
            edits += _shared_decay_edits(clean, m.end(), name, dims.count("["))
        edits.append((m.start(), m.end(), " ".join(views) + "\n" * text[m.start():m.end()].count("\n")))
    for m in _CONST_RE.finditer(clean):
        # an accessor right after the declaration, on the same line, so it lives in the same #if branch
        name, depth, i = m.group(2), 0, m.end() - 1
        while i < len(clean) and not (clean[i] == ";" and depth == 0):
            depth += clean[i] == "{"
            depth -= clean[i] == "}"
            i += 1
        store = name
        elem, dims = " ".join(m.group(1).split()), "".join(m.group(3).split())
        if (dims and clean[m.end() - 1] == ";" and _CONST_ELEM_RE.fullmatch(elem)
                and clean.count("{", 0, m.start()) <= clean.count("}", 0, m.start())):
            # an array at file scope: the array and a view whose reads the profiler counts (cuda_emu.h)
            store = f"{name}__clemu"
            edits.append((m.start(), m.end(), f"{elem} {store}{dims}; static const ::clemu::cview<{elem}{dims}> "
                                              f"{name}{{{store}}};" + "\n" * text[m.start():m.end()].count("\n")))
        edits.append((i + 1, i + 1, f' extern "C" __attribute__((no_sanitize_address)) void* __clemu_const_{name}(long long* n) '
                                    f'{{ *n = sizeof({store}); return (void*)&{store}; }}'))
    for m in re.finditer(r"^[ \t]*#[ \t]*pragma[ \t]+unroll\b[^\n]*", clean, re.M):
        edits.append((m.start(), m.end(), ""))
    out = text
    for s, e, r in sorted(edits, reverse=True):
        out = out[:s] + r + out[e:]
    return out


def rewrite_for_nvcc(src: Source) -> str:
    """Kernels get C linkage, so the names to look up are the names in the file."""
    clean = strip_comments(src.text)
    out, last = [], 0
    for m in re.finditer(r"__global__", clean):
        before = clean[max(0, m.start() - 16):m.start()]
        out.append(src.text[last:m.start()])
        out.append("__global__" if re.search(r'extern\s+"', before) else 'extern "C" __global__')
        last = m.end()
    out.append(src.text[last:])
    return "".join(out)


_CELLS: dict[str, str] = {}   # the file name a %%cuda cell compiles as -> the cell's name


def register_cell(path, name: str) -> None:
    """Messages about `path` name the %%cuda cell `name` instead (convlab.gpu.magic calls this)."""
    _CELLS[str(path)] = name


def display_name(path) -> str:
    """A source file as messages name it: "cell NAME", its path relative to the repository, or
    (outside it) its name alone: never a path of the machine that ran it."""
    p = str(path)
    if p in _CELLS:
        return f"cell {_CELLS[p]}"
    try:
        return str(Path(p).resolve().relative_to(repo_root()))
    except ValueError:
        return Path(p).name if Path(p).is_absolute() else p


def where(path, line) -> str:
    """A source line as a student finds it: "cell NAME, line N" with N as Jupyter numbers the
    cell's lines (the %%cuda line is line 1), or the file's path relative to the repository."""
    if str(path) in _CELLS:
        return f"{display_name(path)}, line {int(line) + 1}"
    return f"{display_name(path)}:{line}"


def locate(text: str, src: Source) -> str:
    """Every `/abs/path/file.cu:LINE[:COL]` of the source (or its includes) in a message, as where() says it."""
    for p in [src.path, *src.includes]:
        text = re.sub(re.escape(str(p)) + r":(\d+)(?::\d+)?", lambda m, p=p: where(p, m[1]), text)
    return text


def map_compiler_output(output: str, limit: int = 25) -> str:
    """Keep the lines a student needs: errors and the notes that locate them."""
    keep = []
    for line in output.splitlines():
        if not line.strip():
            continue
        if "In file included from" in line and "cuda_emu.h" in line:
            continue
        keep.append(line)
    if len(keep) > limit:
        keep = keep[:limit] + [f"... ({len(keep) - limit} more lines)"]
    return "\n".join(keep)


_EXTERN_C_RE = re.compile(r'extern\s+"[^"\n]*"\s+(?:(?:static|inline)\s+)*void\s+([A-Za-z_]\w*)\s*\(')


def parse_extern_c(text: str, path: Path) -> dict[str, list[Param]]:
    """The `extern "C" void f(...)` functions of a plain C++ file (chapter 1's CPU code)."""
    clean = strip_comments(text)
    out = {}
    for m in _EXTERN_C_RE.finditer(clean):
        close = _matching_paren(clean, m.end() - 1)
        params = []
        for s, e in _split_top(clean, m.end(), close):
            if clean[s:e].strip() not in ("", "void"):
                params.append(_parse_param(clean[s:e], {}))
        out[m.group(1)] = params
    return out
