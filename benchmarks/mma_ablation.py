#!/usr/bin/env python3
"""Chapter 9b's swizzle and stages, each measured on its own: the mma.sync implicit GEMM
(conv2d_mma.cu, convlab.ops.tensor_core) with mma_config's tile on ResNet and VGG layers, its input
already in channels_last (the kernel alone), then

- "swizzle off": the same tile built with SWIZZLE=0 (chunk c of every shared row at slot c: the 8
  rows an ldmatrix phase reads share one group of 4 banks);
- "2 stages", "3 stages", "4 stages": the same tile with that depth of cp.async pipeline (where
  it fits in shared memory; the tile's own depth is the "mma_config" row);

each output checked against the fp64 reference in fp16's bound before it is timed
(convlab.programs.measure.sweep), with the shared-memory bank conflicts of one call beside it (ncu on a GPU,
the emulator's counters with --emu-smoke).

    python benchmarks/mma_ablation.py                  # on a GPU: benchmarks/results/mma_ablation_<GPU>.csv
    python benchmarks/mma_ablation.py --out $OUT       # the CSV into another folder
    CONVLAB_BACKEND=emu python benchmarks/mma_ablation.py --emu-smoke --out /tmp/x  # small twin, checks

Chapter 9b glues the table (book/09b_tensor_cores.ipynb, step 2): each variant's time over the
tile's own.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

NAME = "mma_ablation"
LAYERS = ("resnet_3x3_56", "resnet_3x3_14", "vgg_3x3_56", "resnet_1x1_56")
BASE = "mma_config"


def variants(cfg: dict) -> dict:
    """variant -> the launcher's keywords, the tile pinned to cfg's (SPLIT_K included)."""
    from convlab.ops import tensor_core as tc

    tile = {k: cfg[k] for k in tc.TUNABLES}
    out = {BASE: dict(tile), "swizzle off": dict(tile, swizzle=False)}
    for s in (2, 3, 4):
        t = dict(tile, STAGES=s)
        if s != cfg["STAGES"] and tc.shared_bytes(**t) <= tc.SHARED_OPTIN_MAX:
            out[f"{s} stages"] = t
    return out


def measure(layers, reps: int):
    import pandas as pd

    import convlab as cl
    from convlab.programs import measure as M
    from convlab.measuring import workloads
    from convlab.ops import tensor_core as tc

    frames = []
    for name in layers:
        wl = workloads.get(name)
        shape = wl if cl.backend() == "cuda" else wl.small()
        vs = variants(tc.mma_config(shape))
        df = M.sweep(tc.MMA, wl, list(vs.values()), dtype="fp16", layout="channels_last", reps=reps, desc=name)
        df = df.iloc[:len(vs)].copy()
        df.insert(0, "variant", list(vs)[:len(df)])
        x = cl.randn(*shape.x_shape, dtype=__import__("torch").float16)
        w = cl.randn(*shape.w_shape, dtype=__import__("torch").float16)
        import torch
        x, w = (t.contiguous(memory_format=torch.channels_last) for t in (x, w))
        conflicts = []
        for kw in vs.values():
            card = cl.profile(tc.MMA.launcher, x, w, **shape.conv_kwargs(), **kw)
            k = card.kernel("conv2d_mma")
            conflicts.append(k.value("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"))
        df["shared load bank conflicts"] = conflicts[:len(df)]
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


def table(df):
    """Each variant's time over mma_config's tile's, per layer."""
    ms = df.pivot_table(index="variant", columns="workload", values="ms", sort=False)
    return ms / ms.loc[BASE]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", nargs="*", default=list(LAYERS))
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", type=Path, help="the folder for the CSV (default benchmarks/results)")
    ap.add_argument("--emu-smoke", action="store_true", help="on the emulator: the small twin, the code path only")
    a = ap.parse_args(argv)
    import convlab as cl
    from convlab.measuring import results

    if cl.backend() != "cuda" and not a.emu_smoke:
        print("mma_ablation times kernels: run it on a GPU (or --emu-smoke on the emulator)")
        return 1
    df = measure(a.layers[:1] if a.emu_smoke else a.layers, 1 if a.emu_smoke else a.reps)
    print(table(df).round(2).to_string())
    if cl.backend() == "cuda" or a.out:
        results.write_benchmark(df, NAME, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
