"""Chapter 10 launchers: the layers of a whole network around the convolutions (kernels/10_network/).

- conv2d_bias_act_pool: a convolution with bias + activation + 2x2 pooling fused into its output
  write (one kernel); conv2d_separate_epilogue: the same stage as three kernels (chapter 5's
  pick() convolution, bias_act, pool2x2). Both: f(x, w, y=None, *, stride=1, padding=0, bias,
  act="relu", pool="max", act_out=None, **tunables) -> y; act_out, when given, receives the
  activations before pooling (training needs them; with pool="none" they are the output).
- bias_act, pool2x2: the separate epilogue kernels; pool_act_backward, channel_sum: their gradients.
- linear, linear_dx, linear_dw: a fully-connected layer y = act(x W^T + b) as tiled GEMMs
  (chapter 4's kernel reading an operand transposed, bias and activation fused into the forward).
- softmax, softmax_xent: class probabilities; per-image loss and the logits' gradient.
- sgd_momentum: the optimiser's update, in place.

act: "none", "relu" or "tanh"; pool: "none", "max" or "avg". Every launcher takes float32
tensors on the backend's device and returns its output (allocated when not given).
"""
from __future__ import annotations

import torch

from . import Impl, ceil_div, conv2d_shapes, output
from . import _kernels
from ._kernels import set_mask

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
    B, M = int(x.shape[0]), int(x.shape[1])
    if tuple(bias.shape) != (M,):
        raise ValueError(f"bias has shape {tuple(bias.shape)}, expected ({M},): one value per map")
    P = x.numel() // max(1, B * M)
    y = _output(y, x.shape, x)
    grid, block = _elementwise_grid(x.numel())
    _kernels.module(EPILOGUE_FILE).kernel("bias_act")(x, bias, y, B, M, P, _code(ACTS, act, "act"),
                                                      grid=grid, block=block)
    return y


def pool2x2(x, y=None, *, pool: str = "max"):
    """2x2 max or average pooling with stride 2 over x (B, M, H, W): y (B, M, H//2, W//2)."""
    mode = _code(POOLS, pool, "pool")
    if mode == 0:
        raise ValueError("pool2x2 needs pool='max' or 'avg'")
    B, M, H, W = (int(s) for s in x.shape)
    if H < 2 or W < 2:
        raise ValueError(f"a {H}x{W} map has no 2x2 window to pool")
    y = _output(y, (B, M, H // 2, W // 2), x)
    grid, block = _elementwise_grid(y.numel())
    _kernels.module(EPILOGUE_FILE).kernel("pool2x2")(x, y, B * M, H, W, mode, grid=grid, block=block)
    return y


# ---- the fused stage --------------------------------------------------------------------------------

def fused_fits(M: int, C: int, K: int) -> bool:
    """The mask and the bias fit in constant memory, and the thread's 4·M accumulators in registers."""
    return M * C * K * K + M <= CONSTANT_FLOATS and M <= 32


def fused_module(M: int, C: int, K: int, *, act: str = "relu", pool: str = "max", write_act: bool = False,
                 UNROLL: int | None = None, BLOCK: int | None = None, MG: int | None = None):
    """The fused kernel's module as conv2d_bias_act_pool compiles it for a layer (its kernel's
    .attributes give the registers per thread on a GPU)."""
    return _kernels.module(FUSED_FILE, {"M_OUT": M, "C_IN": C, "KSIZE": K, "ACT": _code(ACTS, act, "act"),
                                        "POOL": _code(POOLS, pool, "pool"), "WRITE_ACT": int(write_act),
                                        "UNROLL": int(UNROLL or K + 1), "BLOCK": int(BLOCK or 128),
                                        "MG": int(MG or M)})


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
    over the window's K+1 input rows is unrolled (default K+1: fully); BLOCK: threads per block;
    MG: maps per thread (default all M; a divisor of M, the groups on gridDim.y)."""
    if stride != 1:
        raise ValueError(f"stride {stride}: the fused kernel takes stride 1 (its 2x2 windows tile the output)")
    B, C, M, H, W, K, Ho, Wo = conv2d_shapes(x, w, stride, padding)
    if not fused_fits(M, C, K):
        raise ValueError(f"M={M}, C={C}, K={K}: the fused kernel needs M <= 32 and the mask ({M * C * K * K:,} "
                         f"floats) within {CONSTANT_FLOATS:,} floats of constant memory; use conv2d_separate_epilogue")
    if tuple(bias.shape) != (M,):
        raise ValueError(f"bias has shape {tuple(bias.shape)}, expected ({M},)")
    act_code, pool_code = _code(ACTS, act, "act"), _code(POOLS, pool, "pool")
    y, act_out = _no_pool_output(y, act_out, pool)
    unroll = int(UNROLL or K + 1)
    block = int(BLOCK or 128)
    if not 1 <= unroll <= K + 1:
        raise ValueError(f"UNROLL={unroll}: between 1 (no unrolling) and K+1={K + 1} (fully)")
    mg = int(MG or M)
    if M % mg:
        raise ValueError(f"MG={mg}: the maps per thread must divide M={M}")
    y = _output(y, (B, M, Ho // 2, Wo // 2) if pool_code else (B, M, Ho, Wo), x)
    if act_out is not None:
        _output(act_out, (B, M, Ho, Wo), x, name="act_out")
    mod = fused_module(M, C, K, act=act, pool=pool, write_act=act_out is not None, UNROLL=unroll, BLOCK=block,
                       MG=mg)
    set_mask(mod, w)
    set_mask(mod, bias, "c_bias")
    threads = B * ceil_div(Ho, 2) * ceil_div(Wo, 2)
    mod.kernel("conv2d_bias_act_pool")(x, y, act_out if act_out is not None else y, B, H, W, padding,
                                       grid=(ceil_div(threads, block), M // mg, 1), block=(block, 1, 1))
    return y


def conv2d_separate_epilogue(x, w, y=None, *, stride: int = 1, padding: int = 0, bias, act: str = "relu",
                             pool: str = "max", act_out=None):
    """Three kernels: chapter 5's pick() convolution, bias_act, pool2x2 (the last skipped for pool="none")."""
    from . import fused

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
    B, M, H, W = (int(s) for s in a.shape)
    mode = _code(POOLS, pool, "pool")
    want = (B, M, H // 2, W // 2) if mode else (B, M, H, W)
    if tuple(dp.shape) != want:
        raise ValueError(f"dp has shape {tuple(dp.shape)}, expected {want}")
    dz = _output(dz, a.shape, a, name="dz")
    grid, block = _elementwise_grid(a.numel())
    _kernels.module(EPILOGUE_FILE).kernel("pool_act_backward")(a, dp, dz, B * M, H, W, mode, _code(ACTS, act, "act"),
                                                      grid=grid, block=block)
    return dz


def channel_sum(dz, db=None):
    """db[m] = the sum of dz[b, m, ...] over b and the rest: a bias's gradient (dz (B, M, ...) or (N, M))."""
    B, M = int(dz.shape[0]), int(dz.shape[1])
    P = dz.numel() // max(1, B * M)
    db = _output(db, (M,), dz, name="db")
    _kernels.module(EPILOGUE_FILE).kernel("channel_sum")(dz, db, B, M, P, grid=(M, 1, 1),
                                                         block=(CHANNEL_SUM_BLOCK, 1, 1))
    return db


# ---- fully-connected layers ---------------------------------------------------------------------------

def _gemm(A, Bm, bias, Cm, M, N, K, *, trans_a=0, trans_b=0, act="none", TILE=16):
    defines = {"TILE": TILE, "TRANS_A": trans_a, "TRANS_B": trans_b, "BIAS": int(bias is not None),
               "ACT": _code(ACTS, act, "act")}
    if ceil_div(M, TILE) > 65_535:
        raise ValueError(f"{M} rows is over gridDim.y's 65,535 tiles of {TILE}")
    _kernels.module(GEMM_FILE, defines).kernel("gemm_bias_act")(A, Bm, bias if bias is not None else Cm, Cm, M, N, K,
                                                       grid=(ceil_div(N, TILE), ceil_div(M, TILE), 1),
                                                       block=(TILE, TILE, 1))
    return Cm


def _linear_shapes(x, w):
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"expected x (N, in) and w (out, in), got {tuple(x.shape)} and {tuple(w.shape)}")
    return int(x.shape[0]), int(w.shape[1]), int(w.shape[0])


def linear(x, w, y=None, *, bias=None, act: str = "none", TILE: int = 16):
    """y (N, out) = act(x (N, in) · w (out, in)^T + bias): one tiled GEMM with its epilogue."""
    N, fin, fout = _linear_shapes(x, w)
    if bias is not None and tuple(bias.shape) != (fout,):
        raise ValueError(f"bias has shape {tuple(bias.shape)}, expected ({fout},)")
    y = _output(y, (N, fout), x)
    return _gemm(x, w, bias, y, N, fout, fin, trans_b=1, act=act, TILE=TILE)


def linear_dx(dy, w, dx=None, *, TILE: int = 16):
    """dx (N, in) = dy (N, out) · w (out, in)."""
    N, fout, fin = int(dy.shape[0]), int(w.shape[0]), int(w.shape[1])
    if dy.dim() != 2 or int(dy.shape[1]) != fout:
        raise ValueError(f"dy {tuple(dy.shape)} does not fit w {tuple(w.shape)}: need (N, {fout})")
    dx = _output(dx, (N, fin), dy, name="dx")
    return _gemm(dy, w, None, dx, N, fin, fout, TILE=TILE)


def linear_dw(dy, x, dw=None, *, TILE: int = 16):
    """dw (out, in) = dy (N, out)^T · x (N, in): dy read transposed."""
    if dy.dim() != 2 or x.dim() != 2 or dy.shape[0] != x.shape[0]:
        raise ValueError(f"expected dy (N, out) and x (N, in), got {tuple(dy.shape)} and {tuple(x.shape)}")
    N, fout, fin = int(dy.shape[0]), int(dy.shape[1]), int(x.shape[1])
    dw = _output(dw, (fout, fin), dy, name="dw")
    return _gemm(dy, x, None, dw, fout, fin, N, trans_a=1, TILE=TILE)


# ---- softmax and cross-entropy -------------------------------------------------------------------------

def softmax(z, p=None):
    """Class probabilities of logits z (N, classes), one thread per row."""
    N, K = (int(s) for s in z.shape)
    p = _output(p, (N, K), z, name="p")
    _kernels.module(SOFTMAX_FILE).kernel("softmax")(z, p, N, K, grid=(ceil_div(N, 128), 1, 1), block=(128, 1, 1))
    return p


def softmax_xent(z, labels, loss=None, dz=None):
    """(loss (N,), dz (N, classes)): each image's cross-entropy and the gradient of the batch's
    mean loss with respect to the logits. labels: int64 (N,)."""
    N, K = (int(s) for s in z.shape)
    if labels.dtype != torch.int64 or tuple(labels.shape) != (N,):
        raise ValueError(f"labels must be int64 of shape ({N},), got {labels.dtype} {tuple(labels.shape)}")
    loss = _output(loss, (N,), z, name="loss")
    dz = _output(dz, (N, K), z, name="dz")
    _kernels.module(SOFTMAX_FILE).kernel("softmax_xent")(z, labels, loss, dz, N, K, 1.0 / N,
                                                grid=(ceil_div(N, 128), 1, 1), block=(128, 1, 1))
    return loss, dz


def sgd_momentum(p, g, v, *, lr: float, momentum: float):
    """v = momentum·v + g; p -= lr·v, in place (torch.optim.SGD with momentum, no dampening)."""
    if not (p.shape == g.shape == v.shape) or not (p.is_contiguous() and g.is_contiguous() and v.is_contiguous()):
        raise ValueError("p, g and v must be contiguous tensors of one shape")
    grid, block = _elementwise_grid(p.numel())
    _kernels.module(EPILOGUE_FILE).kernel("sgd_momentum")(p, g, v, p.numel(), float(lr), float(momentum),
                                                          grid=grid, block=block)
    _forget_constant(p)
    return p


def _forget_constant(t) -> None:
    """A kernel changed t in place, which torch's version counter does not see: drop what set_mask
    remembers of t, so the next launch that takes t as its mask uploads it again."""
    from . import _kernels

    for key, (ref, _) in list(_kernels._mask_state.items()):
        if ref() is t:
            del _kernels._mask_state[key]


def _fused_applies(shape) -> bool:
    return shape.stride == 1 and fused_fits(shape.M, shape.C, shape.K)


#: A conv stage (conv + bias + activation + pooling) both ways. op "conv2d_stage": the launcher
#: takes bias= (and act=, pool=) besides the forward contract.
FUSED = Impl("conv + bias + act + pool, one kernel", conv2d_bias_act_pool, op="conv2d_stage", applies=_fused_applies)
SEPARATE = Impl("conv (pick) + bias/act + pool, three kernels", conv2d_separate_epilogue, op="conv2d_stage")
IMPLEMENTATIONS = (FUSED, SEPARATE)
