"""What a profile card shows: its rows (ncu's metric names), one kernel's numbers (KernelProfile)
and the card of a call (ProfileCard), shown as a table; and the emulator's counts per source line.
cl.profile (convlab.measuring.profile) makes cards from ncu's CSV (convlab.measuring.ncu) or the
emulator's counters (convlab.measuring.emu_counters).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..gpu import emu
from ..gpu._errors import ProfileUnavailable
from .baselines import kernel_base_name
from .tables import sig

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


def stall_metric(reason: str) -> str:
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
               + [stall_metric(r) for r in STALL_REASONS])


# torch's own call: which kernels ran, how long, how busy they kept the GPU.
TORCH_METRICS = ["gpu__time_duration.sum", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
                 "lts__throughput.avg.pct_of_peak_sustained_elapsed", "sm__throughput.avg.pct_of_peak_sustained_elapsed",
                 "smsp__issue_active.avg.pct_of_peak_sustained_active",
                 "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
                 "sm__warps_active.avg.pct_of_peak_sustained_active", "launch__registers_per_thread",
                 "launch__block_size", "launch__grid_size", "dram__bytes_read.sum", "dram__bytes_write.sum"]


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
        vals = [(r, self.metrics.get(stall_metric(r))) for r in STALL_REASONS if r != "selected"]
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
