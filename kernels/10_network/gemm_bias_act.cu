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
// ACT: 0 none, 1 ReLU, 2 tanh; BIAS 1 adds bias[col]. Grid (ceil(N/TILE), ceil(M/TILE), splits),
// block (TILE, TILE).
//
// Split-K: a small product (one image through a 4,624-wide layer: 8 tiles of output, each 289 K
// steps long) leaves most SMs idle while a few blocks walk K one tile at a time. Then blockIdx.z
// takes the slice [z * kslice, z * kslice + kslice) of K (kslice a multiple of TILE) and writes
// its partial sum to ws[z] (splits x M x N floats), with no bias or activation: those need the
// full sum. gemm_splitk_reduce then adds the slices in order (the same order every run: no
// atomics, so the result is deterministic) and applies the epilogue. One slice (gridDim.z 1):
// the epilogue is applied here and ws is not touched.

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

__device__ __forceinline__ float epilogue(float acc, const float* __restrict__ bias, int col)
{
#if BIAS
    acc += bias[col];
#endif
#if ACT == 1
    acc = fmaxf(acc, 0.0f);
#elif ACT == 2
    acc = tanhf(acc);
#endif
    return acc;
}

__global__ void gemm_bias_act(const float* __restrict__ A, const float* __restrict__ Bm, const float* __restrict__ bias,
                              float* __restrict__ Cm, float* __restrict__ ws, int M, int N, int K, int kslice)
{
    __shared__ float As[TILE][TILE + 1];   // As[i][k] = op(A)[row0 + i][k0 + k]; +1: no bank conflicts
    __shared__ float Bs[TILE][TILE + 1];   // Bs[k][j] = op(B)[k0 + k][col0 + j]
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int row0 = blockIdx.y * TILE, col0 = blockIdx.x * TILE;
    const int kbeg = blockIdx.z * kslice, kend = min(K, kbeg + kslice);   // this block's slice of K

    float acc = 0.0f;  // listing: tile_loop
    for (int k0 = kbeg; k0 < kend; k0 += TILE) {
#if TRANS_A   // A stored K x M: consecutive tx read consecutive rows of op(A)
        As[tx][ty] = (row0 + tx < M && k0 + ty < kend) ? A[(size_t)(k0 + ty) * M + row0 + tx] : 0.0f;
#else
        As[ty][tx] = (row0 + ty < M && k0 + tx < kend) ? A[(size_t)(row0 + ty) * K + k0 + tx] : 0.0f;
#endif
#if TRANS_B   // B stored N x K: consecutive tx read consecutive k of one column of op(B)
        Bs[tx][ty] = (k0 + tx < kend && col0 + ty < N) ? Bm[(size_t)(col0 + ty) * K + k0 + tx] : 0.0f;
#else
        Bs[ty][tx] = (k0 + ty < kend && col0 + tx < N) ? Bm[(size_t)(k0 + ty) * N + col0 + tx] : 0.0f;
#endif
        __syncthreads();
#pragma unroll
        for (int k = 0; k < TILE; ++k)
            acc += As[ty][k] * Bs[k][tx];
        __syncthreads();
    }  // end listing: tile_loop
    const int row = row0 + ty, col = col0 + tx;
    if (row < M && col < N) {
        if (gridDim.z > 1)
            ws[((size_t)blockIdx.z * M + row) * N + col] = acc;     // a partial sum: the epilogue waits
        else
            Cm[(size_t)row * N + col] = epilogue(acc, bias, col);
    }
}

// Cm = epilogue(sum over z of ws[z]), one thread per output (grid-stride), slices added in order.
__global__ void gemm_splitk_reduce(const float* __restrict__ ws, const float* __restrict__ bias, float* __restrict__ Cm,
                                   int M, int N, int splits)
{
    const long long n = (long long)M * N;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        float acc = 0.0f;
        for (int z = 0; z < splits; ++z)
            acc += ws[z * n + i];
        Cm[i] = epilogue(acc, bias, (int)(i % N));
    }
}
