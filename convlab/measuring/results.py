"""Benchmark results as rows, written to and read from book/data/<chapter>.csv.

A row says what was timed, how fast, and on what: the GPU (or, for chapter 1, the CPU), the
torch and cuDNN versions, the TF32 setting and the date. book/data holds real GPU-run results
only: save() writes on the GPU backend (make gpu-run) and refuses on the emulator, whose wall
times say nothing about a GPU.
"""
from __future__ import annotations

import datetime as _dt
import functools
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..gpu._paths import repo_root
from ..gpu.runtime import device
from . import roofline, workloads
from .tables import Table

COLUMNS = [
    "workload", "shape", "pass", "dtype", "impl", "key", "kind", "layout",
    "ms", "p25", "p75", "caller_ms", "wall_ms",
    "gflops", "gbs", "floor_ms", "floor_frac", "torch_kernels",
    "gpu", "torch", "cudnn", "tf32", "date",
]
# ms, p25, p75: GPU time (CUDA events, the GPU held busy while Python queues the work, L2 flushed);
# caller_ms: one call as a caller sees it on an idle GPU (events, nothing held: Python's work counts);
# wall_ms: per call in a loop of back-to-back calls (wall clock, synchronised at the end).
# kind: "ours", "torch" (one layout), "torch best" (the faster layout), "cpu" (chapter 1).
# impl: the label figures show; key: the identity code joins on (an Impl's key, else key_of(label)).

ELEMENT_BYTES = {"fp32": 4, "fp16": 2, "fp64": 8}
PASSES = ("forward", "dX", "dW", "forward+dX+dW")


@dataclass(frozen=True)
class Measured:
    """The times of one implementation on one layer (what measure.time_impl returns)."""

    ms: float
    p25: float
    p75: float
    caller_ms: float = math.nan
    wall_ms: float = math.nan


def cost(workload, pass_: str = "forward", dtype: str = "fp32") -> tuple:
    """(FLOPs, least bytes) of one pass over a layer: each input read once, each output written once.
    dX reads dy and w and writes dx; dW reads x and dy and writes dw; each does the forward's FLOPs."""
    e = ELEMENT_BYTES[dtype]
    x, w = math.prod(workload.x_shape), math.prod(workload.w_shape)
    y = math.prod(workload.y_shape)
    flops = workload.flops
    moved = {"forward": x + w + y, "dX": y + w + x, "dW": x + y + w}
    if pass_ == "forward+dX+dW":
        return 3 * flops, e * sum(moved.values())
    if pass_ not in moved:
        raise ValueError(f"unknown pass {pass_!r}: one of {', '.join(PASSES)}")
    return flops, e * moved[pass_]


def device_label() -> str:
    return device().name


def tf32_setting() -> str:
    """How the timings here were taken: always strict fp32 (bench.strict_fp32; the figure says so)."""
    return "TF32 off"


def versions() -> dict:
    """torch and cuDNN versions, as written on figures and in book/data."""
    import torch

    cudnn = "n/a"
    if torch.backends.cudnn.is_available():
        v = torch.backends.cudnn.version()  # e.g. 91900 for 9.19.0
        if v:
            cudnn = f"{v // 10000}.{v % 10000 // 100}.{v % 100}"
    return {"torch": torch.__version__, "cudnn": cudnn}


def key_of(label: str) -> str:
    """The key of a row that is no Impl's (torch's rows, derived rows): its label in lower case,
    each run of other characters than letters and digits one '_' ("torch (NCHW)" -> "torch_nchw")."""
    return re.sub(r"[^a-z0-9]+", "_", label.lower()).strip("_")


def row(workload, impl: str, timing, *, key: str | None = None, kind: str = "ours", pass_: str = "forward",
        dtype: str = "fp32", layout: str = "nchw", roof=None, device: str | None = None, tf32: str | None = None,
        torch_kernels: str = "", **overrides) -> dict:
    """One result. impl: the label; key: the Impl's key (key_of(impl) when left out).
    workload: a convlab.measuring.workloads.Workload; timing: anything with .ms/.p25/.p75 and,
    optionally, .caller_ms/.wall_ms (Measured, cl.bench's Timing, baselines.CpuTiming); roof: a
    roofline.Roofline for the floor (GPU rows); device: what ran it (the active device by default);
    overrides: columns to set by hand (cudnn="n/a (CPU)" for CPU timings)."""
    ms = float(timing.ms)
    flops, nbytes = cost(workload, pass_, dtype)
    floor = roof.floor_ms(flops, nbytes) if roof is not None else math.nan
    out = {
        "workload": workload.name,
        "shape": workload.shape_text,
        "pass": pass_,
        "dtype": dtype,
        "impl": impl,
        "key": key or key_of(impl),
        "kind": kind,
        "layout": {"nchw": "NCHW", "channels_last": "channels_last"}.get(layout, layout),
        "ms": ms,
        "p25": float(timing.p25),
        "p75": float(timing.p75),
        "caller_ms": float(getattr(timing, "caller_ms", math.nan)),
        "wall_ms": float(getattr(timing, "wall_ms", math.nan)),
        "gflops": flops / (ms * 1e-3) / 1e9,
        "gbs": nbytes / (ms * 1e-3) / 1e9,
        "floor_ms": floor,
        # 1.0 = at the roofline floor; 0.1 = ten times slower than the floor
        "floor_frac": floor / ms if roof is not None else math.nan,
        "torch_kernels": torch_kernels,
        "gpu": device if device is not None else device_label(),
        **versions(),
        "tf32": tf32 if tf32 is not None else tf32_setting(),
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
    return repo_root() / "book" / "data" / f"{chapter}.csv"


def may_save() -> bool:
    """True on the GPU backend, or when CONVLAB_SAVE_RESULTS=1 says so explicitly."""
    if os.environ.get("CONVLAB_SAVE_RESULTS") == "1":
        return True
    return device().backend == "cuda"


def save(df_or_rows, chapter: str, *, force: bool = False, quiet: bool = False) -> Path | None:
    """Write the results of a chapter to book/data/<chapter>.csv, on a GPU run only."""
    import pandas as pd

    df = df_or_rows if isinstance(df_or_rows, pd.DataFrame) else frame(df_or_rows)
    target = data_path(chapter)
    if not (force or may_save()):
        if quiet:
            return None
        print(f"not saved to book/data/{chapter}.csv: this is not a GPU run (book/data keeps GPU-run results only)")
        return None
    target.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(target, index=False, float_format="%.6g")
    return target


def save_benchmark(df, name: str, folder=None, say: bool = True) -> Path | None:
    """Write a benchmark script's rows to <folder>/<name>_<GPU>.csv (folder: benchmarks/results by
    default), on a GPU run only, as save(), and say so (say=True) by the file's name: a report names
    no path of the machine. The path written, or None."""
    return write_benchmark(df, name, folder, say) if may_save() else None


def write_benchmark(df, name: str, folder=None, say: bool = True) -> Path:
    """save_benchmark's file, written wherever the script runs: a GPU script's --emu-smoke run writes
    the CSV its page reads into the folder it is given."""
    folder = Path(folder) if folder else repo_root() / "benchmarks" / "results"
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{name}_{str(df['gpu'].iloc[0]).replace(' ', '_')}.csv"
    df.to_csv(target, index=False, float_format="%.6g")
    if say:
        print(f"# wrote {target.name}")
    return target


def load(chapter: str, *, quiet: bool = False):
    """The committed results of a chapter as a DataFrame, or None when there are none of this
    schema: no file, no rows, or a file written by an older harness (its columns are not COLUMNS;
    one line says so, unless quiet). Extra columns (a sweep's tunables) are kept."""
    import pandas as pd

    target = data_path(chapter)
    if not target.is_file():
        return None
    df = pd.read_csv(target, keep_default_na=False, na_values=[""])   # "n/a" (cuDNN on a CPU) stays text
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        if not quiet:
            print(f"book/data/{chapter}.csv was written by an older harness (it has no {', '.join(missing)} "
                  f"column): no results of the current harness are committed yet; `make gpu-run` rewrites it")
        return None
    return df if len(df) else None


def refloor_fp16(df, roof16=None, tolerance: float = 0.05):
    """df with the roofline floor of its fp16 convolution rows recomputed from their shapes: half
    bytes at roof16's bandwidth, FLOPs at its fp16 tensor-core rate (roofline.REFERENCE_H200_FP16
    by default). Only rows whose floor is more than `tolerance` above that one change: those were
    given the fp32 GEMM rate; rows already on an fp16 floor (measured live) keep it. Conversion rows
    (no FLOPs) keep their copy floor. Returns (new frame, number of rows changed)."""
    roof16 = roof16 or roofline.REFERENCE_H200_FP16
    out = df.copy()
    changed = 0
    for i, r in out.iterrows():
        if r["dtype"] != "fp16" or not r["gflops"] > 0 or not math.isfinite(r["floor_ms"]):
            continue
        wl = workloads.get(r["workload"])
        if wl.shape_text != r["shape"]:
            raise ValueError(f"row {i}: {r['workload']} is {r['shape']!r} here but {wl.shape_text!r} in "
                             f"convlab.measuring.workloads: its floor cannot be recomputed from the shape")
        floor = roof16.floor_ms(*cost(wl, r["pass"], "fp16"))
        if r["floor_ms"] > (1 + tolerance) * floor:
            out.loc[i, "floor_ms"] = floor
            out.loc[i, "floor_frac"] = floor / r["ms"]
            changed += 1
    return out, changed


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


@functools.cache
def _report_frame():
    """The DataFrame class results.report returns (built on first use: pandas loads lazily)."""
    import pandas as pd

    class ReportFrame(pd.DataFrame):
        @property
        def _constructor(self):   # a slice or computation on it is a plain DataFrame again
            return pd.DataFrame

        def _repr_html_(self):
            return Table(pd.DataFrame(self))._repr_html_()

        def __repr__(self):
            return repr(Table(pd.DataFrame(self)))

    return ReportFrame


def report(df):
    """The numbers behind a figure: GPU time (CPU wall time for chapter 1's rows), the time a caller
    sees, GFLOP/s, GB/s and % of the roofline floor per row. A DataFrame indexed by (workload,
    impl); on the page both are ordinary columns and every number has three significant figures."""
    cols = ["workload", "impl", "ms", "caller_ms", "wall_ms", "gflops", "gbs", "floor_frac"]
    out = df[[c for c in cols if c in df]].copy()
    floor = out.pop("floor_frac")
    if floor.notna().any():  # CPU rows have no roofline floor
        out["floor %"] = 100 * floor
    for c in ("ms", "caller_ms", "wall_ms"):
        if c in out and not out[c].notna().any():
            out.pop(c)
    cpu = "kind" in df and (df["kind"] == "cpu").all()      # chapter 1: wall time on the CPU
    names = {"ms": "CPU ms (wall)" if cpu else "GPU ms", "caller_ms": "caller ms", "wall_ms": "ms per call in a loop",
             "gflops": "GFLOP/s", "gbs": "GB/s"}
    return _report_frame()(out.rename(columns=names).set_index(["workload", "impl"]))


def speedup(df, impl: str, over: str = "torch best") -> "pandas.Series":  # noqa: F821
    """GPU time of `over` divided by that of `impl`, per workload: above 1, `impl` is faster."""
    ms = summary(df)
    return (ms[over] / ms[impl]).dropna()


_COMPARISON = re.compile(r"^# (?P<what>.+?): (?P<ratio>[\d.]+)x torch's[^(]*\((?P<ours>[\d.]+) against "
                         r"(?P<torch>[\d.]+) us")


def launch_comparisons(path) -> "pandas.DataFrame":  # noqa: F821
    """The comparisons benchmarks/launch_overhead.py writes under its table ("# <what>: <r>x
    torch's ... (<ours> against <torch> us ..."): columns what, ratio, ours_us, torch_us."""
    import pandas as pd

    rows = [dict(what=m["what"], ratio=float(m["ratio"]), ours_us=float(m["ours"]), torch_us=float(m["torch"]))
            for m in map(_COMPARISON.match, Path(path).read_text().splitlines()) if m]
    return pd.DataFrame(rows, columns=["what", "ratio", "ours_us", "torch_us"])
