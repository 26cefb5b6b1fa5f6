// Chapter 6, step 2: half2, two results per instruction.
//
// A half2 holds two halves in one 32-bit register, and __hfma2(a, b, c) computes both lanes,
// a.x*b.x + c.x and a.y*b.y + c.y, in one HFMA2 instruction: twice the arithmetic of FFMA or of a
// scalar __hfma per instruction (sm_90: 256 half results per clock and SM, against 128 float).
// The work has to come in pairs that share an instruction. Which pairs? In step 1 every thread
// computes MT maps x ROWS rows, and for one tap all MT maps multiply the same input value by
// MT different mask values. So the pairs are two neighbouring maps:
//
//     acc2[p][r] = __hfma2(Ws2[tap][p], (x, x), acc2[p][r])     maps 2p and 2p+1, row r
//
//  - The mask slice is stored as half2 pairs of maps, Ws2[tap][p] = (w[m0+2p][tap],
//    w[m0+2p+1][tap]); a 16-byte load brings 4 pairs (8 maps) of one tap, a broadcast as before.
//  - The input value is duplicated into both lanes once (__half2half2), then used for all MT/2
//    pairs and every ky that touches it.
//  - The accumulators are MT/2 x ROWS half2: half the registers of step 1 for the same outputs.
//  Per (c, kx) with MT=16, ROWS=4, K=7: 10 input loads, 10 duplications, 14 mask loads and 224
//  HFMA2 (448 multiply-adds): half the multiply-add instructions of chapter 5's fp32 kernel.
//
// Accuracy is that of step 1 (same roundings in the same order, each lane on its own).
//
// Layout: x (B,C_IN,H,W), w (M_OUT,C_IN,K,K), y (B,M_OUT,Ho,Wo), half, NCHW.
// Grid: (ceil(B * ceil(Ho/ROWS) * Wo / BLOCK), ceil(M_OUT/MT)), block BLOCK threads.
// Padding: any (run time). Stride: STRIDE (compile time).

#include <cuda_fp16.h>

#ifndef M_OUT
#define M_OUT 16
#endif
#ifndef C_IN
#define C_IN 4
#endif
#ifndef KSIZE
#define KSIZE 7
#endif
#ifndef STRIDE
#define STRIDE 1
#endif
#ifndef MT
#define MT 16                // output maps per thread (even; a multiple of 8 for 16-byte mask loads)
#endif
#ifndef ROWS
#define ROWS 4               // output rows per thread
#endif
#ifndef BLOCK
#define BLOCK 128
#endif

#define TAPS (C_IN * KSIZE * KSIZE)
#define XROWS ((ROWS - 1) * STRIDE + KSIZE)
#define PAIRS (MT / 2)
#define VW (PAIRS % 4 == 0 ? 4 : (PAIRS % 2 == 0 ? 2 : 1))   // half2 pairs per shared-memory load

static_assert(MT % 2 == 0, "MT must be even: maps go in pairs");
static_assert(TAPS * MT * 2 <= 48 * 1024, "the block's mask slice must fit in 48 KB of shared memory");

__global__ void conv2d_half2(const half* __restrict__ x, const half* __restrict__ w,
                             half* __restrict__ y, int B, int H, int W, int pad)
{
    __shared__ __align__(16) half2 Ws2[TAPS][PAIRS];    // Ws2[tap][p] = (map 2p, map 2p+1)
    const int m0 = blockIdx.y * MT;
    const half zero = __float2half(0.0f);
    for (int i = threadIdx.x; i < TAPS * PAIRS; i += BLOCK) {
        const int p = i / TAPS, tap = i % TAPS;
        const int ma = m0 + 2 * p, mb = ma + 1;
        Ws2[tap][p] = __halves2half2(ma < M_OUT ? w[ma * TAPS + tap] : zero,
                                     mb < M_OUT ? w[mb * TAPS + tap] : zero);
    }
    __syncthreads();                       // the only barrier

    const int Ho = (H + 2 * pad - KSIZE) / STRIDE + 1;
    const int Wo = (W + 2 * pad - KSIZE) / STRIDE + 1;
    const int strips = (Ho + ROWS - 1) / ROWS;
    const int t = blockIdx.x * BLOCK + threadIdx.x;
    if (t >= B * strips * Wo) return;
    const int ox = t % Wo;
    const int strip = (t / Wo) % strips;
    const int b = t / (Wo * strips);
    const int oy0 = strip * ROWS;
    const int iy0 = oy0 * STRIDE - pad, ix0 = ox * STRIDE - pad;

    half2 acc[PAIRS][ROWS];
#pragma unroll
    for (int p = 0; p < PAIRS; ++p)
#pragma unroll
        for (int r = 0; r < ROWS; ++r) acc[p][r] = __half2half2(zero);

#pragma unroll 1
    for (int c = 0; c < C_IN; ++c) {
        const int xbase = (b * C_IN + c) * H * W;
#pragma unroll
        for (int kx = 0; kx < KSIZE; ++kx) {
            const int ix = ix0 + kx;
            const bool col_in = ix >= 0 && ix < W;
            half2 xv[XROWS];                               // each input value in both lanes  // listing: inner_loop
#pragma unroll
            for (int j = 0; j < XROWS; ++j) {
                const int iy = iy0 + j;
                xv[j] = __half2half2((col_in && iy >= 0 && iy < H) ? __ldg(&x[xbase + iy * W + ix]) : zero);
            }
#pragma unroll
            for (int ky = 0; ky < KSIZE; ++ky) {
                const half2* wrow = &Ws2[(c * KSIZE + ky) * KSIZE + kx][0];
#pragma unroll
                for (int q = 0; q < PAIRS / VW; ++q) {
                    union { uint4 u4; uint2 u2; unsigned u1; half2 h[4]; } wv;   // VW pairs, one load
#if VW == 4
                    wv.u4 = *(const uint4*)&wrow[4 * q];     // broadcast: the same address in every lane
#elif VW == 2
                    wv.u2 = *(const uint2*)&wrow[2 * q];
#else
                    wv.u1 = *(const unsigned*)&wrow[q];
#endif
#pragma unroll
                    for (int r = 0; r < ROWS; ++r) {
                        const half2 v = xv[r * STRIDE + ky];
#pragma unroll
                        for (int e = 0; e < VW; ++e)
                            acc[VW * q + e][r] = __hfma2(wv.h[e], v, acc[VW * q + e][r]);
                    }  // end listing: inner_loop
                }
            }
        }
    }

    const int P = Ho * Wo;
#pragma unroll
    for (int p = 0; p < PAIRS; ++p) {
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            const int oy = oy0 + r;
            if (oy >= Ho) continue;
            const int m = m0 + 2 * p;
            if (m < M_OUT) y[(b * M_OUT + m) * P + oy * Wo + ox] = __low2half(acc[p][r]);
            if (m + 1 < M_OUT) y[(b * M_OUT + m + 1) * P + oy * Wo + ox] = __high2half(acc[p][r]);
        }
    }
}
