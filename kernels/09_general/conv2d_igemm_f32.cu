// Chapter 9: the fp32 implicit GEMM, taken the rest of the way towards cuBLAS's SGEMM (the steps of
// siboehm's SGEMM_CUDA), on plain FFMA: no tensor cores, no TF32. It takes every 2D layer torch's
// conv2d takes but the depthwise ones (groups == C keep their own kernels): dilation, Kh != Kw,
// a stride and a padding per axis, and groups.
//
//   per group g: Y_g (M x N) = Wt_g^T (M x KD) . U_g (KD x N),  N = B*Ho*Wo output pixels,
//   KD = C*Kh*Kw, M and C the maps and channels of one group (M/groups and C/groups of the layer),
//   U_g the im2col matrix of group g's channels of x (NCHW), formed tile by tile in shared memory,
//   never in global memory. The group is blockIdx.y: a grouped layer is `groups` GEMMs side by side,
//   each reading its own channels and its own mask and writing its own maps.
//
// Groups, dilation, non-square masks and per-axis stride and padding change only index arithmetic:
// tap (ky, kx) of output pixel (oy, ox) reads x at (oy*sh - ph + ky*dh, ox*sw - pw + kx*dw).
//
// What it adds to chapter 5's register-tiled kernel (conv2d_implicit_gemm_reg.cu):
//  - Warp tiling. Each warp owns a WM x WN piece of the block tile and its 32 lanes are laid out
//    (WM/TM) x (WN/TN) inside it; a lane's TM x TN micro-tile is (TM/4) x (TN/4) groups of 4 x 4,
//    the groups WM/(TM/4) rows and WN/(TN/4) columns apart. A float4 read of the A tile then
//    touches WM/TM distinct 16-byte words (64 bytes for 32x64), of the B tile WN/TN (128 bytes):
//    one shared-memory wavefront each, for 16 FFMAs per lane.
//  - The mask transposed to K-major, Wt[g][k][m] (igemm_mask_kmajor below, one small launch the
//    launcher makes every call), rows padded to Mp = M rounded up to 4 and KD to a multiple of 32 with zeros: the A
//    tile is a copy of BK rows of Wt, one 16-byte load per float4, no transposing store and no
//    bounds test along k. With the mask flipped and transposed the same kernel computes dE/dX (one
//    launch per stride phase, OUT_STRIDED); with x's images and channels swapped (strides, not a
//    copy) and dy as the mask, dE/dW (convlab/ops/igemm.py).
//  - The reduction in filter-position-major order for MODE 1: k = (ky*Kw + kx)*C + c. With C a
//    multiple of BK, all BK rows of a step share one filter tap (ky, kx), so the im2col bounds test
//    and the address of a thread's pixel are worked out once per step, not once per element, and
//    the tap advances by a carry (c0 += BK, then kx, then ky; the dilated offsets by adding dh, dw),
//    never by a division.
//  - Each thread's pixels (image, window corner) are computed once, before the reduction.
//  - MODE 2, the 1x1 stride-1 unpadded layer, is a plain GEMM: U[c][n] is x[b][c][p]; with Ho*Wo a
//    multiple of 4 (VEC4=1) four neighbouring pixels are one 16-byte load and one 16-byte store.
//  - Split-K: gridDim.z > 1 splits the reduction's steps; split z writes its partial sums to
//    out + z*out_total and igemm_splitk_reduce adds them (and the bias) in a fixed order, so the
//    result is the same on every run. For layers with few pixels (7x7, 14x14) whose tile grid
//    would leave SMs idle, and for dW, whose reduction (the batch's pixels) is long.
//  - As chapter 5: A and B tiles double-buffered in shared memory, the next step's global loads in
//    flight in registers while the block computes on the current one: one barrier per step.
//
// MODE 0 takes every other layer (C not a multiple of BK: the 7x7 stem has C = 3, a ResNeXt group
// 4): the natural order k = c*Kh*Kw + ky*Kw + kx, each element's (c, ky, kx) from k by divisions by
// constants.
//
// Strides as arguments: x is read at x + g*x_gs + b*x_ns + c*x_cs + iy*W + ix and the output
// written at out + g*out_gs + b*out_ns + m*out_ms + p, so one kernel serves the forward (NCHW
// strides), dW (x read as x^T: its images are the channels, its channels the images) and dX. With
// OUT_STRIDED, pixel p = (py, px) of the Ho x Wo grid goes to plane position (oy0 + osy*py,
// ox0 + osx*px) of rows oW long: dX of a strided layer is computed one stride phase at a time,
// each phase a sub-grid of dx.
//
// dE/dX of a strided layer is a sum over stride phases, not a transposed GEMM over dy with zeros
// inserted between its pixels. Input row ry + sh*i (phase ry) is reached only by the taps ky for
// which sh divides ry + ph - ky*dh: every (sh/gcd(sh, dh))-th tap, reading dy rows dh/gcd(sh, dh)
// apart. So each phase (ry, rx) is a stride-1 convolution of dy by its own sub-mask (flipped,
// transposed per group), written to its sub-grid of dx with OUT_STRIDED. The zero-inserted GEMM
// would run every tap for every dx pixel: sh*sw times the FLOPs (4x at stride 2), most of its
// loads failing the bounds test. The phases do exactly the layer's FLOPs, at the price of sh*sw
// launches of 1/(sh*sw) of the pixels each (split-K refills the smaller grids) and a mask per
// phase. At stride 1 there is one phase: the whole mask, flipped, padding d*(K-1)-p. Positions no
// tap reaches (a stride larger than the mask's span) are zeros, written by the launcher.
//
// Layout: NCHW. The output's columns are pixels, so stores are along the contiguous axis; U's rows
// are runs of an input row, so a warp's 32 columns of one tap are 32 neighbouring floats (stride 1);
// and MODE 2 needs no reordering at all. NHWC would make C the contiguous axis, which pays when the
// loads are 16-byte vectors along C; here, at one tap per step, the loads along pixels coalesce too.
//
// Tunables (defines): BM, BN, BK (block tile), WM, WN (warp tile), TM, TN (micro-tile), KH, KW (the
// mask), MODE (0, 1, 2), VEC4 (MODE 2: 16-byte loads of x), OUT_STRIDED, MIN_BLOCKS
// (__launch_bounds__'s second value). Threads per block: (BM/WM) * (BN/WN) * 32. Grid:
// (ceil(M/BM) * ceil(N/BN), groups, splits), the M tiles fastest so blocks that run together share
// their input tile in L2.

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
#ifndef KH
#define KH 3
#endif
#ifndef KW
#define KW KH
#endif
#ifndef MODE
#define MODE 1
#endif
#ifndef VEC4
#define VEC4 0
#endif
#ifndef OUT_STRIDED
#define OUT_STRIDED 0
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
                 int Ho, int Wo, int ph, int pw, int sh, int sw, int dh, int dw, int Mp,
                 int x_ns, int x_cs, int x_gs, int out_ns, int out_ms, int out_gs, int out_total,
                 int oW, int oy0, int ox0, int osy, int osx)
{
    const int KK = KH * KW;
    const int P = Ho * Wo, N = B * P, KD = C * KK;
    const int KDp = (KD + 31) / 32 * 32;

    __shared__ __align__(16) float As[2][BK][BM];   // Wt tile: As[k][m]
    __shared__ __align__(16) float Bs[2][BK][BN];   // U tile: Bs[k][n]

    const int tid = threadIdx.x;
    const int mtiles = (M + BM - 1) / BM;
    const int m0 = (blockIdx.x % mtiles) * BM, n0 = (blockIdx.x / mtiles) * BN;

    // This group's channels, mask and maps.
    const int g = blockIdx.y;
    x += (long long)g * x_gs;
    wt += (long long)g * KDp * Mp;
    out += (long long)g * out_gs;
    if (has_bias) bias += g * M;

    // This split's steps of the reduction (an empty split writes zeros).
    const int ntiles = (KD + BK - 1) / BK;
    const int per = (ntiles + gridDim.z - 1) / gridDim.z;
    const int t_begin = blockIdx.z * per, t_end = min(ntiles, t_begin + per);
    out += (long long)blockIdx.z * out_total;

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
        col_x = col_ok ? b * x_ns + (n - b * P) : 0;
    }
#elif MODE == 2
    const int bn = tid % BN, bk = tid / BN;
    int col_x[B_COLS];                                   // x[b][0][p] of each column
    bool col_ok[B_COLS];
#pragma unroll
    for (int j = 0; j < B_COLS; ++j) {
        const int n = n0 + bn + j * NTHREADS, b = n / P;
        col_ok[j] = n < N;
        col_x[j] = col_ok[j] ? b * x_ns + (n - b * P) : 0;
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
            col_x[j] = b * x_ns;
            col_iy[j] = oy * sh - ph;
            col_ix[j] = ox * sw - pw;
        }
    }
#endif

#if MODE == 1  // listing: first_tap
    // The filter tap and first channel of step t_begin, and the tap's dilated offsets (ky*dh, kx*dw);
    // advanced by a carry after each step.
    int c0, kx, off_y, off_x;
    {
        const int k = t_begin * BK, pos = k / C, ky = pos / KW;
        c0 = k - pos * C; kx = pos - ky * KW;
        off_y = ky * dh; off_x = kx * dw;
    }  // end listing: first_tap
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
            b_next[e] = (col_ok && c < C) ? *(const float4*)&x[col_x + c * x_cs] : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#elif MODE == 2
#pragma unroll
        for (int r = 0; r < B_ROWS; ++r) {
            const int c = k0 + bk + r * B_KSTEP;
#pragma unroll
            for (int j = 0; j < B_COLS; ++j)
                b_next[r][j] = (col_ok[j] && c < C) ? x[col_x[j] + c * x_cs] : 0.0f;
        }
#elif MODE == 1  // listing: loader_step
        // one tap for the whole step: one bounds test and one address per pixel
#pragma unroll
        for (int j = 0; j < B_COLS; ++j) {
            const int iy = col_iy[j] + off_y, ix = col_ix[j] + off_x;
            const bool ok = (unsigned)iy < (unsigned)H && (unsigned)ix < (unsigned)W;
            const int base = col_x[j] + (c0 + bk) * x_cs + iy * W + ix;
#pragma unroll
            for (int r = 0; r < B_ROWS; ++r)
                b_next[r][j] = ok ? x[base + r * B_KSTEP * x_cs] : 0.0f;
        }  // listing: tap_carry
        c0 += BK;                              // the next step's tap
        if (c0 == C) {
            c0 = 0; off_x += dw;
            if (++kx == KW) { kx = 0; off_x = 0; off_y += dh; }
        }  // end listing: loader_step  // end listing: tap_carry
#else
#pragma unroll
        for (int r = 0; r < B_ROWS; ++r) {
            const int k = k0 + bk + r * B_KSTEP;
            const int c = k / KK, rem = k - c * KK, ky_ = rem / KW, kx_ = rem - ky_ * KW;
            const int oy = ky_ * dh, ox = kx_ * dw;
#pragma unroll
            for (int j = 0; j < B_COLS; ++j) {
                const int iy = col_iy[j] + oy, ix = col_ix[j] + ox;
                b_next[r][j] = (k < KD && (unsigned)iy < (unsigned)H && (unsigned)ix < (unsigned)W)
                                   ? x[col_x[j] + c * x_cs + iy * W + ix] : 0.0f;
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

    // ---- this lane's place: warp (wm, wn) of the block tile, lane (lm, ln) of the warp tile  // listing: main_loop
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
            for (int q = 0; q < TM / 4; ++q) {
                const float4 v = *(const float4*)&As[s][kk][wm + q * (WM / TM) * 4 + lm * 4];
                a[4 * q] = v.x; a[4 * q + 1] = v.y; a[4 * q + 2] = v.z; a[4 * q + 3] = v.w;
            }
#pragma unroll
            for (int q = 0; q < TN / 4; ++q) {
                const float4 v = *(const float4*)&Bs[s][kk][wn + q * (WN / TN) * 4 + ln * 4];
                b[4 * q] = v.x; b[4 * q + 1] = v.y; b[4 * q + 2] = v.z; b[4 * q + 3] = v.w;
            }
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j)
                    acc[i][j] += a[i] * b[j];
        }
        if (t + 1 < t_end) store(s ^ 1);
        __syncthreads();
    }  // end listing: main_loop

    // ---- epilogue: column n is pixel p of image b, out[b*out_ns + m*out_ms + p]. With P % 4 == 0 a
    // group of 4 columns (4-aligned) lies in one image: one 16-byte store (vec_out: the launcher
    // checked that P, out_ns and out_ms are multiples of 4 and that out is 16-byte aligned).
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int m = m0 + wm + (i / 4) * (WM / TM) * 4 + lm * 4 + (i % 4);
        if (m >= M) continue;
        const float bv = has_bias ? bias[m] : 0.0f;
#pragma unroll
        for (int g4 = 0; g4 < TN / 4; ++g4) {
            const int n = n0 + wn + g4 * (WN / TN) * 4 + ln * 4;
#if OUT_STRIDED
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                if (n + q < N) {
                    const int b = (n + q) / P, p = (n + q) - b * P, py = p / Wo, px = p - py * Wo;
                    out[b * out_ns + m * out_ms + (oy0 + osy * py) * oW + ox0 + osx * px] = acc[i][4 * g4 + q] + bv;
                }
            }
#else
            if (vec_out && n < N) {
                const int b = n / P, p = n - b * P;
                *(float4*)&out[b * out_ns + m * out_ms + p] =
                    make_float4(acc[i][4 * g4] + bv, acc[i][4 * g4 + 1] + bv, acc[i][4 * g4 + 2] + bv, acc[i][4 * g4 + 3] + bv);
            } else {
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    if (n + q < N) {
                        const int b = (n + q) / P, p = (n + q) - b * P;
                        out[b * out_ns + m * out_ms + p] = acc[i][4 * g4 + q] + bv;
                    }
                }
            }
#endif
        }
    }
}

// y[i] = bias[(i / P) % M] + the splits' partial sums of output i, added in split order (the same
// bits on every run). total = the output's size (M maps of P pixels per image); grid-stride over i,
// so any grid covers it.
__global__ void igemm_splitk_reduce(const float* __restrict__ part, const float* __restrict__ bias,
                                    float* __restrict__ y, int has_bias, int splits, int total, int M, int P)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        float v = has_bias ? bias[(i / P) % M] : 0.0f;
        for (int s = 0; s < splits; ++s) v += part[(long long)s * total + i];
        y[i] = v;
    }
}

// Wt[g][k][m] (groups x KDp x Mp, zeros past KD and M) of the convolution with M maps of C channels
// per group and a Kh x Kw mask: k = c*Kh*Kw + ky*Kw + kx (order 0, MODE 0 and 2) or
// k = (ky*Kw + kx)*C + c (order 1, MODE 1).
// flip=0: from its mask w[g*M + m][c][ky][kx] (w of shape (groups*M, C, Kh, Kw)).
// flip=1: the mask of one stride phase of dE/dX, from the forward mask w of shape
// (groups*C, M, Khf, Kwf): the forward's maps are dX's channels, and tap (ky, kx) of the phase is
// forward tap (ky0 + (Kh-1-ky)*ty, kx0 + (Kw-1-kx)*tx), flipped and every ty-th (tx-th) from ky0
// (kx0); at stride 1 ky0 = kx0 = 0, ty = tx = 1, the whole mask flipped. One thread per element of
// Wt, m fastest: the writes coalesce; the mask is read once, scattered.
__global__ void igemm_mask_kmajor(const float* __restrict__ w, float* __restrict__ wt, int M, int C, int Mp,
                                  int KDp, int order, int flip, int Kh, int Kw, int groups, int Khf, int Kwf,
                                  int ky0, int ty, int kx0, int tx)
{
    const int KK = Kh * Kw, KD = C * KK, per_group = KDp * Mp;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < groups * per_group; i += gridDim.x * blockDim.x) {
        const int g = i / per_group, km = i - g * per_group, k = km / Mp, m = km - k * Mp;
        float v = 0.0f;
        if (m < M && k < KD) {
            int c, tap;
            if (order == 1) { tap = k / C; c = k - tap * C; }
            else { c = k / KK; tap = k - c * KK; }
            const int ky = tap / Kw, kx = tap - ky * Kw;
            v = flip ? w[((g * C + c) * M + m) * Khf * Kwf + (ky0 + (Kh - 1 - ky) * ty) * Kwf + kx0 + (Kw - 1 - kx) * tx]
                     : w[((g * M + m) * C + c) * KK + tap];
        }
        wt[i] = v;
    }
}
