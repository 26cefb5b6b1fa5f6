"""The verdict on one output against its fp64 reference: the core every exercise check and puzzle
stands on (convlab.teach.checks runs the launches, this module judges what they wrote).

    ok, text = verdict(y, ref, inputs=(x, w, stride, pad))   # "correct", or what is wrong and where

Verdicts: "correct"; a named common mistake when the output matches one of them on the
reference (flipped mask, swapped axes, padding or stride ignored, `=` for `+=`, a tile not fully
loaded, every output off by one amount: a sum that does not start at 0); "wrong at (b,m,h,w):
expected … got …", and when the wrong outputs hold other outputs' right values, how the two differ
(by the index and the fields locate() names: warp 1 holds what warp 0 computes, acc[i][j] holds
acc[i][j+1]'s, a leading dimension of 16 where the row holds 36); "N outputs never written"; an
output computed from __shared__ memory no thread wrote (the emulator's poison). Each piece of
advice is given only where its premise holds on the failing case.
"""
from __future__ import annotations

import math
import re

import numpy as np

import convlab as cl


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


def _fmt(v: float) -> str:
    return "NaN (never written)" if math.isnan(v) else f"{v:.6g}"


#: NaN as the emulator's poisoned shared memory holds it (all bits set), unlike cl.empty's NaN:
#: an output with these bits was computed from shared memory that no thread wrote. A half output
#: shows it as 0xFFFF (copied) or 0xFE00 (through float: the float NaN rounded to half), both with
#: the sign bit set, which cl.empty's half NaN (0x7E00) has not.
_POISON_BITS = 0xFFFFFFFF
_POISON_BITS_HALF = (0xFFFF, 0xFE00)


def poison_mask(y) -> np.ndarray | None:
    a = np.ascontiguousarray(as_numpy(y))
    if a.dtype == np.float32:
        return a.view(np.uint32) == _POISON_BITS
    if a.dtype == np.float16:
        return np.isin(a.view(np.uint16), _POISON_BITS_HALF)
    return None


def _poisoned(y) -> int:
    mask = poison_mask(y)
    return 0 if mask is None else int(mask.sum())


def conv2d_mistakes(x, w, stride: int, pad: int):
    """(what, the output that mistake gives) for the common mistakes, computed on the reference."""
    import torch
    import torch.nn.functional as F


    x, w = torch.as_tensor(x).detach().cpu().double(), torch.as_tensor(w).detach().cpu().double()
    Ho, Wo = cl.out_size(x.shape[-2], w.shape[-1], stride, pad), cl.out_size(x.shape[-1], w.shape[-1], stride, pad)
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
        want = as_numpy(make()).astype(np.float64)
        if want.shape == got.shape:
            bound = atol if atol is not None else 1e-4 * max(float(np.sqrt(np.mean(want ** 2))), 1e-30)
            if np.all(np.abs(got - want) <= bound + rtol * np.abs(want)):
                return what
    return None


def diagnose(y, x, w, stride: int, pad: int, *, rtol: float = 1e-4, atol: float | None = None) -> str | None:
    """Which common mistake gives the output y for these inputs, or None (atol: as in verdict)."""
    return _match(as_numpy(y).astype(np.float64), conv2d_mistakes(x, w, stride, pad), rtol, atol)


#: verdict's texts for an output nothing was computed into: a check says "not done yet" instead
#: while a TODO stub is left (todo_left).
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
    got = as_numpy(y).astype(np.float64)
    want = as_numpy(ref).astype(np.float64)
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
            mistakes = conv2d_mistakes(*inputs)
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


def as_numpy(a) -> np.ndarray:
    try:
        import torch

        if isinstance(a, torch.Tensor):
            return a.detach().cpu().numpy()
    except ImportError:
        pass
    return np.asarray(a)
