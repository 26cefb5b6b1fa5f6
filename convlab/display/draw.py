"""Pictures of what one kernel launch touches, drawn from the emulator's record of it (cl.trace),
so a picture can never disagree with its kernel.

    fig = cl.draw(cl.ops.naive.conv2d_naive_z, x, w, block_id=(1, 0, 0))            # a launcher call
    fig = cl.draw(kern, x, w, y, B, C, M, H, W, K, 0, 1, grid=g, block=b, what="threads")

Views (what=): "footprint" (the input cells a block reads, its halo, the reuse, the outputs it
writes), "shared" (the block's __shared__ array: who wrote each cell; cells read but never
written), "sectors" (one warp's global request of one line: lanes -> 32-byte sectors), "banks"
(one warp's shared request of one line: lanes -> banks, conflicts) and "threads" (which output
cells each thread writes, colored by warp). Every figure carries the numbers it was drawn from
as fig.convlab_data (a dict), and the Trace itself as fig.convlab_trace.
"""
from __future__ import annotations

import numpy as np

from ..gpu._errors import ConvlabError
from ..measuring.trace import request_sectors, request_wavefronts, trace

__all__ = ["draw", "draw_trace", "VIEWS"]

VIEWS = ("footprint", "shared", "sectors", "banks", "threads")
FIGSIZE_W = 7.5
DPI = 110
FONT = 10


def draw(kernel, *args, grid=None, block=None, shared=0, block_id=(0, 0, 0), what: str = "footprint",
         buffer: str | None = None, warp: int = 0, line: int | str | None = None, shape=None, ax=None,
         title: str | None = None, launch: int | str = 0, **kwargs):
    """Draw what block `block_id` of one launch touches. kernel: a Kernel (grid=, block=, shared=
    as for a launch) or a launcher (cl.ops...., its own keywords in kwargs). what: one of VIEWS.
    buffer: the array to draw (default: the input for "footprint", the __shared__ array for
    "shared", the output for "threads"); warp and line (its number, or text it contains) pick the
    request for "sectors" and "banks" (default: warp 0, the first line of that kind); shape: the
    2D shape to lay a flat buffer out in; launch: which kernel launch of a launcher call.
    Returns the matplotlib Figure (fig.convlab_data: what it shows, as arrays and counts)."""
    if what not in VIEWS:
        raise ValueError(f"what={what!r}: use one of {', '.join(VIEWS)}")
    if grid is not None:
        kwargs.update(grid=grid, block=block, shared=shared)
    elif block is not None:        # a launcher's own block= keyword
        kwargs["block"] = block
    t = trace(kernel, *args, blocks=[block_id], launch=launch, **kwargs)
    return draw_trace(t, what, buffer=buffer, warp=warp, line=line, shape=shape, ax=ax, title=title)


def draw_trace(t, what: str = "footprint", *, buffer=None, warp=0, line=None, shape=None, ax=None, title=None):
    """Draw a Trace (cl.trace's) as draw() does; its first traced block."""
    import matplotlib.pyplot as plt

    acc = t.of_block(t.blocks[0])
    if not len(acc):
        raise ConvlabError(f"block {t.blocks[0]} of {t.kernel} made no memory access (is it inside the grid "
                           f"{t.grid}? threads past the edge may all return)")
    fig = None
    if ax is None:
        panels = 2 if what == "footprint" else 1
        fig, axes = plt.subplots(1, panels, figsize=(FIGSIZE_W, 3.6 if panels == 2 else 4.6), dpi=DPI,
                                 squeeze=False)
        ax = list(axes[0]) if panels == 2 else axes[0][0]
    else:
        pair = isinstance(ax, (list, tuple)) or (hasattr(ax, "shape") and getattr(ax, "size", 1) == 2)
        if (what == "footprint") != pair:
            raise ValueError("ax=: the footprint view draws on two axes (input, output), the others on one")
        fig = (ax[0] if pair else ax).figure
    with plt.rc_context({"font.size": FONT}):
        data, head = _VIEW[what](t, acc, ax, buffer=buffer, warp=warp, line=line, shape=shape)
    b = t.blocks[0]
    fig.suptitle(title or f"{_short(t.kernel)}, block ({b[0]},{b[1]},{b[2]}): {head}", fontsize=FONT + 1)
    fig.tight_layout()
    fig.convlab_data, fig.convlab_trace = data, t
    return fig


def _short(name: str) -> str:
    return name.split("(")[0].split("<")[0]


# ---------------------------------------------------------------------------------------------
# Laying a buffer out as planes of 2D cells

def _planes(t, name: str, shape=None):
    """(number of planes, plane shape) of a buffer drawn as its last two dimensions (or shape=)."""
    b = t.buffers[name]
    full = tuple(shape) if shape is not None else b.shape
    if len(full) == 1:
        n = full[0]
        full = (n,) if n <= 32 else ((n + 31) // 32, 32)
    if len(full) == 1:
        return 1, (1, full[0])
    return int(np.prod(full[:-2])) if len(full) > 2 else 1, (full[-2], full[-1])


def _cells(acc, t, name, shape=None):
    """Each access's element(s) of the buffer as (plane, row, col), one row per element."""
    nplanes, (h, w) = _planes(t, name, shape)
    a = acc[acc.buffer == name]
    idx = np.repeat(a["index"].to_numpy(), a.elems.to_numpy())
    idx = idx + np.concatenate([np.arange(e) for e in a.elems.to_numpy()]) if len(a) else idx
    rows = a.loc[a.index.repeat(a.elems)]
    return rows.assign(plane=idx // (h * w), row=(idx // w) % h, col=idx % w), (h, w)


def _plane_label(t, name, plane, shape=None):
    b = t.buffers[name]
    full = tuple(shape) if shape is not None else b.shape
    if len(full) <= 2:
        return name
    lead = np.unravel_index(plane, full[:-2])
    return f"{name}[{','.join(str(int(i)) for i in lead)}]"


def _grid_axes(ax, h, w):
    ax.set_xlim(-0.5, w - 0.5)
    ax.set_ylim(h - 0.5, -0.5)
    ax.set_aspect("equal")
    step = max(1, int(np.ceil(max(h, w) / 8)))
    ax.set_xticks(range(0, w, step))
    ax.set_yticks(range(0, h, step))
    ax.tick_params(labelsize=FONT - 1)
    if max(h, w) <= 48:          # thin lines between the cells
        ax.set_xticks(np.arange(-0.5, w, 1), minor=True)
        ax.set_yticks(np.arange(-0.5, h, 1), minor=True)
        ax.grid(which="minor", color="#e0e0e0", lw=0.4)
        ax.tick_params(which="minor", length=0)


def _outline(ax, mask, color, lw=2.0, ls="-"):
    """Draw the boundary of a set of cells."""
    h, w = mask.shape
    for r in range(h):
        for c in range(w):
            if not mask[r, c]:
                continue
            for dr, dc, seg in ((-1, 0, ((c - .5, c + .5), (r - .5, r - .5))), (1, 0, ((c - .5, c + .5), (r + .5, r + .5))),
                                (0, -1, ((c - .5, c - .5), (r - .5, r + .5))), (0, 1, ((c + .5, c + .5), (r - .5, r + .5)))):
                rr, cc = r + dr, c + dc
                if not (0 <= rr < h and 0 <= cc < w and mask[rr, cc]):
                    ax.plot(*seg, color=color, lw=lw, ls=ls, solid_capstyle="projecting")


def _legend(ax, handles):
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=FONT - 1, frameon=False,
              borderaxespad=0)


# ---------------------------------------------------------------------------------------------
# The views: each returns (data, a few words for the title)

def _footprint(t, acc, axes, buffer=None, shape=None, **_):
    from matplotlib.patches import Patch
    g = acc[acc.space == "global"]
    written = g[g.access != "read"].buffer.unique()
    if not len(written):
        raise ConvlabError("the block wrote no global buffer: no output tile to draw")
    out = written[0]
    if buffer is None:
        reads = [n for n in g[g.access == "read"].buffer.unique() if n != out]
        if not reads:
            raise ConvlabError("the block read no global buffer besides its output")
        buffer = max(reads, key=lambda n: np.prod(_planes(t, n)[1]))   # the image, not the small mask
    inp, (h, w) = _cells(g[g.access == "read"], t, buffer, shape)
    if not len(inp):
        raise ConvlabError(f"the block read nothing of {buffer!r}")
    plane = int(inp.plane.min())
    inp = inp[inp.plane == plane]
    reads = np.zeros((h, w), dtype=int)
    np.add.at(reads, (inp.row.to_numpy(), inp.col.to_numpy()), 1)
    outc, (ho, wo) = _cells(g[g.access != "read"], t, out)
    oplane = int(outc.plane.min())
    outc = outc[outc.plane == oplane]
    wrote = np.zeros((ho, wo), dtype=bool)
    wrote[outc.row.to_numpy(), outc.col.to_numpy()] = True
    # the block's own output tile mapped back to input coordinates (cross-correlation: output (i, j)
    # starts its window at input (i*stride - pad, j*stride - pad))
    pad = int(t.scalars.get("pad", t.scalars.get("padding", 0)))
    stride = int(t.scalars.get("stride", 1))
    tile = np.zeros((h, w), dtype=bool)
    r, c = outc.row.to_numpy() * stride - pad, outc.col.to_numpy() * stride - pad
    ok = (r >= 0) & (r < h) & (c >= 0) & (c < w)
    tile[r[ok], c[ok]] = True
    halo = (reads > 0) & ~tile
    a0, a1 = axes
    shown = np.ma.masked_equal(reads, 0)
    im = a0.imshow(shown, cmap="Blues", vmin=0, vmax=max(int(reads.max()), 1), interpolation="nearest")
    hr, hc = np.nonzero(halo)
    a0.scatter(hc, hr, marker="x", s=max(8, 1600 / max(h, w) ** 1.2), color="#d95f02", lw=1.2)
    _outline(a0, tile & (reads > 0), "black")
    _grid_axes(a0, h, w)
    a0.set_title(f"read: {_plane_label(t, buffer, plane, shape)}", fontsize=FONT)
    cb = a0.figure.colorbar(im, ax=a0, fraction=0.046, pad=0.03)
    cb.set_label("reads per cell", fontsize=FONT - 1)
    cb.ax.tick_params(labelsize=FONT - 1)
    a1.imshow(np.where(wrote, 1.0, np.nan), cmap="Greens", vmin=0, vmax=1.3, interpolation="nearest")
    _outline(a1, wrote, "black")
    _grid_axes(a1, ho, wo)
    a1.set_title(f"written: {_plane_label(t, out, oplane)}", fontsize=FONT)
    from matplotlib.lines import Line2D
    _legend(a1, [Line2D([], [], color="black", lw=2, label="block's output tile\n(input: mapped back)"),
                 Line2D([], [], marker="x", ls="", color="#d95f02", label="halo: read, outside\nthe tile"),
                 Patch(color="#2171b5", label="shade: times read\n(reuse)")])
    data = {"buffer": buffer, "plane": plane, "reads": reads, "read": reads > 0, "tile": tile, "halo": halo,
            "output": out, "output_plane": oplane, "written": wrote, "pad": pad, "stride": stride}
    return data, f"footprint in {buffer}, outputs in {out}"


def _shared(t, acc, ax, buffer=None, shape=None, **_):
    import matplotlib
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch
    s = acc[acc.space == "shared"]
    if not len(s):
        raise ConvlabError("the block made no __shared__ access")
    buffer = buffer or s.buffer.iloc[0]
    cells, (h, w) = _cells(s, t, buffer, shape)
    cells = cells[cells.plane == cells.plane.min()].sort_values("seq")
    writer = np.full((h, w), -1)
    read = np.zeros((h, w), dtype=bool)
    written = np.zeros((h, w), dtype=bool)
    bad = np.zeros((h, w), dtype=bool)
    for row in cells.itertuples():
        r, c = row.row, row.col
        if row.access == "read":
            if not written[r, c]:
                bad[r, c] = True
            read[r, c] = True
        else:
            written[r, c] = True
            writer[r, c] = row.warp
    nwarps = int(max(acc.warp.max() + 1, 1))
    colors = [matplotlib.colormaps["tab10" if nwarps <= 10 else "tab20"](i % 20) for i in range(nwarps)]
    ax.imshow(np.ma.masked_less(writer, 0), cmap=ListedColormap(colors), vmin=-0.5, vmax=nwarps - 0.5,
              interpolation="nearest")
    br, bc = np.nonzero(bad)
    ax.scatter(bc, br, marker="X", s=max(12, 2400 / max(h, w) ** 1.2), color="red", edgecolor="white", lw=0.6)
    _grid_axes(ax, h, w)
    ax.set_xlabel("column" + ("" if t.buffers[buffer].declared or shape else " (4-byte words; 32 = the banks)"))
    ax.set_ylabel("row")
    hands = [Patch(color=colors[i], label=f"warp {i}") for i in range(min(nwarps, 16))]
    hands.append(Patch(color="white", ec="gray", label="never written"))
    if bad.any():
        from matplotlib.lines import Line2D
        hands.append(Line2D([], [], marker="X", ls="", color="red", label="read before any write"))
    _legend(ax, hands)
    data = {"buffer": buffer, "writer_warp": writer, "written": written, "read": read, "read_unwritten": bad}
    return data, f"__shared__ {buffer}, written by warp (colour)"


def _pick_line(acc, line, what):
    if line is None:
        if not len(acc):
            raise ConvlabError(f"the block has no {what}")
        return acc.sort_values("seq").line.iloc[0]
    if isinstance(line, int):
        hit = acc[acc.lineno == line]
    else:
        hit = acc[acc.line.str.contains(line, regex=False) | acc.code.str.contains(line, regex=False)]
    if not len(hit):
        have = ", ".join(sorted(acc.line.unique()))
        raise ConvlabError(f"no {what} at line {line!r} (lines with one: {have})")
    return hit.sort_values("seq").line.iloc[0]


def _requests(acc, warp, line, what):
    a = acc[acc.warp == warp]
    if not len(a):
        raise ConvlabError(f"warp {warp} of the block made no {what}")
    ln = _pick_line(a, line, what)
    a = a[a.line == ln]
    reqs = [g for _, g in a.sort_values("seq").groupby("request", sort=False)]
    return ln, reqs


def _sectors(t, acc, ax, warp=0, line=None, **_):
    import matplotlib
    g = acc[(acc.space == "global") & (acc.access != "atomic")]
    if line is None:
        loads = g[g.access == "read"]
        g = loads if len(loads) else g
    ln, reqs = _requests(g, warp, line, "global load or store")
    per = [len(request_sectors(r)) for r in reqs]
    first = reqs[0]
    secs = request_sectors(first)
    base = secs[0] * 32
    cmap = matplotlib.colormaps["tab10"]
    lane_secs = {}
    for r in first.itertuples():
        a0 = int(r.addr) - base
        s = list(range(int(r.addr) >> 5, ((int(r.addr) + r.bytes - 1) >> 5) + 1))
        lane_secs[r.lane] = s
        ax.barh(r.lane, r.bytes, left=a0, height=0.8, color=cmap(secs.index(s[0]) % 10), edgecolor="black", lw=0.3)
    span = (secs[-1] + 1) * 32 - base
    for s in secs:
        ax.axvline(s * 32 - base, color="gray", lw=0.6, ls=":")
    ax.set_xlim(0, max(span, 32))
    ax.set_ylim(31.6, -0.6)
    ax.set_yticks(range(0, 32, 4))
    ax.set_ylabel("lane")
    ax.set_xlabel("bytes from the first sector's start (dotted: 32-byte sector boundaries)")
    code = first.code.iloc[0]
    ax.set_title(f"{ln}: {code[:58]}\nrequest 1 of {len(reqs)}: {len(secs)} sectors; the warp's {len(reqs)} "
                 f"requests: {sum(per)} sectors, {sum(per) / len(reqs):.3g} per request", fontsize=FONT - 1)
    data = {"line": ln, "warp": warp, "requests": len(reqs), "sectors": int(sum(per)), "sectors_per_request": per,
            "first_request_sectors": secs, "lane_sectors": lane_secs}
    buf = first.buffer.iloc[0]
    return data, f"{buf}, warp {warp}, lanes -> sectors"


def _banks(t, acc, ax, warp=0, line=None, **_):
    from matplotlib.patches import Rectangle
    s = acc[(acc.space == "shared") & (acc.access != "atomic")]
    if line is None:
        loads = s[s.access == "read"]
        s = loads if len(loads) else s
    ln, reqs = _requests(s, warp, line, "shared-memory load or store")
    waves = [request_wavefronts(r) for r in reqs]
    first = reqs[0]
    # as the profiler: 128 bytes of lanes per phase (8- and 16-byte accesses take 2 or 4 phases);
    # a bank conflicts when one phase touches several distinct words in it
    width = int(first.bytes.max())
    per = 32 // (4 if width > 8 else 2 if width > 4 else 1)
    words, phase_words = {}, {}
    lane_words = {}
    for r in first.itertuples():
        ws = list(range(int(r.addr) >> 2, ((int(r.addr) + r.bytes - 1) >> 2) + 1))
        lane_words[r.lane] = ws
        for wd in ws:
            words.setdefault(wd & 31, set()).add(wd)
            phase_words.setdefault((r.lane // per, wd & 31), set()).add(wd)
    hot = {b for (_, b), ws in phase_words.items() if len(ws) > 1}
    for lane, ws in lane_words.items():
        for wd in ws:
            ax.plot([lane, wd & 31], [1, 0], color="#cb181d" if (wd & 31) in hot else "#6baed6",
                    lw=1.4 if (wd & 31) in hot else 1.0, zorder=1)
    ax.scatter(list(lane_words), [1] * len(lane_words), s=40, color="#08519c", zorder=2)
    for bank in range(32):
        n = len(words.get(bank, ()))
        ax.add_patch(Rectangle((bank - 0.4, -0.12), 0.8, 0.12,
                               color="#cb181d" if bank in hot else "#c6dbef" if n else "#f0f0f0", zorder=2))
        if n > 1:
            ax.text(bank, -0.2, str(n), ha="center", va="top", fontsize=FONT - 1, color="#cb181d")
    ax.set_xlim(-0.8, 31.8)
    ax.set_ylim(-0.42, 1.12)
    ax.set_xticks(range(0, 32, 4))
    ax.set_yticks([0, 1])
    ax.set_yticklabels(["bank", "lane"])
    ax.set_xlabel("lane (top) and bank (bottom; 32 banks of 4-byte words); red numbers: distinct words in a bank"
                  + (f"\n{32 // per} phases of {per} lanes each (8- or 16-byte accesses)" if per < 32 else ""),
                  fontsize=FONT - 1)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    code = first.code.iloc[0]
    wave, least = waves[0]
    total = sum(w for w, _ in waves)
    confl = sum(w - l for w, l in waves)
    ax.set_title(f"{ln}: {code[:58]}\nrequest 1 of {len(reqs)}: {wave} wavefront{'s' if wave != 1 else ''}; "
                 f"the warp's {len(reqs)} requests: {total} wavefronts, {confl} bank conflicts", fontsize=FONT - 1)
    data = {"line": ln, "warp": warp, "requests": len(reqs), "wavefronts": total, "conflicts": confl,
            "first_request": {"wavefronts": wave, "conflicts": wave - least, "bank_words": words,
                              "conflict_banks": sorted(hot), "lane_words": lane_words}}
    buf = first.buffer.iloc[0]
    return data, f"__shared__ {buf}, warp {warp}, lanes -> banks"


def _threads(t, acc, ax, buffer=None, shape=None, **_):
    import matplotlib
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch
    g = acc[(acc.space == "global") & (acc.access != "read")]
    if buffer is None:
        if not len(g):
            raise ConvlabError("the block wrote no global buffer")
        buffer = g.sort_values("seq").buffer.iloc[0]
    cells, (h, w) = _cells(g, t, buffer, shape)
    plane = int(cells.plane.min())
    on = cells[cells.plane == plane]
    warp = np.full((h, w), -1)
    thread = np.full((h, w), -1)
    warp[on.row.to_numpy(), on.col.to_numpy()] = on.warp.to_numpy()
    thread[on.row.to_numpy(), on.col.to_numpy()] = on.thread.to_numpy()
    nwarps = int(acc.warp.max() + 1)
    colors = [matplotlib.colormaps["tab10" if nwarps <= 10 else "tab20"](i % 20) for i in range(nwarps)]
    ax.imshow(np.ma.masked_less(warp, 0), cmap=ListedColormap(colors), vmin=-0.5, vmax=nwarps - 0.5,
              interpolation="nearest")
    labels = max(h, w) <= 20 and thread.max() < 100      # legible numbers: two digits a cell
    if labels:
        for r, c in zip(*np.nonzero(thread >= 0)):
            ax.text(c, r, str(thread[r, c]), ha="center", va="center", fontsize=FONT - 1)
    _grid_axes(ax, h, w)
    per_thread = cells.groupby("thread").size()      # every plane: a coarsened thread's maps too
    _legend(ax, [Patch(color=colors[i], label=f"warp {i}") for i in range(min(nwarps, 16))])
    ax.set_xlabel("column" + (" (numbers: thread, linear in the block)" if labels else ""))
    ax.set_ylabel("row")
    data = {"buffer": buffer, "plane": plane, "warp": warp, "thread": thread,
            "outputs_per_thread": per_thread.to_dict(), "other_planes": int((cells.plane != plane).sum())}
    more = f" (and {data['other_planes']} in other planes)" if data["other_planes"] else ""
    return data, f"{_plane_label(t, buffer, plane, shape)} written, by warp{more}"


_VIEW = {"footprint": _footprint, "shared": _shared, "sectors": _sectors, "banks": _banks, "threads": _threads}
