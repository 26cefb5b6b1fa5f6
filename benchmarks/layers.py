#!/usr/bin/env python3
"""Every kernel of the chosen chapters on the course's layers, beside torch at its best: the book's
own harness (convlab.programs.measure), printed as a table.

    python benchmarks/layers.py                          # chapters 2-5, fp32 forward, 2D workloads
    python benchmarks/layers.py --chapters fp16 --workloads lenet_c3,resnet
    python benchmarks/layers.py --chapters conv3d
    python benchmarks/layers.py --chapters backprop      # dX and dW kernels
    CONVLAB_BACKEND=emu python benchmarks/layers.py      # emulator: checks each kernel on small twins

Each output is checked against an fp64 reference before it is timed; torch's rows (NCHW and
channels_last, each timed in a fresh process, "torch best" the faster) come from
convlab.measuring.baselines. On a GPU the rows also go to benchmarks/results/layers_<GPU>.csv.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import convlab as cl  # noqa: E402
from convlab.measuring import results, workloads  # noqa: E402
from convlab.ops import backprop, conv3d, fp16, fused, im2col, naive, tiled  # noqa: E402
from convlab.programs import measure

CHAPTERS = {"naive": naive, "tiled": tiled, "im2col": im2col, "fused": fused, "fp16": fp16, "conv3d": conv3d,
            "backprop": backprop}
DTYPE = {"fp16": "fp16"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chapters", default="naive,tiled,im2col,fused",
                        help=f"comma-separated, from: {', '.join(CHAPTERS)}")
    parser.add_argument("--workloads", default="", help="comma-separated names (default: every one a kernel takes)")
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    chosen = [c.strip() for c in args.chapters.split(",") if c.strip()]
    unknown = [c for c in chosen if c not in CHAPTERS]
    if unknown:
        parser.error(f"unknown chapters {unknown}; choose from {', '.join(CHAPTERS)}")
    names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    layers = [workloads.get(n) for n in names] if names else list(workloads.WORKLOADS.values())
    print(f"# {cl.device()}")
    frames = []
    for chapter in chosen:
        impls = CHAPTERS[chapter].IMPLEMENTATIONS
        dims3 = all(i.op == "conv3d" for i in impls)
        mine = [wl for wl in layers if (wl.D is not None) == dims3]
        if mine:
            frames.append(measure.run(impls, mine, dtype=DTYPE.get(chapter, "fp32"), reps=args.reps, desc=chapter))
    if not frames:
        print("no layer fits the chosen chapters")
        return 1
    import pandas as pd

    df = pd.concat(frames, ignore_index=True).drop_duplicates(["workload", "pass", "dtype", "impl"])
    if cl.backend() != "cuda":
        print("# emulator: every kernel above passed its check on each layer's small twin; nothing was timed")
        print(df[["workload", "pass", "impl"]].to_string(index=False))
        return 0
    print(f"# {results.provenance(df)}")
    print(results.report(df).to_string())
    results.save_benchmark(df, "layers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
