#!/usr/bin/env python3
"""Recompute the roofline floor of the fp16 convolution rows (results.refloor_fp16) in book/data/*.csv
and in the benchmarks' results measured on the reference GPU (benchmarks/results/*_NVIDIA_H200.csv).

fp16 rows timed before measure.run took the fp16 roofline carry the fp32 floor (FLOPs at the fp32
GEMM rate), which puts fast tensor-core kernels "above 100% of the floor" (tensor_core_layers had
rows at 13 times their floor). This rewrites floor_ms and floor_frac of those rows from their shapes
(half bytes, the fp16 tensor-core rate of roofline.REFERENCE_H200_FP16) and leaves every other
column and row as it is. A benchmark file of another GPU (an H100's) keeps its floors: the
reference rates are the H200's, not that GPU's.

    python scripts/refloor_fp16.py           # rewrite the files, print what changed
    python scripts/refloor_fp16.py --check   # print only; exit 1 when a file would change
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from convlab.measuring import results, roofline  # noqa: E402


def files() -> list[Path]:
    """The result files whose fp16 floors the reference fp16 roofline applies to."""
    bench = [p for p in sorted((ROOT / "benchmarks" / "results").glob("*.csv"))
             if p.stem.endswith("_" + roofline.REFERENCE_H200_FP16.gpu.replace(" ", "_"))]
    return sorted((ROOT / "book" / "data").glob("*.csv")) + bench


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 when a file would change")
    a = ap.parse_args()
    stale = 0
    for path in files():
        df = pd.read_csv(path, keep_default_na=False, na_values=[""])
        if not {"dtype", "floor_ms", "gflops", "shape"} <= set(df.columns):
            continue
        new, changed = results.refloor_fp16(df)
        if not changed:
            continue
        stale += 1
        print(f"{path.relative_to(ROOT)}: {changed} fp16 rows given the fp16 floor")
        if not a.check:
            new.to_csv(path, index=False, float_format="%.6g")
    return 1 if a.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
