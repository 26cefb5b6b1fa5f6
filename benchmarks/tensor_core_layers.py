#!/usr/bin/env python3
"""Time chapter 9's tensor-core convolution (convlab.ops.tensor_core.conv2d_mma, fp16, NHWC) on
the standard layers of ResNet/VGG-class networks, every candidate tile against torch (cuDNN).

    python benchmarks/tensor_core_layers.py                         # every layer, every candidate tile
    python benchmarks/tensor_core_layers.py --layers r3x3_28,stem7x7 --configs default
    python benchmarks/tensor_core_layers.py --batch 64 --out results/tc_b64   # another batch, another folder
    python benchmarks/tensor_core_layers.py --splits 2,3,4,8                  # more split-K depths
    CONVLAB_BACKEND=emu python benchmarks/tensor_core_layers.py     # emulator: tiny twins, checks only

Per layer: torch F.conv2d in fp16 with cudnn.benchmark on, in NCHW and in channels_last (input and
mask converted before timing: torch at its best layout); "torch best" the faster. Ours, for each
candidate tile of tensor_core.CANDIDATES, on the channels_last input (the same tensors torch's
channels_last row gets); for the tile mma_config picks, also on the NCHW input (the NCHW -> NHWC
conversion inside the call, so in its time). Split-K: each candidate whose grid is under two waves
(SMs x 2 blocks) is also timed split along K into each of --splits (the fp32 partials and their
reducing pass in the time). ratio = torch best / ours: above 1, ours is faster.
Each of our outputs is first checked against an fp64 reference on the first and the last image
(fp16_tolerance's bound); a failing row is marked FAIL, is not timed, and the script exits 1.
Times: cl.bench (CUDA events, warm-up, L2 flushed before each call, median of --reps).

At the end: the geometric mean of the ratio over the layers for mma_config's choice and for the
best candidate of each layer (what a better mma_config could reach), the best tile per layer, and
the SASS of the main loop (HMMA, LDSM, LDGSTS, BAR counts per iteration, and all instructions: the
ones that are not HMMA/LDSM are the loop's overhead) and registers of each tile.
To change the choice: edit the PREFERENCE tuples / preference() / BLOCKS_PER_SM / MIN_STEPS_PER_SPLIT in
convlab/ops/tensor_core.py (mma_config), or pass --configs.

Output: the printed table, and a CSV of every row (with the GPU, versions and date) in --out
(default benchmarks/results/ on a GPU, .convlab-cache/ on the emulator).
"""
from __future__ import annotations

import argparse
import csv
import datetime as dt
import math
import sys
import zlib
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import convlab as cl  # noqa: E402
from convlab.baselines import strict_fp32, versions  # noqa: E402
from convlab.ops import tensor_core as tc  # noqa: E402
from convlab.ops.fp16 import fp16_tolerance  # noqa: E402
from convlab.workloads import Workload  # noqa: E402

DEFAULT = "default"     # the --configs name of mma_config's choice


@dataclass(frozen=True)
class Layer:
    name: str
    B: int
    C: int
    M: int
    H: int
    K: int
    stride: int = 1
    padding: int = 0

    @property
    def Ho(self) -> int:
        return (self.H + 2 * self.padding - self.K) // self.stride + 1

    @property
    def flops(self) -> int:
        return 2 * self.B * self.Ho * self.Ho * self.M * self.C * self.K * self.K

    def workload(self) -> Workload:
        return Workload(self.name, B=self.B, C=self.C, M=self.M, H=self.H, W=self.H, K=self.K,
                        stride=self.stride, padding=self.padding)

    def small(self) -> "Layer":
        """The emulator's twin: B=1, at most 16 channels each way, at most 9x9 (the stem: its 3 channels,
        7x7 mask and stride)."""
        return replace(self, name=self.name + "_small", B=1, C=min(self.C, 16), M=min(self.M, 16),
                       H=min(self.H, 9 if self.stride == 1 else 15))

    def text(self) -> str:
        s = f"B={self.B} {self.C}->{self.M} {self.H}x{self.H} k{self.K}"
        return s + (f" s{self.stride}" if self.stride > 1 else "") + (f" p{self.padding}" if self.padding else "")


LAYERS = [
    Layer("r3x3_56", 32, 64, 64, 56, 3, padding=1),          # ResNet-18/34 stage 1
    Layer("r3x3_28", 32, 128, 128, 28, 3, padding=1),        # stage 2
    Layer("r3x3_14", 32, 256, 256, 14, 3, padding=1),        # stage 3
    Layer("r3x3_7", 32, 512, 512, 7, 3, padding=1),          # stage 4
    Layer("r1x1_56_256to64", 32, 256, 64, 56, 1),            # ResNet-50 bottleneck, reduce
    Layer("r1x1_56_64to256", 32, 64, 256, 56, 1),            # ... expand
    Layer("r1x1_14_1024to256", 32, 1024, 256, 14, 1),        # stage 3 reduce
    Layer("vgg3x3_56", 16, 256, 256, 56, 3, padding=1),      # VGG-16 conv3_x
    Layer("stem7x7", 32, 3, 64, 224, 7, stride=2, padding=3),   # ResNet stem (C=3: padded to 8)
]


def check(y, x, w, lay: Layer) -> str:
    """'ok' or 'FAIL: ...': y's first and last images against fp64 of the same half inputs."""
    idx = [0, lay.B - 1] if lay.B > 1 else [0]
    ref = F.conv2d(x[idx].double(), w.double(), stride=lay.stride, padding=lay.padding)
    rtol, atol_rms = fp16_tolerance(lay.C * lay.K * lay.K, 1, accumulate="float", rounded_inputs=True)
    atol = atol_rms * max(float(ref.pow(2).mean().sqrt()), 1e-30)
    res = cl.check(y[idx], ref, rtol=rtol, atol=atol, name="y", raise_on_error=False)
    return "ok" if isinstance(res, cl.CheckResult) else "FAIL: " + str(res).splitlines()[0][:200]


def tflops(lay: Layer, ms: float) -> float:
    return lay.flops / (ms * 1e-3) / 1e12


def split_runs(lay: Layer, tiles: dict, splits: list[int]) -> list[tuple[str, dict]]:
    """(label, tunables) of each tile split along K into each of `splits`, for tiles whose grid is under
    two waves of blocks (more blocks already keep every SM busy) and splits that leave each block at
    least one BK step."""
    P, K = lay.B * lay.Ho * lay.Ho, lay.K * lay.K * -(-lay.C // 8) * 8
    out = []
    for name, t in tiles.items():
        blocks = -(-P // t["BM"]) * -(-lay.M // t["BN"])
        if blocks < 2 * tc.SMS:
            out += [(f"{name} split {k}", dict(t, SPLIT_K=k)) for k in splits if k <= -(-K // t["BK"])]
    return out


def bench_layer(lay: Layer, configs: list[str], splits: list[int], reps: int, log) -> list[dict]:
    dev = cl.device().torch_device
    gen = torch.Generator(device=dev).manual_seed(zlib.crc32(lay.name.encode()))
    x = torch.randn(lay.B, lay.C, lay.H, lay.H, device=dev, generator=gen).half()
    w = torch.randn(lay.M, lay.C, lay.K, lay.K, device=dev, generator=gen).half()
    xc, wc = x.to(memory_format=torch.channels_last), w.to(memory_format=torch.channels_last)
    kw = dict(stride=lay.stride, padding=lay.padding)
    base = {"layer": lay.name, "shape": lay.text(), "gflop": lay.flops / 1e9}
    rows = []
    with strict_fp32(benchmark=True):
        t_nchw = cl.bench(lambda: F.conv2d(x, w, **kw), reps=reps).ms
        t_nhwc = cl.bench(lambda: F.conv2d(xc, wc, **kw), reps=reps).ms
    best = min(t_nchw, t_nhwc)
    for name, t in (("torch NCHW", t_nchw), ("torch channels_last", t_nhwc)):
        rows.append({**base, "impl": name, "tile": "", "input": name.split()[1], "check": "ok", "ms": t,
                     "tflops": tflops(lay, t), "torch_best_ms": best, "ratio": best / t})
        log(rows[-1])
    chosen = tc.mma_config(lay.workload())
    chosen_name = _tile_name(chosen)
    tiles = {n: dict(tc.CANDIDATES[n], SPLIT_K=1) for n in configs if n != DEFAULT}
    runs = [(n, t, xc) for n, t in tiles.items()] + [(n, t, xc) for n, t in split_runs(lay, tiles, splits)]
    if chosen not in [t for _, t, _ in runs]:
        runs.insert(0, (chosen_name, chosen, xc))
    runs.append((chosen_name, chosen, x))                  # the NCHW input, conversion included
    for label, t, xin in runs:
        layout = "channels_last" if xin is xc else "NCHW (converted in the call)"
        row = {**base, "impl": "ours mma.sync", "tile": label, "input": layout, "chosen": int(t == chosen)}
        try:
            status = check(tc.conv2d_mma(xin, wc, **kw, **t), x, w, lay)
        except (ValueError, cl.ConvlabError) as e:
            status = f"FAIL: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
        row["check"] = status
        if status == "ok":
            ms = cl.bench(lambda: tc.conv2d_mma(xin, wc, **kw, **t), reps=reps).ms
            row.update(ms=ms, tflops=tflops(lay, ms), torch_best_ms=best, ratio=best / ms)
        rows.append(row)
        log(row)
    return rows


def _tile_name(t: dict) -> str:
    tile = {k: t[k] for k in tc.TILE}
    split = f" split {t['SPLIT_K']}" if t.get("SPLIT_K", 1) > 1 else ""
    for name, c in tc.CANDIDATES.items():
        if c == tile:
            return name + split
    return "BM={BM} BN={BN} BK={BK} warps {WARPS_M}x{WARPS_N} s{STAGES}".format(**t) + split


HEADER = f"{'layer':<24} {'contender':<44} {'input':<14} {'ms':>8} {'TFLOP/s':>8} {'ratio':>7}  check"


def fmt(r) -> str:
    who = r["impl"] if not r["tile"] else r["tile"]
    mark = " *" if r.get("chosen") else ""
    ms, tf, ratio = (r.get(k, float("nan")) for k in ("ms", "tflops", "ratio"))
    return (f"{r['layer']:<24} {who + mark:<44} {r['input'][:14]:<14} {ms:>8.4f} {tf:>8.1f} {ratio:>6.2f}x  "
            f"{r['check']}")


def geomean(v) -> float:
    return math.exp(sum(map(math.log, v)) / len(v)) if v else float("nan")


def summary(rows) -> list[str]:
    ours = [r for r in rows if r["impl"].startswith("ours") and r["check"] == "ok"]
    layers = list(dict.fromkeys(r["layer"] for r in rows))
    chosen = {r["layer"]: r for r in ours if r["chosen"] and r["input"] == "channels_last"}
    chosen_nchw = {r["layer"]: r for r in ours if r["chosen"] and r["input"] != "channels_last"}
    best = {}
    for r in ours:
        if r["input"] == "channels_last" and (r["layer"] not in best or r["ms"] < best[r["layer"]]["ms"]):
            best[r["layer"]] = r
    out = ["", "# ratio = torch best (the faster of cuDNN NCHW / channels_last, fp16, cudnn.benchmark) / ours;"
           " above 1: ours faster",
           f"# {'layer':<24} {'torch best ms':>13} {'mma_config ms':>13} {'ratio':>6} {'NCHW in':>7}  "
           f"{'best tile (ms, ratio)':<48}"]
    for name in layers:
        c, b, n = chosen.get(name), best.get(name), chosen_nchw.get(name)
        if c is None or b is None:
            out.append(f"# {name:<24} (no passing row)")
            continue
        out.append(f"# {name:<24} {c['torch_best_ms']:>13.4f} {c['ms']:>13.4f} {c['ratio']:>5.2f}x "
                   f"{n['ratio'] if n else float('nan'):>6.2f}x  {b['tile']} ({b['ms']:.4f} ms, {b['ratio']:.2f}x)")
    out.append(f"# geometric mean of the ratio over {len(chosen)} layers: mma_config's tile "
               f"{geomean([r['ratio'] for r in chosen.values()]):.3f}x (channels_last input), "
               f"{geomean([r['ratio'] for r in chosen_nchw.values()]):.3f}x (NCHW input, conversion included); "
               f"best candidate per layer {geomean([r['ratio'] for r in best.values()]):.3f}x")
    return out


def sass_lines(configs: dict) -> list[str]:
    """Opcode counts in conv2d_mma's main loop (the innermost loop with an HMMA) of each tile, and
    registers. SPLIT_K does not change the code: it is the grid's y."""
    from convlab.ops._kernels import module

    out = ["", "# SASS of conv2d_mma's main loop (one iteration = one BK-deep step), sm_90, per tile:",
           f"# {'tile':<44} {'HMMA':>5} {'LDSM':>5} {'LDGSTS':>6} {'BAR':>4} {'all':>5} {'other':>5} {'regs':>5}"]
    for name, t in configs.items():
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


def meta() -> dict:
    v, dev = versions(), cl.device()
    return {"backend": dev.backend, "gpu": dev.name if dev.backend == "cuda" else "CPU emulator",
            "torch": v["torch"], "cudnn": v["cudnn"], "dtype": "fp16", "cudnn_benchmark": "on",
            "date": dt.date.today().isoformat(),
            "timing": "GPU: CUDA events, L2 flushed, median" if dev.backend == "cuda"
            else "emulator wall time, NOT a GPU timing"}


def save(rows, m, out_dir: str | None, on_gpu: bool, batch: int | None) -> Path:
    folder = Path(out_dir) if out_dir else (ROOT / "benchmarks" / "results" if on_gpu else ROOT / ".convlab-cache")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"tensor_core_layers_{m['backend']}{f'_b{batch}' if batch else ''}.csv"
    fields = list(dict.fromkeys(k for r in rows for k in r)) + list(m)
    with open(path, "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=fields)
        wr.writeheader()
        for r in rows:
            wr.writerow({**r, **m})
    return path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", default="", help="comma-separated layer names (default all: "
                    + ", ".join(lay.name for lay in LAYERS) + ")")
    ap.add_argument("--configs", default="all", help=f"'all' (mma_config's choice and every candidate), "
                    f"'{DEFAULT}', or comma-separated names of tensor_core.CANDIDATES")
    ap.add_argument("--splits", default="2,4", help="SPLIT_K depths to time for tiles with under two waves "
                    "of blocks (comma-separated; '' for none)")
    ap.add_argument("--batch", type=int, default=None, help="batch size for every layer (default: each layer's)")
    ap.add_argument("--reps", type=int, default=None, help="timed runs per contender (GPU default 20, emulator 1)")
    ap.add_argument("--out", default=None, help="folder for the CSV (default benchmarks/results/ on a GPU)")
    ap.add_argument("--no-sass", action="store_true", help="skip the SASS counts")
    args = ap.parse_args(argv)

    dev = cl.device()
    on_gpu = dev.backend == "cuda"
    reps = args.reps or (20 if on_gpu else 1)
    names = [n for n in args.layers.split(",") if n]
    unknown = set(names) - {lay.name for lay in LAYERS}
    if unknown:
        ap.error(f"unknown layers {sorted(unknown)}")
    splits = [int(k) for k in args.splits.split(",") if k]
    configs = [DEFAULT] + list(tc.CANDIDATES) if args.configs == "all" else [c for c in args.configs.split(",") if c]
    unknown = set(configs) - {DEFAULT, *tc.CANDIDATES}
    if unknown:
        ap.error(f"unknown configs {sorted(unknown)}; known: {DEFAULT}, " + ", ".join(tc.CANDIDATES))
    layers = [lay for lay in LAYERS if not names or lay.name in names]
    if args.batch:
        layers = [replace(lay, B=args.batch) for lay in layers]
    if not on_gpu:
        layers = [lay.small() for lay in layers]
        configs = [DEFAULT, "64x64x32 s4 (2x2 warps)"] if args.configs == "all" else configs   # a few compiles
    m = meta()
    print(f"# {dev}")
    print(f"# torch {m['torch']}, cuDNN {m['cudnn']}, fp16 in and out, cudnn.benchmark on, {m['date']}; "
          f"{m['timing']}, {reps} reps")
    print(f"# ours: kernels/09_general/conv2d_mma.cu; '*' marks the tile mma_config picks for the layer "
          f"(timed on both inputs)")
    if not on_gpu:
        print("# EMULATOR: tiny twins, wall times of a CPU emulator: these are checks, NOT GPU timings")
    print(HEADER)
    rows = []
    for lay in layers:
        rows += bench_layer(lay, configs, splits, reps, lambda r: print(fmt(r), flush=True))
    for line in summary(rows):
        print(line)
    if not args.no_sass:
        tiles = {r["tile"].split(" split ")[0] for r in rows if r["impl"].startswith("ours")}
        for line in sass_lines({t: tc.CANDIDATES[t] for t in tc.CANDIDATES if t in tiles}):
            print(line)
    print(f"# wrote {save(rows, m, args.out, on_gpu, args.batch)}")
    bad = [r for r in rows if r["check"] != "ok"]
    for r in bad:
        print("# FAILED its check: " + fmt(r))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
