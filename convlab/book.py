"""Small helpers the chapters' notebooks share: where the repository is, and showing a kernel file.

Notebooks run with their own folder as the working directory (book/, solutions/, exercises/),
so paths are resolved from the repository root, found by walking up to ``_toc.yml``.
"""
from __future__ import annotations

import os
from pathlib import Path

_PACKAGE_ROOT = Path(__file__).resolve().parent.parent


def repo_root() -> Path:
    """The workbook's root: the first folder above the working directory with _toc.yml and kernels/.

    Falls back to the folder that holds the convlab package (an editable install).
    """
    env = os.environ.get("CONVLAB_ROOT")
    if env:
        return Path(env).resolve()
    here = Path.cwd().resolve()
    for folder in (here, *here.parents):
        if (folder / "_toc.yml").is_file() and (folder / "kernels").is_dir():
            return folder
    return _PACKAGE_ROOT


def path(relative: str | os.PathLike) -> Path:
    """A path inside the workbook, absolute."""
    p = Path(relative)
    return p if p.is_absolute() else repo_root() / p


def show_source(relative: str | os.PathLike, start: int | None = None, end: int | None = None,
                numbers: bool = True) -> None:
    """Print a source file of the workbook (or lines start..end, 1-based, inclusive) with line numbers,
    so the notebook shows exactly the file that was compiled."""
    lines = path(relative).read_text().splitlines()
    first = 1 if start is None else start
    last = len(lines) if end is None else end
    print(f"// {Path(relative).as_posix()}" + ("" if (start, end) == (None, None) else f", lines {first}-{last}"))
    width = len(str(last))
    for n in range(first, last + 1):
        text = lines[n - 1]
        print(f"{n:>{width}}  {text}" if numbers else text)


def progress(iterable, desc: str = "", **kwargs):
    """A tqdm progress bar for sweeps that stays short in a saved notebook: it redraws at most every
    30 s, so the executed notebook (and the website) keep a few lines instead of every step."""
    try:
        from tqdm import tqdm
    except ImportError:  # an offline GPU machine may lack tqdm: the sweep runs without a bar
        return iterable
    kwargs.setdefault("mininterval", 30.0)
    kwargs.setdefault("dynamic_ncols", False)
    return tqdm(iterable, desc=desc, **kwargs)


GLUE_PREFIX = "application/papermill.record/"   # what myst-nb's {glue} roles read from a cell's outputs


def glue(name: str, value, fmt: str | None = None):
    """Store a value for the prose: a markdown cell shows it with {glue:text}`name`, so every number
    in the text comes from the data it describes. The same output myst_nb.glue writes, without
    needing myst-nb where the notebook runs. fmt formats the value here (e.g. ".2f"); None or NaN
    (no results committed yet) shows as a dash. Returns the value."""
    from IPython.display import display

    missing = value is None or (isinstance(value, float) and value != value)
    text = "—" if missing else (format(value, fmt) if fmt else str(value))
    display({GLUE_PREFIX + "text/plain": text}, raw=True,
            metadata={"scrapbook": {"name": name, "mime_prefix": GLUE_PREFIX}})
    return value
