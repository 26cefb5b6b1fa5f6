// Requires sm_90a: wgmma, the tensor memory accelerator and setmaxnreg (H100, H200)
//
// conv2d_hopper: chapter 11's wgmma + TMA implicit GEMM (conv2d_wgmma.cu: one producer warpgroup
// asking the copy engine for each stage's boxes, two consumer warpgroups multiplying them, a
// persistent grid) for the layers of today's CNNs, in fp16 or bf16 (DTYPE, hopper_elem.cuh):
//
//  - Any stride, padding and dilation. The A box of tap (kh, kw) for the tile's pixels from
//    (oh0, ow0) starts at x's row oh0*sh + kh*dh - ph, column ow0*sw + kw*dw - pw, and the tensor
//    map steps through x's rows and columns by the stride (element strides sh, sw): the box holds
//    exactly the tile's pixels' inputs, zeros outside x. 1x1 layers at stride 1: the launcher
//    views x as one row of B*H*W pixels, a plain GEMM over pixels in 128-row tiles.
//  - Few channels (SMALL_C, the launcher pads C to 8): a stage holds 8 taps of 8 channels (16-byte
//    rows without swizzle, a box per tap), one wgmma per 2 taps, instead of 64 channels of one tap
//    of which all but C would be zeros.
//  - dX (DX): the same loop on dy, the mask read as it lies (w (M, Kh, Kw, C): a row of the B tile
//    is one channel m of dy, its C values consecutive, so B is N-major, WG_TRANS_B), in stride
//    phases: the tiles of phase (rh, rw) compute dx's pixels (rh + sh*i, rw + sw*j) from the taps
//    kh with (rh + ph - kh*dh) % sh == 0 (likewise kw), the flipped mask's, each reading dy at
//    i + (rh + ph - kh*dh)/sh. A phase no tap reaches is written as zeros. One launch for all phases.
//  - Split-K (splits > 1, for layers with too few tiles for the SMs): the work units are (tile,
//    split); a unit sums an even share of its tile's K steps and stores the fp32 sums to
//    ws[split]; splitk_reduce.cu then adds the splits in order 0, 1, ... (the same bits on every
//    run), adds the bias, applies ReLU and rounds once.
//  - Epilogue without a split: sums plus bias (elem, when has_bias), ReLU if relu, rounded to elem
//    into the warpgroup's staging tile, stored to y as 16-byte pieces of a pixel's maps (NM % 8 ==
//    0) or one element at a time. TMA_STORE (forward, one ring): both consumers stage the tile in
//    the 128-byte swizzle, 64 channels a box, and one thread hands the boxes to the copy engine
//    (y_map): the consumers go on to the next tile's MMAs while it stores; the staging tile is
//    rewritten only after the thread's bulk_wait_read<0>() and a barrier.
//
// Layout (N = the output's channels NM, K the input's KC; forward: N = M, K = C; dX: N = C, K = M):
//   a_map: the input, NHWC (B, Hin, Win, KC), box (BI, BH*es_h, BW*es_w, 64) with element strides
//          (1, es_h, es_w, 1), es = the stride forward, 1 for dX; SMALL_C: box (.., 8), no swizzle
//   b_map: the mask (M, Kh, Kw, C); forward box (BN, 1, 1, 64), SMALL_C (BN, 1, 1, 8) without
//          swizzle; dX box (64, 1, 1, 64) (64 of dy's channels x 64 of x's), BN/64 boxes a stage
//   y:     NHWC (B, Hout, Wout, NM); ws (splits, B*Hout*Wout, NM) float when splits > 1
//   y_map: TMA_STORE: y, box (BI, BH, BW, 64) in the 128-byte swizzle (else not read)
// A tile: BN output channels x the pixels of a BW x BH x BI box (<= 128/RINGS) of one phase.
// Grid: min(units, SMs) blocks of 384 threads, persistent; dynamic shared memory as the launcher's
// shared_bytes.
#include "hopper.cuh"
#include "hopper_elem.cuh"

#ifndef BN
#define BN 128          // output channels per tile: the wgmma's N
#endif
#ifndef STAGES
#define STAGES 4
#endif
#ifndef RINGS
#define RINGS 1         // 1: both consumers share 128-row tiles; 2: each takes 64-row tiles of its own
#endif
#ifndef DX
#define DX 0            // 1: dE/dX (B N-major, stride phases)
#endif
#ifndef SMALL_C
#define SMALL_C 0       // 1: 8 channels a tap, 8 taps a stage
#endif
#ifndef TMA_STORE
#define TMA_STORE 0     // 1: the epilogue's stores by the copy engine (forward, one ring, no split)
#endif
#define BK 64           // K values per stage: 64 channels, or 8 taps of 8
#define TILE_ROWS (128 / RINGS)
#define TAPS 8          // SMALL_C: taps per stage

static_assert(BN == 64 || BN == 128 || BN == 256, "BN: 64, 128 or 256 output channels per tile");
static_assert(!(DX && SMALL_C), "dX reads dy's channels, a multiple of 8: no SMALL_C");
static_assert(!(TMA_STORE && (DX || RINGS != 1)), "TMA_STORE: the forward's dense output, one ring");
static_assert(!(DX && RINGS != 1), "dX: one ring (the phases' producer needs more than the 40 registers it keeps)");

constexpr int KIND = WG_TYPE | (DX ? WG_TRANS_B : 0);
constexpr int A_BYTES = TILE_ROWS * BK * 2;     // the tile's pixel rows (the box fills BW*BH*BI of them)
constexpr int B_BYTES = BN * BK * 2;
constexpr int STAGE_BYTES = A_BYTES + B_BYTES;
constexpr int A_TAP = TILE_ROWS * 16, B_TAP = BN * 16;   // SMALL_C: one tap's rows of 8 channels
constexpr int B_CHUNK = 64 * BK * 2;            // dX: one box of 64 channels of x by the stage's 64 of dy
constexpr int OUT_ROW = BN * 2 + 16;            // a staged pixel's BN values, padded 16 bytes (banks)

// One axis of a tile's phase: its pixels (n), the input coordinate of the box's first pixel for its
// first tap (a0, plus i0 * the element stride), the step per tap (a_step), the mask's first tap and
// the step per tap (k0, k_step), how many taps (taps), and the output's offset and stride (r, s_out).
struct Axis { int n, a0, a_step, k0, k_step, taps, r, s_out; };

__device__ __forceinline__ int gcd_of(int a, int b) {
    while (b) { int t = a % b; a = b; b = t; }
    return a;
}

// Forward: output pixel i of n_out reads input i*s + k*d - p for taps k = 0..K-1 (the element stride
// s). dX, phase r of dx's n_out pixels: dx pixel r + s*i reads dy at i + (r + p - k*d)/s for the taps
// k with (r + p - k*d) % s == 0: from the largest, k0, down in steps of s/g (g = gcd(s, d)), dy
// moving d/g per tap.
__device__ Axis axis_of(int r, int n_out, int K, int s, int p, int d) {
    Axis a;
    if (!DX) {
        a.n = n_out, a.a0 = -p, a.a_step = d, a.k0 = 0, a.k_step = 1, a.taps = K, a.r = 0, a.s_out = 1;
        return a;
    }
    int g = gcd_of(s, d), k0 = -1;
    for (int k = K - 1; k >= 0 && k0 < 0; k--)
        if ((r + p - k * d) % s == 0) k0 = k;
    a.n = (n_out - r + s - 1) / s, a.r = r, a.s_out = s;
    a.k0 = k0, a.k_step = -(s / g), a.a_step = d / g;
    a.taps = k0 < 0 ? 0 : k0 / (s / g) + 1;
    a.a0 = k0 < 0 ? 0 : (r + p - k0 * d) / s;
    return a;
}

struct Tile {
    Axis h, w;
    int m0, n0, i0, j0;        // first output channel; first image, row and column of the box in the phase
    int steps, k_begin, k_end;  // the tile's K steps; this unit's share
    int split;
};

// Work unit u: (tile, split); tiles phase by phase, then pixel boxes, then BN-wide channel groups.
__device__ Tile tile_of(int u, int splits, int B, int NM, int KC, int Hout, int Wout, int Kh, int Kw, int sh, int sw,
                        int ph, int pw, int dh, int dw, int BW, int BH, int BI) {
    Tile T;
    T.split = u % splits;
    int t = u / splits;
    int phases_h = DX ? min(sh, Hout) : 1, phases_w = DX ? min(sw, Wout) : 1;
    int tiles_m = (NM + BN - 1) / BN, tiles_n = (B + BI - 1) / BI;
    for (int q = 0; q < phases_h * phases_w; q++) {
        T.h = axis_of(q / phases_w, Hout, Kh, sh, ph, dh);
        T.w = axis_of(q % phases_w, Wout, Kw, sw, pw, dw);
        int tiles_w = (T.w.n + BW - 1) / BW, tiles_h = (T.h.n + BH - 1) / BH;
        int count = tiles_w * tiles_h * tiles_n * tiles_m;
        if (t < count || q == phases_h * phases_w - 1) {
            T.m0 = (t % tiles_m) * BN;
            int p = t / tiles_m;
            T.j0 = (p % tiles_w) * BW, T.i0 = (p / tiles_w % tiles_h) * BH, T.n0 = p / (tiles_w * tiles_h) * BI;
            break;
        }
        t -= count;
    }
    int taps = T.h.taps * T.w.taps;
    T.steps = SMALL_C ? (taps + TAPS - 1) / TAPS : taps * ((KC + BK - 1) / BK);
    T.k_begin = (int)((long long)T.steps * T.split / splits);
    T.k_end = (int)((long long)T.steps * (T.split + 1) / splits);
    return T;
}

__global__ void __launch_bounds__(384, 1)
conv2d_hopper(elem* y, const elem* bias, float* ws, const __grid_constant__ CUtensorMap a_map,
              const __grid_constant__ CUtensorMap b_map, const __grid_constant__ CUtensorMap y_map, int has_bias,
              int relu, int splits, int units, int B,
              int KC, int NM, int Hout, int Wout, int Kh, int Kw, int sh, int sw, int ph, int pw, int dh, int dw,
              int BW, int BH, int BI, int a_box_bytes) {
    extern __shared__ unsigned char smem_raw[];
    // the swizzled tiles need 1024-byte alignment: round the dynamic array's start up
    unsigned char* smem = (unsigned char*)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    unsigned char* staging = smem + RINGS * STAGES * STAGE_BYTES;      // 2 x 64 pixels x OUT_ROW
    __shared__ uint64_t full[RINGS][STAGES], empty[RINGS][STAGES];

    int c_steps = (KC + BK - 1) / BK;
    int es_h = DX ? 1 : sh, es_w = DX ? 1 : sw;   // the a_map's element strides: the box's step per pixel
    int wg = threadIdx.x / 128;                  // 0: producer; 1, 2: consumers
    int ring = RINGS == 1 ? 0 : (wg == 0 ? threadIdx.x / 32 : wg - 1);

    if (threadIdx.x == 0) {
        for (int r = 0; r < RINGS; r++)
            for (int s = 0; s < STAGES; s++) {
                mbar_init(&full[r][s], 1);
                mbar_init(&empty[r][s], 2 / RINGS);
            }
        fence_mbar_init();
    }
    __syncthreads();

    if (wg == 0) {
        setmaxnreg_dec<40>();
        if (threadIdx.x % 32 == 0 && threadIdx.x / 32 < RINGS) {   // lane 0 of warp r feeds ring r
            int it = 0;
            for (int u = blockIdx.x * RINGS + ring; u < units; u += gridDim.x * RINGS) {
                Tile T = tile_of(u, splits, B, NM, KC, Hout, Wout, Kh, Kw, sh, sw, ph, pw, dh, dw, BW, BH, BI);
                int ah = T.i0 * es_h + T.h.a0, aw = T.j0 * es_w + T.w.a0;
                for (int k = T.k_begin; k < T.k_end; k++, it++) {
                    int s = it % STAGES;
                    if (it >= STAGES) mbar_wait(&empty[ring][s], (it / STAGES - 1) & 1);
                    unsigned char* a = smem + (ring * STAGES + s) * STAGE_BYTES;
                    unsigned char* b = a + A_BYTES;
                    if (SMALL_C) {
                        mbar_arrive_expect_tx(&full[ring][s], TAPS * (a_box_bytes + B_TAP));
                        for (int q = 0; q < TAPS; q++) {
                            int tap = k * TAPS + q, th = tap / T.w.taps, tw = tap % T.w.taps;
                            bool real = tap < T.h.taps * T.w.taps;   // past the mask: boxes outside, zeros
                            tma_load_4d(a + q * A_TAP, &a_map, &full[ring][s], 0, aw + tw * T.w.a_step,
                                        ah + th * T.h.a_step, real ? T.n0 : B);
                            tma_load_4d(b + q * B_TAP, &b_map, &full[ring][s], 0, tw, real ? th : Kh, T.m0);
                        }
                    } else {
                        int c0 = (k % c_steps) * BK, tap = k / c_steps, th = tap / T.w.taps, tw = tap % T.w.taps;
                        int kh = T.h.k0 + th * T.h.k_step, kw = T.w.k0 + tw * T.w.k_step;
                        mbar_arrive_expect_tx(&full[ring][s], a_box_bytes + B_BYTES);
                        tma_load_4d(a, &a_map, &full[ring][s], c0, aw + tw * T.w.a_step, ah + th * T.h.a_step,
                                    T.n0);
                        if (DX)
                            for (int j = 0; j < BN / 64; j++)
                                tma_load_4d(b + j * B_CHUNK, &b_map, &full[ring][s], T.m0 + 64 * j, kw, kh, c0);
                        else
                            tma_load_4d(b, &b_map, &full[ring][s], c0, kw, kh, T.m0);
                    }
                }
            }
        }
    } else {
        setmaxnreg_inc<232>();
        int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
        int row0 = RINGS == 1 ? (wg - 1) * 64 : 0;    // this warpgroup's 64 pixel rows of the tile
        unsigned char* out = staging + (wg - 1) * 64 * OUT_ROW;
        int it = 0;
        for (int u = blockIdx.x * RINGS + ring; u < units; u += gridDim.x * RINGS) {
            Tile T = tile_of(u, splits, B, NM, KC, Hout, Wout, Kh, Kw, sh, sw, ph, pw, dh, dw, BW, BH, BI);
            float acc[BN / 2];
#pragma unroll
            for (int i = 0; i < BN / 2; i++) acc[i] = 0.f;
            for (int k = T.k_begin; k < T.k_end; k++, it++) {
                int s = it % STAGES;
                mbar_wait(&full[ring][s], (it / STAGES) & 1);
                unsigned char* a = smem + (ring * STAGES + s) * STAGE_BYTES;
                unsigned char* b = a + A_BYTES;
                wgmma_fence();
                if (SMALL_C) {
#pragma unroll
                    for (int kk = 0; kk < TAPS / 2; kk++)    // taps 2kk and 2kk+1: K values 0-7 and 8-15
                        wgmma_k16<BN, KIND>(acc, smem_desc_plain(a + 2 * kk * A_TAP + row0 * 16, A_TAP, 128),
                                            smem_desc_plain(b + 2 * kk * B_TAP, B_TAP, 128));
                } else {
                    uint64_t da = smem_desc_128b(a + row0 * BK * 2);
                    uint64_t db = DX ? smem_desc_128b_mn(b, B_CHUNK) : smem_desc_128b(b);
#pragma unroll
                    for (int kk = 0; kk < BK / 16; kk++)       // N-major B: 16 K rows are 2048 bytes
                        wgmma_k16<BN, KIND>(acc, da + 2 * kk, db + (DX ? 128 : 2) * kk);
                }
                wgmma_commit();
                wgmma_wait<1>();                 // the previous stage's MMAs are done: hand its buffers back
                if (k > T.k_begin && t == 0) mbar_arrive(&empty[ring][(it - 1) % STAGES]);
            }
            wgmma_wait<0>();
            if (T.k_end > T.k_begin && t == 0) mbar_arrive(&empty[ring][(it - 1) % STAGES]);

            // lane l holds rows l/4 and l/4 + 8 of its warp's 16, channels 8j + 2(l%4) and the next
            if (splits > 1) {                    // fp32 sums to ws[split]: splitk_reduce.cu finishes them
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    int q = row0 + 16 * warp + lane / 4 + 8 * h;
                    int bw = q % BW, bh = q / BW % BH, bi = q / (BW * BH);
                    int i = T.i0 + bh, j = T.j0 + bw, n = T.n0 + bi;
                    if (bi >= BI || n >= B || i >= T.h.n || j >= T.w.n) continue;
                    size_t pix = ((size_t)n * Hout + T.h.r + T.h.s_out * i) * Wout + T.w.r + T.w.s_out * j;
                    float* dst = ws + ((size_t)T.split * B * Hout * Wout + pix) * NM;
#pragma unroll
                    for (int jj = 0; jj < BN / 8; jj++) {
                        int m = T.m0 + 8 * jj + 2 * (lane % 4);
                        if (NM % 2 == 0 && m + 1 < NM) *(float2*)(dst + m) = make_float2(acc[4 * jj + 2 * h], acc[4 * jj + 2 * h + 1]);
                        else {
                            if (m < NM) dst[m] = acc[4 * jj + 2 * h];
                            if (m + 1 < NM) dst[m + 1] = acc[4 * jj + 2 * h + 1];
                        }
                    }
                }
                continue;
            }
            if constexpr (TMA_STORE) {
                // the store of the previous tile has read the staging tile: both consumers may write it
                if (t == 0 && wg == 1) bulk_wait_read<0>();
                named_barrier_sync(3, 256);
#pragma unroll
                for (int jj = 0; jj < BN / 8; jj++) {
                    int c = 8 * jj + 2 * (lane % 4), m = T.m0 + c;
                    float b0 = 0.f, b1 = 0.f;
                    if (has_bias && m < NM) b0 = to_float(bias[m]), b1 = to_float(bias[m + 1]);
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        float v0 = acc[4 * jj + 2 * h] + b0, v1 = acc[4 * jj + 2 * h + 1] + b1;
                        if (relu) v0 = fmaxf(v0, 0.f), v1 = fmaxf(v1, 0.f);
                        // row r of box c/64 (64 channels, 128 bytes a row), its 16-byte chunks swizzled
                        int r = row0 + 16 * warp + lane / 4 + 8 * h;
                        unsigned char* at = staging + (c / 64) * (128 * 128) + r * 128 + ((jj % 8) ^ (r % 8)) * 16 +
                                            (c % 8) * 2;
                        *(unsigned*)at = to_bits2(v0, v1);
                    }
                }
                fence_proxy_async();                 // the stores visible to the copy engine
                named_barrier_sync(3, 256);
                if (t == 0 && wg == 1) {
                    for (int q = 0; q < BN / 64 && T.m0 + 64 * q < NM; q++)
                        tma_store_4d(&y_map, staging + q * (128 * 128), T.m0 + 64 * q, T.j0, T.i0, T.n0);
                    bulk_commit();
                }
            } else {
                // sums -> bias, ReLU, elem -> the staging tile
#pragma unroll
                for (int jj = 0; jj < BN / 8; jj++) {
                    int m = T.m0 + 8 * jj + 2 * (lane % 4);
                    float b0 = 0.f, b1 = 0.f;
                    if (has_bias && m < NM) b0 = to_float(bias[m]);
                    if (has_bias && m + 1 < NM) b1 = to_float(bias[m + 1]);
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        float v0 = acc[4 * jj + 2 * h] + b0, v1 = acc[4 * jj + 2 * h + 1] + b1;
                        if (relu) v0 = fmaxf(v0, 0.f), v1 = fmaxf(v1, 0.f);
                        int r = 16 * warp + lane / 4 + 8 * h;
                        *(elem2*)(out + r * OUT_ROW + (8 * jj + 2 * (lane % 4)) * 2) = to_elem2(v0, v1);
                    }
                }
                named_barrier_sync(wg, 128);         // this warpgroup's tile is staged
                // 16-byte chunks: BN/8 per pixel row, consecutive threads along a row (coalesced in y)
                for (int c = t; c < 64 * (BN / 8); c += 128) {
                    int r = c / (BN / 8), ch = c % (BN / 8), q = row0 + r, m = T.m0 + 8 * ch;
                    int bw = q % BW, bh = q / BW % BH, bi = q / (BW * BH);
                    int i = T.i0 + bh, j = T.j0 + bw, n = T.n0 + bi;
                    if (bi >= BI || n >= B || i >= T.h.n || j >= T.w.n || m >= NM) continue;
                    size_t pix = ((size_t)n * Hout + T.h.r + T.h.s_out * i) * Wout + T.w.r + T.w.s_out * j;
                    if (NM % 8 == 0) {
                        *(uint4*)(y + pix * NM + m) = *(const uint4*)(out + r * OUT_ROW + ch * 16);
                    } else {
                        for (int e = 0; e < 8 && m + e < NM; e++)
                            y[pix * NM + m + e] = *(const elem*)(out + r * OUT_ROW + ch * 16 + 2 * e);
                    }
                }
                named_barrier_sync(wg, 128);         // read back before the next tile overwrites it
            }
        }
        if (TMA_STORE && t == 0 && wg == 1) bulk_wait_read<0>();   // the block's shared memory outlives the stores
    }
}
