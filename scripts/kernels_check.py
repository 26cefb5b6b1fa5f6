#!/usr/bin/env python3
"""Compile every kernels/**/*.cu for each of the course's GPU architectures, warnings as errors
(what `make kernels-check` runs; needs nvcc, no GPU, no venv).

Each file is compiled to a cubin (nvcc and ptxas, so an architecture's own limits count) for every
architecture in convlab/gpu/arch.py's ARCHS that its header allows: a file whose header says
"// Requires sm_80 or newer: ..." is skipped for the older ones, and that is reported.

    python3 scripts/kernels_check.py [--nvcc PATH] [--jobs N] [FILES...]
"""
from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("convlab_arch", ROOT / "convlab" / "gpu" / "arch.py")
arch = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(arch)


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def compile_one(nvcc: str, path: Path, target: str) -> str | None:
    """None when nvcc compiles path for target without a warning, else its output."""
    # an "a" target as the -gencode pair: the -arch=sm_90a shorthand also runs a plain sm_90 pass
    flag = f"-gencode=arch=compute_{target[3:]},code={target}" if target.endswith("a") else f"-arch={target}"
    cmd = [nvcc, "-cubin", flag, "-std=c++17", "-Werror", "all-warnings",
           "-I", str(ROOT / "kernels"), "-o", "/dev/null", str(path)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode == 0 and not done.stderr.strip():
        return None
    return (done.stdout + done.stderr).strip() or f"nvcc exited with {done.returncode}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nvcc", default="nvcc")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("files", nargs="*", type=Path)
    args = parser.parse_args()
    files = [f.resolve() for f in args.files] or sorted((ROOT / "kernels").rglob("*.cu"))
    jobs, skipped = [], []
    for path in files:
        text = path.read_text()
        need, why = arch.required(text)
        built = arch.targets(text)
        jobs += [(path, target) for target in built]
        skipped += [f"{shown(path)} on {target} (it requires {arch.sm(need)}{arch.required_suffix(text)}: {why})"
                    for target in arch.ARCHS if target not in built]
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(lambda job: compile_one(args.nvcc, *job), jobs))
    failed = [(path, target, out) for (path, target), out in zip(jobs, results) if out]
    for path, target, out in failed:
        print(f"FAILED {shown(path)} for {target}:\n{out}\n")
    for line in skipped:
        print(f"skipped {line}")
    print(f"kernels-check: {len(files)} kernel files, {len(jobs) - len(failed)} of {len(jobs)} compilations "
          f"for {', '.join(arch.ARCHS)} without a warning; {len(skipped)} skipped by their headers")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
