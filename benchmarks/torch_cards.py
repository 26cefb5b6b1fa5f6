#!/usr/bin/env python3
"""torch's profile cards of the call that "torch best" timed: for each fp32 torch card the chapters
show, torch.nn.functional.conv2d profiled under ncu as the book times torch (cudnn.benchmark on, so
cuDNN picks the algorithm it picked when it was timed; TF32 off in the profiled process; the
layout of the chapter's committed torch best row), by convlab.display.evidence.torch_best_card. Each card is
stored where the chapters read it (book/data/profiles/<name>.csv, as a GPU run of the chapter
stores it); a summary says, per card, the kernels torch best ran when it was timed (its row's
torch_kernels) against the kernels the card profiled, and whether they are the same.

    python benchmarks/torch_cards.py                  # on a GPU with ncu: the cards, and
                                                      # benchmarks/results/torch_cards_<GPU>.csv
    python benchmarks/torch_cards.py --out $OUT       # the summary into another folder
    CONVLAB_BACKEND=emu python benchmarks/torch_cards.py --emu-smoke --out /tmp/x   # committed cards

Pages that read them: book/02_naive.ipynb (ch2_torch), 03b_tiling_loses.ipynb (ch3_torch),
04_im2col.ipynb (ch4_torch), 05_fused.ipynb (ch5_torch_fa17, ch5_torch_resnet).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

NAME = "torch_cards"
#: card name -> (the chapter whose torch best row was timed, the layer)
CARDS = {"ch2_torch": ("02_naive", "lenet_c1"), "ch3_torch": ("03_tiled", "lenet_c3"),
         "ch4_torch": ("04_im2col", "lenet_c1"), "ch5_torch_fa17": ("05_fused", "fa17"),
         "ch5_torch_resnet": ("05_fused", "resnet")}


def measure(names):
    import pandas as pd

    import convlab as cl
    from convlab.display import evidence
    from convlab.measuring import workloads

    rows = []
    for name in names:
        chapter, layer = CARDS[name]
        wl = workloads.get(layer)
        x, w = (cl.randn(*wl.x_shape), cl.randn(*wl.w_shape)) if cl.backend() == "cuda" else (None, None)
        card = evidence.torch_best_card(name, chapter, layer, x, w, stride=wl.stride, padding=wl.padding)
        del x, w
        row = evidence.torch_best_row(chapter, layer)
        match = evidence.timed_kernel(card, row)
        rows.append({"card": name, "chapter": chapter, "workload": layer,
                     "timed kernels": " | ".join(match["timed"]) if match else "",
                     "profiled kernels": " | ".join(match["profiled"]) if match else "",
                     "same": bool(match and match["same"]),
                     "card us": match["card_us"] if match else None, "timed ms": match["timed_ms"] if match else None,
                     "card source": "" if card is None else card.source,
                     "gpu": cl.device().name if cl.backend() == "cuda" else "CPU emulator"})
        if cl.backend() == "cuda":
            import torch
            torch.cuda.empty_cache()
    return pd.DataFrame(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cards", nargs="*", default=list(CARDS), choices=list(CARDS))
    ap.add_argument("--out", type=Path, help="the folder for the summary CSV (default benchmarks/results)")
    ap.add_argument("--emu-smoke", action="store_true", help="on the emulator: the committed cards, compared")
    a = ap.parse_args(argv)
    import convlab as cl
    from convlab.measuring import results

    if cl.backend() != "cuda" and not a.emu_smoke:
        print("torch_cards profiles torch under ncu: run it on a GPU (or --emu-smoke on the emulator)")
        return 1
    df = measure(a.cards)
    print(df[["card", "same", "timed kernels", "profiled kernels"]].to_string(index=False))
    if cl.backend() == "cuda" or a.out:
        results.write_benchmark(df, NAME, a.out)
    return 0 if cl.backend() != "cuda" or df["same"].all() else 2


if __name__ == "__main__":
    sys.exit(main())
