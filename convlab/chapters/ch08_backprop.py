"""Chapter 8, backprop (book/08_backprop.ipynb, kernels/08_backprop/, convlab.ops.backprop): its
figures (dX as a gather and as a scatter, dW's reduction levels), its exercises' checks (dW with
atomics and without, dX as a gather and its counters) and answers.

    from convlab.chapters import ch08_backprop as ch8
    fig = ch8.dx_gather_scatter(stride=2)
    ch8.check_dw(launch)        # launch(x, dy, dw, stride, pad): the weight gradient into dw
    ch8.check_dx(launch)        # launch(dy, w, dx, stride, pad): the input gradient into dx
    ch8.count_atomics(fn, *args)    # global atomic warp instructions of the kernels fn(*args) launches
    ch8.dw_bound(n)             # the harness's bound on a dW element, a sum of n products (x its RMS)
"""
from __future__ import annotations

from functools import partial

import numpy as np
import torch
import torch.nn.functional as F

import convlab as cl

from ..display.diagrams import FONT, GREY, PALETTE, draw_grid, light, new_figure
from ..measuring import workloads
from ..measuring.baselines import strict_fp32
from ..measuring.cards import ATOMICS
from ..ops import backprop, ceil_div
from ..teach import checks
from ..teach.checks import AWKWARD_SHAPES, Case, Shape, describe_error, run_cases
from ..teach.verdict import Verdict
from .ch02_naive import COUNTER_SHAPE, Targets, check_counters, kept_targets, multiply_adds

ANSWERS = {
    "08.per_weight": ("atomics per weight on lenet_c1", lambda: 10000 * 80 * 80),
}

check_answer = partial(checks.check_answer, ANSWERS)

#: Exercise 8.2's targets on ch2.COUNTER_SHAPE, chapter 8's conv2d_dx_gather (bp.conv2d_input_grad_gather's
#: config): no atomics, 4.33 sectors per load request (lanes are consecutive dx columns).
TARGETS = {"08_dx_gather": {"global atomics": 0, "sectors per load request": 4.33}}


def check_targets(key: str = "08_dx_gather") -> Targets:
    """Exercise 8.2's counter targets."""
    return kept_targets(key, TARGETS[key])


def dx_geometry(H: int = 6, W: int = 6, K: int = 3, stride: int = 1, padding: int = 0, at=(2, 3), source=(1, 1)) -> dict:
    """The transposed convolution's index sets: gather[(iy, ix)] = [(oy, ox, ky, kx)] (the dy cells
    dx[iy][ix] sums, with the tap of the unflipped mask each is multiplied by: the flipped mask's
    (K-1-ky, K-1-kx)), scatter[(oy, ox)] = [(iy, ix, ky, kx)] and writers[iy, ix] = how many dy cells
    add into that dx cell (the collisions the scatter kernel resolves with atomicAdd)."""
    Ho, Wo = (H + 2 * padding - K) // stride + 1, (W + 2 * padding - K) // stride + 1
    gather, scatter = {}, {}
    writers = np.zeros((H, W), int)
    for oy in range(Ho):
        for ox in range(Wo):
            for ky in range(K):
                for kx in range(K):
                    iy, ix = oy * stride + ky - padding, ox * stride + kx - padding
                    if 0 <= iy < H and 0 <= ix < W:
                        gather.setdefault((iy, ix), []).append((oy, ox, ky, kx))
                        scatter.setdefault((oy, ox), []).append((iy, ix, ky, kx))
                        writers[iy, ix] += 1
    return {"H": H, "W": W, "Ho": Ho, "Wo": Wo, "K": K, "stride": stride, "padding": padding, "at": at,
            "source": source, "gather": gather, "scatter": scatter, "writers": writers}


def dx_gather_scatter(H: int = 6, W: int = 6, K: int = 3, stride: int = 1, padding: int = 0, at=(2, 3), source=(1, 1)):
    """Figure: dE/dX two ways (conv2d_dx_gather.cu and conv2d_dx_scatter.cu). Left, gather: the dy
    cells that dx cell `at` sums, each labelled with the tap of the flipped mask it is multiplied
    by. Middle, scatter: the dx cells dy cell `source` adds into (the mask's taps). Right: how many
    dy cells add into each dx cell. What to see: the gather thread reads a K×K window of dy and
    writes one dx value; the scatter thread writes K² dx values, and up to K² threads write the same
    dx cell, hence atomicAdd (and a result whose float rounding depends on their order)."""
    g = dx_geometry(H, W, K, stride, padding, at, source)
    Ho, Wo = g["Ho"], g["Wo"]
    fig, axes = new_figure(1, 3, height=3.0, gridspec_kw={"width_ratios": [Wo, W, W]})
    cells = np.empty((Ho, Wo, 3))
    cells[:] = GREY
    labels = np.full((Ho, Wo), "", object)
    for oy, ox, ky, kx in g["gather"].get(tuple(at), []):
        cells[oy, ox] = light(PALETTE[0])
        labels[oy, ox] = f"{K - 1 - ky},{K - 1 - kx}"
    draw_grid(axes[0], cells, labels, title=f"gather into dx{tuple(at)}:\ndy cells × flipped mask")
    cells = np.empty((H, W, 3))
    cells[:] = GREY
    labels = np.full((H, W), "", object)
    for iy, ix, ky, kx in g["scatter"].get(tuple(source), []):
        cells[iy, ix] = light(PALETTE[1])
        labels[iy, ix] = f"{ky},{kx}"
    draw_grid(axes[1], cells, labels, title=f"scatter from dy{tuple(source)}:\ndx cells × mask")
    n = g["writers"]
    draw_grid(axes[2], [[light(PALETTE[2], 0.25 + 0.75 * v / n.max()) for v in row] for row in n], n.astype(str),
          title="dy cells adding into\neach dx cell (atomics)")
    fig.suptitle(f"dE/dX, K={K}, stride {stride}: dy is {Ho}×{Wo}, dx {H}×{W}; labels: the tap (row, column) each cell is multiplied by",
                 fontsize=FONT + 1)
    fig.convlab_data = g
    return fig


def dw_levels(workload: str = "lenet_c1", sms: int = 132) -> dict:
    """How many partial sums each weight of dE/dW has at each level of conv2d_dw_direct.cu, with
    the tunables direct_dw_config and the launcher's chunking give for `workload` on a GPU of `sms`
    SMs (132: an H100 or H200): B·Ho·Wo products, one sum per thread, per warp (shuffles), per
    block (shared memory: the partials), and one after reduce_partials. The atomic kernel instead
    sends all B·Ho·Wo products to one address each."""
    s = workloads.get(workload)
    cfg = backprop.direct_dw_config(s.C, s.M, s.K, s.stride, s.Ho)
    pairs = ceil_div(s.M, cfg["MT"]) * s.C
    tasks = s.B * ceil_div(s.Ho, cfg["ROWS"]) * s.Wo
    chunks = backprop.direct_dw_chunks(tasks, pairs, cfg["BLOCK"], cfg["MIN_BLOCKS"], sms)
    threads = chunks * cfg["BLOCK"]
    levels = [("products (B·Ho·Wo):\nconv2d_dw_atomic's atomics", s.B * s.Ho * s.Wo), ("thread sums (registers)", min(threads, tasks)),
              ("warp sums (shuffles)", ceil_div(min(threads, tasks), 32)), ("block partials", chunks),
              ("dW (reduce_partials)", 1)]
    return {"workload": workload, "config": cfg, "chunks": chunks, "blocks": chunks * pairs, "tasks": tasks,
            "levels": levels, "atomics_per_weight_atomic_kernel": s.B * s.Ho * s.Wo}


def dw_reduction(workload: str = "lenet_c1", sms: int = 132):
    """Figure: the sum behind one dE/dW weight, level by level, in conv2d_dw_direct.cu for `workload`
    (log scale: partial sums left per weight). What to see: B·Ho·Wo products (64 million on
    lenet_c1) shrink to one sum per thread in registers, one per warp by shuffles, one per block in
    shared memory: 792 block partials on lenet_c1 with 132 SMs, which a second pass adds in a fixed
    order; the atomic kernel sends every one of the products to the same address instead."""
    d = dw_levels(workload, sms)
    names, values = zip(*d["levels"])
    fig, ax = new_figure(height=2.9)
    y = np.arange(len(names))[::-1]
    ax.barh(y, values, color=PALETTE[0])
    ax.set_xscale("log")
    ax.set_yticks(y, names, fontsize=FONT)
    ax.tick_params(labelsize=FONT)
    for yy, v in zip(y, values):
        ax.text(v * 1.15, yy, f"{v:,}", va="center", fontsize=FONT)
    ax.set_xlim(0.5, max(values) * 40)
    ax.set_xlabel("partial sums per weight", fontsize=FONT)
    cfg = d["config"]
    ax.set_title(f"{workload} dW: MT={cfg['MT']}, ROWS={cfg['ROWS']}, {d['chunks']} chunks × {d['blocks'] // d['chunks']} "
                 f"(map group, channel) pairs, {cfg['BLOCK']} threads per block ({sms} SMs)", fontsize=FONT)
    fig.convlab_data = d
    return fig


def dw_bound(n: int) -> float:
    """The bound the measuring harness holds a dW element to, a sum of n products (B·Ho·Wo), as a
    multiple of the output's RMS: cl.check's share (1e-4), widened to 8·u·sqrt(n) for long sums
    (u = 2^-24, fp32's unit roundoff; convlab.programs.measure.ROUNDING)."""
    return max(1e-4, 8 * 2.0 ** -24 * n ** 0.5)


def dw_errors(name: str) -> list[dict]:
    """Our dW (backprop.conv2d_weight_grad_best) and cuDNN's (strict fp32, cudnn.benchmark) of
    workload `name` at full size against fp64: the largest |error| in units of the output's RMS,
    beside dw_bound. One row per contender, on a GPU (it names the GPU)."""
    wl = workloads.get(name)
    x, dy = cl.randn(*wl.x_shape), cl.randn(*wl.y_shape)
    kw = {"stride": wl.stride, "padding": wl.padding}
    ref = torch.nn.grad.conv2d_weight(x.double(), wl.w_shape, dy.double(), **kw)
    rms = float(ref.pow(2).mean().sqrt())
    with strict_fp32(benchmark=True):
        torch.nn.grad.conv2d_weight(x, wl.w_shape, dy, **kw)      # lets cuDNN choose
        theirs = torch.nn.grad.conv2d_weight(x, wl.w_shape, dy, **kw)
    ours = backprop.conv2d_weight_grad_best(x, dy, kernel_size=wl.K, **kw)
    n = wl.B * wl.Ho * wl.Wo
    return [{"workload": name, "dW": who, "n": n,
             "max error / RMS": float((out.double() - ref).abs().max()) / rms,
             "bound / RMS": dw_bound(n), "GPU": torch.cuda.get_device_name()}
            for who, out in (("ours (pick)", ours), ("cuDNN", theirs))]


def _weight_grad_mistakes(x, dy, w_shape, stride: int, pad: int):
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
            yield Case(str(s), s.note, lambda x=x, dy=dy, dw=dw, s=s: launch(x, dy, dw, s.stride, s.padding), dw,
                        cl.ref.conv2d_weight_grad(x, w_shape, dy, stride=s.stride, padding=s.padding),
                        mistakes=list(_weight_grad_mistakes(x, dy, w_shape, s.stride, s.padding)))

    return run_cases(launch, cases(), name=name, labels=("m", "c", "ky", "kx"),
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
            yield Case(str(s), s.note, lambda dy=dy, w=w, dx=dx, s=s: run(dy, w, dx, s.stride, s.padding), dx,
                        cl.ref.conv2d_input_grad(dx.shape, w, dy, stride=s.stride, padding=s.padding),
                        mistakes=[(what, make) for what, make in
                                  _input_grad_mistakes(dy, w, s.H, s.W, s.stride, s.padding)])

    return run_cases(launch, cases(), name=name,
                      nothing_hint={
                          "was written": " (dx starts as NaN: a kernel that adds into dx, with += or atomicAdd, "
                                         "adds to that NaN. Each dx element has one thread here: sum into a "
                                         "register and store it once, dx[i] = acc)"},
                      passed=f"matches the fp64 reference on all {len(shapes)} shapes (awkward sizes, C=1, "
                             f"B=1, odd and even K, stride 2, padding)")


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
                          macs=multiply_adds(s), name=name)


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
