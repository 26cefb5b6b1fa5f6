// Requires sm_90a: wgmma, the tensor memory accelerator and setmaxnreg (H100, H200)
//
// conv2d_hopper_dw: dE/dW of a convolution on Hopper's wgmma, in fp16 or bf16 (DTYPE,
// hopper_elem.cuh): a GEMM over pixels,
//     dw[m, kh, kw, c] = sum over (b, oh, ow) of dy[b, oh, ow, m] * x[b, oh*sh + kh*dh - ph, ow*sw + kw*dw - pw, c],
// for each tap (kh, kw) a (maps x channels) GEMM whose K is the output pixels. Both operands come
// in by the copy engine as they lie in NHWC memory: a box of dy (64 maps x 64 pixels) is the A tile
// M-major (a row per pixel, its 64 maps consecutive: WG_TRANS_A), a box of x at the tap's offset,
// stepping through x by the stride (element strides), is the B tile N-major (WG_TRANS_B), 64
// channels a box, BN/64 boxes a stage. The 64 pixels of a stage are a BW x BH x BI box of dy's
// pixels (powers of two, BW*BH*BI = 64: every K row is a pixel, dy's zeros outside).
//  - A tile: CONSUMERS*64 maps x BN channels of one tap; a consumer warpgroup per 64 maps.
//  - Work units (tile, split): a unit sums an even share of the pixel boxes; with one split it
//    rounds its sums to elem and stores dw, else it stores them as fp32 to ws[split] and
//    splitk_reduce.cu adds the splits in order and rounds once.
//  - Persistent: min(units, SMs) blocks of 128*(1 + CONSUMERS) threads take the units in turn.
// Layout: dy_map (B, Ho, Wo, M) box (BI, BH, BW, 64); x_map (B, H, W, C) box (BI, BH*sh, BW*sw, 64),
// element strides (1, sh, sw, 1); dw (M, Kh, Kw, C_out) elem, C_out <= C (x's channels padded with zeros
// to C, a multiple of 8, by the launcher: an RGB stem); ws (splits, M*Kh*Kw*C_out) float when splits > 1.
// M a multiple of 8 (16-byte rows for the copy engine).
#include "hopper.cuh"
#include "hopper_elem.cuh"

#ifndef BN
#define BN 128          // channels per tile: the wgmma's N
#endif
#ifndef STAGES
#define STAGES 4
#endif
#ifndef CONSUMERS
#define CONSUMERS 2     // consumer warpgroups, 64 maps each
#endif
#define BK 64           // pixels per stage
#define DW_THREADS (128 + 128 * CONSUMERS)   // a producer warpgroup and the consumers

static_assert(BN == 64 || BN == 128 || BN == 256, "BN: 64, 128 or 256 channels per tile");
static_assert(CONSUMERS == 1 || CONSUMERS == 2, "CONSUMERS: 1 or 2 warpgroups of 64 maps");

constexpr int KIND = WG_TYPE | WG_TRANS_A | WG_TRANS_B;
constexpr int CHUNK = BK * 64 * 2;              // one box: 64 pixels x 64 values, 128-byte swizzle
constexpr int A_BYTES = CONSUMERS * CHUNK;
constexpr int STAGE_BYTES = A_BYTES + (BN / 64) * CHUNK;

__global__ void __launch_bounds__(DW_THREADS, 1)
conv2d_hopper_dw(elem* dw, float* ws, const __grid_constant__ CUtensorMap dy_map,
                 const __grid_constant__ CUtensorMap x_map, int splits, int units, int B, int C, int C_out, int M,
                 int Ho, int Wo, int Kh, int Kw, int sh, int sw, int ph, int pw, int dh, int dwl, int BW, int BH,
                 int BI) {
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = (unsigned char*)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    __shared__ uint64_t full[STAGES], empty[STAGES];

    int tiles_c = (C + BN - 1) / BN, taps = Kh * Kw;
    int boxes_w = (Wo + BW - 1) / BW, boxes_h = (Ho + BH - 1) / BH, steps = boxes_w * boxes_h * ((B + BI - 1) / BI);
    int wg = threadIdx.x / 128;

    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], CONSUMERS);
        }
        fence_mbar_init();
    }
    __syncthreads();

    if (wg == 0) {
        setmaxnreg_dec<40>();
        if (threadIdx.x == 0) {
            int it = 0;
            for (int u = blockIdx.x; u < units; u += gridDim.x) {
                int split = u % splits, tile = u / splits;
                int c0 = (tile % tiles_c) * BN, tap = tile / tiles_c % taps, m0 = tile / (tiles_c * taps) * 64 * CONSUMERS;
                int kh = tap / Kw, kw = tap % Kw;
                int k_begin = (int)((long long)steps * split / splits), k_end = (int)((long long)steps * (split + 1) / splits);
                for (int k = k_begin; k < k_end; k++, it++) {
                    int s = it % STAGES;
                    if (it >= STAGES) mbar_wait(&empty[s], (it / STAGES - 1) & 1);
                    int ow0 = (k % boxes_w) * BW, oh0 = (k / boxes_w % boxes_h) * BH, n0 = k / (boxes_w * boxes_h) * BI;
                    unsigned char* a = smem + s * STAGE_BYTES;
                    mbar_arrive_expect_tx(&full[s], STAGE_BYTES);
                    for (int g = 0; g < CONSUMERS; g++)
                        tma_load_4d(a + g * CHUNK, &dy_map, &full[s], m0 + 64 * g, ow0, oh0, n0);
                    for (int j = 0; j < BN / 64; j++)
                        tma_load_4d(a + A_BYTES + j * CHUNK, &x_map, &full[s], c0 + 64 * j, ow0 * sw + kw * dwl - pw,
                                    oh0 * sh + kh * dh - ph, n0);
                }
            }
        }
    } else {
        setmaxnreg_inc<232>();
        int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
        int it = 0;
        for (int u = blockIdx.x; u < units; u += gridDim.x) {
            int split = u % splits, tile = u / splits;
            int c0 = (tile % tiles_c) * BN, tap = tile / tiles_c % taps, m0 = tile / (tiles_c * taps) * 64 * CONSUMERS;
            int k_begin = (int)((long long)steps * split / splits), k_end = (int)((long long)steps * (split + 1) / splits);
            float acc[BN / 2];
#pragma unroll
            for (int i = 0; i < BN / 2; i++) acc[i] = 0.f;
            for (int k = k_begin; k < k_end; k++, it++) {
                int s = it % STAGES;
                mbar_wait(&full[s], (it / STAGES) & 1);
                unsigned char* a = smem + s * STAGE_BYTES;
                // both tiles a row per pixel: 16 pixels (K) are 2048 bytes, desc + 128
                uint64_t da = smem_desc_128b_mn(a + (wg - 1) * CHUNK, CHUNK);
                uint64_t db = smem_desc_128b_mn(a + A_BYTES, CHUNK);
                wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < BK / 16; kk++) wgmma_k16<BN, KIND>(acc, da + 128 * kk, db + 128 * kk);
                wgmma_commit();
                wgmma_wait<1>();
                if (k > k_begin && t == 0) mbar_arrive(&empty[(it - 1) % STAGES]);
            }
            wgmma_wait<0>();
            if (k_end > k_begin && t == 0) mbar_arrive(&empty[(it - 1) % STAGES]);
            // lane l holds maps l/4 and l/4 + 8 of its warp's 16, channels 8j + 2(l%4) and the next
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int m = m0 + 64 * (wg - 1) + 16 * warp + lane / 4 + 8 * h;
                if (m >= M) continue;
                size_t row = ((size_t)m * taps + tap) * C_out;
                float* part = ws + (size_t)split * M * taps * C_out + row;
#pragma unroll
                for (int j = 0; j < BN / 8; j++) {
                    int c = c0 + 8 * j + 2 * (lane % 4);
                    float v0 = acc[4 * j + 2 * h], v1 = acc[4 * j + 2 * h + 1];
                    if (C_out % 2 == 0) {                    // c even: c + 1 < C_out too, a pair
                        if (c >= C_out) continue;
                        if (splits == 1) *(elem2*)(dw + row + c) = to_elem2(v0, v1);
                        else *(float2*)(part + c) = make_float2(v0, v1);
                    } else {                                 // an odd C_out (a padded x): one at a time
                        for (int e = 0; e < 2 && c + e < C_out; e++) {
                            if (splits == 1) dw[row + c + e] = to_elem(e ? v1 : v0);
                            else part[c + e] = e ? v1 : v0;
                        }
                    }
                }
            }
        }
    }
}
