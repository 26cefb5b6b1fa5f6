#!/usr/bin/env python3
"""Execute notebooks in place with nbclient, each in its own folder (what `make gpu-run` runs).

Needs only nbformat, nbclient and ipykernel: no jupyter-book, no network, so it works with the
offline GPU kit (`make gpu-run PYTHON=python3`). Stops at the first notebook that fails.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per cell")
    parser.add_argument("--kernel", default="python3")
    args = parser.parse_args()
    # A kernel started with MPLBACKEND=Agg would draw figures into nothing: let it use its inline backend.
    os.environ.pop("MPLBACKEND", None)
    for path in args.notebooks:
        nb = nbformat.read(path, as_version=4)
        started = time.perf_counter()
        print(f"executing {path} ...", flush=True)
        client = NotebookClient(nb, timeout=args.timeout, kernel_name=args.kernel,
                                resources={"metadata": {"path": str(path.parent.resolve())}})
        try:
            client.execute()
        except CellExecutionError as e:
            nbformat.write(nb, path)  # keep the outputs up to the failure, to read them
            print(f"FAILED: {path}\n{e}", file=sys.stderr)
            return 1
        nbformat.write(nb, path)
        print(f"  done in {time.perf_counter() - started:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
