// Chapter 5, step 4: a register-tiled direct convolution, the mask in shared memory. The kernel
// for the small-channel layers (lenet_c1, lenet_c3, fa17).
//
// Step 3 (conv2d_direct_coarse.cu) put the mask in __constant__ memory and hoped the compiler
// would use each mask element as an FFMA operand. On sm_90 the disassembly shows otherwise: every
// mask element is first loaded into a uniform register (ULDC), one load for about every FFMA on
// lenet_c3 and fa17, and the constant cache (an 8 KB working set per SM) cannot hold lenet_c3's
// 12.5 KB mask. Here the mask lives in shared memory instead, and each thread reuses everything
// it loads from registers:
//
//  - Micro-tile: each thread computes MT output maps x ROWS output rows of one column. Per mask
//    tap (c, ky, kx) it reads the MT mask values with MT/4 16-byte loads (LDS.128) and does
//    MT*ROWS FFMAs. All threads of a block work on the same maps, so those loads are broadcasts
//    (every lane reads the same address: one shared-memory transaction).
//  - Input in registers: for each (c, kx) the thread loads the input column its ROWS outputs need,
//    ROWS*STRIDE + K - STRIDE values, once, and reuses each one for every ky that touches it.
//    Per (c, kx): ROWS+K-1 global loads, K*MT/4 shared loads, K*MT*ROWS FFMAs. lenet_c3 with
//    MT=16, ROWS=4: 10 + 28 loads for 448 FFMAs.
//  - Lanes are consecutive output columns, so every global load and store is coalesced.
//  - Maps come in groups of MT (blockIdx.y); the last group is padded with zero mask values and
//    its extra outputs are not stored (fa17: M=50 as 2 groups of 28 or 1 of 52).
//  - M_OUT, C_IN, KSIZE, STRIDE, MT, ROWS are compile-time constants, so the loops over ky, kx,
//    maps and rows unroll completely and the accumulators stay in registers. The loop over input
//    channels does not unroll (#pragma unroll 1): unrolled, lenet_c3's body would be
//    C*K*K*MT*ROWS = 12,544 FFMAs, 200 KB of code, far more than the instruction cache.
//
// Layout: x (B,C_IN,H,W), w (M_OUT,C_IN,K,K), y (B,M_OUT,Ho,Wo), float32 NCHW.
// Grid: (ceil(B * ceil(Ho/ROWS) * Wo / BLOCK), ceil(M_OUT/MT)), block BLOCK threads.
// Padding: any (run time). Stride: STRIDE (compile time).

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
#define MT 16                // output maps per thread (a multiple of 4: float4 mask loads)
#endif
#ifndef ROWS
#define ROWS 4               // output rows per thread
#endif
#ifndef BLOCK
#define BLOCK 256
#endif

#define TAPS (C_IN * KSIZE * KSIZE)                 // mask values per output map
#define XROWS ((ROWS - 1) * STRIDE + KSIZE)          // input rows under ROWS output rows

static_assert(MT % 4 == 0, "MT must be a multiple of 4 (16-byte mask loads)");
static_assert(TAPS * MT * 4 <= 48 * 1024, "the block's mask slice must fit in 48 KB of shared memory");

__global__ void conv2d_direct_regtile(const float* __restrict__ x, const float* __restrict__ w,
                                      float* __restrict__ y, int B, int H, int W, int pad)
{
    // This block's MT maps of the mask, tap-major: Ws[tap][m]. One row holds the MT values a
    // thread needs for one tap, 16-byte aligned for float4 reads.
    __shared__ __align__(16) float Ws[TAPS][MT];
    const int m0 = blockIdx.y * MT;
    // Consecutive threads read consecutive taps of one map: coalesced. Maps past M_OUT read as 0.
    for (int i = threadIdx.x; i < TAPS * MT; i += BLOCK) {
        const int mi = i / TAPS, tap = i % TAPS;
        Ws[tap][mi] = (m0 + mi < M_OUT) ? w[(m0 + mi) * TAPS + tap] : 0.0f;
    }
    __syncthreads();                       // the only barrier: after it, no thread writes Ws

    const int Ho = (H + 2 * pad - KSIZE) / STRIDE + 1;
    const int Wo = (W + 2 * pad - KSIZE) / STRIDE + 1;
    const int strips = (Ho + ROWS - 1) / ROWS;
    const int t = blockIdx.x * BLOCK + threadIdx.x;
    if (t >= B * strips * Wo) return;      // past the barrier: returning early is safe
    const int ox = t % Wo;
    const int strip = (t / Wo) % strips;
    const int b = t / (Wo * strips);
    const int oy0 = strip * ROWS;
    const int iy0 = oy0 * STRIDE - pad, ix0 = ox * STRIDE - pad;

    float acc[MT][ROWS];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int r = 0; r < ROWS; ++r) acc[m][r] = 0.0f;

#pragma unroll 1  // listing: channel_loop
    for (int c = 0; c < C_IN; ++c) {
        const int xbase = (b * C_IN + c) * H * W;
#pragma unroll
        for (int kx = 0; kx < KSIZE; ++kx) {
            // The input column under this thread's outputs, for this kx: XROWS loads, each used
            // for every (row r, ky) with r*STRIDE + ky == j.
            const int ix = ix0 + kx;
            const bool col_in = ix >= 0 && ix < W;
            float xv[XROWS];  // listing: input_column
#pragma unroll
            for (int j = 0; j < XROWS; ++j) {
                const int iy = iy0 + j;
                xv[j] = (col_in && iy >= 0 && iy < H) ? __ldg(&x[xbase + iy * W + ix]) : 0.0f;  // end listing: input_column
            }
#pragma unroll
            for (int ky = 0; ky < KSIZE; ++ky) {
                const float* wrow = &Ws[(c * KSIZE + ky) * KSIZE + kx][0];
#pragma unroll
                for (int q = 0; q < MT / 4; ++q) {
                    const float4 wv = *(const float4*)&wrow[4 * q];   // broadcast: same address in every lane  // listing: mask_broadcast
#pragma unroll
                    for (int r = 0; r < ROWS; ++r) {
                        const float v = xv[r * STRIDE + ky];
                        acc[4 * q + 0][r] += wv.x * v;
                        acc[4 * q + 1][r] += wv.y * v;
                        acc[4 * q + 2][r] += wv.z * v;
                        acc[4 * q + 3][r] += wv.w * v;  // end listing: mask_broadcast
                    }
                }
            }
        }
    }  // end listing: channel_loop

    // For each (map, row) the warp stores consecutive columns: coalesced.
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
