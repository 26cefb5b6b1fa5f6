#!/usr/bin/env python3
"""The conv3d article's 8x8x8 blocks against chapter 7's 32-wide rows: chapter 7's shared-tile kernel
(conv3d.TILED, kernels/07_conv3d/conv3d_tiled.cu) on the LeetGPU challenge with blocks of
TX x TY x TZ = 32x4x4 (the chapter's) and 8x8x8 (the article's), each checked against the fp64
reference, then timed through the book's harness (convlab.programs.measure.sweep). Beside each time, the
global load sectors per request of one call, from ncu on a GPU (cl.profile) and from the emulator's
counters with --emu-smoke. Chapter 7 glues the result (book/07_conv3d.ipynb, step 2b).

    python benchmarks/conv3d_blocks.py                 # on a GPU: benchmarks/results/conv3d_blocks_<GPU>.csv
    python benchmarks/conv3d_blocks.py --out $OUT      # the CSV into another folder
    CONVLAB_BACKEND=emu python benchmarks/conv3d_blocks.py --emu-smoke --out /tmp/x   # small twin, checks
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

NAME = "conv3d_blocks"
BLOCKS = {"32x4x4": dict(TX=32, TY=4, TZ=4), "8x8x8": dict(TX=8, TY=8, TZ=8)}


def measure(reps: int):
    import pandas as pd

    import convlab as cl
    from convlab.programs import measure as M
    from convlab.measuring import workloads
    from convlab.ops import conv3d

    wl = workloads.get("conv3d")
    df = M.sweep(conv3d.TILED, wl, list(BLOCKS.values()), reps=reps, desc="blocks")
    shape = wl if cl.backend() == "cuda" else wl.small()
    x, w = cl.randn(*shape.x_shape), cl.randn(*shape.w_shape)
    sectors = []
    for cfg in BLOCKS.values():
        card = cl.profile(conv3d.TILED.launcher, x, w, **cfg)
        k = card.kernel("conv3d_tiled")
        sectors.append(k.sectors_per_request("ld"))
    df.insert(0, "block", list(BLOCKS))
    df["sectors per load request"] = sectors
    return pd.DataFrame(df)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", type=Path, help="the folder for the CSV (default benchmarks/results)")
    ap.add_argument("--emu-smoke", action="store_true", help="on the emulator: the small twin, the code path only")
    a = ap.parse_args(argv)
    import convlab as cl
    from convlab.measuring import results

    if cl.backend() != "cuda" and not a.emu_smoke:
        print("conv3d_blocks times kernels: run it on a GPU (or --emu-smoke on the emulator)")
        return 1
    df = measure(1 if a.emu_smoke else a.reps)
    print(df[["block", "ms", "sectors per load request"]].to_string(index=False))
    if cl.backend() == "cuda" or a.out:
        results.write_benchmark(df, NAME, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
