#!/usr/bin/env python3
"""Chapter 10's fusion, stage by stage and for the whole forward pass: each conv stage of both
networks at a batch of 10,000 fused (one kernel: conv + bias + activation + pooling) and as three
kernels (pick()'s convolution, then the epilogue), by network.measure_stages; then the whole forward
pass of each network with every stage fused, with none fused, and with network.forward's rule
(network.fuses: fuse where the stage's mask fits the constant cache), each checked against torch in
fp64 on sampled images before it is timed.

    python benchmarks/network_fusion.py                # on a GPU: benchmarks/results/network_fusion_<GPU>.csv
    python benchmarks/network_fusion.py --out $OUT     # the CSV into another folder
    CONVLAB_BACKEND=emu python benchmarks/network_fusion.py --emu-smoke --out /tmp/x  # twins, checks only

Chapter 10 glues the whole-forward rows (book/10_network.ipynb, step 1).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

NAME = "network_fusion"
MODES = {"every stage fused": True, "no stage fused": False, "fused where it pays (network.fuses)": None}


def measure(images: int, reps: int):
    import pandas as pd
    import torch

    import convlab as cl
    from convlab.programs import measure as M
    from convlab.measuring import results
    from convlab.programs import network
    from convlab.ops import layers as ops

    frames = []
    archs = (network.CLASS_PROJECT, network.LENET5)
    for arch in archs:
        if cl.backend() != "cuda" and arch.image_size > 28:
            arch = arch.at_size(30)
        stages = network.measure_stages([ops.FUSED, ops.SEPARATE], arch.conv_workloads(images), reps=reps,
                                        act=arch.convs[0].act, pool=arch.convs[0].pool, torch_too=False)
        stages.insert(0, "network", arch.key)
        frames.append(stages)
        params = network.init(arch, seed=0)
        model64 = network.load_into(network.torch_model(arch), params).to(next(iter(params.values())).device).double()
        x = cl.randn(images, 1, arch.image_size, arch.image_size)
        idx = M.sample_images(images)
        with torch.no_grad():
            ref = model64(x[idx].double())
        wl = arch.conv_workloads(images)[0]
        rows = []
        for mode, fused in MODES.items():
            fn = lambda fused=fused: network.forward(arch, params, x, fused=fused)  # noqa: E731
            cl.check(fn()[idx], ref, name=f"{arch.name}, {mode}")
            rows.append({**results.row(wl, mode, M.time_impl(fn, reps)), "workload": arch.key,
                         "shape": f"B={images}, whole network forward", "network": arch.key})
        frames.append(pd.DataFrame(rows))
    return pd.concat(frames, ignore_index=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=10_000)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", type=Path, help="the folder for the CSV (default benchmarks/results)")
    ap.add_argument("--emu-smoke", action="store_true", help="on the emulator: the twins, the code path only")
    a = ap.parse_args(argv)
    import convlab as cl
    from convlab.measuring import results

    if cl.backend() != "cuda" and not a.emu_smoke:
        print("network_fusion times kernels: run it on a GPU (or --emu-smoke on the emulator)")
        return 1
    df = measure(4 if a.emu_smoke else a.images, 1 if a.emu_smoke else a.reps)
    print(df[["network", "workload", "impl", "ms"]].to_string(index=False))
    if cl.backend() == "cuda" or a.out:
        results.write_benchmark(df, NAME, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
