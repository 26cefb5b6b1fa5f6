// Requires sm_90a: wgmma with .tf32 operands, the tensor memory accelerator and setmaxnreg (H100, H200)
//
// Chapter 12: an fp32 convolution on Hopper's warpgroup MMA with TF32 operands, chapter 11's
// pipeline (a producer thread asking the copy engine for boxes, a ring of STAGES stages with full
// and empty mbarriers, two consumer warpgroups, persistent blocks) with fp32 data:
//
//  - GEMM view Y (M x P) = W (M x K) . X^T with the maps as the wgmma's rows: a consumer warpgroup
//    multiplies 64 maps by BN pixels (m64nBNk8), and its accumulators hold pairs of adjacent pixels
//    of one map, so y is stored NCHW, as torch's conv2d returns it, straight from the registers.
//    MAPS = 128: the two warpgroups take maps 0-63 and 64-127 of a tile of BN pixels; MAPS = 64:
//    both take the tile's 64 maps, each its own BN of the tile's 2*BN pixels.
//  - A stage is one tap (kh, kw) and 32 channels: rows of 32 floats, 128 bytes, in the 128-byte
//    swizzle. The x box at (c0, ow0 + kw - pad_w, oh0 + kh - pad_h, n0) is BW x BH pixels of BI
//    images (zeros where it leaves the input: the padding); the mask's at (c0, kw, kh, m0) is MAPS
//    maps. A wgmma m64nBNk8 takes 8 of the 32 floats: desc + 2 per step, 4 steps a stage.
//  - PRODUCTS = 1 (TF32): x and the mask come rounded to TF32 (tf32_prep.cu, MODE 1), one wgmma a
//    step. PRODUCTS = 3 (3xTF32): they come split, hi and lo (MODE 2: wgmma reads its operands
//    from shared memory, so the split is made once per element, in that pass), a stage holds both
//    parts of both boxes, and a step is three wgmmas, the small products first: lo*hi, hi*lo, hi*hi.
//  - Promotion: a stage's wgmmas sum into a fresh zero (the first with accumulate off), and that sum
//    is added to the accumulator by ordinary fp32 adds, rounded to nearest: the tensor cores' sums
//    round toward zero (clemu_mma_numerics.h), and a reduction of thousands of steps chained through
//    them would drift. The adds wait for the stage's MMAs (wgmma_wait<0>); meanwhile the other
//    consumer warpgroup's MMAs keep the tensor cores busy. (Reading one partial sum while the MMAs
//    of another are in flight makes ptxas serialize every wgmma: warning C7514.)
//  - Split-K (splits > 1): a tile's steps are cut in `splits` shares, each a work unit of its own,
//    so a layer whose tiles would leave the last round of SMs part idle spreads evenly; each share
//    stores its fp32 partial sums to ws and tf32_splitk_reduce adds them and the bias.
//  - Epilogue: the promoted sums plus bias, stored to NCHW y by each lane (a quad of lanes writes 8
//    adjacent pixels of a map).
//
// Needs stride 1, dilation 1. x_hi, x_lo: (B, H, W, C4) float, the mask's w_hi, w_lo (M, Kh, Kw, C4),
// C4 % 4 == 0 (16-byte rows for the copy engine; a partial 32-channel step reads zeros); with
// PRODUCTS = 1 the lo maps are not read (pass the hi ones). y (B, M, Ho, Wo) float, or the partial
// sums ws (SPLITS, B, M, Ho, Wo). Grid: min(units, SMs) blocks of 384 threads (a producer warpgroup,
// two consumers), dynamic shared memory STAGES * STAGE_BYTES + 1024.
#include "wgmma_tf32.cuh"

#ifndef BN
#define BN 128          // pixels per consumer warpgroup: the wgmma's N
#endif
#ifndef MAPS
#define MAPS 128        // maps per tile: 128 (a warpgroup each) or 64 (shared)
#endif
#ifndef STAGES
#define STAGES 3
#endif
#ifndef PRODUCTS
#define PRODUCTS 3
#endif
#define BK 32           // channels per stage: one 128-byte swizzled row of floats

#if BN == 64
#define WGMMA wgmma_m64n64k8_tf32
#elif BN == 128
#define WGMMA wgmma_m64n128k8_tf32
#else
#error "BN: 64 or 128 pixels per warpgroup"
#endif
static_assert(MAPS == 64 || MAPS == 128, "MAPS: 64 or 128 maps per tile");
static_assert(PRODUCTS == 1 || PRODUCTS == 3, "PRODUCTS: 1 (TF32) or 3 (3xTF32)");

constexpr int TILE_PIX = MAPS == 128 ? BN : 2 * BN;            // pixel rows of a tile
constexpr int A_BYTES = MAPS * BK * 4, B_BYTES = TILE_PIX * BK * 4;
constexpr int PART = A_BYTES + B_BYTES;                         // one part (hi or lo) of both boxes
constexpr int STAGE_BYTES = PART * (PRODUCTS == 3 ? 2 : 1);     // [A hi][B hi]([A lo][B lo])
constexpr int ACC = BN / 2;                                     // a thread's accumulators

__device__ __forceinline__ void add_to(float (&acc)[ACC], const float (&part)[ACC]) {
#pragma unroll
    for (int i = 0; i < ACC; i++) acc[i] += part[i];
}

// One stage's MMAs, summed into `into` from zero (the first wgmma's accumulate is off), committed as a group.
__device__ __forceinline__ void mma_stage(float (&into)[ACC], unsigned char* st, int a_row, int b_row) {
    const uint64_t a_hi = smem_desc_128b(st + a_row * BK * 4), b_hi = smem_desc_128b(st + A_BYTES + b_row * BK * 4);
#if PRODUCTS == 3
    const uint64_t a_lo = smem_desc_128b(st + PART + a_row * BK * 4);
    const uint64_t b_lo = smem_desc_128b(st + PART + A_BYTES + b_row * BK * 4);
#endif
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BK / 8; kk++) {
#if PRODUCTS == 3
        WGMMA(into, a_lo + 2 * kk, b_hi + 2 * kk, kk > 0);
        WGMMA(into, a_hi + 2 * kk, b_lo + 2 * kk);
        WGMMA(into, a_hi + 2 * kk, b_hi + 2 * kk);
#else
        WGMMA(into, a_hi + 2 * kk, b_hi + 2 * kk, kk > 0);
#endif
    }
    wgmma_commit();
}

__global__ void __launch_bounds__(384, 1)
conv2d_wgmma_tf32(float* y, const float* bias, const __grid_constant__ CUtensorMap x_hi,
                  const __grid_constant__ CUtensorMap x_lo, const __grid_constant__ CUtensorMap w_hi,
                  const __grid_constant__ CUtensorMap w_lo, int has_bias, int B, int C4, int M, int Ho, int Wo,
                  int Kh, int Kw, int pad_h, int pad_w, int BW, int BH, int BI, int box_bytes, int splits)
{
    extern __shared__ unsigned char smem_raw[];
    // the swizzled tiles need 1024-byte alignment: round the dynamic array's start up
    unsigned char* smem = (unsigned char*)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    __shared__ uint64_t full[STAGES], empty[STAGES];

    const int tiles_w = (Wo + BW - 1) / BW, tiles_h = (Ho + BH - 1) / BH, tiles_n = (B + BI - 1) / BI;
    const int tiles_m = (M + MAPS - 1) / MAPS, units = tiles_w * tiles_h * tiles_n * tiles_m * splits;
    const int c_steps = (C4 + BK - 1) / BK, steps = Kh * Kw * c_steps, per = (steps + splits - 1) / splits;
    const int wg = threadIdx.x / 128;                // 0: producer; 1, 2: consumers

    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) {
            mbar_init(&full[s], 1);                  // the producer's one arrival (and the bytes it expects)
            mbar_init(&empty[s], 2);                 // one arrival per consumer warpgroup
        }
        fence_mbar_init();
    }
    __syncthreads();

    // unit u: share u % splits of the steps of tile u / splits (maps fastest, then pixels)
    if (wg == 0) {
        setmaxnreg_dec<40>();                        // the producer needs few registers: give them to the consumers
        if (threadIdx.x == 0) {
            int it = 0;                              // the ring's position, running on across units
            for (int u = blockIdx.x; u < units; u += gridDim.x) {
                const int tile = u / splits, k0 = (u % splits) * per, k1 = min(steps, k0 + per);
                const int m0 = (tile % tiles_m) * MAPS, p = tile / tiles_m;
                const int ow0 = (p % tiles_w) * BW, oh0 = (p / tiles_w % tiles_h) * BH, n0 = p / (tiles_w * tiles_h) * BI;
                for (int k = k0; k < k1; k++, it++) {
                    const int s = it % STAGES;
                    if (it >= STAGES) mbar_wait(&empty[s], (it / STAGES - 1) & 1);
                    const int c0 = (k % c_steps) * BK, tap = k / c_steps, kh = tap / Kw, kw = tap % Kw;
                    unsigned char* st = smem + s * STAGE_BYTES;
                    mbar_arrive_expect_tx(&full[s], (A_BYTES + box_bytes) * (PRODUCTS == 3 ? 2 : 1));
                    tma_load_4d(st, &w_hi, &full[s], c0, kw, kh, m0);
                    tma_load_4d(st + A_BYTES, &x_hi, &full[s], c0, ow0 + kw - pad_w, oh0 + kh - pad_h, n0);
#if PRODUCTS == 3
                    tma_load_4d(st + PART, &w_lo, &full[s], c0, kw, kh, m0);
                    tma_load_4d(st + PART + A_BYTES, &x_lo, &full[s], c0, ow0 + kw - pad_w, oh0 + kh - pad_h, n0);
#endif
                }
            }
        }
    } else {
        setmaxnreg_inc<232>();
        const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
        const int a_row = MAPS == 128 ? (wg - 1) * 64 : 0;     // this warpgroup's maps of the tile
        const int b_row = MAPS == 128 ? 0 : (wg - 1) * BN;     // ... and pixels
        int it = 0;
        for (int u = blockIdx.x; u < units; u += gridDim.x) {
            const int tile = u / splits, share = u % splits, k0 = share * per, k1 = min(steps, k0 + per);
            const int m0 = (tile % tiles_m) * MAPS, p = tile / tiles_m;
            const int ow0 = (p % tiles_w) * BW, oh0 = (p / tiles_w % tiles_h) * BH, n0 = p / (tiles_w * tiles_h) * BI;
            float acc[ACC], part[ACC];
#pragma unroll
            for (int i = 0; i < ACC; i++) acc[i] = 0.f;

            for (int k = k0; k < k1; k++, it++) {  // listing: consumer_loop
                const int s = it % STAGES;
                mbar_wait(&full[s], (it / STAGES) & 1);
                mma_stage(part, smem + s * STAGE_BYTES, a_row, b_row);
                wgmma_wait<0>();                     // the stage's sum is in: its buffers go back,
                if (t == 0) mbar_arrive(&empty[s]);
                add_to(acc, part);                   // and it is promoted  // end listing: consumer_loop
            }

            // lane l holds maps 16*warp + l/4 (+8) and pixels 8j + 2(l%4) (+1) of its 64 x BN
            float* out = splits > 1 ? y + (long long)share * B * M * Ho * Wo : y;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int m = m0 + a_row + 16 * warp + lane / 4 + 8 * h;
                if (m >= M) continue;
                const float b = has_bias && splits == 1 ? bias[m] : 0.f;
#pragma unroll
                for (int j = 0; j < BN / 8; j++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const int q = b_row + 8 * j + 2 * (lane % 4) + e;
                        const int bw = q % BW, bh = q / BW % BH, bi = q / (BW * BH);
                        const int ow = ow0 + bw, oh = oh0 + bh, n = n0 + bi;
                        if (bi < BI && n < B && oh < Ho && ow < Wo)
                            out[(((long long)n * M + m) * Ho + oh) * Wo + ow] = acc[4 * j + 2 * h + e] + b;
                    }
            }
        }
    }
}
