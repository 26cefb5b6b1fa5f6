#!/usr/bin/env python3
"""Chapter 9's fp32 implicit GEMM (convlab.ops.igemm) on the standard ResNet/VGG layers
(convlab.measuring.workloads.GEMM_LAYERS): every tile and split-K candidate checked, then timed, against
torch at its best and chapter 5's best, through the book's harness (convlab.programs.measure).

    python benchmarks/f32_layers.py                         # every layer, every candidate
    python benchmarks/f32_layers.py --layers resnet_3x3_7,resnet_stem_7x7_s2
    python benchmarks/f32_layers.py --quick                 # igemm_config's choice only
    python benchmarks/f32_layers.py --any                   # also the grouped, dilated, 1x7 and 7x1 layers
    python benchmarks/f32_layers.py --out DIR               # CSV into DIR (default benchmarks/results)
    CONVLAB_BACKEND=emu python benchmarks/f32_layers.py     # emulator: small twins, config only, checks

Per layer: ours (igemm.IGEMM_F32) swept (measure.sweep) over igemm_config's choice and every
tile x split of TILES and SPLITS below; chapter 5's pick (fused.conv2d_best) and torch from
convlab.measuring.baselines (cudnn.benchmark on, TF32 off, NCHW and channels_last, each timed in a fresh
process, "torch best" the faster), through measure.run. Every output is first checked against an
fp64 reference: a wrong one stops the script. Each call of ours makes the K-major mask first (a
copy kept per weight tensor would miss changes made through w.data); the time to make it is also
a row of its own. The layers' gradients (--no-backward to skip): dX, dW and
forward+dX+dW, igemm_config's choice for each convolution, against torch's autograd.

Printed: each layer's rows; per layer, torch best beside igemm_config's choice, the best candidate
and chapter 5's best; geometric means of torch best / ours (above 1: ours faster); a TUNED table of
each layer's fastest candidate: paste it into convlab/ops/igemm.py (TUNED) to make igemm_config
choose those, or adjust the rule in igemm_config where the winners show a pattern.

On a GPU the rows (convlab.measuring.results' columns and the tunables BM ... SPLIT) go to
benchmarks/results/f32_layers_<GPU>.csv (--out: another folder).
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
from convlab.ops import Impl, ceil_div, fused, igemm  # noqa: E402
from convlab.programs import measure

# Tile candidates (BM, BN, BK, WM, WN, MIN_BLOCKS); each is tried with every split in SPLITS that
# leaves at least 4 steps per split (splits > 1 only where the tile grid is under 4 blocks per SM).
# MIN_BLOCKS caps the registers (65536 / (threads x MIN_BLOCKS)): 2 for 256 threads and 4 for 128
# both mean 128 per thread.
TILES = [
    (128, 128, 8, 32, 64, 2), (128, 128, 8, 32, 64, 1), (128, 128, 16, 32, 64, 1), (128, 128, 8, 64, 32, 2),
    (128, 64, 8, 32, 64, 1), (128, 64, 8, 32, 64, 4), (128, 64, 16, 32, 64, 1),
    (64, 128, 8, 32, 64, 1), (64, 128, 8, 32, 64, 4), (64, 128, 16, 32, 64, 1), (64, 64, 8, 32, 64, 1),
    (64, 64, 16, 64, 32, 1),
    (32, 128, 8, 32, 64, 1),
    (16, 128, 8, 16, 128, 1),           # one warp: for groups of 32 maps or fewer
]
SPLITS = (1, 2, 3, 4, 6, 8, 12)
TKEYS = ("BM", "BN", "BK", "WM", "WN", "MIN_BLOCKS")
CH5 = "chapter 5's best (fused.pick)"
MASK = "K-major mask (made in every call of ours)"


def train(x, w, dy, **conv):
    """forward, dX and dW by the three fp32 implicit-GEMM launchers in a row, igemm_config's choice
    for each convolution; conv: stride, padding, dilation, groups."""
    return (igemm.conv2d_igemm_f32(x, w, **conv),
            igemm.conv2d_igemm_f32_dx(dy, w, input_size=tuple(x.shape[2:]), **conv),
            igemm.conv2d_igemm_f32_dw(x, dy, kernel_size=tuple(w.shape[2:]), **conv))


def _trains(s) -> bool:
    return igemm.IGEMM_F32_DX.applies(s) and igemm.IGEMM_F32_DW.applies(s)


TRAIN = Impl("implicit GEMM fp32: forward + dX + dW", train, op="conv2d_train", applies=_trains, any_layer=True)
BACKWARD = (igemm.IGEMM_F32_DX, igemm.IGEMM_F32_DW, TRAIN)


def candidates(wl, sms: int, quick: bool) -> list[dict]:
    """igemm_config's choice first, then every tile x split worth trying on this layer."""
    cfg = igemm.igemm_config(wl)
    out = [cfg]
    if quick:
        return out
    for tile in TILES:
        t = dict(zip(TKEYS, tile))
        Mg = wl.M // wl.groups
        if t["BM"] > max(32, 2 * Mg) or (t["BM"] == 16 and Mg > 32):   # over half the tile's maps empty
            continue
        try:
            igemm.check_tunables(t["BM"], t["BN"], t["BK"], t["WM"], t["WN"])
        except ValueError:
            continue
        steps = ceil_div(wl.reduction, t["BK"])
        blocks = wl.groups * ceil_div(Mg, t["BM"]) * ceil_div(wl.B * wl.Ho * wl.Wo, t["BN"])
        out += [dict(t, SPLIT=s) for s in SPLITS if s == 1 or (blocks < 4 * sms and steps // s >= 4)]
    return [dict(c) for c in dict.fromkeys(tuple(sorted(c.items())) for c in out)]


def mask_row(wl, reps: int, roof) -> dict:
    """The K-major mask's one transposition (the order igemm_config's loader reads), a row of its own."""
    order = int(igemm.igemm_mode(wl, igemm.igemm_config(wl)["BK"]) == 1)
    w = cl.randn(*wl.w_shape)
    wt = igemm.kmajor(w, order, groups=wl.groups)
    m = measure.time_impl(lambda: igemm.kmajor(w, order, groups=wl.groups), reps)
    nbytes = 4 * (w.numel() + wt.numel())
    floor = roof.floor_ms(0, nbytes) if roof is not None else float("nan")
    return results.row(wl, MASK, m, roof=roof, gflops=0.0, gbs=nbytes / (m.ms * 1e-3) / 1e9, floor_ms=floor,
                       floor_frac=floor / m.ms)


def measure_layer(wl, reps: int, quick: bool, backward: bool, sms: int, roof):
    import pandas as pd

    small = wl if cl.backend() == "cuda" else wl.small()
    frames = [measure.sweep(igemm.IGEMM_F32, wl, candidates(small, sms, quick), reps=reps, roof=roof, desc=wl.name),
              measure.run([Impl(CH5, fused.conv2d_best)], [wl], reps=reps, roof=roof, desc=wl.name),
              results.frame([mask_row(small, reps, roof)])]
    if backward:
        frames.append(measure.run(BACKWARD, [wl], reps=reps, roof=roof, desc=wl.name))
    return pd.concat(frames, ignore_index=True)


def picks(shapes: dict) -> dict:
    """The summary's columns (name -> the row of a layer's rows it names). shapes: workload name ->
    the Workload measured."""
    def sweep(rows):
        return rows[rows["impl"] == igemm.IGEMM_F32.name]

    def config(rows):
        cfg = igemm.igemm_config(shapes[rows["workload"].iloc[0]])
        mine = sweep(rows)
        return st.fastest(mine[[st.tunables(r, igemm.TUNABLES) == cfg for _, r in mine.iterrows()]])

    return {"igemm_config": config, "chapter 5's best": lambda rows: st.fastest(rows[rows["impl"] == CH5]),
            "best candidate": lambda rows: st.fastest(sweep(rows))}


def text(r) -> str:
    c = st.tunables(r, igemm.TUNABLES)
    return "{BM}x{BN}x{BK} warp {WM}x{WN} minB {MIN_BLOCKS} split {SPLIT}".format(**c) if c else "igemm_config"


def label(r) -> str:
    return f"ours {text(r)}" if r["impl"] == igemm.IGEMM_F32.name else r["impl"]


def report(df, shapes: dict) -> list[str]:
    """Each layer's forward rows; the gradients; the summary per layer; geometric means; TUNED."""
    out = []
    fwd = df[df["pass"] == "forward"]
    for wl, rows in fwd.groupby("workload", sort=False):
        out += [f"\n## {wl}: {rows['shape'].iloc[0]}", st.layer_table(rows, label)]
    back = df[df["pass"] != "forward"]
    if len(back):
        out += st.gradient_lines(back, "gradients of the layers, igemm_config's choice for each convolution")
    cols = picks(shapes)
    table = st.versus(fwd, cols, label=text)
    out += ["", "# the forward pass per layer: GPU ms (torch best / ours: above 1, ours faster); the best candidate's "
            "config", st.show(table, cols), ""] + st.geomeans(table, cols)
    out += ["", "# TUNED: each layer's fastest candidate; paste into convlab/ops/igemm.py to make igemm_config use it",
            "TUNED = {"]
    for name, rows in fwd.groupby("workload", sort=False):
        best, s = cols["best candidate"](rows), shapes[name]
        if best is not None and s.plain:               # TUNED holds plain layers only
            key = (s.B, s.C, s.M, s.H, s.W, s.K, s.stride, s.padding)
            out.append(f"    {key}: {st.tunables(best, igemm.TUNABLES)},   # {name}: {best['ms']:.4f} ms")
    return out + ["}"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    known = [w.name for w in workloads.GEMM_LAYERS]
    others = [w for w in workloads.LAYERS if w.family != "depthwise" and w.name not in known]
    ap.add_argument("--layers", default="", help=f"comma-separated (default all: {', '.join(known)})")
    ap.add_argument("--any", action="store_true", help="also LAYERS' grouped, dilated and non-square ones: "
                    f"{', '.join(w.name for w in others)}")
    ap.add_argument("--quick", action="store_true", help="time igemm_config's choice only")
    ap.add_argument("--no-backward", action="store_true", help="leave out the layers' dX, dW and "
                    "forward+dX+dW")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default=None, help="folder for the CSV (default benchmarks/results)")
    args = ap.parse_args(argv)
    gpu = cl.backend() == "cuda"
    names = [n for n in args.layers.split(",") if n]
    pool = workloads.GEMM_LAYERS + (others if args.any else [])
    if set(names) - {w.name for w in pool}:
        ap.error(f"unknown layers {sorted(set(names) - {w.name for w in pool})}; known: "
                 f"{', '.join(w.name for w in pool)}")
    layers = [w for w in pool if not names or w.name in names]
    quick = args.quick or not gpu              # the emulator: the candidates' checks are the tests' job
    shapes = {s.name: s for s in (w if gpu else w.small() for w in layers)}   # as measured
    sms = cl.device().threads if gpu else igemm.SMS            # as igemm_config counts them
    roof = None
    if gpu:
        from convlab.measuring import roofline

        roof = roofline.current()

    print(f"# {cl.device()}")
    import pandas as pd

    df = pd.concat([measure_layer(w, args.reps, quick, not args.no_backward, sms, roof) for w in layers],
                   ignore_index=True)
    if not gpu:
        print("\n".join(st.checked_lines(df, label, ("pass",))))
        return 0
    print(f"# {results.provenance(df)}")
    for line in report(df, shapes):
        print(line)
    results.save_benchmark(df, "f32_layers", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
