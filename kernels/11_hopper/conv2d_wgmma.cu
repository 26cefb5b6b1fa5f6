// Requires sm_90a: wgmma, the tensor memory accelerator and setmaxnreg (H100, H200)
//
// Chapter 11: an fp16 implicit-GEMM convolution on Hopper's warpgroup MMA, fed by the copy engine.
// The GEMM of chapter 9 (Y = A . B^T, a row of A one output pixel's receptive field, a row of B
// one map's weights, K = Kh*Kw*C with the channel fastest), with who-does-what changed:
//
//  - One producer thread asks the tensor memory accelerator (TMA) for each tile: for tap (kh, kw)
//    and channels c0..c0+63, the box of x at (c0, ow0 + kw - pad_w, oh0 + kh - pad_h, n0) of
//    64 channels x BW pixels x BH rows x BI images is the A tile of the block's BW*BH*BI <= 128
//    output pixels (zeros where the box leaves the input: the padding costs nothing); the box of
//    the mask at (c0, kw, kh, m0) of 64 channels x BN maps is the B tile. No thread computes an
//    address.
//  - STAGES shared-memory stages form a ring. full[s] (an mbarrier) completes when both boxes of
//    stage s have landed (the producer told it how many bytes to expect); empty[s] completes when
//    both consumer warpgroups are done reading stage s, and the producer waits for it before it
//    refills the stage.
//  - Two consumer warpgroups each multiply 64 of a tile's 128 pixel rows by the BN maps with wgmma
//    m64nBNk16 straight from shared memory (no ldmatrix: the descriptor says where the tile is),
//    four per 64-deep stage, and keep one stage's MMAs in flight while they wait for the next.
//  - Persistent: gridDim.x blocks (one per SM) take the output tiles in turn, so the producer
//    already loads the next tile while the consumers store this one.
//  - RINGS = 2 ("ping-pong"): each consumer warpgroup takes 64-row tiles of its own, fed through a
//    ring of its own by a producer warp of its own, so one's epilogue overlaps the other's MMAs
//    and a small layer has twice the tiles to spread over the SMs.
//  - Epilogue: the fp32 sums plus bias (half, read when has_bias), ReLU if relu, rounded to half
//    into the warpgroup's staging tile in shared memory, then stored to NHWC y (B, Ho, Wo, M) as
//    16-byte rows (a pixel's maps are contiguous in y).
//
// Needs stride 1, dilation 1, C % 8 == 0 (TMA's 16-byte rows; a partial step of 64 channels reads
// zeros) and M % 8 == 0 (16-byte stores). x is NHWC (a channels_last tensor), the mask (M, Kh, Kw, C).
#include <cuda_fp16.h>
#include "hopper.cuh"

#ifndef BN
#define BN 128          // maps per tile: the wgmma's N
#endif
#ifndef STAGES
#define STAGES 4        // stages per ring
#endif
#ifndef RINGS
#define RINGS 1         // 1: both consumers share 128-row tiles; 2: each takes 64-row tiles of its own
#endif
#define BK 64           // channels per stage: one 128-byte swizzled row of halves
#define TILE_ROWS (128 / RINGS)

#if BN == 64
#define WGMMA wgmma_m64n64k16
#elif BN == 128
#define WGMMA wgmma_m64n128k16
#elif BN == 256
#define WGMMA wgmma_m64n256k16
#else
#error "BN: 64, 128 or 256 maps per tile"
#endif

constexpr int A_BYTES = TILE_ROWS * BK * 2;     // the tile's pixel rows (the box fills BW*BH*BI of them)
constexpr int B_BYTES = BN * BK * 2;
constexpr int STAGE_BYTES = A_BYTES + B_BYTES;
constexpr int OUT_ROW = BN * 2 + 16;            // a staged pixel's BN halves, padded 16 bytes (banks)

__global__ void __launch_bounds__(384, 1)
conv2d_wgmma(half* y, const half* bias, const __grid_constant__ CUtensorMap x_map,
             const __grid_constant__ CUtensorMap w_map, int has_bias, int relu, int B, int C, int M, int Ho, int Wo,
             int Kh, int Kw, int pad_h, int pad_w, int BW, int BH, int BI, int box_bytes) {
    extern __shared__ unsigned char smem_raw[];
    // the swizzled tiles need 1024-byte alignment: round the dynamic array's start up
    unsigned char* smem = (unsigned char*)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    unsigned char* staging = smem + RINGS * STAGES * STAGE_BYTES;      // 2 x 64 pixels x OUT_ROW
    __shared__ uint64_t full[RINGS][STAGES], empty[RINGS][STAGES];

    int tiles_w = (Wo + BW - 1) / BW, tiles_h = (Ho + BH - 1) / BH, tiles_n = (B + BI - 1) / BI;
    int tiles_m = (M + BN - 1) / BN, tiles = tiles_w * tiles_h * tiles_n * tiles_m;
    int c_steps = (C + BK - 1) / BK, steps = Kh * Kw * c_steps;
    int wg = threadIdx.x / 128;                  // 0: producer; 1, 2: consumers
    // ring r holds the tiles blockIdx.x * RINGS + r, then every gridDim.x * RINGS-th
    int ring = RINGS == 1 ? 0 : (wg == 0 ? threadIdx.x / 32 : wg - 1);

    if (threadIdx.x == 0) {
        for (int r = 0; r < RINGS; r++)
            for (int s = 0; s < STAGES; s++) {
                mbar_init(&full[r][s], 1);       // the producer's one arrival (and the bytes it expects)
                mbar_init(&empty[r][s], 2 / RINGS);   // one arrival per consumer warpgroup of the ring
            }
        fence_mbar_init();
    }
    __syncthreads();

    if (wg == 0) {  // listing: producer
        setmaxnreg_dec<40>();                    // the producer needs few registers: give them to the consumers
        if (threadIdx.x % 32 == 0 && threadIdx.x / 32 < RINGS) {   // lane 0 of warp r feeds ring r
            int it = 0;                          // the ring's position, running on across tiles
            for (int tile = blockIdx.x * RINGS + ring; tile < tiles; tile += gridDim.x * RINGS) {
                int m0 = (tile % tiles_m) * BN, p = tile / tiles_m;
                int ow0 = (p % tiles_w) * BW, oh0 = (p / tiles_w % tiles_h) * BH, n0 = p / (tiles_w * tiles_h) * BI;
                for (int k = 0; k < steps; k++, it++) {
                    int s = it % STAGES;
                    if (it >= STAGES) mbar_wait(&empty[ring][s], (it / STAGES - 1) & 1);
                    int c0 = (k % c_steps) * BK, tap = k / c_steps, kh = tap / Kw, kw = tap % Kw;
                    unsigned char* a = smem + (ring * STAGES + s) * STAGE_BYTES;
                    mbar_arrive_expect_tx(&full[ring][s], box_bytes + B_BYTES);
                    tma_load_4d(a, &x_map, &full[ring][s], c0, ow0 + kw - pad_w, oh0 + kh - pad_h, n0);
                    tma_load_4d(a + A_BYTES, &w_map, &full[ring][s], c0, kw, kh, m0);
                }
            }
        }  // end listing: producer
    } else {
        setmaxnreg_inc<232>();
        int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
        int row0 = RINGS == 1 ? (wg - 1) * 64 : 0;    // this warpgroup's 64 pixel rows of the tile
        unsigned char* out = staging + (wg - 1) * 64 * OUT_ROW;
        int it = 0;
        for (int tile = blockIdx.x * RINGS + ring; tile < tiles; tile += gridDim.x * RINGS) {
            int m0 = (tile % tiles_m) * BN, p = tile / tiles_m;
            int ow0 = (p % tiles_w) * BW, oh0 = (p / tiles_w % tiles_h) * BH, n0 = p / (tiles_w * tiles_h) * BI;
            float acc[BN / 2];
#pragma unroll
            for (int i = 0; i < BN / 2; i++) acc[i] = 0.f;
            for (int k = 0; k < steps; k++, it++) {  // listing: consumer_loop
                int s = it % STAGES;
                mbar_wait(&full[ring][s], (it / STAGES) & 1);
                unsigned char* a = smem + (ring * STAGES + s) * STAGE_BYTES;
                uint64_t da = smem_desc_128b(a + row0 * BK * 2), db = smem_desc_128b(a + A_BYTES);
                wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < BK / 16; kk++) WGMMA(acc, da + 2 * kk, db + 2 * kk);
                wgmma_commit();
                wgmma_wait<1>();                 // the previous stage's MMAs are done: hand its buffers back
                if (k > 0 && t == 0) mbar_arrive(&empty[ring][(it - 1) % STAGES]);
            }
            wgmma_wait<0>();
            if (t == 0) mbar_arrive(&empty[ring][(it - 1) % STAGES]);  // end listing: consumer_loop

            // sums -> bias, ReLU, half -> the staging tile: lane l holds rows l/4 and l/4 + 8 of its  // listing: epilogue
            // warp's 16, maps 8j + 2(l%4) and the next
#pragma unroll
            for (int j = 0; j < BN / 8; j++) {
                int m = m0 + 8 * j + 2 * (lane % 4);
                float b0 = 0.f, b1 = 0.f;
                if (has_bias && m < M) b0 = __half2float(bias[m]), b1 = __half2float(bias[m + 1]);
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    float v0 = acc[4 * j + 2 * h] + b0, v1 = acc[4 * j + 2 * h + 1] + b1;
                    if (relu) v0 = fmaxf(v0, 0.f), v1 = fmaxf(v1, 0.f);
                    int r = 16 * warp + lane / 4 + 8 * h;
                    *(half2*)(out + r * OUT_ROW + (8 * j + 2 * (lane % 4)) * 2) = __floats2half2_rn(v0, v1);
                }
            }
            named_barrier_sync(wg, 128);         // this warpgroup's tile is staged
            // 16-byte chunks: BN/8 per pixel row, consecutive threads along a row (coalesced in y)
            for (int c = t; c < 64 * (BN / 8); c += 128) {
                int r = c / (BN / 8), ch = c % (BN / 8), q = row0 + r, m = m0 + 8 * ch;
                int bw = q % BW, bh = q / BW % BH, bi = q / (BW * BH);
                int ow = ow0 + bw, oh = oh0 + bh, n = n0 + bi;
                if (bi < BI && n < B && oh < Ho && ow < Wo && m < M)
                    *(uint4*)(y + (((size_t)n * Ho + oh) * Wo + ow) * M + m) = *(const uint4*)(out + r * OUT_ROW + ch * 16);
            }
            named_barrier_sync(wg, 128);         // read back before the next tile overwrites it  // end listing: epilogue
        }
    }
}
