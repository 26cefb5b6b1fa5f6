// Chapter 10: the fully-connected layers as GEMMs: chapter 4's shared-memory tiled product
// (kernels/04_im2col/gemm_tiled.cu), with operands that may be read transposed and an epilogue.
//
//     Cm (M x N) = op(A) . op(B)  [+ bias[col], then the activation ACT]
//
// A linear layer y = act(x W^T + b), x (N_img, in), W (out, in), needs three products:
//   forward  y  = x  . W^T   (TRANS_B: W read as its transpose; bias and activation fused in)
//   dX       dx = dy . W     (plain)
//   dW       dw = dy^T . x   (TRANS_A: dy read as its transpose)
// Reading an operand transposed costs nothing extra: the tile load swaps its indices so that
// consecutive threads still read consecutive addresses, and the tile in shared memory is the
// same. Row-major storage: A is M x K (K x M when TRANS_A), B is K x N (N x K when TRANS_B).
// ACT: 0 none, 1 ReLU, 2 tanh; BIAS 1 adds bias[col]. Grid (ceil(N/TILE), ceil(M/TILE)), block (TILE, TILE).

#ifndef TILE
#define TILE 16
#endif
#ifndef TRANS_A
#define TRANS_A 0
#endif
#ifndef TRANS_B
#define TRANS_B 0
#endif
#ifndef BIAS
#define BIAS 0
#endif
#ifndef ACT
#define ACT 0
#endif

__global__ void gemm_bias_act(const float* __restrict__ A, const float* __restrict__ Bm, const float* __restrict__ bias,
                              float* __restrict__ Cm, int M, int N, int K)
{
    __shared__ float As[TILE][TILE + 1];   // As[i][k] = op(A)[row0 + i][k0 + k]; +1: no bank conflicts
    __shared__ float Bs[TILE][TILE + 1];   // Bs[k][j] = op(B)[k0 + k][col0 + j]
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int row0 = blockIdx.y * TILE, col0 = blockIdx.x * TILE;

    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += TILE) {
#if TRANS_A   // A stored K x M: consecutive tx read consecutive rows of op(A)
        As[tx][ty] = (row0 + tx < M && k0 + ty < K) ? A[(size_t)(k0 + ty) * M + row0 + tx] : 0.0f;
#else
        As[ty][tx] = (row0 + ty < M && k0 + tx < K) ? A[(size_t)(row0 + ty) * K + k0 + tx] : 0.0f;
#endif
#if TRANS_B   // B stored N x K: consecutive tx read consecutive k of one column of op(B)
        Bs[tx][ty] = (k0 + tx < K && col0 + ty < N) ? Bm[(size_t)(col0 + ty) * K + k0 + tx] : 0.0f;
#else
        Bs[ty][tx] = (k0 + ty < K && col0 + tx < N) ? Bm[(size_t)(k0 + ty) * N + col0 + tx] : 0.0f;
#endif
        __syncthreads();
#pragma unroll
        for (int k = 0; k < TILE; ++k)
            acc += As[ty][k] * Bs[k][tx];
        __syncthreads();
    }
    const int row = row0 + ty, col = col0 + tx;
    if (row < M && col < N) {
#if BIAS
        acc += bias[col];
#endif
#if ACT == 1
        acc = fmaxf(acc, 0.0f);
#elif ACT == 2
        acc = tanhf(acc);
#endif
        Cm[(size_t)row * N + col] = acc;
    }
}
