// Chapter 5, step 2: register-tiled implicit GEMM, for layers with many channels (resnet: 64->64,
// K=3; days100: 32->128), where the arithmetic dominates.
//
// The product is  Y (M x N) = W (M x KD) . U (KD x N)  over the whole batch at once:
// N = B*Ho*Wo output pixels (columns), KD = C*K*K (the reduction), U computed on the fly from x as
// in conv2d_implicit_gemm.cu. What changes is how much each loaded value is reused:
//
//  - Block tile BM x BN (maps x pixels) and a thread micro-tile TM x TN: each thread keeps
//    TM*TN accumulators in registers. Per step kk of the reduction it reads TM values of W and TN
//    of U from shared memory and does TM*TN fused multiply-adds: with 8 x 8, 64 FMAs for 16
//    loads (4 float4 loads), against 1 FMA per 2 loads in the one-output-per-thread kernel. Shared
//    memory bandwidth, not arithmetic, was that kernel's limit.
//  - float4 loads from shared memory. A thread's TN columns are not contiguous: they are TN/4
//    groups of 4, the groups BN/(TN/4) apart. Then the 8 threads of a quarter-warp read 8
//    consecutive float4 (128 contiguous bytes): no bank conflicts. (Eight contiguous columns per
//    thread would put lanes 32 bytes apart: two-way conflicts.) Same for the TM rows.
//  - Double buffering: while the block computes on one shared-memory buffer, each thread's global
//    loads for the next tile are already in flight into registers; they are stored into the other
//    buffer after the arithmetic. One __syncthreads() per step instead of two.
//  - K (KSIZE) is a compile-time constant, so the im2col index arithmetic in the loads is
//    multiplications by constants, and `__restrict__` tells the compiler x, w and y never alias,
//    so it may keep values in registers and use the read-only data path for x and w.
//  - W tile stored transposed (As[k][m]) with rows padded by 4 floats: the transposing stores
//    land in distinct banks, and rows stay 16-byte aligned for the float4 reads.
//
// Tunables (defines): BM, BN (block tile), BK (reduction step), TM, TN (micro-tile), KSIZE.
// Threads per block: (BM/TM) * (BN/TN); 64x128 with 8x8 gives 128.
// Grid: (ceil(N/BN), ceil(M/BM)) with block NTHREADS (1-D). Padding: any. Stride: any.

#ifndef BM
#define BM 64
#endif
#ifndef BN
#define BN 128
#endif
#ifndef BK
#define BK 8
#endif
#ifndef TM
#define TM 8
#endif
#ifndef TN
#define TN 8
#endif
#ifndef KSIZE
#define KSIZE 3
#endif

#define NTHREADS ((BM / TM) * (BN / TN))
#define A_PER ((BM * BK) / NTHREADS)                         // W-tile elements each thread loads
#define B_COLS (NTHREADS >= BN ? 1 : BN / NTHREADS)          // U-tile columns each thread loads
#define B_KSTEP (NTHREADS >= BN ? NTHREADS / BN : 1)         // ... rows apart
#define B_ROWS (BK / B_KSTEP)                                // ... rows per column

static_assert(TM % 4 == 0 && TN % 4 == 0, "TM and TN must be multiples of 4 (float4 shared loads)");
static_assert(BM % TM == 0 && BN % TN == 0, "the micro-tile must divide the block tile");
static_assert((BM * BK) % NTHREADS == 0, "the W tile must split evenly over the threads");
static_assert(NTHREADS >= BN ? (NTHREADS % BN == 0 && BK % (NTHREADS / BN) == 0) : (BN % NTHREADS == 0),
              "the U tile must split evenly over the threads");
static_assert(NTHREADS <= 1024, "at most 1024 threads per block");

__global__ void conv2d_implicit_gemm_reg(const float* __restrict__ x, const float* __restrict__ w,
                                         float* __restrict__ y, int B, int C, int M, int H, int W,
                                         int pad, int stride)
{
    const int K = KSIZE, KK = KSIZE * KSIZE;
    const int Ho = (H + 2 * pad - K) / stride + 1;
    const int Wo = (W + 2 * pad - K) / stride + 1;
    const int P = Ho * Wo, N = B * P, KD = C * KK, HW = H * W;

    __shared__ __align__(16) float As[2][BK][BM + 4];   // W tile, transposed: As[k][m]
    __shared__ __align__(16) float Bs[2][BK][BN];       // U tile: Bs[k][n]

    const int tid = threadIdx.x;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    const int tm = tid / (BN / TN), tn = tid % (BN / TN);   // this thread's micro-tile

    // ---- U-tile loader: this thread's columns are fixed for the whole reduction, so the
    // image and window corner of each are computed once. Invalid columns (past N) get a corner
    // far outside the image, so the bounds test below fails for them.
    const int bn = tid % BN, bk = tid / BN;
    int col_x[B_COLS], col_iy[B_COLS], col_ix[B_COLS];
#pragma unroll
    for (int j = 0; j < B_COLS; ++j) {
        const int n = n0 + bn + j * NTHREADS;
        col_x[j] = 0; col_iy[j] = -(1 << 28); col_ix[j] = 0;
        if (n < N) {
            const int b = n / P, p = n - b * P;
            const int oy = p / Wo, ox = p - oy * Wo;
            col_x[j] = b * C * HW;
            col_iy[j] = oy * stride - pad;
            col_ix[j] = ox * stride - pad;
        }
    }

    float a_next[A_PER], b_next[B_ROWS * B_COLS];     // the next tile, in flight in registers
    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;

    // Software pipeline, one barrier per step. Step t: (1) issue the global loads of tile t into
    // registers, (2) compute tile t-1 from shared buffer (t-1)&1 while those loads are in flight,
    // (3) store tile t into buffer t&1, (4) barrier. Buffer t&1 was last read at step t-1, before
    // that step's barrier, so (3) overwrites nothing still in use.
    const int ntiles = (KD + BK - 1) / BK;
    for (int t = 0; t <= ntiles; ++t) {
        const int k0 = t * BK;
        if (t < ntiles) {
            // (1a) W tile: consecutive threads read consecutive k of one row of w (w is tiny and
            // stays in L1/L2).
#pragma unroll
            for (int e = 0; e < A_PER; ++e) {
                const int i = tid + e * NTHREADS, ak = i % BK, am = i / BK;
                a_next[e] = (m0 + am < M && k0 + ak < KD) ? w[(m0 + am) * KD + k0 + ak] : 0.0f;
            }
            // (1b) U tile, the fused im2col: row k -> (c, ky, kx), the same for all this thread's
            // columns; consecutive threads take consecutive columns = neighbouring pixels.
#pragma unroll
            for (int r = 0; r < B_ROWS; ++r) {
                const int k = k0 + bk + r * B_KSTEP;
                const int c = k / KK, rem = k - c * KK, ky = rem / K, kx = rem - ky * K;
#pragma unroll
                for (int j = 0; j < B_COLS; ++j) {
                    const int iy = col_iy[j] + ky, ix = col_ix[j] + kx;
                    b_next[r * B_COLS + j] = (k < KD && iy >= 0 && iy < H && ix >= 0 && ix < W)
                                                 ? x[col_x[j] + c * HW + iy * W + ix] : 0.0f;
                }
            }
        }
        if (t > 0) {  // listing: reduction_step
            // (2) the arithmetic on the previous tile
            const int s = (t - 1) & 1;
#pragma unroll
            for (int kk = 0; kk < BK; ++kk) {
                float a[TM], bv[TN];
#pragma unroll
                for (int g = 0; g < TM / 4; ++g) {  // listing: micro_tile
                    const float4 v = *(const float4*)&As[s][kk][g * (BM / TM) * 4 + tm * 4];
                    a[4 * g] = v.x; a[4 * g + 1] = v.y; a[4 * g + 2] = v.z; a[4 * g + 3] = v.w;
                }
#pragma unroll
                for (int g = 0; g < TN / 4; ++g) {
                    const float4 v = *(const float4*)&Bs[s][kk][g * (BN / TN) * 4 + tn * 4];
                    bv[4 * g] = v.x; bv[4 * g + 1] = v.y; bv[4 * g + 2] = v.z; bv[4 * g + 3] = v.w;
                }
#pragma unroll
                for (int i = 0; i < TM; ++i)
#pragma unroll
                    for (int j = 0; j < TN; ++j)
                        acc[i][j] += a[i] * bv[j];  // end listing: micro_tile
            }  // end listing: reduction_step
        }
        if (t < ntiles) {
            // (3) registers -> shared buffer t&1 (W transposed: As[k][m])
            const int s = t & 1;
#pragma unroll
            for (int e = 0; e < A_PER; ++e) {
                const int i = tid + e * NTHREADS;
                As[s][i % BK][i / BK] = a_next[e];
            }
#pragma unroll
            for (int r = 0; r < B_ROWS; ++r)
#pragma unroll
                for (int j = 0; j < B_COLS; ++j)
                    Bs[s][bk + r * B_KSTEP][bn + j * NTHREADS] = b_next[r * B_COLS + j];
        }
        __syncthreads();   // (4)
    }

    // ---- epilogue: column n of the product is pixel p of image b, y[b][m][p].
    // When P is a multiple of 4, a group of 4 columns (4-aligned) lies in one image at a 4-aligned
    // pixel: one 16-byte store. Otherwise (or at the end of the batch), element by element.
    const bool vec = (P % 4) == 0;
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int m = m0 + (i / 4) * (BM / TM) * 4 + tm * 4 + (i % 4);
        if (m >= M) continue;
#pragma unroll
        for (int g = 0; g < TN / 4; ++g) {
            const int n = n0 + g * (BN / TN) * 4 + tn * 4;
            if (vec && n + 3 < N) {
                const int b = n / P, p = n - b * P;
                float4 v;
                v.x = acc[i][4 * g]; v.y = acc[i][4 * g + 1]; v.z = acc[i][4 * g + 2]; v.w = acc[i][4 * g + 3];
                *(float4*)&y[(b * M + m) * P + p] = v;
            } else {
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    if (n + q < N) {
                        const int b = (n + q) / P, p = (n + q) - b * P;
                        y[(b * M + m) * P + p] = acc[i][4 * g + q];
                    }
                }
            }
        }
    }
}
