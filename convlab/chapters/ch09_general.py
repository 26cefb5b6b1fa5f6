"""Chapter 9a, any layer (book/09_general.ipynb, kernels/09_general/, convlab.ops.general): its
figure of grouped weights and dilated taps, and its exercise's check (groups and dilation) and
answers.

    from convlab.chapters import ch09_general as ch9
    fig = ch9.groups_dilation()
    ch9.check_general_kernel(launch)   # launch(x, w, y, stride, pad, dilation, groups)
"""
from __future__ import annotations

from functools import partial

import numpy as np

import convlab as cl

from ..display.diagrams import FONT, GREY, PALETTE, draw_grid, light, new_figure
from ..measuring import workloads
from ..measuring.workloads import Workload
from ..teach import checks
from ..teach.checks import Case, Shape, run_cases
from ..teach.verdict import Verdict

ANSWERS = {
    "09a_groups_dilation.macs": ("multiply-adds of {0}", lambda name: workloads.get(name).flops // 2),
    "09a_groups_dilation.window": ("window of {0}",
                                  lambda name: workloads.get(name).dilation * (workloads.get(name).K - 1) + 1),
}

check_answer = partial(checks.check_answer, ANSWERS)


def groups_dilation(grouped: str = "resnext_g32_56", dilated: str = "deeplab_d2_28"):
    """Figure: left, which input channels each output map of the grouped layer `grouped` reads (the
    weight matrix M × C is block-diagonal: M/g maps read C/g channels each); right, one output's
    taps over the input for the dilated layer `dilated` (K×K taps spread d apart over a window of
    d·(K−1)+1). What to see: a grouped convolution is g independent small convolutions (g times
    fewer multiply-adds); dilation widens the window without adding taps."""
    gs, ds = workloads.get(grouped), workloads.get(dilated)
    g = gs.groups
    reads = np.zeros((gs.M, gs.C), bool)
    for m in range(gs.M):
        k = m // (gs.M // g)
        reads[m, k * (gs.C // g):(k + 1) * (gs.C // g)] = True
    span = ds.dilation * (ds.K - 1) + 1
    n = span + 2
    taps = np.zeros((n, n), bool)
    for ky in range(ds.K):
        for kx in range(ds.K):
            taps[1 + ky * ds.dilation, 1 + kx * ds.dilation] = True
    fig, (a, b) = new_figure(1, 2, height=3.6)
    a.imshow(np.where(reads[..., None], np.asarray(PALETTE[0]), np.ones(3)), interpolation="nearest")
    a.set_xlabel("input channel", fontsize=FONT)
    a.set_ylabel("output map", fontsize=FONT)
    a.tick_params(labelsize=FONT)
    a.set_title(f"{grouped}: groups={g}, {gs.C // g} channels per map", fontsize=FONT + 1)
    cells = np.empty((n, n, 3))
    cells[:] = GREY
    cells[1:1 + span, 1:1 + span] = light(PALETTE[1], 0.3)
    cells[taps] = PALETTE[1]
    labels = np.full((n, n), "", object)
    for i, (r, c) in enumerate(zip(*np.nonzero(taps))):
        labels[r, c] = f"{i // ds.K},{i % ds.K}"
    draw_grid(b, cells, labels, title=f"{dilated}: K={ds.K}, dilation {ds.dilation}: window {span}×{span}")
    fig.convlab_data = {"grouped": grouped, "groups": g, "reads": reads, "dilated": dilated, "taps": taps, "span": span}
    return fig


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
            yield Case(str(s), s.note, lambda x=x, w=w, y=y, s=s: launch(x, w, y, s.stride, s.padding, s.dilation,
                                                                          s.groups),
                        y, _general_reference(x, w, s), mistakes=list(_general_mistakes(x, w, s)))

    return run_cases(launch, cases(), name=name,
                      passed=f"matches the fp64 reference on all {len(shapes)} shapes (depthwise, grouped, "
                             "dilated, with stride, padding and an even mask)")


def _general_reference(x, w, s: Workload):
    """torch's conv2d of layer s in fp64."""
    import torch.nn.functional as F

    return F.conv2d(x.detach().cpu().double(), w.detach().cpu().double(), stride=s.stride, padding=s.padding,
                    dilation=s.dilation, groups=s.groups)
