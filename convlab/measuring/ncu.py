"""ncu on the command line: where it is, the call it profiles (a job a subprocess runs,
convlab.measuring._profile_worker), what it refuses and why, and its CSV read into KernelProfiles.
"""
from __future__ import annotations

import csv
import io
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ..gpu import runtime
from ..gpu._errors import ProfileUnavailable
from .cards import KernelProfile


_TIME_NS = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6, "second": 1e9, "s": 1e9}


_BYTES = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12, "KB": 1e3, "MB": 1e6, "GB": 1e9}


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


def _to_cpu(v):
    import torch
    if isinstance(v, torch.Tensor):
        return ("__tensor__", v.detach().cpu(), v.is_cuda)
    if isinstance(v, (list, tuple)):
        return type(v)(_to_cpu(a) for a in v)
    if isinstance(v, dict):
        return {k: _to_cpu(a) for k, a in v.items()}
    return v


def job(fn, args, kwargs) -> dict:
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


def device_name() -> str:
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
                   "--metrics", ",".join(metrics), sys.executable, "-m", "convlab.measuring._profile_worker", str(jf)]
            # the worker imports this convlab, wherever the notebook found it
            here = str(Path(__file__).resolve().parents[2])
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
