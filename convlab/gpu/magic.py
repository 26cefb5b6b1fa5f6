"""%%cuda: write a kernel in a notebook cell and compile it on the active backend.

    %load_ext convlab.gpu.magic

    %%cuda my_conv [-D TILE=16 ...]
    __global__ void conv2d(...) { ... }

binds NAME (my_conv) to the compiled Module (my_conv.kernel("conv2d")). A compile error is
printed with its line in the cell instead of raised, and NAME is then bound to a stand-in whose
use says the cell did not compile, so the notebook runs on and the checks report it.
"""
from __future__ import annotations

import re
import shlex
from pathlib import Path

from IPython.core.magic import Magics, cell_magic, magics_class

from . import _source
from ._errors import CompileError, ConvlabError
from .runtime import device, load_source


class CellNotCompiled(ConvlabError):
    """A kernel of a %%cuda cell that did not compile was used."""


class FailedModule:
    """Stands in for the Module of a %%cuda cell that did not compile."""

    kernels: list = []

    def __init__(self, name: str, message: str):
        self._name = name
        self._message = message

    def _fail(self):
        raise CellNotCompiled(f"the %%cuda cell '{self._name}' did not compile; fix the error printed under "
                              f"that cell and run it again")

    def kernel(self, kernel_name: str):
        return FailedKernel(self, kernel_name)

    def set_constant(self, *args, **kwargs):
        self._fail()

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        self._fail()

    def __repr__(self) -> str:
        return f"<%%cuda cell '{self._name}': did not compile>"


class FailedKernel:
    def __init__(self, module: FailedModule, name: str):
        self._module = module
        self.name = name

    def __call__(self, *args, **kwargs):
        self._module._fail()

    def __repr__(self) -> str:
        return f"<kernel {self.name} of a %%cuda cell that did not compile>"


def parse_line(line: str):
    """'NAME [-D KEY=VALUE | -DKEY=VALUE | -D KEY]...' -> (name, defines)."""
    words = shlex.split(line)
    if not words or words[0].startswith("-"):
        raise ValueError("usage: %%cuda NAME [-D KEY=VALUE ...]  (NAME is the variable that gets the module)")
    name, rest = words[0], words[1:]
    if not name.isidentifier():
        raise ValueError(f"%%cuda: {name!r} is not a Python name")
    defines = {}
    i = 0
    while i < len(rest):
        word = rest[i]
        if word == "-D" and i + 1 < len(rest):
            item, i = rest[i + 1], i + 2
        elif word.startswith("-D") and len(word) > 2:
            item, i = word[2:], i + 1
        else:
            raise ValueError(f"%%cuda: cannot read {word!r}; expected -D KEY=VALUE")
        key, _, value = item.partition("=")
        defines[key] = value if value else 1
    return name, defines


def cell_message(message: str, name: str) -> str:
    """Point compiler messages at the cell: g++'s '/some/dir/NAME.cu:12:5: error' and nvcc's
    'NAME.cu(12): error' both become 'cell NAME, line 13...': the source's line 12 is the cell's
    line 13, as Jupyter numbers it (the %%cuda line is line 1)."""
    pattern = re.compile(r"(?:[^\s:'‘`(]*[/\\])?" + re.escape(name) + r"\.cu(?::(\d+)(?::\d+)?|\((\d+)\))?")

    def where(m: re.Match) -> str:
        line = m[1] or m[2]
        return f"cell {name}, line {int(line) + 1}" if line else f"cell {name}"

    return pattern.sub(where, message)


@magics_class
class CudaMagics(Magics):
    @cell_magic
    def cuda(self, line: str, cell: str):
        """%%cuda NAME [-D KEY=VALUE ...]: compile the cell as CUDA C; bind NAME to the module."""
        try:
            name, defines = parse_line(line)
        except ValueError as e:
            print(e)
            return
        # every message of the emulator (faults, races, barriers, compile errors) names the cell
        _source.register_cell(Path.cwd() / f"{name}.cu", name)
        try:
            module = load_source(cell, name=name, defines=defines or None)
        except CompileError as e:
            print(f"✗ the cell did not compile ({device().backend} backend):\n")
            print(cell_message(str(e), name))
            self.shell.user_ns[name] = FailedModule(name, str(e))
            return
        except ConvlabError as e:
            print(f"✗ {type(e).__name__}: {e}")
            self.shell.user_ns[name] = FailedModule(name, str(e))
            return
        self.shell.user_ns[name] = module
        print(f"{name}: compiled, kernels {', '.join(module.kernels) or '(none)'}")


def load_ipython_extension(ipython) -> None:
    ipython.register_magics(CudaMagics)
