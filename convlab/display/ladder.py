"""The performance ladder: the steps of the course's kernels, chapter by chapter, on each workload.

A rung is one kernel that is a step of the course (not every variant a chapter measures): its
chapter, its kernel by Impl.key (its display name, label(key), is only how the rows of
book/data/<chapter>.csv call it), its precision and its pass. Each chapter's page extends the ladder by its own rungs:

    ladder.table("05_fused")            # every rung of chapters 2-5: one row per rung and workload
    ladder.show("05_fused")             # a compact table: x torch best per rung and workload
    ladder.figure("05_fused")           # x torch best along the rungs, one line per workload
    ladder.best("05_fused", "lenet_c1") # the fastest rung so far on one workload (for glue)

Numbers come from the committed GPU results only. "x torch best" is torch best's GPU time over the
rung's, both from the rung's own results file (so both were timed in the same run): above 1 the
rung is faster. fp16 rungs are compared with torch in fp16 and marked fp16; chapter 10's fused
stage (convolution + bias + activation + pooling) with torch's same stage.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..measuring import results
from ..measuring.baselines import TORCH_BEST
from ..ops import backprop, dispatch

# the course's workloads (convlab.measuring.workloads), in the order the chapters use them
WORKLOADS_2D = ("lenet_c1", "lenet_c3", "fa17", "days100", "resnet")
WORKLOAD_3D = "conv3d"
COURSE = (*WORKLOADS_2D, WORKLOAD_3D)   # chapter 9's further layers are not on the ladder
PASSES = ("forward", "dX", "dW", "forward+dX+dW")


class LadderError(LookupError):
    """A rung the ladder names is missing from the committed results."""


@dataclass(frozen=True)
class Rung:
    chapter: str                    # "05_fused": the chapter whose page adds this step
    kernel: str                     # its kernel's Impl.key (pick: pick()'s, autograd: Conv2dFunction)
    dtype: str = "fp32"
    pass_: str = "forward"
    source: str = ""                # results file under book/data (the chapter's by default)
    torch_impl: str = TORCH_BEST    # the row it is compared with, from the same file
    aliases: tuple = ()             # (name in the file, course workload) where the file names it otherwise
    what: str = ""                  # a short mark shown after the step where it differs from a conv
    short: str = ""                 # the figure's tick label (the step's name when it is short)

    @property
    def file(self) -> str:
        return self.source or self.chapter

    @property
    def impl(self) -> str:
        """The kernel's display name: the `impl` of its rows in the results file."""
        return label(self.kernel)


def label(key: str) -> str:
    """The display name the results files give the kernel of that key (KeyError: no such kernel)."""
    harness = {dispatch.BEST_KEY: dispatch.BEST, backprop.AUTOGRAD_KEY: backprop.AUTOGRAD}
    return harness[key] if key in harness else dispatch.by_key(key).name


_TORCH_STAGE = "torch: conv + bias + act + pool (cuDNN, NCHW)"

RUNGS = (
    Rung("02_naive", "naive_flat", short="naive flat"),
    # of the three tiled strategies, the fastest across the five workloads (geometric mean)
    Rung("03_tiled", "tiled_multi_pass", short="tiled, multi-pass"),
    Rung("04_im2col", "im2col_gemm", short="im2col + GEMM"),
    Rung("05_fused", "igemm", short="implicit GEMM"),
    Rung("05_fused", "igemm_reg", short="impl. GEMM, reg.-tiled"),
    Rung("05_fused", "direct_regtile", short="direct, reg.-tiled"),
    Rung("05_fused", "pick", short="pick()"),
    Rung("06_fp16", "half2", dtype="fp16", short="half2"),
    Rung("06_fp16", "wmma", dtype="fp16", short="WMMA"),
    Rung("06_fp16", "pick", dtype="fp16", short="pick()"),
    Rung("07_conv3d", "conv3d_naive", short="3D naive"),
    Rung("07_conv3d", "conv3d_tiled", short="3D shared tile"),
    Rung("07_conv3d", "conv3d_cube", short="3D 2×2×2 cube"),
    Rung("07_conv3d", "conv3d_coarse", short="3D coarse in z"),
    Rung("08_backprop", "dx_scatter", pass_="dX", short="dX scatter"),
    Rung("08_backprop", "dx_gather", pass_="dX", short="dX gather"),
    Rung("08_backprop", "dw_direct", pass_="dW", short="dW direct"),
    Rung("08_backprop", "dw_gemm_atomic", pass_="dW", short="dW GEMM"),
    Rung("08_backprop", "autograd", pass_="forward+dX+dW", short="autograd"),
    Rung("09_general", "igemm_f32", short="impl. GEMM, warp-tiled"),
    Rung("09_general", "pick", short="pick()"),
    # from an NCHW input, its conversion to NHWC included (9b's timing from chapter 9a's run)
    Rung("09b_tensor_cores", "mma", dtype="fp16", source="09_general", short="mma.sync"),
    # the fused stage does a convolution's work and its epilogue: compared with torch's stage
    Rung("10_network", "stage_fused", source="details/10_network_stages", torch_impl=_TORCH_STAGE,
         aliases=(("project_conv1", "lenet_c1"), ("project_conv2", "lenet_c3")), what="+ bias, act, pool",
         short="fused stage"),
)

COLUMNS = ["chapter", "step", "impl", "short", "dtype", "pass", "workload", "GPU ms", "caller ms", "torch best ms",
           "× torch best", "% of floor", "new", "gpu", "date"]


def _number(chapter: str) -> float:
    """The chapter's place in the course: '05_fused' is 5, '09b_tensor_cores' 9.5 (after 9a)."""
    head = chapter.split("_", 1)[0]
    if not (head[:2].isdigit() and head[2:] in ("", "b")):
        raise ValueError(f"a chapter is named like '05_fused' or '09b_tensor_cores', not {chapter!r}")
    return int(head[:2]) + (0.5 if head[2:] == "b" else 0)


def rungs(upto: str, pass_: str | None = "forward") -> list:
    """The rungs of chapters 2 to `upto` (and of one pass; None: every pass), in the course's order."""
    n = _number(upto)
    return [r for r in RUNGS if _number(r.chapter) <= n and (pass_ is None or r.pass_ == pass_)]


_loaded: dict = {}   # name -> (the file's mtime and size when read, its rows)


def _data(name: str):
    """The results file's rows, read again whenever the file changed: a chapter that re-measures and
    saves its results mid-notebook must see them in the ladder it draws afterwards."""
    path = results.data_path(name)
    stamp = (path.stat().st_mtime_ns, path.stat().st_size) if path.is_file() else None
    if name not in _loaded or _loaded[name][0] != stamp:
        df = results.load(name, quiet=True)
        if df is None:
            raise LadderError(f"no committed results book/data/{name}.csv (of the current harness)")
        _loaded[name] = (stamp, df)
    return _loaded[name][1]


def _rows(rung: Rung):
    """The rung's rows and the matching torch rows of its file, keyed by course workload."""
    df = _data(rung.file)
    alias = dict(rung.aliases)
    df = df.assign(workload=df["workload"].map(lambda w: alias.get(w, w)))
    same = (df["dtype"] == rung.dtype) & (df["pass"] == rung.pass_)
    ours = df[same & (df["impl"] == rung.impl) & (df["kind"] == "ours")]
    if ours.empty:
        raise LadderError(f"rung {rung.impl!r} ({rung.chapter}, {rung.dtype}, {rung.pass_}): no such rows "
                          f"in book/data/{rung.file}.csv")
    torch = df[same & (df["impl"] == rung.torch_impl)]
    return ours.set_index("workload"), torch.set_index("workload")


def table(upto: str, workload: str | None = None, pass_: str = "forward"):
    """One row per rung of chapters 2 to `upto` and workload (or one workload): chapter, step (the
    kernel's display name, with a mark where it does more than a convolution), impl (its name in the
    results), short (the figure's label), dtype, pass, GPU ms, caller ms, torch best ms, × torch best
    (torch best's GPU time over the rung's), % of the roofline floor, `new` (True for `upto`'s own
    rungs), gpu and date.
    Workloads a rung cannot run (a kernel for few channels on resnet, say) have no row."""
    import pandas as pd

    if workload is not None and workload not in COURSE:
        raise ValueError(f"{workload!r} is not one of the course's workloads {COURSE}")
    out = []
    for rung in rungs(upto, pass_):
        ours, torch = _rows(rung)
        for wl, r in ours.iterrows():
            if wl not in COURSE or (workload is not None and wl != workload):
                continue
            t = torch["ms"].get(wl, math.nan)
            floor = r["floor_frac"] if "floor_frac" in r else math.nan
            step = f"{rung.impl} ({rung.what})" if rung.what else rung.impl
            out.append({"chapter": rung.chapter, "step": step, "impl": rung.impl, "short": rung.short or rung.impl, "dtype": rung.dtype, "pass": rung.pass_,
                        "workload": wl, "GPU ms": r["ms"], "caller ms": r["caller_ms"], "torch best ms": t,
                        "× torch best": t / r["ms"], "% of floor": 100 * floor,
                        "new": rung.chapter == upto, "gpu": r["gpu"], "date": r["date"]})
    df = pd.DataFrame(out, columns=COLUMNS)
    if workload is not None and df.empty:
        raise LadderError(f"no rung up to {upto} ran on {workload!r} ({pass_})")
    return df


def best(upto: str, workload: str, pass_: str = "forward", dtype: str | None = "fp32"):
    """The fastest rung (by GPU time) of chapters 2 to `upto` on one workload, of one precision
    (None: either): a row of table() (a pandas Series: step, chapter, GPU ms, × torch best, ...)."""
    df = table(upto, workload, pass_)
    if dtype is not None:
        df = df[df["dtype"] == dtype]
    if df.empty:
        raise LadderError(f"no {dtype} rung up to {upto} ran on {workload!r} ({pass_})")
    return df.loc[df["GPU ms"].idxmin()]


def provenance(df) -> str:
    """Where and when a ladder's numbers were measured: GPU and dates."""
    gpus = " / ".join(dict.fromkeys(df["gpu"].astype(str)))
    dates = sorted(dict.fromkeys(df["date"].astype(str)))
    when = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
    return f"GPU time on {gpus}, measured {when} (book/data); torch best: cuDNN, strict fp32 or fp16 as marked"


def _label(row) -> str:
    return f"{row['step']} [fp16]" if row["dtype"] == "fp16" else row["step"]


def _ch(chapter: str) -> str:
    n = _number(chapter)
    return f"ch{int(n)}" + ("b" if n % 1 else "")


def _fmt(v, suffix: str = "") -> str:
    return "—" if v is None or not math.isfinite(v) else f"{v:.3g}{suffix}"


def html(upto: str, pass_: str = "forward") -> str:
    """The ladder of chapters 2 to `upto` as HTML (what show() displays): one row per rung, one
    column per workload with × torch best (GPU ms, caller ms and % of floor in each cell's
    tooltip), this chapter's rungs in bold; under it, the GPU ms of the same cells."""
    from html import escape

    df = table(upto, pass_=pass_)
    parts = ["<style>table.convlab-ladder{font-size:85%;max-width:780px;border-collapse:collapse;margin:0.3em 0}"
             "table.convlab-ladder td,table.convlab-ladder th{padding:1px 7px;text-align:right}"
             "table.convlab-ladder caption{caption-side:top;text-align:left}</style>"]
    for group in (WORKLOADS_2D, (WORKLOAD_3D,)):
        sub = df[df["workload"].isin(group)]
        if sub.empty:
            continue
        cols = [w for w in group if w in set(sub["workload"])]
        keys = list(dict.fromkeys(zip(sub["chapter"], sub["step"], sub["dtype"])))
        cell = {(r["chapter"], r["step"], r["dtype"], r["workload"]): r for _, r in sub.iterrows()}

        def grid(value, title: str) -> str:
            head = "".join(f"<th>{escape(w)}</th>" for w in cols)
            body = []
            for ch, step, dt in keys:
                new = ch == upto
                style = ' style="font-weight:bold;background:#fff4d6"' if new else ""
                name = escape(f"{step} [fp16]" if dt == "fp16" else step)
                tds = []
                for w in cols:
                    r = cell.get((ch, step, dt, w))
                    if r is None:
                        tds.append("<td>—</td>")
                        continue
                    tip = (f"GPU {_fmt(r['GPU ms'])} ms · caller {_fmt(r['caller ms'])} ms · torch best "
                           f"{_fmt(r['torch best ms'])} ms · {_fmt(r['% of floor'], '%')} of the roofline floor")
                    tds.append(f'<td title="{escape(tip)}">{value(r)}</td>')
                body.append(f"<tr{style}><td>{_ch(ch)}</td><td style=\"text-align:left\">{name}</td>{''.join(tds)}</tr>")
            return (f'<table class="convlab-ladder">'
                    f"<caption>{escape(title)}</caption>"
                    f"<thead><tr><th></th><th style=\"text-align:left\">step</th>{head}</tr></thead>"
                    f"<tbody>{''.join(body)}</tbody></table>")

        label = ("" if pass_ == "forward" else f", {pass_}") + (", conv3d" if group == (WORKLOAD_3D,) else "")
        parts.append(grid(lambda r: _fmt(r["× torch best"], "×"),
                          f"× torch best (torch best's GPU time / ours; above 1× ours is faster){label}"))
        parts.append("<details><summary>GPU ms of the same rungs</summary>"
                     + grid(lambda r: _fmt(r["GPU ms"]), f"GPU ms{label}") + "</details>")
    parts.append(f'<p style="font-size:80%">{escape(provenance(df))}. Bold: this chapter\'s rungs; '
                 f"hover a cell for GPU ms, caller ms and % of the roofline floor.</p>")
    return "".join(parts)


def show(upto: str, pass_: str = "forward") -> None:
    """Display the ladder of chapters 2 to `upto` in a notebook (html())."""
    from IPython.display import HTML, display

    display(HTML(html(upto, pass_)))


def figure(upto: str, pass_: str = "forward"):
    """× torch best (log scale) along the rungs of chapters 2 to `upto`, one line per workload,
    this chapter's rungs shaded, the 1× line marked "torch best"; sized for a 780 px column."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    df = table(upto, pass_=pass_)
    keys = list(dict.fromkeys(zip(df["chapter"], df["step"], df["dtype"])))
    x = {k: i for i, k in enumerate(keys)}
    short = dict(zip(zip(df["chapter"], df["step"], df["dtype"]), df["short"]))
    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=110, layout="constrained")
    new = [x[k] for k in keys if k[0] == upto]
    if new:
        ax.axvspan(min(new) - 0.5, max(new) + 0.5, color="#fff4d6", zorder=0)
    workloads = [w for w in COURSE if w in set(df["workload"])]
    colors = sns.color_palette("colorblind", len(workloads))
    for i, w in enumerate(workloads):
        sub = df[df["workload"] == w]
        have = {(r["chapter"], r["step"], r["dtype"]): r["× torch best"] for _, r in sub.iterrows()}
        # a gap where the rung did not run on this workload: the line breaks there
        ys = [have.get(k, math.nan) for k in keys]
        ax.plot(range(len(keys)), ys, marker="osD^vP"[i % 6], color=colors[i], label=w, lw=1.4, ms=5)
    ax.set_yscale("log")
    ax.axhline(1.0, color="black", lw=1, ls="--")
    ax.annotate("torch best", xy=(1.0, 1.0), xycoords=("axes fraction", "data"), xytext=(-3, 3),
                textcoords="offset points", fontsize=9, ha="right",
                bbox={"fc": "white", "ec": "none", "alpha": 0.85, "pad": 1})   # readable over the points
    labels = [short[k] + (" (fp16)" if k[2] == "fp16" else "") for k in keys]
    ax.set_xticks(range(len(keys)), labels, rotation=40, ha="right", rotation_mode="anchor", fontsize=9)
    for tick, k in zip(ax.get_xticklabels(), keys):
        if k[0] == upto:
            tick.set_fontweight("bold")
    # the chapters along the top, a thin rule between them
    chapters = list(dict.fromkeys(k[0] for k in keys))
    for ch in chapters:
        xs = [x[k] for k in keys if k[0] == ch]
        ax.text((min(xs) + max(xs)) / 2, 1.01, _ch(ch), transform=ax.get_xaxis_transform(), ha="center",
                va="bottom", fontsize=9, fontweight="bold" if ch == upto else "normal")
        if min(xs) > 0:
            ax.axvline(min(xs) - 0.5, color="0.75", lw=0.8)
    ax.set_xlim(-0.5, len(keys) - 0.5)
    ax.tick_params(axis="y", labelsize=9)
    ax.set_ylabel("× torch best (log; above 1: faster)", fontsize=10)
    what = "" if pass_ == "forward" else f", {pass_}"
    ax.set_title(f"The ladder up to chapter {_ch(upto)[2:]}{what} (shaded: this chapter)", fontsize=10, pad=16)
    ax.grid(axis="y", which="major", alpha=0.3)
    # the legend to the right of the axes and a strip kept free at the bottom for the provenance line
    # (a legend below the axes and that line overlapped)
    fig.legend(*ax.get_legend_handles_labels(), loc="outside right upper", fontsize=9, frameon=False)
    fig.get_layout_engine().set(rect=(0, 0.035, 1, 0.965))
    fig.text(0.01, 0.005, provenance(df), fontsize=8, ha="left", va="bottom")
    return fig
