"""Chapter 10 launchers: the layers of a whole network around the convolutions (kernels/10_network/).

- conv2d_bias_act_pool: a convolution with bias + activation + 2x2 pooling fused into its output
  write (one kernel); conv2d_separate_epilogue: the same stage as three kernels (chapter 5's
  pick() convolution, bias_act, pool2x2). Both: f(x, w, y=None, *, stride=1, padding=0, bias,
  act="relu", pool="max", act_out=None, **tunables) -> y; act_out, when given, receives the
  activations before pooling (training needs them; with pool="none" they are the output).
  fused_config(shape): the fused kernel's tunables (UNROLL, MG, BLOCK) for a layer.
- bias_act, pool2x2: the separate epilogue kernels; pool_act_backward, channel_sum: their gradients.
- linear, linear_dx, linear_dw: a fully-connected layer y = act(x W^T + b) as tiled GEMMs
  (chapter 4's kernel reading an operand transposed, bias and activation fused into the forward),
  split along K when the output's tiles alone would leave SMs idle (gemm_split(M, N, K)).
- softmax, softmax_xent: class probabilities; per-image loss and the logits' gradient.
- sgd_momentum: the optimiser's update, in place.

act: "none", "relu" or "tanh"; pool: "none", "max" or "avg". Every launcher takes float32
tensors on the backend's device and returns its output (allocated when not given). Each launcher
works out its launch once per shape and tunables (_plans) and keeps it: a repeated call checks its
tensors and launches.
"""
from __future__ import annotations

import torch

from ..measuring.workloads import Workload
from . import Impl, _kernels, ceil_div, conv2d_shapes, fused, new_output, output
from .igemm import conv2d_igemm_f32
from ._kernels import Launch, remember, sm_count

FUSED_FILE = "kernels/10_network/conv2d_bias_act_pool.cu"
EPILOGUE_FILE = "kernels/10_network/epilogue.cu"
GEMM_FILE = "kernels/10_network/gemm_bias_act.cu"
SOFTMAX_FILE = "kernels/10_network/softmax_xent.cu"

ACTS = {"none": 0, "relu": 1, "tanh": 2}
POOLS = {"none": 0, "max": 1, "avg": 2}
CONSTANT_FLOATS = 16384      # 64 KB of __constant__ memory: the mask and the bias must fit
ELEMENTWISE_BLOCK = 256
MAX_BLOCKS = 1 << 16         # elementwise kernels stride over the rest
CHANNEL_SUM_BLOCK = 256      # epilogue.cu's BLOCK (its default): channel_sum's shared array has that size

_plans: dict = {}


def _code(table: dict, value: str, what: str) -> int:
    if value not in table:
        raise ValueError(f"{what}={value!r}: use one of {', '.join(repr(k) for k in table)}")
    return table[value]


def _output(y, shape, like, name: str = "y"):
    return output(y, tuple(int(s) for s in shape), like, name=name)


def _elementwise_grid(n: int) -> tuple:
    return (max(1, min(ceil_div(n, ELEMENTWISE_BLOCK), MAX_BLOCKS)), 1, 1), (ELEMENTWISE_BLOCK, 1, 1)


def pooled_size(n: int, pool: str) -> int:
    """The size after a 2x2 pooling of stride 2 (an odd last row or column is dropped), or n."""
    return n if pool == "none" else n // 2


# ---- the epilogue as separate kernels ---------------------------------------------------------------

def bias_act(x, bias, y=None, *, act: str = "relu"):
    """y = act(x + bias[m]) for x (B, M, ...) (a linear layer's (N, M) too)."""
    def build():
        B, M = int(x.shape[0]), int(x.shape[1])
        if tuple(bias.shape) != (M,):
            raise ValueError(f"bias has shape {tuple(bias.shape)}, expected ({M},): one value per map")
        P = x.numel() // max(1, B * M)
        grid, block = _elementwise_grid(x.numel())
        return Launch(EPILOGUE_FILE, "bias_act", None, (B, M, P, _code(ACTS, act, "act")), grid=grid, block=block)

    launch = remember(_plans, ("bias_act", x.shape, bias.shape, act), build)
    y = _output(y, x.shape, x)
    launch(x, bias, y)
    return y


def pool2x2(x, y=None, *, pool: str = "max"):
    """2x2 max or average pooling with stride 2 over x (B, M, H, W): y (B, M, H//2, W//2)."""
    def build():
        mode = _code(POOLS, pool, "pool")
        if mode == 0:
            raise ValueError("pool2x2 needs pool='max' or 'avg'")
        B, M, H, W = (int(s) for s in x.shape)
        if H < 2 or W < 2:
            raise ValueError(f"a {H}x{W} map has no 2x2 window to pool")
        shape = (B, M, H // 2, W // 2)
        grid, block = _elementwise_grid(B * M * (H // 2) * (W // 2))
        return shape, Launch(EPILOGUE_FILE, "pool2x2", None, (B * M, H, W, mode), grid=grid, block=block)

    shape, launch = remember(_plans, ("pool2x2", x.shape, pool), build)
    y = _output(y, shape, x)
    launch(x, y)
    return y


# ---- the fused stage --------------------------------------------------------------------------------

#: The row loop's unroll factor: 4 was the fastest of 1, 2, 4 and 8 (8: fully, K+1 rows) on both of
#: the class project's layers at a batch of 10,000, for every MG tried (book/data/details/
#: 10_network_unroll.csv, H200; project_conv2 with all 16 maps: 3.47 ms against 4.85 fully
#: unrolled, project_conv1: 0.93 against 1.13). Not for occupancy: on project_conv2 it took 255
#: registers per thread against 168 fully unrolled. LeNet-5's K=5 layers were not swept; they get
#: the same factor. Layers with K < 3 unroll all their K+1 rows.
FUSED_UNROLL = 4
FUSED_BLOCK = 128            # threads per block at large batches (the unroll sweep's blocks)
MIN_BLOCK = 32               # one warp: a smaller block only leaves lanes idle


def fused_fits(M: int, C: int, K: int) -> bool:
    """The mask and the bias fit in constant memory, and the thread's 4·M accumulators in registers."""
    return M * C * K * K + M <= CONSTANT_FLOATS and M <= 32


def fused_config(shape: Workload, sms: int | None = None) -> dict:
    """UNROLL, MG and BLOCK of conv2d_bias_act_pool for a layer (a Workload; sms: the GPU's SM count,
    the device's by default). UNROLL: FUSED_UNROLL. MG (maps per thread) and BLOCK: all M maps in
    blocks of FUSED_BLOCK while that grid has a block for every SM; at small batches it has not
    (the project's second layer at one image: 289 threads, 3 blocks, each thread 16 maps x 4
    outputs x 196 taps in a row, the rest of the GPU idle), so first fewer maps per thread (a
    divisor of M, halving the serial chain and the unrolled body each step; the groups go on
    gridDim.y), then smaller blocks (down to one warp), until the grid has sms blocks."""
    sms = sms or sm_count()
    threads = shape.B * ceil_div(shape.Ho, 2) * ceil_div(shape.Wo, 2)
    blocks = lambda mg, block: ceil_div(threads, block) * (shape.M // mg)  # noqa: E731
    mg, block = shape.M, FUSED_BLOCK
    for d in (d for d in range(shape.M, 0, -1) if shape.M % d == 0):
        mg = d
        if blocks(mg, block) >= sms:
            break
    while blocks(mg, block) < sms and block > MIN_BLOCK:
        block //= 2
    return {"UNROLL": min(FUSED_UNROLL, shape.K + 1), "MG": mg, "BLOCK": block}


def _fused_defines(M, C, K, act, pool, write_act, UNROLL, BLOCK, MG) -> dict:
    return {"M_OUT": M, "C_IN": C, "KSIZE": K, "ACT": _code(ACTS, act, "act"), "POOL": _code(POOLS, pool, "pool"),
            "WRITE_ACT": int(write_act), "UNROLL": int(UNROLL), "BLOCK": int(BLOCK), "MG": int(MG)}


def fused_module(M: int, C: int, K: int, *, act: str = "relu", pool: str = "max", write_act: bool = False,
                 UNROLL: int | None = None, BLOCK: int | None = None, MG: int | None = None):
    """The fused kernel's module as conv2d_bias_act_pool compiles it for a layer (its kernel's
    .attributes give the registers per thread on a GPU); tunables left out: a large batch's
    (fused_config's UNROLL, FUSED_BLOCK, all M maps)."""
    return _kernels.module(FUSED_FILE, _fused_defines(M, C, K, act, pool, write_act,
                                                      UNROLL or min(FUSED_UNROLL, K + 1), BLOCK or FUSED_BLOCK,
                                                      MG or M))


def _no_pool_output(y, act_out, pool: str):
    """With pool="none" the output is the activations: act_out, when given, is where it goes."""
    if pool != "none" or act_out is None:
        return y, act_out
    if y is not None and y is not act_out:
        raise ValueError("pool='none': the output is the activations; pass y or act_out, not both")
    return act_out, None


def conv2d_bias_act_pool(x, w, y=None, *, stride: int = 1, padding: int = 0, bias, act: str = "relu",
                         pool: str = "max", act_out=None, UNROLL: int | None = None, BLOCK: int | None = None,
                         MG: int | None = None):
    """One kernel: conv (stride 1) + bias + activation + 2x2 pooling. UNROLL: how far the loop
    over the window's K+1 input rows is unrolled (1 to K+1: fully); BLOCK: threads per block (a
    multiple of 32); MG: maps per thread (a divisor of M, the groups on gridDim.y). Tunables left
    out come from fused_config (the layer's shape and the GPU's SM count)."""
    y, act_out = _no_pool_output(y, act_out, pool)
    write_act = act_out is not None
    y_shape, a_shape, launch = remember(_plans, ("fused", x.shape, w.shape, bias.shape, stride, padding, act, pool,
                                                 write_act, UNROLL, BLOCK, MG),
                                        lambda: _fused_plan(x, w, bias, stride, padding, act, pool, write_act,
                                                            UNROLL, BLOCK, MG))
    y = _output(y, y_shape, x)
    if write_act:
        _output(act_out, a_shape, x, name="act_out")
    launch.with_mask(w, x, y, act_out if write_act else y, also=(("c_bias", bias),))
    return y


def _fused_plan(x, w, bias, stride, padding, act, pool, write_act, UNROLL, BLOCK, MG):
    """(y's shape, act_out's shape, Launch) of conv2d_bias_act_pool for one call signature."""
    if stride != 1:
        raise ValueError(f"stride {stride}: the fused kernel takes stride 1 (its 2x2 windows tile the output)")
    B, C, M, H, W, K, Ho, Wo = conv2d_shapes(x, w, stride, padding)
    if not fused_fits(M, C, K):
        raise ValueError(f"M={M}, C={C}, K={K}: the fused kernel needs M <= 32 and the mask ({M * C * K * K:,} "
                         f"floats) within {CONSTANT_FLOATS:,} floats of constant memory; use conv2d_separate_epilogue")
    if tuple(bias.shape) != (M,):
        raise ValueError(f"bias has shape {tuple(bias.shape)}, expected ({M},)")
    pool_code = _code(POOLS, pool, "pool")
    cfg = fused_config(Workload.of(x, w, padding=padding))
    unroll, block, mg = int(UNROLL or cfg["UNROLL"]), int(BLOCK or cfg["BLOCK"]), int(MG or cfg["MG"])
    if not 1 <= unroll <= K + 1:
        raise ValueError(f"UNROLL={unroll}: between 1 (no unrolling) and K+1={K + 1} (fully)")
    if M % mg:
        raise ValueError(f"MG={mg}: the maps per thread must divide M={M}")
    threads = B * ceil_div(Ho, 2) * ceil_div(Wo, 2)
    launch = Launch(FUSED_FILE, "conv2d_bias_act_pool",
                    _fused_defines(M, C, K, act, pool, write_act, unroll, block, mg), (B, H, W, padding),
                    grid=(ceil_div(threads, block), M // mg, 1), block=(block, 1, 1))
    return (B, M, Ho // 2, Wo // 2) if pool_code else (B, M, Ho, Wo), (B, M, Ho, Wo), launch


def conv2d_separate_epilogue(x, w, y=None, *, stride: int = 1, padding: int = 0, bias, act: str = "relu",
                             pool: str = "max", act_out=None):
    """Three kernels: chapter 5's pick() convolution, bias_act, pool2x2 (the last skipped for pool="none")."""
    y, act_out = _no_pool_output(y, act_out, pool)
    z = fused.conv2d_best(x, w, stride=stride, padding=padding)
    if pool == "none":
        return bias_act(z, bias, y, act=act)
    a = bias_act(z, bias, act_out, act=act)
    return pool2x2(a, y, pool=pool)


# ---- gradients of the epilogue ------------------------------------------------------------------------

def pool_act_backward(a, dp, dz=None, *, act: str = "relu", pool: str = "max"):
    """The gradient of the pre-activation z, from the activations a = act(z) (B, M, H, W) and the
    gradient dp of the pooled output (or of a itself when pool="none")."""
    def build():
        B, M, H, W = (int(s) for s in a.shape)
        mode = _code(POOLS, pool, "pool")
        want = (B, M, H // 2, W // 2) if mode else (B, M, H, W)
        if tuple(dp.shape) != want:
            raise ValueError(f"dp has shape {tuple(dp.shape)}, expected {want}")
        grid, block = _elementwise_grid(a.numel())
        return Launch(EPILOGUE_FILE, "pool_act_backward", None, (B * M, H, W, mode, _code(ACTS, act, "act")),
                      grid=grid, block=block)

    launch = remember(_plans, ("pool_act_backward", a.shape, dp.shape, act, pool), build)
    dz = _output(dz, a.shape, a, name="dz")
    launch(a, dp, dz)
    return dz


def channel_sum(dz, db=None):
    """db[m] = the sum of dz[b, m, ...] over b and the rest: a bias's gradient (dz (B, M, ...) or (N, M))."""
    def build():
        B, M = int(dz.shape[0]), int(dz.shape[1])
        P = dz.numel() // max(1, B * M)
        return (M,), Launch(EPILOGUE_FILE, "channel_sum", None, (B, M, P), grid=(M, 1, 1),
                            block=(CHANNEL_SUM_BLOCK, 1, 1))

    shape, launch = remember(_plans, ("channel_sum", dz.shape), build)
    db = _output(db, shape, dz, name="db")
    launch(dz, db)
    return db


# ---- fully-connected layers ---------------------------------------------------------------------------

#: Split-K for the GEMMs: no split while the output's tiles fill SPLIT_BELOW of the SMs. The share is
#: chapter 9's (tensor_core.SPLIT_BELOW, measured there: the partials' traffic and the second
#: kernel cost more than a fifth of the SMs idle); this tiled kernel has not been swept for it.
SPLIT_BELOW = 0.75
MIN_SPLIT_STEPS = 4          # TILE steps per slice at least: a shorter slice is mostly its partial's write
MAX_SPLIT = 32


def gemm_split(M: int, N: int, K: int, TILE: int = 16, sms: int | None = None) -> int:
    """The slices of K for an M x N x K product in TILE x TILE tiles: 1 when its tiles fill SPLIT_BELOW
    of the SMs (every large batch); else enough slices to give each SM a block, at most MAX_SPLIT
    and each at least MIN_SPLIT_STEPS tiles deep. One image through the project's 4,624 -> 128 layer:
    8 tiles, 289 steps: 17 slices of 17 steps, 136 blocks on 132 SMs."""
    sms = sms or sm_count()
    blocks, steps = ceil_div(M, TILE) * ceil_div(N, TILE), ceil_div(K, TILE)
    if blocks >= SPLIT_BELOW * sms:
        return 1
    return max(1, min(ceil_div(sms, blocks), MAX_SPLIT, steps // MIN_SPLIT_STEPS))


def _gemm_plan(M, N, K, trans_a, trans_b, bias, act, TILE, SPLIT):
    """(splits, Launch of the product, Launch of the reduction or None) for one call signature."""
    tile = int(TILE or 16)
    defines = {"TILE": tile, "TRANS_A": trans_a, "TRANS_B": trans_b, "BIAS": int(bias), "ACT": _code(ACTS, act, "act")}
    if ceil_div(M, tile) > 65_535:
        raise ValueError(f"{M} rows is over gridDim.y's 65,535 tiles of {tile}")
    steps = ceil_div(K, tile)
    want = int(SPLIT or gemm_split(M, N, K, tile))
    if not 1 <= want <= max(1, steps):
        raise ValueError(f"SPLIT={want}: between 1 and the {steps} steps of TILE={tile} in K={K}")
    per = ceil_div(steps, want)
    splits = ceil_div(steps, per)                  # no empty slice: 10 steps in 4 slices are 3+3+3+1
    launch = Launch(GEMM_FILE, "gemm_bias_act", defines, (M, N, K, per * tile),
                    grid=(ceil_div(N, tile), ceil_div(M, tile), splits), block=(tile, tile, 1))
    grid, block = _elementwise_grid(M * N)
    reduce = None if splits == 1 else Launch(GEMM_FILE, "gemm_splitk_reduce", defines, (M, N, splits),
                                             grid=grid, block=block)
    return splits, launch, reduce


def _gemm(key, A, Bm, bias, Cm, M, N, K, **plan):
    splits, launch, reduce = remember(_plans, key, lambda: _gemm_plan(M, N, K, bias=bias is not None, **plan))
    b = bias if bias is not None else Cm             # never read without BIAS
    if reduce is None:
        launch(A, Bm, b, Cm, Cm)                     # ws: never touched by one slice
    else:
        ws = new_output((splits, M, N), Cm)          # poisoned like an output: a slice never written shows
        launch(A, Bm, b, Cm, ws)
        reduce(ws, b, Cm)
    return Cm


def _linear_shapes(x, w):
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"expected x (N, in) and w (out, in), got {tuple(x.shape)} and {tuple(w.shape)}")
    return int(x.shape[0]), int(w.shape[1]), int(w.shape[0])


GEMMS = ("tiled", "igemm")


def linear(x, w, y=None, *, bias=None, act: str = "none", TILE: int | None = None, SPLIT: int | None = None,
           GEMM: str | None = None):
    """y (N, out) = act(x (N, in) · w (out, in)^T + bias). GEMM="tiled": one tiled GEMM with its
    epilogue (TILE default 16), split along K in SPLIT slices (default gemm_split's) and then
    reduced. GEMM="igemm": the layer as the 1x1 convolution it is (N images of `in` channels, `out`
    maps) by chapter 9's warp-tiled implicit GEMM (convlab.ops.igemm, its own tile and split), the
    bias added by it and the activation by bias_act. Default: linear_gemm's choice."""
    N, fin, fout = _linear_shapes(x, w)
    if bias is not None and tuple(bias.shape) != (fout,):
        raise ValueError(f"bias has shape {tuple(bias.shape)}, expected ({fout},)")
    gemm = GEMM or linear_gemm(N, fin, fout)
    if gemm not in GEMMS:
        raise ValueError(f"GEMM={gemm!r}: one of {GEMMS}")
    if gemm == "igemm":
        return _linear_igemm(x, w, y, bias, act, N, fin, fout)
    y = _output(y, (N, fout), x)
    return _gemm(("linear", N, fin, fout, bias is not None, act, TILE, SPLIT), x, w, bias, y, N, fout, fin,
                 trans_a=0, trans_b=1, act=act, TILE=TILE, SPLIT=SPLIT)


#: linear_gemm's thresholds, from benchmarks/network_batches.py's FC rows on an H200
#: (benchmarks/results/network_fc_layers_NVIDIA_H200.csv). The tiled GEMM walks K one 16-wide
#: step at a time with one output per thread; the implicit GEMM's 128-wide tiles and register
#: tiles win once there is work enough: on the 4,624-deep project layer from a batch of 64
#: (0.032 ms against 0.048; at one image 0.026 against 0.020), on LeNet-5's shallow layers from
#: about 1e8 multiply-adds (400 -> 120 at N = 10,000: 0.076 against 0.168; at 1,250 they tie).
IGEMM_MACS = 100_000_000
IGEMM_DEEP = 1024            # inputs from which ...
IGEMM_DEEP_N = 64            # ... a batch of this many rows already goes to the implicit GEMM


def linear_gemm(N: int, fin: int, fout: int) -> str:
    """linear's GEMM for a layer of fin -> fout features at a batch of N (see IGEMM_MACS)."""
    if N * fin * fout >= IGEMM_MACS or (fin >= IGEMM_DEEP and N >= IGEMM_DEEP_N):
        return "igemm"
    return "tiled"


def reference_linear(x, w, bias, act: str):
    """act(x · w^T + bias) in float64: what linear's checks compare with."""
    z = x.double() @ w.double().T + (0 if bias is None else bias.double())
    return {"none": lambda t: t, "relu": torch.relu, "tanh": torch.tanh}[act](z)


def _linear_igemm(x, w, y, bias, act, N, fin, fout):
    x4, w4 = x.view(N, fin, 1, 1), w.view(fout, fin, 1, 1)
    if act == "none":
        y = _output(y, (N, fout), x)
        conv2d_igemm_f32(x4, w4, y.view(N, fout, 1, 1), bias=bias)
        return y
    if bias is None:
        raise ValueError("GEMM='igemm' with an activation needs a bias (bias_act applies both)")
    return bias_act(conv2d_igemm_f32(x4, w4).view(N, fout), bias, y, act=act)


def linear_dx(dy, w, dx=None, *, TILE: int | None = None, SPLIT: int | None = None):
    """dx (N, in) = dy (N, out) · w (out, in); K = out, split as linear's."""
    N, fout, fin = int(dy.shape[0]), int(w.shape[0]), int(w.shape[1])
    if dy.dim() != 2 or int(dy.shape[1]) != fout:
        raise ValueError(f"dy {tuple(dy.shape)} does not fit w {tuple(w.shape)}: need (N, {fout})")
    dx = _output(dx, (N, fin), dy, name="dx")
    return _gemm(("linear_dx", N, fin, fout, TILE, SPLIT), dy, w, None, dx, N, fin, fout,
                 trans_a=0, trans_b=0, act="none", TILE=TILE, SPLIT=SPLIT)


def linear_dw(dy, x, dw=None, *, TILE: int | None = None, SPLIT: int | None = None):
    """dw (out, in) = dy (N, out)^T · x (N, in): dy read transposed; K = N, the batch (a large batch
    on a narrow layer is a few tiles of output over a long K: split)."""
    if dy.dim() != 2 or x.dim() != 2 or dy.shape[0] != x.shape[0]:
        raise ValueError(f"expected dy (N, out) and x (N, in), got {tuple(dy.shape)} and {tuple(x.shape)}")
    N, fout, fin = int(dy.shape[0]), int(dy.shape[1]), int(x.shape[1])
    dw = _output(dw, (fout, fin), dy, name="dw")
    return _gemm(("linear_dw", N, fin, fout, TILE, SPLIT), dy, x, None, dw, fout, fin, N,
                 trans_a=1, trans_b=0, act="none", TILE=TILE, SPLIT=SPLIT)


# ---- softmax and cross-entropy -------------------------------------------------------------------------

def softmax(z, p=None):
    """Class probabilities of logits z (N, classes), one thread per row."""
    def build():
        N, K = (int(s) for s in z.shape)
        return (N, K), Launch(SOFTMAX_FILE, "softmax", None, (N, K), grid=(ceil_div(N, 128), 1, 1), block=(128, 1, 1))

    shape, launch = remember(_plans, ("softmax", z.shape), build)
    p = _output(p, shape, z, name="p")
    launch(z, p)
    return p


def softmax_xent(z, labels, loss=None, dz=None):
    """(loss (N,), dz (N, classes)): each image's cross-entropy and the gradient of the batch's
    mean loss with respect to the logits. labels: int64 (N,)."""
    def build():
        N, K = (int(s) for s in z.shape)
        if labels.dtype != torch.int64 or tuple(labels.shape) != (N,):
            raise ValueError(f"labels must be int64 of shape ({N},), got {labels.dtype} {tuple(labels.shape)}")
        return N, K, Launch(SOFTMAX_FILE, "softmax_xent", None, (N, K, 1.0 / N), grid=(ceil_div(N, 128), 1, 1),
                            block=(128, 1, 1))

    N, K, launch = remember(_plans, ("softmax_xent", z.shape, labels.shape, labels.dtype), build)
    loss = _output(loss, (N,), z, name="loss")
    dz = _output(dz, (N, K), z, name="dz")
    launch(z, labels, loss, dz)
    return loss, dz


def sgd_momentum(p, g, v, *, lr: float, momentum: float):
    """v = momentum·v + g; p -= lr·v, in place (torch.optim.SGD with momentum, no dampening)."""
    if not (p.shape == g.shape == v.shape) or not (p.is_contiguous() and g.is_contiguous() and v.is_contiguous()):
        raise ValueError("p, g and v must be contiguous tensors of one shape")
    def build():
        grid, block = _elementwise_grid(n)
        return Launch(EPILOGUE_FILE, "sgd_momentum", None, (n, float(lr), float(momentum)), grid=grid, block=block)

    n = p.numel()
    launch = remember(_plans, ("sgd_momentum", n, lr, momentum), build)
    launch(p, g, v)
    return p


def _fused_applies(shape) -> bool:
    return shape.stride == 1 and fused_fits(shape.M, shape.C, shape.K)


#: A conv stage (conv + bias + activation + pooling) both ways. op "conv2d_stage": the launcher
#: takes bias= (and act=, pool=) besides the forward contract.
FUSED = Impl("conv + bias + act + pool, one kernel", conv2d_bias_act_pool, op="conv2d_stage", applies=_fused_applies,
             config=fused_config, key="stage_fused")
SEPARATE = Impl("conv (pick) + bias/act + pool, three kernels", conv2d_separate_epilogue, op="conv2d_stage", key="stage_separate")
IMPLEMENTATIONS = (FUSED, SEPARATE)
