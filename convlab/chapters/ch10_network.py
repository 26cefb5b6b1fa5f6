"""Chapter 10, the whole network (book/10_network.ipynb, kernels/10_network/, convlab.ops.layers):
its figures (the fused epilogue against three kernels, the network as a profiler's timeline), its
exercises' checks (the fused conv + bias + ReLU + pool stage; streams and pinned copies, graded on a
model fitted to the chapter's measurements) and answer.

    from convlab.chapters import ch10_network as ch10
    fig = ch10.fused_epilogue()
    fig = ch10.stream_timeline(timeline, "ours", ["pinned", "streams, 8 chunks"])   # the streams, op by op
    ch10.check_stage(launch)      # launch(x, w, bias, y): conv, bias, ReLU, 2x2 max pool into y
    ch10.check_streams(run)       # run(g, images, chunks): the network on streams, recorded
"""
from __future__ import annotations

from functools import partial

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Rectangle

import convlab as cl

from ..display.diagrams import FONT, GREY, PALETTE, light, new_figure
from ..measuring import workloads
from ..ops import layers
from ..programs import network, streams
from ..teach import checks
from ..teach.checks import (Case, attempt, checked_launch, describe_error, fault_text, nothing_text, run_cases, say,
                            todo_left)
from ..teach.verdict import NOTHING, Verdict, verdict

ANSWERS = {
    "10.saved_bytes": ("bytes of the conv output moved by the three-kernel path on lenet_c1",
                       lambda: 4 * 4 * 10000 * 4 * 80 * 80),
}

check_answer = partial(checks.check_answer, ANSWERS)

#: Exercise 10.2's target, the model time of its 8-chunk schedule (convlab.programs.streams.Model): chapter
#: 10's own 8 chunks on streams took 6.39 ms, 1.19x the longer of copy and compute (5.39 ms).
TARGETS = {"10_streams": {"time over the longer of copy and compute": 1.2}}


def epilogue_bytes(workload: str = "lenet_c1") -> dict:
    """Global-memory bytes of the layer's forward stage (input, conv output, pooled output; masks and
    bias left out), per kernel: unfused = conv, bias_act, pool2x2 (three kernels, the conv output
    written and read back twice); fused = conv2d_bias_act_pool (input read, pooled output written)."""
    s = workloads.get(workload)
    xb = 4 * s.B * s.C * s.H * s.W
    yb = 4 * s.B * s.M * s.Ho * s.Wo
    pb = 4 * s.B * s.M * layers.pooled_size(s.Ho, "max") * layers.pooled_size(s.Wo, "max")
    unfused = [("conv", xb, yb), ("bias + act", yb, yb), ("pool 2×2", yb, pb)]
    fused_ = [("conv + bias + act + pool", xb, pb)]
    return {"workload": workload, "unfused": unfused, "fused": fused_,
            "unfused_total": sum(r + w for _, r, w in unfused), "fused_total": xb + pb}


def fused_epilogue(workload: str = "lenet_c1"):
    """Figure: left, what one thread of conv2d_bias_act_pool.cu computes for `workload`: the
    (K+1)×(K+1) input window per channel under the 2×2 conv outputs that one pooled output needs,
    all in registers; right, the global-memory traffic of the stage fused and as three kernels.
    What to see: fused, the conv outputs never leave registers (bias, activation and pooling happen
    there) and one value in four is written; unfused, the conv output is written, read, written
    again and read once more."""
    s = workloads.get(workload)
    d = epilogue_bytes(workload)
    fig, (a, b) = new_figure(1, 2, height=3.4, gridspec_kw={"width_ratios": [1.3, 1]})
    n = s.K + 1
    uses = np.zeros((n, n), int)              # how many of the 2×2 conv outputs read each input
    for dy in (0, 1):
        for dx in (0, 1):
            uses[dy:dy + s.K, dx:dx + s.K] += 1
    shades = {1: light(PALETTE[0], 0.3), 2: light(PALETTE[0], 0.6), 4: PALETTE[0]}
    for (r, c), u in np.ndenumerate(uses):
        a.add_patch(Rectangle((c, n - 1 - r), 1, 1, fc=shades[u], ec="white", lw=0.5))
    stages = [(n + 1.5, 2, PALETTE[2], "conv:\n2×2 sums"), (n + 5, 2, PALETTE[4], "+ bias,\nact"),
              (n + 8.5, 1, PALETTE[3], "pool:\n1 written")]
    for x0, k, color, label in stages:
        for r in range(k):
            for c in range(k):
                a.add_patch(Rectangle((x0 + c, n / 2 - k / 2 + r), 1, 1, fc=color, ec="white", lw=1))
        a.text(x0 + k / 2, n / 2 - 1.6, label, ha="center", va="top", fontsize=FONT)
    for x0, x1 in ((n + 0.2, n + 1.3), (n + 3.7, n + 4.8), (n + 7.2, n + 8.3)):
        a.annotate("", (x1, n / 2), (x0, n / 2), arrowprops={"arrowstyle": "->", "lw": 1.2})
    a.text(n / 2, -0.4, f"input window {n}×{n} per channel\n(darker: read by more outputs)", ha="center", va="top",
           fontsize=FONT)
    a.text(n + 5.5, n / 2 + 2.2, "registers", ha="center", fontsize=FONT, style="italic")
    a.set_xlim(-0.3, n + 10)
    a.set_ylim(-2.6, n + 0.3)
    a.set_aspect("equal")
    a.axis("off")
    a.set_title("one thread of the fused kernel", fontsize=FONT + 1)
    rows = [("fused", d["fused"])] + [("unfused", d["unfused"])]
    labels, reads, writes = [], [], []
    for kind, stages in rows:
        for name, r, w in stages:
            labels.append(f"{name}" if kind == "fused" else f"{name} (separate)")
            reads.append(r / 2**20)
            writes.append(w / 2**20)
    y = np.arange(len(labels))[::-1]
    b.barh(y, reads, color=PALETTE[0], label="read")
    b.barh(y, writes, left=reads, color=PALETTE[3], label="written")
    b.set_yticks(y, labels, fontsize=FONT)
    b.tick_params(labelsize=FONT)
    b.set_xlabel("MiB of global memory", fontsize=FONT)
    b.set_title(f"{workload}: {d['fused_total'] / 2**20:,.0f} MiB fused, {d['unfused_total'] / 2**20:,.0f} MiB unfused",
                fontsize=FONT + 1)
    b.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2, fontsize=FONT, frameon=False)
    fig.convlab_data = d
    return fig


def timeline_spans(lanes: dict) -> list[dict]:
    """The spans network_timeline draws: each lane's ops one after another from 0 ms (a forward pass
    runs its kernels in order on one stream), as dicts of lane, op, kind, start and end (ms)."""
    spans = []
    for lane, ops in lanes.items():
        t = 0.0
        for op, kind, ms in ops:
            if not ms >= 0:
                raise ValueError(f"{lane}: {op} has no time ({ms!r})")
            spans.append({"lane": lane, "op": op, "kind": kind, "start": t, "end": t + ms})
            t += ms
    return spans


TIMELINE_KINDS = {"copy": PALETTE[0], "conv stage": PALETTE[1], "fully-connected": PALETTE[2], "other": GREY}


def network_timeline(lanes: dict | None = None, *, title: str = ""):
    """Figure: a profiler's timeline (as Nsight Systems draws one) of a whole network's forward pass,
    one row per contender, its ops back to back in the order they run, each bar as long as the op's
    measured time (lanes: {row label: [(op, kind, ms), ...]}, kind one of TIMELINE_KINDS; title: the
    GPU and where the times come from). What to see: which op the time goes to; an op too short to
    label is named below the row. Without lanes: a two-op example."""
    lanes = lanes or {"example": [("copy in", "copy", 1.0), ("conv", "conv stage", 2.0)]}
    spans = timeline_spans(lanes)
    end = max(s["end"] for s in spans)
    names = list(lanes)
    fig, ax = new_figure(height=0.9 + 0.85 * len(names))
    for s in spans:
        y = len(names) - 1 - names.index(s["lane"])
        width = s["end"] - s["start"]
        ax.barh(y, width, left=s["start"], height=0.5, color=TIMELINE_KINDS[s["kind"]], edgecolor="white", lw=0.8)
        label = f"{s['op']}\n{width:.2f} ms" if width >= 0.09 * end else ""
        if label:
            ax.text(s["start"] + width / 2, y, label, ha="center", va="center", fontsize=FONT - 1)
    # ops too short for their label: named under the row, in order
    for lane in names:
        y = len(names) - 1 - names.index(lane)
        small = [s for s in spans if s["lane"] == lane and s["end"] - s["start"] < 0.09 * end]
        if small:
            ax.text(small[0]["start"], y - 0.3, ", ".join(f"{s['op']} {s['end'] - s['start']:.2f} ms" for s in small),
                    ha="left" if small[0]["start"] < 0.6 * end else "right", va="top", fontsize=FONT - 1)
    ax.set_yticks(range(len(names)), names[::-1], fontsize=FONT)
    ax.set_xlim(0, end * 1.01)
    ax.set_ylim(-0.85, len(names) - 0.5)
    ax.set_xlabel("ms from the start of the pass", fontsize=FONT)
    ax.tick_params(labelsize=FONT)
    ax.spines[["top", "right"]].set_visible(False)
    used = [k for k in TIMELINE_KINDS if any(s["kind"] == k for s in spans)]
    ax.legend(handles=[Rectangle((0, 0), 1, 1, color=TIMELINE_KINDS[k]) for k in used], labels=used,
              loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=len(used), fontsize=FONT, frameon=False)
    if title:
        fig.suptitle(title, fontsize=FONT)
    fig.convlab_data = {"spans": spans, "end_ms": end}
    return fig


def stream_timeline(timeline, who: str, modes):
    """Figure: one panel per mode (of the end-to-end runs' `timeline` rows: who, mode, stream,
    chunk, start ms, end ms), its copies in, computes and copies out as bars on three rows, from
    the first copy's start. What to see: pinned copies one after another, then the chunks of the
    streamed modes overlapping copy and compute."""
    colors = {"copy in": "tab:blue", "compute": "tab:orange", "copy out": "tab:green"}
    fig, axes = plt.subplots(len(modes), 1, figsize=(7.5, 0.6 + 1.0 * len(modes)),
                             sharex=True,
                             layout="constrained")
    for ax, mode in zip(axes, modes):
        sub = timeline[(timeline["who"] == who) & (timeline["mode"] == mode)]
        for y, stream in enumerate(("copy in", "compute", "copy out")):
            spans = sub[sub["stream"] == stream]
            ax.broken_barh(list(zip(spans["start ms"],
                                    spans["end ms"] - spans["start ms"])),
                                    (y - 0.4, 0.8),
                           facecolors=colors[stream], edgecolors="white")
        ax.set_yticks(range(3), ["copy in", "compute", "copy out"])
        ax.invert_yaxis()
        ax.set_title(mode, fontsize=9, loc="left")
    axes[-1].set_xlabel("ms from the first copy's start (CUDA events per stream)")
    return fig


def both_layers(df, impl: str, dtype: str = "fp32") -> tuple[float, float]:
    """The forward ms of implementation `impl` on lenet_c1 and on lenet_c3 in result rows df (NaN
    where it has none): the class project's two convolutions."""
    sub = df[(df["impl"] == impl) & (df["dtype"] == dtype) & (df["pass"] == "forward")]
    ms = sub.set_index("workload")["ms"]
    return ms.get("lenet_c1", float("nan")), ms.get("lenet_c3", float("nan"))


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
            yield Case(f"B={B} C={C} M={M} {H}×{W} K={K}", "", lambda x=x, w=w, b=b, y=y: launch(x, w, b, y),
                        y, ref, mistakes=mistakes)

    return run_cases(launch, cases(), name=name, labels=("b", "m", "py", "px"), out_index=3,
                      passed=f"matches the fp64 stage on all {len(shapes)} shapes")


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
    memory) through chapter 10's network, issued through g, a convlab.programs.streams.Recorder, in
    `chunks` chunks. Checked on STREAM_CASES: the same logits as the whole batch at once, no races
    (an operation reading memory another stream writes with nothing ordering them, the logits
    read before their copy back is known to be done), then the model time of the 8-chunk
    schedule on chapter 10's GPU against the longer of copy and compute (target in
    TARGETS["10_streams"]). On a GPU it also times the schedule on 10,000 images."""
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
            text = fault_text(run, describe_error(e))
            return say(False, text if text.startswith("not done") else f"✗ {case}: {text}")
        if out is None:
            todo = todo_left(run)
            return say(False, f"not done yet: {todo} is still there" if todo else
                               f"✗ {case}: {name} returned None: does it end with `return out_host`?")
        if g.problems:
            return say(False, f"✗ {case}: {g.problems[0]}")
        late = g.unfinished(out)
        if late:
            return say(False, f"✗ {case}: the host reads the logits while {late[0].what} may still be running: "
                               f"nothing made the host wait for it (g.synchronize() after the loop)")
        if isinstance(out, torch.Tensor) and g.where(out) == "device":
            return say(False, f"✗ {case}: {name} returned device memory: copy the logits back to host memory "
                               f"and return that")
        missing = torch.isnan(torch.as_tensor(out, dtype=torch.float64)).all(dim=-1).nonzero().flatten().tolist()
        if missing and len(missing) < B:
            step = -(-B // chunks)
            sizes = [min(step, B - b0) for b0 in range(0, B, step)]
            return say(False, f"✗ {case}: the logits of images {missing[0]}..{missing[-1]} never came back: the "
                               f"chunks must cover the whole batch, the last taking what is left when {chunks} does "
                               f"not divide {B} (here chunks of {', '.join(map(str, sizes))})")
        ok, text = verdict(out, ref.cpu(), labels=("image", "class"))
        if not ok:
            if text.startswith(NOTHING):
                return say(False, nothing_text(run, text, out_index=None))
            return say(False, f"✗ {case}: not the logits of the whole batch at once: {text}")
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
        verdict_ = say(False, f"✗ correct (the same logits as the whole batch at once, no races), but not "
                               f"within the target: {said}:\n  " + "\n  ".join(causes))
    else:
        verdict_ = say(True, f"✓ correct: the same logits as the whole batch at once, no races; {said}")
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
