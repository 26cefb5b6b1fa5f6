"""The dispatcher for any layer: pick(shape, dtype) chooses among every forward kernel of the course
that takes the layer, by an explicit rule derived from the chapters' measurements.

- SOURCES: the modules whose IMPLEMENTATIONS pick() chooses from (chapter 5's fp32 kernels,
  chapter 6's fp16 kernels, chapter 9's general and depthwise ones, its fp32 implicit GEMM and its
  mma.sync one). A new module joins with one line; a rule naming its kernel decides where pick()
  takes it.
- candidates(shape, dtype): every registered kernel of that dtype that takes the layer (the
  chapters' own kernels take only plain layers: Impl.takes).
- RULES / dispatch_rule(): the rule, an ordered table of conditions -> kernel: the first row whose
  condition holds and whose kernel takes the layer wins. Printable.
- pick(shape, dtype) -> Impl; conv2d(x, w, ...): the forward the drop-in runs (pick()'s kernel
  with its tunables, the bias added where the kernel has none). The layout of x decides one thing
  more: a channels_last x of a depthwise layer goes to the NHWC depthwise kernel, and the mma.sync
  kernel reads it without a conversion; the result has x's layout, as torch's.
- evidence(): pick()'s choice beside the fastest kernel measured on each shape of the chapters'
  committed results (book/data/05_fused.csv, 06_fp16.csv, 09_general.csv): the rule holds where
  every choice is the fastest, within the measurement's spread.
"""
from __future__ import annotations

import functools
import importlib
import inspect
from dataclasses import dataclass
from typing import Callable

import torch

from .._limits import INT32_MAX
from ..workloads import Workload

#: The modules of convlab.ops whose IMPLEMENTATIONS are candidates (one line per module).
SOURCES = ["fused", "fp16", "general", "igemm", "tensor_core"]

LAYOUTS = ("nchw", "channels_last")                 # x's memory format, as pick() takes it
OPS = {"fp32": "conv2d", "fp16": "conv2d_fp16"}      # the forward op of each dtype's kernels
DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16"}
#: float32 in and out, but half arithmetic: not a candidate for a strict-fp32 layer
NOT_CANDIDATES = {"ours, float32 in and out: to_half + pick() + to_float"}
#: The chapters whose committed results are pick()'s evidence.
EVIDENCE = ("05_fused", "06_fp16", "09_general")
#: The name of pick()'s own rows in those results (not a candidate).
BEST = "best: pick()"


@functools.cache
def implementations(dtype: str) -> tuple:
    """Every registered forward kernel of a dtype ('fp32' or 'fp16'), in SOURCES' order."""
    out = []
    for name in SOURCES:
        mod = importlib.import_module(f"{__package__}.{name}")
        out += [i for i in mod.IMPLEMENTATIONS if i.op == OPS[dtype] and i.name not in NOT_CANDIDATES]
    return tuple(out)


def _fits_int(shape: Workload) -> bool:
    """The chapters' kernels index x and y with int (and keep headroom for a grid stride)."""
    return max(shape.B * shape.C * shape.H * shape.W, shape.B * shape.M * shape.Ho * shape.Wo) <= INT32_MAX // 2


def candidates(shape: Workload, dtype: str = "fp32") -> list:
    """The registered kernels of dtype that take this 2D layer."""
    if shape.dims != 2:
        raise ValueError(f"{shape}: pick() chooses among 2D kernels")
    return [i for i in implementations(dtype) if i.takes(shape) and (i.any_layer or _fits_int(shape))]


# ---- the rule ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Rule:
    condition: str                  # the condition, as the printed table says it
    holds: Callable                 # Workload -> bool
    kernel: str                     # an Impl's name
    why: str                        # the measured reason, and where the data is
    layouts: tuple = LAYOUTS        # the layouts of x the row is for


def _taps(s: Workload) -> int:
    return s.C * s.K * s.Kw


def _pads_cheaply(s: Workload) -> bool:
    """C a multiple of 8, or padding it to one (the mma.sync kernel's 16-byte loads) adds at most a
    quarter: an RGB stem's 3 -> 8 would nearly triple its tensor-core work."""
    return s.C % 8 == 0 or 4 * (-(-s.C // 8) * 8) <= 5 * s.C


RULES = {
    "fp32": [
        Rule("plain, stride 1, C < 8, M ≤ 64", lambda s: s.plain and s.stride == 1 and s.C < 8 and s.M <= 64,
             "direct, register-tiled (mask in shared)",
             "few channels: a GEMM tile would be mostly padding (05_fused: lenet_c1, lenet_c3, fa17)"),
        Rule("plain", lambda s: s.plain, "implicit GEMM fp32, warp-tiled",
             "long reductions: warp tiles of 8x8 outputs (benchmarks/f32_layers.py: faster than chapter 5's "
             "best on every layer it measured)"),
        Rule("plain", lambda s: s.plain, "implicit GEMM, register-tiled",
             "where the warp-tiled kernel does not take the layer (05_fused: days100, resnet)"),
        Rule("depthwise (groups = C)", lambda s: s.groups == s.C, "depthwise (input tile in shared, column strips)",
             "memory-bound: each input read once into shared memory (09_general)"),
        Rule("any layer", lambda s: True, "general direct (any layer)", "the only kernel that takes every layer"),
    ],
    "fp16": [
        Rule("plain, C = 1, M ≤ 8", lambda s: s.plain and s.C == 1 and s.M <= 8, "half (direct, register-tiled)",
             "one channel, few maps: faster than half2 and tensor cores (06_fp16: lenet_c1)"),
        Rule("plain, C = 1, M ≤ 64", lambda s: s.plain and s.C == 1 and s.M <= 64, "half2 (direct, register-tiled)",
             "one channel: a reduction of K² taps, too short for tensor cores (06_fp16: fa17)"),
        Rule("plain, C ≤ 8, stride 1", lambda s: s.plain and s.C <= 8 and s.stride == 1,
             "WMMA, few channels (no im2col)", "fragments read straight from the input tile (06_fp16: lenet_c3)"),
        Rule("x channels_last, groups 1, C·Kh·Kw ≥ 64, C pads to 8 cheaply",
             lambda s: s.groups == 1 and _taps(s) >= 64 and _pads_cheaply(s), "mma.sync implicit GEMM (NHWC)",
             "many channels: mma.sync fed by ldmatrix from a cp.async pipeline (benchmarks/tensor_core_layers.py; "
             "needs sm_80); from NCHW, converting x costs more than WMMA loses (09_general)",
             layouts=("channels_last",)),
        Rule("plain", lambda s: s.plain, "WMMA implicit GEMM",
             "tensor cores through WMMA (06_fp16: days100, resnet); the stem's 3 channels, an older GPU"),
        Rule("groups 1, C·Kh·Kw ≥ 64, C pads to 8 cheaply", lambda s: s.groups == 1 and _taps(s) >= 64 and
             _pads_cheaply(s), "mma.sync implicit GEMM (NHWC)",
             "a layer WMMA does not take (dilated, non-square): faster than the general kernel even with x "
             "converted from NCHW (09_general)"),
        Rule("depthwise (groups = C)", lambda s: s.groups == s.C,
             "depthwise fp16 (input tile in shared, column strips)",
             "memory-bound: each input read once into shared memory (09_general)"),
        Rule("any layer", lambda s: True, "general direct fp16 (any layer)", "the only kernel that takes every layer"),
    ],
}


def dispatch_rule(dtype: str | None = None) -> str:
    """The rule as a table: for each dtype, the conditions in order, the kernel and why."""
    lines = []
    for dt in ([dtype] if dtype else list(RULES)):
        rules = RULES[dt]
        wc = max(len(r.condition) for r in rules)
        wk = max(len(r.kernel) for r in rules)
        lines.append(f"{dt}: the first row whose condition holds and whose kernel takes the layer")
        lines.append(f"  {'condition':<{wc}}  {'kernel':<{wk}}  why")
        lines += [f"  {r.condition:<{wc}}  {r.kernel:<{wk}}  {r.why}" for r in rules]
    return "\n".join(lines)


@functools.lru_cache(maxsize=4096)
def pick(shape: Workload, dtype: str = "fp32", layout: str = "nchw"):
    """The Impl the rule gives this 2D layer in dtype ('fp32' or 'fp16') with x in layout ('nchw' or
    'channels_last'); best = pick(shape, dtype); best(x, w, **shape.conv_kwargs(), **best.config(shape))
    runs it."""
    if isinstance(shape, str):
        from .. import workloads
        shape = workloads.get(shape)
    if dtype not in RULES:
        raise ValueError(f"dtype {dtype!r}: one of {', '.join(RULES)}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r}: one of {', '.join(LAYOUTS)}")
    takes = {i.name: i for i in candidates(shape, dtype)}
    for rule in RULES[dtype]:
        if layout in rule.layouts and rule.holds(shape) and rule.kernel in takes:
            return takes[rule.kernel]
    raise ValueError(f"no rule of {dtype} gives a kernel that takes {shape}: the last rule should take any layer")


# ---- the forward the drop-in runs --------------------------------------------------------------------

def _workload_of(g) -> Workload:
    """A convlab.ops.general.Geometry as a Workload (its padding: the top/left one)."""
    return Workload("", B=g.B, C=g.C, M=g.M, H=g.H, W=g.W, K=(g.Kh, g.Kw), stride=(g.sh, g.sw),
                    padding=(g.ph, g.pw), dilation=(g.dh, g.dw), groups=g.groups)


@functools.lru_cache(maxsize=4096)
def _route(g, dtype: str, nhwc: bool = False):
    """(launcher, keyword arguments, whether it adds the bias) for a Geometry and x's layout (nhwc:
    channels_last); None for the arguments as given (torch's 'same' with an even mask pads one
    more at the end, which only chapter 9's kernels take: their pick among themselves; the NHWC
    depthwise kernel takes any depthwise layer's arguments)."""
    from .depthwise import conv2d_depthwise_nhwc, nhwc_applies

    if nhwc and nhwc_applies(g):
        return conv2d_depthwise_nhwc, None, True
    shape = _workload_of(g)
    if (shape.Ho, shape.Wo) != (g.Ho, g.Wo):
        from .general import DEPTHWISE, DEPTHWISE_FP16, GENERAL, GENERAL_FP16, depthwise_applies

        fp16 = dtype == "fp16"
        impl = (DEPTHWISE_FP16 if fp16 else DEPTHWISE) if depthwise_applies(g) else (GENERAL_FP16 if fp16 else GENERAL)
        return impl.launcher, None, True
    impl = pick(shape, dtype, "channels_last" if nhwc else "nchw")
    kw = {**shape.conv_kwargs(), **impl.config(shape)}
    return impl.launcher, kw, "bias" in inspect.signature(impl.launcher).parameters


_routes: dict = {}      # (shapes, dtype, layout, plain arguments) -> the route: a repeated call's one lookup


def _channels_last(x) -> bool:
    """x is in channels_last memory (and not also plain NCHW, as a 1x1 plane or one channel is)."""
    return x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last)


def conv2d(x, w, y=None, *, stride=1, padding=0, dilation=1, groups: int = 1, bias=None):
    """y = conv2d(x, w, bias) by pick()'s kernel for the layer (x 4-D, float32 or float16, NCHW or
    channels_last); stride, padding and dilation in any form torch takes. y comes back in x's
    layout, as torch's does (a given y: NCHW contiguous)."""
    from .general import _plain, geometry

    nhwc = _channels_last(x)
    b_shape = None if bias is None else bias.shape
    key = (x.shape, w.shape, b_shape, x.dtype, nhwc, stride, padding, dilation, groups)
    plain = _plain(stride) and _plain(padding) and _plain(dilation) and _plain(groups)
    hit = _routes.get(key) if plain else None
    if hit is None:
        from .depthwise import conv2d_depthwise_nhwc
        from .tensor_core import conv2d_mma

        g = geometry(x.shape, w.shape, stride, padding, dilation, groups, b_shape)
        dtype = DTYPE_NAMES.get(x.dtype)
        if dtype is None:
            raise TypeError(f"x is {x.dtype}: pick() has float32 and float16 kernels")
        launcher, kw, takes_bias = _route(g, dtype, nhwc)
        if kw is None:
            kw = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
        hit = (launcher, kw, takes_bias, launcher in (conv2d_mma, conv2d_depthwise_nhwc))
        if plain:
            _routes[key] = hit
    launcher, kw, takes_bias, nhwc_kernel = hit
    if nhwc_kernel:                                    # NHWC kernels: channels_last out
        out = launcher(x, w.contiguous(), bias=bias, **kw)
    else:
        xc = x.contiguous()
        if takes_bias:
            out = launcher(xc, w, None if nhwc else y, bias=bias, **kw)
        else:
            out = launcher(xc, w, None if nhwc else y, **kw)
            out = out if bias is None else out.add_(bias.view(1, -1, 1, 1))
    if y is not None:
        return y if out is y else y.copy_(out)
    return out.contiguous(memory_format=torch.channels_last if nhwc else torch.contiguous_format)


def _accumulation(shape: Workload) -> str:
    from .fp16 import accumulation

    return accumulation(pick(shape, "fp16"))


conv2d.accumulation = _accumulation      # fp16.accumulation: how the kernel pick() runs adds (fp16)


def _fp16_route(x_shape, w_shape, stride, padding, dilation, groups):
    from .general import geometry

    x_shape = tuple(x_shape) if len(x_shape) == 4 else (1, *x_shape)
    return _route(geometry(x_shape, w_shape, stride, padding, dilation, groups), "fp16")


def forward_accumulation(x_shape, w_shape, stride=1, padding=0, dilation=1, groups: int = 1) -> str:
    """'half' or 'float': how the kernel conv2d runs in float16 on this layer keeps its sums (chapter
    6's direct kernels add in half where pick() chooses them): what fp16.fp16_tolerance needs."""
    from .fp16 import accumulation

    return accumulation(_fp16_route(x_shape, w_shape, stride, padding, dilation, groups)[0])


def check_fp16_forward(y, ref, x_shape, w_shape, bias=None, stride=1, padding=0, dilation=1, groups: int = 1,
                       name: str = "y"):
    """cl.check of conv2d's float16 output y against ref (fp64 of the half inputs, bias included)
    with the bound derived for the kernel conv2d runs (fp16.fp16_tolerance: its sums, in half or
    float, of C/groups·Kh·Kw terms and the bias). Where that kernel adds no bias, conv2d adds it to
    the kernel's half output, which is rounded once more: u·|y - bias| <= u·|ref| + u·|bias| more."""
    import convlab as cl

    from .fp16 import U16, accumulation, fp16_tolerance

    launcher, _, takes_bias = _fp16_route(x_shape, w_shape, stride, padding, dilation, groups)
    n = w_shape[1] * w_shape[2] * w_shape[3] + (bias is not None)
    rtol, atol_rms = fp16_tolerance(n, 1, accumulation(launcher), rounded_inputs=True)
    r = ref.detach().double().cpu()
    atol = atol_rms * max(float(r.pow(2).mean().sqrt()) if r.numel() else 1.0, 1e-30)
    if bias is not None and not takes_bias:
        rtol, atol = 2 * rtol, atol + U16 * float(bias.detach().double().abs().max())
    return cl.check(y, r, rtol=rtol, atol=atol, name=name)

def picked(dtype: str = "fp32"):
    """An Impl named BEST that runs pick()'s kernel on any layer, for measure.run."""
    from . import Impl

    return Impl(BEST, conv2d, OPS[dtype], any_layer=True)


# ---- the evidence ------------------------------------------------------------------------------------

def measured(chapters=EVIDENCE):
    """The committed forward rows of our kernels in the chapters' results, one per (chapter,
    workload, dtype, impl), for the kernels pick() chooses among; None when there are none."""
    import pandas as pd

    from .. import results

    frames = []
    for ch in chapters:
        df = results.load(ch, quiet=True)
        if df is None:
            continue
        df = df[(df["kind"] == "ours") & (df["pass"] == "forward") & df["dtype"].isin(list(RULES))]
        names = {d: {i.name for i in implementations(d)} for d in RULES}
        df = df[[n in names[d] for n, d in zip(df["impl"], df["dtype"])]]
        frames.append(df.assign(chapter=ch))
    return pd.concat(frames, ignore_index=True) if frames else None


def evidence(chapters=EVIDENCE):
    """Per measured (chapter, workload, dtype): pick()'s kernel, the fastest measured kernel, their
    GPU times and whether pick() agrees (its median within the fastest's p75: as fast, within the
    measurement's spread). A (chapter, workload, dtype) whose results lack pick()'s kernel (chapters
    5 and 6 measure their own kernels; chapter 9's run measures every registered one on the course's
    layers too) is left out. None when no results are committed."""
    import pandas as pd

    from .. import workloads

    df = measured(chapters)
    if df is None:
        return None
    rows = []
    for (ch, name, dtype), sub in df.groupby(["chapter", "workload", "dtype"], sort=False):
        shape = workloads.get(name)
        if sub["shape"].iloc[0] != shape.shape_text:
            raise ValueError(f"book/data/{ch}.csv measured {name} as {sub['shape'].iloc[0]!r}, but the workload "
                             f"is now {shape.shape_text!r}: re-run the chapter on a GPU")
        fastest = sub.loc[sub["ms"].idxmin()]
        layout = str(sub["layout"].iloc[0]) if "layout" in sub and sub["layout"].iloc[0] in LAYOUTS else "nchw"
        chosen = pick(shape, dtype, layout).name
        mine = sub[sub["impl"] == chosen]
        if not len(mine):                # a kernel newer than the chapter's run: chapter 9's run measures it
            continue
        ms = float(mine["ms"].iloc[0])
        rows.append({"chapter": ch, "workload": name, "family": shape.family, "dtype": dtype,
                     "pick()": chosen, "pick() ms": ms, "fastest": fastest["impl"], "fastest ms": fastest["ms"],
                     "pick() / fastest": ms / fastest["ms"], "agrees": bool(ms <= fastest["p75"]),
                     "kernels measured": len(sub)})
    return pd.DataFrame(rows) if rows else None
