#!/usr/bin/env python3
"""Chapter 10's networks from one image to 10,000, and LeNet-5's training step, ours against torch.

    python benchmarks/network_batches.py                  # the active backend (a GPU when there is one)
    python benchmarks/network_batches.py --out DIR        # CSV into DIR (default benchmarks/results)

- The whole forward pass (images on the device, logits left there) of the class project's network
  and LeNet-5 at B = 1, 10, 100, 1,000, 10,000: network.measure_networks (each contender checked
  against the fp64 torch network first), ours with fused stages and with the separate epilogue,
  and torch (cudnn.benchmark on, TF32 off): GPU ms (CUDA events, the GPU held), caller ms (what a
  caller waits, nothing held) and us of GPU time per image. Beside each batch, what the config
  functions chose for it: ops.fused_config per conv stage (UNROLL, MG, BLOCK) and ops.gemm_split
  per fully-connected layer.
- each fully-connected layer of both networks at FC_BATCHES, with each GEMM ops.linear has
  ("tiled": chapter 4's tile with the epilogue fused; "igemm": the layer as a 1x1 convolution by
  chapter 9's implicit GEMM), and the one ops.linear_gemm picks; and the project's deep FC layer by
  the implicit GEMM with each split of its reduction, at the pipeline's chunk sizes;
- LeNet-5's training step at batch 64 on the digits (network.train against network.train_torch,
  the same batches from the same weights): ms per step over STEPS steps, after a warm-up run, and
  leaving out the first epoch (TrainResult.step_ms: it compiles the kernels of the epoch's smaller
  last batch, and cudnn.benchmark tries its algorithms on it).

Writes benchmarks/results/network_batches_<GPU>.csv (the forward rows of convlab.measuring.results' schema)
and network_train_step_<GPU>.csv. On the emulator: the project's network at 30x30 and B = 1, 2,
checked, two training steps of batch 4; nothing timed for a figure, nothing written.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402

import convlab as cl  # noqa: E402
from convlab.measuring import results  # noqa: E402
from convlab.ops import layers as ops  # noqa: E402
from convlab.programs import network

BATCHES = (1, 10, 100, 1000, 10_000)
STEPS = 100             # LeNet-5 training steps timed (batch 64: about 4 epochs of the digits' training set)


def configs(arch, B: int) -> str:
    """What the config functions give this batch: each fused stage's tunables, each FC layer's split."""
    stages = [f"conv{i + 1} " + ",".join(f"{k}={v}" for k, v in ops.fused_config(wl).items())
              for i, wl in enumerate(arch.conv_workloads(B))]
    fcs = [f"fc{j + 1} " + ("GEMM=igemm" if ops.linear_gemm(B, i, o) == "igemm" else f"SPLIT={ops.gemm_split(B, o, i)}")
           for j, (i, o) in enumerate(arch.widths)]
    return "; ".join(stages + fcs)


def forward_rows(gpu: bool, reps: int):
    archs = (network.CLASS_PROJECT, network.LENET5) if gpu else (network.CLASS_PROJECT.at_size(30), network.LENET5)
    batches = BATCHES if gpu else (1, 2)
    frames = [network.measure_networks(arch, batches, reps=reps) for arch in archs]
    df = pd.concat(frames, ignore_index=True)
    df["B"] = df["shape"].str.extract(r"B=(\d+)")[0].astype(int)
    df["us per image"] = 1e3 * df["ms"] / df["B"]
    print(f"{'network':8s} {'B':>6s} {'contender':28s} {'GPU ms':>9s} {'caller ms':>10s} {'us/image':>9s}")
    for arch in archs:
        for B in batches:
            sub = df[(df["workload"] == arch.key) & (df["B"] == B)]
            for _, r in sub.iterrows():
                print(f"{arch.key:8s} {B:6d} {r['impl']:28s} {r['ms']:9.4f} {r['caller_ms']:10.4f} "
                      f"{r['us per image']:9.3f}")
            print(f"{'':15s} config: {configs(arch, B)}")
    return df


FC_BATCHES = (1, 64, 625, 1250, 2500, 10_000)   # the stream pipeline's chunks lie between 625 and 2,500


def fc_rows(gpu: bool, reps: int):
    """Each fully-connected layer of both networks at FC_BATCHES, with each of ops.linear's GEMMs
    (checked against fp64 first): GPU ms, and the one linear_gemm picks."""
    from convlab.programs import measure

    rows = []
    for arch in (network.CLASS_PROJECT, network.LENET5):
        for j, (fin, fout) in enumerate(arch.widths):
            act = "none" if j == len(arch.widths) - 1 else arch.act
            for N in (FC_BATCHES if gpu else (1, 3)):
                x, w, b = cl.randn(N, fin), cl.randn(fout, fin), cl.randn(fout)
                ref = ops.reference_linear(x, w, b, act)
                for gemm in ops.GEMMS:
                    fn = lambda gemm=gemm: ops.linear(x, w, bias=b, act=act, GEMM=gemm)  # noqa: E731
                    cl.check(fn(), ref, name=f"{arch.key} fc{j + 1} N={N} {gemm}")
                    t = measure.time_impl(fn, reps)
                    rows.append({"network": arch.key, "layer": f"fc{j + 1}", "in": fin, "out": fout, "N": N,
                                 "GEMM": gemm, "ms": t.ms, "caller_ms": t.caller_ms,
                                 "picked": gemm == ops.linear_gemm(N, fin, fout), "gpu": results.device_label(),
                                 "date": pd.Timestamp.now().date().isoformat()})
    df = pd.DataFrame(rows)
    print(f"\n{'network':8s} {'layer':5s} {'in->out':>10s} {'N':>6s} " + " ".join(f"{g + ' ms':>10s}" for g in ops.GEMMS)
          + "  picked")
    for (net, layer, fin, fout, N), sub in df.groupby(["network", "layer", "in", "out", "N"], sort=False):
        ms = sub.set_index("GEMM")["ms"]
        print(f"{net:8s} {layer:5s} {f'{fin}->{fout}':>10s} {N:6d} " + " ".join(f"{ms[g]:10.4f}" for g in ops.GEMMS)
              + f"  {sub[sub['picked']]['GEMM'].iloc[0]}")
    return df


FC_SPLITS = (1, 2, 4, 8, 12, 16, 24, 32, 48)
FC_SPLIT_BATCHES = (625, 1250, 2500)      # the stream pipeline's chunk sizes


def fc_split_rows(gpu: bool, reps: int):
    """The project's deep FC layer as the implicit GEMM runs it (a 1x1 convolution, igemm_config's
    tile) at the pipeline's chunk sizes, with each split of its reduction: checked, then GPU ms."""
    from convlab.programs import measure
    from convlab.ops import igemm
    from convlab.measuring.workloads import Workload

    fin, fout = network.CLASS_PROJECT.widths[0]
    frames = []
    for N in (FC_SPLIT_BATCHES if gpu else (3,)):
        wl = Workload(f"project_fc1_{N}", B=N, C=fin, M=fout, H=1, W=1, K=1)
        cfg = igemm.igemm_config(wl)
        df = measure.sweep(igemm.IGEMM_F32, wl, [dict(cfg, SPLIT=s) for s in FC_SPLITS], reps=reps, desc=wl.name)
        frames.append(df)
        ms = df.set_index("SPLIT")["ms"]
        print(f"{wl.name}: " + "  ".join(f"split {s}: {ms[s]:.4f}" + ("*" if s == cfg["SPLIT"] else "")
                                          for s in ms.index) + "   (* igemm_config's)")
    return pd.concat(frames, ignore_index=True)


def train_step_rows(gpu: bool, steps: int):
    """ms per LeNet-5 training step, ours and torch's, after a warm-up run of each."""
    arch = network.LENET5
    data = network.digits(arch.image_size)
    kw = dict(epochs=1_000, batch_size=64, max_steps=steps) if gpu else dict(epochs=1, batch_size=4, max_steps=2)
    if not gpu:
        data = data.subset(8, 8)
    rows = []
    for who, train in (("ours", network.train), ("torch", network.train_torch)):
        train(arch, data, **{**kw, "max_steps": min(5, kw["max_steps"])})     # compile, plan, cudnn.benchmark
        _, r = train(arch, data, **kw)
        rows.append({"network": arch.key, "who": who, "batch": kw["batch_size"], "steps": r.steps,
                     "ms per step": r.step_ms, "final loss": r.losses[-1],
                     "gpu": results.device_label(), "date": pd.Timestamp.now().date().isoformat()})
    df = pd.DataFrame(rows)
    ours, theirs = (df.set_index("who")["ms per step"][k] for k in ("ours", "torch"))
    print(f"\n# LeNet-5 training step, batch {kw['batch_size']}, {kw['max_steps']} steps: ours {ours:.3f} ms, "
          f"torch {theirs:.3f} ms per step ({ours / theirs:.2f}x torch's time)")
    return df


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--steps", type=int, default=STEPS, help="LeNet-5 training steps timed")
    ap.add_argument("--out", default=None, help="folder for the CSV files (default benchmarks/results)")
    args = ap.parse_args(argv)
    gpu = cl.backend() == "cuda"
    print(f"# {cl.device()}")
    fwd = forward_rows(gpu, args.reps)
    fc = fc_rows(gpu, args.reps)
    print("\n# the deep FC layer by the implicit GEMM, split by split (GPU ms)")
    splits = fc_split_rows(gpu, args.reps)
    train = train_step_rows(gpu, args.steps)
    if not gpu:
        print("# emulator: every contender checked against fp64; the times above say nothing about a GPU")
        return 0
    print(f"# {results.provenance(fwd)}")
    results.save_benchmark(fwd, "network_batches", args.out)
    results.save_benchmark(train, "network_train_step", args.out)
    results.save_benchmark(fc, "network_fc_layers", args.out)
    results.save_benchmark(splits, "network_fc_splits", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
