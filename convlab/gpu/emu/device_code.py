"""Device code is device code: what nvcc refuses in a kernel, the emulator refuses too, at compile
time and at the student's line, instead of running it in the user's process.

- compile_flags(offset) / LINK_FLAGS: how a kernel module is built so that every load and store
  is checked against what its launch owns (guard.cpp's shadow at `offset`, inline checks;
  offset 0: the shadow is in software, every check a call), local arrays are bounds-checked,
  integer division by zero is reported, and malloc/free/new/delete go to the device heap.
- check_inline_asm(text, ...): inline assembly (PTX, or anything else) in the kernel's own files.
- check_host_calls(so, src): every function the module calls outside itself must be one a GPU has
  (the emulator runtime, the C math library, memcpy/memset); the C library's I/O, process and
  environment calls, exceptions and the standard containers are host code, refused with the
  call's line, as nvcc refuses them ("calling a __host__ function from a __global__ function is
  not allowed").
"""
from __future__ import annotations

import functools
import re
import subprocess
from pathlib import Path

from .._errors import CompileError
from .._source import Source, _matching_paren, display_name, strip_comments, where


def compile_flags(offset: int) -> list[str]:
    """The sanitizers' flags: the guard's checks (inline against the shadow at `offset`, or calls
    where offset is 0), local arrays' bounds, integer division by zero, a function that reaches its
    end without the value it returns; new may return NULL."""
    guard = ["-fsanitize=kernel-address", "--param", "asan-stack=0", "--param", "asan-globals=0"]
    if offset:
        guard += [f"-fasan-shadow-offset={offset:#x}", "--param", "asan-instrumentation-with-call-threshold=100000000"]
    else:
        guard += ["--param", "asan-instrumentation-with-call-threshold=0"]
    # no sibling calls: every __device__ function keeps its frame, so a fault names its caller's line
    # stack-clash protection: a large frame touches its pages in order, so an overflow meets the guard page
    return guard + ["-fsanitize=bounds,integer-divide-by-zero,return", "-fcheck-new", "-fno-optimize-sibling-calls",
                    "-fstack-clash-protection"]


#: Device code's malloc and new: the device heap of the emulator's runtime (__wrap_* in runtime.cpp).
WRAPPED = ("malloc", "free", "_Znwm", "_Znam", "_ZdlPv", "_ZdaPv", "_ZdlPvm", "_ZdaPvm",
           "__cxa_throw_bad_array_new_length")
#: Linked in a second step, without the sanitizers' flags (so no sanitizer library is pulled in);
#: the module's relocations read-only once loaded (a wild store cannot reach its imports).
LINK_FLAGS = ["-Wl,-z,relro,-z,now", *(f"-Wl,--wrap={w}" for w in WRAPPED)]


# ---- inline assembly ---------------------------------------------------------------------------

_ASM_RE = re.compile(r"\b(asm|__asm__|__asm)\b")


def check_inline_asm(text: str, src: Source, flags: list[str], include_dir: Path, cxx: str) -> None:
    """Inline assembly in the kernel's own files (after the preprocessor: the course's headers keep
    theirs in the branch for nvcc): the emulator runs C++ on a CPU and cannot run it."""
    if "asm" not in src.all_text():
        return
    r = subprocess.run([cxx, "-std=c++17", "-E", *flags, "-x", "c++", "-"], input=text, capture_output=True, text=True)
    if r.returncode != 0:
        return   # the compile that follows reports the error
    own = {str(src.path), *(str(p) for p in src.includes)}
    current, line = None, 0
    for raw in r.stdout.splitlines():
        m = re.match(r'#\s*(\d+)\s+"([^"]*)"', raw)
        if m:
            line, current = int(m.group(1)), m.group(2)
            continue
        if current in own and _ASM_RE.search(raw):
            raise CompileError(
                f"{where(current, line)}: inline assembly (`{_ASM_RE.search(raw).group(1)}`) does not run on the "
                f"emulator: it runs the kernel as C++ on a CPU, and a PTX instruction means nothing there. Use the "
                f"course's wrappers (kernels/09_general/tensor_core.cuh, kernels/11_hopper/hopper.cuh), which the "
                f"emulator models exactly, or keep the asm in an `#ifndef CONVLAB_EMULATOR` branch with a C++ twin "
                f"in the `#else`.")
        line += 1


# ---- calls out of the module ---------------------------------------------------------------------

_ALLOWED = {
    "__tls_get_addr", "__cxa_finalize", "_ITM_deregisterTMCloneTable", "_ITM_registerTMCloneTable", "__gmon_start__",
    "__gxx_personality_v0", "_Unwind_Resume", "__stack_chk_fail", "__cxa_guard_acquire", "__cxa_guard_release",
    "__cxa_guard_abort", "memcpy", "memset", "memmove", "memcmp", "__memcpy_chk", "__memset_chk", "__memmove_chk",
    # math that glibc keeps in libc rather than libm
    "frexp", "frexpf", "ldexp", "ldexpf", "modf", "modff", "scalbn", "scalbnf", "copysign", "copysignf", "abs",
    "labs", "llabs", "__isnan", "__isnanf", "__isinf", "__isinff", "__finite", "__finitef", "isnan", "isinf",
    "isnanf", "isinff", "finite", "finitef",
}
_ALLOWED_PREFIXES = ("clemu_", "__asan_", "__ubsan_", "__wrap_", "_ZTH", "_ZTW")
_HINTS = [
    (re.compile(r"^(f?open|fclose|f?printf|v?f?printf|fputs?|puts|putc|putchar|fwrite|fread|fgets|getc|getchar|f?scanf|"
                r"perror|remove|rename|tmpfile|fflush|read|write|close|creat|f?stat|mkdir|unlink)$"),
     "Files and streams are the host's: a kernel writes its results into an output buffer (printf is the one "
     "output device code has)."),
    (re.compile(r"^(system|exit|_exit|_Exit|abort|quick_exit|atexit|getenv|secure_getenv|setenv|putenv|unsetenv|fork|"
                r"vfork|exec\w*|popen|pclose|kill|raise|signal|sigaction|sleep|usleep|nanosleep|syscall|dlopen|dlsym)$"),
     "A kernel cannot start or end processes or read the environment: to stop a kernel on a bad value use "
     "assert(...) or __trap(); to end a thread, return."),
    (re.compile(r"^__cxa_(throw|allocate_exception|begin_catch|end_catch|rethrow|free_exception)$"),
     "Exceptions do not exist in device code: check the condition and return (or assert)."),
    (re.compile(r"^(calloc|realloc|aligned_alloc|posix_memalign|valloc|memalign)$"),
     "Device code has malloc and free (and new and delete) only."),
    (re.compile(r"^(time|clock|gettimeofday|clock_gettime|rand|srand|random|srandom|rand_r)$"),
     "The host's clock and random numbers are not the GPU's: use clock64() for a cycle count, and pass random "
     "numbers (or a seed for a hash) in a buffer."),
]
_STD_HINT = ("The C++ standard library's containers and strings (std::vector, std::string, std::map...) are host "
             "code: use a fixed-size local array, shared memory or a buffer argument.")


@functools.cache
def _exports(library: str) -> frozenset:
    """The functions a shared library this process loaded exports (libm: the C math API device code
    has; libgcc_s: the compiler's own helpers, such as a 64-bit popcount)."""
    path = None
    try:
        for line in Path("/proc/self/maps").read_text().splitlines():
            if re.search(rf"/{library}[.-][^/]*\.so|/{library}\.so", line):
                path = line.split()[-1]
                break
    except OSError:
        pass
    if not path:
        return frozenset()
    r = subprocess.run(["nm", "-D", "--defined-only", path], capture_output=True, text=True)
    return frozenset(ln.split()[-1].split("@")[0] for ln in r.stdout.splitlines() if ln.strip())


def _libm_exports() -> frozenset:
    return frozenset(n for n in _exports("libm") if not n.startswith("fe"))   # fenv: the thread's rounding and traps


def _allowed(sym: str) -> bool:
    return (sym in _ALLOWED or sym.startswith(_ALLOWED_PREFIXES) or sym in _libm_exports()
            or sym in _exports("libgcc_s"))


def _undefined(so: Path) -> list[tuple[str, str]]:
    """(symbol, demangled) for each function the library leaves to others."""
    raw = subprocess.run(["nm", "-D", "--undefined-only", str(so)], capture_output=True, text=True).stdout.split("\n")
    nice = subprocess.run(["nm", "-D", "-C", "--undefined-only", str(so)], capture_output=True, text=True).stdout.split("\n")
    out = []
    for a, b in zip(raw, nice):
        a, b = a.strip(), b.strip()
        if not a:
            continue
        sym = a.split()[-1].split("@")[0]
        pretty = b.split(None, 1)[-1].rsplit("@", 1)[0] if " " in b else sym
        out.append((sym, pretty))
    return out


def _sites(so: Path, symbols: set) -> dict:
    """symbol -> the addresses in the library's code that call or take it."""
    r = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(so)], capture_output=True, text=True)
    found: dict = {}
    for line in r.stdout.splitlines():
        m = re.match(r"\s*([0-9a-f]+):\s+\S.*<([^>@+]+)(?:@[^>]*)?>", line)
        if m and m.group(2) in symbols and not line.rstrip().endswith(">:"):
            found.setdefault(m.group(2), []).append(int(m.group(1), 16))
    return found


def _line_of(so: Path, address: int, src: Source, include_dir: Path) -> str | None:
    """The student's line an instruction belongs to: the innermost inlined frame in the kernel's own
    files (its path or its includes), else the innermost outside convlab's and the system's headers."""
    r = subprocess.run(["addr2line", "-i", "-e", str(so), hex(address)], capture_output=True, text=True)
    frames = []
    for fr in r.stdout.splitlines():
        path, _, line = fr.split(" (discriminator")[0].strip().rpartition(":")
        if path and path != "??" and line.isdigit() and line != "0":
            frames.append((path, line))
    own = {str(src.path), *(str(p) for p in src.includes)}
    for path, line in frames:
        if path in own:
            return where(path, line)
    for path, line in frames:
        if not path.startswith((str(include_dir), "/usr/")) and not path.startswith("<"):
            return where(path, line)
    return None


def check_host_calls(so: Path, src: Source, include_dir: Path) -> None:
    """Refuse a module that calls a function a GPU does not have, naming the call and its line."""
    bad = [(s, p) for s, p in _undefined(so) if not _allowed(s)]
    if not bad:
        return
    sites = _sites(so, {s for s, _ in bad})
    lines = []
    for sym, pretty in bad:
        at = [_line_of(so, a, src, include_dir) for a in sites.get(sym, [])]
        at = sorted({a for a in at if a})
        hint = next((h for rx, h in _HINTS if rx.match(sym)), _STD_HINT if "std::" in pretty else "")
        where_ = f" at {', '.join(at[:3])}" if at else ""
        lines.append(f"`{pretty}`{where_} is a host function: device code cannot call it (nvcc: calling a __host__ "
                     f"function from a __global__ function is not allowed). {hint}".rstrip())
    raise CompileError(f"{display_name(src.path)}: device code calls the host:\n" + "\n".join(lines))


# ---- the kernel's own host functions ------------------------------------------------------------

_NOT_FUNCTIONS = {"if", "for", "while", "switch", "return", "sizeof", "alignof", "decltype", "catch", "static_assert",
                  "defined", "__attribute__", "__launch_bounds__", "__align__", "alignas", "template", "operator"}


def _blank_preprocessor(clean: str) -> str:
    """Preprocessor lines (with their continuations) as blanks, every offset kept."""
    out, cont = [], False
    for line in clean.split("\n"):
        if cont or line.lstrip().startswith("#"):
            cont = line.rstrip().endswith("\\")
            out.append(" " * len(line))
        else:
            out.append(line)
    return "\n".join(out)


def _definitions(clean: str):
    """(name, is_device, body_start, body_end, line) of each function defined at namespace scope."""
    depth, d, opens = [0] * (len(clean) + 1), 0, []
    transparent = {m.end() - 1 for m in re.finditer(r"\bnamespace\b[^{;]*\{|extern\s*\"C\"\s*\{", clean)}
    for i, ch in enumerate(clean):
        depth[i] = d
        if ch == "{":
            opens.append(i in transparent)
            d += 0 if i in transparent else 1
        elif ch == "}" and opens:
            d -= 0 if opens.pop() else 1
    for m in re.finditer(r"\b([A-Za-z_]\w*)\s*\(", clean):
        name = m.group(1)
        if name in _NOT_FUNCTIONS or depth[m.start()] != 0:
            continue
        close = _matching_paren(clean, m.end() - 1)
        if close < 0:
            continue
        tail = re.match(r"(?:\s|const\b|noexcept\b|volatile\b|override\b|&|->\s*[\w:<>,\s*&]+?)*\{", clean[close + 1:close + 400])
        if not tail:
            continue
        start = close + tail.end()          # the body's `{`
        body_end, k = start, 0
        for j in range(start, len(clean)):
            k += (clean[j] == "{") - (clean[j] == "}")
            if k == 0:
                body_end = j
                break
        head_from = max(clean.rfind(c, 0, m.start()) for c in ";}{")
        head = clean[head_from + 1:m.start()]
        device = bool(re.search(r"\b__(device|global)__\b", head))
        yield name, device, start, body_end, clean.count("\n", 0, m.start()) + 1


def check_host_functions(src: Source) -> None:
    """A kernel or __device__ function of the file that calls a function the file defines without
    __device__ (a host function, for nvcc): refused, with both lines."""
    clean = _blank_preprocessor(strip_comments(src.text))
    defs = list(_definitions(clean))
    device_names = {n for n, dev, *_ in defs if dev}
    host = {n: line for n, dev, _, _, line in defs if not dev and n not in device_names}
    if not host:
        return
    problems = []
    for name, dev, lo, hi, _ in defs:
        if not dev:
            continue
        for m in re.finditer(r"(?<![\w.>:])(" + "|".join(map(re.escape, host)) + r")\s*\(", clean[lo:hi]):
            line = clean.count("\n", 0, lo + m.start()) + 1
            callee = m.group(1)
            problems.append(f"{where(src.path, line)}: `{name}` calls `{callee}`, a host function (defined at "
                            f"{where(src.path, host[callee])} without __device__): nvcc refuses it (calling a __host__ "
                            f"function from a __device__ function is not allowed). Add __device__ to `{callee}`'s "
                            f"definition (or __host__ __device__ to use it on both sides).")
    if problems:
        raise CompileError(f"{display_name(src.path)}: device code calls the host:\n" + "\n".join(problems))


# ---- the C++ standard library ------------------------------------------------------------------

# What of namespace std device code has (nvcc without --expt-relaxed-constexpr): types and traits,
# which compile to nothing, and the math functions CUDA's headers overload for the device.
_STD_TYPES = re.compile(r"(is_\w+|enable_if\w*|conditional\w*|remove_\w+|add_\w+|decay\w*|common_type\w*|"
                        r"integral_constant|true_type|false_type|make_(un)?signed\w*|underlying_type\w*|"
                        r"size_t|ptrdiff_t|nullptr_t|u?int(8|16|32|64)_t|u?intptr_t|max_align_t|byte)$")
_STD_MATH = re.compile(r"(abs|fabs|sqrt|cbrt|exp|exp2|expm1|log|log2|log10|log1p|pow|sin|cos|tan|asin|acos|atan|atan2|"
                       r"sinh|cosh|tanh|asinh|acosh|atanh|floor|ceil|round|trunc|rint|nearbyint|lround|llround|fmod|"
                       r"remainder|fma|fmin|fmax|fdim|hypot|erf|erfc|tgamma|lgamma|frexp|ldexp|modf|scalbn|ilogb|logb|"
                       r"copysign|nextafter|isnan|isinf|isfinite|signbit)f?$")


def check_std_library(src: Source) -> None:
    """std:: in device code: the containers, strings, streams, algorithms and smart pointers are
    host code for nvcc (and std::min, std::swap, std::numeric_limits' functions are constexpr host
    functions, which nvcc refuses in device code too). Refused with the line."""
    problems = []
    for path, text in [(src.path, src.text), *((p, p.read_text(errors="replace")) for p in src.includes)]:
        clean = strip_comments(text)
        for m in re.finditer(r"\bstd\s*::\s*(\w+)", clean):
            name = m.group(1)
            if _STD_TYPES.match(name) or _STD_MATH.match(name):
                continue
            problems.append(f"{where(path, clean.count(chr(10), 0, m.start()) + 1)}: `std::{name}` is host code: "
                            f"nvcc refuses it in device code (a __host__ function, or a class whose member "
                            f"functions are). {_STD_HINT}")
    if problems:
        raise CompileError(f"{display_name(src.path)}: device code uses the host's C++ library:\n"
                           + "\n".join(dict.fromkeys(problems)))
