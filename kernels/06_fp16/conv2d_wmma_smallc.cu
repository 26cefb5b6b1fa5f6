// Chapter 6, step 4: tensor cores for layers with few input channels, without any im2col.
//
// For lenet_c3 (C=4, K=7, M=16) the implicit GEMM of step 3 spends its time building U: every
// output pixel needs C*K*K = 196 gathered values, each loaded and stored one by one, for a
// reduction that the tensor cores finish in a few instructions. This kernel never builds U. It
// puts the input in shared memory once, channels innermost, and lets the fragment loads read the
// unrolled matrix straight out of it, by choosing the leading dimension.
//
// The layout. A block takes one image (or a band of BAND output rows) and stores its padded input
// as positions pos = row*RP + col (RP >= W + 2*pad: a row pitch), each position holding CP
// halves (the C channels, zero-padded to CP = 1, 2, 4 or 8). Number the outputs the same way,
// q = oy*RP + ox (the columns ox >= Wo are computed and thrown away: (RP-Wo)/RP of the work).
// Then output q with tap (ky, kx) reads position q + ky*RP + kx, and for a fixed ky
//
//     A[r][j] = input at position (q0 + r*NPH + ky*RP + j/CP), channel j%CP       (NPH = 8/CP)
//             = S[(q0 + ky*RP)*CP + r*8 + j]
//
// is a 16x16 row-major matrix with a leading dimension of 8 halves, rows overlapping in memory:
// exactly what load_matrix_sync reads. Row r is output q0 + r*NPH, column j is tap kx = j/CP of
// channel j%CP; K*CP columns cover a whole row of the mask (28 for lenet_c3, rounded up to
// JC*16 = 32, the extra columns meeting zero weights). The B matrix is the mask of row ky:
// B[j][m] = w[m][j%CP][ky][j/CP]. So an output tile needs K*JC mma_sync, and no U.
//
//  - One fragment covers the outputs q0, q0+NPH, ..., q0+15*NPH. The NPH "phases" e = 0..NPH-1
//    cover the rest, each from its own copy of the tile shifted by e positions, S_e[p] = S[p+e]
//    (a fragment pointer must be 32-byte aligned, so q0 + e cannot simply move the pointer): a
//    tile is QT = 16*NPH consecutive outputs, NPH accumulator fragments. lenet_c3: CP=4, NPH=2,
//    tiles of 32 outputs, 7 x 2 x 2 = 28 mma_sync each.
//  - The B matrices are the same for every block: smallc_mask (below; the launcher runs it first,
//    so its cost is in the timing) lays them out once in global memory, Wb[group][ky][jc][16][16],
//    and each block copies its group's slice with 16-byte loads. The B fragments (K*JC of them:
//    14 for lenet_c3) are loaded into registers once per warp when there are at most 16 (BREG);
//    otherwise they are re-read from shared memory for each tile.
//  - Epilogue: each warp stages its NPH accumulators in shared memory (column-major: a map's
//    outputs contiguous), then writes half2 pairs of neighbouring outputs, a half-warp per map.
//  - Work: the whole reduction runs on the tensor cores. Per tile (lenet_c3; nvcc 13, sm_90) a
//    warp issues 191 instructions: 28 fragment loads (LDSM, 512 bytes each), 56 HMMA.16816 and
//    the epilogue. The fragment loads' shared-memory bandwidth (4 cycles of an SM's 128 bytes per
//    cycle each) is the expected limit: ~0.2 ms for lenet_c3 on an H100/H200, against a memory
//    floor of ~0.12 ms (500 MB of half input and output).
//
// Accuracy as step 3: half inputs, exact products, float sums, rounded once to half.
//
// Layout: x (B,C_IN,IN_H,IN_W), w (M_OUT,C_IN,K,K), y (B,M_OUT,Ho,Wo), half, NCHW. Stride 1.
// Grid: (B * ceil(Ho/BAND), ceil(M_OUT/16)), block 32*WARPS threads. Padding: any.
// Tunables: the layer (C_IN, M_OUT, KSIZE, IN_H, IN_W, PAD), RP (row pitch in positions:
// >= IN_W+2*PAD, a multiple of 16/CP), BAND (output rows per block), WARPS.

#include <mma.h>
#include <cuda_fp16.h>
using namespace nvcuda;

#ifndef C_IN
#define C_IN 4
#endif
#ifndef M_OUT
#define M_OUT 16
#endif
#ifndef KSIZE
#define KSIZE 7
#endif
#ifndef IN_H
#define IN_H 40
#endif
#ifndef IN_W
#define IN_W 40
#endif
#ifndef PAD
#define PAD 0
#endif
#ifndef RP
#define RP 40
#endif
#ifndef BAND
#define BAND 34
#endif
#ifndef WARPS
#define WARPS 4
#endif

#define HO (IN_H + 2 * PAD - KSIZE + 1)
#define WO (IN_W + 2 * PAD - KSIZE + 1)
#define CP (C_IN <= 1 ? 1 : C_IN <= 2 ? 2 : C_IN <= 4 ? 4 : 8)   // channels per position
#define NPH (8 / CP)                                 // phases: outputs between a fragment's rows
#define JC ((KSIZE * CP + 15) / 16)                  // 16-wide column chunks of one mask row
#define QT (16 * NPH)                                // outputs per tile
#define NQ (BAND * RP)                               // outputs of a band (with the thrown-away columns)
#define NTILES ((NQ + QT - 1) / QT)
#define NPOS (NTILES * QT + (KSIZE - 1) * RP + JC * 16 / CP)   // positions read, all written
#define NT (32 * WARPS)
#define BREG (KSIZE * JC <= 16)                       // B fragments in registers
#define LDS_ 16                                       // staging: floats per map (column-major)
#define S_BYTES (NPH * NPOS * CP * 2)
#define W_BYTES (KSIZE * JC * 256 * 2)
#define ST_BYTES (WARPS * NPH * 16 * LDS_ * 4)

static_assert(C_IN >= 1 && C_IN <= 8, "this kernel is for 1 to 8 input channels");
static_assert(RP >= IN_W + 2 * PAD, "a row of the padded input must fit in the row pitch");
static_assert((RP * CP) % 16 == 0, "RP*CP must be a multiple of 16 halves (32-byte aligned fragment rows)");
static_assert(S_BYTES + W_BYTES + ST_BYTES <= 48 * 1024, "shared memory over 48 KB: use a smaller BAND");

// The mask as K*JC B matrices per group of 16 maps: Wb[g][ky][jc][jj][m] = w[16g+m][c][ky][kx],
// j = jc*16+jj, kx = j/CP, c = j%CP; zero past the mask's row, past C_IN and past M_OUT.
// Grid: ceil(groups*K*JC*256 / 256) blocks of 256 threads.
__global__ void smallc_mask(const half* __restrict__ w, half* __restrict__ wb)
{
    const int i = blockIdx.x * 256 + threadIdx.x;
    const int groups = (M_OUT + 15) / 16;
    if (i >= groups * KSIZE * JC * 256) return;
    const int mm = i % 16, jj = (i / 16) % 16, jc = (i / 256) % JC, ky = (i / (256 * JC)) % KSIZE;
    const int g = i / (256 * JC * KSIZE);
    const int j = jc * 16 + jj, kx = j / CP, c = j % CP, m = g * 16 + mm;
    wb[i] = (kx < KSIZE && c < C_IN && m < M_OUT) ? w[((m * C_IN + c) * KSIZE + ky) * KSIZE + kx] : __float2half(0.0f);
}

__global__ void __launch_bounds__(NT)
conv2d_wmma_smallc(const half* __restrict__ x, const half* __restrict__ wb, half* __restrict__ y, int B)
{
    __shared__ __align__(128) unsigned char smem[S_BYTES + W_BYTES + ST_BYTES];
    half* S = (half*)smem;                                          // S[e][pos][c]: NPH shifted copies
    half* Wsm = (half*)(smem + S_BYTES);                            // Wsm[ky][jc][16 j][16 m]
    float* stage = (float*)(smem + S_BYTES + W_BYTES);              // stage[warp][e][m][r]

    constexpr int H = IN_H, W = IN_W, Ho = HO, Wo = WO;
    constexpr int nbands = (HO + BAND - 1) / BAND;
    const int b = blockIdx.x / nbands, oy0 = (blockIdx.x % nbands) * BAND;
    const int m0 = blockIdx.y * 16;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const half zero = __float2half(0.0f);

    // ---- the band's padded input, channels innermost, into the NPH shifted copies. Position pos
    // (band row pos/RP, column pos%RP) goes to S_e[pos - e] for every e. Consecutive threads take
    // consecutive positions: each channel's loads coalesce.
    for (int pos = tid; pos < NPOS + NPH - 1; pos += NT) {
        const int r = pos / RP, col = pos - r * RP;
        const int iy = oy0 + r - PAD, ix = col - PAD;
        const bool in = pos < NPOS && r < BAND + KSIZE - 1 && iy >= 0 && iy < H && ix >= 0 && ix < W;
        union { uint4 u4; uint2 u2; unsigned u1; unsigned short u0; half h[8]; } v;
#pragma unroll
        for (int c = 0; c < CP; ++c)
            v.h[c] = (in && c < C_IN) ? x[((b * C_IN + c) * H + iy) * W + ix] : zero;
#pragma unroll
        for (int e = 0; e < NPH; ++e) {
            const int p = pos - e;
            if (p < 0 || p >= NPOS) continue;
            half* dst = &S[(e * NPOS + p) * CP];
#if CP == 8
            *(uint4*)dst = v.u4;
#elif CP == 4
            *(uint2*)dst = v.u2;
#elif CP == 2
            *(unsigned*)dst = v.u1;
#else
            *dst = v.h[0];
#endif
        }
    }
    // ---- this group's B matrices, prepared by smallc_mask: a 16-byte copy.
    for (int i = tid; i < W_BYTES / 16; i += NT)
        ((uint4*)Wsm)[i] = *(const uint4*)&wb[blockIdx.y * (W_BYTES / 2) + 8 * i];
    __syncthreads();                    // the only barrier: from here on each warp works alone

    typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::row_major> FragB;
#if BREG
    FragB bf[KSIZE][JC];
#pragma unroll
    for (int ky = 0; ky < KSIZE; ++ky)
#pragma unroll
        for (int jc = 0; jc < JC; ++jc)
            wmma::load_matrix_sync(bf[ky][jc], &Wsm[(ky * JC + jc) * 256], 16);
#endif

    float* st = &stage[warp * NPH * 16 * LDS_];
    // Epilogue mapping: lane -> row r = lane % 16 of the fragments (outputs q0 + NPH*r + e) and
    // maps mm = lane / 16, +2, +4, ...; each half-warp writes one map's 16 rows.
    const int r_l = lane % 16, mm_l = lane / 16;
    for (int tile = warp; tile < NTILES; tile += WARPS) {
        const int q0 = tile * QT;
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[NPH];
#pragma unroll
        for (int e = 0; e < NPH; ++e) wmma::fill_fragment(acc[e], 0.0f);
#pragma unroll  // listing: tap_loop
        for (int ky = 0; ky < KSIZE; ++ky) {
#pragma unroll
            for (int jc = 0; jc < JC; ++jc) {
#if BREG
                const FragB& bk = bf[ky][jc];
#else
                FragB bk;
                wmma::load_matrix_sync(bk, &Wsm[(ky * JC + jc) * 256], 16);
#endif
#pragma unroll
                for (int e = 0; e < NPH; ++e) {
                    wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> a;
                    wmma::load_matrix_sync(a, &S[(e * NPOS + q0 + ky * RP) * CP + jc * 16], 8);
                    wmma::mma_sync(acc[e], a, bk, acc[e]);
                }
            }  // end listing: tap_loop
        }
        // acc[e] element (r, m) is output q0 + NPH*r + e of map m0 + m: staged column-major,
        // st[e][m][r].
#pragma unroll
        for (int e = 0; e < NPH; ++e)
            wmma::store_matrix_sync(&st[e * 16 * LDS_], acc[e], LDS_, wmma::mem_col_major);
        __syncwarp();
        // Lane (r, mm) writes outputs q0 + NPH*r + 0 .. NPH-1 of maps mm, mm+2, ...: NPH
        // neighbouring columns of one output row (RP and q0 are multiples of NPH). When Wo is even,
        // a pair starting at an even column ox < Wo is whole and 4-byte aligned: one half2 store.
        const int q = q0 + NPH * r_l, oyl = q / RP, ox = q - oyl * RP, oy = oy0 + oyl;
        if (oyl < BAND && oy < Ho && ox < Wo && (M_OUT % 16 == 0 || m0 + mm_l < M_OUT)) {
            half* dst = &y[((size_t)(b * M_OUT + m0 + mm_l) * Ho + oy) * Wo + ox];
            constexpr size_t map_step = (size_t)2 * HO * WO;
#pragma unroll
            for (int mm = mm_l; mm < 16; mm += 2, dst += map_step) {
                if (M_OUT % 16 != 0 && m0 + mm >= M_OUT) break;
#pragma unroll
                for (int e = 0; e < NPH; e += 2) {
                    const float v0 = st[(e * 16 + mm) * LDS_ + r_l];
                    if (NPH == 1) { dst[0] = __float2half(v0); continue; }
                    const float v1 = st[((e + 1) * 16 + mm) * LDS_ + r_l];
                    if (WO % 2 == 0 && (e == 0 || ox + e < Wo)) {
                        *(half2*)&dst[e] = __floats2half2_rn(v0, v1);      // ox + e even, Wo even
                    } else {
                        if (ox + e < Wo) dst[e] = __float2half(v0);
                        if (ox + e + 1 < Wo) dst[e + 1] = __float2half(v1);
                    }
                }
            }
        }
        __syncwarp();                   // all lanes' reads of st before the next tile's stores
    }
}
