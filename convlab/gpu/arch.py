"""Which GPUs a kernel file runs on. Standard library only: scripts/kernels_check.py loads this
file by itself, without the package (no torch needed to compile-check the kernels).

Every kernel runs on compute capability 7.5 (T4, RTX 20) and newer, the oldest that CUDA 13
compiles for, unless its header comment (the comment lines the file starts with) says otherwise:

    // Requires sm_80 or newer: cp.async copies global memory to shared memory asynchronously

`make kernels-check` then compiles the file only for those architectures, and `cl.load` on an
older GPU stops with a CompileError that quotes the reason.
"""
from __future__ import annotations

import re

# The course's GPUs, oldest first: T4 / RTX 20, A100, RTX 30 / A10, RTX 40 / L4, H100 / H200.
ARCHS = ("sm_75", "sm_80", "sm_86", "sm_89", "sm_90")
OLDEST = (7, 5)
REQUIRES = re.compile(r"^//\s*Requires sm_(\d)(\d)\b or newer:?\s*(.*)$", re.MULTILINE)
# an architecture-specific target ("a"): that compute capability only, e.g. sm_90a's wgmma on H100/H200
REQUIRES_ONLY = re.compile(r"^//\s*Requires sm_(\d)(\d)a:?\s*(.*)$", re.MULTILINE)


def header(text: str) -> str:
    """The comment lines a file starts with (blank lines included), up to its first code."""
    lines = []
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("//"):
            break
        lines.append(line)
    return "\n".join(lines)


def required(text: str) -> tuple[tuple[int, int], str]:
    """(the oldest compute capability the file runs on, why), from its header."""
    m = REQUIRES.search(header(text)) or REQUIRES_ONLY.search(header(text))
    if m is None:
        return OLDEST, ""
    return (int(m.group(1)), int(m.group(2))), m.group(3).strip()


def required_suffix(text: str) -> str:
    """"a" when the file is built for its compute capability's architecture-specific target only
    (its header says `// Requires sm_90a: ...`), else ""."""
    return "a" if REQUIRES_ONLY.search(header(text)) else ""


def targets(text: str) -> list[str]:
    """The targets `make kernels-check` compiles the file for."""
    need, _ = required(text)
    if required_suffix(text):
        return [sm(need) + "a"]
    return [t for t in ARCHS if (int(t[3]), int(t[4:])) >= need]


def sm(cc: tuple[int, int]) -> str:
    return f"sm_{cc[0]}{cc[1]}"


def too_old(text: str, path, cc: tuple[int, int], gpu: str) -> str | None:
    """None when a GPU of compute capability cc runs the file, else the message that says why not
    and what to do instead."""
    need, why = required(text)
    if required_suffix(text):
        if tuple(cc) == need:
            return None
        return (f"{path} runs only on a GPU of compute capability {need[0]}.{need[1]} ({sm(need)}a: an H100 or "
                f"H200)" + (f" ({why})" if why else "") + f"; this {gpu} is {cc[0]}.{cc[1]}. Run it on the CPU "
                "emulator (CONVLAB_BACKEND=emu); on this GPU, chapter 9's mma.sync kernel is the fp16 path.")
    if tuple(cc) >= need:
        return None
    return (f"{path} needs a GPU of compute capability {need[0]}.{need[1]} ({sm(need)}) or newer"
            + (f" ({why})" if why else "") + f"; this {gpu} is {cc[0]}.{cc[1]}. Run it on the CPU "
            "emulator (CONVLAB_BACKEND=emu) or on a newer GPU; README.md lists which GPUs run which "
            "chapters.")
