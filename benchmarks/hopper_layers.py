#!/usr/bin/env python3
"""Chapter 11's wgmma + TMA convolution (convlab.ops.wgmma.conv2d_wgmma, fp16, NHWC) on the standard
ResNet/VGG layers it takes (convlab.workloads.GEMM_LAYERS at stride 1), beside chapter 9's mma.sync
kernel and torch at its best, through the book's harness (convlab.measure).

    python benchmarks/hopper_layers.py                      # every layer, every tile
    python benchmarks/hopper_layers.py --layers vgg_3x3_56  # one layer
    CONVLAB_BACKEND=emu python benchmarks/hopper_layers.py  # emulator: small twins, checks only

Per layer, ours swept (measure.sweep) over wgmma_config's choice and each BN (64, 128, 256, as many
maps as the layer has) with one ring and, where it fits, two (RINGS=2, ping-pong), on
channels_last inputs; chapter 9's conv2d_mma (its default tile, channels_last) by measure.run,
with torch's rows: NCHW and channels_last, each timed in a fresh process with cudnn.benchmark on,
"torch best" the faster. Every output is first checked against an fp64 reference.

Printed: per layer, GPU ms and the time a caller sees (caller ms: events around one call, nothing
held) of torch best (and its kernel), mma.sync, wgmma_config's tile and the fastest tile; torch best
/ ours per layer (above 1: ours faster) and their geometric means. On a GPU the rows (convlab.results'
columns and the tunables BN, STAGES, RINGS) go to benchmarks/results/hopper_layers_<GPU>.csv.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import convlab as cl  # noqa: E402
from convlab import baselines, measure, results, workloads  # noqa: E402
from convlab.ops import tensor_core as tc  # noqa: E402
from convlab.ops import wgmma  # noqa: E402

DTYPE = "fp16"


def layers(names: list[str]) -> list:
    """The GEMM layers conv2d_wgmma takes (by name, or all of them); the others said why not."""
    out = []
    for wl in workloads.GEMM_LAYERS:
        if names and wl.name not in names:
            continue
        why = wgmma.refuses(wl)
        if why:
            print(f"# {wl.name}: not taken by conv2d_wgmma ({why}); chapter 9's mma.sync kernel runs it")
        else:
            out.append(wl)
    return out


def configs(wl) -> list[dict]:
    """wgmma_config's choice, then each BN the layer's maps fill, with one ring and with two."""
    shape = wl if cl.backend() == "cuda" else wl.small()
    out = [wgmma.wgmma_config(shape)]
    for BN in (64, 128, 256):
        if BN > max(64, shape.M):
            continue
        for rings in (1, 2):
            if wgmma.shared_bytes(BN, 2, rings) + wgmma.static_shared(2, rings) <= wgmma.SHARED_OPTIN_MAX:
                out.append(dict(BN=BN, RINGS=rings))
    return [dict(c) for c in dict.fromkeys(tuple(sorted(c.items())) for c in out)]


def measure_layer(wl, reps: int):
    import pandas as pd

    swept = measure.sweep(wgmma.WGMMA, wl, configs(wl), dtype=DTYPE, layout="channels_last", reps=reps,
                          desc=wl.name)
    rest = measure.run([tc.MMA], [wl], dtype=DTYPE, layout="channels_last", reps=reps, desc=wl.name)
    return pd.concat([swept, rest], ignore_index=True)


def _tunables(r) -> dict:
    return {k: int(r[k]) for k in wgmma.TUNABLES if k in r and isinstance(r[k], (int, float)) and not math.isnan(r[k])}


def report(df) -> list[str]:
    """Per layer: torch best, mma.sync, wgmma_config's tile, the fastest tile; ratios; geomeans."""
    out = [f"{'layer':22s} {'torch best (kernel)':44s} {'mma.sync':>9s} {'wgmma':>9s} {'best':>9s}  "
           f"{'torch/wgmma GPU':>15s} {'caller':>7s}  best tile"]
    ratios = {"gpu": [], "caller": [], "best": []}
    for name, rows in df.groupby("workload", sort=False):
        best_t = rows[rows["kind"] == "torch best"].iloc[0]
        mma = rows[(rows["kind"] == "ours") & (rows["impl"] == tc.MMA.name)]
        ours = rows[(rows["kind"] == "ours") & (rows["impl"] == wgmma.WGMMA.name)]
        wl = next(w for w in workloads.GEMM_LAYERS if w.name == name)
        cfg = wgmma.wgmma_config(wl)
        mine = ours[[all(_tunables(r).get(k) == v for k, v in cfg.items() if k in ("BN", "RINGS"))
                     and (_tunables(r).get("STAGES") in (None, cfg["STAGES"])) for _, r in ours.iterrows()]]
        chosen = mine.loc[mine["ms"].idxmin()]
        best = ours.loc[ours["ms"].idxmin()]
        t_caller = best_t["caller_ms"]
        ratios["gpu"].append(best_t["ms"] / chosen["ms"])
        ratios["caller"].append(t_caller / chosen["caller_ms"])
        ratios["best"].append(best_t["ms"] / best["ms"])
        kernel = baselines.kernel_short_name(str(best_t["torch_kernels"] or ""))[:30]
        out.append(f"{name:22s} {best_t['ms']:.4f} {best_t['layout']:>13s} {kernel:30s} {mma['ms'].min():9.4f} "
                   f"{chosen['ms']:9.4f} {best['ms']:9.4f}  {ratios['gpu'][-1]:15.2f} {ratios['caller'][-1]:7.2f}  "
                   f"{_tunables(best)}")

    def geo(v):
        return math.exp(sum(map(math.log, v)) / len(v))
    out.append(f"# torch best / wgmma_config's tile, geometric mean: GPU time {geo(ratios['gpu']):.2f} "
               f"(at least 1.0 on {sum(r >= 1 for r in ratios['gpu'])} of {len(ratios['gpu'])} layers), as a caller "
               f"sees it {geo(ratios['caller']):.2f}; the fastest tile per layer: {geo(ratios['best']):.2f}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", default="", help="comma-separated layer names (default: all it takes)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default=None, help="folder for the CSV (default benchmarks/results)")
    args = ap.parse_args(argv)
    import pandas as pd

    print(f"# {cl.device()}")
    df = pd.concat([measure_layer(w, args.reps) for w in layers([n for n in args.layers.split(",") if n])],
                   ignore_index=True)
    if cl.backend() != "cuda":
        print(f"# emulator: {len(df)} rows checked against fp64 on the layers' small twins; nothing timed")
        return 0
    print(f"# {results.provenance(df)}")
    for line in report(df):
        print(line)
    print(f"# wrote {results.save_benchmark(df, 'hopper_layers', args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
