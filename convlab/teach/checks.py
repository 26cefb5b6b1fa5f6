"""The exercise checks every chapter uses, on the verdict core (convlab.teach.verdict): they print
a verdict a student can act on and never raise. A chapter's own checks are in its module
(convlab.chapters), built on these.

    import convlab.teach.checks as ex
    ex.check_kernel(launch)          # launch(x, w, y, stride, pad) runs your kernel into y
    ex.check_kernel(launch, fp16="float", locate=where)   # half in and out; who computed a wrong output
    ex.check_function(conv2d_numpy)  # conv2d_numpy(x, w, stride, pad) returns y (numpy)
    ex.check_value("FLOPs", flops, expected)
    ex.check_prediction("sectors per request", predicted, measured)   # {case: number} each
    ex.attempt(fn, *args)            # fn's result, or None after printing its fault

Every launch runs checked (checked_launch): on the emulator under the race detector and a time
limit, so a missing __syncthreads() or atomicAdd fails every time, and outputs start poisoned with
NaN (cl.empty). The emulator's fault messages (cl.ConvlabError subclasses: out of range, races,
barriers, timeouts, each at its source line) are told as they are, but for two threads that store
to one element at one line, told as an index to fix, not a barrier to add. "not done yet" only
while a TODO stub that scripts/make_exercises.py left (`TODO: … (about N lines)`) is still in the
code the check runs (the launch function, the functions and %%cuda modules it uses); written code
that writes nothing is told so. Every check returns a Verdict, true when right, so a notebook (or
a test) can go on either way; it shows nothing itself in a notebook, the printed line says it all.
"""
from __future__ import annotations

import dis
import inspect
import math
import re
import traceback
from dataclasses import dataclass

import convlab as cl

from ..gpu import emu
from ..measuring.workloads import Workload
from ..ops.fp16 import fp16_tolerance
from .verdict import NOTHING, Verdict, as_numpy, poison_mask, verdict


#: The emulator's time limit for a launch inside a check (cl.set_timeout overrides it): the checks'
#: shapes run in well under a second with the race detector, so a kernel that hangs fails fast.
CHECK_TIMEOUT_S = 5.0


def Shape(B: int, C: int, M: int, H: int, W: int, K: int, stride: int = 1, pad: int = 0, why: str = "",
          dilation: int = 1, groups: int = 1) -> Workload:
    """One convolution to check, as the course's one shape type: input (B, C, H, W), mask
    (M, C/groups, K, K), stride, padding `pad`, dilation, groups; `why` (the Workload's note) says
    which mistake the shape catches."""
    return Workload("", B=B, C=C, M=M, H=H, W=W, K=K, stride=stride, padding=pad, note=why, dilation=dilation,
                    groups=groups)


#: Shapes that catch the usual mistakes: sizes no multiple of a block, C=1, B=1, odd and even K,
#: stride 2, padding. Small enough for the emulator.
AWKWARD_SHAPES = [
    Shape(1, 1, 1, 5, 5, 3, why="the smallest: B=1, C=1, M=1"),
    Shape(2, 3, 4, 17, 19, 5, why="not a multiple of a 16×16 block, H≠W, odd K"),
    Shape(3, 2, 5, 20, 13, 4, why="even K"),
    Shape(2, 1, 3, 23, 18, 3, stride=2, why="stride 2, C=1"),
    Shape(1, 4, 2, 16, 16, 3, pad=1, why="same padding, B=1"),
    Shape(2, 2, 3, 21, 15, 5, stride=2, pad=2, why="stride 2 and padding"),
]


#: The shapes without padding (chapter 1's loop nest takes a stride but no padding).
VALID_SHAPES = [s for s in AWKWARD_SHAPES if s.padding == 0]


def describe_error(e: BaseException) -> str:
    """A fault as a student should read it: convlab's own messages whole, other errors in one line
    with the line of the notebook cell where they happened."""

    if isinstance(e, cl.ConvlabError):
        return f"{type(e).__name__}: {e}"
    frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename.startswith("<ipython-input")
              or "ipykernel" in f.filename]
    where = f" (cell line {frames[-1].lineno})" if frames else ""
    return f"your code raised {type(e).__name__}: {e}{where}"


def attempt(fn, *args, **kwargs):
    """Run fn; print a fault instead of raising it. Returns fn's result, or None after a fault."""
    try:
        return fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 (a check must never stop the notebook)
        print(describe_error(e))
        return None


def _rebinds(fn, index: int) -> str | None:
    """The name of fn's parameter `index` when fn's code assigns to it (`y = ...` rebinds the name
    and leaves the caller's tensor as it was), else None."""
    code = getattr(fn, "__code__", None)
    if code is None or code.co_argcount <= index:
        return None
    name = code.co_varnames[index]
    for ins in dis.get_instructions(code):
        if ins.opname in ("STORE_FAST", "STORE_DEREF") and ins.argval == name:
            return name
    return None


#: The stub scripts/make_exercises.py leaves where a solution was: `// TODO: hint (about N lines)`,
#: wrapped over comment lines that continue it.
_TODO_STUB = re.compile(r"(?://|#)[ \t]*TODO:(?:[^\n]|\n[ \t]*(?://|#)[ \t])*?"
                        r"\(about(?:\s|//|#)+\d+(?:\s|//|#)+lines?\)")


def todo_left(run) -> str | None:
    """Where an exercise's TODO stub is still in the code a check runs: the function itself, the
    functions it calls and the %%cuda modules (or their kernels) it names, through its globals
    and closure. None when no stub is left (the code was written, right or wrong)."""

    seen: set[int] = set()

    def visit(obj, depth: int) -> str | None:
        if id(obj) in seen or depth > 3:
            return None
        seen.add(id(obj))
        if isinstance(obj, cl.Kernel):
            obj = obj.module
        if isinstance(obj, cl.Module):
            m = _TODO_STUB.search(obj.src.text)
            if m:
                line = obj.src.text.count("\n", 0, m.start()) + 2      # + the %%cuda line
                return f"the TODO in cell {obj.path.stem}, line {line}"
            return None
        code = getattr(obj, "__code__", None)
        if code is None:
            func = getattr(obj, "func", None)                           # functools.partial
            return visit(func, depth + 1) if func is not None else None
        try:
            lines, first = inspect.getsourcelines(obj)
        except (OSError, TypeError):
            lines, first = [], 0
        m = _TODO_STUB.search("".join(lines))
        if m:
            line = first + "".join(lines).count("\n", 0, m.start())
            return f"the TODO in {getattr(obj, '__name__', 'your function')}, line {line} of its cell"
        names = [getattr(obj, "__globals__", {}).get(n) for n in code.co_names]
        cells = [c.cell_contents for c in (getattr(obj, "__closure__", None) or ()) if _filled(c)]
        for value in names + cells:
            if value is not None and (callable(value) or isinstance(value, cl.Module)):
                found = visit(value, depth + 1)
                if found:
                    return found
        return None

    return visit(run, 0)


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def nothing_text(run, text: str, *, out_index: int | None) -> str:
    """An output with nothing in it: "not done yet" while a TODO stub is left, else what writes nothing."""
    todo = todo_left(run)
    if todo:
        return f"not done yet: {todo} is still there, and nothing was computed into the output"
    rebound = _rebinds(run, out_index) if out_index is not None else None
    if rebound:
        return (f"✗ none of the outputs was written: your launch function assigns to `{rebound}` "
                f"(`{rebound} = ...`), which only makes the name point at a new tensor inside the function; "
                f"the checked tensor stays as it was. Write into it instead: `{rebound}.copy_(...)` or "
                f"`{rebound}[...] = ...`")
    return f"✗ {text}"


def fault_text(run, error: str) -> str:
    todo = todo_left(run)
    return f"not done yet: {todo} is still there (running the code as it is: {error})" if todo else error


def checked_launch(call):
    """Run a student's launch under the race detector and the checks' time limit; its result."""

    with cl.detect_races(True), cl.time_limit(CHECK_TIMEOUT_S):
        out = call()
    cl.sync()  # a GPU launch is asynchronous: its faults show here
    return out


def say(ok: bool, text: str) -> Verdict:
    print(text)
    return Verdict(ok, text)


def unfinished(todo) -> Verdict | None:
    """"not done yet" while the code a check was given (todo=: a module, kernel or function) still
    holds its TODO stub, else None."""
    where = todo_left(todo) if todo is not None else None
    return say(False, f"not done yet: {where} is still there") if where else None


@dataclass
class Case:
    """One run of a check: what it is (for the verdict), its call, its output tensor and reference."""
    text: str
    why: str
    call: object                 # () -> the student's result (a tensor used instead of out, or None)
    out: object
    ref: object
    mistakes: object = None      # (what, make) pairs, or None
    bound: dict | None = None    # rtol=, atol= for verdict
    inputs: tuple | None = None  # conv2d's (x, w, stride, pad): verdict's own mistakes
    locate: object = None


def run_cases(run, cases, *, name: str, labels: str = "bmhw", out_index: int | None = 2,
               passed: str, nothing_hint: dict | None = None, explain=None) -> Verdict:
    """The checks' common path: each case run (faults printed, never raised), judged against its
    reference and the common mistakes; the first failure is the verdict. nothing_hint: {words of
    the first clause of verdict's text for an empty output: what to add} for the operation's own
    causes. explain(e) -> text (or ""): the operation's own reading of a fault, added under the
    fault's message."""
    import torch

    cases = list(cases)
    for i, case in enumerate(cases):
        before = f"\n  ({i} shape{'s' if i > 1 else ''} before it passed)" if i else ""
        try:
            result = checked_launch(case.call)
        except Exception as e:  # noqa: BLE001 (a check must never stop the notebook)
            text = fault_text(run, describe_error(e))
            if text.startswith("not done"):
                return say(False, text)
            why = explain(e) if explain is not None else ""
            why = f"\n  → {why}" if why else ""
            return say(False, f"✗ {case.text}: {text}{_read_on(e, case, labels)}{why}")
        out = result if isinstance(result, torch.Tensor) and out_index is not None else case.out
        ok, text = verdict(out, case.ref, labels=labels, inputs=case.inputs, mistakes=case.mistakes,
                           locate=case.locate, **(case.bound or {}))
        if not ok and text.startswith(NOTHING):
            hint = next((h for words, h in (nothing_hint or {}).items() if words in text.split(": ")[0]), "")
            text = nothing_text(run, text, out_index=out_index)
            if text.startswith("not done"):
                return say(False, text)
            # "nothing written" asks whether the kernel stores at all: where it stores on a larger
            # case, that case's verdict says what is wrong instead
            later = _first_written(cases[i + 1:], labels) if text.startswith("✗ none of") else None
            if later is not None:
                other, verdict_text = later
                return say(False, f"✗ {case.text}: nothing was written, though on {other.text} some outputs are; "
                                   f"there: {verdict_text}")
            return say(False, f"{text[:2]}{case.text}: {text[2:]}{hint}")
        if not ok:
            why = f" ({case.why})" if case.why else ""
            return say(False, f"✗ {case.text}{why}: {text}{before}")
    return say(True, f"✓ correct: {name} {passed}")


def _first_written(cases, labels: str):
    """The first of cases where the launch writes some outputs, and verdict's text there (a fault
    ends the search): (case, text), or None."""
    for case in cases:
        try:
            checked_launch(case.call)
        except Exception:  # noqa: BLE001 (the first case's verdict stands)
            return None
        ok, text = verdict(case.out, case.ref, labels=labels, inputs=case.inputs, mistakes=case.mistakes,
                           locate=case.locate, **(case.bound or {}))
        if not ok and not text.startswith(NOTHING):
            return case, text
    return None


def _read_on(e: BaseException, case: Case, labels: str) -> str:
    """After the emulator stopped a read of a static __shared__ array past one of its dimensions
    (Bs[0][64] of Bs[8][64]), what the outputs are when it reads on into the array as a GPU does:
    run once more so, the verdict names which outputs that read made wrong and how ("" when it
    still faults, or comes out right)."""
    import torch


    if cl.backend() != "emu" or not isinstance(e, cl.OutOfBoundsError) or " of dimension " not in str(e):
        return ""
    try:
        case.out.fill_(float("nan"))
        with emu.flat_shared():
            checked_launch(case.call)
    except Exception:  # noqa: BLE001 (the fault above is the verdict)
        return ""
    # outputs that read past the whole array (NaN bytes there) are told apart from the rest
    past = poison_mask(case.out)
    got = case.out.detach().cpu().clone()
    if past is not None and past.any():
        got[torch.from_numpy(past)] = torch.as_tensor(as_numpy(case.ref)).to(got.dtype)[torch.from_numpy(past)]
    ok, text = verdict(got, case.ref, labels=labels, inputs=case.inputs, mistakes=case.mistakes,
                       locate=case.locate, **(case.bound or {}))
    n_past = int(past.sum()) if past is not None else 0
    more = f"\n  ({n_past} more outputs read past the array's end)" if n_past else ""
    if ok or text.startswith(NOTHING):
        return ""
    return (f"\n  On a GPU that index reads on into the array's next row; run so, the rest of the outputs are "
            f"{text}{more}")


def conv2d_cases(run, shapes, *, fp16: str | None, locate):
    import torch


    for shape in shapes:
        x = cl.randn(shape.B, shape.C, shape.H, shape.W)
        w = cl.randn(shape.M, shape.C, shape.K, shape.K)
        ref = cl.ref.conv2d(x, w, stride=shape.stride, padding=shape.padding)
        y = cl.empty(shape.B, shape.M, shape.Ho, shape.Wo, dtype=torch.float16 if fp16 else torch.float32)
        xk, wk = (x.half(), w.half()) if fp16 else (x, w)
        bound = None
        if fp16 is not None:

            rtol, atol_rms = fp16_tolerance(shape.C, shape.K, fp16)
            bound = {"rtol": rtol, "atol": atol_rms * float(ref.double().pow(2).mean().sqrt())}
        where = (lambda index, shape=shape: locate(shape, index)) if locate is not None else None
        yield Case(str(shape), shape.note,
                    lambda xk=xk, wk=wk, y=y, shape=shape: run(xk, wk, y, shape.stride, shape.padding),
                    y, ref, bound=bound, inputs=(x, w, shape.stride, shape.padding), locate=where)


def _same_in_every_order(launch) -> bool:
    """The emulator's race test (cl.find_race: the launch with each block's threads in three
    orders) on one awkward shape; prints what differs, or a fault, and says whether it passed."""

    if cl.backend() != "emu":
        return True
    x, w = cl.randn(2, 3, 21, 19), cl.randn(4, 3, 5, 5)
    y = cl.empty(2, 4, 17, 15)
    try:
        race = cl.find_race(lambda: launch(x, w, y, 1, 0), y)
    except Exception as e:  # noqa: BLE001 (a check must never stop the notebook)
        text = fault_text(launch, describe_error(e))
        print(text if text.startswith("not done") else f"✗ {text}")
        return False
    if race:
        print(f"✗ {race}")
        return False
    return True


def check_kernel(launch, shapes=None, *, name: str = "your kernel", fp16: str | None = None,
                 locate=None, thread_orders: bool = False) -> Verdict:
    """launch(x, w, y, stride, pad) runs a kernel on fresh random x, w (on the backend's device)
    into y, which starts poisoned with NaN. Prints a verdict; True when right on every shape.

    fp16="float" or "half" (how the kernel adds up): x, w and y are half, and the output is held
    to chapter 6's bound for that accumulation (fp16.fp16_tolerance) instead of fp32's.
    locate(shape, (b, m, h, w)) -> text: who computes that output (a thread, a warp, a register
    of its tile), said with the first wrong or unwritten output. thread_orders (emulator): first
    run the launch with each block's threads in three orders (cl.find_race), which finds a
    missing barrier even where the race detector's one order does not."""
    if fp16 not in (None, "half", "float"):
        raise ValueError("fp16 is 'half' or 'float' (how the kernel adds up), or None for float32")
    shapes = list(AWKWARD_SHAPES if shapes is None else shapes)
    if thread_orders and not _same_in_every_order(launch):
        return Verdict(False, "a race")
    within = "is within the fp16 bound of" if fp16 is not None else "matches"
    return run_cases(launch, conv2d_cases(launch, shapes, fp16=fp16, locate=locate), name=name,
                      passed=f"{within} the fp64 reference on all {len(shapes)} shapes (awkward sizes, C=1, "
                             f"B=1, odd and even K, stride 2, padding)")


def check_function(fn, shapes=None, *, name: str = "your function") -> Verdict:
    """fn(x, w, stride, pad) takes numpy float32 arrays and returns y. Prints a verdict."""

    shapes = list(AWKWARD_SHAPES if shapes is None else shapes)
    for i, shape in enumerate(shapes):
        x, w = cl.randn(shape.B, shape.C, shape.H, shape.W), cl.randn(shape.M, shape.C, shape.K, shape.K)
        ref = cl.ref.conv2d(x, w, stride=shape.stride, padding=shape.padding)
        try:
            y = fn(x.cpu().numpy(), w.cpu().numpy(), shape.stride, shape.padding)
        except Exception as e:  # noqa: BLE001
            text = fault_text(fn, describe_error(e))
            return say(False, text if text.startswith("not done") else f"✗ {shape}: {text}")
        if y is None:
            todo = todo_left(fn)
            return say(False, f"not done yet: {todo} is still there" if todo else
                               f"✗ {name} returned None for {shape}: does it end with `return y`?")
        ok, text = verdict(y, ref, inputs=(x, w, shape.stride, shape.padding))
        if not ok:
            before = f"\n  ({i} shape{'s' if i > 1 else ''} before it passed)" if i else ""
            return say(False, f"✗ {shape} ({shape.note}): {text}{before}")
    return say(True, f"✓ correct: {name} matches the fp64 reference on all {len(shapes)} shapes "
                      f"(awkward sizes, C=1, B=1, odd and even K, stride 2, padding)")


def check_value(name: str, got, expected, *, rel: float = 1e-9) -> Verdict:
    """A number (or a collection of them) against the expected one; says how far off, not the answer."""
    if got is None:
        return say(False, f"not done yet: {name} is None")
    if isinstance(expected, (set, frozenset, list, tuple)):
        if isinstance(got, (str, bytes)) or not hasattr(got, "__iter__"):
            return say(False, f"✗ {name}: expected a list, got {type(got).__name__}")
        got_items, want_items = set(map(str, got)), set(map(str, expected))
        if got_items == want_items:
            return say(True, f"✓ correct: {name}")
        hints = []
        if want_items - got_items:
            hints.append(f"{len(want_items - got_items)} missing")
        if got_items - want_items:
            hints.append(f"{len(got_items - want_items)} that should not be there")
        return say(False, f"✗ {name}: {', '.join(hints)}")
    try:
        g, e = float(got), float(expected)
    except (TypeError, ValueError):
        return say(False, f"✗ {name}: expected a number, got {type(got).__name__}")
    if math.isnan(g):
        return say(False, f"✗ {name} is NaN: it was computed from a value that was never written "
                           f"(an output still NaN, or shared memory no thread wrote)")
    if math.isclose(g, e, rel_tol=rel, abs_tol=0.0):
        return say(True, f"✓ correct: {name} = {got:,}" if isinstance(got, int) else f"✓ correct: {name} = {g:.6g}")
    if e == 0:
        return say(False, f"✗ {name} = {g:,.6g}, but it should be 0")
    return say(False, f"✗ {name} = {g:,.6g} is off by a factor of {g / e:.3g}: "
                       f"recount (which factor is missing or extra?)")


def check_prediction(what: str, predicted: dict, measured: dict, *, rel: float = 1e-9) -> Verdict:
    """Predictions (case -> number) against what the profiler measured for the same cases: says which
    cases differ and by how much, so the reasoning can be revisited."""
    if predicted is None or any(v is None for v in predicted.values()):
        return say(False, f"not done yet: fill in every predicted {what}")
    missing = [k for k in measured if k not in predicted]
    if missing:
        return say(False, f"✗ no prediction of {what} for {', '.join(map(str, missing))}")
    wrong = []
    for case, got in measured.items():
        try:
            p = float(predicted[case])
        except (TypeError, ValueError):
            return say(False, f"✗ {what} for {case}: expected a number, got {type(predicted[case]).__name__}")
        if not math.isclose(p, float(got), rel_tol=rel, abs_tol=0.0):
            wrong.append(f"{case}: you predicted {p:g}, the profiler counted {float(got):g}")
    if wrong:
        return say(False, f"✗ {what}: " + "; ".join(wrong))
    return say(True, f"✓ correct: every predicted {what} matches the profiler ({len(measured)} cases)")


def check_answer(answers: dict, key: str, got, *args) -> Verdict:
    """An exercise's number (or list) against the answer its chapter's module keeps in `answers`
    ({key: (what the verdict calls it, answer(*args))}), so the exercise page never shows it; a
    chapter binds its own: ch3.check_answer("03.reuse", reuse). args go to the answer (a
    workload's name). Says how far off, never the answer."""
    what, answer = answers[key]
    return check_value(what.format(*args), got, answer(*args))
