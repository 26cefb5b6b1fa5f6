"""Chapter 12, fp32 on the tensor cores (book/12_tf32.ipynb, kernels/12_tf32/, convlab.ops.tf32):
its figures (the split's bits, the error of each way of adding a sum against n) and exercise 12.1's
check of the 3xTF32 split (part 1) and its three products (part 2).

    from convlab.chapters import ch12_tf32 as ch12
    fig = ch12.bit_figure()           # x, hi and lo bit by bit
    fig = book.figure_on_emulator(ch12.error_sweep)   # fp32, TF32 and 3xTF32 errors against n
    ch12.check_tf32_split(mod, 1)     # split_values: hi and lo, bit for bit
    ch12.check_tf32_split(mod, 2)     # product3: within 3xTF32's bound of the float64 product
"""
from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns
import torch

import convlab as cl

from ..display import plots
from ..ops.tf32 import round_tf32, split_tf32, tf32_tolerance
from ..teach.checks import checked_launch, describe_error, fault_text, say, unfinished
from ..teach.verdict import Verdict


def bits(v) -> int:
    """The 32 bits of v as a float32, as an int."""
    return int(np.array([v], np.float32).view(np.uint32)[0])


def bit_figure(x=np.float32(1 / 3)):
    """Figure: x's 32 bits, hi = tf32(x)'s and lo = tf32(x - hi)'s, the bits TF32 keeps coloured by
    field (sign, exponent, 10 bits of mantissa) and the 13 it drops grey. convlab_data: x, hi, lo,
    what the split leaves out (rest) and how many binades lo sits below hi (shift)."""
    hi, lo = (float(t) for t in split_tf32(torch.tensor([x])))
    rows = [("x (fp32)", float(x), 32), ("hi = tf32(x)", hi, 19),
            ("lo = tf32(x - hi)", lo, 19)]
    pal = sns.color_palette("colorblind", 4)
    fig, ax = plt.subplots(figsize=(plots.PAGE_WIDTH_IN, 2.6), layout="constrained")
    for r, (name, v, kept) in enumerate(rows):
        b = bits(v)
        for i in range(32):
            bit = (b >> (31 - i)) & 1
            field = 0 if i == 0 else 1 if i < 9 else 2
            color = pal[field] if i < kept else (0.88, 0.88, 0.88)
            ax.add_patch(plt.Rectangle((i, r), 0.92, 0.8, color=color, alpha=0.9))
            ax.text(i + 0.46, r + 0.42, str(bit), ha="center", va="center", fontsize=8,
                    color="white" if i < kept and field != 2 else "black")
        ax.text(-0.6, r + 0.42, name, ha="right", va="center", fontsize=9)
        ax.text(32.4, r + 0.42, f"{v:.10g}", ha="left", va="center", fontsize=9)
    for x0, x1, label in ((0, 1, "sign"), (1, 9, "exponent (8)"),
                          (9, 19, "mantissa: 10 kept"),
                          (19, 32, "13 dropped")):
        ax.text((x0 + x1) / 2 - 0.04, -0.25, label, fontsize=8, va="bottom",
                ha="center")
    ax.set_xlim(-9, 38)
    ax.set_ylim(3, -0.6)
    ax.axis("off")
    fig.convlab_data = {"x": float(x), "hi": hi, "lo": lo, "rest": float(x) - hi - lo,
                        "shift": math.frexp(hi)[1] - math.frexp(lo)[1]}
    return fig


#: error_sweep's reductions: n products in each output's sum.
SWEEP_KS = (64, 256, 1024, 4096, 16384)
#: error_sweep's ways of adding them: (products per multiply: 0 CUDA cores' FMA, 1 TF32, 3 the
#: 3xTF32 split; 1: each tensor-core step's sum added to an fp32 accumulator, 0: chained in the
#: tensor core), as kernels/12_tf32/tf32_dot.cu takes them.
SWEEP_WAYS = {"fp32 (CUDA cores)": (0, 0), "TF32": (1, 1), "3xTF32": (3, 1),
              "3xTF32, chained in the tensor core": (3, 0)}


def error_sweep(ks=SWEEP_KS):
    """Figure: on the emulator (its tensor cores add as the GPU's), the RMS error over RMS(ref) of
    one warp's 16 x 8 outputs, each a sum of n products (n in ks), for each way of adding them
    (SWEEP_WAYS), beside the derived errors of TF32 and fp32. convlab_data: n (ks) and errors
    {way: [error per n]}."""
    KS = list(ks)
    dot = cl.load("kernels/12_tf32/tf32_dot.cu")
    errors = {name: [] for name in SWEEP_WAYS}
    for K in KS:
        cl.seed(K)
        A, B = cl.randn(16, K), cl.randn(8, K)
        ref = A.double() @ B.double().T
        rms = float(ref.pow(2).mean().sqrt())
        for name, (products, promote) in SWEEP_WAYS.items():
            D = cl.empty(16, 8)
            dot.kernel("tf32_dot")(A, B, D, K, products, promote, grid=1, block=32)
            errors[name].append(float((D.double() - ref).pow(2).mean().sqrt()) / rms)
    fig, ax = plt.subplots(figsize=(plots.PAGE_WIDTH_IN, 3.8), layout="constrained")
    pal = sns.color_palette("colorblind", 5)
    for (name, e), c, m in zip(errors.items(), pal, "osD^"):
        ax.plot(KS, e, marker=m, color=c, label=f"{name}, measured")
    n = np.array(KS, float)
    ax.plot(n, np.full_like(n, 2.0 ** -11 * math.sqrt(2 / 3)), "--", color=pal[1], lw=1,
            label=r"TF32, derived: $2^{-11}\sqrt{2/3}$")
    ax.plot(n, 2.0 ** -24 * np.sqrt(n / 6), "--", color=pal[0], lw=1,
            label=r"fp32, derived: $2^{-24}\sqrt{n/6}$")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("n, the products in each output's sum")
    ax.set_ylabel("RMS error / RMS of the output")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8, frameon=False)
    ax.set_title("one warp's sums on the emulator, against float64", fontsize=10)
    fig.convlab_data = {"n": KS, "errors": errors}
    return fig


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
            return say(False, fault_text(module, describe_error(e)))
        got_hi, got_lo = hi.cpu(), lo.cpu()
        want_hi, want_lo = split_tf32(at)

        def same(x, y):
            return bool(torch.equal(x.view(torch.int32), y.view(torch.int32)))
        if same(got_hi, want_hi) and same(got_lo, want_lo):
            return say(True, f"✓ correct: {name}: hi and lo are the bits of the 3xTF32 split for all {len(a)} "
                              "values (ties, carries, subnormals, both signs)")
        stub = unfinished(module)
        if stub is not None:
            return stub
        if torch.isnan(got_hi).all() or torch.isnan(got_lo).all():
            return say(False, f"✗ {name}: {'hi' if torch.isnan(got_hi).all() else 'lo'} was never written")
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
        return say(False, f"✗ {name}: {why}")

    A, B = cl.randn(16, SPLIT_K), cl.randn(8, SPLIT_K)
    D = cl.to_device(torch.full((16, 8), float("nan")))
    try:
        checked_launch(lambda: module.kernel("product3")(A, B, D, SPLIT_K, grid=1, block=32))
    except Exception as e:  # noqa: BLE001
        return say(False, fault_text(module, describe_error(e)))
    Ad, Bd = A.double().cpu(), B.double().cpu()
    ref = Ad @ Bd.T
    rms = float(ref.pow(2).mean().sqrt())
    got = D.double().cpu()
    if torch.isnan(got).any():
        return unfinished(module) or say(False, f"✗ {name}: {int(torch.isnan(got).sum())} of D's 128 outputs "
                                                  "were never written")
    err = float((got - ref).abs().max()) / rms
    rtol, atol_rms = tf32_tolerance(SPLIT_K, 3, SPLIT_K // 8)
    bound = atol_rms + rtol * float(ref.abs().max()) / rms
    tf32_err = float((round_tf32(A.cpu()).double() @ round_tf32(B.cpu()).double().T - ref).abs().max()) / rms
    if err <= bound:    # (no figures in the verdict: they differ from one machine's random tiles to another's)
        return say(True, "✓ correct: the three products: D is within 3xTF32's bound of the float64 product (about "
                          f"fp32's){', where TF32 alone is not' if tf32_err > bound else ''}")
    stub = unfinished(module)
    if stub is not None:
        return stub
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
    return say(False, f"✗ {name}: {why}")
