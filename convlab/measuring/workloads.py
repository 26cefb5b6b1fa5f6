"""The workloads every chapter times: the design's table, with their FLOPs and bytes, and chapter
9's table of the layers modern networks have (LAYERS: depthwise, grouped, dilated, non-square);
the benchmarks' sets: GEMM_LAYERS (the standard ResNet/VGG layers chapter 9's implicit GEMMs are
tuned on) and DEPTHWISE_LAYERS (the depthwise kernels' sweep).

Shapes come from the course material. Compare only figures taken on the same GPU. Each workload
has a ``small()`` twin with the same character (channels and groups, kernel size, stride,
padding, dilation) but a batch of 2 and a cut spatial size, so the emulator can run and check it
in well under a second.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

FP32_BYTES = 4


def pair(v) -> tuple:
    """An int or a 1- or 2-sequence as (height, width), as torch reads stride, padding, dilation."""
    v = tuple(int(e) for e in v) if isinstance(v, (list, tuple)) else (int(v),)
    if len(v) not in (1, 2):
        raise ValueError(f"expected an int or (height, width), got {v}")
    return v * 2 if len(v) == 1 else v


@dataclass(frozen=True)
class Workload:
    """One convolution layer: input (B, C, [D,] H, W), weights (M, C/groups, K, Kw) (or (M, C, K, K, K)),
    NCHW.

    ``D`` is None for 2D layers; for a 3D layer the kernel is K×K×K over (D, H, W). A 2D layer may
    have what torch's conv2d takes: a non-square mask, per-axis stride, padding and dilation, and
    groups. K, stride, padding and dilation accept an int or a (height, width) pair; each is kept
    as its height value (K, stride, ...) and its width value (Kw, stride_w, ...), so the chapters'
    square layers read K, stride and padding as before. ``plain`` says whether a layer is one of
    those (the chapters' own kernels take only these).
    """

    name: str
    B: int
    C: int
    M: int
    H: int
    W: int
    K: int
    stride: int = 1
    padding: int = 0
    note: str = ""
    D: int | None = None
    dilation: int = 1
    groups: int = 1
    Kw: int | None = None           # None: K (a square mask); likewise the other widths
    stride_w: int | None = None
    padding_w: int | None = None
    dilation_w: int | None = None
    #: padding at the bottom and right where it differs from the top and left (torch's 'same'
    #: with an even mask pads one more at the end); None: the same as padding, padding_w
    padding_end: int | None = None
    padding_w_end: int | None = None

    def __post_init__(self):
        # (height, width) pairs split into the height field and its _w twin; None widths = heights
        for h, w in (("K", "Kw"), ("stride", "stride_w"), ("padding", "padding_w"), ("dilation", "dilation_w")):
            v = getattr(self, h)
            if isinstance(v, (list, tuple)):
                vh, vw = pair(v)
                if getattr(self, w) is not None and getattr(self, w) != vw:
                    raise ValueError(f"{h}={v} and {w}={getattr(self, w)} disagree")
                object.__setattr__(self, h, vh)
                object.__setattr__(self, w, vw)
            elif getattr(self, w) is None:
                object.__setattr__(self, w, v)
        for end, start in (("padding_end", "padding"), ("padding_w_end", "padding_w")):
            if getattr(self, end) is None:
                object.__setattr__(self, end, getattr(self, start))
        if self.D is not None and not self.plain:
            raise ValueError(f"{self.name}: a 3D workload has a cubic mask, one stride and padding, no groups")
        if self.groups < 1 or self.C % self.groups or self.M % self.groups:
            raise ValueError(f"{self.name}: groups={self.groups} must divide C={self.C} and M={self.M}")

    @classmethod
    def of(cls, x, w, stride=1, padding=0, name: str = "", dilation=1, groups: int = 1) -> "Workload":
        """The layer of input x and mask w: x (B, C, H, W) and w (M, C/groups, Kh, Kw); or x (B, C, D, H, W)
        and w (M, C, K, K, K); or a single channel x (D, H, W) and w (K, K, K). stride, padding and
        dilation: an int or a (height, width) pair."""
        xs, ws = tuple(int(s) for s in x.shape), tuple(int(s) for s in w.shape)
        if len(xs) == 3 and len(ws) == 3:
            xs, ws = (1, 1, *xs), (1, 1, *ws)
        if len(xs) not in (4, 5) or len(ws) != len(xs):
            raise ValueError(f"expected x (B, C, [D,] H, W) and w (M, C, Kh, Kw[, K]), got {xs} and {ws}")
        if ws[1] * groups != xs[1] or (len(xs) == 5 and len(set(ws[2:])) != 1):
            raise ValueError(f"w {ws} does not fit x {xs}: need (M, {xs[1]}/groups) and a cubic mask in 3D")
        D = xs[2] if len(xs) == 5 else None
        return cls(name, B=xs[0], C=xs[1], M=ws[0], H=xs[-2], W=xs[-1], K=ws[2:4] if D is None else ws[-1],
                   stride=stride, padding=padding, D=D, dilation=dilation, groups=int(groups))

    @property
    def dims(self) -> int:
        return 2 if self.D is None else 3

    @property
    def plain(self) -> bool:
        """One group, no dilation, a square mask, one stride and one padding for both axes: the
        layers of chapters 1-8, which their kernels take."""
        return (self.groups == 1 and self.dilation == self.dilation_w == 1 and self.K == self.Kw
                and self.stride == self.stride_w and self.padding == self.padding_w and self.symmetric)

    @property
    def symmetric(self) -> bool:
        """As much padding at the bottom and right as at the top and left (what torch's int and pair
        forms of padding give, and what conv_kwargs() can say)."""
        return self.padding_end == self.padding and self.padding_w_end == self.padding_w

    @property
    def family(self) -> str:
        """What kind of layer: depthwise (groups = C > 1), grouped, dilated, nonsquare or standard."""
        if self.groups > 1:
            return "depthwise" if self.groups == self.C else "grouped"
        if max(self.dilation, self.dilation_w) > 1:
            return "dilated"
        return "nonsquare" if self.K != self.Kw else "standard"

    @staticmethod
    def _out(n: int, K: int, stride: int, padding: int, dilation: int = 1, padding_end: int | None = None) -> int:
        end = padding if padding_end is None else padding_end
        return (n + padding + end - dilation * (K - 1) - 1) // stride + 1

    @property
    def Do(self) -> int | None:
        return None if self.D is None else self._out(self.D, self.K, self.stride, self.padding)

    @property
    def Ho(self) -> int:
        return self._out(self.H, self.K, self.stride, self.padding, self.dilation, self.padding_end)

    @property
    def Wo(self) -> int:
        return self._out(self.W, self.Kw, self.stride_w, self.padding_w, self.dilation_w, self.padding_w_end)

    @property
    def kernel_size(self):
        """K for a square mask (what the chapters' dW launchers take), else (Kh, Kw)."""
        return self.K if self.K == self.Kw else (self.K, self.Kw)

    def conv_kwargs(self) -> dict:
        """The keyword arguments of torch's conv2d (and of the launchers) for this layer: stride and
        padding as ints where both axes agree, dilation and groups only where they are not 1 (so a
        plain layer gives the chapters' launchers exactly what they take)."""
        def one(h, w):
            return h if h == w else (h, w)

        kw = {"stride": one(self.stride, self.stride_w), "padding": one(self.padding, self.padding_w)}
        if not self.symmetric:       # only torch's 'same' pads more at the end than at the start
            if (self.stride, self.stride_w, self.Ho, self.Wo) != (1, 1, self.H, self.W):
                raise ValueError(f"{self}: padding {self.padding}/{self.padding_end} (top/bottom), "
                                 f"{self.padding_w}/{self.padding_w_end} (left/right) is no torch argument")
            kw["padding"] = "same"
        if (self.dilation, self.dilation_w) != (1, 1):
            kw["dilation"] = one(self.dilation, self.dilation_w)
        if self.groups != 1:
            kw["groups"] = self.groups
        return kw

    # shapes, in the order the kernels take them
    @property
    def x_shape(self) -> tuple[int, ...]:
        spatial = (self.H, self.W) if self.D is None else (self.D, self.H, self.W)
        return (self.B, self.C, *spatial)

    @property
    def w_shape(self) -> tuple[int, ...]:
        if self.D is not None:
            return (self.M, self.C, self.K, self.K, self.K)
        return (self.M, self.C // self.groups, self.K, self.Kw)

    @property
    def y_shape(self) -> tuple[int, ...]:
        spatial = (self.Ho, self.Wo) if self.D is None else (self.Do, self.Ho, self.Wo)
        return (self.B, self.M, *spatial)

    @property
    def outputs(self) -> int:
        n = self.B * self.M * self.Ho * self.Wo
        return n if self.D is None else n * self.Do

    @property
    def reduction(self) -> int:
        """The length of each output's sum: C/groups·Kh·Kw taps (C·K³ in 3D)."""
        return self.C * self.K ** 3 if self.D is not None else self.C // self.groups * self.K * self.Kw

    @property
    def macs(self) -> int:
        """Multiply-adds: one per output element and tap of its sum."""
        return self.outputs * self.reduction

    @property
    def flops(self) -> int:
        """2·B·M·Ho·Wo·C·K² (a multiply-add counts as two FLOPs); ·Do·K for 3D; C/groups·Kh·Kw in general."""
        return 2 * self.macs

    @staticmethod
    def _numel(shape: tuple[int, ...]) -> int:
        n = 1
        for s in shape:
            n *= s
        return n

    @property
    def bytes(self) -> int:
        """The least traffic a kernel can have: read input and weights once, write output once."""
        return FP32_BYTES * (self._numel(self.x_shape) + self._numel(self.w_shape) + self._numel(self.y_shape))

    @property
    def intensity(self) -> float:
        """FLOPs per byte at that least traffic."""
        return self.flops / self.bytes

    @property
    def shape_text(self) -> str:
        spatial = f"{self.H}×{self.W}" if self.D is None else f"{self.D}×{self.H}×{self.W}"
        mask = "×".join([str(self.K)] * self.dims) if self.D is not None else f"{self.K}×{self.Kw}"

        def one(h, w):
            return str(h) if h == w else f"({h}, {w})"

        extra = []
        if (self.stride, self.stride_w) != (1, 1):
            extra.append(f"stride {one(self.stride, self.stride_w)}")
        if (self.padding, self.padding_w) != (0, 0) or not self.symmetric:
            extra.append(f"pad {one(self.padding, self.padding_w)}")
        if not self.symmetric:
            extra.append(f"pad at the end {one(self.padding_end, self.padding_w_end)}")
        if (self.dilation, self.dilation_w) != (1, 1):
            extra.append(f"dilation {one(self.dilation, self.dilation_w)}")
        if self.groups != 1:
            extra.append(f"groups {self.groups}")
        tail = (", " + ", ".join(extra)) if extra else ""
        return f"B={self.B}, C={self.C}→M={self.M}, {spatial}, K={mask}{tail}"

    def with_batch(self, B: int) -> "Workload":
        return replace(self, B=B)

    def scaled_to(self, flops: float) -> "Workload":
        """A twin of about `flops` FLOPs, for timing on a CPU: fewer images first, then, at B=1,
        a smaller image (channels, mask, stride and padding kept). Never larger than self."""
        per_image = self.flops / self.B
        B = max(1, min(self.B, round(flops / per_image)))
        if B > 1 or per_image <= flops:
            return replace(self, B=B)
        side = (flops / per_image) ** (1 / self.dims)
        H = max(self._span(self.K, self.dilation), round(self.H * side))
        W = max(self._span(self.Kw, self.dilation_w), round(self.W * side))
        D = None if self.D is None else max(self.K, round(self.D * side))
        return replace(self, B=1, H=H, W=W, D=D)

    @staticmethod
    def _span(K: int, dilation: int) -> int:
        return dilation * (K - 1) + 1

    def small(self) -> "Workload":
        """The emulator's twin: B=2, spatial size cut to ≤ 20 outputs, at most 16 channels each way;
        a depthwise layer keeps groups = C (8 of them) and its channel multiplier, a grouped one
        4 groups of at most 2 channels and 2 maps."""
        def cut(n: int, K: int, stride: int, padding: int, dilation: int) -> int:
            # keep the input big enough for the mask and stride, and awkward (not a multiple of 16)
            return min(n, (20 - 1) * stride + self._span(K, dilation) - 2 * padding)

        C, M, groups = min(self.C, 16), min(self.M, 16), 1
        if self.groups == self.C > 1:
            C = groups = min(self.C, 8)
            M = C * (self.M // self.C)
        elif self.groups > 1:
            groups = min(self.groups, 4)
            C, M = groups * min(self.C // self.groups, 2), groups * min(self.M // self.groups, 2)
        return replace(
            self,
            name=self.name + "_small",
            B=min(self.B, 2),
            C=C,
            M=M,
            groups=groups,
            H=cut(self.H, self.K, self.stride, self.padding, self.dilation),
            W=cut(self.W, self.Kw, self.stride_w, self.padding_w, self.dilation_w),
            D=None if self.D is None else min(self.D, 12),
            note="emulator-sized twin of " + self.name,
        )

    def __str__(self) -> str:
        return f"{self.name}: {self.shape_text}" if self.name else self.shape_text


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in [
        Workload("lenet_c1", B=10000, C=1, M=4, H=86, W=86, K=7,
                 note="ECE408 (FA23) modified LeNet-5, layer 1"),
        Workload("lenet_c3", B=10000, C=4, M=16, H=40, W=40, K=7,
                 note="ECE408 (FA23) modified LeNet-5, layer 2"),
        Workload("fa17", B=10000, C=1, M=50, H=28, W=28, K=5,
                 note="an earlier ECE408 project; B·M = 500,000"),
        Workload("days100", B=1, C=32, M=128, H=256, W=256, K=3, padding=1,
                 note="the PyCUDA blog's sweep, same padding"),
        Workload("resnet", B=64, C=64, M=64, H=56, W=56, K=3, padding=1,
                 note="a compute-bound ResNet layer"),
        Workload("conv3d", B=1, C=1, M=1, D=256, H=128, W=128, K=5,
                 note="the LeetGPU 3D challenge, valid"),
    ]
}

#: The 2D layers, in the design's order: the ones chapters 1–6 time.
WORKLOADS_2D: list[Workload] = [w for w in WORKLOADS.values() if w.dims == 2]


def _dw(name: str, B: int, C: int, HW: int, K: int, stride: int = 1, note: str = "") -> Workload:
    """A depthwise layer with 'same'-style padding K // 2: one map per channel."""
    return Workload(name, B=B, C=C, M=C, H=HW, W=HW, K=K, stride=stride, padding=K // 2, groups=C, note=note)


#: Chapter 9: the layers modern networks have, beyond the design's table, at a batch of 32 (16 for
#: DeepLab's larger maps). Their `family` says which kind each is.
LAYERS: list[Workload] = [
    _dw("mbv2_dw3_56", 32, 144, 56, 3, note="MobileNetV2, depthwise 3×3"),
    _dw("mbv2_dw3_28", 32, 192, 28, 3, note="MobileNetV2, depthwise 3×3"),
    _dw("mbv2_dw3_14", 32, 384, 14, 3, note="MobileNetV2, depthwise 3×3"),
    _dw("mbv2_dw3_56_s2", 32, 144, 56, 3, stride=2, note="MobileNetV2, depthwise 3×3, stride 2"),
    _dw("convnext_dw7_56", 32, 128, 56, 7, note="ConvNeXt-T, depthwise 7×7"),
    _dw("convnext_dw7_28", 32, 256, 28, 7, note="ConvNeXt-T, depthwise 7×7"),
    _dw("convnext_dw7_14", 32, 512, 14, 7, note="ConvNeXt-T, depthwise 7×7"),
    Workload("resnext_g32_56", B=32, C=128, M=128, H=56, W=56, K=3, padding=1, groups=32,
             note="ResNeXt-50 32×4d, grouped 3×3"),
    Workload("resnext_g32_28", B=32, C=256, M=256, H=28, W=28, K=3, padding=1, groups=32,
             note="ResNeXt-50 32×4d, grouped 3×3"),
    Workload("deeplab_d2_28", B=16, C=256, M=256, H=28, W=28, K=3, padding=2, dilation=2,
             note="DeepLabV3 ASPP, dilation 2"),
    Workload("deeplab_d4_28", B=16, C=256, M=256, H=28, W=28, K=3, padding=4, dilation=4,
             note="DeepLabV3 ASPP, dilation 4"),
    Workload("inception_1x7_17", B=32, C=128, M=128, H=17, W=17, K=(1, 7), padding=(0, 3),
             note="Inception-v3, factorised 1×7"),
    Workload("inception_7x1_17", B=32, C=128, M=128, H=17, W=17, K=(7, 1), padding=(3, 0),
             note="Inception-v3, factorised 7×1"),
    Workload("resnet_3x3_56", B=32, C=64, M=64, H=56, W=56, K=3, padding=1, note="ResNet-50 stage 1, 3×3"),
    Workload("resnet_1x1_56", B=32, C=256, M=64, H=56, W=56, K=1, note="ResNet-50 stage 1, 1×1 reduce"),
    Workload("resnet_stem_7x7_s2", B=32, C=3, M=64, H=224, W=224, K=7, stride=2, padding=3,
             note="ResNet stem, 7×7 stride 2"),
]

#: More layers of the kinds LAYERS has, with other groups, dilations, masks and strides, for
#: benchmarks/general_layers.py --more (a check that the kernels' speed is not tuned to LAYERS alone).
MORE_LAYERS: list[Workload] = [
    Workload("regnet_g8_28", B=32, C=128, M=128, H=28, W=28, K=3, padding=1, groups=8,
             note="grouped 3×3, 8 groups of 16"),
    Workload("grouped_g2_14", B=32, C=256, M=256, H=14, W=14, K=3, padding=1, groups=2,
             note="grouped 3×3, 2 groups (AlexNet-style)"),
    Workload("deeplab_d6_28", B=16, C=256, M=256, H=28, W=28, K=3, padding=6, dilation=6,
             note="DeepLabV3 ASPP, dilation 6"),
    Workload("conv_1x3_28", B=32, C=192, M=192, H=28, W=28, K=(1, 3), padding=(0, 1), note="factorised 1×3"),
    Workload("conv_5x1_28", B=32, C=128, M=128, H=28, W=28, K=(5, 1), padding=(2, 0), note="factorised 5×1"),
    Workload("conv_s12_56", B=16, C=64, M=128, H=56, W=56, K=3, stride=(1, 2), padding=1,
             note="3×3, stride (1, 2)"),
]

#: The families of LAYERS, in the table's order.
FAMILIES: list[str] = list(dict.fromkeys(w.family for w in LAYERS))


def _layer(name: str) -> Workload:
    """A layer of LAYERS, by name (the same object: one name, one shape)."""
    return next(w for w in LAYERS if w.name == name)


#: The standard layers of ResNet/VGG-class networks that benchmarks/f32_layers.py and
#: tensor_core_layers.py sweep the implicit GEMMs' tiles on (igemm_config's and mma_config's
#: rules come from them): the 3x3 layers of every ResNet stage, the VGG one, the bottleneck's
#: 1x1 layers and the RGB stem. Three are LAYERS' own.
GEMM_LAYERS: list[Workload] = [
    _layer("resnet_3x3_56"),
    Workload("resnet_3x3_28", B=32, C=128, M=128, H=28, W=28, K=3, padding=1, note="ResNet-18/34 stage 2, 3×3"),
    Workload("resnet_3x3_14", B=32, C=256, M=256, H=14, W=14, K=3, padding=1, note="ResNet-18/34 stage 3, 3×3"),
    Workload("resnet_3x3_7", B=32, C=512, M=512, H=7, W=7, K=3, padding=1, note="ResNet-18/34 stage 4, 3×3"),
    Workload("vgg_3x3_56", B=16, C=256, M=256, H=56, W=56, K=3, padding=1, note="VGG-16 conv3_x, 3×3"),
    _layer("resnet_1x1_56"),
    Workload("resnet_1x1_56_expand", B=32, C=64, M=256, H=56, W=56, K=1,
             note="ResNet-50 stage 1, 1×1 expand 64→256"),
    Workload("resnet_1x1_14", B=32, C=1024, M=256, H=14, W=14, K=1, note="ResNet-50 stage 3, 1×1 reduce 1024→256"),
    _layer("resnet_stem_7x7_s2"),
]

#: benchmarks/depthwise_layers.py's layers: LAYERS' depthwise ones, one at a batch of 64 and a
#: MobileNetV2 layer of 112×112 maps.
DEPTHWISE_LAYERS: list[Workload] = [w for w in LAYERS if w.family == "depthwise"] + [
    _dw("mbv2_dw3_56_b64", 64, 144, 56, 3, note="MobileNetV2, depthwise 3×3, batch 64"),
    _dw("mbv2_dw3_112", 32, 96, 112, 3, note="MobileNetV2, depthwise 3×3, 112×112 maps"),
]


def get(name: str) -> Workload:
    """A workload of the design's table, of LAYERS, MORE_LAYERS, GEMM_LAYERS or DEPTHWISE_LAYERS, by name."""
    every = {w.name: w for w in (*DEPTHWISE_LAYERS, *GEMM_LAYERS, *LAYERS, *MORE_LAYERS, *WORKLOADS.values())}
    if name in every:
        return every[name]
    raise KeyError(f"no workload {name!r}; known: {', '.join(every)}")


def table(layers=None) -> "pandas.DataFrame":  # noqa: F821 (pandas imported lazily)
    """The workloads (default the design's table; or `layers`, e.g. LAYERS) with their napkin math,
    one row each (for the notebooks)."""
    import pandas as pd

    rows = []
    for w in (WORKLOADS.values() if layers is None else layers):
        rows.append({
            "workload": w.name,
            "shape": w.shape_text,
            "GFLOP": round(w.flops / 1e9, 3),
            "MB": round(w.bytes / 1e6, 1),
            "FLOP/byte": round(w.intensity, 1),
            **({} if layers is None else {"family": w.family}),
            "note": w.note,
        })
    return pd.DataFrame(rows).set_index("workload")
