// Chapter 4: a shared-memory tiled matrix product, for any M, N, K (not only multiples of the
// tile), batched: for z = blockIdx.z
//
//     Cm[z] (M x N) = A[z] (M x K) . Bm[z] (K x N),   all row-major,
//
// with A[z] = A + z*strideA etc.; strideA = 0 shares one A across the batch (the convolution's
// weights W, M x C*K*K, against each image's unrolled matrix U[b], C*K*K x Ho*Wo).
//
// The textbook tiled GEMM: a TILE x TILE block computes a TILE x TILE tile of Cm, one element per
// thread. It walks along the K dimension in steps of TILE: each step, every thread loads one
// element of A's tile and one of B's into shared memory, the block synchronises, and each thread
// does TILE multiply-adds from shared memory. Every element loaded from global memory is used
// TILE times, so the global traffic falls by a factor TILE against the naive product. Elements
// beyond the matrix edges are loaded as 0, which adds nothing to the sums; so ragged edges need
// no special case in the inner loop. The zeros are still multiplied: a block does all TILE^3
// multiply-adds of each step, so an M of 4 in 16-row tiles does 4x the useful work.
//
// Grid: (ceil(N/TILE), ceil(M/TILE), batch) with block (TILE, TILE).

#ifndef TILE
#define TILE 16
#endif

__global__ void gemm_tiled(const float* __restrict__ A, const float* __restrict__ Bm, float* __restrict__ Cm,
                           int M, int N, int K, int strideA, int strideB, int strideC)
{
    __shared__ float As[TILE][TILE];
    __shared__ float Bs[TILE][TILE];

    const int tx = threadIdx.x, ty = threadIdx.y;
    const int row = blockIdx.y * TILE + ty;            // row of Cm (and of A)
    const int col = blockIdx.x * TILE + tx;            // column of Cm (and of Bm)
    const long long z = blockIdx.z;
    // 64-bit offsets: a batch of unrolled matrices can exceed 2^31 elements in total.
    const long long a0 = z * strideA, b0 = z * strideB, c0 = z * strideC;

    float acc = 0.0f;  // listing: tile_loop
    for (int k0 = 0; k0 < K; k0 += TILE) {
        // Coalesced: consecutive tx read consecutive columns of a row, for A and for Bm.
        As[ty][tx] = (row < M && k0 + tx < K) ? A[a0 + (long long)row * K + k0 + tx] : 0.0f;
        Bs[ty][tx] = (k0 + ty < K && col < N) ? Bm[b0 + (long long)(k0 + ty) * N + col] : 0.0f;
        __syncthreads();
        // As[ty][k] is the same address for a whole row of threads (broadcast); Bs[k][tx] is
        // consecutive across the warp: no bank conflicts.
        for (int k = 0; k < TILE; ++k)
            acc += As[ty][k] * Bs[k][tx];
        __syncthreads();
    }  // end listing: tile_loop
    if (row < M && col < N)
        Cm[c0 + (long long)row * N + col] = acc;
}
