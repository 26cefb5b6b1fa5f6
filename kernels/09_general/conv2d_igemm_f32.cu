// Chapter 9: the fp32 implicit GEMM, taken the rest of the way towards cuBLAS's SGEMM (the steps of
// siboehm's SGEMM_CUDA), on plain FFMA: no tensor cores, no TF32.
//
//   Y (M x N) = Wt^T (M x KD) . U (KD x N),  N = B*Ho*Wo output pixels, KD = C*K*K,
//   U the im2col matrix of x (NCHW), formed tile by tile in shared memory, never in global memory.
//
// What it adds to chapter 5's register-tiled kernel (conv2d_implicit_gemm_reg.cu):
//  - Warp tiling. Each warp owns a WM x WN piece of the block tile and its 32 lanes are laid out
//    (WM/TM) x (WN/TN) inside it; a lane's TM x TN micro-tile is (TM/4) x (TN/4) groups of 4 x 4,
//    the groups WM/(TM/4) rows and WN/(TN/4) columns apart. A float4 read of the A tile then
//    touches WM/TM distinct 16-byte words (64 bytes for 32x64), of the B tile WN/TN (128 bytes):
//    one shared-memory wavefront each, for 16 FFMAs per lane.
//  - The mask transposed once to K-major, Wt[k][m] (igemm_mask_kmajor below, kept by the launcher
//    while the weights do not change), rows padded to Mp = M rounded up to 4 and KD to a multiple
//    of 32 with zeros: the A tile is a copy of BK rows of Wt, one 16-byte load per float4, no
//    transposing store and no bounds test along k. With the mask flipped and transposed the same
//    kernel computes dE/dX of a stride-1 layer; with x and dy's images and channels swapped, dE/dW
//    (convlab/ops/igemm.py).
//  - The reduction in filter-position-major order for MODE 1: k = (ky*K + kx)*C + c. With C a
//    multiple of BK, all BK rows of a step share one filter tap (ky, kx), so the im2col bounds test
//    and the address of a thread's pixel are worked out once per step, not once per element, and
//    the tap advances by a carry (c0 += BK, then kx, then ky), never by a division.
//  - Each thread's pixels (image, window corner) are computed once, before the reduction.
//  - MODE 2, the 1x1 stride-1 unpadded layer, is a plain GEMM: U[c][n] is x[b][c][p]; with Ho*Wo a
//    multiple of 4 (VEC4=1) four neighbouring pixels are one 16-byte load and one 16-byte store.
//  - Split-K: gridDim.z > 1 splits the reduction's steps; split z writes its partial sums to
//    out + z*B*M*Ho*Wo and igemm_splitk_reduce adds them (and the bias) in a fixed order, so the
//    result is the same on every run. For layers with few pixels (7x7, 14x14) whose tile grid
//    would leave SMs idle.
//  - As chapter 5: A and B tiles double-buffered in shared memory, the next step's global loads in
//    flight in registers while the block computes on the current one: one barrier per step.
//
// MODE 0 takes every other layer (C not a multiple of BK: the 7x7 stem has C = 3): the natural
// order k = c*K*K + ky*K + kx, each element's (c, ky, kx) from k by divisions by constants.
//
// Layout: NCHW. The output's columns are pixels, so stores are along the contiguous axis; U's rows
// are runs of an input row, so a warp's 32 columns of one tap are 32 neighbouring floats (stride 1);
// and MODE 2 needs no reordering at all. NHWC would make C the contiguous axis, which pays when the
// loads are 16-byte vectors along C; here, at one tap per step, the loads along pixels coalesce too.
//
// Tunables (defines): BM, BN, BK (block tile), WM, WN (warp tile), TM, TN (micro-tile), KSIZE,
// MODE (0, 1, 2), VEC4 (MODE 2: 16-byte loads of x), MIN_BLOCKS (__launch_bounds__'s second value).
// Threads per block: (BM/WM) * (BN/WN) * 32. Grid: (ceil(M/BM) * ceil(N/BN), 1, splits), the M tiles
// fastest so blocks that run together share their input tile in L2.

#ifndef BM
#define BM 128
#endif
#ifndef BN
#define BN 128
#endif
#ifndef BK
#define BK 8
#endif
#ifndef WM
#define WM 32
#endif
#ifndef WN
#define WN 64
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
#ifndef MODE
#define MODE 1
#endif
#ifndef VEC4
#define VEC4 0
#endif
#ifndef MIN_BLOCKS
#define MIN_BLOCKS 1
#endif

#define NTHREADS ((BM / WM) * (BN / WN) * 32)
#define A_VECS (BK * BM / 4 / NTHREADS)                      // float4s of the A tile per thread
#define A_RSTEP (NTHREADS / (BM / 4))                        // ... rows apart
#define BV_VECS (BK * BN / 4 / NTHREADS)                     // MODE 2, VEC4: float4s of the B tile
#define BV_RSTEP (NTHREADS / (BN / 4))
#define B_COLS (NTHREADS >= BN ? 1 : BN / NTHREADS)          // scalar B loads: columns per thread
#define B_KSTEP (NTHREADS >= BN ? NTHREADS / BN : 1)         // ... rows apart
#define B_ROWS (BK / B_KSTEP)                                // ... rows per column
#define LOAD_VEC (MODE == 2 && VEC4)

static_assert((WM / TM) * (WN / TN) == 32, "a warp tile must hold 32 micro-tiles: (WM/TM)*(WN/TN) == 32");
static_assert(TM % 4 == 0 && TN % 4 == 0, "TM and TN must be multiples of 4 (float4 shared loads)");
static_assert(BM % WM == 0 && BN % WN == 0, "the warp tile must divide the block tile");
static_assert(BK % 4 == 0 && 32 % BK == 0, "BK must be 4, 8, 16 or 32 (the mask's rows are padded to 32)");
static_assert(NTHREADS % (BM / 4) == 0 && (BK * BM / 4) % NTHREADS == 0, "the A tile must split evenly");
static_assert(!LOAD_VEC || (NTHREADS % (BN / 4) == 0 && (BK * BN / 4) % NTHREADS == 0),
              "the B tile must split evenly into float4s");
static_assert(NTHREADS >= BN ? (NTHREADS % BN == 0 && BK % (NTHREADS / BN) == 0) : (BN % NTHREADS == 0),
              "the B tile must split evenly over the threads");
static_assert(NTHREADS <= 1024, "at most 1024 threads per block");

__global__ void __launch_bounds__(NTHREADS, MIN_BLOCKS)
conv2d_igemm_f32(const float* __restrict__ x, const float* __restrict__ wt, const float* __restrict__ bias,
                 float* __restrict__ out, int has_bias, int vec_out, int B, int C, int M, int H, int W,
                 int Ho, int Wo, int pad, int stride, int Mp)
{
    const int KK = KSIZE * KSIZE;
    const int P = Ho * Wo, N = B * P, KD = C * KK;
#if MODE != 2
    const int HW = H * W;
#endif

    __shared__ __align__(16) float As[2][BK][BM];   // Wt tile: As[k][m]
    __shared__ __align__(16) float Bs[2][BK][BN];   // U tile: Bs[k][n]

    const int tid = threadIdx.x;
    const int mtiles = (M + BM - 1) / BM;
    const int m0 = (blockIdx.x % mtiles) * BM, n0 = (blockIdx.x / mtiles) * BN;

    // This split's steps of the reduction (the launcher makes every split non-empty).
    const int ntiles = (KD + BK - 1) / BK;
    const int per = (ntiles + gridDim.z - 1) / gridDim.z;
    const int t_begin = blockIdx.z * per, t_end = min(ntiles, t_begin + per);
    out += (long long)blockIdx.z * N * M;

    // ---- A loader: float4 column a_c4 of rows a_r + e*A_RSTEP of the tile.
    const int a_c4 = tid % (BM / 4), a_r = tid / (BM / 4);
    const bool a_ok = m0 + a_c4 * 4 < Mp;   // Mp % 4 == 0: a float4 is wholly in or out

    // ---- B loader: this thread's pixels, fixed for the whole reduction.
#if LOAD_VEC
    const int b_c4 = tid % (BN / 4), b_r = tid / (BN / 4);
    int col_x;
    bool col_ok;
    {
        const int n = n0 + b_c4 * 4;          // P % 4 == 0: the 4 pixels lie in one image
        const int b = n / P;
        col_ok = n < N;
        col_x = col_ok ? b * C * P + (n - b * P) : 0;
    }
#elif MODE == 2
    const int bn = tid % BN, bk = tid / BN;
    int col_x[B_COLS];                                   // x[b][0][p] of each column
    bool col_ok[B_COLS];
#pragma unroll
    for (int j = 0; j < B_COLS; ++j) {
        const int n = n0 + bn + j * NTHREADS, b = n / P;
        col_ok[j] = n < N;
        col_x[j] = col_ok[j] ? b * C * P + (n - b * P) : 0;
    }
#else
    const int bn = tid % BN, bk = tid / BN;
    int col_x[B_COLS], col_iy[B_COLS], col_ix[B_COLS];   // image offset, window corner
#pragma unroll
    for (int j = 0; j < B_COLS; ++j) {
        const int n = n0 + bn + j * NTHREADS;
        col_x[j] = 0; col_iy[j] = -(1 << 28); col_ix[j] = 0;   // past N: a corner no tap reaches
        if (n < N) {
            const int b = n / P, p = n - b * P, oy = p / Wo, ox = p - oy * Wo;
            col_x[j] = b * C * HW;
            col_iy[j] = oy * stride - pad;
            col_ix[j] = ox * stride - pad;
        }
    }
#endif

#if MODE == 1
    // The filter tap and first channel of step t_begin; advanced by a carry after each step.
    int c0, ky, kx;
    {
        const int k = t_begin * BK, pos = k / C;
        c0 = k - pos * C; ky = pos / KSIZE; kx = pos - ky * KSIZE;
    }
#endif

    float4 a_next[A_VECS];
#if LOAD_VEC
    float4 b_next[BV_VECS];
#else
    float b_next[B_ROWS][B_COLS];
#endif

    // Global loads of step t into registers.
    auto load = [&](int t) {
        const int k0 = t * BK;
#pragma unroll
        for (int e = 0; e < A_VECS; ++e) {
            const int k = k0 + a_r + e * A_RSTEP;
            a_next[e] = a_ok ? *(const float4*)&wt[k * Mp + m0 + a_c4 * 4] : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#if LOAD_VEC
#pragma unroll
        for (int e = 0; e < BV_VECS; ++e) {
            const int c = k0 + b_r + e * BV_RSTEP;
            b_next[e] = (col_ok && c < C) ? *(const float4*)&x[col_x + c * P] : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#elif MODE == 2
#pragma unroll
        for (int r = 0; r < B_ROWS; ++r) {
            const int c = k0 + bk + r * B_KSTEP;
#pragma unroll
            for (int j = 0; j < B_COLS; ++j)
                b_next[r][j] = (col_ok[j] && c < C) ? x[col_x[j] + c * P] : 0.0f;
        }
#elif MODE == 1
        // one tap for the whole step: one bounds test and one address per pixel
#pragma unroll
        for (int j = 0; j < B_COLS; ++j) {
            const int iy = col_iy[j] + ky, ix = col_ix[j] + kx;
            const bool ok = (unsigned)iy < (unsigned)H && (unsigned)ix < (unsigned)W;
            const int base = col_x[j] + (c0 + bk) * HW + iy * W + ix;
#pragma unroll
            for (int r = 0; r < B_ROWS; ++r)
                b_next[r][j] = ok ? x[base + r * B_KSTEP * HW] : 0.0f;
        }
        c0 += BK;                              // the next step's tap
        if (c0 == C) { c0 = 0; if (++kx == KSIZE) { kx = 0; ++ky; } }
#else
#pragma unroll
        for (int r = 0; r < B_ROWS; ++r) {
            const int k = k0 + bk + r * B_KSTEP;
            const int c = k / KK, rem = k - c * KK, ky_ = rem / KSIZE, kx_ = rem - ky_ * KSIZE;
#pragma unroll
            for (int j = 0; j < B_COLS; ++j) {
                const int iy = col_iy[j] + ky_, ix = col_ix[j] + kx_;
                b_next[r][j] = (k < KD && (unsigned)iy < (unsigned)H && (unsigned)ix < (unsigned)W)
                                   ? x[col_x[j] + c * HW + iy * W + ix] : 0.0f;
            }
        }
#endif
    };

    // Registers -> shared buffer s.
    auto store = [&](int s) {
#pragma unroll
        for (int e = 0; e < A_VECS; ++e)
            *(float4*)&As[s][a_r + e * A_RSTEP][a_c4 * 4] = a_next[e];
#if LOAD_VEC
#pragma unroll
        for (int e = 0; e < BV_VECS; ++e)
            *(float4*)&Bs[s][b_r + e * BV_RSTEP][b_c4 * 4] = b_next[e];
#else
#pragma unroll
        for (int r = 0; r < B_ROWS; ++r)
#pragma unroll
            for (int j = 0; j < B_COLS; ++j)
                Bs[s][bk + r * B_KSTEP][bn + j * NTHREADS] = b_next[r][j];
#endif
    };

    // ---- this lane's place: warp (wm, wn) of the block tile, lane (lm, ln) of the warp tile
    const int warp = tid / 32, lane = tid % 32;
    const int wm = (warp / (BN / WN)) * WM, wn = (warp % (BN / WN)) * WN;
    const int lm = lane / (WN / TN), ln = lane % (WN / TN);

    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;

    // Software pipeline: step t computes from buffer s while step t+1's loads are in flight, then
    // stores them into buffer s^1, last read by step t-1 (before its barrier). The loads are not
    // under a branch: behind `if (t + 1 < t_end)` nvcc merged them into the store's branch after
    // the arithmetic (sm_90 SASS), where nothing hides their latency; instead the last step loads
    // its own tile again and never stores it.
    if (t_begin < t_end) {
        load(t_begin);
        store(0);
    }
    __syncthreads();
    for (int t = t_begin; t < t_end; ++t) {
        const int s = (t - t_begin) & 1;
        load(min(t + 1, t_end - 1));
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            float a[TM], b[TN];
#pragma unroll
            for (int g = 0; g < TM / 4; ++g) {
                const float4 v = *(const float4*)&As[s][kk][wm + g * (WM / TM) * 4 + lm * 4];
                a[4 * g] = v.x; a[4 * g + 1] = v.y; a[4 * g + 2] = v.z; a[4 * g + 3] = v.w;
            }
#pragma unroll
            for (int g = 0; g < TN / 4; ++g) {
                const float4 v = *(const float4*)&Bs[s][kk][wn + g * (WN / TN) * 4 + ln * 4];
                b[4 * g] = v.x; b[4 * g + 1] = v.y; b[4 * g + 2] = v.z; b[4 * g + 3] = v.w;
            }
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j)
                    acc[i][j] += a[i] * b[j];
        }
        if (t + 1 < t_end) store(s ^ 1);
        __syncthreads();
    }

    // ---- epilogue: column n is pixel p of image b, out[b][m][p]. With P % 4 == 0 a group of 4
    // columns (4-aligned) lies in one image: one 16-byte store (vec_out: the launcher checked
    // that P % 4 == 0 and that out is 16-byte aligned).
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int m = m0 + wm + (i / 4) * (WM / TM) * 4 + lm * 4 + (i % 4);
        if (m >= M) continue;
        const float bv = has_bias ? bias[m] : 0.0f;
#pragma unroll
        for (int g = 0; g < TN / 4; ++g) {
            const int n = n0 + wn + g * (WN / TN) * 4 + ln * 4;
            if (vec_out && n < N) {
                const int b = n / P, p = n - b * P;
                *(float4*)&out[(b * M + m) * P + p] = make_float4(acc[i][4 * g] + bv, acc[i][4 * g + 1] + bv,
                                                                  acc[i][4 * g + 2] + bv, acc[i][4 * g + 3] + bv);
            } else {
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    if (n + q < N) {
                        const int b = (n + q) / P, p = (n + q) - b * P;
                        out[(b * M + m) * P + p] = acc[i][4 * g + q] + bv;
                    }
                }
            }
        }
    }
}

// y[i] = bias[m] + the splits' partial sums of output i, added in split order (the same bits on
// every run). total = B*M*P; grid-stride over i, so any grid covers it.
__global__ void igemm_splitk_reduce(const float* __restrict__ part, const float* __restrict__ bias,
                                    float* __restrict__ y, int has_bias, int splits, int total, int M, int P)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        float v = has_bias ? bias[(i / P) % M] : 0.0f;
        for (int s = 0; s < splits; ++s) v += part[(long long)s * total + i];
        y[i] = v;
    }
}

// Wt[k][m] (KDp x Mp, zeros past KD and M) of the convolution with M maps of C channels:
// k = c*K*K + ky*K + kx (order 0, MODE 0 and 2) or k = (ky*K + kx)*C + c (order 1, MODE 1).
// flip=0: from its mask w[m][c][ky][kx]. flip=1: the mask of dE/dX at stride 1, from the forward
// mask w[c][m][K-1-ky][K-1-kx] (w of shape (C, M, K, K)): the forward's maps are dX's channels,
// the taps flipped. One thread per element of Wt, m fastest: the writes coalesce; the mask is read
// once, scattered.
__global__ void igemm_mask_kmajor(const float* __restrict__ w, float* __restrict__ wt, int M, int C, int Mp,
                                  int KDp, int order, int flip)
{
    const int KK = KSIZE * KSIZE, KD = C * KK;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < KDp * Mp; i += gridDim.x * blockDim.x) {
        const int k = i / Mp, m = i - k * Mp;
        float v = 0.0f;
        if (m < M && k < KD) {
            int c, tap;
            if (order == 1) { tap = k / C; c = k - tap * C; }
            else { c = k / KK; tap = k - c * KK; }
            v = flip ? w[(c * M + m) * KK + (KK - 1 - tap)] : w[(m * C + c) * KK + tap];
        }
        wt[i] = v;
    }
}
