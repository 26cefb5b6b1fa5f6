"""The chapters' figure: ms per workload per implementation, the spread as error bars, the roofline
floor as a dash, and what it was measured on written on the figure.

Figures are drawn from a DataFrame of results rows (convlab.measuring.results): live rows on a GPU run, or
book/data/<chapter>.csv on the emulator (show_committed), so a reader without a GPU sees the
committed GPU results, labelled with their GPU and date, and never emulator wall times. Every
figure shows GPU time (the `ms` column), and says so; chapter 1's CPU rows show CPU wall time.

- plot_times: ms per workload and implementation, the roofline floor as a dash;
- speedup_bars: each implementation's speedup over a baseline ("torch best" by default);
- heatmap: a parameter sweep's GPU time over two tunables, the best setting outlined;
- show_committed, show_sweep: draw a chapter's results (or a sweep's) from this run's rows on a
  GPU or the committed file, or say in a line that there are none.
"""
from __future__ import annotations

import math

# Imported here, before any kernel is loaded, on purpose: once the emulator's runtime library is
# loaded with RTLD_GLOBAL (cl.load_cpu, the emulator's cl.load), importing matplotlib's ft2font
# extension failed on the GPU machine (pybind11 SystemError). Import convlab.display.plots first.
import matplotlib.pyplot as plt
import seaborn as sns

from ..gpu.runtime import device
from ..measuring import results
from ..measuring.baselines import TORCH_BEST

MARKERS = "osD^vP*X"

PAGE_WIDTH_IN = 7.5   # at PAGE_DPI, about the width of the page's content column (750-820 px)
PAGE_DPI = 110


def page_style() -> None:
    """Font sizes legible at the size the page shows a figure (set when convlab.display.plots is imported).

    The content column is about 750-820 px wide; a figure PAGE_WIDTH_IN (7.5 in) wide saved at
    PAGE_DPI (110 dpi) shows about 1:1 there, a wider one is scaled down (and its text with it).
    So: body text 10 pt, tick labels, legend and the provenance line 9 pt, nothing smaller, and
    legends outside the data (right of the axes, or below). Recipe for a chapter's figure:

        fig, ax = plt.subplots(figsize=(plots.PAGE_WIDTH_IN, 4), layout="constrained")
        ...; ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
        book.glue_figure("ch3_times", fig)        # then a {glue:figure} in the markdown cell
    """
    plt.rcParams.update({
        "font.size": 10, "axes.titlesize": 11, "axes.labelsize": 10, "xtick.labelsize": 9,
        "ytick.labelsize": 9, "legend.fontsize": 9, "legend.title_fontsize": 9, "figure.titlesize": 11,
        "figure.dpi": PAGE_DPI, "savefig.dpi": PAGE_DPI,
    })


page_style()


def _time_kind(df) -> str:
    """What the ms column holds: CPU wall time for chapter 1's rows, else GPU time."""
    return "CPU wall time" if "kind" in df and (df["kind"] == "cpu").all() else "GPU time"


def _caption(fig, df, note):
    fig.text(0.01, -0.01, results.provenance(df) + (f"\n{note}" if note else ""), fontsize=9, ha="left",
             va="top", wrap=True)


def plot_times(df, *, title: str | None = None, note: str | None = None, ax=None, log: bool | None = None):
    """Dot plot of df (results rows): one column of dots per workload, one colour per implementation,
    error bars from p25 to p75, the roofline floor as a black dash where the rows carry one. Of
    torch, only "torch best" is drawn (the single layouts stay in the data and the table)."""
    if df is None or len(df) == 0:
        raise ValueError("no results to plot")
    if "kind" in df and (df["kind"] == "torch best").any():
        df = df[df["kind"] != "torch"]
    devices = list(dict.fromkeys(df["gpu"]))
    if len(devices) > 1:
        raise ValueError(f"results from several devices ({devices}): compare only figures taken on one")

    workloads = list(dict.fromkeys(df["workload"]))
    impls = list(dict.fromkeys(df["impl"]))
    if ax is None:
        fig, ax = plt.subplots(figsize=(PAGE_WIDTH_IN, 4.6), layout="constrained")
    else:
        fig = ax.figure
    colors = sns.color_palette("colorblind", len(impls))
    width = 0.7
    step = width / max(len(impls), 1)

    for j, impl in enumerate(impls):
        sub = df[df["impl"] == impl]
        xs, ys, lo, hi = [], [], [], []
        for _, r in sub.iterrows():
            i = workloads.index(r["workload"])
            xs.append(i - width / 2 + step * (j + 0.5))
            ys.append(r["ms"])
            lo.append(max(r["ms"] - r["p25"], 0.0))
            hi.append(max(r["p75"] - r["ms"], 0.0))
        ax.errorbar(xs, ys, yerr=[lo, hi], fmt=MARKERS[j % len(MARKERS)], color=colors[j], label=impl,
                    markersize=7, capsize=3, linestyle="none")

    floor_label = "roofline floor"
    for i, name in enumerate(workloads):
        floors = df.loc[df["workload"] == name, "floor_ms"].dropna()
        if len(floors):
            ax.hlines(float(floors.iloc[0]), i - width / 2, i + width / 2, colors="black", linestyles="--",
                      linewidth=1.2, label=floor_label)
            floor_label = None  # one legend entry

    values = list(df["ms"]) + list(df["floor_ms"].dropna())
    values = [v for v in values if v > 0 and math.isfinite(v)]
    if log is None:
        log = bool(values) and max(values) / min(values) > 20
    if log:
        ax.set_yscale("log")
    ax.set_xticks(range(len(workloads)), workloads)
    ax.set_xlim(-0.6, len(workloads) - 0.4)
    ax.set_ylabel(f"{_time_kind(df)} per layer, ms (median; bars p25–p75)")
    ax.grid(axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    ax.set_title(title or "time per convolution layer")
    _caption(fig, df, note)
    return fig


def committed_note(name: str) -> str | None:
    """The figure note for committed results shown off a GPU (None on a GPU, where they were just measured)."""
    if device().backend == "cuda":
        return None
    return (f"committed results of a GPU run (book/data/{name}.csv); nothing on this figure was timed on "
            "this machine (it runs the emulator)")


def speedup_bars(df, *, over: str = TORCH_BEST, title: str | None = None, note: str | None = None, ax=None):
    """Bars per workload: each implementation's speedup over `over` (its GPU time divided into
    over's), labelled with its own ms; above the line at 1 it is faster. torch's single layouts
    and `over` itself get no bar. df: results rows of one pass and dtype."""
    import numpy as np

    if df is None or len(df) == 0:
        raise ValueError("no results to plot")
    for col in ("pass", "dtype"):
        if col in df and df[col].nunique() > 1:
            raise ValueError(f"rows of several {col} values ({sorted(df[col].unique())}): pass one at a time")
    ms = results.summary(df)
    if over not in ms:
        raise ValueError(f"no rows of {over!r} to compare with; implementations here: {', '.join(ms.columns)}")
    kinds = dict(zip(df["impl"], df["kind"])) if "kind" in df else {}
    impls = [i for i in ms.columns if i != over and kinds.get(i) != "torch"]
    if ax is None:
        fig, ax = plt.subplots(figsize=(PAGE_WIDTH_IN, 4.6), layout="constrained")
    else:
        fig = ax.figure
    colors = sns.color_palette("colorblind", len(impls))
    width = 0.8 / max(len(impls), 1)
    pos = np.arange(len(ms))
    for j, impl in enumerate(impls):
        have = ms[impl].notna() & ms[over].notna()
        xs = pos[have.to_numpy()] - 0.4 + width * (j + 0.5)
        bars = ax.bar(xs, (ms[over] / ms[impl])[have], width, color=colors[j], label=impl)
        ax.bar_label(bars, labels=[f"{v:.3g}" for v in ms[impl][have]], fontsize=9, rotation=90, padding=2)
    ax.axhline(1.0, color="black", lw=1, label=f"{over} ({' / '.join(f'{v:.3g}' for v in ms[over])} ms)")
    ratios = (ms[over].to_numpy()[:, None] / ms[impls].to_numpy()).ravel()
    ratios = ratios[np.isfinite(ratios)]
    if len(ratios) and ratios.max() / ratios.min() > 20:
        ax.set_yscale("log")
    else:
        ax.set_ylim(0, ax.get_ylim()[1] * 1.15)
    ax.set_xticks(pos, ms.index)
    ax.set_ylabel(f"speedup over {over}\n({_time_kind(df)}; bars labelled with ms)")
    ax.grid(axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=9, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2, frameon=False)   # below: the bars keep the width
    ax.set_title(title or f"speedup over {over}")
    _caption(fig, df, note)
    return fig


def show_committed(chapter: str, draw=None, *, data=None, title: str | None = None, passes=("forward",), **kwargs):
    """A chapter's figure: `data` (this run's rows, on a GPU) or the committed results of the last
    GPU run, our kernels beside "torch best" (torch's per-layout rows are in the table, not the
    figure); or one line saying there are none yet. draw(df, title=..., note=..., **kwargs) draws
    (plot_times by default; speedup_bars, or a chapter's own figure). Returns the frame drawn."""
    df = data if data is not None else results.load(chapter, quiet=True)
    if df is None:
        print(f"No results of the current harness are committed yet for {chapter} (book/data/{chapter}.csv): "
              "`make gpu-run` on a machine with a GPU measures them. Nothing is plotted: the emulator's "
              "wall times say nothing about a GPU.")
        return None
    df = df[df["pass"].isin(passes) & df["kind"].isin(["ours", "torch best", "cpu"])]
    (draw or plot_times)(df, title=title, note=None if data is not None else committed_note(chapter), **kwargs)
    plt.show()
    return df


def heatmap(df, rows: str, cols: str, title: str, *, note: str | None = None, labels=None, unit: str = "ms"):
    """GPU time of a sweep as a heatmap over two of its columns (rows × cols), the best setting
    outlined in red and named in the title. unit: "ms" or "µs"."""
    import numpy as np

    scale = {"ms": 1.0, "µs": 1e3}[unit]
    table = df.pivot_table(index=rows, columns=cols, values="ms", sort=False) * scale
    if table.isna().all().all():
        raise ValueError(f"no times to show over {rows} × {cols}")
    fig, ax = plt.subplots(figsize=(min(PAGE_WIDTH_IN, 1.3 * table.shape[1] + 3), 0.6 * table.shape[0] + 2.4), layout="constrained")
    sns.heatmap(table, annot=True, fmt=".3g", cmap="viridis_r", cbar_kws={"label": f"{_time_kind(df)}, {unit} (median)"},
                ax=ax)
    i, j = np.unravel_index(np.nanargmin(table.to_numpy()), table.shape)
    ax.add_patch(plt.Rectangle((j, i), 1, 1, fill=False, edgecolor="red", lw=3))
    ax.set_title(f"{title}\nbest (red): {rows}={table.index[i]}, {cols}={table.columns[j]}: "
                 f"{table.to_numpy()[i, j]:.4g} {unit}")
    ax.set_ylabel(labels[0] if labels else rows)
    ax.set_xlabel(labels[1] if labels else cols)
    _caption(fig, df, note)
    return fig


def show_sweep(name: str, rows: str, cols: str, title: str, *, data=None, labels=None):
    """The heatmap of a sweep: `data` (this run's, on a GPU) or book/data/<name>.csv; the frame shown."""
    df = data if data is not None else results.load(name)
    if df is None:
        print(f"No results of the current harness are committed yet for {name} (book/data/{name}.csv).")
        return None
    heatmap(df, rows, cols, title, note=None if data is not None else committed_note(name), labels=labels)
    plt.show()
    return df
