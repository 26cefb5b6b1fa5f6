#!/usr/bin/env python3
"""The drop-in conv2d (convlab.ops.dispatch.pick()'s kernel) on the layers modern networks use
(convlab.measuring.workloads.LAYERS: depthwise 3x3 and 7x7, grouped, dilated, non-square and standard layers),
against torch at its best: the book's own harness (convlab.programs.measure), printed as a table.

    python benchmarks/general_layers.py                         # every layer, fp32 and fp16, forward
    python benchmarks/general_layers.py --all                   # + every kernel that takes each layer
    python benchmarks/general_layers.py --families depthwise --dtypes fp32
    python benchmarks/general_layers.py --backward              # + forward, dX and dW through autograd
    python benchmarks/general_layers.py --more                  # workloads.MORE_LAYERS instead of LAYERS
    python benchmarks/general_layers.py --dtypes fp16 --layout channels_last   # our inputs channels_last
    CONVLAB_BACKEND=emu python benchmarks/general_layers.py     # emulator: small twins, checks only

Every output is checked against an fp64 reference before it is timed (fp16: chapter 6's derived
bound). torch's rows come from convlab.measuring.baselines: cudnn.benchmark on, TF32 off, NCHW and
channels_last, each timed in a fresh process, "torch best" the faster. speedup = torch best / ours
(GPU time). On a GPU the rows also go to benchmarks/results/general_layers_<GPU>.csv.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import convlab as cl  # noqa: E402
from convlab.measuring import results, workloads  # noqa: E402
from convlab.measuring.baselines import TORCH_BEST  # noqa: E402
from convlab.ops import Impl, dispatch, dropin  # noqa: E402
from convlab.programs import measure

TRAIN = "ours: autograd (dropin.conv2d)"


def train(x, w, dy, *, stride=1, padding=0, dilation=1, groups=1):
    """forward, dX and dW of the drop-in through autograd: (y, dx, dw)."""
    xg, wg = x.detach().requires_grad_(), w.detach().requires_grad_()
    y = dropin.conv2d(xg, wg, None, stride, padding, dilation, groups)
    dx, dw = torch.autograd.grad(y, (xg, wg), dy)
    return y.detach(), dx, dw


def impls(dtype: str, every: bool, backward: bool) -> list:
    out = [dispatch.picked(dtype)]
    if every:
        out = list(dispatch.implementations(dtype)) + out
    if backward:
        out.append(Impl(TRAIN, train, "conv2d_train", any_layer=True, key="dropin_train",
                        accumulation_of=dispatch.fp16_accumulation))    # its forward adds as pick()'s kernel
    return out


def summary(df) -> list[str]:
    """Geometric means of torch best / ours (GPU time) per family, dtype and pass."""
    ours = df[df["impl"].isin([dispatch.BEST, TRAIN])]
    best = df[df["impl"] == TORCH_BEST].set_index(["workload", "dtype", "pass"])["ms"]
    family = {w.name: w.family for w in workloads.LAYERS + workloads.MORE_LAYERS}
    groups = {}
    for _, r in ours.iterrows():
        key = (r["workload"], r["dtype"], r["pass"])
        if key in best.index:
            groups.setdefault((family[r["workload"]], r["dtype"], r["pass"]), []).append(best[key] / r["ms"])
    out = ["# geometric mean of torch best / ours (GPU time):"]
    for (fam, dtype, ps), v in sorted(groups.items()):
        out.append(f"#   {fam:<10} {dtype:<5} {ps:<14} {math.exp(sum(map(math.log, v)) / len(v)):.2f}x "
                   f"over {len(v)} layers")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", default="", help=f"comma-separated (default all: {', '.join(workloads.FAMILIES)})")
    ap.add_argument("--layers", default="", help="comma-separated layer names (default all)")
    ap.add_argument("--dtypes", default="fp32,fp16", help="fp32, fp16 or both (default both)")
    ap.add_argument("--all", action="store_true", help="also every kernel pick() chooses among, on each layer")
    ap.add_argument("--backward", action="store_true", help="also forward + dX + dW through autograd")
    ap.add_argument("--layout", default="nchw", choices=("nchw", "channels_last"),
                    help="the memory format of our inputs (torch's rows time both)")
    ap.add_argument("--more", action="store_true", help="workloads.MORE_LAYERS (other groups, dilations, masks, "
                    "strides) instead of LAYERS")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args(argv)
    families = [f for f in args.families.split(",") if f]
    names = [n for n in args.layers.split(",") if n]
    dtypes = [d for d in args.dtypes.split(",") if d]
    table = workloads.MORE_LAYERS if args.more else workloads.LAYERS
    for what, given, known in (("families", families, workloads.FAMILIES),
                               ("layers", names, [w.name for w in table]),
                               ("dtypes", dtypes, list(dispatch.RULES))):
        if set(given) - set(known):
            ap.error(f"unknown {what} {sorted(set(given) - set(known))}; known: {', '.join(known)}")
    layers = [w for w in table if (not families or w.family in families) and (not names or w.name in names)]

    print(f"# {cl.device()}")
    frames = [measure.run(impls(d, args.all, args.backward), layers, dtype=d, layout=args.layout, reps=args.reps,
                          desc=d) for d in dtypes]
    import pandas as pd

    df = pd.concat(frames, ignore_index=True)
    if cl.backend() != "cuda":
        print("# emulator: every kernel below passed its check on each layer's small twin; nothing was timed")
        print(df[["workload", "dtype", "pass", "impl"]].to_string(index=False))
        return 0
    print(f"# {results.provenance(df)}")
    for (dtype, ps), sub in df.groupby(["dtype", "pass"], sort=False):
        print(f"\n# {dtype}, {ps}: GPU ms")
        print(results.summary(sub).round(4).to_string())
    print()
    for line in summary(df):
        print(line)
    results.save_benchmark(df, "general_layers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
