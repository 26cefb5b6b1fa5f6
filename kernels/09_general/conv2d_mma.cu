// Requires sm_80 or newer: cp.async and mma.sync.m16n8k16 with float accumulators
//
// Chapter 9: an fp16 implicit-GEMM convolution on tensor cores through mma.sync, in NHWC: the
// layout and the loop structure of NVIDIA CUTLASS's sm80 "implicit GEMM" forward convolution,
// written out by hand.
//
// GEMM view:  Y (P x M) = A (P x K) . B^T,  P = B*Ho*Wo output pixels (rows), M output maps
// (columns), K = Kh*Kw*C with the channel fastest. x is NHWC and the mask is (M, Kh, Kw, C)
// ("KRSC"), so a row of A (one pixel's receptive field, one tap at a time) and a row of B (one
// map's weights) are both contiguous along K: 8 channels are one 16-byte cp.async. Needs C % 8 == 0
// (the launcher pads fewer channels, e.g. an RGB stem, with zeros up to 8).
// Groups: one GEMM per group, the group part of the block's index. C and M are then a group's
// channels and maps; x's pixels hold CX = groups*C channels and y's MY = groups*M maps, and group
// g reads channels g*C.. of x and rows g*M.. of the mask and writes maps g*M.. of y (C % 8 == 0
// per group: the launcher pads each group's channels).
// The same kernel is the data gradient dX (convlab.ops.tensor_core.conv2d_mma_dx): the forward of
// dy with the flipped, per-group transposed mask; a strided layer's dX runs as stride phases, each
// writing every stride-th pixel of dx, so y's pixel of GEMM row (n, oh, ow) is
// y0 + n*y_img + oh*y_row + ow*y_col (a forward: dense, y_img = Ho*Wo, y_row = Wo, y_col = 1).
//
//  - Block tile BM x BN (pixels x maps), BK-deep steps of K; WARPS_M x WARPS_N warps, each owning a
//    (BM/WARPS_M) x (BN/WARPS_N) warp tile of MI x NI m16n8 accumulators (64 x 64: 4 x 8, 128 floats
//    per lane). Per 16-deep step a warp loads MI A fragments and NI/2 pairs of B fragments with
//    ldmatrix.x4 and issues MI*NI mma.sync.m16n8k16.
//  - STAGES-deep cp.async pipeline: tiles kt+1 .. kt+STAGES-1 are in flight while tile kt is
//    multiplied; one cp_async_wait<STAGES-2> + __syncthreads() per step. The copies go global ->
//    shared without registers, so the loads need no registers and no thread waits on them.
//  - Shared memory: STAGES stages of BM rows of A then BN rows of B, each row BK halves (BK/8
//    16-byte chunks), the chunks XOR-swizzled by the row (swz below): the 8 rows an ldmatrix phase
//    reads at one chunk column fall in 8 different 4-bank groups, so the fragment loads have no
//    bank conflicts and the rows need no padding. The XOR also makes the next 16 columns of a
//    fragment an XOR of its address with a constant, and the stages are constants apart: the
//    loop's ldmatrix addresses cost one instruction per 16 columns, none per fragment.
//  - Loader (CUTLASS's "optimized" activation iterator, written out): each thread copies the same
//    chunk column of BK for A_ITERS pixel rows and B_ITERS map rows. What depends on the row is
//    worked out once, before the K loop: a row's offset of its window's top-left tap, and one
//    32-bit mask of the taps inside the image (bit r: the window's row r; bit Kh + s: its column
//    s). The K position is shared by the thread's rows: its tap (r, s), channel c and a pointer,
//    moved by constant deltas with two carries as K advances. A copy in the loop is then a 64-bit
//    add, one AND-NOT test of the row's mask against the tap's two bits, and a cp.async.
//    (Recomputing each row's (ih, iw), four bounds and the address every step made integer
//    instructions, not mma.sync, the bulk of the loop.) Taps in the padding, pixels past P and K's
//    tail are zero-filled by the copy (src-size 0, nothing read); maps past M copy map M-1.
//  - Epilogue: bias (fp32) added to the fp32 sums, rounded to half once, the block's BM x BN tile
//    staged in shared memory (the pipeline's, reused) and written as 16-byte row pieces: y is NHWC,
//    so a pixel's BN maps are contiguous, whole 32-byte sectors.
//  - Split-K (gridDim.y = splits > 1), for layers with too few output tiles to fill the GPU (7x7
//    and 14x14 maps): block (t, z) sums only its z-th share of the K steps and stores its fp32
//    partial tile to ws (splits, P, MY); conv2d_mma_splitk_reduce then adds the splits and the bias
//    and rounds to half once, as the one-pass epilogue does.
//  - Blocks: one 1-D grid, the BN-wide map tiles of one pixel tile adjacent, so the blocks running
//    together share their input rows in L2 (the mask is small and stays in L2 anyway); with groups,
//    every group's map tiles of one pixel tile adjacent: together they read whole pixels of x.
//
// Layout: x (B, H, W, CX) half, CX = groups*C, C % 8 == 0, 16-byte aligned; w (groups*M, Kh, Kw, C)
// half; bias (MY) half (read only when has_bias); y (B, Ho, Wo, MY) half, MY = groups*M, or dx's
// pixels by y0, y_img, y_row, y_col. Stride, padding (negative too) and dilation: any;
// Kh + Kw <= 31 (one 32-bit tap mask per pixel, bit 31 spare). ws (splits, P, MY) float, used only
// when splits > 1.
// Grid: (ceil(P/BM) * groups * ceil(M/BN), splits), block 32*WARPS_M*WARPS_N threads, dynamic
// shared memory max(STAGES*(BM+BN)*BK, BM*(BN+8)) * 2 bytes. Tunables: BM, BN, BK (16, 32 or 64),
// WARPS_M, WARPS_N, STAGES; SWIZZLE=0 turns the swizzle off (measurements only).

#include <cuda_fp16.h>
#include "tensor_core.cuh"

#ifndef BM
#define BM 128
#endif
#ifndef BN
#define BN 128
#endif
#ifndef BK
#define BK 32
#endif
#ifndef WARPS_M
#define WARPS_M 2
#endif
#ifndef WARPS_N
#define WARPS_N 2
#endif
#ifndef STAGES
#define STAGES 4
#endif
// SWIZZLE=0 switches the XOR swizzle off (chunk c of every row at slot c), for the measurement of
// what it buys: the 8 rows an ldmatrix phase reads then share one group of 4 banks.
#ifndef SWIZZLE
#define SWIZZLE 1
#endif

constexpr int THREADS = 32 * WARPS_M * WARPS_N;
constexpr int CHUNKS = BK / 8;                    // 16-byte chunks in a shared row
constexpr int WTM = BM / WARPS_M, WTN = BN / WARPS_N;
constexpr int MI = WTM / 16, NI = WTN / 8;        // m16n8 tiles per warp
constexpr int ROWS_PER_PASS = THREADS / CHUNKS;   // rows one pass of the block's copies fills
constexpr int A_ITERS = BM / ROWS_PER_PASS, B_ITERS = BN / ROWS_PER_PASS;
constexpr int STAGE = (BM + BN) * BK;            // halves per stage: BM rows of A, then BN rows of B
constexpr int CS = BN + 8;                        // the epilogue's shared row: BN maps, padded

static_assert(BK == 16 || BK == 32 || BK == 64, "BK must be 16, 32 or 64");
static_assert(WTM % 16 == 0 && WTN % 16 == 0, "warp tiles must be multiples of 16 x 16");
static_assert(BM % WARPS_M == 0 && BN % WARPS_N == 0, "the warps must split the block tile");
static_assert(THREADS % CHUNKS == 0 && BM % ROWS_PER_PASS == 0 && BN % ROWS_PER_PASS == 0,
              "the block's 16-byte copies must cover BM and BN rows evenly");
static_assert(STAGES >= 2, "at least two stages");
static_assert(ROWS_PER_PASS % 8 == 0, "the swizzle repeats every 8 rows: a thread's copy rows, ROWS_PER_PASS "
              "apart, must share it (so their shared offsets differ by constants)");
// listing: swizzle
// The slot (in 16-byte chunks) of chunk `chunk` of shared row `row`. Rows are BK*2 bytes, so 128/(BK*2)
// rows share one 128-byte line of the 32 banks; XOR-ing the chunk with the row's line index spreads
// the 8 rows an ldmatrix phase reads over all 8 chunk positions of a line.
__device__ __forceinline__ int swz(int row, int chunk)
{
#if SWIZZLE
    return CHUNKS == 8 ? chunk ^ (row & 7) : CHUNKS == 4 ? chunk ^ ((row >> 1) & 3) : chunk ^ ((row >> 2) & 1);
#else
    (void)row;
    return chunk;
#endif
}
// end listing: swizzle
__device__ __forceinline__ int at(int row, int chunk) { return row * BK + swz(row, chunk) * 8; }

// The y pixel of GEMM row p = (n, oh, ow): y0 + n*y_img + oh*y_row + ow*y_col. A forward's y is
// dense (p itself); a strided layer's dX phase writes every stride-th pixel of dx.
__device__ __forceinline__ int y_pixel(int p, int Ho, int Wo, int y0, int y_img, int y_row, int y_col)
{
    if (y0 == 0 && y_col == 1 && y_row == Wo && y_img == Ho * Wo) return p;
    const int n = p / (Ho * Wo), q = p % (Ho * Wo);
    return y0 + n * y_img + (q / Wo) * y_row + (q % Wo) * y_col;
}

__global__ void __launch_bounds__(THREADS)
conv2d_mma(const half* __restrict__ x, const half* __restrict__ w, const half* __restrict__ bias,
           half* __restrict__ y, float* __restrict__ ws, int has_bias, int B, int H, int W, int C, int CX, int M, int MY,
           int Kh, int Kw, int Ho, int Wo, int sh, int sw, int ph, int pw, int dh, int dw,
           int y0, int y_img, int y_row, int y_col)
{
    extern __shared__ __align__(128) half smem[];    // [STAGES][BM + BN][BK] (A rows, B rows); then [BM][CS]

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int P = B * Ho * Wo, K = Kh * Kw * C;
    const int map_tiles = (M + BN - 1) / BN, tiles = MY / M * map_tiles;   // a pixel tile's, every group's
    const int g = (blockIdx.x % tiles) / map_tiles;
    const int p0 = (blockIdx.x / tiles) * BM, m0 = (blockIdx.x % map_tiles) * BN;
    // Group g: its C channels of x's CX, its M maps (and mask rows, biases) of y's MY.
    x += g * C;
    w += g * M * K;
    bias += g * M;
    y += g * M;
    ws += g * M;

    // ---- the loader, set up once: this thread's chunk column, pixel rows and map rows ----
    const int cc = tid % CHUNKS, row0 = tid / CHUNKS;
    const int dst = at(row0, cc);                // row row0 + i*ROWS_PER_PASS: dst + i*ROWS_PER_PASS*BK
    int a_base[A_ITERS];                         // x offset of the row's window at tap (0, 0), channel 0
    unsigned a_taps[A_ITERS];                    // bit r: window row r inside the image; bit Kh + s: column s
#pragma unroll
    for (int i = 0; i < A_ITERS; i++) {
        const int p = p0 + row0 + i * ROWS_PER_PASS;
        const int n = p / (Ho * Wo), q = p % (Ho * Wo);
        const int ih0 = (q / Wo) * sh - ph, iw0 = (q % Wo) * sw - pw;
        a_base[i] = ((n * H + ih0) * W + iw0) * CX;  // may point before x (padding): its copies read nothing
        a_taps[i] = 0;
        for (int r = 0; r < Kh; r++)
            if (p < P && ih0 + r * dh >= 0 && ih0 + r * dh < H) a_taps[i] |= 1u << r;   // past P: no tap valid
        for (int s = 0; s < Kw; s++)
            if (iw0 + s * dw >= 0 && iw0 + s * dw < W) a_taps[i] |= 1u << (Kh + s);
    }
    // w offset of each map row. A row past M copies map M-1's: its products reach only accumulator
    // columns past M, which are never stored, so the copy needs no test of its own in the loop.
    int b_base[B_ITERS];
#pragma unroll
    for (int i = 0; i < B_ITERS; i++) b_base[i] = min(m0 + row0 + i * ROWS_PER_PASS, M - 1) * K;

    // This block's K steps: all of them, or its share under split-K (an empty share stores zeros).
    const int steps_all = (K + BK - 1) / BK, per_split = (steps_all + gridDim.y - 1) / gridDim.y;
    const int kt0 = blockIdx.y * per_split, steps = max(0, min(steps_all - kt0, per_split));

    // The thread's chunk in K, column k = (r*Kw + s)*C + c of the mask: its tap (r, s), channel c,  // listing: loader
    // and two pointers that move with it, xk (x plus the offset of (r, s, c) from a window's
    // top-left; a row adds its a_base) and wk (w plus k; a map adds its b_base). A BK step moves k
    // by dr rows, ds columns and dc channels of the mask (BK = (dr*Kw + ds)*C + dc), then carries c
    // into s and s into r: two compares, never a loop, also where one step crosses several taps
    // (C < BK: the RGB stem's 8 channels). Past the last tap, r >= Kh.
    const int k0 = kt0 * BK + cc * 8;
    int c = k0 % C, s = (k0 / C) % Kw, r = (k0 / C) / Kw;
    const half* xk = x + (r * dh * W + s * dw) * CX + c;
    const half* wk = w + k0;
    const int dc = BK % C, ds = (BK / C) % Kw, dr = (BK / C) / Kw;
    const int step_x = (dr * dh * W + ds * dw) * CX + dc;
    const int carry_c = dw * CX - C, carry_s = (dh * W - Kw * dw) * CX;   // xk's extra moves on a carry

    auto load_tile = [&](int to) {               // to: dst in the stage being filled
        half* as = smem + to;
        half* bs = as + BM * BK;
        // The tap's two bits; past K, bit 31, which no row has (Kh + Kw <= 31): every A copy is
        // zero-filled. A copy is valid when the row has both bits: one AND-NOT test.
        const bool in_k = r < Kh;
        const unsigned tap = in_k ? (1u << r) | (1u << (Kh + s)) : 1u << 31;
#pragma unroll
        for (int i = 0; i < A_ITERS; i++)        // invalid: src-size 0, nothing is read at that address
            cp_async_16(as + i * ROWS_PER_PASS * BK, xk + a_base[i], (tap & ~a_taps[i]) == 0);
#pragma unroll
        for (int i = 0; i < B_ITERS; i++) cp_async_16(bs + i * ROWS_PER_PASS * BK, wk + b_base[i], in_k);
        int move = step_x;                       // xk's move, summed in 32 bits: one 64-bit add
        c += dc;
        s += ds;
        r += dr;
        if (c >= C) { c -= C; s++; move += carry_c; }
        if (s >= Kw) { s -= Kw; r++; move += carry_s; }
        xk += move;
        wk += BK;
    };  // end listing: loader

    // ---- the warp's fragments ----
    const int wm = warp % WARPS_M, wn = warp / WARPS_M;
    float acc[MI][NI][4];
    for (int i = 0; i < MI; i++)
        for (int j = 0; j < NI; j++)
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.f;

    // The lane's ldmatrix row offsets for the step's first 16 columns (chunks 0 and 1); fragment i  // listing: main_loop
    // is 16 rows (two whole swizzle periods) further, a constant. Columns 16kk.. are chunk 2kk + h
    // instead of h, and the swizzle XORs the chunk (2kk + h = 2kk ^ h): their offset is this one
    // XOR 16*kk halves (the row's and the stage's offsets are multiples of BK, no bits below it).
    int a_at = at(wm * WTM + (lane & 15), lane >> 4);   // lanes 0-15: rows 0-15 at k 0-7; 16-31: k 8-15
    int b_at = BM * BK + at(wn * WTN + (lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
                                                 // B matrices: maps 0-7 k 0-7, maps 0-7 k 8-15, maps 8-15 ...
    for (int st = 0; st < STAGES - 1; st++) {
        if (st < steps) load_tile(st * STAGE + dst);
        cp_async_commit();                       // empty groups keep the count in step
    }
    // Tile kt is in stage kt % STAGES (read), tile kt + STAGES - 1 goes to the stage read in the step
    // before (every warp is past this step's barrier, so done with it). The lane's offsets in them,
    // a_at and b_at (ldmatrix) and to (the copies), move on by a stage a step and wrap after the last.
    int read = 0, to = (STAGES - 1) * STAGE + dst;
    for (int kt = 0; kt < steps; kt++) {
        cp_async_wait<STAGES - 2>();             // tile kt has landed (this thread's copies) ...
        __syncthreads();                         // ... everyone's; and stage kt-1 is free again
        if (kt + STAGES - 1 < steps) load_tile(to);
        cp_async_commit();

#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++) {
            const half* as = smem + (a_at ^ (kk * 16));
            const half* bs = smem + (b_at ^ (kk * 16));
            unsigned af[MI][4], bf[NI][2];
#pragma unroll
            for (int i = 0; i < MI; i++) ldmatrix_x4(af[i], as + i * 16 * BK);
#pragma unroll
            for (int j = 0; j < NI / 2; j++) {
                unsigned t[4];
                ldmatrix_x4(t, bs + j * 16 * BK);
                bf[2 * j][0] = t[0]; bf[2 * j][1] = t[1];
                bf[2 * j + 1][0] = t[2]; bf[2 * j + 1][1] = t[3];
            }
#pragma unroll
            for (int i = 0; i < MI; i++)
#pragma unroll
                for (int j = 0; j < NI; j++) mma_16816(acc[i][j], af[i], bf[j]);
        }
        const int next = read == STAGES - 1 ? (1 - STAGES) * STAGE : STAGE;
        to += read == 0 ? (1 - STAGES) * STAGE : STAGE;      // one stage behind: wraps a step later
        read = read == STAGES - 1 ? 0 : read + 1;
        a_at += next;
        b_at += next;
    }  // end listing: main_loop

    if (gridDim.y > 1) {                         // split-K: the fp32 partial sums, no bias, to ws
        float* part = ws + blockIdx.y * P * MY;  // a quad's 4 lanes store 8 adjacent floats: whole sectors
#pragma unroll
        for (int i = 0; i < MI; i++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int p = p0 + wm * WTM + i * 16 + (lane >> 2) + h * 8;
#pragma unroll
                for (int j = 0; j < NI; j++) {
                    const int m = m0 + wn * WTN + j * 8 + (lane & 3) * 2;
                    if (p < P && m < M) part[p * MY + m] = acc[i][j][2 * h];
                    if (p < P && m + 1 < M) part[p * MY + m + 1] = acc[i][j][2 * h + 1];
                }
            }
        return;                                  // (no copy is in flight: the last steps issue none)
    }

    // ---- epilogue: bias, round to half, through shared memory to full-row 16-byte stores ----
    // A lane holds rows lane/4 and lane/4 + 8, maps 2*(lane%4) and +1 of each m16n8 tile: written
    // straight to y, a warp's store would cover 16 of each 32-byte sector. Staged in shared memory
    // (rows padded by 8 halves: the 8 rows of a half2 store fall in different banks), each row of
    // BN maps goes out as whole sectors.
    cp_async_wait<0>();
    __syncthreads();                             // every warp is done with the pipeline's stages
    half* cs = smem;                             // [BM][CS]
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int row = wm * WTM + i * 16 + (lane >> 2) + h * 8;
#pragma unroll
            for (int j = 0; j < NI; j++) {
                const int col = wn * WTN + j * 8 + (lane & 3) * 2, m = m0 + col;
                float v0 = acc[i][j][2 * h], v1 = acc[i][j][2 * h + 1];
                if (has_bias && m < M) {
                    v0 += __half2float(bias[m]);
                    if (m + 1 < M) v1 += __half2float(bias[m + 1]);
                }
                *reinterpret_cast<half2*>(cs + row * CS + col) = __floats2half2_rn(v0, v1);
            }
        }
    __syncthreads();
    const bool vec = (M & 7) == 0;               // 16-byte stores need rows that start 16-byte aligned (MY = M*groups)
    for (int v = tid; v < BM * (BN / 8); v += THREADS) {
        const int row = v / (BN / 8), col = (v % (BN / 8)) * 8;
        const int p = p0 + row, m = m0 + col;
        if (p >= P || m >= M) continue;
        half* out = y + y_pixel(p, Ho, Wo, y0, y_img, y_row, y_col) * MY + m;
        if (vec) {
            *reinterpret_cast<uint4*>(out) = *reinterpret_cast<const uint4*>(cs + row * CS + col);
        } else {
            for (int e = 0; e < 8 && m + e < M; e++) out[e] = cs[row * CS + col + e];
        }
    }
}

// Split-K's second pass: y = half(the splits' fp32 partial sums + bias), each output rounded once.
// One thread per output element; a warp reads 32 adjacent floats of each split.
__global__ void conv2d_mma_splitk_reduce(const float* __restrict__ ws, const half* __restrict__ bias,
                                         half* __restrict__ y, int has_bias, int P, int MY, int splits,
                                         int Ho, int Wo, int y0, int y_img, int y_row, int y_col)
{
    const int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= P * MY) return;
    float v = ws[e];
    for (int z = 1; z < splits; z++) v += ws[z * P * MY + e];
    if (has_bias) v += __half2float(bias[e % MY]);
    y[y_pixel(e / MY, Ho, Wo, y0, y_img, y_row, y_col) * MY + e % MY] = __float2half_rn(v);
}
