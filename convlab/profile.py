"""Profile cards: Nsight Compute's metrics for one call, on a GPU; the same memory counters from the
emulator, for a machine without one.

    card = cl.profile(conv, x, w, y, 2, 3, 8, 32, 32, 5, grid=g, block=b)   # a kernel and its arguments
    card = cl.profile(cl.ops.naive.conv2d_naive_z, x, w, name="ch2_naive_z") # a launcher call
    card = cl.profile_torch(torch.nn.functional.conv2d, x, w, name="ch2_torch")

On a GPU the call runs again in a subprocess under `ncu --clock-control none` (the GPU's clocks are
never changed): once to warm up (compile, load), then once between cudaProfilerStart/Stop, so only
the kernels of that one call are profiled. The card lists each kernel with ncu's metric names, so
every number can be looked up in Nsight Compute's metrics reference. With name=..., the CSV that ncu
wrote is kept in book/data/profiles/NAME.csv; where ncu is missing or may not read the counters,
one line says so and the card shows that committed result instead.

On the emulator, cl.profile runs the call in this process and counts every warp's global and
shared-memory requests, 32-byte sectors, bank conflicts (wavefronts), atomics and barriers under
the same metric names; timing, throughput and occupancy are the GPU's alone. A request is one
access in the source executed by a warp's lanes in one iteration of its loops (convlab/emu/profile.cpp). With name=..., ncu's
committed numbers stand beside the emulator's. The shared-memory instruction rows count, on the
emulator, each warp that makes the access with at least one lane; ncu counts every warp that
issues the instruction, and where nvcc turns a short `if` into a predicated instruction
(`@!P0 STS`), warps whose lanes are all predicated off issue it too (with no wavefront).
"""
from __future__ import annotations

import csv
import ctypes
import datetime as _dt
import io
import math
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from . import emu, runtime
from ._errors import ProfileUnavailable
from ._paths import path as workbook_path
from .baselines import kernel_base_name
from .tables import sig

__all__ = ["profile", "profile_torch", "committed", "ProfileCard", "KernelProfile", "ProfileUnavailable",
           "parse_ncu_csv", "count_trace", "emu_profiling", "NCU_METRICS", "TORCH_METRICS", "EMU_COUNTERS",
           "PROFILES_DIR", "STALL_MEANING", "PRECISION_FP32", "PRECISION_FP16", "PRECISION_INT", "call_precision",
           "stored_precision"]

PROFILES_DIR = "book/data/profiles"


# ---------------------------------------------------------------------------------------------
# What a card shows: (row label, ncu metric name). The names are ncu's own (Nsight Compute's
# "Metrics Reference" and `ncu --query-metrics` explain each one).

STALL_REASONS = ("barrier", "branch_resolving", "dispatch_stall", "drain", "imc_miss", "lg_throttle",
                 "long_scoreboard", "math_pipe_throttle", "membar", "mio_throttle", "misc", "no_instruction",
                 "not_selected", "selected", "short_scoreboard", "sleeping", "tex_throttle", "wait")
# What each stall reason means, in plain words: a paraphrase of the "Warp Stall Reasons" list of
# NVIDIA's Nsight Compute "Kernel Profiling Guide". A card's value per reason is the average number
# of warps stalled for it per issued instruction (smsp__average_warps_issue_stalled_*_per_issue_active).
STALL_MEANING = {
    "barrier": "waiting at a __syncthreads() barrier for the other warps of its block",
    "branch_resolving": "waiting for a branch's target to be computed, or for the warp's threads to "
                        "be regrouped after divergence",
    "dispatch_stall": "the instruction was picked, but the dispatcher could not hand it to its pipeline",
    "drain": "after EXIT, waiting for the warp's last memory stores to leave so it can end",
    "imc_miss": "waiting for a constant-memory value that missed the immediate constant cache",
    "lg_throttle": "the queue of local/global memory instructions is full: too many loads or stores in flight",
    "long_scoreboard": "waiting for data from global or local memory (or a texture) that its next "
                       "instruction needs",
    "math_pipe_throttle": "the arithmetic pipeline it needs (FMA, tensor, ...) is busy with other warps' work",
    "membar": "waiting at a memory fence for earlier memory operations to complete",
    "mio_throttle": "the queue of shared-memory and other memory-input/output instructions is full",
    "misc": "a rare reason that none of the others covers",
    "no_instruction": "its next instruction is not fetched yet (instruction cache miss or a jump)",
    "not_selected": "ready to issue, but the scheduler picked another ready warp this cycle",
    "selected": "issuing an instruction this cycle (not a stall: the cycle the warp was picked)",
    "short_scoreboard": "waiting for the result of a shared-memory access or a slow math op "
                        "(reciprocal, square root, ...)",
    "sleeping": "its threads are asleep (__nanosleep) or waiting for the rest of the warp to converge",
    "tex_throttle": "the texture/L1 unit's queue is full",
    "wait": "a fixed wait the compiler put before the next instruction, to let a dependency of "
            "known latency (most arithmetic) finish",
}
OCCUPANCY_LIMITS = ("blocks", "registers", "shared_mem", "warps", "barriers")


# ncu splits atomics into ATOM (the old value is used) and RED (it is not); the emulator cannot
# tell which one the compiler chose, so the card shows their sum.
ATOMICS = "smsp__inst_executed_op_global_atom.sum + smsp__inst_executed_op_global_red.sum"
# shared-memory atomics: every ATOMS instruction. (ncu's ..._shared_atom_dot_alu and _dot_cas are
# subsets of it, not further atomics: an H200 counted the histogram pattern's 32 ATOMS.POPC.INC in
# both _shared_atom and _dot_alu, so their sum counted each one twice.)
SHARED_ATOMICS = "smsp__inst_executed_op_shared_atom.sum"


def _stall(reason: str) -> str:
    return f"smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio"


ROWS = [
    ("duration (us)", "gpu__time_duration.sum"),
    ("DRAM throughput (% of peak)", "dram__throughput.avg.pct_of_peak_sustained_elapsed"),
    ("L2 throughput (% of peak)", "lts__throughput.avg.pct_of_peak_sustained_elapsed"),
    ("SM throughput (% of peak)", "sm__throughput.avg.pct_of_peak_sustained_elapsed"),
    ("issue slots busy (%)", "smsp__issue_active.avg.pct_of_peak_sustained_active"),
    ("tensor pipe busy (%)", "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"),
    ("achieved occupancy (%)", "sm__warps_active.avg.pct_of_peak_sustained_active"),
    ("theoretical occupancy (%)", "sm__maximum_warps_per_active_cycle_pct"),
    ("occupancy limited by", "launch__occupancy_limit_*"),
    ("registers per thread", "launch__registers_per_thread"),
    ("block size", "launch__block_size"),
    ("grid size", "launch__grid_size"),
    ("DRAM bytes read", "dram__bytes_read.sum"),
    ("DRAM bytes written", "dram__bytes_write.sum"),
    ("L1 hit rate (%)", "l1tex__t_sector_hit_rate.pct"),
    ("global load requests", "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"),
    ("global load sectors", "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"),
    ("global load sectors per request", "l1tex__average_t_sectors_per_request_pipe_lsu_mem_global_op_ld.ratio"),
    ("global store requests", "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum"),
    ("global store sectors", "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum"),
    ("global store sectors per request", "l1tex__average_t_sectors_per_request_pipe_lsu_mem_global_op_st.ratio"),
    ("shared load instructions (warp)", "smsp__inst_executed_op_shared_ld.sum"),
    ("shared load wavefronts", "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum"),
    ("shared load bank conflicts", "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"),
    ("shared store instructions (warp)", "smsp__inst_executed_op_shared_st.sum"),
    ("shared store wavefronts", "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum"),
    ("shared store bank conflicts", "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"),
    ("global atomics, ATOM + RED (warp instructions)", "smsp__inst_executed_op_global_atom.sum + smsp__inst_executed_op_global_red.sum"),
    ("shared atomics (warp instructions)", SHARED_ATOMICS),
    ("barriers (warp instructions)", "smsp__inst_executed_op_barrier.sum"),
    ("instructions executed (warp)", "smsp__inst_executed.sum"),
    ("FFMA (thread instructions)", "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum"),
    ("HFMA2 and HFMA (thread instructions)", "smsp__sass_thread_inst_executed_op_hfma_pred_on.sum"),
    ("tensor-core HMMA (warp instructions)", "smsp__inst_executed_pipe_tensor_op_hmma.sum"),
    ("top warp stalls (cycles per issue)", "smsp__average_warps_issue_stalled_*_per_issue_active.ratio"),
]

# What ncu is asked for: every plain row, the occupancy limits and the stall reasons behind the two
# summary rows, and the sector-per-request inputs.
NCU_METRICS = ([m for _, m in ROWS if "*" not in m and " + " not in m]
               + ATOMICS.split(" + ")
               + [f"launch__occupancy_limit_{k}" for k in OCCUPANCY_LIMITS]
               + [_stall(r) for r in STALL_REASONS])

# torch's own call: which kernels ran, how long, how busy they kept the GPU.
TORCH_METRICS = ["gpu__time_duration.sum", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
                 "lts__throughput.avg.pct_of_peak_sustained_elapsed", "sm__throughput.avg.pct_of_peak_sustained_elapsed",
                 "smsp__issue_active.avg.pct_of_peak_sustained_active",
                 "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
                 "sm__warps_active.avg.pct_of_peak_sustained_active", "launch__registers_per_thread",
                 "launch__block_size", "launch__grid_size", "dram__bytes_read.sum", "dram__bytes_write.sum"]

_TIME_NS = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6, "second": 1e9, "s": 1e9}
_BYTES = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12, "KB": 1e3, "MB": 1e6, "GB": 1e9}


# ---------------------------------------------------------------------------------------------
# One kernel's numbers, and the card

@dataclass
class KernelProfile:
    """One profiled kernel launch: its name as ncu printed it, and metric -> value (durations in
    ns, sizes in bytes; text where ncu gave text)."""
    name: str
    metrics: dict = field(default_factory=dict)
    grid: str = ""
    block: str = ""
    sites: list = field(default_factory=list)   # emulator: (where token, kind, counters) per access site
    trace: object = None                        # emulator, under cl.trace: the chosen blocks' accesses

    @property
    def short_name(self) -> str:
        """The name without its parameter list or template arguments' noise (`conv2d_naive_z`)."""
        n = kernel_base_name(self.name).rsplit("::", 1)[-1] or self.name
        return n if len(n) <= 72 else n[:69] + "..."

    def get(self, metric: str):
        return self.metrics.get(metric)

    def sectors_per_request(self, op: str = "ld"):
        m = self.metrics
        ratio = m.get(f"l1tex__average_t_sectors_per_request_pipe_lsu_mem_global_op_{op}.ratio")
        if isinstance(ratio, (int, float)):
            return float(ratio)
        req = m.get(f"l1tex__t_requests_pipe_lsu_mem_global_op_{op}.sum")
        sec = m.get(f"l1tex__t_sectors_pipe_lsu_mem_global_op_{op}.sum")
        if isinstance(req, (int, float)) and isinstance(sec, (int, float)) and req:
            return sec / req
        return None

    def occupancy_limiter(self):
        """Which resource caps the blocks per SM: the smallest launch__occupancy_limit_* (ties listed)."""
        lim = {k: self.metrics.get(f"launch__occupancy_limit_{k}") for k in OCCUPANCY_LIMITS}
        lim = {k: v for k, v in lim.items() if isinstance(v, (int, float))}
        if not lim:
            return None
        low = min(lim.values())
        names = [k for k, v in lim.items() if v == low]
        return f"{' and '.join(names)} ({low:g} blocks/SM)"

    def top_stalls(self, n: int = 3):
        vals = [(r, self.metrics.get(_stall(r))) for r in STALL_REASONS if r != "selected"]
        vals = sorted(((r, v) for r, v in vals if isinstance(v, (int, float)) and v > 0), key=lambda rv: -rv[1])
        if not vals:
            return None
        return ", ".join(f"{r} {v:.3g}" for r, v in vals[:n])

    def value(self, metric: str):
        """A row's value: the metric, or the derived summaries (limiter, stalls, sectors/request)."""
        if metric == "launch__occupancy_limit_*":
            return self.occupancy_limiter()
        if metric.startswith("smsp__average_warps_issue_stalled_*"):
            return self.top_stalls()
        if metric.startswith("l1tex__average_t_sectors_per_request_pipe_lsu_mem_global_op_"):
            return self.sectors_per_request(metric.rsplit("_op_", 1)[1].split(".")[0])
        if " + " in metric and metric not in self.metrics:
            parts = [self.metrics.get(m) for m in metric.split(" + ")]
            nums = [p for p in parts if isinstance(p, (int, float))]
            return sum(nums) if nums else None
        v = self.metrics.get(metric)
        if metric == "gpu__time_duration.sum" and isinstance(v, (int, float)):
            return v / 1e3
        return v


def card_value(v) -> str:
    """A card's value: counts exact, other numbers to three significant figures."""
    if isinstance(v, float) and math.isfinite(v) and v.is_integer() and abs(v) < 1e15:
        return f"{int(v):,}"
    return sig(v, 3)


def column_head(kernel) -> str:
    """A kernel's column head: a long (library) kernel name cut short, whole in its tooltip."""
    from html import escape

    name = str(kernel)
    shown = name if len(name) <= 24 else name[:22] + "…"
    return f'<th title="{escape(name)}">{escape(shown)}</th>'


def _html_table(df, caption: str | None, metric_of: dict) -> str:
    """A card's rows as a compact HTML table: the short label in the first column with ncu's metric
    name only as its tooltip, one value column per kernel, the caption inside the table."""
    from html import escape

    head = "".join(column_head(c) for c in df.columns)
    rows = []
    for key, values in zip(df.index, df.itertuples(index=False)):
        label = key[0] if isinstance(key, tuple) else key
        metric = metric_of.get(label, "")
        cells = "".join(f"<td>{escape(card_value(v))}</td>" for v in values)
        rows.append(f'<tr><th title="{escape(metric)}">{escape(label)}</th>{cells}</tr>')
    cap = f"<caption>{escape(caption)}</caption>" if caption else ""
    return (f'<div class="table-wrap"><table class="convlab-card">{cap}<thead><tr><th></th>{head}</tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table></div>")


class ProfileCard:
    """A few metrics per kernel of one call, with ncu's names. `card.table()` is a DataFrame (rows:
    what and the ncu metric; one column per kernel); `card[metric]` the first kernel's value;
    `card.kernels` the KernelProfile list. Shown as a table in a notebook."""

    def __init__(self, kernels: list, source: str, reference: "ProfileCard | None" = None, rows=None,
                 precision: str = ""):
        self.kernels = list(kernels)
        self.source = source          # where the numbers come from: ncu on which GPU, or the emulator
        self.precision = precision    # what the call ran in, e.g. PRECISION_FP32 ("" where unknown)
        self.reference = reference    # ncu's committed card beside an emulator card
        self.rows = rows or ROWS

    def __getitem__(self, metric: str):
        if not self.kernels:
            raise KeyError(f"{metric}: the call launched no kernel")
        return self.kernels[0].value(metric)

    def __len__(self):
        return len(self.kernels)

    @property
    def ncu(self) -> "ProfileCard | None":
        """ncu's numbers: this card when ncu made it, the committed card beside an emulator card,
        else None (an emulator card with nothing committed under its name)."""
        return self.reference if self.source.startswith("emulator") else self

    def kernel(self, name: str) -> KernelProfile:
        """The first kernel whose name contains `name`."""
        for k in self.kernels:
            if name in k.name:
                return k
        have = ", ".join(k.short_name for k in self.kernels) or "none"
        raise KeyError(f"no kernel named like {name!r} in this card (it has: {have})")

    def lines(self, kernel: int | str = 0):
        """Emulator cards: the counts per source line of one kernel (its index or part of its name)."""
        k = self.kernel(kernel) if isinstance(kernel, str) else self.kernels[kernel]
        if not k.sites:
            raise ProfileUnavailable("counts per source line come from the emulator; this card is ncu's "
                                     "(open its report in Nsight Compute's Source page for lines on a GPU)")
        return site_table(k)

    def table(self):
        import pandas as pd

        cols, names = {}, []
        for i, k in enumerate(self.kernels):
            label = k.short_name
            if label in names:
                label = f"{label} #{i + 1}"
            names.append(label)
            cols[label] = [k.value(m) for _, m in self.rows]
        if self.reference is not None:
            for i, k in enumerate(self.reference.kernels):
                label = f"{k.short_name} (ncu)"
                if label in cols:
                    label = f"{k.short_name} #{i + 1} (ncu)"
                cols[label] = [k.value(m) for _, m in self.rows]
        # a row only where some kernel has a value (the emulator has no timing, say)
        keep = [r for r in range(len(self.rows)) if any(c[r] is not None for c in cols.values())]
        index = pd.MultiIndex.from_tuples([self.rows[r] for r in keep], names=["what", "ncu metric"])
        return pd.DataFrame({name: [c[r] for r in keep] for name, c in cols.items()}, index=index, dtype=object)

    def _shown(self):
        df = self.table()
        return df.apply(lambda col: col.map(card_value)) if len(df.columns) else df

    def caption(self) -> str:
        """Where the numbers come from (ncu on which GPU, or the emulator) and their precision."""
        s = self.source
        if self.precision:
            s += f"; precision: {self.precision}"
        if self.reference is not None:
            s += f"; (ncu) columns: {self.reference.caption()}"
        return s

    def __repr__(self):
        return f"{self.caption()}\n{self._shown().to_string()}"

    def _repr_html_(self):
        return _html_table(self.table(), self.caption(), dict(self.rows))

    def select(self, rows) -> "pandas.DataFrame":  # noqa: F821
        """table() restricted to `rows` (labels or ncu metric names), in that order; a row no kernel
        has a value for shows as None."""
        df = self.table()
        by_label = dict(zip(df.index.get_level_values(0), df.index))
        keys = []
        for r in rows:
            label = next((lab for lab, m in self.rows if r in (lab, m)), None)
            if label is None:
                raise KeyError(f"{r!r} is not a row of this card (rows: {', '.join(lab for lab, _ in self.rows)})")
            keys.append(by_label.get(label, (label, dict(self.rows)[label])))
        return df.reindex(keys)

    def show(self, rows, caption: str | None = None):
        """A small HTML table of just `rows` (labels or ncu metric names), captioned with where the
        numbers come from (or `caption`)."""
        from IPython.display import HTML

        return HTML(_html_table(self.select(rows), caption or self.caption(), dict(self.rows)))


# ---------------------------------------------------------------------------------------------
# ncu's CSV

def _number(text: str):
    t = text.strip()
    if t in ("", "n/a", "N/A"):
        return None
    try:
        return float(t.replace(",", ""))
    except ValueError:
        return t


def _normalise(metric: str, value, unit: str):
    if not isinstance(value, float):
        return value
    if unit in _TIME_NS:
        return value * _TIME_NS[unit]
    if unit in _BYTES and metric.startswith(("dram__bytes", "lts__t_bytes", "l1tex__t_bytes")):
        return value * _BYTES[unit]
    return value


def parse_ncu_csv(text: str) -> list:
    """ncu's --csv output, either `--page raw` (one row per kernel, one column per metric, a row of
    units under the header) or the default details page (one row per metric). Lines that are not
    CSV (ncu's ==PROF== lines, the program's output, '#' comments) are skipped. Numbers lose their
    thousands separators; durations become ns and byte counts bytes."""
    start = text.find('"ID",')
    if start < 0:
        raise ValueError("no ncu CSV in this text (no header row starting with \"ID\"); ncu said:\n"
                         + "\n".join(text.splitlines()[:20]))
    rows = list(csv.reader(io.StringIO(text[start:])))
    head = rows[0]
    col = {h: i for i, h in enumerate(head)}
    if "Kernel Name" not in col:
        raise ValueError(f"an ncu CSV header without a \"Kernel Name\" column: {head[:8]}")
    # ncu's own lines (==PROF==, ==WARNING==) can land between rows: they are not rows of the table
    # (details rows without a rule stop after Metric Value)
    need = col["Metric Value"] + 1 if "Metric Value" in col else len(head)
    rows = [head] + [r for r in rows[1:] if len(r) >= need]
    kernels: dict = {}
    order = []

    def kernel_of(r):
        key = r[col["ID"]] if "ID" in col else str(len(order))
        if key not in kernels:
            kernels[key] = KernelProfile(r[col["Kernel Name"]], {}, r[col["Grid Size"]] if "Grid Size" in col else "",
                                         r[col["Block Size"]] if "Block Size" in col else "")
            order.append(key)
        return kernels[key]

    if "Metric Name" in col:            # details page: one metric per row
        for r in rows[1:]:
            if not r[col["Metric Name"]]:
                continue
            m = r[col["Metric Name"]]
            kernel_of(r).metrics[m] = _normalise(m, _number(r[col["Metric Value"]]), r[col["Metric Unit"]])
        return [kernels[k] for k in order]
    units = None
    for r in rows[1:]:
        if units is None and not r[col["Kernel Name"]]:
            units = r                   # the raw page's row of units
            continue
        k = kernel_of(r)
        for i, h in enumerate(head):
            if "__" not in h:           # ID, Kernel Name, NVTX ranges, ...: not metrics
                continue
            k.metrics[h] = _normalise(h, _number(r[i]), units[i] if units else "")
    return [kernels[k] for k in order]


# ---------------------------------------------------------------------------------------------
# Where ncu is, and what it says when it cannot work

def ncu_path() -> str | None:
    """The ncu executable: $NCU, then PATH, then the CUDA toolkit's usual places."""
    env = os.environ.get("NCU")
    if env:
        return env if Path(env).exists() else None
    found = shutil.which("ncu")
    if found:
        return found
    roots = [os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"]
    for root in filter(None, roots):
        p = Path(root) / "bin" / "ncu"
        if p.exists():
            return str(p)
    for p in sorted(Path("/opt/nvidia").glob("nsight-compute/*/ncu"), reverse=True):
        return str(p)
    return None


_REFUSALS = [
    ("ERR_NVGPUCTRPERM", "this user may not read the GPU's performance counters (ERR_NVGPUCTRPERM; an "
                         "administrator can allow it, see NVIDIA's ERR_NVGPUCTRPERM page)"),
    ("LibraryNotLoaded", "ncu could not load its profiling library on this machine (LibraryNotLoaded)"),
    ("Failed to initialize the profiler", "ncu could not start its profiler on this machine"),
    ("Profiling is not supported on this device", "ncu does not support this GPU"),
    ("No kernels were profiled", "ncu saw no kernel in the call"),
]


def refusal(output: str) -> str | None:
    """The reason, in words, when ncu's output says it could not profile; None when it did."""
    for needle, words in _REFUSALS:
        if needle in output:
            return words
    errors = [ln for ln in output.splitlines() if ln.startswith("==ERROR==")]
    if errors:
        return "ncu failed: " + errors[0][len("==ERROR=="):].strip()
    return None


_UNKNOWN_METRIC = re.compile(r"==ERROR==.*?[Mm]etric[^\n]*?\b([a-z0-9]+__[A-Za-z0-9_.]+)")


def unknown_metric(output: str) -> str | None:
    """The metric name ncu rejected (its name differs on some GPUs and ncu versions), if any."""
    m = _UNKNOWN_METRIC.search(output)
    return m.group(1).rstrip(".") if m else None


# ---------------------------------------------------------------------------------------------
# The call, written down so a subprocess can repeat it

def _to_cpu(v):
    import torch
    if isinstance(v, torch.Tensor):
        return ("__tensor__", v.detach().cpu(), v.is_cuda)
    if isinstance(v, (list, tuple)):
        return type(v)(_to_cpu(a) for a in v)
    if isinstance(v, dict):
        return {k: _to_cpu(a) for k, a in v.items()}
    return v


def _job(fn, args, kwargs) -> dict:
    """What the worker needs to run fn(*args, **kwargs) again: a Kernel by its module's source, or
    any function Python can pickle by name (a launcher, an Impl, torch's own functions)."""
    import torch
    args, kwargs = _to_cpu(list(args)), _to_cpu(dict(kwargs))
    if isinstance(fn, runtime.Kernel):
        m = fn.module
        return {"kind": "kernel", "text": m.src.text, "path": str(m.path), "defines": m.defines,
                "options": m.options,
                "constants": {k: v if isinstance(v, bytes) else v.detach().cpu().numpy().tobytes()
                              for k, v in m.constants_set.items()},
                "kernel": fn.name, "args": args, "kwargs": kwargs, "cudnn_benchmark": torch.backends.cudnn.benchmark}
    target = getattr(fn, "launcher", fn)    # an Impl: its launcher (its config is resolved inside)
    try:
        pickle.dumps(target)
    except Exception as e:  # noqa: BLE001 - any pickling failure means the same thing here
        raise ProfileUnavailable(
            f"cl.profile runs the call again in a separate process under ncu, so it needs a kernel or a "
            f"function defined at the top of a module (a launcher such as cl.ops.naive.conv2d_naive_z, or "
            f"torch.nn.functional.conv2d), not {fn!r} ({e}). Pass the function and its arguments: "
            f"cl.profile(f, x, w, stride=1) instead of a lambda.") from None
    return {"kind": "call", "fn": target, "args": args, "kwargs": kwargs,
            "cudnn_benchmark": torch.backends.cudnn.benchmark}


def _device_name() -> str:
    try:
        import torch
        return torch.cuda.get_device_name()
    except Exception:  # noqa: BLE001
        return "GPU"


def run_ncu(job: dict, metrics, *, timeout: float = 600.0) -> tuple[str, str]:
    """Run the job under ncu. Returns (csv_text, "") or ("", why it could not)."""
    ncu = ncu_path()
    if ncu is None:
        return "", "ncu (Nsight Compute) is not installed here (not on PATH, nor in /usr/local/cuda/bin; set NCU=/path/to/ncu)"
    metrics = list(metrics)
    with tempfile.TemporaryDirectory() as tmp:
        jf = Path(tmp) / "job.pt"
        import torch
        torch.save(job, jf)
        for _ in range(len(metrics)):
            cmd = [ncu, "--clock-control", "none", "--profile-from-start", "off", "--csv", "--page", "raw",
                   "--metrics", ",".join(metrics), sys.executable, "-m", "convlab._profile_worker", str(jf)]
            # the worker imports this convlab, wherever the notebook found it
            here = str(Path(__file__).resolve().parent.parent)
            env = dict(os.environ, CONVLAB_BACKEND="cuda",
                       PYTHONPATH=os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])))
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
            except subprocess.TimeoutExpired:
                return "", f"ncu did not finish within {timeout:.0f} s"
            out = (r.stdout or "") + "\n" + (r.stderr or "")
            bad = unknown_metric(out)
            if bad and bad in metrics:
                metrics.remove(bad)      # this GPU or ncu version names it differently: leave it out
                continue
            if '"Kernel Name"' in out and r.returncode == 0:
                return r.stdout, ""
            lines = [ln for ln in out.strip().splitlines() if ln.strip()]
            if "Traceback (most recent call last)" in out:
                return "", f"the call failed when it was repeated under ncu ({lines[-1].strip()})"
            why = refusal(out)
            if why is None:
                why = f"ncu exited with status {r.returncode} and no result ({lines[-1].strip() if lines else 'no output'})"
            return "", why
    return "", "ncu rejected every metric asked for"


# ---------------------------------------------------------------------------------------------
# Committed results

def _profiles_dir() -> Path:
    return workbook_path(PROFILES_DIR)


# What a card's call ran in, written as a "# precision: ..." line of its stored CSV. The worker
# turns TF32 off, so fp32 inputs run in strict fp32 (TF32 never touches our own kernels' FFMAs).
PRECISION_FP32 = "fp32 strict (TF32 off)"
PRECISION_FP16 = "fp16"
PRECISION_INT = "integers only (no floating point)"
_PRECISION_TAG = "# precision:"


def call_precision(args, kwargs) -> str:
    """The precision a call runs in, from its floating-point tensors: fp16 when any is half."""
    import torch
    dtypes = {v.dtype for v in [*args, *kwargs.values()] if isinstance(v, torch.Tensor) and v.is_floating_point()}
    if not dtypes:
        return PRECISION_INT
    return PRECISION_FP16 if dtypes & {torch.float16, torch.bfloat16} else PRECISION_FP32


def stored_precision(text: str) -> str:
    """The precision a stored card's "# precision: ..." line names, or "" when it names none."""
    for ln in text.splitlines():
        if not ln.startswith("#"):
            break
        if ln.startswith(_PRECISION_TAG):
            return ln[len(_PRECISION_TAG):].strip()
    return ""


def committed(name: str) -> "ProfileCard | None":
    """The card a GPU run stored as book/data/profiles/NAME.csv, or None when there is none."""
    p = _profiles_dir() / f"{name}.csv"
    if not p.exists():
        return None
    text = p.read_text()
    first = text.splitlines()[0] if text else ""
    source = first[1:].strip() if first.startswith("#") else f"ncu, committed in {PROFILES_DIR}/{name}.csv"
    return ProfileCard(parse_ncu_csv(text), source, precision=stored_precision(text))


def _store(name: str, csv_text: str, what: str, precision: str) -> str:
    d = _profiles_dir()
    d.mkdir(parents=True, exist_ok=True)
    day = _dt.date.today().isoformat()
    source = f"ncu on {_device_name()}, {day}: {what}"
    body = "\n".join(ln for ln in csv_text.splitlines() if ln.startswith('"'))
    (d / f"{name}.csv").write_text(f"# {source}\n{_PRECISION_TAG} {precision}\n{body}\n")
    return source


def _describe(fn, args) -> str:
    if isinstance(fn, runtime.Kernel):
        return f"{fn.module.path.name}:{fn.name}"
    name = getattr(fn, "name", None) or getattr(fn, "__qualname__", None) or repr(fn)
    shapes = ", ".join("x".join(str(s) for s in a.shape) for a in args if hasattr(a, "shape"))
    return f"{name}({shapes})"


def _fallback(name, why: str) -> ProfileCard:
    card = committed(name) if name else None
    if card is None:
        where = (f"no committed result {PROFILES_DIR}/{name}.csv either" if name else
                 "pass name=... to fall back to a result a GPU run committed")
        raise ProfileUnavailable(f"no profile here: {why}; {where}.")
    print(f"cl.profile: {why}; showing the committed result ({card.source}).")
    return card


# ---------------------------------------------------------------------------------------------
# The entry points

def profile(fn, *args, name: str | None = None, metrics=None, **kwargs) -> ProfileCard:
    """Profile one call: fn(*args, **kwargs), where fn is a Kernel (its launch keywords grid=,
    block=, shared= among kwargs) or a launcher. On a GPU: ncu's metrics for every kernel the call
    launches, measured in a subprocess (the tensors here are left as they are), stored as
    book/data/profiles/NAME.csv when name is given. On the emulator: the call runs here and its
    memory counters are taken, with ncu's committed numbers beside them when name is given."""
    if runtime.backend() == "emu":
        # counting makes a launch several times slower: give it ten times the usual time limit
        limit = runtime.default_timeout()
        runtime.set_timeout(10 * limit)
        try:
            with emu_profiling() as launches:
                fn(*args, **kwargs)
        finally:
            runtime.set_timeout(limit)
        ref = committed(name) if name else None
        return ProfileCard(launches, "emulator counters (memory requests, sectors, bank conflicts; no timing)",
                           reference=ref)
    csv_text, why = run_ncu(_job(fn, args, kwargs), metrics or NCU_METRICS)
    if why:
        return _fallback(name, why)
    what, precision = _describe(fn, args), call_precision(args, kwargs)
    source = _store(name, csv_text, what, precision) if name else f"ncu on {_device_name()}: {what}"
    return ProfileCard(parse_ncu_csv(csv_text), source, precision=precision)


def profile_torch(fn, *args, name: str | None = None, **kwargs) -> ProfileCard:
    """torch's own call under ncu, e.g. profile_torch(torch.nn.functional.conv2d, x, w, padding=1):
    which cuDNN or cuBLAS kernels ran, how long each took and how busy it kept the GPU. Without a
    GPU, the result a GPU run committed under name."""
    if runtime.backend() == "emu":
        return _fallback(name, "no GPU here, so torch runs its CPU code and has no cuDNN kernels to profile")
    csv_text, why = run_ncu(_job(fn, args, kwargs), TORCH_METRICS)
    if why:
        return _fallback(name, why)
    what, precision = _describe(fn, args), call_precision(args, kwargs)
    source = _store(name, csv_text, what, precision) if name else f"ncu on {_device_name()}: {what}"
    return ProfileCard(parse_ncu_csv(csv_text), source, rows=[r for r in ROWS if r[1] in TORCH_METRICS], precision=precision)


# ---------------------------------------------------------------------------------------------
# The emulator's counters (convlab/emu/profile.cpp), in the order of its enum clprof_counter

#: The emulator's own counters of __constant__ reads (ncu has none per request): a warp's requests,
#: and the distinct 4-byte addresses they read (the constant cache serves them one after another).
EMU_CONSTANT_REQUESTS = "emu__constant_ld_requests.sum"
EMU_CONSTANT_ADDRESSES = "emu__constant_ld_addresses.sum"

EMU_COUNTERS = ("l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum", "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
                "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum", "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum",
                "smsp__inst_executed_op_shared_ld.sum", "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
                "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum", "smsp__inst_executed_op_shared_st.sum",
                "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum",
                "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum", ATOMICS, SHARED_ATOMICS,
                "smsp__inst_executed_op_barrier.sum", EMU_CONSTANT_REQUESTS, EMU_CONSTANT_ADDRESSES)
KINDS = {"global_ld": 0, "global_st": 1, "shared_ld": 2, "shared_st": 3, "global_atom": 4, "shared_atom": 5,
         "constant_ld": 6}


def counters_lib(lib):
    """Declare profile.cpp's C functions (its counters and cl.trace's records) on a ctypes library
    that contains them."""
    lib.clprof_site.argtypes = [ctypes.c_ulonglong, ctypes.c_int]
    lib.clprof_site.restype = ctypes.c_int
    lib.clprof_access.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_ulonglong]
    lib.clprof_epoch.argtypes = [ctypes.c_int, ctypes.c_int]
    lib.clprof_totals.argtypes = [ctypes.POINTER(ctypes.c_longlong)]
    lib.clprof_totals.restype = ctypes.c_int
    lib.clprof_site_info.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_ulonglong), ctypes.POINTER(ctypes.c_int),
                                     ctypes.POINTER(ctypes.c_longlong)]
    lib.clprof_site_info.restype = ctypes.c_int
    lib.clprof_site_where.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    lib.clprof_site_where.restype = ctypes.c_int
    lib.clprof_trace_blocks.argtypes = [ctypes.POINTER(ctypes.c_uint), ctypes.c_int]
    lib.clprof_trace_take.argtypes = [ctypes.c_void_p, ctypes.c_longlong]
    lib.clprof_trace_take.restype = ctypes.c_longlong
    lib.clprof_trace_array.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    lib.clprof_trace_array.restype = ctypes.c_int
    return lib


def emu_totals(lib) -> dict:
    """The counters since the last clprof_reset, by ncu metric name."""
    out = (ctypes.c_longlong * len(EMU_COUNTERS))()
    lib.clprof_totals(out)
    return {name: float(out[i]) for i, name in enumerate(EMU_COUNTERS)}


_standalone = None


def count_trace(events, n_threads: int) -> dict:
    """Count an access trace as the emulator's profiler does, without running a kernel: the metric
    math on its own. events: (thread, kind, address, bytes), (thread, kind, address, bytes, site) or
    (thread, kind, address, bytes, site, loop) tuples in the order the threads made them (kind: one
    of KINDS; site: any int naming the source instruction, by default one site per kind; loop: any
    int naming the loop iteration the thread is in, by default 0, none), and "barrier" where the
    block's threads all meet a __syncthreads(). Returns ncu metric name -> count for that one block."""
    global _standalone
    import hashlib
    if _standalone is None:
        text = emu.PROFILE_SRC.read_text() + (emu.INCLUDE / "clemu_profile.h").read_text()
        key = "profile-" + hashlib.sha256(text.encode()).hexdigest()[:20]
        so = emu.compile_library(emu.PROFILE_SRC.read_text(), key, ["-I", str(emu.INCLUDE)], "emulator profiler")
        _standalone = counters_lib(ctypes.CDLL(str(so)))
    lib = _standalone
    lib.clprof_reset()
    sites = {}
    for ev in events:
        if ev == "barrier":
            lib.clprof_epoch(n_threads, 1)
            continue
        thread, kind, addr, nbytes, *rest = ev
        if kind not in KINDS:
            raise ValueError(f"kind {kind!r}: use one of {', '.join(KINDS)}")
        site, loop = (list(rest) + [None, 0][len(rest):])[:2]
        key = (-1 - KINDS[kind] if site is None else site, KINDS[kind])
        if key not in sites:
            sites[key] = lib.clprof_site(key[0] & 0xFFFFFFFFFFFFFFFF, key[1])
        lib.clprof_access(int(thread), sites[key], int(addr), int(nbytes), int(loop) & 0xFFFFFFFFFFFFFFFF)
    lib.clprof_epoch(n_threads, 0)
    return emu_totals(lib)


class EmuRecorder:
    """What emu_profiling() hands the emulator (convlab.emu.recording): it arms the runtime before
    each launch and keeps each finished launch's counters, as a KernelProfile, in `launches`."""

    blocks: tuple = ()    # blockIdx triples whose accesses to record (cl.trace's recorder sets them)

    def __init__(self):
        self.launches = []

    def arm(self, lib):
        xyz = (ctypes.c_uint * max(3 * len(self.blocks), 1))(*[int(v) for b in self.blocks for v in b])
        counters_lib(lib).clprof_trace_blocks(xyz, len(self.blocks))

    def record(self, lib, name, grid, block, src, checked):
        self.launches.append(emu_kernel_profile(lib, name, grid, block))


@contextmanager
def emu_profiling(recorder: EmuRecorder | None = None):
    """Count every emulator launch made inside: yields the list of their KernelProfiles."""
    rec = recorder or EmuRecorder()
    with emu.recording(rec):
        yield rec.launches


def emu_kernel_profile(lib, name: str, grid, block) -> KernelProfile:
    """One finished emulator launch's counters (the runtime library holds them until the next)."""
    lib = counters_lib(lib)
    metrics = emu_totals(lib)
    metrics["launch__block_size"] = float(block[0] * block[1] * block[2])
    metrics["launch__grid_size"] = float(grid[0] * grid[1] * grid[2])
    sites = []
    key, kind = ctypes.c_ulonglong(), ctypes.c_int()
    counts = (ctypes.c_longlong * len(EMU_COUNTERS))()
    buf = ctypes.create_string_buffer(2048)
    n = lib.clprof_totals((ctypes.c_longlong * len(EMU_COUNTERS))())
    for site in range(n):
        if lib.clprof_site_info(site, ctypes.byref(key), ctypes.byref(kind), counts) and any(counts):
            where = buf.value.decode() if lib.clprof_site_where(site, buf, len(buf)) else ""
            sites.append((where, kind.value, tuple(counts)))
    return KernelProfile(name, metrics, f"({grid[0]}, {grid[1]}, {grid[2]})", f"({block[0]}, {block[1]}, {block[2]})",
                         sites)


_KIND_NAMES = {0: "global load", 1: "global store", 2: "shared load", 3: "shared store", 4: "global atomic",
               5: "shared atomic"}
# per kind: (requests, sectors or wavefronts, bank conflicts) as indices into EMU_COUNTERS
_KIND_COUNTERS = {0: (0, 1, None), 1: (2, 3, None), 2: (4, 5, 6), 3: (7, 8, 9), 4: (10, None, None),
                  5: (11, None, None)}


def site_table(kernel: KernelProfile):
    """The emulator's counts per source line of one kernel: which access makes the traffic."""
    import pandas as pd

    where = emu.resolve_sites("\n".join(w or "{{site:?+0x0}}" for w, _, _ in kernel.sites)).split("\n")
    rows = {}
    for line, (_, kind, c) in zip(where, kernel.sites):
        if kind not in _KIND_COUNTERS:
            continue   # __constant__ reads: the totals have them (EMU_CONSTANT_*), the lines global and shared
        req_i, unit_i, confl_i = _KIND_COUNTERS[kind]
        r = rows.setdefault((line, _KIND_NAMES[kind]), [0, 0, 0])
        r[0] += c[req_i]
        r[1] += c[unit_i] if unit_i is not None else 0
        r[2] += c[confl_i] if confl_i is not None else 0
    out = []
    for (line, what), (req, units, confl) in rows.items():
        unit = "wavefronts" if what.startswith("shared") and "atomic" not in what else "sectors"
        per = units / req if req and "atomic" not in what else None
        out.append({"source line": line, "access": what, "requests": req,
                    f"{unit} per request": per, "bank conflicts": confl if what.startswith("shared") else None})
    df = pd.DataFrame(out)
    # sectors and wavefronts in one column each, whichever the access has
    return df.set_index(["source line", "access"]).astype(object).where(lambda d: d.notna(), None)
