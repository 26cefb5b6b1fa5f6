"""convlab's modules import one another one way: no import cycle among them, and its packages stand on
floors (FLOORS): a package imports only packages below it.

Read from the source (ast), not by importing: every `import` / `from ... import` of a convlab
module counts, at module level or inside a function, except a function-local one whose line says
it is there for an "optional" or "heavy" dependency. `import convlab` and `from convlab import
NAME` (NAME not a submodule) point at the package front, convlab/__init__.py.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "convlab"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_waived(node, lines, in_function: bool) -> bool:
    """A function-local import whose line (or the comment just above it) names an optional or heavy dependency."""
    if not in_function:
        return False
    text = " ".join(lines[max(node.lineno - 2, 0):node.end_lineno]).lower()
    return "#" in text and ("optional" in text or "heavy" in text)


def imports_of(name: str, path: Path, known: set[str]) -> dict[str, int]:
    """The convlab modules `name` imports (counted as the module docstring says), each with the line
    of its first import."""
    text = path.read_text()
    lines = text.splitlines()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: dict[str, int] = {}

    def target(base: str, item: str | None) -> str:
        if item and f"{base}.{item}" in known:
            return f"{base}.{item}"         # `from convlab import book`: the submodule
        while base not in known:             # `from convlab.x import NAME`: the module x
            base = base.rpartition(".")[0]
        return base

    def visit(node, in_function: bool):
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import) and not _is_waived(child, lines, in_function):
                for a in child.names:
                    if a.name.split(".")[0] == "convlab":
                        out.setdefault(target(a.name, None), child.lineno)
            elif isinstance(child, ast.ImportFrom) and not _is_waived(child, lines, in_function):
                if child.level:
                    base = ".".join(package.split(".")[:len(package.split(".")) - child.level + 1])
                    base = f"{base}.{child.module}" if child.module else base
                else:
                    base = child.module or ""
                if base.split(".")[0] == "convlab":
                    for a in child.names:
                        out.setdefault(target(base, a.name), child.lineno)
            visit(child, inner)

    visit(ast.parse(text), False)
    out.pop(name, None)
    return out


def graph() -> dict[str, dict[str, int]]:
    mods = modules()
    known = set(mods)
    return {m: imports_of(m, p, known) for m, p in mods.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def strong(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in g:
                continue
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            strong(v)
    return out


def test_no_import_cycle_among_convlab_modules():
    g = graph()
    found = cycles(g)
    detail = "\n".join(
        "  " + ", ".join(c) + "\n" + "\n".join(f"    {a} -> {b}" for a in c for b in sorted(set(g[a]) & set(c)))
        for c in found)
    assert not found, f"import cycles among convlab's modules:\n{detail}"


#: convlab's packages from the ground up. A package imports only itself and the packages below it;
#: the package front (convlab/__init__.py, "convlab" here) hands on names from the floors below it,
#: and the floors above it use it (import convlab as cl).
FLOORS = ["gpu", "measuring", "ops", "display", "convlab", "programs", "teach", "chapters"]


def floor(module: str) -> str:
    """The package a convlab module is in (convlab.ops.fused: "ops"; the front: "convlab")."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "convlab"


def imports_up(g: dict[str, dict[str, int]], paths: dict[str, Path]) -> list[str]:
    """'path:line: module imports module (its package stands above)' for each import up the floors."""
    return sorted(f"{paths[a].relative_to(ROOT)}:{line}: {a} imports {b} ({floor(b)} stands above {floor(a)})"
                  for a, targets in g.items() for b, line in targets.items()
                  if b in g and FLOORS.index(floor(b)) > FLOORS.index(floor(a)))


def test_every_module_is_in_a_package_on_a_floor():
    loose = [m for m in modules() if m != "convlab" and floor(m) not in FLOORS]
    stray = [m for m in modules() if len(m.split(".")) == 2 and m.split(".")[1] not in FLOORS]
    assert not loose and not stray, f"convlab modules on no floor of FLOORS: {sorted(set(loose + stray))}"


def test_packages_import_only_the_floors_below():
    found = imports_up(graph(), modules())
    assert not found, "imports up convlab's floors:\n" + "\n".join(found)


def test_the_floor_check_sees_an_import_up():
    """The reader itself: a launcher importing a chapter is named, with its line."""
    g = {"convlab.ops.fused": {"convlab.chapters.ch05_fused": 7}, "convlab.chapters.ch05_fused": {"convlab.ops.fused": 3}}
    paths = {m: ROOT / (m.replace(".", "/") + ".py") for m in g}
    assert imports_up(g, paths) == ["convlab/ops/fused.py:7: convlab.ops.fused imports convlab.chapters.ch05_fused "
                                    "(chapters stands above ops)"]


def test_the_package_front_only_hands_names_on():
    """convlab/__init__.py defines no function or class of its own (the runtime is convlab.gpu.runtime),
    and no module the front imports imports the front back."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    own = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name != "__getattr__"]
    assert own == []
    g = graph()
    below, todo = set(), ["convlab"]
    while todo:
        for m in g.get(todo.pop(), ()):
            if m not in below:
                below.add(m)
                todo.append(m)
    assert "convlab" not in below


def test_the_check_sees_a_cycle(tmp_path):
    """The reader itself: a function-local import closing a loop is a cycle; one marked as an
    optional heavy dependency is not."""
    a = tmp_path / "convlab" / "a.py"
    b = tmp_path / "convlab" / "b.py"
    a.parent.mkdir()
    a.write_text("from . import b\n")
    b.write_text("def f():\n    from . import a\n")
    known = {"convlab.a", "convlab.b"}
    rel = lambda p: ".".join(p.relative_to(tmp_path).with_suffix("").parts)  # noqa: E731
    g = {rel(p): imports_of(rel(p), p, known) for p in (a, b)}
    assert cycles(g) == [["convlab.a", "convlab.b"]]
    b.write_text("def f():\n    from . import a  # optional: heavy, only for plots\n")
    g = {rel(p): imports_of(rel(p), p, known) for p in (a, b)}
    assert cycles(g) == []


def local_imports() -> list[str]:
    """'path:line: text' of each function-local import of a convlab module that names no optional or
    heavy dependency."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = path.read_text().splitlines()
        for fn in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                own = ((isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("convlab")))
                       or (isinstance(node, ast.Import) and any(a.name.startswith("convlab") for a in node.names)))
                if own and not _is_waived(node, lines, True):
                    out.append(f"{path.relative_to(ROOT)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    return sorted(set(out))


def test_no_function_imports_its_own_package_without_a_reason():
    """Imports run one way at the top of each module; one inside a function hides a dependency (and
    often a cycle) and is allowed only for an optional heavy dependency, said on its line."""
    found = local_imports()
    assert not found, "function-local imports of convlab modules:\n" + "\n".join(found)
