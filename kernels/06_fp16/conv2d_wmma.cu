// Chapter 6, step 3: tensor cores through WMMA, on chapter 5's implicit GEMM.
//
// The product is chapter 5's  Y (M x N) = A (M x KD) . U (KD x N),  N = B*Ho*Wo pixels, KD = C*K*K,
// with U (the unrolled input) computed on the fly while a tile of it is loaded. A tensor core
// multiplies 16x16 half tiles and accumulates in float: one warp-wide mma_sync is 4,096
// multiply-adds (sm_90: ~1,000 dense fp16 TFLOP/s against ~60 for FFMA). WMMA is the portable C++
// face of it: a warp loads a 16x16 tile of A and of B from memory into "fragments"
// (load_matrix_sync: 32-byte aligned pointer, leading dimension a multiple of 8 halves), multiplies
// them into a float accumulator fragment (mma_sync) and stores that (store_matrix_sync). Which lane
// holds which element is unspecified; all 32 lanes must make each call together.
//
//  - Block tile BM x BN (maps x pixels), WARPS_M x WARPS_N warps; each warp owns a
//    (BM/WARPS_M) x (BN/WARPS_N) part of it as FM x FN accumulator fragments (2 x 4 by default:
//    32 maps x 64 pixels, 64 floats per lane). Per 16-deep step of the reduction a warp loads FM
//    A fragments and FN B fragments from shared memory and issues FM*FN mma_sync.
//  - The layer's shape (C, H, W, K, padding, stride, M) is compiled in, as for chapter 5's
//    direct kernels: every index computation is by constants, and the U-tile loads below take
//    their offsets as immediates. Only the batch size B is a run-time argument.
//  - The reduction runs "tap-major": k = (ky*K + kx)*C + c, so the mask is the (M, K, K, C)
//    reordering of w (convert_fp16.cu's mask_to_tap_major, run by the launcher). When C is a
//    multiple of BK, a BK-deep tile of U is one tap (ky, kx) and BK consecutive channels: each
//    thread computes its pixels' input address and bounds test once per tile, and its BK/2 loads
//    per pixel are that address plus constant multiples of H*W: one load instruction each
//    (ONE_TAP=1; otherwise every row is decoded). A pixel whose window lies in the padding loads
//    from its channel plane's first element instead, and the value is masked to 0 afterwards: no
//    branch, no per-load zeroing.
//  - U tile loads: each thread owns two neighbouring pixels (columns), so consecutive lanes read
//    consecutive pixels (coalesced) and write one half2 per row into shared memory.
//  - Shared memory rows padded by 8 halves (16 bytes): the 8 rows a fragment load reads at once
//    land in different banks, and every fragment pointer stays 32-byte aligned.
//  - Double buffering as in chapter 5: the next tiles' global loads go to registers before the
//    mma_sync on the current ones, and to the other buffer after them; one __syncthreads() a step.
//  - Epilogue: the accumulators go through shared memory (store_matrix_sync, float; each warp
//    16 rows at a time in its own slice), so the output is written as half2 pairs of consecutive
//    pixels of one map: coalesced.
//
// Per 32-deep step of resnet's tile (nvcc 13, sm_90) a warp issues 238 instructions: 32 HMMA.16816,
// 12 fragment loads (LDSM), 34 global loads (the U gather and the mask), 18 shared stores and the
// integer work around them. The gather, not the tensor cores, sets the pace: ~30-50 us expected
// for resnet on an H100/H200 (floor ~20 us at the fp16 tensor rate).
//
// Accuracy: the inputs are rounded to half (u = 2^-11 each), the products are exact and the sums
// are float: the error is the inputs' rounding plus the output's, independent of C*K*K.
//
// Layout: x (B,C_IN,IN_H,IN_W) half NCHW; wt (M_OUT, K, K, C_IN) half; y (B,M_OUT,Ho,Wo) half.
// Grid: (ceil(N/BN), ceil(M_OUT/BM)), block 32*WARPS_M*WARPS_N threads. Padding: any. Stride: any.
// Tunables: BM, BN, BK, WARPS_M, WARPS_N; the layer: C_IN, M_OUT, IN_H, IN_W, KSIZE, PAD, STRIDE.

#include <mma.h>
#include <cuda_fp16.h>
using namespace nvcuda;

#ifndef BM
#define BM 64
#endif
#ifndef BN
#define BN 128
#endif
#ifndef BK
#define BK 32
#endif
#ifndef WARPS_M
#define WARPS_M 2
#endif
#ifndef WARPS_N
#define WARPS_N 2
#endif
#ifndef C_IN
#define C_IN 64
#endif
#ifndef M_OUT
#define M_OUT 64
#endif
#ifndef IN_H
#define IN_H 56
#endif
#ifndef IN_W
#define IN_W 56
#endif
#ifndef KSIZE
#define KSIZE 3
#endif
#ifndef PAD
#define PAD 1
#endif
#ifndef STRIDE
#define STRIDE 1
#endif

#define HO ((IN_H + 2 * PAD - KSIZE) / STRIDE + 1)
#define WO ((IN_W + 2 * PAD - KSIZE) / STRIDE + 1)
#define KD (KSIZE * KSIZE * C_IN)           // the reduction length
#define ONE_TAP (C_IN % BK == 0)            // each BK-deep tile is one tap (ky, kx)
#define A_VEC (KD % 8 == 0)                 // mask rows 16-byte aligned
#define NTHREADS (32 * WARPS_M * WARPS_N)
#define WTM (BM / WARPS_M)                  // a warp's maps
#define WTN (BN / WARPS_N)                  // a warp's pixels
#define FM (WTM / 16)
#define FN (WTN / 16)
#define LDA (BK + 8)                        // halves per row of As (padded)
#define LDB (BN + 8)                        // halves per row of Bs (padded)
#define LDC (WTN + 4)                       // floats per row of a warp's staging area (padded)
#define A_CHUNKS ((BM * BK) / 8)            // 16-byte pieces of the A tile
#define A_PER ((A_CHUNKS + NTHREADS - 1) / NTHREADS)
#define PAIRS (BN / 2)                      // column pairs of the U tile
#define RSTEP (NTHREADS / PAIRS)            // rows between a thread's U-tile rows
#define B_ROWS (BK / RSTEP)                 // U-tile rows per thread
#define SMEM_AB (2 * BM * LDA * 2 + 2 * BK * LDB * 2)
#define SMEM_C (WARPS_M * WARPS_N * 16 * LDC * 4)
#define SMEM (SMEM_AB > SMEM_C ? SMEM_AB : SMEM_C)

static_assert(BM % 16 == 0 && BN % 16 == 0 && BK % 16 == 0, "tiles are made of 16x16x16 fragments");
static_assert(WTM % 16 == 0 && WTN % 16 == 0, "each warp's part must be whole fragments");
static_assert(NTHREADS % PAIRS == 0 && BK % RSTEP == 0, "the U tile must split evenly over the threads");
static_assert(SMEM <= 48 * 1024, "shared memory over 48 KB");

__global__ void __launch_bounds__(NTHREADS)
conv2d_wmma(const half* __restrict__ x, const half* __restrict__ wt, half* __restrict__ y, int B)
{
    constexpr int C = C_IN, M = M_OUT, H = IN_H, W = IN_W, K = KSIZE, HW = IN_H * IN_W;
    constexpr int Wo = WO, P = HO * WO;
    const int N = B * P;

    __shared__ __align__(128) unsigned char smem[SMEM];
    half (*As)[BM][LDA] = (half (*)[BM][LDA])smem;                        // As[2][BM][LDA]: A (m, k)
    half (*Bs)[BK][LDB] = (half (*)[BK][LDB])(smem + 2 * BM * LDA * 2);   // Bs[2][BK][LDB]: U (k, n)

    const int tid = threadIdx.x, warp = tid / 32;
    const int wm = warp / WARPS_N, wn = warp % WARPS_N;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;

    // ---- U-tile loader: this thread's two pixels (columns 2*pc, 2*pc+1) and rows rg + j*RSTEP.
    // A pixel past N gets a window far outside the image, so every bounds test fails for it.
    const int pc = tid % PAIRS, rg = tid / PAIRS;
    int col_base[2], col_iy[2], col_ix[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int n = n0 + 2 * pc + h;
        col_base[h] = 0; col_iy[h] = -(1 << 28); col_ix[h] = 0;
        if (n < N) {
            const int b = n / P, p = n - b * P, oy = p / Wo, ox = p - oy * Wo;
            col_base[h] = b * C * HW;
            col_iy[h] = oy * STRIDE - PAD;
            col_ix[h] = ox * STRIDE - PAD;
        }
    }
    const half zero = __float2half(0.0f);

    uint4 a_next[A_PER];
    half2 b_next[B_ROWS];
    auto load_tiles = [&](int k0) {
        // A: 16-byte pieces of rows of the tap-major mask (tiny, L1/L2-resident).
#pragma unroll
        for (int e = 0; e < A_PER; ++e) {
            const int i = tid + e * NTHREADS, am = i / (BK / 8), ak = (i % (BK / 8)) * 8;
            const int m = m0 + am, k = k0 + ak;
            union { uint4 u; half h[8]; } v;
            v.u = make_uint4(0, 0, 0, 0);
            if (i < A_CHUNKS && m < M) {
#if A_VEC
                if (k < KD) v.u = *(const uint4*)&wt[m * KD + k];     // KD % 8 == 0: all 8 or none
#else
#pragma unroll
                for (int q = 0; q < 8; ++q) v.h[q] = (k + q < KD) ? wt[m * KD + k + q] : zero;
#endif
            }
            a_next[e] = v.u;
        }
        // U: the fused im2col.
#if ONE_TAP
        {
            const int tap = k0 / C, c0 = k0 - tap * C, ky = tap / K, kx = tap - ky * K;
            const half* src[2];
            unsigned keep = 0;                               // which halves of each pair are real
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int iy = col_iy[h] + ky, ix = col_ix[h] + kx;
                const bool ok = iy >= 0 && iy < H && ix >= 0 && ix < W;
                keep |= ok ? (0xffffu << (16 * h)) : 0u;
                src[h] = &x[col_base[h] + (c0 + rg) * HW + (ok ? iy * W + ix : 0)];   // in bounds either way
            }
#pragma unroll
            for (int j = 0; j < B_ROWS; ++j) {               // offsets j*RSTEP*HW: immediates
                const half2 v = __halves2half2(src[0][j * RSTEP * HW], src[1][j * RSTEP * HW]);
                unsigned bits = *(const unsigned*)&v & keep;
                b_next[j] = *(const half2*)&bits;
            }
        }
#else
        {
#pragma unroll
            for (int j = 0; j < B_ROWS; ++j) {
                const int k = k0 + rg + j * RSTEP;
                half v[2] = {zero, zero};
                if (k < KD) {
                    const int tap = k / C, c = k - tap * C, ky = tap / K, kx = tap - ky * K;
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int iy = col_iy[h] + ky, ix = col_ix[h] + kx;
                        if (iy >= 0 && iy < H && ix >= 0 && ix < W) v[h] = x[col_base[h] + c * HW + iy * W + ix];
                    }
                }
                b_next[j] = __halves2half2(v[0], v[1]);
            }
        }
#endif
    };
    auto store_tiles = [&](int s) {
#pragma unroll
        for (int e = 0; e < A_PER; ++e) {
            const int i = tid + e * NTHREADS, am = i / (BK / 8), ak = (i % (BK / 8)) * 8;
            if ((A_CHUNKS % NTHREADS) == 0 || i < A_CHUNKS) *(uint4*)&As[s][am][ak] = a_next[e];
        }
#pragma unroll
        for (int j = 0; j < B_ROWS; ++j)
            *(half2*)&Bs[s][rg + j * RSTEP][2 * pc] = b_next[j];
    };

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[FM][FN];
#pragma unroll
    for (int i = 0; i < FM; ++i)  // listing: main_loop
#pragma unroll
        for (int j = 0; j < FN; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

    // Software pipeline (chapter 5): step t loads tile t into registers, multiplies tile t-1 from
    // buffer (t-1)&1, stores tile t into buffer t&1, then one barrier.
    const int ntiles = (KD + BK - 1) / BK;
    for (int t = 0; t <= ntiles; ++t) {
        if (t < ntiles) load_tiles(t * BK);
        if (t > 0) {
            const int s = (t - 1) & 1;
#pragma unroll
            for (int kk = 0; kk < BK; kk += 16) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> a[FM];
#pragma unroll
                for (int i = 0; i < FM; ++i)
                    wmma::load_matrix_sync(a[i], &As[s][wm * WTM + i * 16][kk], LDA);
#pragma unroll
                for (int j = 0; j < FN; ++j) {
                    wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::row_major> b;
                    wmma::load_matrix_sync(b, &Bs[s][kk][wn * WTN + j * 16], LDB);
#pragma unroll
                    for (int i = 0; i < FM; ++i)
                        wmma::mma_sync(acc[i][j], a[i], b, acc[i][j]);
                }
            }
        }
        if (t < ntiles) store_tiles(t & 1);
        __syncthreads();
    }  // end listing: main_loop

    // ---- epilogue. The tile buffers are free after the loop's last barrier: each warp stages its
    // accumulators in its own slice of them, one row of fragments (16 maps x WTN pixels, float) at
    // a time, then writes them out as half. Column n of the product is pixel p of image b,
    // y[b][m][p]; with P even a pair (n, n+1) starting at an even n is in one image at an even p:
    // one 4-byte half2 store, and a warp's lanes write consecutive pairs of one map (coalesced).
    float (*Cw)[LDC] = (float (*)[LDC])(smem + warp * 16 * LDC * 4);   // this warp's 16 x WTN floats
    const bool pairs_ok = (P % 2) == 0;
    const int lane = tid % 32;
#pragma unroll
    for (int i = 0; i < FM; ++i) {
#pragma unroll
        for (int j = 0; j < FN; ++j)
            wmma::store_matrix_sync(&Cw[0][j * 16], acc[i][j], LDC, wmma::mem_row_major);
        __syncwarp();                                    // the whole warp's stores before any lane reads
        for (int idx = lane; idx < 16 * (WTN / 2); idx += 32) {
            const int r = idx / (WTN / 2), pp = idx - r * (WTN / 2);
            const int m = m0 + wm * WTM + i * 16 + r, n = n0 + wn * WTN + 2 * pp;
            if (m >= M || n >= N) continue;
            if (pairs_ok && n + 1 < N) {
                const int b = n / P, p = n - b * P;
                *(half2*)&y[(b * M + m) * P + p] = __floats2half2_rn(Cw[r][2 * pp], Cw[r][2 * pp + 1]);
            } else {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    if (n + h < N) {
                        const int b = (n + h) / P, p = (n + h) - b * P;
                        y[(b * M + m) * P + p] = __float2half(Cw[r][2 * pp + h]);
                    }
                }
            }
        }
        __syncwarp();                                    // all reads done before the next stores
    }
}
