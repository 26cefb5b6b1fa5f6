"""Chapter 3a, shared-memory tiles (book/03_tiled.ipynb, kernels/03_tiled/, convlab.ops.tiled):
its exercises' targets and answers, and exercise 3a.2's check of a mask in constant memory.

    from convlab.chapters import ch03_tiled as ch3
    ch3.check_constant_mask(launch, my_const, ch3.check_targets("03a_constant_mask"))
"""
from __future__ import annotations

from functools import partial

import convlab as cl

from ..ops import tiled
from ..teach import checks
from ..teach.checks import AWKWARD_SHAPES, Shape, conv2d_cases, run_cases
from ..teach.verdict import Verdict, conv2d_mistakes
from .ch02_naive import COUNTER_SHAPE, Targets, check_counters, kept_targets

ANSWERS = {
    "03.reuse": ("multiply-adds per global load", lambda: 16 ** 2 * 49 / 22 ** 2),
    # a warp's read of one tap from global memory: one 32-byte sector for 32 multiply-adds
    "03a_constant_mask.saved": ("global load bytes saved per multiply-add", lambda: 1.0),
}

check_answer = partial(checks.check_answer, ANSWERS)

#: The exercises' counter targets, from the chapter's kernel on the same shape (tests/test_exercise_mutants.py
#: measures them again).
TARGETS = {
    # ch2.COUNTER_SHAPE, chapter 3's conv2d_tiled_halo_multi_pass with TILE=8 and the mask in
    # constant memory: 0.608 bytes of global loads per multiply-add, 6.51 sectors per load request
    "03a": {"global load bytes per multiply-add": 0.61, "sectors per load request": 6.52},
    # exercise 3a.2, the same kernel on the same shape: 0.608 bytes with the mask in constant
    # memory, 1.608 with MASK_IN_CONSTANT=0 (the mask read from w); its warps read one address of
    # c_mask per request (a broadcast)
    "03a_constant_mask": {"global load bytes per multiply-add": 0.61, "constant addresses per request": 1},
}


def check_targets(key: str) -> Targets:
    """The counter targets of exercise 3a.1 ("03a": timed on a GPU against the chapter's multi-pass
    kernel on lenet_c1) or 3a.2 ("03a_constant_mask")."""
    return kept_targets(key, TARGETS[key], ("lenet_c1", tiled.IMPLEMENTATIONS[0]) if key == "03a" else None)


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

    cases = list(conv2d_cases(launch, AWKWARD_SHAPES, fp16=None, locate=None))
    for case in cases:
        case.call = zeroed_first(case.call, case.inputs[1])
        case.mistakes = list(conv2d_mistakes(*case.inputs)) + list(_mask_index_mistakes(*case.inputs))
    never_copied = (f"\n  Here the likely cause: the mask was never copied into `{constant}`, so the kernel read "
                    f"zeros. A __constant__ array holds zeros until the launch fills it, "
                    f"`module.set_constant(\"{constant}\", w)`, before the kernel's launch")
    right = run_cases(launch, cases, name=name, nothing_hint={"outputs are 0": never_copied},
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
