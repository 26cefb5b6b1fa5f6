"""The chapters' figure: ms per workload per implementation, the spread as error bars, the roofline
floor as a dash, and what it was measured on written on the figure.

Figures are drawn from a DataFrame of results rows (convlab.results): live rows on a GPU run, or
book/data/<chapter>.csv on the emulator, so a reader without a GPU sees the committed GPU
results, labelled with their GPU and date, and never emulator wall times.
"""
from __future__ import annotations

import math

# Imported here, before any kernel is loaded, on purpose: once the emulator's runtime library is
# loaded with RTLD_GLOBAL (cl.load_cpu, the emulator's cl.load), importing matplotlib's ft2font
# extension failed on the GPU machine (pybind11 SystemError). Import convlab.plots first.
import matplotlib.pyplot as plt
import seaborn as sns

from . import results

MARKERS = "osD^vP*X"


def plot_times(df, *, title: str | None = None, note: str | None = None, ax=None, log: bool | None = None):
    """Dot plot of df (results rows): one column of dots per workload, one colour per implementation,
    error bars from p25 to p75, the roofline floor as a black dash where the rows carry one."""
    if df is None or len(df) == 0:
        raise ValueError("no results to plot")
    devices = list(dict.fromkeys(df["gpu"]))
    if len(devices) > 1:
        raise ValueError(f"results from several devices ({devices}): compare only figures taken on one")

    workloads = list(dict.fromkeys(df["workload"]))
    impls = list(dict.fromkeys(df["impl"]))
    if ax is None:
        fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(workloads) + 2), 4.6), layout="constrained")
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
    ax.set_ylabel("time per layer, ms (median; bars p25–p75)")
    ax.grid(axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    ax.set_title(title or "time per convolution layer")
    caption = results.provenance(df)
    if note:
        caption += "\n" + note
    fig.text(0.01, -0.01, caption, fontsize=8, ha="left", va="top", wrap=True)
    return fig


def plot_committed(chapter: str, *, title: str | None = None):
    """Plot book/data/<chapter>.csv, the results of the last GPU run, or say plainly there are none."""
    import convlab as cl

    df = results.load(chapter)
    if df is None:
        print(f"No GPU results are committed yet for chapter {chapter}: book/data/{chapter}.csv does not exist.\n"
              f"Run `make gpu-run` on a machine with a GPU to measure them. Nothing is plotted: the emulator's wall\n"
              f"times say nothing about a GPU.")
        return None
    note = None
    if cl.device().backend != "cuda":
        note = ("committed results of a GPU run, read from book/data/"
                f"{chapter}.csv; nothing on this figure was timed on this machine (it runs the emulator)")
    return plot_times(df, title=title, note=note)
