#!/usr/bin/env python3
"""Fill README.md's results section from book/data/*.csv (the committed GPU-run results).

Rewrites only the lines between <!-- results:begin --> and <!-- results:end -->: one table per
chapter, ms per workload (rows) and implementation (columns), with where and when it was measured.

    python scripts/results_table.py            # rewrite README.md
    python scripts/results_table.py --print    # print the section only
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"


def chapter_table(df: pd.DataFrame) -> str:
    impls = list(dict.fromkeys(df["impl"]))
    workloads = list(dict.fromkeys(df["workload"]))
    has_floor = "floor_ms" in df and df["floor_ms"].notna().any()
    has_shape = "shape" in df
    header = ["workload", *(["shape"] if has_shape else []), *impls] + (["roofline floor"] if has_floor else [])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name in workloads:
        sub = df[df["workload"] == name]
        cells = [name]
        if has_shape:
            cells.append(str(sub["shape"].iloc[0]))
        for impl in impls:
            ms = sub.loc[sub["impl"] == impl, "ms"]
            cells.append(fmt(ms.iloc[0]) if len(ms) else "—")
        if has_floor:
            floor = sub["floor_ms"].dropna()
            cells.append(fmt(floor.iloc[0]) if len(floor) else "—")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def provenance(df: pd.DataFrame) -> str:
    def one(col):
        if col not in df:
            return "?"
        vals = [str(v) for v in dict.fromkeys(df[col].dropna()) if str(v) not in ("", "nan")]
        return " / ".join(vals) if vals else "?"

    return (f"{one('gpu')}, {one('dtype')}, torch {one('torch')}, cuDNN {one('cudnn')}, {one('tf32')}, "
            f"measured {one('date')}")


def fmt(ms) -> str:
    return f"{ms:.3g}" if pd.notna(ms) else "—"


# Rows that time one step of a convolution, not a whole one: never "the best kernel".
PARTIAL_STEPS = {"unroll only (no GEMM)"}


def best_table(frames: dict) -> str:
    """The fastest course kernel per workload over all chapters, beside torch, per GPU and dtype
    (timings are compared only within one GPU's runs)."""
    rows = []
    for stem, df in frames.items():
        # forward layers only: chapter 8's rows are per pass (dX, dW), chapter 1's are CPU timings
        if ("torch tuned" not in set(df["impl"]) or "pass" in df.columns
                or df["gpu"].astype(str).str.contains("CPU").any()):
            continue
        rows.append(df.assign(chapter=stem))
    if not rows:
        return ""
    all_rows = pd.concat(rows, ignore_index=True)
    out = []
    for (gpu, dtype), g in all_rows.groupby(["gpu", "dtype"], sort=False):
        lines = [f"**Best kernel per workload** — {gpu}, {dtype}, strict (TF32 off); speedup = torch tuned / best",
                 "", "| workload | best course kernel (chapter) | ms | torch default | torch tuned | speedup | "
                 "fraction of roofline floor |", "|---|---|---|---|---|---|---|"]
        for wl, w in g.groupby("workload", sort=False):
            ours = w[~w["impl"].str.startswith("torch") & ~w["impl"].isin(PARTIAL_STEPS)]
            if not len(ours):
                continue
            b = ours.loc[ours["ms"].idxmin()]
            t_def = w.loc[w["impl"] == "torch default", "ms"].min()
            t_tun = w.loc[w["impl"] == "torch tuned", "ms"].min()
            frac = b["floor_ms"] / b["ms"] if "floor_ms" in b and pd.notna(b["floor_ms"]) else float("nan")
            lines.append(f"| {wl} | {b['impl']} ({b['chapter']}) | {fmt(b['ms'])} | {fmt(t_def)} | {fmt(t_tun)} | "
                         f"{t_tun / b['ms']:.2f}× | {frac:.0%} |")
        out.append("\n".join(lines))
    return "\n\n".join(out)


def section(data_dir: Path) -> str:
    files = sorted(data_dir.glob("*.csv"))
    frames = {p.stem: pd.read_csv(p) for p in files}
    best = best_table(frames)
    parts = [best] if best else []
    for path in files:
        df = frames[path.stem]
        if not len(df):
            continue
        parts.append(f"**{path.stem}** — median ms per layer; {provenance(df)} "
                     f"(`book/data/{path.name}`)\n\n{chapter_table(df)}")
    if not parts:
        return ("No GPU results are committed yet. Run `make gpu-run` on a machine with a GPU; it executes the "
                "notebooks, writes `book/data/*.csv` and refills this section.")
    return "\n\n".join(parts)


def rewrite(readme: Path, body: str) -> bool:
    text = readme.read_text()
    if BEGIN not in text or END not in text or text.index(BEGIN) > text.index(END):
        raise SystemExit(f"{readme}: no {BEGIN} … {END} section to fill")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    new = f"{head}{BEGIN}\n{body}\n{END}{tail}"
    if new != text:
        readme.write_text(new)
        return True
    return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--print", action="store_true", help="print the section instead of writing README.md")
    parser.add_argument("--readme", type=Path, default=ROOT / "README.md")
    parser.add_argument("--data", type=Path, default=ROOT / "book" / "data")
    args = parser.parse_args()
    body = section(args.data)
    if args.print:
        print(body)
        return 0
    changed = rewrite(args.readme, body)
    print(f"{args.readme.name}: results section {'updated' if changed else 'already up to date'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
