"""Checks for the exercise notebooks: they print a verdict a student can act on and never raise.

    import convlab.exercise as ex
    ex.check_kernel(launch)          # launch(x, w, y, stride, pad) runs your kernel into y
    ex.check_kernel(launch, fp16="float", locate=where)   # half in and out; who computed a wrong output
    ex.check_general_kernel(launch)  # launch(x, w, y, stride, pad, dilation, groups): groups and dilation
    ex.check_conv3d(launch, K)       # launch(x, w, y): a single-channel 3D convolution into y
    ex.check_dw(launch)              # launch(x, dy, dw, stride, pad): the weight gradient into dw
    ex.check_dx(launch)              # launch(dy, w, dx, stride, pad): the input gradient into dx
    ex.check_stage(launch)           # launch(x, w, bias, y): conv, bias, ReLU, 2x2 max pool into y
    ex.check_streams(run)            # run(g, images, chunks): chapter 10's network on streams, recorded
    ex.check_unroll(unroll)          # unroll(x, K, stride, pad) returns im2col's U
    ex.check_counters(launch, targets)   # correct, then the emulator's memory counters against targets
    ex.check_targets("05_direct_regtile", MT=8, ROWS=2, BLOCK=128)   # targets from the chapter's kernel
    ex.check_constant_mask(launch, mod, targets)   # the mask in mod's __constant__ c_mask, then counters
    ex.check_conv3d_counters(launch, K, targets)   # the same for a 3D launch(x, w, y)
    ex.check_dx_counters(launch, targets)          # the same for a dX launch(dy, w, dx, stride, pad)
    ex.check_answer("03.reuse", reuse)   # a number against the answer kept in exercise_answers
    ex.check_ring(my_ring)           # exercise 11.1's TMA + wgmma ring: the mbarrier protocol
    ex.check_tf32_split(mod, part)   # exercise 12.1: the 3xTF32 split (part 1), the three products (part 2)
    ex.count_atomics(fn, *args)      # global atomic warp instructions of the kernels fn(*args) launches
    ex.check_function(conv2d_numpy)  # conv2d_numpy(x, w, stride, pad) returns y (numpy)
    ex.check_value("FLOPs", flops, expected)
    ex.check_prediction("sectors per request", predicted, measured)   # {case: number} each
    ex.check_pick(pick, times, layers, device=gpu)   # a dispatcher rule against measured times
    ex.check_fragment("A fragment", regs, a_element, "A")   # a warp's registers against a layout
    ex.check_placement("D", D, d_element)                   # where each lane's d[i] went

Verdicts: "correct"; a named common mistake when the output matches one of them on the
reference (flipped mask, swapped axes, padding or stride ignored, `=` for `+=`, a tile not fully
loaded, the result rebound instead of written into y, every output off by one amount: a sum
that does not start at 0); "wrong at (b,m,h,w): expected … got …",
and when the wrong outputs hold other outputs' right values, how the two differ (by the index and
the fields locate() names: warp 1 holds what warp 0 computes, acc[i][j] holds acc[i][j+1]'s, a
leading dimension of 16 where the row holds 36);
"N outputs never written"; the emulator's fault messages (cl.ConvlabError subclasses: out of
range, races, barriers, timeouts, each at its source line) as they are, but for two threads that
store to one element at one line, told as an index to fix, not a barrier to add. Each piece of
advice is given only where its premise holds on the failing case. "not done yet" only while
a TODO stub that scripts/make_exercises.py left (`TODO: … (about N lines)`) is still in the code
the check runs (the launch function, the functions and %%cuda modules it uses); written code
that writes nothing is told so. On the emulator, kernels run with the race detector, so a
missing __syncthreads() or atomicAdd fails every time.
Every check returns a Verdict, true when right, so a notebook (or a test) can go on either way;
it shows nothing itself in a notebook, the printed line says it all.
"""
from __future__ import annotations

import dis
import inspect
import math
import re
import traceback
from dataclasses import dataclass

import numpy as np

import convlab as cl

from . import emu, network, simgpu, streams
from .baselines import torch_algorithm
from .exercise_answers import ANSWERS, COMPARE, COUNTER_SHAPES, RING_ROUNDS, TARGETS, TUNABLES
from .measure import call, inputs
from .ops import fused, naive, out_size
from .ops.fp16 import fp16_tolerance
from .ops.tf32 import round_tf32, split_tf32, tf32_tolerance
from .profile import ATOMICS, EMU_CONSTANT_ADDRESSES, EMU_CONSTANT_REQUESTS
from .workloads import Workload, get


#: The emulator's time limit for a launch inside a check (cl.set_timeout overrides it): the checks'
#: shapes run in well under a second with the race detector, so a kernel that hangs fails fast.
CHECK_TIMEOUT_S = 5.0


class Verdict:
    """The outcome of a check: true when right. Prints nothing as a cell's last value."""

    def __init__(self, ok: bool, text: str = ""):
        self.ok, self.text = bool(ok), text

    def __bool__(self) -> bool:
        return self.ok

    def __repr__(self) -> str:
        return f"<Verdict {'correct' if self.ok else 'not correct'}>"

    def _ipython_display_(self) -> None:
        pass  # the check already printed its verdict


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


def _fmt(v: float) -> str:
    return "NaN (never written)" if math.isnan(v) else f"{v:.6g}"


#: NaN as the emulator's poisoned shared memory holds it (all bits set), unlike cl.empty's NaN:
#: an output with these bits was computed from shared memory that no thread wrote. A half output
#: shows it as 0xFFFF (copied) or 0xFE00 (through float: the float NaN rounded to half), both with
#: the sign bit set, which cl.empty's half NaN (0x7E00) has not.
_POISON_BITS = 0xFFFFFFFF
_POISON_BITS_HALF = (0xFFFF, 0xFE00)


def poison_mask(y) -> np.ndarray | None:
    a = np.ascontiguousarray(_as_numpy(y))
    if a.dtype == np.float32:
        return a.view(np.uint32) == _POISON_BITS
    if a.dtype == np.float16:
        return np.isin(a.view(np.uint16), _POISON_BITS_HALF)
    return None


def _poisoned(y) -> int:
    mask = poison_mask(y)
    return 0 if mask is None else int(mask.sum())


def _mistakes(x, w, stride: int, pad: int):
    """(what, the output that mistake gives) for the common mistakes, computed on the reference."""
    import torch
    import torch.nn.functional as F


    x, w = torch.as_tensor(x).detach().cpu().double(), torch.as_tensor(w).detach().cpu().double()
    Ho, Wo = out_size(x.shape[-2], w.shape[-1], stride, pad), out_size(x.shape[-1], w.shape[-1], stride, pad)
    conv = lambda xx, ww, s=stride, p=pad: cl.ref.conv2d(xx, ww, stride=s, padding=p)  # noqa: E731
    yield ("the mask is flipped: that is convolution, but the course computes cross-correlation, "
           "y[h][w] += x[h+p][w+q] * k[p][q] (not k[K-1-p][K-1-q])", lambda: conv(x, w.flip(-1, -2)))
    yield ("the mask's axes are swapped: k[q][p] where k[p][q] belongs (p runs down the rows, q across)",
           lambda: conv(x, w.transpose(-1, -2)))
    if x.shape[-1] == x.shape[-2]:
        yield ("h and w are swapped in the input's index: x[...][w][h] where x[...][h][w] belongs",
               lambda: conv(x.transpose(-1, -2), w))
    if Ho == Wo:
        yield ("h and w are swapped in the output's index: y[...][w][h] where y[...][h][w] belongs",
               lambda: conv(x, w).transpose(-1, -2))
    if pad:
        yield (f"the padding is ignored: the input row is h*stride + p, but it must be h*stride + p - pad "
               f"(pad={pad}), with the bounds check treating rows and columns outside the image as 0",
               lambda: conv(F.pad(x, (0, 2 * pad, 0, 2 * pad)), w, p=0))
    if stride > 1:
        yield (f"the stride is ignored: the input row is h + p, but it must be h*stride + p - pad (stride={stride})",
               lambda: conv(x, w, s=1)[..., :Ho, :Wo])

    def only(last_tap: bool):
        keep = torch.zeros_like(w)
        if last_tap:
            keep[:, -1, -1, -1] = w[:, -1, -1, -1]
        else:
            keep[:, -1] = w[:, -1]
        return conv(x, keep)
    yield ("`=` where `+=` belongs: each output keeps only its last product (acc = a * b overwrites the "
           "sum; acc += a * b adds to it)", lambda: only(True))
    if x.shape[1] > 1:
        yield ("only the last channel counts: the sum starts again at 0 for every channel c (set acc = 0 "
               "once, before the loop over c), or the store is inside the loop over c", lambda: only(False))


def _match(got: np.ndarray, mistakes, rtol: float, atol: float | None) -> str | None:
    """The first (what, make) of mistakes whose output equals got within the bound, else None."""
    for what, make in mistakes:
        want = _as_numpy(make()).astype(np.float64)
        if want.shape == got.shape:
            bound = atol if atol is not None else 1e-4 * max(float(np.sqrt(np.mean(want ** 2))), 1e-30)
            if np.all(np.abs(got - want) <= bound + rtol * np.abs(want)):
                return what
    return None


def diagnose(y, x, w, stride: int, pad: int, *, rtol: float = 1e-4, atol: float | None = None) -> str | None:
    """Which common mistake gives the output y for these inputs, or None (atol: as in verdict)."""
    return _match(_as_numpy(y).astype(np.float64), _mistakes(x, w, stride, pad), rtol, atol)


#: verdict's texts for an output nothing was computed into: a check says "not done yet" instead
#: while a TODO stub is left (_todo_left).
NOTHING = ("none of the", "all ")


def _outside_windows(H: int, W: int, K: int, stride: int, pad: int, Ho: int, Wo: int) -> np.ndarray:
    """(Ho, Wo): whether each output's window reaches outside the image (a padding row or column),
    where the bounds test and the padding's offset decide its value."""
    def reach(size, n):
        first = np.arange(n) * stride - pad
        return (first < 0) | (first + K - 1 > size - 1)
    return reach(H, Ho)[:, None] | reach(W, Wo)[None, :]


def _edge_only(bad: np.ndarray, x_shape, K: int, stride: int, pad: int) -> bool:
    """Whether the wrong outputs of a (B, M, Ho, Wo) output are exactly at the image's edge: every
    one of them has a window that reaches outside the image, and the outputs whose windows lie
    inside it (there are some) are all right. Without padding no window reaches outside."""
    if bad.ndim != 4 or not bad.any():
        return False
    outside = _outside_windows(x_shape[-2], x_shape[-1], K, stride, pad, *bad.shape[-2:])
    return bool(outside.any() and (~outside).any() and not bad[..., ~outside].any())


#: A field of a locate() text: a word and a number ("warp 1", "row 0"), a tuple ("block (0,1)")
#: or subscripts ("acc[0][7]").
_FIELD = re.compile(r"([A-Za-z_]\w*)\s*(\(\d+(?:,\s*\d+)*\)|(?:\[\d+\])+|\d+)")


def _fields(index, labels, locate) -> dict:
    """An output's coordinates by name: the index's (b, m, h, w) and the fields its locate text
    names, each a tuple of ints."""
    out = {n: (int(i),) for n, i in zip(labels, index)}
    if locate is not None:
        for name, value in _FIELD.findall(str(locate(index))):
            out.setdefault(name, tuple(int(v) for v in re.findall(r"\d+", value)))
    return out


def _sub(name: str, v: tuple) -> str:
    """A field's value as a locate text shows it: warp 1, acc[0][7]."""
    return f"{name}[{']['.join(map(str, v))}]" if len(v) > 1 else f"{name} {v[0]}"


def _shifted(name: str, d: tuple) -> str:
    """A field of any value and the one d away: "acc[i][j] holds the value of acc[i][j+1]"."""
    if len(d) == 1:
        return f"{name} n holds the value of {name} n{d[0]:+d}"
    letters = "ijkl"
    return (name + "".join(f"[{letters[k]}]" for k in range(len(d))) + " holds the value of " + name
            + "".join(f"[{letters[k]}{f'{dk:+d}' if dk else ''}]" for k, dk in enumerate(d)))


def _only(bad, labels, locate, named) -> str:
    """"; every wrong output is warp 1's" when one value of a field is common to every wrong output
    and at least 9 in 10 of that value's outputs are wrong (a few may be right by chance)."""
    wrong = [_fields(tuple(i), labels, locate) for i in np.argwhere(bad)[:4096]]
    right = [_fields(tuple(i), labels, locate) for i in np.argwhere(~bad)[:4096]]
    for n in named:
        values = {f.get(n) for f in wrong}
        if len(values) != 1 or not right:
            continue
        v = values.pop()
        n_right = sum(f.get(n) == v for f in right)
        if v is not None and n_right <= 0.1 * (n_right + len(wrong)) and len(right) > n_right:
            return (f"; every wrong output is {_sub(n, v)}'s ({len(wrong)} of its {len(wrong) + n_right}), "
                    f"no other {n}'s")
    return ""


def _moved(got, want, bad, tol, labels, locate) -> str | None:
    """When most wrong outputs hold the right value of another output (a tile or a fragment in the
    wrong place, an index off by a constant), say which output's value they hold and how the two
    differ, by the index and by the fields locate() names (warp, thread, the accumulator's row and
    column), derived from the outputs: which warp or thread wrote them, which index is off, or the
    row length two row-major layouts disagree on (a leading dimension)."""
    flat_want, order = want.ravel(), np.argsort(want.ravel(), kind="stable")
    sorted_want = flat_want[order]
    where_bad = np.argwhere(bad & np.isfinite(got))
    if len(where_bad) < 4 or want.size < 2:
        return None
    # every output whose right value is within the bound of a wrong one (a few where values are close)
    cands = []
    for idx in where_bad[:4096]:
        g, t = got[tuple(idx)], tol[tuple(idx)]
        if g == 0:
            continue   # an output left at 0 holds no other output's value
        lo, hi = np.searchsorted(sorted_want, g - t), np.searchsorted(sorted_want, g + t, side="right")
        if hi > lo:
            near = order[lo:hi][np.argsort(np.abs(sorted_want[lo:hi] - g), kind="stable")[:16]]
            here = tuple(int(i) for i in idx)
            others = [tuple(int(i) for i in np.unravel_index(j, want.shape)) for j in near]
            others = [o for o in others if o != here]
            if others:
                cands.append((here, others))
    if len(cands) < max(4, 0.2 * min(len(where_bad), 4096)):
        return None
    fields = {}

    def fld(index):
        if index not in fields:
            fields[index] = _fields(index, labels, locate)
        return fields[index]

    first = fld(cands[0][0])
    names = [n for n in first if all(n in fld(d) and len(fld(d)[n]) == len(first[n]) for d, _ in cands)]
    # the locate fields when there are any (who computes it), else the index's own
    named = [n for n in names if n not in labels] or names

    def pattern(d, s):
        f, g = fld(d), fld(s)
        if any(n not in g or len(g[n]) != len(f[n]) for n in named):
            return None
        return tuple((n, tuple(b - a for a, b in zip(f[n], g[n]))) for n in named if f[n] != g[n])

    # each wrong output votes for how it differs from the outputs whose values it holds
    votes: dict = {}
    for d, near in cands:
        ps = {pattern(d, s) for s in near} - {None}
        for p in ps:
            votes[p] = votes.get(p, 0.0) + 1 / len(ps)
    if not votes:
        return None
    key = max(votes, key=votes.get)
    pairs, members = [], []
    for d, near in cands:
        s = next((s for s in near if pattern(d, s) == key), near[0])
        pairs.append((d, s))
        if pattern(d, s) == key:
            members.append(((d, s), fld(d), fld(s)))
    dest, src = [fld(d) for d, _ in pairs], [fld(s) for _, s in pairs]
    (d0, s0), _, _ = members[0]

    def at(index):
        text = "(" + ",".join(f"{n}={i}" for n, i in zip(labels, index)) + ")"
        return f"{text} [{locate(index)}]" if locate is not None else text

    lead = (f"{len(pairs)} of the {len(where_bad)} wrong outputs hold the right value of another output, "
            f"e.g. {at(d0)} holds that of {at(s0)}")
    members = [(f, g) for _, f, g in members]
    if len(members) >= 0.5 * min(len(where_bad), 4096) and key:
        same = [n for n in named if all(f[n] == g[n] for f, g in members)]
        parts = []
        for n, d in key:
            dv, sv = {f[n] for f, _ in members}, {g[n] for _, g in members}
            if len(dv) == 1 and len(sv) == 1:
                v, u = dv.pop(), sv.pop()
                # the outputs of n 0 where those of another n belong: an offset by n left out
                why = f", as if an offset by {n} were left out" if not any(u) and any(v) else ""
                parts.append(f"{_sub(n, v)} holds what {_sub(n, u)} computes{why}")
            else:
                off = [f"{'ijkl'[k] if len(d) > 1 else n} is off by {x:+d}" for k, x in enumerate(d) if x]
                parts.append(f"{_shifted(n, d)}: its index {' and '.join(off)}")
        tail = f" (the same {', '.join(same)})" if same else ""
        return f"{lead}. In {len(members)} of them {'; '.join(parts)}{tail}{_only(bad, labels, locate, named)}"
    # right values in the wrong places, not by a constant: the fields (a row, a column, a warp's
    # offset) add up to one memory offset as written and another as read, a row-major layout with
    # rows L1 apart read with rows L2 apart (a leading dimension)
    moved = [n for n in named if len(first[n]) == 1 and any(f[n] != g[n] for f, g in zip(dest, src))]
    scalars = [n for n in named if len(first[n]) == 1]
    best = None
    for unit in reversed(moved[:4]):
        others = [n for n in scalars if n != unit and n in moved]
        rest = [n for n in named if n not in moved]
        sure = [(fld(d), fld(near[0])) for d, near in cands if len(near) == 1]
        sure = [(f, g) for f, g in sure if all(f[n] == g[n] for n in rest)]
        if not others or len(sure) < 2 * len(others) + 2:
            continue
        A = np.array([[f[n][0] for n in others] + [-g[n][0] for n in others] for f, g in sure], dtype=float)
        rhs = np.array([g[unit][0] - f[unit][0] for f, g in sure], dtype=float)
        coef = [int(round(v)) for v in np.linalg.lstsq(A, rhs, rcond=None)[0]]
        a_, b_ = dict(zip(others, coef[:len(others)])), dict(zip(others, coef[len(others):]))

        def offset(f, k):
            return sum(k[n] * f[n][0] for n in others) + f[unit][0]

        def fits(d, s_):
            f, g = fld(d), fld(s_)
            return all(f[n] == g[n] for n in rest) and offset(f, a_) == offset(g, b_)

        fit = [(d, next(s_ for s_ in near if fits(d, s_))) for d, near in cands if any(fits(d, s_) for s_ in near)]
        if best is None or len(fit) > len(best[0]):
            best = (fit, unit, others, a_, b_)
    if best is None:
        return None
    fit, unit, others, a_, b_ = best
    strides = [n for n in others if a_[n] != b_[n]]
    if len(fit) < 0.5 * len(cands) or len(strides) != 1 or a_[strides[0]] <= 0 or b_[strides[0]] <= 0:
        return None
    r_, L1, L2 = strides[0], a_[strides[0]], b_[strides[0]]

    def formula(k, prime):
        return " + ".join([f"{k[n]}·{n}{prime}" for n in others] + [f"{unit}{prime}"])

    d0, s0 = fit[0]
    return (f"{len(cands)} of the {len(where_bad)} wrong outputs hold the right value of another output, "
            f"e.g. {at(d0)} holds that of {at(s0)}. They are right values in the wrong places: in {len(fit)} "
            f"of them the output at {formula(a_, '')} holds what {formula(b_, chr(39))} computes: the rows "
            f"({r_}) were taken {L2} elements apart where they are {L1} apart, a leading dimension of {L2} where "
            f"a row of the array holds {L1} (a load's or a store's ldm is the row length of the array as "
            f"declared, not the tile's width)")


def verdict(y, ref, *, rtol: float = 1e-4, atol: float | None = None, labels: str = "bmhw",
            inputs: tuple | None = None, locate=None, mistakes=None) -> tuple[bool, str]:
    """Compare an output with the fp64 reference: (ok, a one-line verdict). Like cl.check, atol
    defaults to 1e-4 of the reference's RMS (fp32 sums of many products). With inputs=(x, w,
    stride, pad) of a conv2d, a wrong output is also tried against the common mistakes; other
    operations pass their own mistakes: (what, make() -> the output that mistake gives) pairs.
    locate(index) -> text names who computes the output at an index (which thread, which register
    of its micro-tile): the verdict adds it after the first wrong or unwritten output.
    An output with nothing in it starts with one of NOTHING."""
    n_poisoned = _poisoned(y)
    got = _as_numpy(y).astype(np.float64)
    want = _as_numpy(ref).astype(np.float64)
    given_atol = atol      # the common mistakes are compared with the caller's bound, or their own
    if atol is None:
        atol = 1e-4 * max(float(np.sqrt(np.mean(want ** 2))) if want.size else 0.0, 1e-30)
    if got.shape != want.shape:
        return False, f"wrong shape: your output is {tuple(got.shape)}, expected {tuple(want.shape)}"
    def at(index) -> str:
        text = "(" + ",".join(f"{n}={i}" for n, i in zip(labels, index)) + ")"
        return f"{text} [{locate(index)}]" if locate is not None else text

    if n_poisoned:
        first = tuple(int(i) for i in np.argwhere(poison_mask(y))[0])
        halo = ", halo rows and columns included" if inputs is not None else ""
        questions = (f"does the loop that loads the tile cover all of it{halo}, does every thread wait at a "
                     f"__syncthreads() before reading it, and does every read stay inside what was written (an "
                     f"index, a fragment's leading dimension)?")
        if n_poisoned == got.size:
            return False, (f"all {got.size} outputs were computed from __shared__ memory that no thread wrote "
                           f"(the emulator fills it with NaN for each block): {questions}")
        return False, (f"{n_poisoned} of {got.size} outputs were computed from __shared__ memory that no thread "
                       f"wrote (the emulator fills it with NaN for each block), the first at {at(first)}: "
                       f"{questions}")
    never = np.isnan(got)
    n_never = int(never.sum())
    if n_never == got.size:
        return False, (f"none of the {got.size} outputs was written (they start as NaN): does the kernel store "
                       f"into the output pointer it is passed, and does the launch pass the very tensor it was "
                       f"given (not a new one), with a grid that starts at least one thread?")
    if not got.any() and want.any():
        return False, (f"all {got.size} outputs are 0, as if nothing was added up: is each product added "
                       f"into the sum (+=), and is it the sum that is stored?")
    bad = never | ~np.isfinite(got) | (np.abs(got - want) > atol + rtol * np.abs(want))
    n_bad = int(bad.sum())
    if n_bad == 0:
        return True, "correct"
    if not n_never:
        if inputs is not None and mistakes is None:
            mistakes = _mistakes(*inputs)
        mistake = _match(got, mistakes, rtol, given_atol) if mistakes is not None else None
        if mistake:
            return False, mistake

    if not n_never and n_bad == got.size > 1:
        diff = got - want
        off = float(np.median(diff))
        if np.all(np.abs(diff - off) <= atol + rtol * np.abs(want)):
            return False, (f"every output is {off:+.6g} off the reference, the same amount everywhere: does the sum "
                           f"start at 0 (acc = 0 before the loop, not left unset or set to another value)?")
    first = tuple(int(i) for i in np.argwhere(bad)[0])
    moved = _moved(got, want, bad, atol + rtol * np.abs(got), labels, locate)
    if n_never:
        first_never = tuple(int(i) for i in np.argwhere(never)[0])
        if moved:     # written to the wrong places: an index off, not outputs without a thread
            return False, (f"{n_never} of {got.size} outputs never written, the first at {at(first_never)}, and "
                           f"written ones hold values that belong elsewhere:\n  {moved}")
        return False, (f"{n_never} of {got.size} outputs never written, the first at {at(first_never)}: "
                       f"does every output get a thread?")
    edge = ""
    if inputs is not None and not moved and _edge_only(bad, np.shape(inputs[0]), np.shape(inputs[1])[-1], inputs[2],
                                                       inputs[3]):
        edge = (": only outputs at the image's edge are wrong, whose windows reach outside the image: check "
                "the bounds test (ih < H, not ih <= H; ih >= 0) and where the padding is subtracted")
    return False, (f"wrong at {at(first)}: expected {_fmt(want[first])} got {_fmt(got[first])} "
                   f"({n_bad} of {got.size} outputs wrong){edge}" + (f"\n  {moved}" if moved else ""))


def _as_numpy(a) -> np.ndarray:
    try:
        import torch

        if isinstance(a, torch.Tensor):
            return a.detach().cpu().numpy()
    except ImportError:
        pass
    return np.asarray(a)


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


def _todo_left(run) -> str | None:
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


def _nothing(run, text: str, *, out_index: int | None) -> str:
    """An output with nothing in it: "not done yet" while a TODO stub is left, else what writes nothing."""
    todo = _todo_left(run)
    if todo:
        return f"not done yet: {todo} is still there, and nothing was computed into the output"
    rebound = _rebinds(run, out_index) if out_index is not None else None
    if rebound:
        return (f"✗ none of the outputs was written: your launch function assigns to `{rebound}` "
                f"(`{rebound} = ...`), which only makes the name point at a new tensor inside the function; "
                f"the checked tensor stays as it was. Write into it instead: `{rebound}.copy_(...)` or "
                f"`{rebound}[...] = ...`")
    return f"✗ {text}"


def _fault(run, error: str) -> str:
    todo = _todo_left(run)
    return f"not done yet: {todo} is still there (running the code as it is: {error})" if todo else error


def checked_launch(call):
    """Run a student's launch under the race detector and the checks' time limit; its result."""

    with cl.detect_races(True), cl.time_limit(CHECK_TIMEOUT_S):
        out = call()
    cl.sync()  # a GPU launch is asynchronous: its faults show here
    return out


def _say(ok: bool, text: str) -> Verdict:
    print(text)
    return Verdict(ok, text)


@dataclass
class _Case:
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


def _run_cases(run, cases, *, name: str, labels: str = "bmhw", out_index: int | None = 2,
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
            text = _fault(run, describe_error(e))
            if text.startswith("not done"):
                return _say(False, text)
            why = explain(e) if explain is not None else ""
            why = f"\n  → {why}" if why else ""
            return _say(False, f"✗ {case.text}: {text}{_read_on(e, case, labels)}{why}")
        out = result if isinstance(result, torch.Tensor) and out_index is not None else case.out
        ok, text = verdict(out, case.ref, labels=labels, inputs=case.inputs, mistakes=case.mistakes,
                           locate=case.locate, **(case.bound or {}))
        if not ok and text.startswith(NOTHING):
            hint = next((h for words, h in (nothing_hint or {}).items() if words in text.split(": ")[0]), "")
            text = _nothing(run, text, out_index=out_index)
            if text.startswith("not done"):
                return _say(False, text)
            # "nothing written" asks whether the kernel stores at all: where it stores on a larger
            # case, that case's verdict says what is wrong instead
            later = _first_written(cases[i + 1:], labels) if text.startswith("✗ none of") else None
            if later is not None:
                other, verdict_text = later
                return _say(False, f"✗ {case.text}: nothing was written, though on {other.text} some outputs are; "
                                   f"there: {verdict_text}")
            return _say(False, f"{text[:2]}{case.text}: {text[2:]}{hint}")
        if not ok:
            why = f" ({case.why})" if case.why else ""
            return _say(False, f"✗ {case.text}{why}: {text}{before}")
    return _say(True, f"✓ correct: {name} {passed}")


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


def _read_on(e: BaseException, case: _Case, labels: str) -> str:
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
        got[torch.from_numpy(past)] = torch.as_tensor(_as_numpy(case.ref)).to(got.dtype)[torch.from_numpy(past)]
    ok, text = verdict(got, case.ref, labels=labels, inputs=case.inputs, mistakes=case.mistakes,
                       locate=case.locate, **(case.bound or {}))
    n_past = int(past.sum()) if past is not None else 0
    more = f"\n  ({n_past} more outputs read past the array's end)" if n_past else ""
    if ok or text.startswith(NOTHING):
        return ""
    return (f"\n  On a GPU that index reads on into the array's next row; run so, the rest of the outputs are "
            f"{text}{more}")


def _conv2d_cases(run, shapes, *, fp16: str | None, locate):
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
        yield _Case(str(shape), shape.note,
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
        text = _fault(launch, describe_error(e))
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
    return _run_cases(launch, _conv2d_cases(launch, shapes, fp16=fp16, locate=locate), name=name,
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
            text = _fault(fn, describe_error(e))
            return _say(False, text if text.startswith("not done") else f"✗ {shape}: {text}")
        if y is None:
            todo = _todo_left(fn)
            return _say(False, f"not done yet: {todo} is still there" if todo else
                               f"✗ {name} returned None for {shape}: does it end with `return y`?")
        ok, text = verdict(y, ref, inputs=(x, w, shape.stride, shape.padding))
        if not ok:
            before = f"\n  ({i} shape{'s' if i > 1 else ''} before it passed)" if i else ""
            return _say(False, f"✗ {shape} ({shape.note}): {text}{before}")
    return _say(True, f"✓ correct: {name} matches the fp64 reference on all {len(shapes)} shapes "
                      f"(awkward sizes, C=1, B=1, odd and even K, stride 2, padding)")


#: Volumes (D, H, W, why) for a 3D kernel of blocks of 32 columns, BY rows and ZC planes: no
#: multiple of any block along each axis, a single output plane, fewer planes than ZC.
VOLUMES = [(3, 3, 3, "the smallest: one output"),
           (9, 13, 37, "no multiple of 32, BY or ZC"),
           (6, 8, 40, "fewer planes than two blocks; columns over two warps"),
           (11, 6, 10, "a short last plane block"),
           (3, 20, 70, "D = K: one output plane")]


def check_conv3d(launch, K: int, volumes=None, *, name: str = "your kernel", tol: float = 1e-5) -> Verdict:
    """launch(x, w, y) runs a single-channel 3D convolution (valid, stride 1) of x (D, H, W) with
    the mask w (K, K, K) into y, which starts as NaN; checked on `volumes` ((D, H, W, why), VOLUMES
    by default) against the fp64 reference within tol, the challenge's tolerance."""

    volumes = VOLUMES if volumes is None else volumes

    def cases():
        for D, H, W, why in volumes:
            x, w = cl.randn(D, H, W), cl.randn(K, K, K)
            y = cl.empty(D - K + 1, H - K + 1, W - K + 1)
            conv = lambda ww, x=x: cl.ref.conv3d(x, ww)  # noqa: E731
            mistakes = [
                ("the mask is flipped: that is convolution, but the course computes cross-correlation, "
                 "x[z+kz][y+ky][x+kx] * k[kz][ky][kx]", lambda w=w, conv=conv: conv(w.flip(0, 1, 2))),
                ("the mask's planes are in the wrong order: output plane oz takes input plane iz with mask "
                 "plane kz = iz - oz; in the window acc[j] (output plane iz - (KS-1) + j) that is plane "
                 "KS-1-j, not j", lambda w=w, conv=conv: conv(w.flip(0))),
                ("the mask's row and column are swapped: k[kz][kx][ky] where k[kz][ky][kx] belongs",
                 lambda w=w, conv=conv: conv(w.transpose(1, 2))),
            ]
            yield _Case(f"{D}×{H}×{W}", why, lambda x=x, w=w, y=y: launch(x, w, y), y, cl.ref.conv3d(x, w),
                        mistakes=mistakes, bound={"rtol": tol, "atol": tol})

    return _run_cases(launch, cases(), name=name, labels="zyx",
                      passed=f"matches the fp64 reference within {tol:g} on all {len(volumes)} volumes")


def _weight_grad_mistakes(x, dy, w_shape, stride: int, pad: int):
    import torch
    import torch.nn.functional as F


    x, dy = x.double().cpu(), dy.double().cpu()
    grad = lambda xx, gy, s=stride, p=pad: cl.ref.conv2d_weight_grad(xx, w_shape, gy, stride=s, padding=p)  # noqa: E731
    yield ("dw[m][c][ky][kx] is flipped: the product for tap (ky, kx) goes to dw[...][K-1-ky][K-1-kx]",
           lambda: grad(x, dy).flip(-1, -2))
    yield ("ky and kx are swapped: the product for tap (ky, kx) goes to dw[...][kx][ky]",
           lambda: grad(x, dy).transpose(-1, -2))
    if pad:
        yield (f"the padding is ignored: the input row is oy*stride + ky, but it must be oy*stride + ky - pad "
               f"(pad={pad}), skipping rows and columns outside the image",
               lambda: grad(F.pad(x, (0, 2 * pad, 0, 2 * pad)), dy, p=0))
    if stride > 1:
        H, W, K = x.shape[-2], x.shape[-1], w_shape[-1]
        full = torch.zeros(*dy.shape[:2], H + 2 * pad - K + 1, W + 2 * pad - K + 1, dtype=dy.dtype)
        full[..., :dy.shape[-2], :dy.shape[-1]] = dy
        yield (f"the stride is ignored: the input row is oy + ky - pad, but it must be oy*stride + ky - pad "
               f"(stride={stride})", lambda: grad(x, full, s=1))

    # a block's tree with `=` for `+=` (partial[t] = partial[t + s]) leaves in partial[0] the sum of
    # its last thread alone: the pixels t = T-1, 2T-1, ... of a block of T threads
    n = dy.shape[0] * dy.shape[-2] * dy.shape[-1]
    for T in (32, 64, 128, 256, 512, 1024):
        if T <= n:
            keep = (torch.arange(n) % T == T - 1).view(dy.shape[0], 1, *dy.shape[-2:]).to(dy.dtype)
            yield (f"`=` where `+=` belongs in the tree: partial[t] = partial[t + s] keeps only one thread's "
                   f"sum (that of thread {T - 1}), so partial[0] is not the block's total",
                   lambda keep=keep: grad(x, dy * keep))


def check_dw(launch, shapes=None, *, name: str = "your kernel") -> Verdict:
    """launch(x, dy, dw, stride, pad) computes the weight gradient (M, C, K, K) of a conv2d into dw,
    which starts as NaN (a kernel that adds into it zeroes it first); checked on the awkward shapes
    against the fp64 reference."""

    shapes = list(AWKWARD_SHAPES if shapes is None else shapes)

    def cases():
        for s in shapes:
            x, dy = cl.randn(s.B, s.C, s.H, s.W), cl.randn(s.B, s.M, s.Ho, s.Wo)
            w_shape = (s.M, s.C, s.K, s.K)
            dw = cl.empty(*w_shape)
            yield _Case(str(s), s.note, lambda x=x, dy=dy, dw=dw, s=s: launch(x, dy, dw, s.stride, s.padding), dw,
                        cl.ref.conv2d_weight_grad(x, w_shape, dy, stride=s.stride, padding=s.padding),
                        mistakes=list(_weight_grad_mistakes(x, dy, w_shape, s.stride, s.padding)))

    return _run_cases(launch, cases(), name=name, labels=("m", "c", "ky", "kx"),
                      nothing_hint={
                          "was written": " (dw starts as NaN, and NaN plus anything stays NaN: a kernel that adds "
                                         "into dw with atomicAdd needs dw.zero_() before the launch)",
                          "outputs are 0": " (in a reduction tree each step adds, partial[t] += partial[t + s]: with "
                                           "`=` partial[0] holds one thread's sum, 0 where that thread had no pixel)",
                          "no thread wrote": " (a reduction's partial[] has an element per thread of the block, which "
                                             "that thread writes: a block of fewer threads than the array leaves the "
                                             "rest unwritten)"},
                      passed=f"matches the fp64 reference on all {len(shapes)} shapes (awkward sizes, C=1, "
                             f"B=1, odd and even K, stride 2, padding)")


def _gathered(dy, w, H: int, W: int, stride: int, pad: int, *, sign: int = 1, ksign: int = -1, flip: bool = False,
              divisible: bool = True, lower: str = "t", last: bool = False):
    """dx (B, C, H, W) in fp64 as a gather kernel computes it with the given index arithmetic:
    input row iy meets mask row ky at t = iy + sign*pad + ksign*ky and dy row oy = t / stride (C's
    division); divisible: only where t % stride == 0; lower: skip t < 0 ("t") or oy < 0 ("oy"), and
    oy >= Ho; flip: the mask's tap (K-1-ky, K-1-kx) instead of (ky, kx); last: each element keeps
    its last product (`=` for `+=`). The same for columns. (A kernel that reads outside dy faults:
    check_dx adds a hint to that fault, no output to compare.)"""
    import torch

    dy, w = dy.detach().cpu().double(), w.detach().cpu().double()
    B, M, Ho, Wo = dy.shape
    C, K = w.shape[1], w.shape[-1]
    flat, n = dy.reshape(-1), dy.numel()

    def taps(size: int, k: int, out: int):
        t = torch.arange(size) + sign * pad + ksign * k
        o = torch.div(t, stride, rounding_mode="trunc")
        ok = (t % stride == 0) if divisible else torch.ones(size, dtype=torch.bool)
        ok &= (t >= 0 if lower == "t" else o >= 0) & (o < out)
        return o, ok

    dx = torch.zeros(B, C, H, W, dtype=torch.float64)
    b = torch.arange(B).view(B, 1, 1)
    for m in range(M):
        for ky in range(K):
            oy, oky = taps(H, ky, Ho)
            for kx in range(K):
                ox, okx = taps(W, kx, Wo)
                ok = oky.view(1, H, 1) & okx.view(1, 1, W)
                at = ((b * M + m) * Ho + oy.view(1, H, 1)) * Wo + ox.view(1, 1, W)
                val = torch.where(ok, flat[at.clamp(0, n - 1)], 0.0)     # clamped: the skipped taps
                tap = w[m, :, K - 1 - ky, K - 1 - kx] if flip else w[m, :, ky, kx]
                prod = val.unsqueeze(1) * tap.view(1, C, 1, 1)
                dx = torch.where(ok.unsqueeze(1), prod, dx) if last else dx + prod
    return dx


def _input_grad_mistakes(dy, w, H: int, W: int, stride: int, pad: int):
    """(what, the dx it gives) for the usual mistakes of a gather kernel's index arithmetic."""
    def variant(**kw):
        return lambda: _gathered(dy, w, H, W, stride, pad, **kw)

    yield ("the mask is flipped twice: dy row oy = (iy + pad - ky)/stride meets mask row ky itself (the "
           "minus sign in front of ky is the flip); w[...][K-1-ky][K-1-kx] there flips it back",
           variant(flip=True))
    yield ("the mask is not flipped: dy row (iy - pad + ky)/stride is the forward pass's index read the "
           "wrong way; the forward pass read input row iy = oy*stride + ky - pad, so input row iy meets "
           "dy row oy = (iy + pad - ky)/stride", variant(sign=-1, ksign=1))
    if stride > 1:
        for lower in ("t", "oy"):
            yield (f"the stride test is missing: only taps with (iy + pad - ky) divisible by the stride "
                   f"(here {stride}) meet a dy row; for the others (iy + pad - ky)/stride rounds down onto a "
                   f"row this input never touched (skip them: (iy + pad - ky) % stride != 0)",
                   variant(divisible=False, lower=lower))
    if pad:
        yield (f"the padding is ignored: input row iy meets dy row (iy + pad - ky)/stride, not "
               f"(iy - ky)/stride (pad={pad})", variant(sign=0))
        yield (f"the padding has the wrong sign: iy - pad - ky where iy + pad - ky belongs (the forward "
               f"pass read input row oy*stride + ky - pad, pad={pad})", variant(sign=-1))
    yield ("`=` where `+=` belongs: each dx element keeps only its last product (acc = a * b overwrites "
           "the sum; acc += a * b adds to it)", variant(last=True))


def _dy_hint(launch):
    """launch with a hint added to a read outside dy: the taps whose dy position is outside dy."""

    def run(*args):
        try:
            return launch(*args)
        except cl.OutOfBoundsError as e:
            if " dy[" not in str(e):
                raise
            raise cl.OutOfBoundsError(
                f"{e}\n  dy's bounds: a tap whose dy position (oy, ox) falls outside 0 ≤ oy < Ho, "
                f"0 ≤ ox < Wo reaches no output (in the forward pass it was padding): skip it") from None
    return run


def check_dx(launch, shapes=None, *, name: str = "your kernel") -> Verdict:
    """launch(dy, w, dx, stride, pad) computes the input gradient (B, C, H, W) of a conv2d into dx,
    which starts as NaN; checked on the awkward shapes against the fp64 reference (torch's
    conv2d_input). A wrong dx is tried against the usual mistakes of the gather's index arithmetic
    (the mask flipped twice or not at all, the stride test, the padding ignored or its sign, `=`
    for `+=`), and a read outside dy (dy's bounds not tested) gets a hint."""

    shapes = list(AWKWARD_SHAPES if shapes is None else shapes)
    run = _dy_hint(launch)

    def cases():
        for s in shapes:
            dy, w = cl.randn(s.B, s.M, s.Ho, s.Wo), cl.randn(s.M, s.C, s.K, s.K)
            dx = cl.empty(s.B, s.C, s.H, s.W)
            yield _Case(str(s), s.note, lambda dy=dy, w=w, dx=dx, s=s: run(dy, w, dx, s.stride, s.padding), dx,
                        cl.ref.conv2d_input_grad(dx.shape, w, dy, stride=s.stride, padding=s.padding),
                        mistakes=[(what, make) for what, make in
                                  _input_grad_mistakes(dy, w, s.H, s.W, s.stride, s.padding)])

    return _run_cases(launch, cases(), name=name,
                      nothing_hint={
                          "was written": " (dx starts as NaN: a kernel that adds into dx, with += or atomicAdd, "
                                         "adds to that NaN. Each dx element has one thread here: sum into a "
                                         "register and store it once, dx[i] = acc)"},
                      passed=f"matches the fp64 reference on all {len(shapes)} shapes (awkward sizes, C=1, "
                             f"B=1, odd and even K, stride 2, padding)")


#: The (images, chunks) exercise 10.2's schedule is checked on: 8 equal chunks (the chapter's
#: plan, whose model time is graded) and a batch that 4 chunks do not divide.
STREAM_CASES = ((16, 8), (10, 4))


def _stream_network():
    """Chapter 10's network for the streams check: the class project's, on 30×30 images on the
    emulator (its twin), whole on a GPU; its params and forward(xb, out)."""

    arch = network.CLASS_PROJECT if cl.backend() == "cuda" else network.CLASS_PROJECT.at_size(30)
    params = network.init(arch, seed=0)
    return arch, lambda xb, out: network.forward(arch, params, xb, logits=out)


def _stream_mistakes(g, chunks: int) -> list:
    """The classic mistakes a record shows, as the verdict names them."""
    said = []
    pageable = [kind for kind in ("copy in", "copy out") if any(op.pageable and op.kind == kind for op in g.ops)]
    if pageable:
        which = " and ".join({"copy in": "the copies in (the images)", "copy out": "the copies back (the logits)"}[k]
                             for k in pageable)
        said.append(f"{which} use pageable host memory (not made by g.pinned or g.host_empty(..., "
                    f"pinned=True)): the driver copies it through a pinned buffer of its own and the host waits "
                    f"for each such copy, so nothing it issues later can overlap it")
    if chunks > 1 and len(g.streams_used()) == 1:
        said.append("all chunks are on one stream: in a stream each operation waits for the one before, so "
                    "chunk i+1's copy in waits for chunk i's compute and copy back; give each chunk its own "
                    "stream (g.stream() inside the loop)")
    if g.syncs_inside():
        said.append("a synchronize inside the loop: the host waits until chunk i is done before it issues "
                    "chunk i+1, so the copy engine idles while the GPU computes; synchronize once, after the loop")
    return said


def check_streams(run, *, name: str = "your schedule") -> Verdict:
    """run(g, images, chunks) -> the logits (host memory) of images (B, 1, S, S, pageable host
    memory) through chapter 10's network, issued through g, a convlab.streams.Recorder, in
    `chunks` chunks. Checked on STREAM_CASES: the same logits as the whole batch at once, no races
    (an operation reading memory another stream writes with nothing ordering them, the logits
    read before their copy back is known to be done), then the model time of the 8-chunk
    schedule on chapter 10's GPU against the longer of copy and compute (target in
    exercise_answers.TARGETS["10_streams"]). On a GPU it also times the schedule on 10,000 images."""
    import torch


    arch, forward = _stream_network()
    gen = torch.Generator().manual_seed(0)
    records = {}
    for B, chunks in STREAM_CASES:
        case = f"{B} images in {chunks} chunks"
        images = torch.randn(B, 1, arch.image_size, arch.image_size, generator=gen)
        ref = torch.full((B, arch.classes), float("nan"), device=cl.device().torch_device)
        forward(images.to(ref.device), ref)                  # the whole batch at once
        g = streams.Recorder(forward, classes=arch.classes)
        try:
            out = checked_launch(lambda: run(g, images, chunks))
        except Exception as e:  # noqa: BLE001 (a check must never stop the notebook)
            text = _fault(run, describe_error(e))
            return _say(False, text if text.startswith("not done") else f"✗ {case}: {text}")
        if out is None:
            todo = _todo_left(run)
            return _say(False, f"not done yet: {todo} is still there" if todo else
                               f"✗ {case}: {name} returned None: does it end with `return out_host`?")
        if g.problems:
            return _say(False, f"✗ {case}: {g.problems[0]}")
        late = g.unfinished(out)
        if late:
            return _say(False, f"✗ {case}: the host reads the logits while {late[0].what} may still be running: "
                               f"nothing made the host wait for it (g.synchronize() after the loop)")
        if isinstance(out, torch.Tensor) and g.where(out) == "device":
            return _say(False, f"✗ {case}: {name} returned device memory: copy the logits back to host memory "
                               f"and return that")
        missing = torch.isnan(torch.as_tensor(out, dtype=torch.float64)).all(dim=-1).nonzero().flatten().tolist()
        if missing and len(missing) < B:
            step = -(-B // chunks)
            sizes = [min(step, B - b0) for b0 in range(0, B, step)]
            return _say(False, f"✗ {case}: the logits of images {missing[0]}..{missing[-1]} never came back: the "
                               f"chunks must cover the whole batch, the last taking what is left when {chunks} does "
                               f"not divide {B} (here chunks of {', '.join(map(str, sizes))})")
        ok, text = verdict(out, ref.cpu(), labels=("image", "class"))
        if not ok:
            if text.startswith(NOTHING):
                return _say(False, _nothing(run, text, out_index=None))
            return _say(False, f"✗ {case}: not the logits of the whole batch at once: {text}")
        records[(B, chunks)] = g
    B, chunks = STREAM_CASES[0]
    g = records[(B, chunks)]
    model = streams.Model.from_chapter()
    ms = model.time(g.ops, B)
    ratio, target = ms / model.longer_ms, TARGETS["10_streams"]["time over the longer of copy and compute"]
    said = (f"{B} images in {chunks} chunks would take {ms:.2f} ms on the chapter's {model.gpu} at "
            f"{streams.CHAPTER_IMAGES:,} images, {ratio:.2f}× the longer of copy and compute "
            f"({model.longer_ms:.2f} ms; target ≤ {target:g})")
    if ratio > target + 1e-9:
        causes = _stream_mistakes(g, chunks) or [
            "the copies and the computes overlap too little: chunk i+1's copy in should run while chunk i computes"]
        verdict_ = _say(False, f"✗ correct (the same logits as the whole batch at once, no races), but not "
                               f"within the target: {said}:\n  " + "\n  ".join(causes))
    else:
        verdict_ = _say(True, f"✓ correct: the same logits as the whole batch at once, no races; {said}")
    if cl.backend() == "cuda":      # the real thing: the chapter's batch, timed by CUDA events per op
        images = torch.randn(streams.CHAPTER_IMAGES, 1, arch.image_size, arch.image_size, generator=gen)
        spans = []
        for _ in range(3):
            g = streams.Recorder(forward, classes=arch.classes)
            if attempt(run, g, images, chunks) is None:
                return verdict_
            torch.cuda.synchronize()
            ends = g.measured().values()
            spans.append(max(e for _, _, e in ends) - min(a for _, a, _ in ends))
        print(f"  on this GPU ({torch.cuda.get_device_name()}): {sorted(spans)[1]:.2f} ms from the first copy's "
              f"start to the last one's end, {streams.CHAPTER_IMAGES:,} images in {chunks} chunks (CUDA events, "
              f"median of 3 runs); the model, for the chapter's GPU: {model.time(g.ops, streams.CHAPTER_IMAGES):.2f} ms")
    return verdict_


#: Shapes (B, C, M, H, W, K) of a conv + bias + ReLU + 2x2 max pool stage: odd conv outputs (the
#: last row or column is dropped), C > 1, one image, K = 1.
STAGE_SHAPES = [(2, 1, 4, 20, 20, 7), (2, 3, 5, 17, 22, 5), (1, 4, 16, 15, 13, 7),
                (3, 2, 3, 9, 10, 3), (1, 2, 2, 6, 7, 1)]


def check_stage(launch, shapes=None, *, name: str = "your kernel") -> Verdict:
    """launch(x, w, bias, y) computes max_pool2d(relu(conv2d(x, w) + bias), 2) (stride 1, no padding)
    into y (B, M, Ho//2, Wo//2), which starts as NaN; checked on STAGE_SHAPES against fp64."""
    import torch
    import torch.nn.functional as F


    shapes = STAGE_SHAPES if shapes is None else shapes

    def cases():
        for B, C, M, H, W, K in shapes:
            x, w, b = cl.randn(B, C, H, W), cl.randn(M, C, K, K), cl.randn(M)
            xd, wd, bd = x.double().cpu(), w.double().cpu(), b.double().cpu()
            conv = lambda ww, bb=None, xd=xd: F.conv2d(xd, ww, bb)  # noqa: E731
            pool = lambda t: F.max_pool2d(t, 2)  # noqa: E731
            ref = pool(torch.relu(conv(wd, bd)))
            mistakes = [
                ("the mask is flipped: that is convolution, but the course computes cross-correlation, "
                 "x[..][2py+dy+ky][2px+dx+kx] * w[m][c][ky][kx]", lambda wd=wd, bd=bd, conv=conv, ref=ref: pool(torch.relu(conv(wd.flip(-1, -2), bd)))),
                ("the mask's axes are swapped: w[m][c][kx][ky] where w[m][c][ky][kx] belongs",
                 lambda wd=wd, bd=bd, conv=conv, ref=ref: pool(torch.relu(conv(wd.transpose(-1, -2), bd)))),
                ("the ReLU is missing: the largest of the four must be at least 0 (fmaxf(v, 0.0f))",
                 lambda wd=wd, bd=bd, conv=conv, ref=ref: pool(conv(wd, bd))),
                ("the bias is missing: bias[m] is added to every conv output (once to the largest is enough)",
                 lambda wd=wd, conv=conv: pool(torch.relu(conv(wd)))),
                ("the bias comes after the ReLU: ReLU(max + bias), not ReLU(max) + bias",
                 lambda wd=wd, bd=bd, conv=conv, ref=ref: pool(torch.relu(conv(wd))) + bd.view(1, -1, 1, 1)),
                ("that is average pooling: the window's output is the largest of its four values, not their mean",
                 lambda wd=wd, bd=bd, conv=conv, ref=ref: F.avg_pool2d(torch.relu(conv(wd, bd)), 2)),
                ("that is average pooling: the window's output is the largest of its four values, not their mean",
                 lambda wd=wd, bd=bd, conv=conv: torch.relu(F.avg_pool2d(conv(wd, bd), 2))),
                ("the window is 2×2 conv outputs at rows 2py, 2py+1 and columns 2px, 2px+1: only (2py, 2px) "
                 "was taken", lambda wd=wd, bd=bd, conv=conv, ref=ref: torch.relu(conv(wd, bd))[..., 0:2 * (ref.shape[-2]):2, 0:2 * ref.shape[-1]:2]),
                ("the windows overlap: pooled output (py, px) takes the conv outputs at rows 2py, 2py+1 and columns "
                 "2px, 2px+1, so its input row is 2 * py + dy + ky, not py + dy + ky",
                 lambda wd=wd, bd=bd, conv=conv, ref=ref: F.max_pool2d(torch.relu(conv(wd, bd)), 2, stride=1)[
                     ..., :ref.shape[-2], :ref.shape[-1]]),
            ]
            y = cl.empty(*ref.shape)
            yield _Case(f"B={B} C={C} M={M} {H}×{W} K={K}", "", lambda x=x, w=w, b=b, y=y: launch(x, w, b, y),
                        y, ref, mistakes=mistakes)

    return _run_cases(launch, cases(), name=name, labels=("b", "m", "py", "px"), out_index=3,
                      passed=f"matches the fp64 stage on all {len(shapes)} shapes")


#: The shape check_counters runs a conv2d kernel on: a few warps of rows wider than one, padding.
COUNTER_SHAPE = Shape(1, 2, 4, 24, 40, 5, pad=2, why="the counters' shape")


def _macs(shape: Workload) -> int:
    return shape.B * shape.M * shape.Ho * shape.Wo * shape.C * shape.K * shape.K


#: What check_counters grades, from one kernel's emulator counters (k.metrics) and the
#: multiply-adds of the launch: (its value, its unit for the verdict). "shared loads per
#: multiply-add" needs k.trace, a trace of every block of the launch (cl.trace): shared_values.
def _quantity(what: str, k, macs: int | None) -> float | None:
    m = k.metrics
    if what == "sectors per load request":
        return k.sectors_per_request("ld")
    if what == "sectors per store request":
        return k.sectors_per_request("st")
    if what == "shared bank conflicts":
        return (m["l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"]
                + m["l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"])
    if what == "global load bytes per multiply-add":
        return 32 * m["l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"] / macs if macs else None
    if what == "shared loads per multiply-add":      # the values each thread loads (shared_values)
        if getattr(k, "trace", None) is None:
            raise ValueError("shared loads per multiply-add are counted from a trace of every block of the launch "
                             "(cl.trace(..., blocks=every block)): k.trace")
        return len(shared_values(k.trace)) / macs if macs else None
    if what == "global atomics":                     # warp instructions, as ncu counts them

        return k.value(ATOMICS)
    if what == "constant addresses per request":     # each served in turn by the constant cache

        requests = m.get(EMU_CONSTANT_REQUESTS, 0)
        return m[EMU_CONSTANT_ADDRESSES] / requests if requests else None
    raise ValueError(f"check_counters grades {', '.join(COUNTERS)}; not {what!r}")


COUNTERS = ("sectors per load request", "sectors per store request", "shared bank conflicts",
            "global load bytes per multiply-add", "shared loads per multiply-add", "global atomics",
            "constant addresses per request")

#: The accesses of card.lines() behind each quantity: the line named under a missed target is one of them.
_ACCESSES = {"sectors per load request": ("global load",), "global load bytes per multiply-add": ("global load",),
             "sectors per store request": ("global store",), "shared bank conflicts": ("shared load", "shared store"),
             "global atomics": ("global atomic",)}


def shared_values(trace):
    """The shared-memory values a traced launch's threads load, as compiled code loads them: each
    4-byte word once per thread and barrier interval. A word the thread read before in the same
    interval is still in a register (nvcc keeps it there: no other thread may write it before the
    next barrier, and the thread's own stores it forwards), and the width of the load instructions
    is the compiler's (it merges a float4's worth of neighbouring floats into one load where it can
    prove the alignment), so neither a float4 written as four floats nor a value read again inside
    a loop is counted twice (checked against nvcc's PTX in tests/test_exercise_mutants.py). Where
    nvcc keeps two reads apart (each under its own condition) this counts one. trace: cl.trace of
    every block. A DataFrame, one row per (block, thread, interval, word), with the source line of
    its first read ("line")."""
    import pandas as pd

    a = trace.accesses
    r = a[(a.space == "shared") & (a.access == "read")]
    words = np.maximum(r.bytes.to_numpy() // 4, 1)
    rows = np.repeat(np.arange(len(r)), words)
    within = np.arange(len(rows)) - np.repeat(np.cumsum(words) - words, words)
    df = pd.DataFrame({c: r[c].to_numpy()[rows] for c in ("bx", "by", "bz", "thread", "phase", "line")})
    df["word"] = (r.addr.to_numpy().astype(np.uint64)[rows] >> np.uint64(2)) + within.astype(np.uint64)
    return df.drop_duplicates(["bx", "by", "bz", "thread", "phase", "word"]).reset_index(drop=True)


def _every_block(grid: str) -> list:
    """Every block of a launch's grid, as a KernelProfile gives it ("(5, 1, 1)")."""
    gx, gy, gz = (int(v) for v in grid.strip("()").split(","))
    return [(bx, by, bz) for bz in range(gz) for by in range(gy) for bx in range(gx)]


def _traced(call, card):
    """The last kernel of a profiled call, run again with every block traced: a KernelProfile with
    its trace (the quantities counted from accesses)."""
    k = card.kernels[-1]
    return cl.trace(call, blocks=_every_block(k.grid), launch=len(card.kernels) - 1).profile


def _costliest_line(card, missed=(), traced=None) -> str:
    """The source line a student looks at first: under a missed target, the line that makes most
    of that quantity (the most shared values loaded, the most sectors of a global load, the most
    bank conflicts); otherwise the line whose accesses move the most sectors or wavefronts."""
    if "shared loads per multiply-add" in missed and traced is not None:
        per_line = shared_values(traced.trace).groupby("line").size()
        if len(per_line):
            line = per_line.idxmax()
            return (f"\n  the line that loads the most from shared memory: {line} ({per_line[line]:,} values, each "
                    f"counted once per thread and barrier interval)")
    try:
        df = card.lines(len(card.kernels) - 1).reset_index()
    except Exception:  # noqa: BLE001 (no lines on this card: nothing to add)
        return ""
    kinds = {kind for q in missed for kind in _ACCESSES.get(q, ())}
    if kinds:
        df = df[df.access.isin(kinds)]
    best, text = -1.0, ""
    for _, row in df.iterrows():
        if "shared bank conflicts" in missed:
            n = row.get("bank conflicts")
            if n is not None and not (isinstance(n, float) and math.isnan(n)) and float(n) > best:
                best, text = float(n), f"{row['source line']} ({row['access']}: {float(n):,.0f} bank conflicts)"
            continue
        for unit in ("sectors", "wavefronts"):
            per = row.get(f"{unit} per request")
            if per is not None and not (isinstance(per, float) and math.isnan(per)):
                moved = float(per) * float(row["requests"])
                if moved > best:
                    best, text = moved, f"{row['source line']} ({row['access']}: {moved:,.0f} {unit})"
    return f"\n  the line that moves the most: {text}" if text else ""


def check_counters(launch, targets: dict, *, shape: Workload | None = None, result=None,
                   macs: int | None = None, name: str = "your kernel") -> Verdict:
    """Correct first, then the emulator's memory counters against targets {quantity: most allowed}
    (quantities: COUNTERS). With shape, launch(x, w, y, stride, pad) is a conv2d launch, run once
    on that shape under cl.profile and its output held to the fp64 reference; without, launch()
    takes no arguments, result() -> (got, expected) says whether its output is right and macs
    (its multiply-adds) is what the "per multiply-add" quantities divide by. Prints
    e.g. "✓ correct; 4 sectors per load request (target ≤ 4.5); ..." and the line to look at
    (under a missed target, the line that makes most of that quantity).

    What is counted is what the GPU would do with the kernel as nvcc compiles it, so that a
    target never punishes what the compiler does for the student: global memory in the sectors and
    requests the emulator's warps make (nvcc keeps a global load where the code has it); shared
    loads as the values each thread loads (shared_values: a word once per thread and barrier
    interval, whatever the width of the loads, since nvcc keeps a value already loaded in a
    register and merges neighbouring floats into vector loads). Targets made by check_targets for
    another shape than this one (a Targets with derive) are made again for this shape."""
    import torch


    if getattr(targets, "derive", None) is not None and shape is not None and cl.backend() == "emu" \
            and _dims(shape) != _dims(targets.shape):
        targets = targets.derive(shape)
    for what in targets:
        if what not in COUNTERS:
            raise ValueError(f"check_counters grades {', '.join(COUNTERS)}; not {what!r}")
    if cl.backend() != "emu":
        verdict_ = _say(False, "the counters are graded on the emulator: run this notebook with "
                               "CONVLAB_BACKEND=emu (on a GPU, cl.profile gives ncu's counters to read yourself)")
        if shape is not None:
            compare_on_gpu(launch, targets, name=name)
        return verdict_
    if shape is not None:
        x, w = cl.randn(shape.B, shape.C, shape.H, shape.W), cl.randn(shape.M, shape.C, shape.K, shape.K)
        y = cl.empty(shape.B, shape.M, shape.Ho, shape.Wo)
        call = lambda: launch(x, w, y, shape.stride, shape.padding)  # noqa: E731
        macs = _macs(shape)
    else:
        call = launch
    try:
        card = cl.profile(call)
    except Exception as e:  # noqa: BLE001 (a check must never stop the notebook)
        text = _fault(launch, describe_error(e))
        return _say(False, text if text.startswith("not done") else f"✗ {text}")
    if shape is not None:
        ok, text = verdict(y, cl.ref.conv2d(x, w, stride=shape.stride, padding=shape.padding),
                           inputs=(x, w, shape.stride, shape.padding))
    else:
        try:
            got, want = result()
        except Exception as e:  # noqa: BLE001
            return _say(False, f"✗ {describe_error(e)}")
        ok, text = verdict(got, want, labels="ijk")
    if not ok:
        if text.startswith(NOTHING):
            text = _nothing(launch, text, out_index=2 if shape is not None else None)
            return _say(False, text)
        return _say(False, f"✗ {name}{f' on {shape}' if shape else ''}: {text}")
    if not card.kernels:
        return _say(False, f"✗ {name} launched no kernel")
    k, traced = card.kernels[-1], None
    if "shared loads per multiply-add" in targets:
        try:
            traced = _traced(call, card)
        except Exception as e:  # noqa: BLE001 (a check must never stop the notebook)
            return _say(False, f"✗ {describe_error(e)}")
    parts, missed = [], []
    for what, most in targets.items():
        got = _quantity(what, traced if what == "shared loads per multiply-add" else k, macs)
        if got is None:
            parts.append(f"no {what} (the kernel makes no such access)")
            continue
        good = got <= most + 1e-9
        if not good:
            missed.append(what)
        shown = f"{got:,.0f}" if float(got).is_integer() else f"{got:.3g}"
        parts.append(f"{shown} {what} (target {'≤ ' if most else ''}{most:g}){'' if good else ' ✗'}")
    lead = "✓ correct" if not missed else "✗ correct, but not within the targets"
    source = f"\n  the targets: {targets.source}" if getattr(targets, "source", "") else ""
    verdict_ = _say(not missed, f"{lead}: {name}: " + "; ".join(parts) + source
                    + _costliest_line(card, missed, traced))
    if shape is not None:
        compare_on_gpu(launch, targets, name=name)
    return verdict_


def _comparison(key):
    """(workload, the chapter's Impl) an exercise's kernel is timed against, or None."""
    import importlib


    if key not in COMPARE:
        return None
    wl_name, module, impl_name = COMPARE[key]
    mod = importlib.import_module(f"convlab.ops.{module}")
    impls = [v for v in vars(mod).values() if hasattr(v, "launcher")] + list(getattr(mod, "IMPLEMENTATIONS", ()))
    return get(wl_name), next(i for i in impls if i.name == impl_name)


def torch_best_row(workload: str) -> dict | None:
    """book/data/torch.csv's fastest fp32 forward row of a layer (either layout), or None."""
    import csv
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "book" / "data" / "torch.csv"
    if not path.is_file():
        return None
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["workload"] == workload and r["pass"] == "forward"
                and r["dtype"] == "fp32" and r["kind"] == "torch"]
    return min(rows, key=lambda r: float(r["ms"])) if rows else None


def side_by_side(wl, device: str, chapter: str, yours, theirs, torch_row: dict | None) -> str:
    """The three GPU times of check_counters's comparison as lines of text: your kernel, the
    chapter's (each a cl.bench Timing), torch best from book/data/torch.csv (its GPU and kernel named)."""

    lines = [f"  on {device}, {wl.name} ({wl.shape_text}), GPU time (median of 20, IQR):"]

    def line(who, ms, p25, p75, note=""):
        lines.append(f"    {who:<22}{ms:>9.4g} ms ({p25:.4g}–{p75:.4g}){note}")
    line("your kernel", yours.ms, yours.p25, yours.p75, f", {yours.ms / theirs.ms:.2f}× the chapter's")
    line("the chapter's kernel", theirs.ms, theirs.p25, theirs.p75, f": {chapter}")
    if torch_row is None:
        lines.append("    torch best            (not in book/data/torch.csv)")
    else:
        algorithm, kernel = torch_algorithm(torch_row["torch_kernels"])
        where = "" if torch_row["gpu"] == device else f", measured on {torch_row['gpu']}, not this GPU"
        line("torch best", float(torch_row["ms"]), float(torch_row["p25"]), float(torch_row["p75"]),
             f": {torch_row['impl']}, {algorithm} ({kernel}){where}")
    return "\n".join(lines)


def compare_on_gpu(launch, targets, *, name: str = "your kernel") -> None:
    """On a GPU: launch(x, w, y, stride, pad) timed with cl.bench on the exercise's course layer
    beside the chapter's own kernel and torch best (exercise_answers.COMPARE, by the key
    check_targets gave targets); on the emulator, one line saying so. Prints; never raises."""
    import torch



    found = _comparison(getattr(targets, "key", None))
    if found is None:
        return
    wl, impl = found
    if cl.backend() == "emu":
        print(f"  (timing {name} against the chapter's kernel and torch best on {wl.name} needs a GPU)")
        return
    try:
        t = inputs(wl, "forward")
        y = cl.empty(*wl.y_shape)
        ours = cl.bench(lambda: launch(t["x"], t["w"], y, wl.stride, wl.padding))
        chapter = call(impl, wl, t, impl.config(wl))
        want = chapter()
        theirs = cl.bench(chapter)
    except Exception as e:  # noqa: BLE001 (a check must never stop the notebook)
        print(f"  timing on {wl.name}: {describe_error(e)}")
        return
    if not torch.allclose(y, want, rtol=1e-3, atol=1e-3 * float(want.abs().max())):
        print(f"  on {wl.name} your kernel's output differs from the chapter's kernel's: not timed")
        return
    print(side_by_side(wl, cl.device().name, impl.name, ours, theirs, torch_best_row(wl.name)))



def _mask_index_mistakes(x, w, stride: int, pad: int):
    """(what, the output it gives) for an index into a flat mask that leaves out the map or channel."""

    x, w = x.detach().cpu().double(), w.detach().cpu().double()
    M, C, K = w.shape[0], w.shape[1], w.shape[-1]
    conv = lambda ww: cl.ref.conv2d(x, ww, stride=stride, padding=pad)  # noqa: E731
    tap = "map m, channel c, tap (p, q) is element ((m * C + c) * K + p) * K + q of the flat mask"
    if M * C > 1:
        yield (f"every map and channel reads the first K×K taps: the index into the mask leaves out m and c; {tap}",
               lambda: conv(w[:1, :1].expand_as(w)))
    if C > 1:
        yield (f"the index into the mask leaves out the channel c: {tap}",
               lambda: conv(w.reshape(-1)[:M * K * K].reshape(M, 1, K, K).expand_as(w)))
    if M > 1 and C > 1:
        yield (f"the index into the mask puts the channel before the map, ((c * M + m) * K + p) * K + q: {tap}",
               lambda: conv(w.reshape(C, M, K, K).transpose(0, 1)))


def _global_reads(launch, arg: str, shape: Shape) -> str | None:
    """Where a conv2d launch reads its argument `arg` from global memory (block 0's first such
    read, as "line: code"), or None."""

    x, w = cl.randn(shape.B, shape.C, shape.H, shape.W), cl.randn(shape.M, shape.C, shape.K, shape.K)
    y = cl.empty(shape.B, shape.M, shape.Ho, shape.Wo)
    try:
        a = cl.trace(launch, x, w, y, shape.stride, shape.padding, blocks=[(0, 0, 0)]).accesses
    except Exception:  # noqa: BLE001 (the verdict is already printed: this only adds where)
        return None
    hits = a[(a.buffer == arg) & (a.space == "global") & (a.access == "read")]
    return f"{hits.line.iloc[0]}: `{hits.code.iloc[0]}`" if len(hits) else None


def check_constant_mask(launch, module, targets: dict, *, constant: str = "c_mask", mask_arg: str = "w",
                        name: str = "your kernel") -> Verdict:
    """Exercise 3a.2: launch(x, w, y, stride, pad) runs a conv2d kernel of `module` that reads its
    mask from the __constant__ array `constant`, which the launch fills. Before each awkward shape
    the check zeroes that array, so a launch that never fills it (or fills it after the kernel ran)
    gives zeros and is told so; an array too small for a mask is told with the mask's size; an
    index that leaves out the map or channel is named. Then check_counters on COUNTER_SHAPE against
    targets; where they miss, a traced block says where the kernel still reads the mask from global
    memory (its argument `mask_arg`), and too many constant addresses per request are said to be
    lanes reading different elements (the constant cache serves them in turn)."""
    import torch


    def zeroed_first(call, w):
        def run():
            try:   # what the array holds before any fill: zeros
                module.set_constant(constant, torch.zeros(w.numel()))
            except cl.ArgumentError as e:
                if "holds" not in str(e):
                    raise
                raise cl.ArgumentError(
                    f"{e}: `{constant}` is too small for this layer's mask, {'×'.join(map(str, w.shape))} = "
                    f"{w.numel():,} floats ({4 * w.numel():,} bytes): declare it with room for the largest mask "
                    f"the kernel takes (chapter 3's MASK_MAX, 16,384 floats: the 64 KB of constant memory)") from None
            return call()
        return run

    cases = list(_conv2d_cases(launch, AWKWARD_SHAPES, fp16=None, locate=None))
    for case in cases:
        case.call = zeroed_first(case.call, case.inputs[1])
        case.mistakes = list(_mistakes(*case.inputs)) + list(_mask_index_mistakes(*case.inputs))
    never_copied = (f"\n  Here the likely cause: the mask was never copied into `{constant}`, so the kernel read "
                    f"zeros. A __constant__ array holds zeros until the launch fills it, "
                    f"`module.set_constant(\"{constant}\", w)`, before the kernel's launch")
    right = _run_cases(launch, cases, name=name, nothing_hint={"outputs are 0": never_copied},
                       passed=f"matches the fp64 reference on all {len(cases)} shapes (awkward sizes, C=1, "
                              f"B=1, odd and even K, stride 2, padding)")
    if not right:
        return right
    graded = check_counters(launch, targets, shape=COUNTER_SHAPE, name=name)
    if not graded and graded.text.startswith("✗ correct, but"):
        where = _global_reads(launch, mask_arg, COUNTER_SHAPE)
        if where:
            print(f"  the mask is still read from global memory: {where} reads `{mask_arg}`; read "
                  f"`{constant}` there")
        most = targets.get("constant addresses per request")
        if most is not None and f"constant addresses per request (target ≤ {most:g}) ✗" in graded.text:
            print(f"  a warp's lanes read different elements of `{constant}` at once, and the constant cache "
                  f"serves one address at a time: index it by what the warp's threads share (m, c, p, q), "
                  f"not by the thread")
    return graded

#: Layers that catch the mistakes of groups and dilation: depthwise, groups of several channels to
#: several maps, dilation with stride and padding, an even mask, a window wider than the image.
GENERAL_SHAPES = [
    Shape(1, 4, 4, 9, 8, 3, pad=1, groups=4, why="depthwise: groups = C"),
    Shape(2, 6, 4, 11, 10, 3, pad=2, dilation=2, groups=2, why="2 groups, dilation 2"),
    Shape(2, 6, 9, 10, 11, 2, dilation=2, groups=3, why="even K, 3 groups of 2 channels to 3 maps"),
    Shape(1, 8, 6, 13, 12, 3, stride=2, pad=1, dilation=3, groups=2, why="stride 2, dilation 3"),
    Shape(1, 3, 2, 7, 7, 3, pad=4, dilation=4, why="one group, a 9-wide window over a 7×7 image"),
]


def _general_mistakes(x, w, s: Workload):
    """(what, the output it gives) for the usual mistakes of groups and dilation, on the reference."""
    import torch.nn.functional as F

    x, w = x.detach().cpu().double(), w.detach().cpu().double()
    Cg = s.C // s.groups
    kw = dict(stride=s.stride, padding=s.padding)
    if s.dilation > 1:
        yield ("the dilation is missing from the input's index: tap p reads row h*stride - pad + p, but it "
               f"must be h*stride - pad + p*dilation (dilation={s.dilation})",
               lambda: F.conv2d(x, w, groups=s.groups, **kw)[..., :s.Ho, :s.Wo])
    if s.groups > 1:
        yield ("every map reads the first group's channels: map m belongs to group g = m / (M/groups), and "
               f"reads channels g*C/groups to g*C/groups + C/groups - 1 (here C/groups = {Cg})",
               lambda: F.conv2d(x[:, :Cg], w, dilation=s.dilation, **kw))


def check_general_kernel(launch, shapes=None, *, name: str = "your kernel") -> Verdict:
    """launch(x, w, y, stride, pad, dilation, groups) runs a kernel on fresh random x (B, C, H, W)
    and w (M, C/groups, K, K), on the backend's device, into y (B, M, Ho, Wo), which starts poisoned
    with NaN. Each shape of GENERAL_SHAPES (or `shapes`) is checked against torch's conv2d in fp64
    through the checks' common path; a wrong output is also tried against the usual mistakes
    (dilation left out of the input's index, every map reading the first group)."""

    shapes = list(GENERAL_SHAPES if shapes is None else shapes)

    def cases():
        for s in shapes:
            x, w = cl.randn(s.B, s.C, s.H, s.W), cl.randn(s.M, s.C // s.groups, s.K, s.K)
            y = cl.empty(s.B, s.M, s.Ho, s.Wo)
            yield _Case(str(s), s.note, lambda x=x, w=w, y=y, s=s: launch(x, w, y, s.stride, s.padding, s.dilation,
                                                                          s.groups),
                        y, _general_reference(x, w, s), mistakes=list(_general_mistakes(x, w, s)))

    return _run_cases(launch, cases(), name=name,
                      passed=f"matches the fp64 reference on all {len(shapes)} shapes (depthwise, grouped, "
                             "dilated, with stride, padding and an even mask)")


def _general_reference(x, w, s: Workload):
    """torch's conv2d of layer s in fp64."""
    import torch.nn.functional as F

    return F.conv2d(x.detach().cpu().double(), w.detach().cpu().double(), stride=s.stride, padding=s.padding,
                    dilation=s.dilation, groups=s.groups)


def check_value(name: str, got, expected, *, rel: float = 1e-9) -> Verdict:
    """A number (or a collection of them) against the expected one; says how far off, not the answer."""
    if got is None:
        return _say(False, f"not done yet: {name} is None")
    if isinstance(expected, (set, frozenset, list, tuple)):
        if isinstance(got, (str, bytes)) or not hasattr(got, "__iter__"):
            return _say(False, f"✗ {name}: expected a list, got {type(got).__name__}")
        got_items, want_items = set(map(str, got)), set(map(str, expected))
        if got_items == want_items:
            return _say(True, f"✓ correct: {name}")
        hints = []
        if want_items - got_items:
            hints.append(f"{len(want_items - got_items)} missing")
        if got_items - want_items:
            hints.append(f"{len(got_items - want_items)} that should not be there")
        return _say(False, f"✗ {name}: {', '.join(hints)}")
    try:
        g, e = float(got), float(expected)
    except (TypeError, ValueError):
        return _say(False, f"✗ {name}: expected a number, got {type(got).__name__}")
    if math.isnan(g):
        return _say(False, f"✗ {name} is NaN: it was computed from a value that was never written "
                           f"(an output still NaN, or shared memory no thread wrote)")
    if math.isclose(g, e, rel_tol=rel, abs_tol=0.0):
        return _say(True, f"✓ correct: {name} = {got:,}" if isinstance(got, int) else f"✓ correct: {name} = {g:.6g}")
    if e == 0:
        return _say(False, f"✗ {name} = {g:,.6g}, but it should be 0")
    return _say(False, f"✗ {name} = {g:,.6g} is off by a factor of {g / e:.3g}: "
                       f"recount (which factor is missing or extra?)")


def check_prediction(what: str, predicted: dict, measured: dict, *, rel: float = 1e-9) -> Verdict:
    """Predictions (case -> number) against what the profiler measured for the same cases: says which
    cases differ and by how much, so the reasoning can be revisited."""
    if predicted is None or any(v is None for v in predicted.values()):
        return _say(False, f"not done yet: fill in every predicted {what}")
    missing = [k for k in measured if k not in predicted]
    if missing:
        return _say(False, f"✗ no prediction of {what} for {', '.join(map(str, missing))}")
    wrong = []
    for case, got in measured.items():
        try:
            p = float(predicted[case])
        except (TypeError, ValueError):
            return _say(False, f"✗ {what} for {case}: expected a number, got {type(predicted[case]).__name__}")
        if not math.isclose(p, float(got), rel_tol=rel, abs_tol=0.0):
            wrong.append(f"{case}: you predicted {p:g}, the profiler counted {float(got):g}")
    if wrong:
        return _say(False, f"✗ {what}: " + "; ".join(wrong))
    return _say(True, f"✓ correct: every predicted {what} matches the profiler ({len(measured)} cases)")


#: Fewer timed runs than this say no spread: a quartile of 5 numbers is about one of them.
TIMING_RUNS = 10


def _timed(log) -> tuple[list, list]:
    """From a simulated GPU's log: the samples a harness read (elapsed_time's, and the host clock's
    differences around a call of fn) and, for each, the launches inside it."""
    samples = [(ms, [L for L in log.launches if a <= L.start_ms - L.other_ms and L.end_ms <= b + 1e-9])
               for a, b, ms in log.elapsed]
    for c0, c1 in zip(log.clock, log.clock[1:]):
        inside = [L for L in log.launches if c0 <= L.begin_ms and L.host_ms <= c1]
        if inside:
            samples.append((c1 - c0, inside))
    return [ms for ms, _ in samples], [ls for _, ls in samples]


def check_timing(time_it, *, seed: int | None = None) -> Verdict:
    """time_it(fn, gpu) -> (median ms, 25th, 75th percentile): a timing harness, graded on a
    simulated GPU (convlab.simgpu.SimGPU) whose kernel's cold-cache time is known, and named by its
    mistake: a host clock read without synchronize, events read before they completed, the first
    (compiling) call timed, too few runs, the flush timed with the kernel, a hot L2, the mean, a
    "median" that is no middle run (named: the fastest, the slowest, the first or last, a
    quartile), wrong quartiles. On a GPU it is then compared with cl.bench on chapter 2's flat
    naive kernel (lenet_c1)."""
    import random
    import statistics


    rng = random.Random(seed)
    true_ms = round(rng.uniform(0.4, 1.6), 3)
    gpu = simgpu.SimGPU(ms=true_ms, seed=rng.randrange(1 << 30))
    kernel = gpu.kernel()
    try:
        result = time_it(kernel, gpu)
    except simgpu.NotReady as e:
        unfinished = _unfinished(time_it)
        return unfinished if unfinished is not None else _say(False, (
            f"✗ events recorded but not waited for: {e}. An event completes when the GPU reaches it, "
            f"after the kernel; the host gets there first, since a launch returns at once"))
    except Exception as e:  # noqa: BLE001 (a check must never stop the notebook)
        text = _fault(time_it, describe_error(e))
        return _say(False, text if text.startswith("not done") else f"✗ {text}")
    if result is None or (isinstance(result, (tuple, list)) and None in result):
        unfinished = _unfinished(time_it)
        return unfinished if unfinished is not None else _say(
            False, f"✗ time_it returned {result!r}: does it end with `return median, p25, p75`, each a number?")
    try:
        ms, p25, p75 = (float(v) for v in result)
    except (TypeError, ValueError):
        return _say(False, f"✗ time_it returns the median and the quartiles, (ms, p25, p75); it returned "
                           f"{type(result).__name__} {result!r:.60}")
    log = gpu.log
    if not log.launches:
        return _say(False, "✗ time_it never called fn: nothing was launched")
    samples, inside = _timed(log)
    if not samples:
        return _say(False, "✗ no run of fn was timed: read the clock, or record events, before and after fn()")
    timed = [L for ls in inside for L in ls]
    # the host's clock read when fn() returns, before the GPU ran the kernel
    early = [L for c0, c1 in zip(log.clock, log.clock[1:]) for L in log.launches
             if c0 <= L.begin_ms and L.host_ms <= c1 < L.end_ms]
    if early and not log.elapsed:
        short = statistics.median(samples)
        return _say(False, (
            f"✗ the host's clock times only the launch: {short:.3g} ms, while the kernel takes about "
            f"{true_ms:g} ms. fn() queues the kernel and returns at once; the GPU runs it later. Wait for "
            f"it (gpu.synchronize()) before reading the clock, or time it on the GPU with events"))
    if any(L.compiled for L in timed):
        return _say(False, (
            f"✗ no warm-up: the first call of fn was timed, and it compiles the kernel "
            f"({simgpu.COMPILE_MS:g} ms here, before the GPU even starts). Call fn once (or a few times) "
            f"before the timed runs"))
    if len(samples) < TIMING_RUNS:
        per = f" ({len(timed)} calls in one interval: their mean, with no spread)" if len(timed) > len(samples) else ""
        return _say(False, (
            f"✗ {len(samples)} timed run{'s' if len(samples) != 1 else ''}{per}: too few to say a spread. With "
            f"a few runs, one slowed by other work moves the median and the quartiles are each about one "
            f"run; the course takes 20"))
    # a flush (a buffer as large as L2 zeroed) between the start event and the kernel
    flushed = [(a, b) for a, b, _ in log.elapsed for z0, _, n in log.zeroed if n >= gpu.L2_BYTES and a <= z0 < b]
    if len(flushed) > len(samples) / 2:
        return _say(False, (
            f"✗ the L2 flush is inside the timed interval: {len(flushed)} of your {len(samples)} runs time the "
            f"flush too (zeroing {2 * gpu.L2_BYTES >> 20} MB), then the kernel. Flush before recording the start "
            f"event"))
    hot = sum(L.hot for L in timed)
    if hot > len(timed) / 2:
        return _say(False, (
            f"✗ a hot-cache time: {hot} of the {len(timed)} timed runs found their data still in L2 from the "
            f"run before ({ms:.3g} ms against a cold {true_ms:g} ms). A layer runs once per step, after other "
            f"layers have filled L2 with theirs: flush L2 before each run (gpu.flush_l2(), or zero a buffer "
            f"of at least gpu.L2_BYTES)"))
    median, mean = statistics.median(samples), statistics.mean(samples)
    qs, n = sorted(samples), len(samples)
    # a median has at most half the runs on either side of it (statistics.median, or the lower or
    # upper middle run); anything else is named by what it is
    below, above = sum(x < ms - 1e-12 for x in qs), sum(x > ms + 1e-12 for x in qs)
    named = next((text for value, text in (
        (qs[0], f"the fastest of your {n} runs (min(times))"), (qs[-1], f"the slowest of your {n} runs (max(times))"),
        (samples[0], f"the first of your {n} runs"), (samples[-1], f"the last of your {n} runs"),
        (p25, "your p25, the first quartile"), (p75, "your p75, the third quartile"),
        *zip(statistics.quantiles(samples, n=4)[::2], ("the first quartile of your runs (statistics.quantiles(times, "
                                                       "n=4) gives [p25, median, p75], in that order)",
                                                       "the third quartile of your runs (statistics.quantiles(times, "
                                                       "n=4) gives [p25, median, p75], in that order)")))
        if math.isclose(ms, value, rel_tol=1e-9, abs_tol=1e-12)), None)
    middle = 2 * below <= n and 2 * above <= n
    if not middle and named is None and abs(ms - mean) < abs(ms - median) and abs(mean - median) > 0.05 * median:
        slow = sum(L.other_ms > 0 for L in timed)
        return _say(False, (
            f"✗ {ms:.3g} ms is the mean of your {len(samples)} runs: {slow} of them waited behind other work "
            f"on the GPU and pull the mean up; the median ({median:.3g} ms) is what a run takes, whatever a "
            f"few outliers do (statistics.median)"))
    if not middle:
        what = named or f"no middle value of your {n} runs: {below} of them are faster, {above} slower"
        return _say(False, (
            f"✗ the median you return, {ms:.3g} ms, is {what}, not their median ({median:.3g} ms): the "
            f"median is the middle of the sorted times, half the runs faster and half slower "
            f"(statistics.median(times), or the middle value of statistics.quantiles(times, n=4))"))

    def rank(v):
        return sum(x <= v + 1e-12 for x in qs) / len(qs)
    if not (0.1 <= rank(p25) <= 0.4 and 0.6 <= rank(p75) <= 0.9 and p25 <= ms <= p75):
        return _say(False, (
            f"✗ the quartiles: p25 = {p25:.3g} and p75 = {p75:.3g} ms should cut off the fastest and the "
            f"slowest quarter of your runs (statistics.quantiles(times, n=4) gives [p25, median, p75]); "
            f"{rank(p25):.0%} of the runs are at most p25, {rank(p75):.0%} at most p75"))
    if abs(ms - true_ms) > 0.05 * true_ms:
        return _say(False, f"✗ time_it gives {ms:.3g} ms, but the simulated kernel takes {true_ms:g} ms cold")
    ok = _say(True, (
        f"✓ correct: on the simulated GPU time_it gives {ms:.3g} ms (IQR {p25:.3g}–{p75:.3g}) for a kernel "
        f"whose cold-cache time is {true_ms:g} ms"))
    return _timing_on_gpu(time_it) if ok else ok


def _timing_on_gpu(time_it) -> Verdict:
    """On a GPU: time_it and cl.bench on chapter 2's flat naive kernel on lenet_c1, side by side."""


    if cl.backend() == "emu":
        return _say(True, "  (on the emulator: comparing time_it with cl.bench on the chapter's kernel needs a GPU)")
    wl = get("lenet_c1")
    x, w = cl.randn(*wl.x_shape), cl.randn(*wl.w_shape)
    y = cl.empty(*wl.y_shape)
    run = lambda: naive.conv2d_naive_flat(x, w, y)  # noqa: E731
    try:
        ms, p25, p75 = (float(v) for v in time_it(run, simgpu.cuda()))
    except Exception as e:  # noqa: BLE001 (a check must never stop the notebook)
        return _say(False, f"✗ on {cl.device().name}: {describe_error(e)}")
    ref = cl.bench(run)
    agree = p25 <= ref.p75 and ref.p25 <= p75 or abs(ms - ref.ms) <= 0.05 * ref.ms
    return _say(agree, (
        f"  on {cl.device().name}, chapter 2's flat naive kernel on lenet_c1: time_it {ms:.4g} ms "
        f"(IQR {p25:.4g}–{p75:.4g}), cl.bench {ref.ms:.4g} ms (IQR {ref.p25:.4g}–{ref.p75:.4g})"
        + ("" if agree else ": they disagree by more than their spreads; what does cl.bench do that time_it "
                            "does not (convlab/bench.py)?")))


def _layer_text(shape) -> str:
    return (f"C={shape.C}, K={shape.K}, M={shape.M}, {shape.Ho}×{shape.Wo} output pixels per image, "
            f"B={shape.B}")


def check_pick(pick, times: dict, layers: dict, *, device: str) -> Verdict:
    """A dispatcher rule against measured times. pick(shape) returns the name of a kernel (or an Impl);
    times[layer][kernel] is the time (ms) measured on `device` of each kernel that took that layer;
    layers[layer] is the layer's shape (a Workload). Says on which layers the rule picks a slower
    kernel than the fastest measured, and how much slower."""
    kernels = list(dict.fromkeys(k for ms in times.values() for k in ms))
    slower, total, best_total = [], 0.0, 0.0
    for layer, shape in layers.items():
        measured = times[layer]
        try:
            choice = pick(shape)
        except Exception as e:  # noqa: BLE001 (a check must never stop the notebook)
            return _say(False, f"✗ {layer}: {describe_error(e)}")
        if choice is None:
            todo = _todo_left(pick)
            return _say(False, f"not done yet: {todo} is still there" if todo else
                               f"✗ your rule returned None for {layer}: does every path end in `return` a kernel's name?")
        choice = getattr(choice, "name", choice)
        if choice not in kernels:
            return _say(False, f"✗ {layer}: your rule returned {choice!r}, which is none of the kernels: "
                               + ", ".join(repr(k) for k in kernels))
        if choice not in measured:
            return _say(False, f"✗ {layer} ({_layer_text(shape)}): your rule picks {choice!r}, which does not "
                               f"take this layer (it was not measured on it); the kernels that do: "
                               + ", ".join(repr(k) for k in measured))
        best = min(measured, key=measured.get)
        total, best_total = total + measured[choice], best_total + measured[best]
        if measured[choice] > measured[best]:
            slower.append(f"{layer} ({_layer_text(shape)}): your rule picks {choice!r}, "
                          f"{measured[choice]:.4g} ms; {best!r} takes {measured[best]:.4g} ms, "
                          f"{measured[choice] / measured[best]:.2f}× faster")
    if slower:
        return _say(False, f"✗ on {len(slower)} of {len(layers)} layers your rule picks a slower kernel than the "
                           f"fastest measured on {device}:\n  " + "\n  ".join(slower)
                           + f"\n  all {len(layers)} layers: {total:.4g} ms with your rule, {best_total:.4g} ms "
                             f"with the fastest kernel of each")
    return _say(True, f"✓ correct: your rule picks the fastest kernel measured on {device} on all "
                      f"{len(layers)} layers ({best_total:.4g} ms in all)")


def _halves(reg: int) -> tuple[int, int]:
    return reg & 0xFFFF, reg >> 16


def _unfinished(todo) -> Verdict | None:
    """"not done yet" while the code a check was given (todo=: a module, kernel or function) still
    holds its TODO stub, else None."""
    where = _todo_left(todo) if todo is not None else None
    return _say(False, f"not done yet: {where} is still there") if where else None


def check_fragment(name: str, regs, element, matrix: str = "A", *, todo=None) -> Verdict:
    """regs: the (32, R) 32-bit registers each lane of a warp holds after loading a tile whose
    element (row, col) is the number 16 * row + col, so each 16-bit half says where it came from.
    element(lane, j) is the (row, col) the fragment's element j of that lane must be; register i
    holds elements 2i (low half) and 2i+1 (high half). Names the first wrong lane and register.
    todo: the module (or function) the registers came from: "not done yet" while its TODO is left."""
    if regs is None:
        return _say(False, f"✗ no registers for {name}: the kernel did not run")
    got = np.ascontiguousarray(_as_numpy(regs)).view(np.uint32).reshape(32, -1)

    def at(v):
        return f"{matrix}[{v // 16}][{v % 16}]" if v < 256 else f"0x{v:04x} (no element of the tile: never loaded?)"
    wrong = []
    for lane in range(32):
        for i in range(got.shape[1]):
            want = [16 * r + c for r, c in (element(lane, 2 * i), element(lane, 2 * i + 1))]
            if list(_halves(int(got[lane, i]))) != want:
                wrong.append((lane, i, _halves(int(got[lane, i])), want))
    if not wrong:
        return _say(True, f"✓ correct: {name}: all {got.size} registers of the warp hold what the layout says")
    unfinished = _unfinished(todo)
    if unfinished is not None:
        return unfinished
    lane, i, has, want = wrong[0]
    return _say(False, f"✗ {name}: lane {lane}, register {i} holds {at(has[0])}, {at(has[1])}; the layout needs "
                       f"{at(want[0])}, {at(want[1])} ({len(wrong)} of {got.size} registers wrong)")


def check_placement(name: str, out, element, *, todo=None) -> Verdict:
    """out: the 2-D output a warp wrote, each lane's d[i] holding the number 4 * lane + i; element(lane, i)
    is the (row, col) where d[i] of that lane belongs. Names the first misplaced value. todo: as
    in check_fragment."""
    if out is None:
        return _say(False, f"✗ no {name}: the kernel did not run")
    got = _as_numpy(out).astype(np.float64)
    if np.isnan(got).all():
        return _unfinished(todo) or _say(False, f"✗ nothing of {name} was written")
    want = np.full(got.shape, np.nan)
    for lane in range(32):
        for i in range(4):
            want[element(lane, i)] = 4 * lane + i
    bad = np.argwhere(~(got == want))
    if not len(bad):
        return _say(True, f"✓ correct: {name}: every lane's d[0..3] is where the layout puts it")
    unfinished = _unfinished(todo)
    if unfinished is not None:
        return unfinished
    r, c = (int(v) for v in bad[0])
    has = "nothing (never written)" if np.isnan(got[r, c]) else f"lane {int(got[r, c]) // 4}'s d[{int(got[r, c]) % 4}]"
    belongs = int(want[r, c])
    return _say(False, f"✗ {name}[{r}][{c}] holds {has}; the layout puts lane {belongs // 4}'s d[{belongs % 4}] "
                       f"there ({len(bad)} of {got.size} wrong)")


#: The volume (D, H, W) check_conv3d_counters profiles a 3D kernel on: two row blocks, three warps
#: of columns, three plane blocks.
COUNTER_VOLUME = (12, 20, 70)


def check_conv3d_counters(launch, K: int, targets: dict, *, volume=COUNTER_VOLUME,
                          name: str = "your kernel") -> Verdict:
    """check_counters for a 3D kernel launch(x, w, y) (as check_conv3d takes it) on `volume`."""

    D, H, W = volume
    x, w = cl.randn(D, H, W), cl.randn(K, K, K)
    y = cl.empty(D - K + 1, H - K + 1, W - K + 1)
    return check_counters(lambda: launch(x, w, y), targets, result=lambda: (y, cl.ref.conv3d(x, w)),
                          macs=y.numel() * K ** 3, name=name)


def check_dx_counters(launch, targets: dict, *, shape: Shape = COUNTER_SHAPE,
                      name: str = "your kernel") -> Verdict:
    """check_counters for an input-gradient launch(dy, w, dx, stride, pad) (as check_dx takes it) on
    `shape`; "per multiply-add" counts the products of the forward pass (dX has as many)."""

    s = shape
    dy, w = cl.randn(s.B, s.M, s.Ho, s.Wo), cl.randn(s.M, s.C, s.K, s.K)
    dx = cl.empty(s.B, s.C, s.H, s.W)
    return check_counters(lambda: launch(dy, w, dx, s.stride, s.padding), targets,
                          result=lambda: (dx, cl.ref.conv2d_input_grad(dx.shape, w, dy, stride=s.stride,
                                                                       padding=s.padding)),
                          macs=_macs(s), name=name)


def count_atomics(fn, *args, **kwargs) -> int:
    """The global atomic warp instructions (ncu's ATOM + RED) of every kernel that fn(*args,
    **kwargs) launches, by cl.profile: on the emulator its counters, on a GPU ncu's (fn a Kernel
    with its launch keywords, or a launcher). One per atomicAdd that a warp's active lanes reach.
    NaN, with the reason printed, when the call faults or cannot be profiled."""

    try:
        return int(sum(k.value(ATOMICS) or 0 for k in cl.profile(fn, *args, **kwargs).kernels))
    except Exception as e:  # noqa: BLE001 (a check must never stop the notebook)
        print(f"✗ {describe_error(e)}")
        return float("nan")


def check_answer(key: str, got, *args) -> Verdict:
    """An exercise's number (or list) against the answer kept in convlab.exercise_answers, so the
    exercise page never shows it: check_answer("03.reuse", reuse); args go to the answer (a
    workload's name). Says how far off, never the answer."""

    what, answer = ANSWERS[key]
    return check_value(what.format(*args), got, answer(*args))


class Targets(dict):
    """An exercise's counter targets {quantity: most allowed}, and the exercise's key
    (check_counters's GPU comparison). Targets measured from a kernel also say where they come
    from (source, printed under the verdict), on which shape, and derive(shape) makes them again
    for another shape."""
    key: str | None = None
    source: str = ""
    shape: Workload | None = None
    derive = None


def _dims(shape) -> tuple | None:
    return None if shape is None else (shape.B, shape.C, shape.M, shape.H, shape.W, shape.K, shape.stride,
                                       shape.padding, shape.dilation, shape.groups)


def _round_up(v: float, digits: int = 3) -> float:
    """v rounded up to `digits` significant digits: a target a kernel as good as v meets."""
    if v <= 0:
        return v
    e = math.floor(math.log10(v)) - digits + 1
    return round(math.ceil(v / 10 ** e - 1e-9) * 10 ** e, max(-e, 0))


def _round(v: float, digits: int = 3) -> float:
    return float(f"{v:.{digits}g}")


def _conv_counters(run, shape: Workload, quantities) -> dict:
    """The quantities of the last kernel run(x, w, y, stride=, padding=) launches on shape, counted
    on the emulator as check_counters counts them."""
    x, w = cl.randn(shape.B, shape.C, shape.H, shape.W), cl.randn(shape.M, shape.C, shape.K, shape.K)
    y = cl.empty(shape.B, shape.M, shape.Ho, shape.Wo)
    call = lambda: run(x, w, y, stride=shape.stride, padding=shape.padding)  # noqa: E731
    card = cl.profile(call)
    traced = _traced(call, card) if "shared loads per multiply-add" in quantities else None
    return {q: _quantity(q, traced if q == "shared loads per multiply-add" else card.kernels[-1], _macs(shape))
            for q in quantities}


def _flat_targets(shape: Workload) -> Targets:
    """Exercise 2.1: sectors per load and per store request halfway (on a log scale: the geometric
    mean) between chapter 2's flat kernel, coalesced, and the same sum with a warp's lanes down a
    column of the output, uncoalesced (chapter 2's conv2d_naive_z in blocks of 1 × 32), both
    measured on the shape: a coalesced kernel that does a little more or less than the chapter's
    (taps clamped to the image, another loop order) passes, one whose lanes are not consecutive
    output columns fails, with the margin of the factor between the two."""
    quantities = ("sectors per load request", "sectors per store request")
    chapter = _conv_counters(naive.conv2d_naive_flat, shape, quantities)
    column = _conv_counters(lambda *a, **kw: naive.conv2d_naive_z(*a, block=(1, 32), **kw), shape, quantities)
    t = Targets({q: _round(math.sqrt(chapter[q] * column[q])) for q in quantities})
    t.source = ("halfway between chapter 2's conv2d_naive_flat, coalesced ("
                + ", ".join(f"{_round(chapter[q])}" for q in quantities)
                + "), and a warp's lanes down a column of the output, uncoalesced (conv2d_naive_z in blocks of "
                  "1 × 32: " + ", ".join(f"{_round(column[q])}" for q in quantities)
                + ") on the same shape, for loads and stores")
    return t


def _direct_regtile_targets(shape: Workload, MT: int, ROWS: int, BLOCK: int) -> Targets:
    """Exercise 5.3: chapter 5's conv2d_direct_regtile with the same MT, ROWS and BLOCK on the shape."""
    quantities = ("shared loads per multiply-add", "global load bytes per multiply-add")
    got = _conv_counters(lambda x, w, y, **kw: fused.conv2d_direct_regtile(x, w, y, MT=MT, ROWS=ROWS, BLOCK=BLOCK,
                                                                             **kw), shape, quantities)
    t = Targets({q: _round_up(v) for q, v in got.items()})
    t.source = f"chapter 5's conv2d_direct_regtile with MT={MT}, ROWS={ROWS}, BLOCK={BLOCK} on the same shape"
    return t


def _register_tile_targets(shape: Workload, BM: int, BN: int, BK: int, TM: int, TN: int) -> Targets:
    """Exercise 5.2: the shared values the exercise's loop loads with these tunables, per
    multiply-add of the shape: each thread's TM + TN values of a step kk feed its TM·TN
    multiply-adds, over every block of (BM/TM)·(BN/TN) threads and every step of BK."""
    N, KD = shape.B * shape.Ho * shape.Wo, shape.C * shape.K * shape.K
    blocks = -(-N // BN) * -(-shape.M // BM)
    threads, steps = (BM // TM) * (BN // TN), -(-KD // BK)
    t = Targets({"shared loads per multiply-add": _round_up(blocks * threads * steps * BK * (TM + TN) / _macs(shape))})
    t.source = (f"the micro-tile's loop with BM={BM}, BN={BN}, BK={BK}, TM={TM}, TN={TN}: each thread's "
                f"TM + TN = {TM + TN} values per step kk for TM·TN = {TM * TN} multiply-adds, on {blocks} "
                f"block{'s' if blocks > 1 else ''} of {threads} threads and {steps} steps of BK on the same shape")
    return t


#: The exercises whose targets are measured when asked for: key -> targets(shape, **tunables).
_DERIVED = {"02": _flat_targets, "05_direct_regtile": _direct_regtile_targets,
            "05_register_tiles": _register_tile_targets}


def check_targets(key: str, **tunables) -> dict:
    """The counter targets of an exercise's kernel: those kept in convlab.exercise_answers.TARGETS,
    or, for the exercises whose targets come from a kernel (2.1, 5.2, 5.3), measured now on the
    emulator on counter_shape(key) with the tunables given (check_targets("05_direct_regtile",
    MT=8, ROWS=2, BLOCK=128); the exercise's own for those left out, exercise_answers.TUNABLES)
    and made again by check_counters for another shape. On a GPU those hold no numbers (the
    counters are graded on the emulator) but still name the exercise."""

    if key not in _DERIVED:
        if tunables:
            raise TypeError(f"the targets of {key!r} take no tunables")
        targets = Targets(TARGETS[key])
    else:
        known = TUNABLES.get(key, {})
        unknown = sorted(set(tunables) - set(known))
        if unknown:
            raise TypeError(f"the targets of {key!r} take the tunables {', '.join(known) or 'none'}; not "
                            f"{', '.join(unknown)}")
        values = {k: int(v) for k, v in {**known, **tunables}.items()}
        derive = _DERIVED[key]

        def make(shape, derive=derive, values=values):
            t = derive(shape, **values)
            t.key, t.shape, t.derive = key, shape, make
            return t
        if cl.backend() == "emu":
            return make(counter_shape(key))
        targets = Targets()
        targets.derive = make
    targets.key = key
    return targets


def counter_shape(key: str) -> Shape:
    """The shape an exercise's kernel is profiled on: COUNTER_SHAPE unless its tiles need another."""

    if key not in COUNTER_SHAPES:
        return COUNTER_SHAPE
    B, C, M, H, W, K, stride, pad = COUNTER_SHAPES[key]
    return Shape(B, C, M, H, W, K, stride, pad, why="the counters' shape")


def check_unroll(unroll) -> Verdict:
    """unroll(x, K, stride, pad) returns im2col's U (B, C*K*K, Ho*Wo); checked against torch's
    unfold on the awkward shapes. A wrong entry is named by its row (c, ky, kx) and column
    (oy, ox) of U, with the input pixel that belongs there."""
    import torch
    import torch.nn.functional as F


    for i, s in enumerate(AWKWARD_SHAPES):
        x = cl.randn(s.B, s.C, s.H, s.W)
        want = F.unfold(x.cpu().double(), s.K, padding=s.padding, stride=s.stride)
        try:
            got = checked_launch(lambda x=x, s=s: unroll(x, s.K, s.stride, s.padding))
        except Exception as e:  # noqa: BLE001 (a check must never stop the notebook)
            text = _fault(unroll, describe_error(e))
            return _say(False, text if text.startswith("not done") else f"✗ {s}: {text}")
        ok, text = verdict(got, want, labels="brp")
        if ok:
            continue
        if text.startswith(NOTHING):
            return _say(False, _nothing(unroll, text, out_index=None))
        if text.startswith("wrong shape"):
            return _say(False, f"✗ {s}: {text}")
        b, r, p = (int(v) for v in (~torch.isclose(got.cpu().double(), want, rtol=1e-6, atol=1e-6)).nonzero()[0])
        c, ky, kx = r // (s.K * s.K), r % (s.K * s.K) // s.K, r % s.K
        oy, ox = p // s.Wo, p % s.Wo
        iy, ix = oy * s.stride - s.padding + ky, ox * s.stride - s.padding + kx
        where = f"x[{b}][{c}][{iy}][{ix}]" if 0 <= iy < s.H and 0 <= ix < s.W else \
            f"0 (pixel ({iy}, {ix}) is in the padding)"
        before = f"\n  ({i} shape{'s' if i > 1 else ''} before it passed)" if i else ""
        return _say(False, f"✗ {s} ({s.note}): U[{b}][row {r} = (c={c}, ky={ky}, kx={kx})][column {p} = "
                           f"(oy={oy}, ox={ox})] should be {where} = {want[b, r, p].item():.6g}, got "
                           f"{got[b, r, p].item():.6g}\n  ({text}){before}")
    return _say(True, f"✓ correct: U matches torch's unfold on all {len(AWKWARD_SHAPES)} shapes "
                      f"(awkward sizes, C=1, B=1, odd and even K, stride 2, padding)")


# ---- exercise 11.1: the ring of mbarriers -------------------------------------------------------

#: The ring exercise's kernel: Y (128 x 64, float) = A (128 x K) . B^T, A and B half, K = 64 * steps;
#: a producer warpgroup and two consumer warpgroups; a stage holds A's 128 x 64 box and B's 64 x 64.
RING_BLOCK = 384
RING_STAGE_BYTES = 128 * 64 * 2 + 64 * 64 * 2

_RING_DEADLOCK = re.compile(r"deadlock in block .*?: thread \((\d+),0,0\) waits at mbar_wait at .*? for the phase of "
                            r"parity \d of the mbarrier __shared__ (\w+)\[(\d+)\] \(current phase (\d+)")


def _ring_stages(module) -> int:
    """STAGES as the kernel's cell defines it (the -D of %%cuda first)."""
    if "STAGES" in (getattr(module, "defines", None) or {}):
        return int(module.defines["STAGES"])
    m = re.search(r"^\s*#define\s+STAGES\s+(\d+)", getattr(getattr(module, "src", None), "text", ""), re.M)
    return int(m[1]) if m else 2


def ring_diagnosis(error: BaseException, steps: int, stages: int = 2) -> str:
    """The classic mistake of a producer/consumer ring behind an emulator fault of the ring
    exercise's kernel (steps: its K / 64, over `stages` stages), in one line; "" when it knows none."""
    msg = str(error)
    if "bytes fewer than announced" in msg:
        return ("mbar_arrive_expect_tx announced more bytes than the stage's copies bring: the two boxes, A's "
                "128 x 64 halves and B's 64 x 64, 2 bytes a half")
    if "transaction count would go negative" in msg:
        return ("the copies brought more bytes than mbar_arrive_expect_tx announced: announce, before the "
                "tma_load calls, the bytes of BOTH boxes that land in the stage (A's and B's)")
    if "have completed since this thread last knew it" in msg:
        return ("the producer ran two phases ahead: it refilled a stage without waiting for the consumers to "
                "release it (mbar_wait on empty[s] before each refill from round 1 on)")
    if "still reads (no wgmma_wait covers" in msg and "tma_load" in msg:
        return ("a stage was refilled while a wgmma still read it: it was released (mbar_arrive on empty[s]) "
                "before the wgmma_wait that covers its MMAs. wgmma_wait<1>() leaves the newest group, this "
                "stage's, in flight: after it, release the previous stage")
    if "read of a wgmma accumulator" in msg:
        return ("the epilogue read acc while the last stage's MMAs were in flight: after the loop, "
                "wgmma_wait<0>() (wgmma_wait<1> leaves the newest group running)")
    if "before this thread has waited for the copy" in msg:
        return ("a consumer read the stage before its wait for this round's copy returned: mbar_wait on "
                "full[s] with the round's parity, before the wgmma")
    if "one arrival too many" in msg:
        return ("a barrier got more arrivals in a phase than mbar_init counts: full[s] takes the producer's "
                "one mbar_arrive_expect_tx a round, empty[s] one mbar_arrive per consumer warpgroup")
    m = _RING_DEADLOCK.search(msg)
    if m is None:
        return ""
    producer, bar, s, phase = int(m[1]) < 128, m[2], int(m[3]), int(m[4])
    if bar == "empty" and not producer:
        return ("a consumer waits on empty[s]: consumers wait on full[s] (the stage's boxes have landed) and "
                "arrive on empty[s] when they are done with it")
    if bar == "empty" and phase > steps:
        return (f"empty[{s}] completed {phase} phases, more than the {steps} stages of K there are to release: "
                "it gets too many arrivals. mbar_init(&empty[s], 2) counts one arrival per consumer warpgroup: "
                "one thread of each arrives (t == 0), not all 128")
    if bar == "empty" and phase == 0:
        return ("no consumer has released this stage yet: in the producer's first round (k < STAGES) the stages "
                "are empty and need no wait; round r >= 1 waits for phase r - 1 of empty[s], parity (r - 1) & 1")
    if bar == "empty":
        return ("the producer waits for a release that never comes: round r >= 1 waits for phase r - 1 of "
                "empty[s] (parity (r - 1) & 1), and each consumer warpgroup arrives on empty[s] once a round")
    rounds = len(range(s, steps, stages))      # the rounds of stage s: one phase of full[s] each
    if bar == "full" and phase > rounds:
        return (f"full[{s}] completed {phase} phases, more than the {rounds} round{'s' if rounds > 1 else ''} of "
                f"stage {s}: it gets more than one arrival a round. One mbar_arrive_expect_tx per round announces "
                "the bytes of both boxes; the copies bring bytes, not arrivals")
    if bar == "full" and phase >= 2:
        return (f"full[{s}] completed {phase} phases while the consumers still wait for an earlier one: the "
                f"producer refilled stage {s} before the consumers released it. Before each refill (round "
                "r >= 1) it waits on empty[s] for parity (r - 1) & 1; a wait with the other parity returns at once")
    if bar == "full":
        return ("the consumers' wait on full[s] has the wrong parity: round r of stage s is phase r of full[s], "
                "parity r & 1")
    return ""


def _ring_where(index) -> str:
    """Who holds Y[i][j] in the ring kernel: wgmma m64n64's accumulator layout, warpgroup 1 rows 0-63."""
    i, j = (int(v) for v in index)
    r = i % 64
    return (f"warpgroup {1 + i // 64}, warp {r // 16}, lane {4 * (r % 8) + (j % 8) // 2}, "
            f"acc[{4 * (j // 8) + 2 * (r % 16 // 8) + j % 2}]")


def check_ring(module, *, kernel: str = "ring_gemm", name: str = "your ring") -> Verdict:
    """Exercise 11.1's pipelined GEMM: module (the %%cuda cell's) has kernel(Y, a_map, b_map, steps)
    for Y (128 x 64, float, poisoned with NaN first) = A (128 x 64*steps) . B^T (B 64 x 64*steps),
    both half, on one block of 384 threads with STAGES stages of RING_STAGE_BYTES. Run with K of 1,
    2 and 5 rounds of the ring (exercise_answers.RING_ROUNDS) against fp64, on the emulator with the
    threads in forward order (whatever cl.thread_order says outside); a fault (the emulator
    checks every wait's parity, every arrival and byte count, every stage refilled while in use)
    is printed with ring_diagnosis's line. On the emulator, or an H100/H200 (sm_90a); on another
    GPU it says so in one line. A wrong protocol may hang a GPU: check on the emulator first."""
    import torch


    if cl.backend() == "cuda" and tuple(cl.device().cc or ()) != (9, 0):
        return _say(False, f"the ring's kernel needs wgmma and TMA, an H100 or H200 (sm_90a); this GPU is "
                           f"{cl.device().name}: run this notebook on the emulator (CONVLAB_BACKEND=emu)")
    stages = _ring_stages(module)
    shared = stages * RING_STAGE_BYTES + 1024      # + the slack that rounds the tiles up to 1024 bytes
    steps_of = {}

    def cases():
        for rounds in RING_ROUNDS:
            steps = rounds * stages
            A, B = cl.randn(128, 64 * steps).half(), cl.randn(64, 64 * steps).half()
            Y = cl.to_device(torch.full((128, 64), float("nan")))
            ref = A.double().cpu() @ B.double().cpu().T
            first = A[:, :64].double().cpu() @ B[:, :64].double().cpu().T
            mistakes = [
                ("every step multiplied the boxes at column 0: step k's boxes start at column 64 * k (tma_load_2d's "
                 "coordinates go innermost first: the column, then the row)", lambda first=first, steps=steps:
                 steps * first),
                ("only the first step's 64 columns of K count: are tma_load_2d's coordinates swapped? The column "
                 "(64 * k) comes first, then the row (0)", lambda first=first: first)]

            def run(A=A, B=B, Y=Y, steps=steps):
                steps_of["now"] = steps
                # the emulator's forward order runs the producer as soon as a stage is released: a
                # release before the wgmma_wait that covers the stage is then a refill while in use
                # (in reverse order the consumers reach their wait first, and it goes unseen)
                with cl.thread_order("forward"):
                    module.kernel(kernel)(Y, cl.tensor_map(A, (128, 64)), cl.tensor_map(B, (64, 64)), steps,
                                          grid=(1, 1, 1), block=(RING_BLOCK, 1, 1), shared=shared,
                                          max_shared=shared + 1024)   # + the static __shared__: the mbarriers
            yield _Case(f"K = {64 * steps} ({rounds} round{'s' if rounds > 1 else ''} of the {stages}-stage ring)",
                        "", run, Y, ref, mistakes=mistakes if steps > 1 else None, locate=_ring_where)

    where = ("on the emulator, which checks every wait's parity, every arrival and byte count and every stage "
             "refilled while in use; on an H100 or H200 this check runs it on the GPU"
             if cl.backend() == "emu" else f"on {cl.device().name}")
    return _run_cases(module, cases(), name=name, labels="ij", out_index=None,
                      passed=f"matches the fp64 reference with K of {', '.join(map(str, RING_ROUNDS))} rounds of "
                             f"the ring ({where})",
                      explain=lambda e: ring_diagnosis(e, steps_of.get("now", 0), stages))


# ---- 12: the 3xTF32 split --------------------------------------------------------------------

#: Exercise 12.1, part 1's values: ties (low 13 bits 0x1000), just below and above them, a carry into
#: the exponent, subnormals, both signs, zeros; then random floats over a wide range.
SPLIT_BITS = (0x3F801000, 0xBF801000, 0x3F800FFF, 0x3F801001, 0x3FFFF000, 0x3FFFFFFF, 0x00001000, 0x00000FFF,
              0x807FF000, 0x3EAAAAAB, 0xBF7FFFFF, 0x00000000, 0x80000000, 0x7F7FEFFF)
#: Part 2's reduction: K floats per output, 8 a tensor-core step.
SPLIT_K = 256


def check_tf32_split(module, part: int, *, name: str = "your split") -> Verdict:
    """Exercise 12.1 on the %%cuda module that holds it. Part 1: split_values(a, hi, lo, n) runs the
    student's split(a, hi, lo) on SPLIT_BITS and random floats; hi and lo must be the bits of
    convlab.ops.tf32.split_tf32 (hi: a rounded to TF32, to nearest; lo: a - hi, rounded too).
    Named: hi left as a, hi truncated, lo not rounded, lo truncated, lo of the wrong sign. Part 2:
    product3(A, B, D, K) multiplies a 16 x K by a K x 8 tile with mma_1688_tf32 on the split
    fragments; D must be within 3xTF32's bound (tf32_tolerance: the target) of the float64 product.
    Named: a product left out (by which TF32 sum D matches), TF32's error, never written."""
    import torch

    if part == 1:
        rng = np.random.default_rng(12)
        rand = (rng.standard_normal(500) * np.exp2(rng.integers(-40, 40, 500))).astype(np.float32)
        a = np.concatenate([np.array(SPLIT_BITS, np.uint32).view(np.float32), rand])
        at = torch.from_numpy(a)
        hi, lo = cl.to_device(torch.full((len(a),), float("nan"))), cl.to_device(torch.full((len(a),), float("nan")))
        try:
            run = module.kernel("split_values")
            checked_launch(lambda: run(cl.to_device(at), hi, lo, len(a), grid=(len(a) + 127) // 128, block=128))
        except Exception as e:  # noqa: BLE001 (a check must never stop the notebook)
            return _say(False, _fault(module, describe_error(e)))
        got_hi, got_lo = hi.cpu(), lo.cpu()
        want_hi, want_lo = split_tf32(at)

        def same(x, y):
            return bool(torch.equal(x.view(torch.int32), y.view(torch.int32)))
        if same(got_hi, want_hi) and same(got_lo, want_lo):
            return _say(True, f"✓ correct: {name}: hi and lo are the bits of the 3xTF32 split for all {len(a)} "
                              "values (ties, carries, subnormals, both signs)")
        unfinished = _unfinished(module)
        if unfinished is not None:
            return unfinished
        if torch.isnan(got_hi).all() or torch.isnan(got_lo).all():
            return _say(False, f"✗ {name}: {'hi' if torch.isnan(got_hi).all() else 'lo'} was never written")
        trunc = (at.view(torch.int32) & -0x2000).view(torch.float32)
        rest = at - want_hi
        if same(got_hi, at):
            why = "hi is a itself, all 23 mantissa bits: round it to TF32's 10 (cvt_rna_tf32)"
        elif same(got_hi, trunc):
            why = ("hi is a truncated (its low 13 bits dropped): that rounds toward zero; cvt_rna_tf32 rounds to "
                   "nearest, so |a - hi| is at most half a TF32 step")
        elif not same(got_hi, want_hi):
            i = int((got_hi.view(torch.int32) != want_hi.view(torch.int32)).nonzero()[0])
            why = (f"hi of {float(a[i])!r} (bits {a.view(np.uint32)[i]:#010x}) is {float(got_hi[i])!r}; a rounded to "
                   f"TF32 is {float(want_hi[i])!r}")
        elif same(got_lo, rest):
            why = ("lo = a - hi is right, but not rounded: the tensor core reads only its top 19 bits, so round lo "
                   "to TF32 too (then a_lo * b_hi is exact)")
        elif same(got_lo, (rest.view(torch.int32) & -0x2000).view(torch.float32)):
            why = "lo is truncated: round a - hi to nearest (cvt_rna_tf32), as hi is"
        elif torch.equal(got_lo, -want_lo):             # as values: +0 and -0 alike
            why = "lo has the wrong sign: it is a - hi, what hi left over"
        else:
            i = int((got_lo.view(torch.int32) != want_lo.view(torch.int32)).nonzero()[0])
            why = (f"lo of {float(a[i])!r} is {float(got_lo[i])!r}; a - hi = {float(rest[i])!r} rounded to TF32 is "
                   f"{float(want_lo[i])!r}")
        return _say(False, f"✗ {name}: {why}")

    A, B = cl.randn(16, SPLIT_K), cl.randn(8, SPLIT_K)
    D = cl.to_device(torch.full((16, 8), float("nan")))
    try:
        checked_launch(lambda: module.kernel("product3")(A, B, D, SPLIT_K, grid=1, block=32))
    except Exception as e:  # noqa: BLE001
        return _say(False, _fault(module, describe_error(e)))
    Ad, Bd = A.double().cpu(), B.double().cpu()
    ref = Ad @ Bd.T
    rms = float(ref.pow(2).mean().sqrt())
    got = D.double().cpu()
    if torch.isnan(got).any():
        return _unfinished(module) or _say(False, f"✗ {name}: {int(torch.isnan(got).sum())} of D's 128 outputs "
                                                  "were never written")
    err = float((got - ref).abs().max()) / rms
    rtol, atol_rms = tf32_tolerance(SPLIT_K, 3, SPLIT_K // 8)
    bound = atol_rms + rtol * float(ref.abs().max()) / rms
    tf32_err = float((round_tf32(A.cpu()).double() @ round_tf32(B.cpu()).double().T - ref).abs().max()) / rms
    if err <= bound:    # (no figures in the verdict: they differ from one machine's random tiles to another's)
        return _say(True, "✓ correct: the three products: D is within 3xTF32's bound of the float64 product (about "
                          f"fp32's){', where TF32 alone is not' if tf32_err > bound else ''}")
    unfinished = _unfinished(module)
    if unfinished is not None:
        return unfinished
    (ah, al), (bh, bl) = (tuple(t.double() for t in split_tf32(m.cpu())) for m in (A, B))
    sums = {"only a_hi * b_hi": ah @ bh.T, "a_hi * b_hi + a_lo * b_hi: a_hi * b_lo is missing": ah @ bh.T + al @ bh.T,
            "a_hi * b_hi + a_hi * b_lo: a_lo * b_hi is missing": ah @ bh.T + ah @ bl.T}
    close = [k for k, v in sums.items() if float((got - v).abs().max()) / rms < 10 * bound]
    if close:
        why = f"D is {close[0]}: three products are needed, each fragment pair's hi and lo crossed"
    elif err > 0.1 * tf32_err:
        why = f"D's error is TF32's ({err:.2g} of its RMS; TF32 alone {tf32_err:.2g}): a lo part is lost"
    else:
        why = f"D's largest error is {err:.2g} of its RMS, over 3xTF32's bound {bound:.2g}"
    return _say(False, f"✗ {name}: {why}")
