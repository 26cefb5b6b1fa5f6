"""The tables the tile-sweep benchmarks (f32_layers.py, tensor_core_layers.py, depthwise_layers.py)
print, computed from their result rows: convlab.measuring.results' columns, plus the tunables measure.sweep
adds as columns (empty where a row ran with the launcher's defaults)."""
from __future__ import annotations

import math

from convlab.measuring.baselines import TORCH_BEST


def geomean(values) -> float:
    v = [float(a) for a in values if a == a and a > 0]
    return math.exp(sum(map(math.log, v)) / len(v)) if v else float("nan")


def tunables(row, keys) -> dict:
    """The tunables a row was measured with ({}: the launcher's defaults)."""
    return {k: int(row[k]) for k in keys if k in row and row[k] == row[k]}


def text(cfg: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in cfg.items()) or "default"


def ours(rows):
    return rows[rows["kind"] == "ours"]


def fastest(rows):
    """The row of least GPU time, or None."""
    return None if rows is None or not len(rows) else rows.loc[rows["ms"].idxmin()]


def torch_best_ms(rows) -> float:
    best = rows[rows["impl"] == TORCH_BEST]
    return float(best["ms"].iloc[0]) if len(best) else float("nan")


def layer_table(rows, name) -> str:
    """One layer's rows, fastest first: name(row) says who, then GPU ms, GFLOP/s, GB/s, % of the
    roofline floor and torch best / ms (above 1: faster than torch at its best layout)."""
    best = torch_best_ms(rows)
    out = [f"   {'contender':<66} {'ms':>9} {'GFLOP/s':>9} {'GB/s':>7} {'floor':>6} {'ratio':>6}"]
    for _, r in rows.sort_values("ms").iterrows():
        out.append(f"   {name(r)[:66]:<66} {r['ms']:>9.4f} {r['gflops']:>9.0f} {r['gbs']:>7.0f} "
                   f"{100 * r['floor_frac']:>5.0f}% {best / r['ms']:>6.2f}")
    return "\n".join(out)


def versus(df, picks: dict, label=None):
    """One line per (workload, dtype) of df (the rows of one pass): torch best's ms, then for each pick
    (column name -> function of that layer's rows giving the one row it names, or None) its ms and
    torch best / ms; label(row), when given, names the row of the last pick (its config)."""
    import pandas as pd

    lines = []
    for (wl, dtype), rows in df.groupby(["workload", "dtype"], sort=False):
        best = torch_best_ms(rows)
        line = {"layer": wl, "dtype": dtype, "torch best ms": best}
        last = None
        for col, pick in picks.items():
            last = pick(rows)
            ms = float("nan") if last is None else float(last["ms"])
            line[f"{col} ms"], line[f"{col} ratio"] = ms, best / ms
        if label is not None:
            line["its config"] = "-" if last is None else label(last)
        lines.append(line)
    return pd.DataFrame(lines).set_index(["layer", "dtype"])


def show(table, picks) -> str:
    """versus()'s table as text: each pick's cell "ms (torch best / ms)"; other columns as they are."""
    mine = {f"{col} {end}" for col in picks for end in ("ms", "ratio")} | {"its config"}
    out = table[[c for c in table if c not in mine]].round(4).astype(str)
    for col in picks:
        out[col] = [f"{ms:.4f} ({r:.2f}x)" for ms, r in zip(table[f"{col} ms"], table[f"{col} ratio"])]
    if "its config" in table:
        out["its config"] = table["its config"]
    return out.to_string()


def geomeans(table, picks, over: str = "torch best") -> list[str]:
    """The geometric mean of each pick's ratio column over the layers (per dtype)."""
    out = [f"# geometric mean of {over} / ours (above 1: ours faster):"]
    for dtype, sub in table.groupby(level="dtype", sort=False):
        for col in picks:
            r = sub[f"{col} ratio"].dropna()
            out.append(f"#   {dtype:<5} {col:<34} {geomean(r):.3f}x over {len(r)} layers")
    return out


def checked_lines(df, label, columns=()) -> list[str]:
    """On the emulator, in place of the timings: one line per row (each passed its check on the
    layer's small twin), the workload and the given columns, then label(row)."""
    width = max(len(str(w)) for w in df["workload"]) + 2
    lines = ["# emulator: every row below passed its check on the layer's small twin; nothing was timed"]
    for _, r in df.iterrows():
        cols = "".join(f"{r[c]:<{max(len(str(v)) for v in df[c]) + 1}}" for c in columns)
        lines.append(f"{r['workload']:<{width}}{cols}{label(r)}")
    return lines


def gradient_lines(back, heading: str) -> list[str]:
    """Per layer and gradient pass (dX, dW, forward+dX+dW) of `back` (rows of those passes): torch
    best ms / our fastest ms and their ratio, then the ratio's geometric mean per pass."""
    import pandas as pd

    tables = {ps: versus(rows, {ps: lambda r: fastest(ours(r))}) for ps, rows in back.groupby("pass", sort=False)}
    cell = lambda a, b: f"{a:.4f} / {b:.4f} ({a / b:.2f}x)"  # noqa: E731
    shown = pd.DataFrame({ps: [cell(a, b) for a, b in zip(t["torch best ms"], t[f"{ps} ms"])]
                          for ps, t in tables.items()}, index=next(iter(tables.values())).index)
    out = ["", f"# {heading}: torch best ms / ours ms (their ratio: above 1, ours faster)", shown.to_string(),
           "# geometric mean of the ratio:"]
    for ps, t in tables.items():
        out += geomeans(t, [ps])[1:]
    return out
