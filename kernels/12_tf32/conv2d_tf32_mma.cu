// Requires sm_80 or newer: cp.async and mma.sync.m16n8k8 with .tf32 operands
//
// Chapter 12: an fp32 convolution on the tensor cores through mma.sync with TF32 operands, in one
// of two forms (PRODUCTS):
//   1  TF32: each operand rounded to TF32 (10 mantissa bits), one product per multiply-add;
//   3  3xTF32: each operand split, a = a_hi + a_lo (tf32.cuh's tf32_split), and
//      a*b ~ a_lo*b_hi + a_hi*b_lo + a_hi*b_hi, the small products first: fp32's accuracy at
//      three tensor-core products per multiply-add.
// The split is made once per element, in registers, as ldmatrix delivers the fragments: a
// fragment of A meets NI fragments of B, one of B meets MI of A.
//
// GEMM view: Y (M x P) = W (M x K) . X^T, M maps (the MMA's rows), P = B*Ho*Wo output pixels (its
// columns), K = Kh*Kw*C4 with the channel fastest. The maps are the rows so that a lane's two
// adjacent accumulators are two adjacent pixels of one map: y is written NCHW, as torch's conv2d
// returns it, straight from the registers. x is NHWC and the mask (M, Kh, Kw, C4), both with C
// padded with zeros to C4, a multiple of 4 (the launcher makes them: convlab/ops/tf32.py), so a row
// of either is contiguous along K: 4 channels are one 16-byte cp.async.
//
//  - Block tile BM maps x BN pixels, 32-float steps of K (one tap, 32 channels); WARPS_M x WARPS_N
//    warps, each a (BM/WARPS_M) x (BN/WARPS_N) warp tile of MI x NI m16n8 accumulators.
//  - STAGES-deep cp.async pipeline, shared rows of 32 floats (128 bytes, 8 chunks of 16), chunk c of
//    row r stored at slot c ^ (r % 8): the 8 rows an ldmatrix phase reads fall in 8 different bank
//    groups, and the next 8 floats of a fragment are its address XOR a constant.
//  - Fragments: ldmatrix reads 8 x 4 floats as 8 x 8 halves, so lane l gets float l%4 of row l/4:
//    the m16n8k8 layout of a TF32 operand (tf32.cuh).
//  - Promotion: the tensor cores add a step's products and the accumulator rounding toward zero
//    (clemu_mma_numerics.h), which over a long reduction drifts towards zero by about one unit in
//    the last place per step. Each k8 step's products are summed by the tensor cores into a fresh
//    zero, and that sum added to the accumulator by an ordinary fp32 add (rounded to nearest).
//  - Epilogue: bias (fp32) added, each lane's pairs of pixels stored to NCHW y.
//
// Layout: x (B, H, W, C4) float, C4 % 4 == 0, 16-byte aligned; w (M, Kh, Kw, C4) float; bias (M)
// float (read when has_bias); y (B, M, Ho, Wo) float. Stride, padding and dilation: any.
// Grid: (ceil(P/BN), ceil(M/BM)), block 32*WARPS_M*WARPS_N threads, dynamic shared memory
// STAGES*(BM+BN)*32*4 bytes. Tunables: BM, BN, WARPS_M, WARPS_N, STAGES, PRODUCTS.
#include "tf32.cuh"

#ifndef BM
#define BM 128
#endif
#ifndef BN
#define BN 128
#endif
#ifndef WARPS_M
#define WARPS_M 2
#endif
#ifndef WARPS_N
#define WARPS_N 4
#endif
#ifndef STAGES
#define STAGES 3
#endif
#ifndef PRODUCTS
#define PRODUCTS 3
#endif

constexpr int BK = 32;                            // floats per step: one 128-byte shared row
constexpr int THREADS = 32 * WARPS_M * WARPS_N;
constexpr int WTM = BM / WARPS_M, WTN = BN / WARPS_N;
constexpr int MI = WTM / 16, NI = WTN / 8;        // m16n8 tiles per warp
constexpr int ROWS_PER_PASS = THREADS / 8;        // rows one pass of the block's 16-byte copies fills
constexpr int A_ITERS = BM / ROWS_PER_PASS, B_ITERS = BN / ROWS_PER_PASS;
constexpr int STAGE = (BM + BN) * BK;             // floats per stage: BM map rows, then BN pixel rows

static_assert(PRODUCTS == 1 || PRODUCTS == 3, "PRODUCTS: 1 (TF32) or 3 (3xTF32)");
static_assert(WTM % 16 == 0 && WTN % 16 == 0, "warp tiles must be multiples of 16 x 16");
static_assert(BM % WARPS_M == 0 && BN % WARPS_N == 0, "the warps must split the block tile");
static_assert(BM % ROWS_PER_PASS == 0 && BN % ROWS_PER_PASS == 0, "the block's copies must cover BM and BN rows evenly");
static_assert(ROWS_PER_PASS % 8 == 0, "a thread's copy rows, ROWS_PER_PASS apart, share the swizzle");
static_assert(STAGES >= 2, "at least two stages");

__device__ __forceinline__ int at(int row, int chunk) { return row * BK + ((chunk ^ (row & 7)) << 2); }

__global__ void __launch_bounds__(THREADS)
conv2d_tf32_mma(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ bias,
                float* __restrict__ y, int has_bias, int B, int H, int W, int C4, int M, int Kh, int Kw, int Ho,
                int Wo, int sh, int sw, int ph, int pw, int dh, int dw)
{
    extern __shared__ __align__(128) float smem[];   // [STAGES][BM + BN][BK]

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int HoWo = Ho * Wo, P = B * HoWo;
    const int p0 = blockIdx.x * BN, m0 = blockIdx.y * BM;

    // ---- the loader, set up once: this thread's chunk column, map rows and pixel rows ----
    const int cc = tid % 8, row0 = tid / 8;
    const int dst = at(row0, cc);                    // row row0 + i*ROWS_PER_PASS: dst + i*ROWS_PER_PASS*BK
    const int KK = Kh * Kw;
    int a_off[A_ITERS];                              // w offset of the map row (a map past M copies map M-1:
#pragma unroll                                       // its sums land in rows never stored)
    for (int i = 0; i < A_ITERS; i++) a_off[i] = min(m0 + row0 + i * ROWS_PER_PASS, M - 1) * KK * C4 + cc * 4;
    int b_img[B_ITERS], b_ih[B_ITERS], b_iw[B_ITERS];   // the pixel's image offset and window corner
#pragma unroll
    for (int i = 0; i < B_ITERS; i++) {
        const int p = p0 + row0 + i * ROWS_PER_PASS, n = p / HoWo, q = p % HoWo;
        b_img[i] = n * H * W * C4 + cc * 4;
        b_ih[i] = p < P ? (q / Wo) * sh - ph : -(1 << 30);   // past P: no tap is inside the image
        b_iw[i] = (q % Wo) * sw - pw;
    }

    // The step's tap (kh, kw) and channels c0..c0+31; steps run over the taps, C4 channels each.
    const int c_steps = (C4 + BK - 1) / BK, steps = KK * c_steps;
    int c0 = 0, kw = 0, kh = 0;
    auto load_tile = [&](int to) {                   // to: dst in the stage being filled
        float* as = smem + to;
        float* bs = as + BM * BK;
        const bool c_in = c0 + cc * 4 < C4;          // C4 % 4 == 0: a chunk is all channels or none
        const int tap = (kh * Kw + kw) * C4 + c0;
#pragma unroll
        for (int i = 0; i < A_ITERS; i++) cp_async_16(as + i * ROWS_PER_PASS * BK, w + a_off[i] + tap, c_in);
#pragma unroll
        for (int i = 0; i < B_ITERS; i++) {
            const int ih = b_ih[i] + kh * dh, iw = b_iw[i] + kw * dw;
            const bool in = c_in && (unsigned)ih < (unsigned)H && (unsigned)iw < (unsigned)W;
            // invalid: src-size 0, nothing is read (the address may lie outside x)
            cp_async_16(bs + i * ROWS_PER_PASS * BK, x + (in ? b_img[i] + (ih * W + iw) * C4 + c0 : 0), in);
        }
        c0 += BK;
        if (c0 >= C4) { c0 = 0; if (++kw == Kw) { kw = 0; kh++; } }
    };

    // ---- the warp's fragments ----
    const int wm = warp % WARPS_M, wn = warp / WARPS_M;
    float acc[MI][NI][4];
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int j = 0; j < NI; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.f;

    // ldmatrix rows for the step's first 8 floats (chunks 0, 1); floats 8kk.. are this XOR 8kk.
    // A (16 maps x 8): lanes 0-15 rows 0-15 at floats 0-3, lanes 16-31 at floats 4-7: a[0..3].
    // B (two n8 tiles): maps 0-7 floats 0-3, 0-7 floats 4-7, 8-15 floats 0-3, 8-15 floats 4-7.
    int a_at = at(wm * WTM + (lane & 15), lane >> 4);
    int b_at = BM * BK + at(wn * WTN + (lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);

    for (int st = 0; st < STAGES - 1; st++) {
        if (st < steps) load_tile(st * STAGE + dst);
        cp_async_commit();                           // empty groups keep the count in step
    }
    for (int kt = 0; kt < steps; kt++) {
        cp_async_wait<STAGES - 2>();                 // step kt has landed (this thread's copies) ...
        __syncthreads();                             // ... everyone's; and stage kt-1 is free again
        if (kt + STAGES - 1 < steps) load_tile(((kt + STAGES - 1) % STAGES) * STAGE + dst);
        cp_async_commit();
        const float* stage = smem + (kt % STAGES) * STAGE;

#pragma unroll
        for (int kk = 0; kk < BK / 8; kk++) {  // listing: step
            // the fragments, each split (or rounded) once
            unsigned ah[MI][4], bh[NI][2];
#if PRODUCTS == 3
            unsigned al[MI][4], bl[NI][2];
#endif
#pragma unroll
            for (int i = 0; i < MI; i++) {
                unsigned r[4];
                ldmatrix_x4(r, stage + (a_at ^ (kk * 8)) + i * 16 * BK);
#pragma unroll
                for (int e = 0; e < 4; e++) {
#if PRODUCTS == 3
                    float hi, lo;
                    tf32_split(__uint_as_float(r[e]), hi, lo);
                    ah[i][e] = __float_as_uint(hi);
                    al[i][e] = __float_as_uint(lo);
#else
                    ah[i][e] = cvt_rna_tf32(__uint_as_float(r[e]));
#endif
                }
            }
#pragma unroll
            for (int j = 0; j < NI / 2; j++) {
                unsigned r[4];
                ldmatrix_x4(r, stage + (b_at ^ (kk * 8)) + j * 16 * BK);
#pragma unroll
                for (int e = 0; e < 4; e++) {
#if PRODUCTS == 3
                    float hi, lo;
                    tf32_split(__uint_as_float(r[e]), hi, lo);
                    bh[2 * j + e / 2][e % 2] = __float_as_uint(hi);
                    bl[2 * j + e / 2][e % 2] = __float_as_uint(lo);
#else
                    bh[2 * j + e / 2][e % 2] = cvt_rna_tf32(__uint_as_float(r[e]));
#endif
                }
            }
            // the step's products into a fresh zero, then promoted to the accumulator (rounded to nearest)
#pragma unroll
            for (int i = 0; i < MI; i++)
#pragma unroll
                for (int j = 0; j < NI; j++) {
                    float t[4] = {0.f, 0.f, 0.f, 0.f};
#if PRODUCTS == 3
                    mma_1688_tf32(t, al[i], bh[j]);
                    mma_1688_tf32(t, ah[i], bl[j]);
#endif
                    mma_1688_tf32(t, ah[i], bh[j]);
#pragma unroll
                    for (int e = 0; e < 4; e++) acc[i][j][e] += t[e];  // end listing: step
                }
        }
    }
    cp_async_wait<0>();                              // (the last steps issue no copies: nothing is in flight)

    // ---- epilogue: lane (g, t) holds maps g, g+8 and pixels 2t, 2t+1 of each m16n8 tile ----
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int m = m0 + wm * WTM + i * 16 + (lane >> 2) + h * 8;
            if (m >= M) continue;
            const float b = has_bias ? bias[m] : 0.f;
#pragma unroll
            for (int j = 0; j < NI; j++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int p = p0 + wn * WTN + j * 8 + (lane & 3) * 2 + e;
                    if (p < P) y[((size_t)(p / HoWo) * M + m) * HoWo + p % HoWo] = acc[i][j][2 * h + e] + b;
                }
        }
}
