"""The drawing kit of the course's mapping diagrams (which thread, block, register or kernel
touches what): one figure size and font, a colour per index, arrays drawn as grids of cells.

Each chapter draws its own diagrams with it (convlab.chapters: chapter 2's grids, chapter 5's
tiles, ...), from the code that launches the kernel (the launchers' grid and config functions,
the kernels' own index arithmetic) or from running a tiny kernel, so a diagram cannot disagree
with the code. A diagram attaches the data it draws to its Figure as ``fig.convlab_data`` (a
dict), which the tests check. No diagram measures a time.
"""
from __future__ import annotations

# Before any kernel is loaded (see convlab.display.plots): matplotlib's extension fails to import after the
# emulator's runtime library is loaded with RTLD_GLOBAL.
import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns
from matplotlib.patches import Rectangle

WIDTH = 7.5          # inches: ~780 px at 110 dpi
FONT = 9
PALETTE = sns.color_palette("colorblind")
GREY = (0.85, 0.85, 0.85)


def new_figure(nrows=1, ncols=1, height=3.4, **kw):
    """A diagram's figure: WIDTH wide at 110 dpi (about 1:1 in the page's content column)."""
    fig, axes = plt.subplots(nrows, ncols, figsize=(WIDTH, height), dpi=110, layout="constrained", **kw)
    return fig, axes


def draw_grid(ax, colors, labels=None, *, fontsize=FONT, title=None, lw=0.5):
    """Draw a 2-D array of RGB colours as cells (row 0 at the top), with optional text per cell."""
    colors = np.asarray(colors, float)
    rows, cols = colors.shape[:2]
    ax.imshow(colors, interpolation="nearest", aspect="equal")
    ax.set_xticks(np.arange(-0.5, cols, 1), minor=True)
    ax.set_yticks(np.arange(-0.5, rows, 1), minor=True)
    ax.grid(which="minor", color="white", lw=lw)
    ax.tick_params(which="both", length=0, labelbottom=False, labelleft=False)
    ax.set_xticks([])
    ax.set_yticks([])
    if labels is not None:
        for (r, c), s in np.ndenumerate(labels):
            if s != "":
                ax.text(c, r, s, ha="center", va="center", fontsize=fontsize)
    if title:
        ax.set_title(title, fontsize=FONT + 1)


def outline(ax, r0, c0, h, w, color="black", lw=2.0):
    """A rectangle around h×w cells of a draw_grid from row r0, column c0."""
    ax.add_patch(Rectangle((c0 - 0.5, r0 - 0.5), w, h, fill=False, ec=color, lw=lw, zorder=3))


def by_index(ids, palette=PALETTE, empty=GREY):
    """Colours for an integer array: palette[id % len], empty where id < 0."""
    ids = np.asarray(ids)
    out = np.empty(ids.shape + (3,))
    for idx, v in np.ndenumerate(ids):
        out[idx] = empty if v < 0 else palette[int(v) % len(palette)]
    return out


def light(c, f=0.55):
    """Colour c lightened towards white (f: how much of c is left)."""
    return tuple(1 - f * (1 - np.asarray(c)))
