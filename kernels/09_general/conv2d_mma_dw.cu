// Requires sm_80 or newer: cp.async and mma.sync.m16n8k16 with float accumulators
//
// Chapter 9: the weight gradient dE/dW of an fp16 convolution on tensor cores, NHWC, for
// conv2d_mma's layers (groups, stride, padding, dilation, non-square masks).
//
// GEMM view, per group:  dW (M x N) = dy^T (M x P) . X (P x N),  P = B*Ho*Wo output pixels (the
// reduction), M maps, N = Kh*Kw*C columns (tap (r, s), channel c fastest: the mask's (M, Kh, Kw, C)
// order, w in channels_last). dy is NHWC (B, Ho, Wo, MX) and x NHWC (B, H, W, CX), a group's M maps
// and C channels at g*M and g*C; M % 8 == 0 and C % 8 == 0 (the launcher pads each group with zero
// maps and channels): a row of either tile is one pixel's 16-byte chunks, 8 maps of dy or 8
// channels of one tap of x.
//
//  - Block tile BM x BN (maps x columns), BK pixels a step; WARPS_M x WARPS_N warps, each
//    (BM/WARPS_M) x (BN/WARPS_N) of m16n8 accumulators. Shared tiles are pixel-major, [BK][BM] of
//    dy and [BK][BN] of x, so the reduction runs down their rows: ldmatrix .trans turns them into
//    the fragments mma.sync wants (A row-major in (map, pixel), B column-major in (pixel, column)).
//    16-byte chunks XOR-swizzled by the row (swz), as in conv2d_mma.cu, for conflict-free ldmatrix.
//  - STAGES-deep cp.async pipeline as in conv2d_mma.cu. A copy of dy is one pixel's 8 maps: its
//    address is linear in the pixel. A copy of x is one pixel's 8 channels at one tap: the thread's
//    tap (r, s) and channel are fixed for the whole loop (worked out once), and its pixel's
//    (n, oh, ow) moves on by BK pixels a step with carries, no division. Taps in the padding,
//    pixels past P and columns past N are zero-filled (src-size 0).
//  - Split-K over the pixels (gridDim.y = splits): a block sums its share of the BK steps and
//    stores its fp32 partial tile to ws (splits, G*M, N); conv2d_mma_dw_reduce adds the splits in
//    order (deterministic), drops the padding channels and rounds to half once. The reduction is
//    long (B*Ho*Wo) and the output small, so a layer is split to fill the GPU.
//  - Blocks: one 1-D grid per split, a group's tiles adjacent, every group's together: the blocks
//    running together read the same pixels of x and dy.
//
// Layout: x (B, H, W, CX) half, CX = G*C; dy (B, Ho, Wo, MX) half, MX = G*M, of a group's M maps
// the first Mreal real; both 16-byte aligned. ws (splits, G*Mreal, Kh*Kw*C) float; dw
// (G*Mreal, Kh, Kw, Cg) half, Cg <= C the real channels.
// Grid: (G * ceil(M/BM) * ceil(N/BN), splits), block 32*WARPS_M*WARPS_N threads, dynamic shared
// memory STAGES*BK*(BM+BN)*2 bytes. Tunables: BM, BN (16, 32, 64 or 128), BK (16, 32 or 64),
// WARPS_M, WARPS_N, STAGES.

#include <cuda_fp16.h>
#include "tensor_core.cuh"

#ifndef BM
#define BM 64
#endif
#ifndef BN
#define BN 64
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
#ifndef STAGES
#define STAGES 4
#endif

constexpr int THREADS = 32 * WARPS_M * WARPS_N;
constexpr int WTM = BM / WARPS_M, WTN = BN / WARPS_N;
constexpr int MI = WTM / 16, NI = WTN / 8;
constexpr int A_CHUNKS = BM / 8, B_CHUNKS = BN / 8;          // 16-byte chunks in a shared row
constexpr int A_COPIES = BK * A_CHUNKS, B_COPIES = BK * B_CHUNKS;
constexpr int A_ITERS = (A_COPIES + THREADS - 1) / THREADS, B_ITERS = (B_COPIES + THREADS - 1) / THREADS;
constexpr int STAGE = BK * (BM + BN);                        // halves: BK rows of dy, then BK rows of x

static_assert(BM == 16 || BM == 32 || BM == 64 || BM == 128, "BM must be 16, 32, 64 or 128");
static_assert(BN == 16 || BN == 32 || BN == 64 || BN == 128, "BN must be 16, 32, 64 or 128");
static_assert(BK == 16 || BK == 32 || BK == 64, "BK must be 16, 32 or 64");
static_assert(WTM % 16 == 0 && WTN % 16 == 0, "warp tiles must be multiples of 16 x 16");
static_assert(STAGES >= 2, "at least two stages");

// The slot of chunk `chunk` in shared row `row` of a tile WC chunks wide: the 8 rows an ldmatrix
// phase reads fall in 8 different 16-byte bank groups (conv2d_mma.cu's swz, for any width).
template <int WC>
__device__ __forceinline__ int swz(int row, int chunk)
{
    return WC >= 8 ? chunk ^ (row & 7) : WC == 4 ? chunk ^ ((row >> 1) & 3) : chunk ^ ((row >> 2) & 1);
}

__global__ void __launch_bounds__(THREADS)
conv2d_mma_dw(const half* __restrict__ x, const half* __restrict__ dy, float* __restrict__ ws, int B, int H, int W,
              int C, int CX, int M, int MX, int Mreal, int Kh, int Kw, int Ho, int Wo, int sh, int sw, int ph, int pw,
              int dh, int dw)
{
    extern __shared__ __align__(128) half smem[];    // [STAGES][BK rows of BM (dy), BK rows of BN (x)]

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int P = B * Ho * Wo, N = Kh * Kw * C;
    const int m_tiles = (M + BM - 1) / BM, n_tiles = (N + BN - 1) / BN;
    const int g = blockIdx.x / (m_tiles * n_tiles), t = blockIdx.x % (m_tiles * n_tiles);
    const int m0 = (t / n_tiles) * BM, n0 = (t % n_tiles) * BN;
    x += g * C;
    dy += g * M;

    // ---- the loader, set up once: each copy's fixed part (its column, or its tap and channel) ----
    int a_col[A_ITERS];                          // dy: the map of the copy's chunk; -1: no copy
#pragma unroll
    for (int i = 0; i < A_ITERS; i++) {
        const int v = tid + i * THREADS;
        a_col[i] = v < A_COPIES && m0 + (v % A_CHUNKS) * 8 < M ? m0 + (v % A_CHUNKS) * 8 : -1;
    }
    int b_r[B_ITERS], b_s[B_ITERS], b_c[B_ITERS];     // x: the copy's tap (r, s) and first channel
#pragma unroll
    for (int i = 0; i < B_ITERS; i++) {
        const int v = tid + i * THREADS, n = n0 + (v % B_CHUNKS) * 8;
        const bool ok = v < B_COPIES && n < N;
        b_r[i] = ok ? n / C / Kw : -1;           // -1: no copy (past N, or no such thread)
        b_s[i] = n / C % Kw;
        b_c[i] = n % C;
    }

    const int steps_all = (P + BK - 1) / BK, per_split = (steps_all + gridDim.y - 1) / gridDim.y;
    const int kt0 = blockIdx.y * per_split, steps = max(0, min(steps_all - kt0, per_split));

    // Each x copy's pixel (n, oh, ow) in the next tile to load: divided out once here, then moved on
    // by BK pixels a load (tiles load in order), ow carrying into oh and oh into n.
    int b_n[B_ITERS], b_oh[B_ITERS], b_ow[B_ITERS];
#pragma unroll
    for (int i = 0; i < B_ITERS; i++) {
        const int p = kt0 * BK + (tid + i * THREADS) / B_CHUNKS, q = p % (Ho * Wo);
        b_n[i] = p / (Ho * Wo);
        b_oh[i] = q / Wo;
        b_ow[i] = q % Wo;
    }
    const int d_oh = BK / Wo, d_ow = BK % Wo;

    auto load_tile = [&](int stage, int kt) {     // kt: kt0, kt0 + 1, ... in order
        half* as = smem + stage * STAGE;
        half* bs = as + BK * BM;
#pragma unroll
        for (int i = 0; i < A_ITERS; i++) {
            const int v = tid + i * THREADS, row = v / A_CHUNKS, ch = v % A_CHUNKS;
            if (v >= A_COPIES) break;
            const int p = kt * BK + row;
            const bool ok = a_col[i] >= 0 && p < P;
            cp_async_16(as + row * BM + swz<A_CHUNKS>(row, ch) * 8, ok ? dy + p * MX + a_col[i] : dy, ok);
        }
#pragma unroll
        for (int i = 0; i < B_ITERS; i++) {
            const int v = tid + i * THREADS, row = v / B_CHUNKS, ch = v % B_CHUNKS;
            if (v >= B_COPIES) break;
            const int n = b_n[i], ih = b_oh[i] * sh - ph + b_r[i] * dh, iw = b_ow[i] * sw - pw + b_s[i] * dw;
            const bool ok = b_r[i] >= 0 && n < B && ih >= 0 && ih < H && iw >= 0 && iw < W;   // n < B: p < P
            cp_async_16(bs + row * BN + swz<B_CHUNKS>(row, ch) * 8, ok ? x + ((n * H + ih) * W + iw) * CX + b_c[i] : x, ok);
            b_ow[i] += d_ow;
            b_oh[i] += d_oh;
            if (b_ow[i] >= Wo) { b_ow[i] -= Wo; b_oh[i]++; }
            while (b_oh[i] >= Ho) { b_oh[i] -= Ho; b_n[i]++; }   // more than once only for maps under BK pixels
        }
    };

    const int wm = warp % WARPS_M, wn = warp / WARPS_M;
    float acc[MI][NI][4];
    for (int i = 0; i < MI; i++)
        for (int j = 0; j < NI; j++)
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.f;

    // ldmatrix .trans rows (pixels) and chunks (maps or columns) of the lane. A: matrices (maps 0-7,
    // pixels 0-7), (maps 8-15, pixels 0-7), (0-7, 8-15), (8-15, 8-15): a[0..3]. B: (pixels 0-7,
    // columns 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15): b[0], b[1] of two n8 tiles.
    const int a_row = (lane & 7) + ((lane >> 4) << 3), a_ch = (wm * WTM) / 8 + ((lane >> 3) & 1);
    const int b_row = (lane & 7) + (((lane >> 3) & 1) << 3), b_ch = (wn * WTN) / 8 + (lane >> 4);

    for (int st = 0; st < STAGES - 1; st++) {
        if (st < steps) load_tile(st, kt0 + st);
        cp_async_commit();
    }
    for (int kt = 0; kt < steps; kt++) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();                         // tile kt landed for all; stage (kt-1) % STAGES is free
        if (kt + STAGES - 1 < steps) load_tile((kt + STAGES - 1) % STAGES, kt0 + kt + STAGES - 1);
        cp_async_commit();

        const half* as = smem + (kt % STAGES) * STAGE;
        const half* bs = as + BK * BM;
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++) {
            unsigned af[MI][4], bf[NI][2];
            const int ar = kk * 16 + a_row, br = kk * 16 + b_row;
#pragma unroll
            for (int i = 0; i < MI; i++) ldmatrix_x4_trans(af[i], as + ar * BM + swz<A_CHUNKS>(ar, a_ch + 2 * i) * 8);
#pragma unroll
            for (int j = 0; j < NI / 2; j++) {
                unsigned u[4];
                ldmatrix_x4_trans(u, bs + br * BN + swz<B_CHUNKS>(br, b_ch + 2 * j) * 8);
                bf[2 * j][0] = u[0]; bf[2 * j][1] = u[1];
                bf[2 * j + 1][0] = u[2]; bf[2 * j + 1][1] = u[3];
            }
#pragma unroll
            for (int i = 0; i < MI; i++)
#pragma unroll
                for (int j = 0; j < NI; j++) mma_16816(acc[i][j], af[i], bf[j]);
        }
    }

    // fp32 partial tile of this split: maps past the group's real ones and columns past N unstored
    float* part = ws + (blockIdx.y * (MX / M) * Mreal + g * Mreal) * N;
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int m = m0 + wm * WTM + i * 16 + (lane >> 2) + h * 8;
#pragma unroll
            for (int j = 0; j < NI; j++) {
                const int n = n0 + wn * WTN + j * 8 + (lane & 3) * 2;
                if (m < Mreal && n < N) part[m * N + n] = acc[i][j][2 * h];
                if (m < Mreal && n + 1 < N) part[m * N + n + 1] = acc[i][j][2 * h + 1];
            }
        }
}

// dw = half(the splits' fp32 partial sums), in order, each rounded once; one thread per element of
// dw (MY, Kh*Kw, Cg), read from ws (splits, MY, Kh*Kw*C) where C >= Cg holds the padding channels.
__global__ void conv2d_mma_dw_reduce(const float* __restrict__ ws, half* __restrict__ dw, int MY, int KK, int Cg,
                                     int C, int splits)
{
    const int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= MY * KK * Cg) return;
    const int c = e % Cg, rs = (e / Cg) % KK, m = e / (Cg * KK);
    const int src = (m * KK + rs) * C + c, plane = MY * KK * C;
    float v = ws[src];
    for (int z = 1; z < splits; z++) v += ws[z * plane + src];
    dw[e] = __float2half_rn(v);
}
