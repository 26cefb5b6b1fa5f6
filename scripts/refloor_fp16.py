#!/usr/bin/env python3
"""Recompute the roofline floor of the fp16 convolution rows in book/data/*.csv (results.refloor_fp16).

fp16 rows timed through measure.run before it took the fp16 roofline carry the fp32 floor (FLOPs at
the fp32 GEMM rate), which puts fast tensor-core kernels "above 100% of the floor". This rewrites
floor_ms and floor_frac of those rows from their shapes (half bytes, the fp16 tensor-core rate of
roofline.REFERENCE_H200_FP16) and leaves every other column and row as it is.

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

from convlab import results  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 when a file would change")
    a = ap.parse_args()
    stale = 0
    for path in sorted((ROOT / "book" / "data").glob("*.csv")):
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
