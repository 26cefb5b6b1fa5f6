// Chapter 5, step 3: thread coarsening for the small-channel layers (lenet_c1, lenet_c3, fa17).
//
// Why GEMM is the wrong shape for them: with C = 1 and M = 4 (lenet_c1) the reduction is only
// C*K*K = 49 long and the product has 4 rows. A GEMM tile of 64 maps would be 94% empty, and the
// implicit GEMM loads every input pixel K*K times into its tiles to use each copy only M times.
// What bounds them once the waste is gone (chapter 5's cards of conv2d_direct_regtile.cu, H200):
// instruction issue (74% of cycles), FFMAs half of it; DRAM 28-41%, mostly the output's writes.
//
// So: a direct convolution in which every thread computes a micro-tile of outputs that shares
// its inputs, and nothing but the multiply-adds stays in the inner loop.
//  - Each thread computes ALL M_OUT output maps of ROWS vertically adjacent output pixels (one
//    column). Every input value it loads feeds up to M_OUT * min(ROWS, K) multiply-adds from
//    registers (all maps, every output row whose window covers it).
//  - M_OUT, C_IN, KSIZE, STRIDE are compile-time constants and all loops over them are fully
//    unrolled (#pragma unroll), so every mask index is a constant and every mask read is uniform
//    across the warp: what the constant cache serves best. The hope is that the compiler folds
//    c_mask[const] into the FFMA instruction as a constant-bank operand. Measure, don't hope:
//    the sm_90 disassembly (nvcc 13, cuobjdump -sass) shows no such FFMA; ptxas first loads the
//    mask values into uniform registers (ULDC), about one load per FFMA on lenet_c3 and fa17,
//    and the constant cache's 8 KB working set per SM cannot hold lenet_c3's 12.5 KB mask.
//    It works well for lenet_c1 (196 mask values, 784 bytes); conv2d_direct_regtile.cu moves the
//    mask to shared memory for the others.
//  - Consecutive threads take consecutive output columns (ox), so each load of an input row and
//    each store of an output row is coalesced across the warp. Input is read straight from global
//    memory through the read-only path (__ldg / __restrict__): a pixel's K neighbours hit L1,
//    the tile of a shared-memory version would only add barriers.
//  - The thread -> output mapping is flat over (image, strip of ROWS rows, column), so no warp is
//    half empty at the right edge of an image (80 columns are 2.5 warps) and the grid is 1-D:
//    fa17's B*M = 500,000 never touches the 65,535 limit of gridDim.y/z.
//
// Costs to watch: the fully unrolled body has M_OUT*C_IN*K*K*ROWS FFMAs (lenet_c3 with ROWS=1:
// 3,136 instructions, 50 KB of code), and M_OUT*ROWS accumulators live in registers; the
// launcher picks ROWS to keep both in check.
//
// Layout: x (B,C_IN,H,W), y (B,M_OUT,Ho,Wo) float32 NCHW; mask (M_OUT,C_IN,K,K) in c_mask.
// Grid: ceil(B * ceil(Ho/ROWS) * Wo / BLOCK) blocks of BLOCK threads. Padding: any (run time).
// Stride: STRIDE (compile time).

#ifndef M_OUT
#define M_OUT 4
#endif
#ifndef C_IN
#define C_IN 1
#endif
#ifndef KSIZE
#define KSIZE 7
#endif
#ifndef STRIDE
#define STRIDE 1
#endif
#ifndef ROWS
#define ROWS 4               // output rows per thread (thread coarsening along y)
#endif
#ifndef BLOCK
#define BLOCK 256            // threads per block (the launcher passes the same number)
#endif

__constant__ float c_mask[M_OUT * C_IN * KSIZE * KSIZE];

__global__ void conv2d_direct_coarse(const float* __restrict__ x, float* __restrict__ y,
                                     int B, int H, int W, int pad)
{
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

    float acc[M_OUT][ROWS];
#pragma unroll
    for (int m = 0; m < M_OUT; ++m)
#pragma unroll
        for (int r = 0; r < ROWS; ++r) acc[m][r] = 0.0f;

#pragma unroll
    for (int c = 0; c < C_IN; ++c) {
        const int xbase = (b * C_IN + c) * H * W;
        // Input rows j of the strip's window: row j feeds output row r with mask row ky = j - r*STRIDE.
#pragma unroll
        for (int j = 0; j < (ROWS - 1) * STRIDE + KSIZE; ++j) {
            const int iy = iy0 + j;
            const bool row_in = iy >= 0 && iy < H;
#pragma unroll
            for (int kx = 0; kx < KSIZE; ++kx) {
                const int ix = ix0 + kx;
                const float v = (row_in && ix >= 0 && ix < W) ? __ldg(&x[xbase + iy * W + ix]) : 0.0f;
#pragma unroll
                for (int r = 0; r < ROWS; ++r) {
                    const int ky = j - r * STRIDE;         // a compile-time constant after unrolling
                    if (ky >= 0 && ky < KSIZE) {
#pragma unroll
                        for (int m = 0; m < M_OUT; ++m)
                            acc[m][r] += c_mask[((m * C_IN + c) * KSIZE + ky) * KSIZE + kx] * v;
                    }
                }
            }
        }
    }

    // Stores: for each (map, row) the warp writes consecutive columns: coalesced.
    const int P = Ho * Wo;
    const int ybase = b * M_OUT * P + ox;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        const int oy = oy0 + r;
        if (oy < Ho) {
#pragma unroll
            for (int m = 0; m < M_OUT; ++m)
                y[ybase + m * P + oy * Wo] = acc[m][r];
        }
    }
}
