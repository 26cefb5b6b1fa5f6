// Chapter 8, step 4: dE/dW as a reduction: sums in registers, then in shared memory, then per block.
// For the small-channel layers (lenet_c1, fa17: a mask of C*K*K <= 64 taps per map).
//
//   dw[m][c][ky][kx] = sum over b, oy, ox of dy[b][m][oy][ox] * x[b][c][oy*s + ky - pad][ox*s + kx - pad]
//
// conv2d_dw_atomic.cu sends every product to L2 as an atomic. Here the same sum is done in three
// levels, and only the last one leaves the block:
//  1. Registers. Each thread owns MT maps x all K*K taps of one input channel c, and walks many
//     (image, strip of ROWS output rows, column) tasks, a grid-stride loop: for each task it loads
//     MT x ROWS dy values and, per mask column kx, the (ROWS-1)*s + K input values under them,
//     then does MT*ROWS*K FMAs per column: every input value it loads is used for up to
//     MT*min(K, ROWS) FMAs, every dy value for K*K. lenet_c1 (MT = 2, ROWS = 4, K = 7):
//     8 + 7*10 loads for 392 FMAs. The loop order is the forward kernel's (direct_regtile) with
//     dy in the role of the mask.
//  2. The block. Each accumulator is summed over the warp with shuffles (5 steps), then the warps'
//     sums meet in shared memory and one thread per weight adds them, in a fixed order.
//  3. The grid. Block j writes its sums to partial[j][m][c][ky][kx] and reduce_partials.cu adds
//     the rows in a fixed order: two passes, no atomics, the same bits on every run. Or, with
//     FINAL_ATOMIC = 1, each block atomicAdds its sums into dw (zeroed first): one pass, and
//     (number of blocks) atomics per weight instead of B*Ho*Wo.
//
// Blocks: gridDim.x = nchunks x (map groups x C). The (map group, channel) pairs of one chunk are
// neighbours in blockIdx.x, so they run at the same time and share that chunk's dy and x in L2.
// Each pair's chunk walks the same tasks: task = chunk*BLOCK + threadIdx.x + i*nchunks*BLOCK.
//
// Registers: MT*K*K accumulators + MT*ROWS dy values + one input column. The launcher keeps
// MT*K*K near 100 (lenet_c1: MT = 2, 98; fa17: K = 5, MT = 4, 100) and ROWS at 4, where
// __launch_bounds__(128, 3) (168 registers) leaves nothing spilled; with 8 rows ptxas spills.
// The defaults below are lenet_c1's.
//
// Layout: x (B,C,H,W), dy (B,M,Ho,Wo), out: partial (nchunks, M,C,K,K) or dw (M,C,K,K).
// Grid: (nchunks * ceil(M/MT) * C) blocks of BLOCK threads (1-D).

#ifndef KSIZE
#define KSIZE 7
#endif
#ifndef STRIDE
#define STRIDE 1
#endif
#ifndef MT
#define MT 2                 // maps per thread
#endif
#ifndef ROWS
#define ROWS 4               // output rows per task
#endif
#ifndef BLOCK
#define BLOCK 128
#endif
#ifndef MIN_BLOCKS
#define MIN_BLOCKS 3         // __launch_bounds__: blocks of BLOCK threads per SM, so at most
#endif                       // 65536 / (BLOCK*MIN_BLOCKS) registers per thread (3 x 128: 168)
#ifndef FINAL_ATOMIC
#define FINAL_ATOMIC 0       // 0: write per-block partial sums; 1: atomicAdd them into dw
#endif

#define XROWS ((ROWS - 1) * STRIDE + KSIZE)      // input rows under ROWS output rows
#define NACC (MT * KSIZE * KSIZE)                // accumulators per thread
#define WARPS (BLOCK / 32)

static_assert(BLOCK % 32 == 0 && BLOCK <= 1024, "BLOCK must be a multiple of 32, at most 1024");
static_assert(WARPS * NACC * 4 <= 48 * 1024, "the per-warp sums must fit in 48 KB of shared memory");

__global__ void __launch_bounds__(BLOCK, MIN_BLOCKS) conv2d_dw_direct(const float* __restrict__ x, const float* __restrict__ dy,
                                 float* __restrict__ out, int B, int C, int M, int H, int W,
                                 int pad, int nchunks)
{
    __shared__ float red[WARPS][NACC];

    const int Ho = (H + 2 * pad - KSIZE) / STRIDE + 1;
    const int Wo = (W + 2 * pad - KSIZE) / STRIDE + 1;
    const int pairs = ((M + MT - 1) / MT) * C;
    const int pair = blockIdx.x % pairs;
    const int chunk = blockIdx.x / pairs;
    const int c = pair % C;
    const int m0 = (pair / C) * MT;
    const int strips = (Ho + ROWS - 1) / ROWS;
    const int tasks = B * strips * Wo;

    float acc[MT][KSIZE][KSIZE];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int ky = 0; ky < KSIZE; ++ky)
#pragma unroll
            for (int kx = 0; kx < KSIZE; ++kx) acc[mt][ky][kx] = 0.0f;

    // ---- 1. registers: a grid-stride walk over (image, strip, column) tasks
    for (int t = chunk * BLOCK + threadIdx.x; t < tasks; t += nchunks * BLOCK) {
        const int ox = t % Wo;                 // lanes: consecutive columns, coalesced loads
        const int strip = (t / Wo) % strips;
        const int b = t / (Wo * strips);
        const int oy0 = strip * ROWS;
        const int iy0 = oy0 * STRIDE - pad, ix0 = ox * STRIDE - pad;

        float dv[MT][ROWS];                    // dy of this task: MT maps x ROWS rows
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            const int m = m0 + mt;
#pragma unroll
            for (int r = 0; r < ROWS; ++r)
                dv[mt][r] = (m < M && oy0 + r < Ho) ? __ldg(&dy[((b * M + m) * Ho + oy0 + r) * Wo + ox]) : 0.0f;
        }
        const int xbase = (b * C + c) * H * W;
#pragma unroll
        for (int kx = 0; kx < KSIZE; ++kx) {
            const int ix = ix0 + kx;
            const bool col_in = ix >= 0 && ix < W;
            float xv[XROWS];                   // the input column under the task, for this kx
#pragma unroll
            for (int j = 0; j < XROWS; ++j) {
                const int iy = iy0 + j;
                xv[j] = (col_in && iy >= 0 && iy < H) ? __ldg(&x[xbase + iy * W + ix]) : 0.0f;
            }
#pragma unroll
            for (int ky = 0; ky < KSIZE; ++ky)
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                    for (int r = 0; r < ROWS; ++r)
                        acc[mt][ky][kx] += dv[mt][r] * xv[r * STRIDE + ky];
        }
    }

    // ---- 2. the block: warp shuffles (every lane ends with the warp's sum), then shared memory  // listing: block_sum
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int ky = 0; ky < KSIZE; ++ky)
#pragma unroll
            for (int kx = 0; kx < KSIZE; ++kx) {
                float v = acc[mt][ky][kx];
#pragma unroll
                for (int off = 16; off > 0; off /= 2)
                    v += __shfl_xor_sync(0xffffffffu, v, off);
                if (lane == 0) red[warp][(mt * KSIZE + ky) * KSIZE + kx] = v;
            }
    __syncthreads();

    // ---- 3. one value per weight leaves the block
    for (int a = threadIdx.x; a < NACC; a += BLOCK) {
        float s = 0.0f;
        for (int i = 0; i < WARPS; ++i) s += red[i][a];        // fixed order: deterministic
        const int m = m0 + a / (KSIZE * KSIZE), tap = a % (KSIZE * KSIZE);
        if (m < M) {
            const int idx = (m * C + c) * KSIZE * KSIZE + tap;
#if FINAL_ATOMIC
            atomicAdd(&out[idx], s);
#else
            out[chunk * M * C * KSIZE * KSIZE + idx] = s;
#endif
        }
    }  // end listing: block_sum
}
