"""The workloads every chapter times: the design's table, with their FLOPs and bytes.

Shapes come from the course material. Compare only figures taken on the same GPU. Each workload
has a ``small()`` twin with the same character (channels, kernel size, stride, padding) but a
batch of 2 and a cut spatial size, so the emulator can run and check it in well under a second.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

FP32_BYTES = 4


@dataclass(frozen=True)
class Workload:
    """One convolution layer: input (B, C, [D,] H, W), weights (M, C, K, K[, K]), NCHW fp32.

    ``D`` is None for 2D layers; for a 3D layer the kernel is K×K×K over (D, H, W).
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

    @classmethod
    def of(cls, x, w, stride: int = 1, padding: int = 0, name: str = "") -> "Workload":
        """The layer of input x and mask w: x (B, C, H, W) and w (M, C, K, K); or x (B, C, D, H, W)
        and w (M, C, K, K, K); or a single channel x (D, H, W) and w (K, K, K)."""
        xs, ws = tuple(int(s) for s in x.shape), tuple(int(s) for s in w.shape)
        if len(xs) == 3 and len(ws) == 3:
            xs, ws = (1, 1, *xs), (1, 1, *ws)
        if len(xs) not in (4, 5) or len(ws) != len(xs):
            raise ValueError(f"expected x (B, C, [D,] H, W) and w (M, C, K, K[, K]), got {xs} and {ws}")
        if ws[1] != xs[1] or len(set(ws[2:])) != 1:
            raise ValueError(f"w {ws} does not fit x {xs}: need (M, {xs[1]}) and a cubic or square mask")
        D = xs[2] if len(xs) == 5 else None
        return cls(name, B=xs[0], C=xs[1], M=ws[0], H=xs[-2], W=xs[-1], K=ws[-1], stride=int(stride),
                   padding=int(padding), D=D)

    @property
    def dims(self) -> int:
        return 2 if self.D is None else 3

    @staticmethod
    def _out(n: int, K: int, stride: int, padding: int) -> int:
        return (n + 2 * padding - K) // stride + 1

    @property
    def Do(self) -> int | None:
        return None if self.D is None else self._out(self.D, self.K, self.stride, self.padding)

    @property
    def Ho(self) -> int:
        return self._out(self.H, self.K, self.stride, self.padding)

    @property
    def Wo(self) -> int:
        return self._out(self.W, self.K, self.stride, self.padding)

    # shapes, in the order the kernels take them
    @property
    def x_shape(self) -> tuple[int, ...]:
        spatial = (self.H, self.W) if self.D is None else (self.D, self.H, self.W)
        return (self.B, self.C, *spatial)

    @property
    def w_shape(self) -> tuple[int, ...]:
        return (self.M, self.C, *([self.K] * self.dims))

    @property
    def y_shape(self) -> tuple[int, ...]:
        spatial = (self.Ho, self.Wo) if self.D is None else (self.Do, self.Ho, self.Wo)
        return (self.B, self.M, *spatial)

    @property
    def outputs(self) -> int:
        n = self.B * self.M * self.Ho * self.Wo
        return n if self.D is None else n * self.Do

    @property
    def macs(self) -> int:
        """Multiply-adds: one per output element, input map and mask element."""
        return self.outputs * self.C * self.K ** self.dims

    @property
    def flops(self) -> int:
        """2·B·M·Ho·Wo·C·K² (a multiply-add counts as two FLOPs); ·Do·K for 3D."""
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
        mask = "×".join([str(self.K)] * self.dims)
        extra = []
        if self.stride != 1:
            extra.append(f"stride {self.stride}")
        if self.padding:
            extra.append(f"pad {self.padding}")
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
        H = max(self.K, round(self.H * side))
        W = max(self.K, round(self.W * side))
        D = None if self.D is None else max(self.K, round(self.D * side))
        return replace(self, B=1, H=H, W=W, D=D)

    def small(self) -> "Workload":
        """The emulator's twin: B=2, at most 16 channels each way, spatial size cut to ≤ 20 outputs."""
        def cut(n: int) -> int:
            # keep the input big enough for K and stride, and awkward (not a multiple of 16)
            return min(n, (20 - 1) * self.stride + self.K - 2 * self.padding)

        return replace(
            self,
            name=self.name + "_small",
            B=min(self.B, 2),
            C=min(self.C, 16),
            M=min(self.M, 16),
            H=cut(self.H),
            W=cut(self.W),
            D=None if self.D is None else min(self.D, 12),
            note="emulator-sized twin of " + self.name,
        )

    def __str__(self) -> str:
        return f"{self.name}: {self.shape_text}"


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


def get(name: str) -> Workload:
    try:
        return WORKLOADS[name]
    except KeyError:
        raise KeyError(f"no workload {name!r}; known: {', '.join(WORKLOADS)}") from None


def table() -> "pandas.DataFrame":  # noqa: F821 (pandas imported lazily)
    """The workloads with their napkin math, one row each (for the notebooks)."""
    import pandas as pd

    rows = []
    for w in WORKLOADS.values():
        rows.append({
            "workload": w.name,
            "shape": w.shape_text,
            "GFLOP": round(w.flops / 1e9, 3),
            "MB": round(w.bytes / 1e6, 1),
            "FLOP/byte": round(w.intensity, 1),
            "note": w.note,
        })
    return pd.DataFrame(rows).set_index("workload")
