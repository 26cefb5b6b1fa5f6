#!/usr/bin/env python3
"""Chapter 9a's step 4, one idea at a time: the fp32 implicit GEMM (conv2d_igemm_f32.cu,
convlab.ops.igemm) with igemm_config's tile, then with each of its techniques switched off alone,
on the same layers, each output checked against the fp64 reference before it is timed
(convlab.programs.measure.sweep):

- "split-K off": SPLIT=1 where igemm_config splits the reduction (few-pixel layers);
- "tap per step off": natural_order=True, the loader's MODE 0 (each element's (c, ky, kx) worked out
  by divisions, as chapter 5's kernels do) where igemm_mode gives MODE 1 (one filter tap per step,
  a carry instead of a division) or MODE 2 (the 1x1 layer as a plain GEMM, 16-byte loads);
- "warp tile 64x32" and "warp tile 16x128": the same block tile with its warps laid out otherwise
  than igemm_config's 32x64, which changes how many distinct 16-byte words a warp's float4 reads
  of the shared tiles touch;
- chapter 5's register-tiled implicit GEMM (no warp tiles, no K-major mask, no tap per step, no
  split-K): where step 4 started from.
The K-major mask has no switch of its own: the kernel always reads the transposed mask, and a
second loader for the untransposed one would be new code, not a technique switched off.

    python benchmarks/igemm_ablation.py                  # on a GPU: benchmarks/results/igemm_ablation_<GPU>.csv
    python benchmarks/igemm_ablation.py --out $OUT       # the CSV into another folder
    CONVLAB_BACKEND=emu python benchmarks/igemm_ablation.py --emu-smoke --out /tmp/x  # small twins, checks

Chapter 9a glues the table (book/09_general.ipynb, step 4): each variant's time over step 4's.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

NAME = "igemm_ablation"
LAYERS = ("resnet", "days100", "resnet_3x3_56", "resnet_3x3_14", "resnet_1x1_56")
STEP4 = "step 4: igemm_config"
#: variant -> the launcher's keywords (on top of igemm_config's tile)
VARIANTS = {STEP4: {}, "split-K off": {"SPLIT": 1}, "tap per step off": {"natural_order": True},
            "warp tile 64x32": {"WM": 64, "WN": 32}, "warp tile 16x128": {"WM": 16, "WN": 128}}
CH5 = "chapter 5: register-tiled implicit GEMM"


def measure(layers, reps: int):
    import pandas as pd

    import convlab as cl
    from convlab.programs import measure as M
    from convlab.measuring import workloads
    from convlab.ops import fused, igemm

    frames = []
    for name in layers:
        wl = workloads.get(name)
        shape = wl if cl.backend() == "cuda" else wl.small()
        cfg = igemm.igemm_config(shape)
        variants = {k: v for k, v in VARIANTS.items() if not (k == "split-K off" and cfg["SPLIT"] == 1)}
        df = M.sweep(igemm.IGEMM_F32, wl, list(variants.values()), reps=reps, desc=name)
        names = []
        for v, kw in variants.items():        # the rows of the settings that ran, in order
            if len(names) < len(df) and all(df.iloc[len(names)].get(k) == val for k, val in kw.items()):
                names.append(v)
        df.insert(0, "variant", names)
        frames.append(df)
        ch5 = M.run([fused.IMPLICIT_GEMM_REG], [wl], torch_baseline=False, reps=reps, desc="ch5")
        ch5.insert(0, "variant", CH5)
        frames.append(ch5)
    return pd.concat(frames, ignore_index=True)


def table(df):
    """Each variant's time over step 4's, per layer (above 1: switching the technique off cost time)."""
    ms = df.pivot_table(index="variant", columns="workload", values="ms", sort=False)
    return ms / ms.loc[STEP4]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", nargs="*", default=list(LAYERS))
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", type=Path, help="the folder for the CSV (default benchmarks/results)")
    ap.add_argument("--emu-smoke", action="store_true", help="on the emulator: small twins, the code path only")
    a = ap.parse_args(argv)
    import convlab as cl
    from convlab.measuring import results

    if cl.backend() != "cuda" and not a.emu_smoke:
        print("igemm_ablation times kernels: run it on a GPU (or --emu-smoke on the emulator)")
        return 1
    df = measure(a.layers[:1] if a.emu_smoke else a.layers, 1 if a.emu_smoke else a.reps)
    print(table(df).round(2).to_string())
    if cl.backend() == "cuda" or a.out:
        results.write_benchmark(df, NAME, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
