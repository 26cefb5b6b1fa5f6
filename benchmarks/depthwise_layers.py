#!/usr/bin/env python3
"""Depthwise layers (convlab.measuring.workloads.DEPTHWISE_LAYERS: MobileNetV2 3x3, ConvNeXt 7x7): every
config of our two depthwise kernels checked, then timed, against torch at its best and the memory
floor, through the book's harness (convlab.programs.measure).

    python benchmarks/depthwise_layers.py                        # every layer, fp32 and fp16
    python benchmarks/depthwise_layers.py --layers convnext_dw7_56 --dtypes fp16 --reps 50
    python benchmarks/depthwise_layers.py --quick                # each kernel's default only
    CONVLAB_BACKEND=emu python benchmarks/depthwise_layers.py    # emulator: small twins, checks only

Per layer and dtype (edit CONFIGS below to try others):
- ours NCHW: depthwise.conv2d_depthwise (kernels/09_general/conv2d_depthwise.cu, depthwise.DEPTHWISE),
  its default (what the drop-in dropin.conv2d runs on an NCHW x) by measure.run, and the tunables
  of CONFIGS["nchw"] by measure.sweep;
- ours NHWC: depthwise.conv2d_depthwise_nhwc (conv2d_depthwise_nhwc.cu, depthwise.DEPTHWISE_NHWC)
  on channels_last inputs, its default and CONFIGS["nhwc"] likewise;
- torch from convlab.measuring.baselines: NCHW and channels_last, cudnn.benchmark on, TF32 off, each timed in
  a fresh process, "torch best" the faster.
Every output is first checked against an fp64 reference (written into NaN-filled outputs on the
emulator, so an element never written fails): a wrong one stops the script.

These layers are memory-bound: the floor (convlab.measuring.roofline: the bytes of x, w and y at the copy
bandwidth measured on this GPU) bounds every kernel; each row prints its GB/s and its fraction of
the floor. Per layer and dtype: torch best beside our two defaults and our fastest config;
geometric means of torch best / ours (above 1: ours faster).

On a GPU the rows (convlab.measuring.results' columns and the tunables) go to
benchmarks/results/depthwise_layers_<GPU>.csv (--out: another folder).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import convlab as cl  # noqa: E402
from benchmarks import sweep_tables as st  # noqa: E402
from convlab.measuring import results, workloads  # noqa: E402
from convlab.ops import depthwise  # noqa: E402
from convlab.programs import measure

# Tunables tried besides each launcher's default. Keys: the launchers' keywords.
CONFIGS = {
    "nchw": [dict(vec=1),                                   # one element per load (the old tile load)
             dict(OY=2), dict(OY=8), dict(OY=16), dict(BX=64), dict(OY=8, BX=64)],
    "nhwc": [dict(vec=8), dict(OY=1, OX=4), dict(OY=2, OX=2), dict(OY=4, OX=4), dict(OY=4, OX=2),
             dict(OY=8, OX=2), dict(OY=2, OX=8), dict(vec=8, OY=4, OX=2), dict(PB=4), dict(PB=16)],
}
KEYS = ("vec", "OY", "OX", "BX", "BY", "BZ", "CB", "PB")
IMPLS = {  # (layout, dtype) -> the Impl
    ("nchw", "fp32"): depthwise.DEPTHWISE, ("nchw", "fp16"): depthwise.DEPTHWISE_FP16,
    ("channels_last", "fp32"): depthwise.DEPTHWISE_NHWC, ("channels_last", "fp16"): depthwise.DEPTHWISE_NHWC_FP16,
}
CONFIGS_OF = {"nchw": CONFIGS["nchw"], "channels_last": CONFIGS["nhwc"]}


def measure_layer(wl, dtype: str, reps: int, roof, quick: bool = False):
    """One layer in one dtype: each kernel's default (measure.run; the NCHW one with torch's rows),
    then its CONFIGS (measure.sweep; quick: none)."""
    import pandas as pd

    frames = []
    for layout in ("nchw", "channels_last"):
        impl = IMPLS[layout, dtype]
        frames.append(measure.run([impl], [wl], dtype=dtype, layout=layout, torch_baseline=layout == "nchw",
                                  reps=reps, roof=roof, desc=f"{wl.name} {dtype}"))
        if not quick:
            frames.append(measure.sweep(impl, wl, CONFIGS_OF[layout], dtype=dtype, layout=layout, reps=reps,
                                        roof=roof, desc=f"{wl.name} {dtype} {layout}"))
    return pd.concat(frames, ignore_index=True)


def _default(layout):
    def pick(rows):
        mine = st.ours(rows)
        return st.fastest(mine[[r["layout"] == layout and not st.tunables(r, KEYS) for _, r in mine.iterrows()]])
    return pick


PICKS = {"NCHW default": _default("NCHW"), "NHWC default": _default("channels_last"),
         "ours best": lambda rows: st.fastest(st.ours(rows))}


def label(r) -> str:
    if r["kind"] != "ours":
        return r["impl"]
    return f"ours {'NHWC' if r['layout'] == 'channels_last' else 'NCHW'} {st.text(st.tunables(r, KEYS))}"


def report(df) -> list[str]:
    """Each layer's rows per dtype; the summary; geometric means."""
    out = []
    for (wl, dtype), rows in df.groupby(["workload", "dtype"], sort=False):
        out += [f"\n## {wl} {dtype}: {rows['shape'].iloc[0]}", st.layer_table(rows, label)]
    table = st.versus(df, PICKS, label=label)
    floor = df.groupby(["workload", "dtype"], sort=False)["floor_ms"].first()
    table.insert(1, "floor ms", floor.reindex(table.index))
    out += ["", "# per layer and dtype: GPU ms (torch best / ours: above 1, ours faster), the roofline floor; "
            "our fastest config", st.show(table, PICKS), ""]
    return out + st.geomeans(table, PICKS)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    known = [w.name for w in workloads.DEPTHWISE_LAYERS]
    ap.add_argument("--layers", default="", help=f"comma-separated (default all: {', '.join(known)})")
    ap.add_argument("--dtypes", default="fp32,fp16", help="fp32, fp16 or both (default both)")
    ap.add_argument("--quick", action="store_true", help="each kernel's default only (no CONFIGS)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default=None, help="folder for the CSV (default benchmarks/results)")
    args = ap.parse_args(argv)
    gpu = cl.backend() == "cuda"
    names = [n for n in args.layers.split(",") if n]
    dtypes = [d for d in args.dtypes.split(",") if d]
    for what, given, choices in (("layers", names, known), ("dtypes", dtypes, ["fp32", "fp16"])):
        if set(given) - set(choices):
            ap.error(f"unknown {what} {sorted(set(given) - set(choices))}; known: {', '.join(choices)}")
    layers = [w for w in workloads.DEPTHWISE_LAYERS if not names or w.name in names]
    roof = None
    if gpu:
        from convlab.measuring import roofline

        roof = roofline.current()

    print(f"# {cl.device()}")
    if roof is not None:
        print(f"# {roof}")
    import pandas as pd

    df = pd.concat([measure_layer(w, d, args.reps, roof, args.quick) for w in layers for d in dtypes],
                   ignore_index=True)
    if not gpu:
        print("\n".join(st.checked_lines(df, label, ("dtype",))))
        return 0
    print(f"# {results.provenance(df)}")
    for line in report(df):
        print(line)
    results.save_benchmark(df, "depthwise_layers", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
