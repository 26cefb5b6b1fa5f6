// Chapter 6, step 1: chapter 5's register-tiled direct convolution, computing in half.
//
// The same kernel as kernels/05_fused/conv2d_direct_regtile.cu (the fastest there on the small-
// channel layers) with every float replaced by half: the input, the mask and the output are half
// in global memory, the mask slice is half in shared memory, and the MT x ROWS accumulators are
// half, updated with __hfma (one rounding per multiply-add).
//
// What this buys, and what it does not:
//  - Bytes: half the traffic. lenet_c3 moves 256 MB of input and 740 MB of output in float32,
//    128 + 370 MB in half. The mask slice in shared memory is half the size too.
//  - Arithmetic: by itself, nothing. A scalar __hfma is one HFMA2 instruction with one of its two
//    lanes idle, and chapter 5's cards show instruction issue as these layers' limit, FFMAs half
//    of what is issued. But in the machine code (cuobjdump -sass) nvcc 13 for sm_90 pairs this
//    kernel's independent __hfma on its own, maps m and m+1 of the same input value, into HFMA2
//    (lenet_c3's loop over one channel: 1,568 HFMA2 for 3,136 __hfma), with the accumulators
//    packed two to a register: half the multiply-add instructions of chapter 5's kernel. Step 2
//    (conv2d_half2.cu) writes that pairing out with half2, where no compiler can take it away.
//  - Accuracy: the sum over C*K*K terms is accumulated in half. Each addition rounds to 11
//    significant bits (unit roundoff u = 2^-11 ~ 4.9e-4) and the rounding errors of a long sum
//    add up like a random walk: for random data the error grows ~ u*sqrt(C*K*K/6) relative to the
//    output's size (resnet, C*K*K = 576: ~1% of the RMS; lenet_c3, 196: ~0.3%). The tests derive
//    their tolerance from exactly this (convlab.ops.fp16.fp16_tolerance).
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
#define MT 16                // output maps per thread (a multiple of 2; of 8 for 16-byte mask loads)
#endif
#ifndef ROWS
#define ROWS 4               // output rows per thread
#endif
#ifndef BLOCK
#define BLOCK 128
#endif

#define TAPS (C_IN * KSIZE * KSIZE)                 // mask values per output map
#define XROWS ((ROWS - 1) * STRIDE + KSIZE)          // input rows under ROWS output rows
#define VW (MT % 8 == 0 ? 8 : (MT % 4 == 0 ? 4 : 2)) // halves per shared-memory mask load

static_assert(MT % 2 == 0, "MT must be even");
static_assert(TAPS * MT * 2 <= 48 * 1024, "the block's mask slice must fit in 48 KB of shared memory");

__global__ void conv2d_half(const half* __restrict__ x, const half* __restrict__ w,
                            half* __restrict__ y, int B, int H, int W, int pad)
{
    // This block's MT maps of the mask, tap-major: Ws[tap][m], rows 16-byte aligned for MT % 8 == 0.
    __shared__ __align__(16) half Ws[TAPS][MT];
    const int m0 = blockIdx.y * MT;
    const half zero = __float2half(0.0f);
    for (int i = threadIdx.x; i < TAPS * MT; i += BLOCK) {
        const int mi = i / TAPS, tap = i % TAPS;
        Ws[tap][mi] = (m0 + mi < M_OUT) ? w[(m0 + mi) * TAPS + tap] : zero;
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

    half acc[MT][ROWS];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int r = 0; r < ROWS; ++r) acc[m][r] = zero;

#pragma unroll 1
    for (int c = 0; c < C_IN; ++c) {
        const int xbase = (b * C_IN + c) * H * W;
#pragma unroll  // listing: inner_loop
        for (int kx = 0; kx < KSIZE; ++kx) {
            const int ix = ix0 + kx;
            const bool col_in = ix >= 0 && ix < W;
            half xv[XROWS];
#pragma unroll
            for (int j = 0; j < XROWS; ++j) {
                const int iy = iy0 + j;
                xv[j] = (col_in && iy >= 0 && iy < H) ? __ldg(&x[xbase + iy * W + ix]) : zero;
            }
#pragma unroll
            for (int ky = 0; ky < KSIZE; ++ky) {
                const half* wrow = &Ws[(c * KSIZE + ky) * KSIZE + kx][0];
#pragma unroll
                for (int q = 0; q < MT / VW; ++q) {
                    union { uint4 u4; uint2 u2; unsigned u1; half h[8]; } wv;   // VW mask values, one load
#if VW == 8
                    wv.u4 = *(const uint4*)&wrow[8 * q];     // broadcast: the same address in every lane
#elif VW == 4
                    wv.u2 = *(const uint2*)&wrow[4 * q];
#else
                    wv.u1 = *(const unsigned*)&wrow[2 * q];
#endif
#pragma unroll
                    for (int r = 0; r < ROWS; ++r) {
                        const half v = xv[r * STRIDE + ky];
#pragma unroll
                        for (int e = 0; e < VW; ++e)
                            acc[VW * q + e][r] = __hfma(wv.h[e], v, acc[VW * q + e][r]);
                    }
                }  // end listing: inner_loop
            }
        }
    }

    // For each (map, row) the warp stores consecutive columns: coalesced, 2 bytes a lane.
    const int P = Ho * Wo;
#pragma unroll
    for (int m = 0; m < MT; ++m) {
        if (m0 + m < M_OUT) {
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
                const int oy = oy0 + r;
                if (oy < Ho)
                    y[(b * M_OUT + m0 + m) * P + oy * Wo + ox] = acc[m][r];
            }
        }
    }
}
