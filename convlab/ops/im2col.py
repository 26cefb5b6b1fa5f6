"""Chapter 4 launchers: im2col (kernels/04_im2col/im2col.cu) and the tiled GEMM (gemm_tiled.cu).

The unrolled matrix is per image: U (B, C·K·K, Ho·Wo), so that W (M, C·K·K) · U[b] is image b's
(M, Ho·Wo) block of the NCHW output and no transpose is needed after the GEMM. U is K² times the
input (49× for K=7: 12.5 GB for lenet_c1's whole batch), so conv2d_im2col_gemm unrolls a chunk of
images at a time into a workspace of at most `workspace_mb` MiB, then runs one batched GEMM on it.

- unroll(x, K, stride=, padding=): U for the whole given batch (chapter 4's demonstrations).
- gemm_tiled(A, B): C = A·B, 2D or batched (a 2D A is shared across B's batch).
- conv2d_im2col_gemm: im2col + our tiled GEMM.
- conv2d_im2col_matmul: im2col + torch.matmul (cuBLAS on a GPU), to separate the cost of the
  unroll from the cost of our GEMM.
- unrolled_shape / unrolled_bytes: the size of U, for the K² expansion plot.
- pick(shape): the chapter's best with our own kernels only, im2col + tiled GEMM.
"""
from __future__ import annotations

import torch

from ..gpu._limits import GRID_YZ_MAX, INT32_MAX
from . import Impl, ceil_div, conv2d_shapes, out_size, output
from . import _kernels
from ._kernels import Launch, remember

IM2COL_FILE = "kernels/04_im2col/im2col.cu"
GEMM_FILE = "kernels/04_im2col/gemm_tiled.cu"


def unrolled_shape(B: int, C: int, H: int, W: int, K: int, stride: int = 1, padding: int = 0) -> tuple:
    """U's shape: (B, C·K·K, Ho·Wo)."""
    return (B, C * K * K, out_size(H, K, stride, padding) * out_size(W, K, stride, padding))


def unrolled_bytes(B: int, C: int, H: int, W: int, K: int, stride: int = 1, padding: int = 0) -> int:
    b, r, p = unrolled_shape(B, C, H, W, K, stride, padding)
    return 4 * b * r * p


def _im2col_launch(x, u, K, stride, padding, BLOCK):
    B, C, H, W = (int(s) for s in x.shape)
    P = out_size(H, K, stride, padding) * out_size(W, K, stride, padding)
    mod = _kernels.module(IM2COL_FILE, {"BLOCK": BLOCK})
    mod.kernel("im2col")(x, u, B, C, H, W, K, padding, stride, grid=(ceil_div(P, BLOCK), C, B),
                         block=(BLOCK, 1, 1))


def unroll(x, K: int, u=None, *, stride: int = 1, padding: int = 0, BLOCK: int | None = None):
    """U (B, C·K·K, Ho·Wo) from x (B, C, H, W); u, when given, must have that shape."""
    BLOCK = int(BLOCK or 256)
    B, C, H, W = (int(s) for s in x.shape)
    shape = unrolled_shape(B, C, H, W, K, stride, padding)
    if shape[2] < 1:
        raise ValueError(f"no output: input {H}×{W}, K={K}, stride {stride}, padding {padding}")
    u = output(u, shape, x, name="u")
    _im2col_launch(x, u, K, stride, padding, BLOCK)
    return u


def _gemm_launch(A, Bm, Cm, Z, M, N, K, sA, sB, sC, TILE):
    """Batched launch; an operand with stride 0 is one matrix shared by the whole batch."""
    kern = _kernels.module(GEMM_FILE, {"TILE": TILE}).kernel("gemm_tiled")
    for z0 in range(0, Z, GRID_YZ_MAX):       # the batch is on gridDim.z
        z1 = min(Z, z0 + GRID_YZ_MAX)
        a = A if sA == 0 else A[z0:z1]
        b = Bm if sB == 0 else Bm[z0:z1]
        kern(a, b, Cm[z0:z1], M, N, K, sA, sB, sC,
             grid=(ceil_div(N, TILE), ceil_div(M, TILE), z1 - z0), block=(TILE, TILE, 1))


def gemm_tiled(A, Bm, Cm=None, *, TILE: int | None = None):
    """C = A·B with our tiled kernel. A (M, K) or (Z, M, K); B (K, N) or (Z, K, N); float32.
    A 2D operand is shared by the whole batch."""
    TILE = int(TILE or 16)
    if A.dim() not in (2, 3) or Bm.dim() not in (2, 3):
        raise ValueError(f"A and B must be 2D or batched 3D, got {tuple(A.shape)} and {tuple(Bm.shape)}")
    M, K = (int(s) for s in A.shape[-2:])
    K2, N = (int(s) for s in Bm.shape[-2:])
    if K2 != K:
        raise ValueError(f"inner sizes differ: A {tuple(A.shape)}, B {tuple(Bm.shape)}")
    za = int(A.shape[0]) if A.dim() == 3 else 0
    zb = int(Bm.shape[0]) if Bm.dim() == 3 else 0
    if za and zb and za != zb:
        raise ValueError(f"batch sizes differ: A {tuple(A.shape)}, B {tuple(Bm.shape)}")
    Z = max(za, zb, 1)
    batched = bool(za or zb)
    Cm = output(Cm, (Z, M, N) if batched else (M, N), A, name="C")
    sA = M * K if za else 0
    sB = K * N if zb else 0
    _gemm_launch(A, Bm, Cm.view(Z, M, N), Z, M, N, K, sA, sB, M * N, TILE)
    return Cm


def _chunk(B: int, per_image_bytes: int, workspace_mb: float) -> int:
    budget = int(workspace_mb * 2**20)
    n = max(1, min(B, budget // max(per_image_bytes, 1), GRID_YZ_MAX))
    if n * per_image_bytes // 4 > INT32_MAX:
        n = max(1, INT32_MAX // (per_image_bytes // 4))
    return n


_plans: dict = {}


def _im2col_then(x, w, y, stride, padding, BLOCK, workspace_mb, TILE):
    """im2col into a workspace, chunk by chunk of images, each chunk followed by its GEMM: our tiled
    GEMM with TILE×TILE blocks (its Launch per chunk kept in the plan), or with TILE=0 torch.matmul."""
    def build():
        B, C, M, H, W, K, Ho, Wo = conv2d_shapes(x, w, stride, padding)
        P, KD = Ho * Wo, C * K * K
        nb = _chunk(B, 4 * KD * P, workspace_mb)
        chunks = []
        for b0 in range(0, B, nb):
            n = min(B, b0 + nb) - b0
            unroll = Launch(IM2COL_FILE, "im2col", {"BLOCK": BLOCK}, (n, C, H, W, K, padding, stride),
                            grid=(ceil_div(P, BLOCK), C, n), block=(BLOCK,))
            gemm = None
            if TILE:                     # W (M, KD), shared by the chunk, times U[b] (KD, P) into y[b] (M, P)
                gemm = Launch(GEMM_FILE, "gemm_tiled", {"TILE": TILE}, (M, P, KD, 0, KD * P, M * P),
                              grid=(ceil_div(P, TILE), ceil_div(M, TILE), n), block=(TILE, TILE))
            chunks.append((b0, b0 + n, unroll, gemm))
        return (B, M, Ho, Wo), (nb, KD, P), (M, KD), chunks

    key = (x.shape, w.shape, stride, padding, BLOCK, workspace_mb, TILE)
    shape, u_shape, w_2d, chunks = remember(_plans, key, build)
    y = output(y, shape, x)
    u = torch.empty(u_shape, dtype=torch.float32, device=x.device)    # overwritten before it is read
    for b0, b1, unroll, gemm in chunks:
        whole = len(chunks) == 1          # no views: the kernels see the same memory
        xb, yb = (x, y) if whole else (x[b0:b1], y[b0:b1])
        ub = u if b1 - b0 == u_shape[0] else u[: b1 - b0]
        unroll(xb, ub)
        if gemm is not None:
            gemm(w, ub, yb)
        else:
            torch.matmul(w.view(w_2d), ub, out=yb.view(b1 - b0, w_2d[0], u_shape[2]))
    return y


def conv2d_im2col_gemm(x, w, y=None, *, stride: int = 1, padding: int = 0, TILE: int | None = None,
                       BLOCK: int | None = None, workspace_mb: float | None = None):
    """im2col into a workspace (at most workspace_mb MiB, default 512), chunk by chunk of images, then our
    batched tiled GEMM into y."""
    return _im2col_then(x, w, y, stride, padding, int(BLOCK or 256), workspace_mb or 512, int(TILE or 16))


def conv2d_im2col_matmul(x, w, y=None, *, stride: int = 1, padding: int = 0, BLOCK: int | None = None,
                         workspace_mb: float | None = None):
    """im2col (ours) + torch.matmul (cuBLAS on a GPU): the GEMM's share of the time, separated."""
    return _im2col_then(x, w, y, stride, padding, int(BLOCK or 256), workspace_mb or 512, 0)


#: The chapter's implementations, by the name the figures use.
IM2COL_GEMM = Impl("im2col + tiled GEMM", conv2d_im2col_gemm,
                   config=lambda s: {"TILE": 16, "BLOCK": 256, "workspace_mb": 512}, key="im2col_gemm", candidate=False)
IM2COL_MATMUL = Impl("im2col + torch.matmul", conv2d_im2col_matmul, config=lambda s: {"BLOCK": 256, "workspace_mb": 512}, key="im2col_matmul", candidate=False)
IMPLEMENTATIONS = (IM2COL_GEMM, IM2COL_MATMUL)


def pick(shape) -> Impl:
    """The chapter's best with the course's own kernels only: im2col + our tiled GEMM (the
    torch.matmul variant is faster, but its GEMM is cuBLAS's)."""
    return IM2COL_GEMM
