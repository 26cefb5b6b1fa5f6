// Requires sm_90a: wgmma, the tensor memory accelerator and setmaxnreg (H100, H200)
//
// Chapter 11: an fp16 implicit-GEMM convolution on Hopper's warpgroup MMA, fed by the copy engine.
// The GEMM of chapter 9 (Y = A . B^T, a row of A one output pixel's receptive field, a row of B
// one map's weights, K = Kh*Kw*C with the channel fastest), with who-does-what changed:
//
//  - One producer warp asks the tensor memory accelerator (TMA) for each tile: for tap (kh, kw)
//    and channels c0..c0+63, the box of x at (c0, ow0 + kw - pad_w, oh0 + kh - pad_h, n) of
//    64 channels x BW pixels x BH rows is exactly the A tile of BW*BH = 128 output pixels (zeros
//    where the box leaves the image: the padding costs nothing); the box of the mask at
//    (c0, kw, kh, m0) of 64 channels x BN maps is the B tile. No thread computes an address.
//  - STAGES shared-memory stages form a ring. full[s] (an mbarrier) completes when both boxes of
//    stage s have landed (the producer told it how many bytes to expect); empty[s] completes when
//    both consumer warpgroups are done reading stage s, and the producer waits for it before it
//    refills the stage.
//  - Two consumer warpgroups each multiply 64 of the 128 pixels by the BN maps with wgmma
//    m64nBNk16 straight from shared memory (no ldmatrix: the descriptor says where the tile is),
//    four per 64-deep stage, and keep one group of them in flight while the next stage's wait
//    runs.
//  - Epilogue: the fp32 sums plus bias (half, read when has_bias), ReLU if relu, rounded to half,
//    stored to NHWC y (B, Ho, Wo, M).
//
// Needs stride 1, dilation 1, C % 8 == 0 (TMA's 16-byte rows; fewer channels read as zeros up to
// 64) and M % 8 == 0 (y's rows as whole half2 pairs). x is NHWC (a channels_last tensor), the
// mask (M, Kh, Kw, C).
#include <cuda_fp16.h>
#include "hopper.cuh"

#ifndef BN
#define BN 128          // maps per block: the wgmma's N
#endif
#ifndef BW
#define BW 16           // output pixels per block along a row...
#endif
#define BH (128 / BW)   // ... and rows: 128 pixels, 64 per consumer warpgroup
#ifndef STAGES
#define STAGES 5
#endif
#define BK 64           // channels per stage: one 128-byte swizzled row of halves

#if BN == 64
#define WGMMA wgmma_m64n64k16
#elif BN == 128
#define WGMMA wgmma_m64n128k16
#elif BN == 256
#define WGMMA wgmma_m64n256k16
#else
#error "BN: 64, 128 or 256 maps per block"
#endif

constexpr int A_BYTES = 128 * BK * 2;
constexpr int B_BYTES = BN * BK * 2;
constexpr int STAGE_BYTES = A_BYTES + B_BYTES;

__global__ void __launch_bounds__(384, 1)
conv2d_wgmma(half* y, const half* bias, const __grid_constant__ CUtensorMap x_map,
             const __grid_constant__ CUtensorMap w_map, int has_bias, int relu, int C, int M, int Ho, int Wo, int Kh,
             int Kw, int pad_h, int pad_w, int tiles_w, int tiles_h) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    // the swizzled tiles need 1024-byte alignment: round the dynamic array's start up
    unsigned char* smem = (unsigned char*)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    __shared__ uint64_t full[STAGES], empty[STAGES];

    int wg = threadIdx.x / 128;                  // 0: producer; 1, 2: consumers
    int tile = blockIdx.x;
    int tw = tile % tiles_w, th = (tile / tiles_w) % tiles_h, n = tile / (tiles_w * tiles_h);
    int ow0 = tw * BW, oh0 = th * BH, m0 = blockIdx.y * BN;
    int c_steps = (C + BK - 1) / BK, steps = Kh * Kw * c_steps;

    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) {
            mbar_init(&full[s], 1);              // the producer's one arrival (and the bytes it expects)
            mbar_init(&empty[s], 2);             // one arrival per consumer warpgroup
        }
        fence_mbar_init();
    }
    __syncthreads();

    if (wg == 0) {
        setmaxnreg_dec<40>();                    // the producer needs few registers: give them to the consumers
        if (threadIdx.x == 0) {
            for (int it = 0; it < steps; it++) {
                int s = it % STAGES;
                if (it >= STAGES) mbar_wait(&empty[s], (it / STAGES - 1) & 1);
                int c0 = (it % c_steps) * BK, tap = it / c_steps, kh = tap / Kw, kw = tap % Kw;
                unsigned char* a = smem + s * STAGE_BYTES;
                mbar_arrive_expect_tx(&full[s], STAGE_BYTES);
                tma_load_4d(a, &x_map, &full[s], c0, ow0 + kw - pad_w, oh0 + kh - pad_h, n);
                tma_load_4d(a + A_BYTES, &w_map, &full[s], c0, kw, kh, m0);
            }
        }
    } else {
        setmaxnreg_inc<232>();
        float acc[BN / 2];
        for (int i = 0; i < BN / 2; i++) acc[i] = 0.f;
        int row0 = (wg - 1) * 64;                // this warpgroup's 64 pixels of the 128
        for (int it = 0; it < steps; it++) {
            int s = it % STAGES;
            mbar_wait(&full[s], (it / STAGES) & 1);
            unsigned char* a = smem + s * STAGE_BYTES;
            uint64_t da = smem_desc_128b(a + row0 * BK * 2), db = smem_desc_128b(a + A_BYTES);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < BK / 16; kk++) WGMMA(acc, da + 2 * kk, db + 2 * kk);
            wgmma_commit();
            wgmma_wait<1>();                     // the previous stage's MMAs are done: hand its buffers back
            if (it > 0 && threadIdx.x % 128 == 0) mbar_arrive(&empty[(it - 1) % STAGES]);
        }
        wgmma_wait<0>();

        int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
#pragma unroll
        for (int h = 0; h < 2; h++) {            // rows l/4 and l/4 + 8 of this warp's 16
            int r = row0 + 16 * warp + lane / 4 + 8 * h;
            int oh = oh0 + r / BW, ow = ow0 + r % BW;
            if (oh >= Ho || ow >= Wo) continue;
            half* out = y + (((size_t)n * Ho + oh) * Wo + ow) * M;
#pragma unroll
            for (int j = 0; j < BN / 8; j++) {
                int m = m0 + 8 * j + 2 * (lane % 4);
                if (m >= M) continue;
                float v0 = acc[4 * j + 2 * h], v1 = acc[4 * j + 2 * h + 1];
                if (has_bias) v0 += __half2float(bias[m]), v1 += __half2float(bias[m + 1]);
                if (relu) v0 = fmaxf(v0, 0.f), v1 = fmaxf(v1, 0.f);
                *(half2*)(out + m) = __floats2half2_rn(v0, v1);
            }
        }
    }
}
