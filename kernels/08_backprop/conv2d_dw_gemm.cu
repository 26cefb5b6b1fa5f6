// Chapter 8, step 5: dE/dW as a split-K implicit GEMM, for the layers with many channels
// (lenet_c3, resnet, days100), where the weight gradient is a real matrix product.
//
// Write n = (b, oy, ox) for an output pixel of the batch (N = B*Ho*Wo of them) and k = (c, ky, kx)
// for a tap (KD = C*K*K). Then
//
//   dW (M x KD) = dY (M x N) . U^T (N x KD),   U[k][n] = x[b][c][oy*s + ky - pad][ox*s + kx - pad]
//
// the forward's unrolled matrix U again (chapter 4), now on the other side of the product, and
// the reduction runs over the long axis N (lenet_c3: 11.6 M; resnet: 200,704) instead of KD.
// The kernel is chapter 5's register-tiled implicit GEMM (conv2d_implicit_gemm_reg.cu) turned to
// this shape:
//  - Block tile BM x BN (maps x taps), thread micro-tile TM x TN in registers, reduction step BK
//    pixels staged in shared memory, double-buffered with one barrier per step; float4 reads
//    of the tiles, the same conflict-free layout.
//  - Split-K: one block could never walk all of N alone, and M x KD has only a few tiles
//    (resnet: 9 of 64 x 64), so the pixels are cut into gridDim.z ranges of n_per_split each.
//    Each block leaves a BM x BN partial sum: in partial[z][m][k] (summed in a fixed order by
//    reduce_partials.cu, deterministic) or, with FINAL_ATOMIC = 1, atomicAdded into dw.
//  - Loads: thread tid always loads pixel column kk = tid % BK of a step, for rows tid / BK,
//    + NTHREADS/BK, ... of the tile. So the pixel -> (b, oy, ox) division is done once per step
//    for all its loads, consecutive threads read consecutive pixels (coalesced along a row of
//    dy, and of x for a fixed tap), and each thread's taps (c, ky, kx) are fixed for the whole
//    block: their offsets into x are computed once, before the loop.
//
// Tunables (defines): BM, BN, BK, TM, TN, KSIZE, FINAL_ATOMIC. Threads (BM/TM)*(BN/TN).
// Grid: (ceil(KD/BN), ceil(M/BM), splits); each block takes pixels [z*n_per_split, +n_per_split).
// Layout: x (B,C,H,W), dy (B,M,Ho,Wo), out: partial (splits, M, KD) or dw (M, KD). Any padding and stride.

#ifndef BM
#define BM 64
#endif
#ifndef BN
#define BN 64
#endif
#ifndef BK
#define BK 16
#endif
#ifndef TM
#define TM 8
#endif
#ifndef TN
#define TN 4
#endif
#ifndef KSIZE
#define KSIZE 3
#endif
#ifndef FINAL_ATOMIC
#define FINAL_ATOMIC 0
#endif

#define NTHREADS ((BM / TM) * (BN / TN))
#define LROWS (NTHREADS / BK)          // tile rows one pass of the block loads
#define A_PER (BM / LROWS)             // dy-tile values per thread and step
#define B_PER (BN / LROWS)             // U-tile values per thread and step

static_assert(TM % 4 == 0 && TN % 4 == 0, "TM and TN must be multiples of 4 (float4 shared loads)");
static_assert(BM % TM == 0 && BN % TN == 0, "the micro-tile must divide the block tile");
static_assert(NTHREADS % BK == 0, "the threads must split evenly over the BK pixels of a step");
static_assert(BM % LROWS == 0 && BN % LROWS == 0, "the tiles must split evenly over the threads");
static_assert(NTHREADS <= 1024, "at most 1024 threads per block");

__global__ void conv2d_dw_gemm(const float* __restrict__ x, const float* __restrict__ dy,
                               float* __restrict__ out, int B, int C, int M, int H, int W,
                               int pad, int stride, int n_per_split)
{
    const int K = KSIZE, KK = KSIZE * KSIZE;
    const int Ho = (H + 2 * pad - K) / stride + 1;
    const int Wo = (W + 2 * pad - K) / stride + 1;
    const int P = Ho * Wo, N = B * P, KD = C * KK, HW = H * W;

    __shared__ __align__(16) float As[2][BK][BM + 4];   // dy tile: As[n][m]
    __shared__ __align__(16) float Bs[2][BK][BN + 4];   // U tile:  Bs[n][k]

    const int tid = threadIdx.x;
    const int m0 = blockIdx.y * BM, k0 = blockIdx.x * BN;
    const int tm = tid / (BN / TN), tn = tid % (BN / TN);
    const int kk = tid % BK, lr = tid / BK;              // loader: pixel column, first tile row

    // This thread's taps, fixed for the block: offset into the image from the window corner,
    // and (ky, kx) for the bounds test. Taps past KD get ky far out, so the test fails.
    int tap_off[B_PER], tap_ky[B_PER], tap_kx[B_PER];
#pragma unroll
    for (int e = 0; e < B_PER; ++e) {
        const int k = k0 + lr + e * LROWS;
        const int c = k / KK, rem = k - c * KK, ky = rem / K, kx = rem - ky * K;
        const bool ok = k < KD;
        tap_off[e] = ok ? c * HW + ky * W + kx : 0;
        tap_ky[e] = ok ? ky : (1 << 28);
        tap_kx[e] = kx;
    }

    const int nbeg = blockIdx.z * n_per_split;
    const int nend = min(N, nbeg + n_per_split);
    const int ntiles = (nend - nbeg + BK - 1) / BK;

    float a_next[A_PER], b_next[B_PER];
    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;

    // The forward kernel's software pipeline: (1) global loads of tile t into registers,
    // (2) arithmetic on tile t-1 from shared buffer (t-1)&1, (3) tile t into buffer t&1, (4) barrier.
    for (int t = 0; t <= ntiles; ++t) {
        if (t < ntiles) {
            const int n = nbeg + t * BK + kk;
            const bool valid = n < nend;
            const int b = valid ? n / P : 0, p = valid ? n - b * P : 0;
            const int oy = p / Wo, ox = p - oy * Wo;
            const int iy0 = oy * stride - pad, ix0 = ox * stride - pad;
            // (1a) dy tile: rows m of pixel n; a warp reads BK consecutive pixels per row.
            const int dbase = b * M * P + p;
#pragma unroll
            for (int e = 0; e < A_PER; ++e) {
                const int m = m0 + lr + e * LROWS;
                a_next[e] = (valid && m < M) ? __ldg(&dy[dbase + m * P]) : 0.0f;
            }
            // (1b) U tile, the fused im2col: tap rows of pixel n.
            const int xbase = b * C * HW + iy0 * W + ix0;
#pragma unroll
            for (int e = 0; e < B_PER; ++e) {
                const int iy = iy0 + tap_ky[e], ix = ix0 + tap_kx[e];
                b_next[e] = (valid && iy >= 0 && iy < H && ix >= 0 && ix < W) ? __ldg(&x[xbase + tap_off[e]]) : 0.0f;
            }
        }
        if (t > 0) {
            // (2) the arithmetic on the previous tile: outer products of TM dy values and TN U values
            const int s = (t - 1) & 1;
#pragma unroll
            for (int q = 0; q < BK; ++q) {
                float a[TM], bv[TN];
#pragma unroll
                for (int g = 0; g < TM / 4; ++g) {
                    const float4 v = *(const float4*)&As[s][q][g * (BM / TM) * 4 + tm * 4];
                    a[4 * g] = v.x; a[4 * g + 1] = v.y; a[4 * g + 2] = v.z; a[4 * g + 3] = v.w;
                }
#pragma unroll
                for (int g = 0; g < TN / 4; ++g) {
                    const float4 v = *(const float4*)&Bs[s][q][g * (BN / TN) * 4 + tn * 4];
                    bv[4 * g] = v.x; bv[4 * g + 1] = v.y; bv[4 * g + 2] = v.z; bv[4 * g + 3] = v.w;
                }
#pragma unroll
                for (int i = 0; i < TM; ++i)
#pragma unroll
                    for (int j = 0; j < TN; ++j)
                        acc[i][j] += a[i] * bv[j];
            }
        }
        if (t < ntiles) {
            // (3) registers -> shared buffer t&1
            const int s = t & 1;
#pragma unroll
            for (int e = 0; e < A_PER; ++e) As[s][kk][lr + e * LROWS] = a_next[e];
#pragma unroll
            for (int e = 0; e < B_PER; ++e) Bs[s][kk][lr + e * LROWS] = b_next[e];
        }
        __syncthreads();   // (4)
    }

    // ---- epilogue: this block's partial sums of its BM x BN tile
#if !FINAL_ATOMIC
    const int zoff = blockIdx.z * M * KD;   // this split's row of partial sums
#endif
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int m = m0 + (i / 4) * (BM / TM) * 4 + tm * 4 + (i % 4);
        if (m >= M) continue;
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            const int k = k0 + (j / 4) * (BN / TN) * 4 + tn * 4 + (j % 4);
            if (k < KD) {
#if FINAL_ATOMIC
                atomicAdd(&out[m * KD + k], acc[i][j]);
#else
                out[zoff + m * KD + k] = acc[i][j];
#endif
            }
        }
    }
}
