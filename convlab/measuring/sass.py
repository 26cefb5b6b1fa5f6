"""SASS, the GPU's own instructions, for the claims the book makes about code generation.

    s = cl.sass("kernels/05_fused/conv2d_direct_regtile.cu", defines={...}, name="ch5_regtile")
    s.summary()          # FFMA, FFMA with a constant-bank operand, HFMA2, HMMA, LDG, LDS, ULDC, ... counts
    s.loop()             # the innermost loop's body (the lines between a backward branch and its target)
    s.counts(s.loop())   # instruction counts by opcode inside that loop

The kernel file is compiled with `nvcc -cubin -arch=sm_90` (the same rewrite PyCUDA compiles) and
disassembled with `cuobjdump --dump-sass`. nvcc and cuobjdump come with the CUDA toolkit; where
cuobjdump is missing, one line says so and, with name=..., the SASS a GPU machine committed in
book/data/sass/NAME.sass is shown instead.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ..gpu.arch import required_suffix
from ..gpu._errors import CompileError, ConvlabError
from ..gpu._paths import path as workbook_path, repo_root
from ..gpu.runtime import resolve_path
from ..gpu._source import parse, rewrite_for_nvcc

__all__ = ["sass", "parse_sass", "compile_cubin", "disassemble", "Sass", "Instruction", "SassUnavailable",
           "SASS_DIR", "KEY_OPCODES", "compact"]

SASS_DIR = "book/data/sass"


class SassUnavailable(ConvlabError):
    """No disassembler here and no committed SASS; the message says what to install or commit."""


@dataclass(frozen=True)
class Instruction:
    address: int        # byte offset in the function
    predicate: str      # "@P0", "@!P1" or ""
    opcode: str         # the full opcode with its modifiers: "LDG.E.128.CONSTANT"
    operands: str       # "R4, desc[UR4][R2.64]"

    @property
    def base(self) -> str:
        """The opcode without modifiers: LDG, FFMA, HFMA2, ..."""
        return self.opcode.split(".")[0]

    @property
    def constant_bank(self) -> bool:
        """An operand read straight from the user's __constant__ bank (c[0x3][...] on sm_90)."""
        return "c[0x3]" in self.operands

    def __str__(self):
        pred = f"{self.predicate} " if self.predicate else ""
        return f"/*{self.address:04x}*/ {pred}{self.opcode} {self.operands};".replace(" ;", ";")


# (row label, test): the instructions the book's claims are about
KEY_OPCODES = [
    ("FFMA", lambda i: i.base == "FFMA"),
    ("FFMA with a c[0x3][...] operand", lambda i: i.base == "FFMA" and i.constant_bank),
    ("HFMA2", lambda i: i.base == "HFMA2" and ".MMA" not in i.opcode),
    ("HFMA2.MMA (moves)", lambda i: i.opcode.startswith("HFMA2.MMA")),
    ("HMMA (tensor cores)", lambda i: i.base == "HMMA"),
    ("LDG (global loads)", lambda i: i.base == "LDG"),
    ("STG (global stores)", lambda i: i.base == "STG"),
    ("LDS (shared loads)", lambda i: i.base == "LDS"),
    ("STS (shared stores)", lambda i: i.base == "STS"),
    ("LDC (constant loads)", lambda i: i.base == "LDC"),
    ("ULDC (uniform constant loads)", lambda i: i.base == "ULDC"),
    ("ATOM/RED (atomics)", lambda i: i.base in ("ATOM", "ATOMG", "RED", "ATOMS")),
    ("BAR (barriers)", lambda i: i.base == "BAR"),
]

_LINE = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)\s*(.*?)\s*;")
_FUNC = re.compile(r"^\s*Function\s*:\s*(\S+)")
_MANGLED = re.compile(r"^_Z(\d+)")


def _plain_name(symbol: str) -> str:
    """conv2d_half2 from _Z12conv2d_half2PK6__halfS1_PS_iiii; an extern "C" name as it is."""
    m = _MANGLED.match(symbol)
    if m:
        n = int(m.group(1))
        return symbol[m.end():m.end() + n]
    return symbol


class Sass:
    """The disassembly of a cubin: its functions' instructions, and the counts that matter."""

    def __init__(self, functions: dict, source: str = ""):
        self.functions = functions   # plain kernel name -> [Instruction]
        self.source = source         # where the text came from

    def function(self, name: str | None = None) -> list:
        if name is None:
            if len(self.functions) != 1:
                raise SassUnavailable(f"this SASS has {len(self.functions)} functions "
                                      f"({', '.join(self.functions) or 'none'}): name the one you want")
            return next(iter(self.functions.values()))
        if name in self.functions:
            return self.functions[name]
        have = ", ".join(self.functions) or "none"
        raise SassUnavailable(f"no function {name!r} in this SASS (it has: {have})")

    def loops(self, function: str | None = None) -> list:
        """Every backward branch's range, as lists of instructions (target .. branch), innermost first."""
        code = self.function(function)
        at = {ins.address: k for k, ins in enumerate(code)}
        found = []
        for k, ins in enumerate(code):
            if ins.base != "BRA":
                continue
            m = re.search(r"0x([0-9a-f]+)", ins.operands)
            if m and int(m.group(1), 16) < ins.address and int(m.group(1), 16) in at:   # not EXIT's self-branch
                found.append(code[at[int(m.group(1), 16)]:k + 1])
        return sorted(found, key=len)

    def loop(self, function: str | None = None, containing: str = "") -> list:
        """The innermost loop (whose body has an instruction with opcode `containing`, if given)."""
        for body in self.loops(function):
            if not containing or any(i.opcode.startswith(containing) for i in body):
                return body
        what = f" with {containing}" if containing else ""
        raise SassUnavailable(f"no loop{what} in {function or 'this function'}: the compiler unrolled it "
                              f"completely (or there was none)")

    def counts(self, code=None, function: str | None = None) -> Counter:
        """Instruction counts by opcode without modifiers (FFMA, LDG, ...)."""
        code = self.function(function) if code is None else code
        return Counter(i.base for i in code)

    def summary(self, function: str | None = None, loop: bool = False):
        """A table of the key opcodes: in the whole function and in its innermost loop."""
        import pandas as pd

        code = self.function(function)
        cols = {"function": [sum(1 for i in code if t(i)) for _, t in KEY_OPCODES]}
        if loop:
            body = self.loop(function)
            cols["innermost loop"] = [sum(1 for i in body if t(i)) for _, t in KEY_OPCODES]
        df = pd.DataFrame(cols, index=[label for label, _ in KEY_OPCODES])
        df.index.name = "instructions"
        return df[df.sum(axis=1) > 0]

    @staticmethod
    def show(code, match: str | None = None, limit: int = 40) -> None:
        """Print instructions (those whose text contains `match`, if given), at most `limit` lines."""
        shown = [i for i in code if match is None or match in str(i)]
        for i in shown[:limit]:
            print(str(i))
        if len(shown) > limit:
            print(f"... {len(shown) - limit} more")

    def __repr__(self):
        n = {k: len(v) for k, v in self.functions.items()}
        return f"<SASS {self.source}: " + ", ".join(f"{k} ({v} instructions)" for k, v in n.items()) + ">"


def parse_sass(text: str, source: str = "") -> Sass:
    """cuobjdump --dump-sass output (or nvdisasm's) -> Sass."""
    functions: dict = {}
    current = None
    for line in text.splitlines():
        f = _FUNC.match(line)
        if f:
            current = functions.setdefault(_plain_name(f.group(1)), [])
            continue
        m = _LINE.match(line)
        if m and current is not None:
            pred = (m.group(2) or "").strip()
            current.append(Instruction(int(m.group(1), 16), pred, m.group(3), m.group(4).strip()))
    if not functions:
        raise SassUnavailable("no SASS functions in this text (expected cuobjdump --dump-sass output, "
                              "with `Function : name` headers)")
    return Sass(functions, source)


# ---------------------------------------------------------------------------------------------

def _tool(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for root in filter(None, (os.environ.get("CUDA_HOME"), "/usr/local/cuda")):
        p = Path(root) / "bin" / name
        if p.exists():
            return str(p)
    if name == "cuobjdump":     # the triton wheel ships one (an optional, large developer install)
        try:
            import triton
            p = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
            if p.exists():
                return str(p)
        except ImportError:
            pass
    return None


def compile_cubin(path, out: Path, defines: dict | None = None, arch: str = "sm_90") -> Path:
    """nvcc -cubin of a kernel file, after the same rewrite the GPU backend compiles."""
    nvcc = _tool("nvcc")
    if nvcc is None:
        raise SassUnavailable("nvcc (the CUDA compiler) is not installed here: install the CUDA toolkit, "
                              "or set CUDA_HOME to it")
    p = resolve_path(path)
    src = parse(p.read_text(), p, [repo_root() / "kernels"])
    text = rewrite_for_nvcc(src)
    flags = [f"-D{k}" if v is None else f"-D{k}={v}" for k, v in (defines or {}).items()]
    if required_suffix(src.text) and not arch.endswith("a"):
        arch += required_suffix(src.text)        # wgmma and setmaxnreg exist only in sm_90a
    # an "a" target as the -gencode pair: the -arch=sm_90a shorthand also runs a plain sm_90 pass
    target = f"-gencode=arch=compute_{arch[3:]},code={arch}" if arch.endswith("a") else f"-arch={arch}"
    with tempfile.TemporaryDirectory() as tmp:
        cu = Path(tmp) / p.name
        cu.write_text(f'#line 1 "{p}"\n' + text)
        r = subprocess.run([nvcc, "-cubin", target, "-std=c++17", "-lineinfo", "-I", str(p.parent), "-I", str(repo_root() / "kernels"), *flags,
                            "-o", str(out), str(cu)], capture_output=True, text=True)
    if r.returncode != 0:
        raise CompileError(f"{p} does not compile with nvcc -cubin -arch={arch}:\n{r.stderr or r.stdout}")
    return out


def disassemble(cubin: Path) -> str:
    tool = _tool("cuobjdump")
    if tool is None:
        raise SassUnavailable("cuobjdump is not installed here (it comes with the CUDA toolkit, next to nvcc)")
    r = subprocess.run([tool, "--dump-sass", str(cubin)], capture_output=True, text=True)
    if r.returncode != 0:
        raise SassUnavailable(f"cuobjdump --dump-sass {cubin.name} failed: {r.stderr.strip() or r.stdout.strip()}")
    return r.stdout


def compact(text: str) -> str:
    """cuobjdump's text without the instruction encodings (the /* 0x... */ columns and lines): what
    parse_sass reads, at about a fifth of the size, for committing."""
    out = []
    for line in text.splitlines():
        bare = re.sub(r"\s*/\*\s*0x[0-9a-f]+\s*\*/\s*$", "", line)
        if _LINE.match(bare):
            bare = "    " + re.sub(r"\s+", " ", bare.strip())      # the columns' padding too
        if bare.strip() or not line.strip():
            out.append(bare)
    return "\n".join(out) + "\n"


def committed(name: str) -> Sass | None:
    p = workbook_path(SASS_DIR) / f"{name}.sass"
    return parse_sass(p.read_text(), f"committed {SASS_DIR}/{name}.sass") if p.exists() else None


def sass(path, defines: dict | None = None, *, name: str | None = None, arch: str = "sm_90") -> Sass:
    """Compile `path` (a kernels/ file) to a cubin and disassemble it. With name=..., the SASS is
    kept in book/data/sass/NAME.sass, and shown from there where cuobjdump is missing."""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            if _tool("cuobjdump") is None:     # say so before a compile that could not be read
                raise SassUnavailable("cuobjdump is not installed here (it comes with the CUDA toolkit, next to nvcc)")
            cubin = compile_cubin(path, Path(tmp) / "k.cubin", defines, arch)
            text = disassemble(cubin)
        except SassUnavailable as e:
            old = committed(name) if name else None
            if old is None:
                where = f"and there is no committed {SASS_DIR}/{name}.sass" if name else \
                        "pass name=... to fall back to SASS committed from a machine with the CUDA toolkit"
                raise SassUnavailable(f"{e}; {where}") from None
            print(f"cl.sass: {e}; showing the committed SASS ({old.source}).")
            return old
    if name:
        d = workbook_path(SASS_DIR)
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{name}.sass").write_text(compact(text))
    return parse_sass(text, f"nvcc -cubin -arch={arch} {Path(path).name} | cuobjdump --dump-sass")
