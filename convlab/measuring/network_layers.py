"""Every convolution of five networks people train and run today, as the papers' architecture
tables give them, at 224x224 images (a diffusion UNet at 512x512 pixels, 64x64 latents):

- "resnet50": ResNet-50 (He et al. 2016, table 1; the stride on the 3x3 of each stage's first
  block, as torchvision's v1.5 has it), its 1x1 projection shortcuts included;
- "vgg16": VGG-16 (Simonyan & Zisserman 2015, configuration D);
- "mobilenetv3": MobileNetV3-Large (Howard et al. 2019, table 1): the stem, each bneck's 1x1
  expansion (none where it would not expand), depthwise and 1x1 projection, the squeeze-and-excite
  1x1 convolutions (on 1x1 maps; squeezed to a quarter of the expansion, rounded to a multiple of
  8 as torchvision does), the last 1x1 layer and the two 1x1 layers of the head (NBN);
- "efficientnet_b0": EfficientNet-B0 (Tan & Le 2019, table 1): the stem, each MBConv's expansion
  (MBConv1: none), depthwise, squeeze-and-excite (a quarter of the block's input channels) and
  projection, and the 1x1 head;
- "unet_resblocks": the residual blocks of Stable Diffusion v1.5's UNet (Rombach et al. 2022;
  channels 320, 640, 1280, 1280 at 64, 32, 16, 8 latents; two blocks a level down, one pair in
  the middle, three a level up on the skip connections' concatenation): each block's two 3x3
  convolutions and its 1x1 shortcut where the channels change.

A layer is (C, M, H, K, stride, groups) on an H x H input, padding K // 2. layers(net, B) gives
each distinct layer once, as a Workload named after what it is, with how often the network has
it (count); all_layers(net, B) every layer in order. macs(net) is what the papers quote.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .workloads import Workload

NETWORKS = ("resnet50", "vgg16", "mobilenetv3", "efficientnet_b0", "unet_resblocks")


def _resnet50() -> list:
    out = [(3, 64, 224, 7, 2, 1)]
    C, H = 64, 56                                    # after the stem and its 3x3 max-pool, stride 2
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for b in range(blocks):
            s = stride if b == 0 else 1
            out += [(C, width, H, 1, 1, 1), (width, width, H, 3, s, 1), (width, 4 * width, H // s, 1, 1, 1)]
            if b == 0:                               # the projection shortcut
                out.append((C, 4 * width, H, 1, s, 1))
            C, H = 4 * width, H // s
    return out


#: VGG-16 (D): (maps, 3x3 layers) per stage, a 2x2 max-pool after each
_VGG16 = ((64, 2), (128, 2), (256, 3), (512, 3), (512, 3))


def _vgg16() -> list:
    out, C, H = [], 3, 224
    for M, n in _VGG16:
        for _ in range(n):
            out.append((C, M, H, 3, 1, 1))
            C = M
        H //= 2
    return out


def _divisible8(v: float) -> int:
    """torchvision's _make_divisible(v, 8): the nearest multiple of 8, never below 90% of v."""
    n = max(8, int(v + 4) // 8 * 8)
    return n + 8 if n < 0.9 * v else n


#: MobileNetV3-Large's bnecks (table 1): (kernel, expansion, out, squeeze-and-excite, stride)
_MOBILENETV3 = ((3, 16, 16, False, 1), (3, 64, 24, False, 2), (3, 72, 24, False, 1), (5, 72, 40, True, 2),
                (5, 120, 40, True, 1), (5, 120, 40, True, 1), (3, 240, 80, False, 2), (3, 200, 80, False, 1),
                (3, 184, 80, False, 1), (3, 184, 80, False, 1), (3, 480, 112, True, 1), (3, 672, 112, True, 1),
                (5, 672, 160, True, 2), (5, 960, 160, True, 1), (5, 960, 160, True, 1))


def _mobilenetv3() -> list:
    out, C, H = [(3, 16, 224, 3, 2, 1)], 16, 112
    for K, E, M, se, s in _MOBILENETV3:
        if E != C:
            out.append((C, E, H, 1, 1, 1))
        out.append((E, E, H, K, s, E))
        H //= s
        if se:
            q = _divisible8(E / 4)
            out += [(E, q, 1, 1, 1, 1), (q, E, 1, 1, 1, 1)]
        out.append((E, M, H, 1, 1, 1))
        C = M
    return out + [(160, 960, 7, 1, 1, 1), (960, 1280, 1, 1, 1, 1), (1280, 1000, 1, 1, 1, 1)]


#: EfficientNet-B0's stages (table 1): (MBConv expansion, kernel, stride, out, layers)
_EFFICIENTNET_B0 = ((1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3), (6, 5, 1, 112, 3),
                    (6, 5, 2, 192, 4), (6, 3, 1, 320, 1))


def _efficientnet_b0() -> list:
    out, C, H = [(3, 32, 224, 3, 2, 1)], 32, 112
    for e, K, stride, M, n in _EFFICIENTNET_B0:
        for i in range(n):
            s, E = (stride if i == 0 else 1), C * e
            if e != 1:
                out.append((C, E, H, 1, 1, 1))
            out.append((E, E, H, K, s, E))
            H //= s
            q = max(1, C // 4)
            out += [(E, q, 1, 1, 1, 1), (q, E, 1, 1, 1, 1), (E, M, H, 1, 1, 1)]
            C = M
    return out + [(320, 1280, 7, 1, 1, 1)]


#: Stable Diffusion v1.5's UNet: channels per level, the latents' side at each
_UNET_LEVELS = ((320, 64), (640, 32), (1280, 16), (1280, 8))


def _resblock(C: int, M: int, H: int) -> list:
    return [(C, M, H, 3, 1, 1), (M, M, H, 3, 1, 1)] + ([(C, M, H, 1, 1, 1)] if C != M else [])


def _unet_resblocks() -> list:
    out, skips, C = [], [320], 320                   # conv_in's 320 channels are the first skip
    for level, (M, H) in enumerate(_UNET_LEVELS):
        for _ in range(2):
            out += _resblock(C, M, H)
            C = M
            skips.append(C)
        if level < len(_UNET_LEVELS) - 1:
            skips.append(C)                          # the downsampler's output
    out += _resblock(C, C, 8) * 2                    # the middle block
    for M, H in reversed(_UNET_LEVELS):
        for _ in range(3):
            out += _resblock(C + skips.pop(), M, H)
            C = M
    return out


_LAYERS = {"resnet50": _resnet50, "vgg16": _vgg16, "mobilenetv3": _mobilenetv3, "efficientnet_b0": _efficientnet_b0,
           "unet_resblocks": _unet_resblocks}
_SHORT = {"resnet50": "r50", "vgg16": "vgg16", "mobilenetv3": "mbv3", "efficientnet_b0": "effb0",
          "unet_resblocks": "unet"}


def _name(net: str, C: int, M: int, H: int, K: int, stride: int, groups: int) -> str:
    kind = f"dw{K}_{C}" if groups == C > 1 else f"{K}x{K}_{C}to{M}"
    return f"{_SHORT[net]}_{kind}_{H}" + (f"_s{stride}" if stride > 1 else "")


def all_layers(net: str, B: int) -> list:
    """Every convolution of the network, in order, as Workloads at batch B."""
    if net not in _LAYERS:
        raise KeyError(f"no network {net!r}; there are: {', '.join(NETWORKS)}")
    return [Workload(_name(net, C, M, H, K, s, g), B=B, C=C, M=M, H=H, W=H, K=K, stride=s, padding=K // 2,
                     groups=g, note=net) for C, M, H, K, s, g in _LAYERS[net]()]


def layers(net: str, B: int) -> list:
    """[(Workload, count)]: each distinct convolution of the network once, in order of first
    appearance, with how many times the network has it."""
    counts: dict = {}
    for wl in all_layers(net, B):
        counts[wl] = counts.get(wl, 0) + 1
    return list(counts.items())


def macs(net: str) -> int:
    """Multiply-adds of all the network's convolutions for one image."""
    return sum(wl.macs for wl in all_layers(net, 1))


def per_layer(df):
    """The drop-in's rows of a benchmarks/dropin_networks.py results file (its check passed),
    each with torch best's caller and GPU time on the same layer, dtype, pass and batch (the
    faster of torch's layouts, in the same run) and the ratios torch best / ours (above 1: ours
    faster): columns caller and gpu."""
    keys = ["network", "layer", "dtype", "pass", "B"]
    torch_best = (df[df["who"] == "torch"].groupby(keys)[["caller_ms", "gpu_ms"]].min()
                  .rename(columns={"caller_ms": "torch_caller_ms", "gpu_ms": "torch_gpu_ms"}))
    ours = df[(df["who"] == "ours") & (df["check"] == "pass")].join(torch_best, on=keys).dropna(subset=["caller_ms"])
    return ours.assign(caller=ours["torch_caller_ms"] / ours["caller_ms"], gpu=ours["torch_gpu_ms"] / ours["gpu_ms"])


def summary(df):
    """Per network, dtype, pass, batch and layout of ours: the geometric mean over its layers (each
    as often as the network has it) of torch best / ours, caller and GPU time (above 1: ours
    faster), the layers measured, the lowest per-layer caller ratio and the layers handed to torch."""
    rows = []
    for (net, dtype, pass_, B, layout), g in per_layer(df).groupby(["network", "dtype", "pass", "B", "layout"],
                                                                   sort=False):
        wgt = g["count"].to_numpy(float)
        rows.append(dict(network=net, dtype=dtype, pass_=pass_, B=B, layout=layout, layers=len(g),
                         caller=float(np.exp((wgt * np.log(g["caller"])).sum() / wgt.sum())),
                         gpu=float(np.exp((wgt * np.log(g["gpu"])).sum() / wgt.sum())),
                         worst=float(g["caller"].min()),
                         fallback=int(g["kernel"].str.startswith("torch:").sum())))
    return pd.DataFrame(rows).rename(columns={"pass_": "pass"})
