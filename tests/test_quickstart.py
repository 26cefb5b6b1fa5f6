"""The README's first screen, its Quickstart, names every tool a newcomer must install before
`make`: those the Makefile calls and the compiler the emulator runs, each with how to get it."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _quickstart() -> tuple[str, int]:
    """The Quickstart section's text and the line it starts on."""
    text = (ROOT / "README.md").read_text()
    start = text.index("## Quickstart\n")
    end = text.index("\n## ", start + 1)
    return text[start:end], text.count("\n", 0, start) + 1


def _tools() -> set:
    """What a newcomer must have: the interpreter the Makefile makes its venv with, every command it
    looks for (`command -v X`), and the compiler the emulator runs by default."""
    makefile = (ROOT / "Makefile").read_text()
    tools = set(re.findall(r"command -v ([\w.+-]+)", makefile)) | {"make"}
    tools |= set(re.findall(r"^\t(python3) -m venv", makefile, re.M))
    emu = (ROOT / "convlab" / "gpu" / "emu" / "__init__.py").read_text()
    tools |= set(re.findall(r'os\.environ\.get\("CXX", "([^"]+)"\)', emu))
    return tools


def test_the_quickstart_is_on_the_first_screen():
    _, line = _quickstart()
    assert line <= 15, f"## Quickstart starts on line {line} of README.md: keep it on the first screen"


def test_the_quickstart_names_every_tool_make_and_the_emulator_call():
    text, _ = _quickstart()
    tools = _tools()
    assert {"g++", "npm", "chromium", "python3"} <= tools, tools
    missing = [t for t in sorted(tools) if t.lower() not in text.lower()]
    assert not missing, f"the Quickstart does not name {missing}, which the Makefile or the emulator calls"


def test_each_prerequisite_says_how_to_get_it_on_debian_and_macos():
    text, _ = _quickstart()
    rows = [r for r in text.splitlines() if r.startswith("| ") and not r.startswith(("| you need", "|---"))]
    assert len(rows) >= 5, rows
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 4 and "apt-get install" in cells[2] and ("brew" in cells[3] or "xcode" in cells[3]), row
    assert "playwright install chromium" in text, "how to get Chromium without root"
    assert "jupyter nbconvert --execute --to notebook" in text


def test_the_environment_make_builds_has_nbconvert():
    """`make venv` installs the test and book extras; nbconvert is among them, so the usual
    `jupyter nbconvert --execute` works there."""
    makefile = (ROOT / "Makefile").read_text()
    extras = re.search(r"pip install -q -e '\.\[([\w,]+)\]'", makefile)[1].split(",")
    pyproject = (ROOT / "pyproject.toml").read_text()
    installed = []
    for extra in extras:
        installed += re.findall(r'"([\w.-]+)', re.search(rf"^{extra} = \[(.*)\]", pyproject, re.M)[1])
    assert "nbconvert" in installed, installed
