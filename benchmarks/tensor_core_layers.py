#!/usr/bin/env python3
"""Chapter 9's tensor-core convolution (convlab.ops.tensor_core.conv2d_mma, fp16, NHWC) on the
standard ResNet/VGG layers (convlab.measuring.workloads.GEMM_LAYERS; the grouped ResNeXt layers on request):
every candidate tile checked, then timed, against torch at its best, through the book's harness
(convlab.programs.measure).

    python benchmarks/tensor_core_layers.py                         # every layer, every candidate tile
    python benchmarks/tensor_core_layers.py --layers resnet_3x3_28,resnet_stem_7x7_s2 --configs default
    python benchmarks/tensor_core_layers.py --batch 64 --out /tmp/tc_b64   # another batch, another folder
    python benchmarks/tensor_core_layers.py --splits 2,3,4,8                  # more split-K depths
    python benchmarks/tensor_core_layers.py --layers resnext_g32_56,resnext_g32_28 --out /tmp/tc_grouped
                                                                    # the grouped layers (ResNeXt), on request
    python benchmarks/tensor_core_layers.py --configs default --backward --out /tmp/tc_backward
                                                                    # and the fp16 dX and dW passes
    CONVLAB_BACKEND=emu python benchmarks/tensor_core_layers.py     # emulator: small twins, checks only

Per layer, ours (tensor_core.MMA) swept (measure.sweep) over mma_config's choice and each tile of
tensor_core.CANDIDATES (--configs) on channels_last inputs, x and w (what torch's channels_last row
gets); each tile whose grid is under two waves (SMs x 2 blocks) also split along K into each of
--splits (the fp32 partials and their reducing pass in the time). mma_config's choice once more on
NCHW inputs (measure.run): x and the mask converted to NHWC inside the call, in its time. torch
from convlab.measuring.baselines: NCHW and channels_last, each timed in a fresh process, "torch best" the
faster. With --backward, the dX and dW passes too (tensor_core.MMA_DX and MMA_DW with their default
tiles, channels_last tensors, beside torch's). Every output is first checked against an fp64
reference (chapter 6's derived fp16 bound; dW the generic one): a wrong one stops the script.

Printed: each layer's rows; per layer, torch best beside mma_config's tile (channels_last and NCHW
input) and the best tile; geometric means of torch best / ours (above 1: ours faster); the SASS of
each timed tile's main loop (--no-sass to skip). To change the choice: PREFERENCE / preference() /
BLOCKS_PER_SM / MIN_STEPS_PER_SPLIT in convlab/ops/tensor_core.py (mma_config). With --backward, a
table of the gradients: torch best / ours per pass, and its geometric means.

On a GPU the rows (convlab.measuring.results' columns and the tunables BM ... SPLIT_K) go to
benchmarks/results/tensor_core_layers_<GPU>.csv (--out: another folder).
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import convlab as cl  # noqa: E402
from benchmarks import sweep_tables as st  # noqa: E402
from convlab.measuring import results, workloads  # noqa: E402
from convlab.ops import ceil_div  # noqa: E402
from convlab.ops import tensor_core as tc  # noqa: E402
from convlab.programs import measure

DEFAULT = "default"     # the --configs name of mma_config's choice
#: chapter 9's grouped layers (ResNeXt): timed only when --layers names them
GROUPED = [w for w in workloads.LAYERS if w.family == "grouped"]
DTYPE = "fp16"


def tile_name(t: dict) -> str:
    """A tile's name in tensor_core.CANDIDATES (or its tunables), with its split."""
    tile = {k: t[k] for k in tc.TILE}
    split = f" split {t['SPLIT_K']}" if t.get("SPLIT_K", 1) > 1 else ""
    for name, c in tc.CANDIDATES.items():
        if c == tile:
            return name + split
    return "BM={BM} BN={BN} BK={BK} warps {WARPS_M}x{WARPS_N} s{STAGES}".format(**t) + split


def configs(wl, names: list[str], splits: list[int]) -> list[dict]:
    """mma_config's choice, then each named candidate tile (SPLIT_K=1), then each of those split along
    K into each of `splits` where its grid is under two waves and every split gets a BK step."""
    P, M, K, _, G = tc.gemm_shape(wl)                 # a group's GEMM (one group: the layer's)
    tiles = [dict(tc.CANDIDATES[n], SPLIT_K=1) for n in names if n != DEFAULT]
    out = [tc.mma_config(wl)] + tiles
    for t in tiles:
        if ceil_div(P, t["BM"]) * ceil_div(M, t["BN"]) * G < 2 * tc.SMS:
            out += [dict(t, SPLIT_K=k) for k in splits if k <= ceil_div(K, t["BK"])]
    return [dict(c) for c in dict.fromkeys(tuple(sorted(c.items())) for c in out)]


def measure_layer(wl, names, splits, reps, backward: bool = False):
    """The layer's rows: the sweep on channels_last inputs, mma_config's choice on NCHW inputs (its
    tunables filled in), torch's rows; with backward, the dX and dW passes (tensor_core.MMA_DX,
    MMA_DW, their default tiles) on channels_last tensors beside torch's."""
    import pandas as pd

    small = wl if cl.backend() == "cuda" else wl.small()
    swept = measure.sweep(tc.MMA, wl, configs(small, names, splits), dtype=DTYPE, layout="channels_last",
                          reps=reps, desc=wl.name)
    nchw = measure.run([tc.MMA], [wl], dtype=DTYPE, reps=reps, desc=wl.name)
    mine = nchw["kind"] == "ours"
    for k, v in tc.mma_config(small).items():
        nchw.loc[mine, k] = v
    frames = [swept, nchw]
    if backward:
        frames.append(measure.run([tc.MMA_DX, tc.MMA_DW], [wl], dtype=DTYPE, layout="channels_last", reps=reps,
                                  desc=wl.name))
    return pd.concat(frames, ignore_index=True)


def picks(shapes: dict) -> dict:
    """The summary's columns (name -> the row of a layer's rows it names): mma_config's tile on
    channels_last and on NCHW inputs, the fastest tile. shapes: workload name -> the Workload measured."""
    def config(layout):
        def pick(rows):
            mine = st.ours(rows)
            mine = mine[mine["layout"] == layout]
            cfg = tc.mma_config(shapes[rows["workload"].iloc[0]])
            return st.fastest(mine[[st.tunables(r, tc.TUNABLES) == cfg for _, r in mine.iterrows()]])
        return pick

    def best(rows):
        mine = st.ours(rows)
        return st.fastest(mine[mine["layout"] == "channels_last"])

    return {"mma_config": config("channels_last"), "mma_config, NCHW in": config("NCHW"), "best tile": best}


def label(r) -> str:
    if r["kind"] != "ours" or r["pass"] != "forward":
        return r["impl"]
    return f"ours {tile_name(st.tunables(r, tc.TUNABLES))}" + (", NCHW input" if r["layout"] == "NCHW" else "")


def report(df, shapes: dict) -> list[str]:
    """Each layer's forward rows; the summary per layer; geometric means; the gradients, if measured."""
    cols = picks(shapes)
    out = []
    back = df[df["pass"] != "forward"]
    df = df[df["pass"] == "forward"]
    for wl, rows in df.groupby("workload", sort=False):
        cfg = tc.mma_config(shapes[wl])
        marked = lambda r: label(r) + (" *" if st.tunables(r, tc.TUNABLES) == cfg else "")  # noqa: E731
        out += [f"\n## {wl}: {rows['shape'].iloc[0]} (* mma_config's tile)", st.layer_table(rows, marked)]
    table = st.versus(df, cols, label=lambda r: tile_name(st.tunables(r, tc.TUNABLES)))
    out += ["", "# per layer: GPU ms (torch best / ours: above 1, ours faster); mma_config's tile on channels_last "
            "and on NCHW inputs (the conversion in its time); the fastest tile (channels_last) and its config",
            st.show(table, cols), ""]
    out += st.geomeans(table, cols)
    if len(back):
        out += st.gradient_lines(back, "gradients, channels_last, mma_dx_config's and mma_dw_config's tiles")
    return out


def sass_lines(tiles: dict) -> list[str]:
    """Opcode counts in conv2d_mma's main loop (the innermost loop with an HMMA) of each tile, and
    registers. SPLIT_K does not change the code: it is the grid's y."""
    from convlab.ops._kernels import module

    out = ["", "# SASS of conv2d_mma's main loop (one iteration = one BK-deep step), sm_90, per tile:",
           f"# {'tile':<44} {'HMMA':>5} {'LDSM':>5} {'LDGSTS':>6} {'BAR':>4} {'all':>5} {'other':>5} {'regs':>5}"]
    for name, t in tiles.items():
        try:
            s = cl.sass(tc.MMA_FILE, defines=t)
            body = s.loop("conv2d_mma", containing="HMMA")
            n = s.counts(body)
            other = len(body) - n.get("HMMA", 0) - n.get("LDSM", 0)
            regs = module(tc.MMA_FILE, t).kernel("conv2d_mma").attributes.get("registers")
            out.append(f"# {name:<44} {n.get('HMMA', 0):>5} {n.get('LDSM', 0):>5} {n.get('LDGSTS', 0):>6} "
                       f"{n.get('BAR', 0):>4} {len(body):>5} {other:>5} {regs if regs is not None else '-':>5}")
        except cl.ConvlabError as e:
            out.append(f"# {name:<44} SASS unavailable here: {str(e).splitlines()[0][:120]}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    known = [w.name for w in workloads.GEMM_LAYERS]
    ap.add_argument("--layers", default="", help=f"comma-separated (default all: {', '.join(known)}); also, on "
                    f"request, the grouped layers {', '.join(w.name for w in GROUPED)}")
    ap.add_argument("--configs", default="all", help=f"'all' (mma_config's choice and every candidate), "
                    f"'{DEFAULT}', or comma-separated names of tensor_core.CANDIDATES")
    ap.add_argument("--splits", default="2,4", help="SPLIT_K depths to time for tiles with under two waves "
                    "of blocks (comma-separated; '' for none)")
    ap.add_argument("--batch", type=int, default=None, help="batch size for every layer (default: each layer's)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default=None, help="folder for the CSV (default benchmarks/results)")
    ap.add_argument("--no-sass", action="store_true", help="skip the SASS counts")
    ap.add_argument("--backward", action="store_true", help="also the dX and dW passes (MMA_DX, MMA_DW)")
    args = ap.parse_args(argv)
    gpu = cl.backend() == "cuda"
    names = [n for n in args.layers.split(",") if n]
    if set(names) - set(known) - {w.name for w in GROUPED}:
        ap.error(f"unknown layers {sorted(set(names) - set(known) - {w.name for w in GROUPED})}; known: "
                 f"{', '.join(known + [w.name for w in GROUPED])}")
    splits = [int(k) for k in args.splits.split(",") if k]
    tiles = [DEFAULT, *tc.CANDIDATES] if args.configs == "all" else [c for c in args.configs.split(",") if c]
    if set(tiles) - {DEFAULT, *tc.CANDIDATES}:
        ap.error(f"unknown configs {sorted(set(tiles) - {DEFAULT, *tc.CANDIDATES})}; known: {DEFAULT}, "
                 + ", ".join(tc.CANDIDATES))
    if not gpu and args.configs == "all":
        tiles = [DEFAULT, "64x64x32 s4 (2x2 warps)"]           # the emulator: a few compiles
    layers = [w for w in [*workloads.GEMM_LAYERS, *GROUPED] if w.name in names] if names else workloads.GEMM_LAYERS
    if args.batch:
        layers = [replace(w.with_batch(args.batch), name=f"{w.name}_b{args.batch}") for w in layers]
    shapes = {s.name: s for s in (w if gpu else w.small() for w in layers)}   # as measured

    print(f"# {cl.device()}")
    import pandas as pd

    df = pd.concat([measure_layer(w, tiles, splits, args.reps, args.backward) for w in layers], ignore_index=True)
    if not gpu:
        print("\n".join(st.checked_lines(df, label)))
        return 0
    print(f"# {results.provenance(df)}")
    for line in report(df, shapes):
        print(line)
    if not args.no_sass:
        names = {tile_name(dict(st.tunables(r, tc.TILE), SPLIT_K=1)) for _, r in st.ours(df).iterrows()}
        for line in sass_lines({n: tc.CANDIDATES[n] for n in tc.CANDIDATES if n in names}):
            print(line)
    results.save_benchmark(df, "tensor_core_layers" + (f"_b{args.batch}" if args.batch else ""), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
