"""Warm-up puzzles: small kernels written in a %%cuda cell, checked at once on the emulator.

    import convlab.teach.puzzles as pz
    pz.check("map", add_ten)          # the %%cuda cell's module (or one of its kernels)
    pz.PUZZLES["map"].chapter         # every puzzle: name, chapter, kernel, what it checks

check launches the kernel on small awkward sizes with its outputs poisoned (NaN; 0 where the
kernel adds into them), the race detector on, compares every output with a numpy reference, and prints one verdict: "✓ correct",
"not done yet" (the untouched stub writes nothing), a named mistake (only the first block
written, the halo never loaded, B read transposed, ...), the emulator's own fault message
(out of bounds, race, barrier, warp mask: each with its line) with what it usually means in
this puzzle, or a counter over its target (sectors per request, bank conflicts) from the
emulator's profile. Where a picture helps it draws what the kernel touched (cl.draw).
Expected values live in convlab.teach.puzzle_set, never in the notebook. A check never raises; it returns a Verdict
(true when right).
"""
from __future__ import annotations

import numpy as np
import torch

import convlab as cl

from .checks import checked_launch, describe_error
from .puzzle_set import PUZZLES, Launch, Puzzle, never_written
from .verdict import Verdict, poison_mask


def _say(ok: bool, text: str) -> Verdict:
    print(text)
    v = Verdict(ok, text)
    v.figure = None   # the picture shown with it, if any
    return v


def _kernel_of(puzzle: Puzzle, kernel):
    """The Kernel to check from what the notebook holds: a Module (the %%cuda cell's name) or a
    Kernel; a cell that did not compile raises its own CellNotCompiled when used."""
    if isinstance(kernel, cl.Module):
        if puzzle.kernel not in kernel.kernels:
            raise cl.ConvlabError(f"the cell has no __global__ function `{puzzle.kernel}` (it has "
                                  f"{', '.join(kernel.kernels) or 'none'}): keep the stub's name")
        return kernel.kernel(puzzle.kernel)
    if hasattr(kernel, "kernel") and not hasattr(kernel, "module"):   # a cell that did not compile
        return kernel.kernel(puzzle.kernel)
    return kernel


def _launch(kernel, case: Launch) -> None:
    for name, values in case.constants.items():
        kernel.module.set_constant(name, torch.from_numpy(np.asarray(values)))
    checked_launch(lambda: kernel(*case.args, grid=case.grid, block=case.block))


def _at(case: Launch, shape, flat: int) -> str:
    index = np.unravel_index(flat, shape)
    names = case.index.split(",") if len(shape) == len(case.index.split(",")) else ["i"] * len(shape)
    return "[" + "][".join(f"{n}={int(i)}" for n, i in zip(names, index)) + "]"


def _compare(puzzle: Puzzle, case: Launch, name: str, got: np.ndarray) -> tuple[str, str | None]:
    """('right' | 'untouched' | 'wrong', text for wrong)."""
    want = case.want[name]
    never = never_written(got)
    if not np.where(never, 0, got).any() and want.any():
        return "untouched", None
    g, w = got.astype(np.float64), want.astype(np.float64)
    scale = float(np.sqrt(np.mean(w ** 2))) if w.size else 0.0
    bad = never | ~np.isfinite(g) | (np.abs(g - w) > puzzle.rtol * (np.abs(w) + scale))
    if not bad.any():
        return "right", None
    for text, test in puzzle.mistakes:
        try:
            if test(case, got):
                return "wrong", text
        except Exception:  # noqa: BLE001 (a diagnosis that does not apply to this output)
            pass
    poison = poison_mask(got)
    if poison is not None and poison.any():
        first = int(np.flatnonzero(poison)[0])
        return "wrong", (f"{int(poison.sum())} of {got.size} elements of {name} were computed from __shared__ "
                         f"memory that no thread wrote (the emulator fills it with NaN for each block), the first "
                         f"at {_at(case, got.shape, first)}: does the load cover the whole tile"
                         f"{', halo included' if puzzle.halo else ''}, and does each thread read a cell "
                         f"that was written?")
    first = int(np.flatnonzero(bad)[0])
    if never.any():
        first_never = int(np.flatnonzero(never)[0])
        return "wrong", (f"{int(never.sum())} of {got.size} elements of {name} never written, the first at "
                         f"{_at(case, got.shape, first_never)}: does every element get a thread?")
    return "wrong", (f"{name}{_at(case, got.shape, first)} is {g.flat[first]:.6g}, expected {w.flat[first]:.6g} "
                     f"({int(bad.sum())} of {got.size} wrong)")


def _fault_kind(e: BaseException) -> str:
    """Which of a puzzle's advices a fault's premise fits: its class name, with " shared" for an
    out-of-range access to a __shared__ array (the advices of "OutOfBoundsError" are about the
    kernel's arguments), and "RaceError stores" for two threads storing to one element (the
    advices of "RaceError" are about a read against a write)."""
    kind, msg = type(e).__name__, str(e)
    if isinstance(e, cl.OutOfBoundsError) and "__shared__ " in msg.split(" by thread")[0]:
        return kind + " shared"
    if isinstance(e, cl.RaceError) and " reads it" not in msg.split(", and nothing orders")[0]:
        return kind + " stores"
    return kind


def _counters(puzzle: Puzzle, kernel, case: Launch):
    """Lines over the puzzle's counter targets: [(view, line, text)] from the emulator's profile."""
    lines = cl.profile(kernel, *case.args, grid=case.grid, block=case.block).lines()
    over = []
    for (where, access), row in lines.iterrows():
        number = where.rsplit(":", 1)[-1].rsplit(" ", 1)[-1]
        if puzzle.sectors_max is not None and access.startswith("global") and row["sectors per request"] is not None \
                and row["sectors per request"] > puzzle.sectors_max:
            over.append(("sectors", int(number), f"the {access} at {where} takes {row['sectors per request']:.3g} "
                         f"sectors per request (at most {puzzle.sectors_max:g}: a warp's 32 floats in a row "
                         f"are 4 sectors of 32 bytes): neighbouring threads (threadIdx.x) must touch "
                         f"neighbouring addresses"))
        if puzzle.conflicts_max is not None and access.startswith("shared") and row["bank conflicts"] is not None \
                and row["bank conflicts"] > puzzle.conflicts_max:
            ways = row["wavefronts per request"]
            why = ("the lanes of a warp read one column of the tile, 32 floats apart, all in one bank. One float "
                   "of padding per row spreads a column over all 32 banks" if ways >= 16 else
                   "the lanes of a warp read one column of the tile, and some of its words share a bank: a row "
                   "length with a factor in common with the 32 banks (an even one) puts a column's words in the "
                   "same banks again and again. A row of TILE + 1 floats, odd, gives each word of a column its "
                   "own bank")
            over.append(("banks", int(number), f"the {access} at {where} has {int(row['bank conflicts']):,} bank "
                         f"conflicts ({ways:.3g} wavefronts per request; 0 is the target): {why}"))
    return over


def _show(fig, caption: str):
    """Display a picture in a notebook under a one-line caption; None outside one."""
    import matplotlib.pyplot as plt

    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        get_ipython = None
    if get_ipython is not None and get_ipython() is not None:
        print(caption)   # before the picture: the page merges printed lines into one block above it
        display(fig)
    plt.close(fig)
    return fig


def _picture(kernel, case: Launch, keywords: dict, line=None):
    """cl.draw of one case; line: the source line (its number or text in it) for sectors and banks."""
    import matplotlib.pyplot as plt

    kw = dict(keywords, **({"line": line} if line is not None else {}))
    kw.pop("case", None)
    height = kw.pop("height", None)   # a figure this many inches high, for a tile of a row or two
    if height is not None and kw["what"] in ("threads", "shared"):
        kw["ax"] = plt.subplots(figsize=(7.5, height), dpi=110)[1]
    return cl.draw(kernel, *case.args, grid=case.grid, block=case.block, **kw)


_CAPTIONS = {
    "threads": "Below: each output cell coloured by the warp of the thread that wrote it, numbered by thread.",
    "shared": "Below: the block's __shared__ tile, each cell coloured by the warp that wrote it last.",
    "sectors": "Below: one warp's request: each lane's bytes, coloured by their 32-byte sector.",
    "banks": "Below: one warp's shared-memory request: each lane by bank; red banks hold several words.",
}


def check(name: str, kernel, *, draw: bool = True) -> Verdict:
    """Check puzzle `name` with the kernel of a %%cuda cell (its module or the Kernel). Prints one
    verdict and returns it (true when right); draw=False: no picture."""
    puzzle = PUZZLES.get(name)
    if puzzle is None:
        return _say(False, f"no puzzle named {name!r}; the puzzles: {', '.join(PUZZLES)}")
    try:
        kern = _kernel_of(puzzle, kernel)
    except Exception as e:  # noqa: BLE001 (a check never stops the notebook)
        return _say(False, f"✗ {describe_error(e)}")
    cases = puzzle.cases()
    untouched = 0
    for i, case in enumerate(cases):
        try:
            _launch(kern, case)
        except Exception as e:  # noqa: BLE001
            advice = puzzle.faults.get(_fault_kind(e))
            text = f"✗ {case.what}: {describe_error(e)}"
            return _say(False, text + (f"\n  In this puzzle that usually means: {advice}" if advice else ""))
        for out, tensor in case.outputs.items():
            got = tensor.detach().cpu().numpy()
            verdict, text = _compare(puzzle, case, out, got)
            if verdict == "untouched":
                untouched += 1
                break
            if verdict == "wrong":
                before = f"\n  ({i} case{'s' if i > 1 else ''} before it passed)" if i else ""
                wrong = _say(False, f"✗ {case.what}: {text}{before}")
                if draw and puzzle.picture and puzzle.picture["what"] in ("threads", "shared") \
                        and cl.device().backend == "emu":   # what the kernel touched, in that case
                    try:
                        wrong.figure = _show(_picture(kern, case, {**puzzle.picture, "case": None}),
                                             _CAPTIONS[puzzle.picture["what"]])
                    except (cl.ConvlabError, ValueError):
                        pass   # this case has no such block, or another shape: the verdict says it all
                return wrong
    if untouched == len(cases):
        return _say(False, f"not done yet: {puzzle.kernel} wrote none of its outputs (is it still a TODO?)")
    if untouched:
        return _say(False, f"✗ on {untouched} of {len(cases)} cases {puzzle.kernel} wrote nothing")
    if cl.device().backend != "emu":   # the counters and pictures come from the emulator's record
        return _say(True, f"✓ correct values on {cl.device().name}: {puzzle.kernel} on all {len(cases)} cases; "
                          f"the counters and pictures need the emulator (CONVLAB_BACKEND=emu)")
    draw = draw and puzzle.picture is not None
    if puzzle.sectors_max is not None or puzzle.conflicts_max is not None:
        over = _counters(puzzle, kern, cases[0])
        if over:
            view, line, text = over[0]
            verdict = _say(False, f"✗ right values, but {text}")
            if draw:
                verdict.figure = _show(_picture(kern, cases[0], {**puzzle.picture, "what": view}, line),
                                       _CAPTIONS[view])
            return verdict
    targets = []
    if puzzle.sectors_max is not None:
        targets.append(f"at most {puzzle.sectors_max:g} sectors per request")
    if puzzle.conflicts_max is not None:
        targets.append(f"{puzzle.conflicts_max} bank conflicts")
    extra = f", with {' and '.join(targets)}" if targets else ""
    verdict = _say(True, f"✓ correct: {kern.name} on all {len(cases)} cases ({'; '.join(c.what for c in cases)})"
                         f"{extra}")
    if draw:
        verdict.figure = _show(_picture(kern, cases[puzzle.picture.get("case", 0)], puzzle.picture),
                               _CAPTIONS[puzzle.picture["what"]])
    return verdict
