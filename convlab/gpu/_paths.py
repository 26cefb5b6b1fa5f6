"""Where the workbook is: its root folder, and paths inside it.

Notebooks run with their own folder as the working directory (book/, solutions/, exercises/),
so paths are resolved from the repository root, found by walking up to ``_toc.yml``.
"""
from __future__ import annotations

import os
from pathlib import Path

_PACKAGE_ROOT = Path(__file__).resolve().parents[2]


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
