"""Benchmark results as rows, written to and read from book/data/<chapter>.csv.

A row says what was timed, how fast, and on what: the GPU (or, for chapter 1, the CPU), the
torch and cuDNN versions, the TF32 setting and the date. book/data holds real GPU-run results
only: save() writes on the GPU backend (make gpu-run) and refuses on the emulator, whose wall
times say nothing about a GPU.
"""
from __future__ import annotations

import datetime as _dt
import math
import os
from pathlib import Path

from . import book

COLUMNS = [
    "workload", "shape", "impl", "ms", "p25", "p75", "gflops", "gbs", "floor_ms", "floor_frac",
    "gpu", "torch", "cudnn", "tf32", "dtype", "date",
]


def row(workload, impl: str, timing, *, roof=None, device: str | None = None, dtype: str = "fp32",
        tf32: str | None = None, **overrides) -> dict:
    """One result. workload: a convlab.workloads.Workload; timing: anything with .ms/.p25/.p75
    (cl.bench's Timing, baselines.CpuTiming); roof: a roofline.Roofline for the floor (GPU rows);
    device: the label of what ran it (defaults to the active device's name); overrides: columns
    to set by hand (cudnn="n/a (CPU)" for CPU timings)."""
    from .baselines import tf32_setting, versions

    if device is None:
        import convlab as cl

        device = cl.device().name
    ms = float(timing.ms)
    floor = roof.floor_ms(workload.flops, workload.bytes) if roof is not None else math.nan
    out = {
        "workload": workload.name,
        "shape": workload.shape_text,
        "impl": impl,
        "ms": ms,
        "p25": float(timing.p25),
        "p75": float(timing.p75),
        "gflops": workload.flops / (ms * 1e-3) / 1e9,
        "gbs": workload.bytes / (ms * 1e-3) / 1e9,
        "floor_ms": floor,
        # 1.0 = at the roofline floor; 0.1 = ten times slower than the floor
        "floor_frac": floor / ms if roof is not None else math.nan,
        "gpu": device,
        **versions(),
        "tf32": tf32 if tf32 is not None else tf32_setting(),
        "dtype": dtype,
        "date": _dt.date.today().isoformat(),
    }
    unknown = set(overrides) - set(out)
    if unknown:
        raise KeyError(f"unknown result columns {sorted(unknown)}")
    out.update(overrides)
    return out


def frame(rows):
    import pandas as pd

    return pd.DataFrame(list(rows), columns=COLUMNS)


def data_path(chapter: str) -> Path:
    """book/data/<chapter>.csv, e.g. data_path('02_naive')."""
    return book.repo_root() / "book" / "data" / f"{chapter}.csv"


def may_save() -> bool:
    """True on the GPU backend, or when CONVLAB_SAVE_RESULTS=1 says so explicitly."""
    if os.environ.get("CONVLAB_SAVE_RESULTS") == "1":
        return True
    import convlab as cl

    return cl.device().backend == "cuda"


def save(df_or_rows, chapter: str, *, force: bool = False) -> Path | None:
    """Write the results of a chapter to book/data/<chapter>.csv, on a GPU run only."""
    import pandas as pd

    df = df_or_rows if isinstance(df_or_rows, pd.DataFrame) else frame(df_or_rows)
    target = data_path(chapter)
    if not (force or may_save()):
        print(f"not saved to book/data/{chapter}.csv: this is not a GPU run (book/data keeps GPU-run results only)")
        return None
    target.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(target, index=False, float_format="%.6g")
    print(f"saved {len(df)} rows to {target.relative_to(book.repo_root()).as_posix()}")
    return target


def load(chapter: str):
    """The committed results of a chapter as a DataFrame, or None when there are none yet."""
    import pandas as pd

    target = data_path(chapter)
    if not target.is_file():
        return None
    df = pd.read_csv(target)
    return df if len(df) else None


def summary(df):
    """ms per workload (rows) and implementation (columns), in the order they were measured."""
    table = df.pivot_table(index="workload", columns="impl", values="ms", sort=False)
    return table[list(dict.fromkeys(df["impl"]))]


def provenance(df) -> str:
    """One line: where and when these numbers were measured."""
    def one(col):
        vals = [str(v) for v in dict.fromkeys(df[col].dropna()) if str(v) not in ("", "nan")]
        return " / ".join(vals) if vals else "?"

    return (f"{one('gpu')} · {one('dtype')} · torch {one('torch')} · cuDNN {one('cudnn')} · "
            f"{one('tf32')} · measured {one('date')}")


def report(df):
    """The numbers behind a figure: ms, GFLOP/s, GB/s and % of the roofline floor per row."""
    out = df[["workload", "impl", "ms", "gflops", "gbs", "floor_frac"]].copy()
    floor = out.pop("floor_frac")
    if floor.notna().any():  # CPU rows have no roofline floor
        out["floor %"] = (100 * floor).round(1)
    out["ms"] = out["ms"].round(3)
    out["gflops"] = out["gflops"].round(1)
    out["gbs"] = out["gbs"].round(1)
    return out.rename(columns={"gflops": "GFLOP/s", "gbs": "GB/s"}).set_index(["workload", "impl"])
