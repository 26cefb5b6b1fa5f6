#!/usr/bin/env python3
"""Chapter 11's persistent blocks, measured on their own: the wgmma + TMA kernel
(kernels/11_hopper/conv2d_wgmma.cu, convlab.ops.wgmma) with wgmma_config's tile on ResNet and VGG
layers, input in channels_last, launched

- "wgmma_config, persistent": one block per SM (at most), each taking tiles b, b+G, b+2G, ... (the
  launcher's grid);
- "a block per tile": the same kernel and tile with a grid of one block per tile, so each block
  takes one tile and exits, as a kernel without persistence does. The kernel's tile loop needs no
  change for it (its stride is gridDim.x); only the launch differs, by telling the launcher the
  GPU has as many SMs as there are tiles (convlab.ops.wgmma.sm_count, patched in this process);

each output checked against the fp64 reference in fp16's bound before it is timed (convlab.programs.measure).
No define of the kernel is changed. On an H100 or H200 only (sm_90a); --emu-smoke runs the code path
on the emulator's small twins.

    python benchmarks/wgmma_ablation.py                  # on an H100/H200: benchmarks/results/wgmma_ablation_<GPU>.csv
    python benchmarks/wgmma_ablation.py --out $OUT       # the CSV into another folder
    CONVLAB_BACKEND=emu python benchmarks/wgmma_ablation.py --emu-smoke --out /tmp/x  # small twin, checks

Chapter 11 glues the result (book/11_hopper.ipynb, step 3).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

NAME = "wgmma_ablation"
LAYERS = ("vgg_3x3_56", "resnet_3x3_56", "resnet_3x3_14", "resnet_3x3_7")
PERSISTENT, PER_TILE = "wgmma_config, persistent", "a block per tile"


def measure(layers, reps: int):
    import pandas as pd

    from convlab.programs import measure as M
    from convlab.measuring import workloads
    from convlab.ops import wgmma

    frames = []
    real_sm_count = wgmma.sm_count
    for name in layers:
        wl = workloads.get(name)
        for variant in (PERSISTENT, PER_TILE):
            wgmma._plans.clear()                 # a plan keeps its grid: plan again
            if variant == PER_TILE:
                wgmma.sm_count = lambda: 1 << 30
            try:
                df = M.run([wgmma.WGMMA], [wl], dtype="fp16", layout="channels_last", torch_baseline=False,
                           reps=reps, desc=f"{name}, {variant}")
            finally:
                wgmma.sm_count = real_sm_count
                wgmma._plans.clear()
            df.insert(0, "variant", variant)
            frames.append(df)
    return pd.concat(frames, ignore_index=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", nargs="*", default=list(LAYERS))
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", type=Path, help="the folder for the CSV (default benchmarks/results)")
    ap.add_argument("--emu-smoke", action="store_true", help="on the emulator: a small twin, the code path only")
    a = ap.parse_args(argv)
    import convlab as cl
    from convlab.measuring import results

    if cl.backend() != "cuda" and not a.emu_smoke:
        print("wgmma_ablation times kernels: run it on an H100 or H200 (or --emu-smoke on the emulator)")
        return 1
    df = measure(a.layers[-1:] if a.emu_smoke else a.layers, 1 if a.emu_smoke else a.reps)
    ms = df.pivot_table(index="variant", columns="workload", values="ms", sort=False)
    print((ms / ms.loc[PERSISTENT]).round(2).to_string())
    if cl.backend() == "cuda" or a.out:
        results.write_benchmark(df, NAME, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
