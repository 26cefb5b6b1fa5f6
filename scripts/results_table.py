#!/usr/bin/env python3
"""Fill README.md's results section from book/data/*.csv (the committed GPU-run results).

Rewrites only the lines between <!-- results:begin --> and <!-- results:end -->: the best kernel
per workload against torch best, then one table per chapter and pass, GPU ms per workload (rows)
and implementation (columns), with where and when it was measured.

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
    """GPU ms per workload (rows) and implementation (columns), our kernels first, then torch."""
    order = {"ours": 0, "cpu": 0, "torch": 1, "torch best": 2}
    impls = sorted(dict.fromkeys(df["impl"]), key=lambda i: order.get(df.loc[df["impl"] == i, "kind"].iloc[0], 0))
    workloads = list(dict.fromkeys(df["workload"]))
    has_floor = df["floor_ms"].notna().any()
    header = ["workload", "shape", *impls] + (["roofline floor"] if has_floor else [])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name in workloads:
        sub = df[df["workload"] == name]
        cells = [name, str(sub["shape"].iloc[0])]
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


# Rows that time one step of a convolution, not a whole one (chapter 4's unroll, chapter 6's
# conversions), or a float32 path that computes in half (chapter 6): never "the best kernel" of a
# strict fp32 or of an fp16 table.
PARTIAL_STEPS = {"unroll only (no GEMM)"}
NOT_A_WHOLE_LAYER = ("conversion", "ours, float32 in and out")


def whole_layer(impl: str) -> bool:
    return impl not in PARTIAL_STEPS and not impl.startswith(NOT_A_WHOLE_LAYER)


def best_table(frames: dict) -> str:
    """The fastest course kernel per workload and dtype over all chapters' forward rows, beside
    torch best, per GPU (timings are compared only within one GPU's runs)."""
    rows = [df.assign(chapter=stem) for stem, df in frames.items() if stem != "torch"]
    if not rows:
        return ""
    all_rows = pd.concat(rows, ignore_index=True)
    all_rows = all_rows[(all_rows["pass"] == "forward") & all_rows["kind"].isin(["ours", "torch best"])]
    out = []
    for (gpu, dtype), g in all_rows.groupby(["gpu", "dtype"], sort=False):
        lines = [f"**Best kernel per workload** — {gpu}, {dtype}, TF32 off; speedup = torch best / ours (GPU time)",
                 "", "| workload | best course kernel (chapter) | GPU ms | caller ms | torch best ms (layout) | "
                 "speedup | fraction of roofline floor |", "|---|---|---|---|---|---|---|"]
        for wl, w in g.groupby("workload", sort=False):
            ours = w[(w["kind"] == "ours") & w["impl"].map(whole_layer)]
            torch_best = w[w["kind"] == "torch best"]
            if not len(ours) or not len(torch_best):
                continue
            b = ours.loc[ours["ms"].idxmin()]
            t = torch_best.iloc[0]
            lines.append(f"| {wl} | {b['impl']} ({b['chapter']}) | {fmt(b['ms'])} | {fmt(b['caller_ms'])} | "
                         f"{fmt(t['ms'])} ({t['layout']}) | {t['ms'] / b['ms']:.2f}× | {b['floor_frac']:.0%} |")
        out.append("\n".join(lines))
    return "\n\n".join(out)


def section(data_dir: Path) -> str:
    files = [p for p in sorted(data_dir.glob("*.csv")) if p.stem != "torch"]
    frames = {p.stem: pd.read_csv(p) for p in files}
    frames = {k: v for k, v in frames.items() if "kind" in v.columns}   # results of the current harness only
    best = best_table(frames)
    parts = [best] if best else []
    for path in files:
        df = frames.get(path.stem)
        if df is None or not len(df):
            continue
        for (pass_, dtype), part in df.groupby(["pass", "dtype"], sort=False):
            title = path.stem + ("" if pass_ == "forward" else f", {pass_}")
            parts.append(f"**{title}** — median GPU ms per layer; {provenance(part)} "
                         f"(`book/data/{path.name}`)\n\n{chapter_table(part)}")
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
