// Chapter 8, step 2: dE/dX as a gather, a transposed convolution with the flipped mask. No atomics.
//
// Turn the scatter of conv2d_dx_scatter.cu around: instead of each dy element pushing into the dx
// elements it came from, each dx element pulls from the dy elements it went to. Input pixel iy fed
// output row oy through mask row ky exactly when oy*s + ky - pad == iy, so
//
//   dx[b][c][iy][ix] = sum over m, ky, kx with (iy + pad - ky) divisible by s, and likewise for x, of
//                      dy[b][m][(iy + pad - ky)/s][(ix + pad - kx)/s] * w[m][c][ky][kx]
//
// With s = 1 that is a convolution of dy, padded by K-1-pad, with the mask flipped in both axes
// and its M and C swapped: a "full" correlation, the course's backward convolution. Every dx
// element is written by one thread, once: no atomics, no zeroing, the same bits on every run.
//
// Stride s > 1: only every s-th mask row reaches a given dx row. Rows whose (iy + pad) leave the
// same remainder mod s (a "phase") use the same mask rows, qy, qy+s, qy+2s, ...; so each thread
// takes ROWS rows of one phase (iy = e, e+s, e+2s, ... from its strip) and the mask is stored
// padded to KP = s*ceil(K/s) rows and columns with zeros, so every phase runs the same
// KS x KS = ceil(K/s)^2 taps, some of them zeros. For s = 1 all of this folds to constants.
//
// The loop structure mirrors the forward kernel conv2d_direct_regtile.cu with the roles swapped:
//  - each thread computes CT input channels x ROWS rows (one phase) of one dx column;
//  - lanes are consecutive columns ix, so loads of dy and stores of dx are coalesced;
//  - for each group of MV maps and each mask column u, the thread loads the dy column its rows
//    need (MV x (ROWS + KS - 1) values) into registers, once, and reuses each value for every
//    mask row that touches it;
//  - the mask lives in shared memory as Ws[ky][kx][m][c]: for one tap the MV*CT values a thread
//    needs are contiguous, one 16-byte load when MV*CT is a multiple of 4, and the same address
//    in every lane of the warp (a broadcast) when s = 1;
//  - which of C and M gets vectorised depends on the layer: lenet_c3 has C = 4, so one 16-byte
//    load carries 4 channels (CT = 4, MV = 1): 49 loads of the mask, 77 of dy for 784 FMAs per map.
//    lenet_c1 has C = 1: one dx channel per thread (CT = 1). MV = 4 would let a load carry 4 maps,
//    but then the thread holds 4 dy columns at once and ptxas spills; the launcher uses MV = 1 and
//    more rows instead (ROWS = 15: 154 dy loads and 49 mask loads for 735 FMAs per map).
//  - The mask may be larger than shared memory (many channels): the launcher passes mchunk, how
//    many maps' slices fit, and the kernel walks the maps in chunks, one barrier pair per chunk.
//
// KSIZE, STRIDE, CT, MV, ROWS are compile-time, so the loops over taps, maps, channels and rows
// unroll and the accumulators stay in registers; B, C, M, H, W, pad are run-time. The loop over
// map groups does not unroll (#pragma unroll 1): the body is already KS*KS*MV*CT*ROWS FFMAs.
//
// Layout: dy (B,M,Ho,Wo), w (M,C,K,K), dx (B,C,H,W), float32 NCHW.
// Grid: (ceil(B * s * strips * W / BLOCK), ceil(C / CT)), strips = ceil(ceil(H/s) / ROWS);
// block BLOCK threads; dynamic shared memory KP*KP*mchunk*CT floats (mchunk a multiple of MV).
// Registers: ptxas would hoist the dy loads of every mask column into registers (200+ per thread);
// __launch_bounds__(BLOCK, MIN_BLOCKS) caps them where nothing spills. The defaults below are
// lenet_c1's (K = 7, one channel: 168 registers, 735 FMAs, 154 dy loads, 49 mask loads per map).

#ifndef KSIZE
#define KSIZE 7
#endif
#ifndef STRIDE
#define STRIDE 1
#endif
#ifndef CT
#define CT 1                 // dx channels per thread
#endif
#ifndef MV
#define MV 1                 // maps per mask load: a load carries MV*CT values
#endif
#ifndef ROWS
#define ROWS 15              // dx rows (of one phase) per thread
#endif
#ifndef BLOCK
#define BLOCK 128
#endif
#ifndef MIN_BLOCKS
#define MIN_BLOCKS 3         // __launch_bounds__: blocks of BLOCK threads per SM, so at most
#endif                       // 65536 / (BLOCK*MIN_BLOCKS) registers per thread (3 x 128: 168)

#define KS ((KSIZE + STRIDE - 1) / STRIDE)   // mask taps per axis that reach one phase
#define KP (KS * STRIDE)                      // mask side padded with zeros to whole phases
#define VEC (MV * CT)                         // mask values per tap and map group
#define DROWS (ROWS + KS - 1)                 // dy rows under ROWS dx rows of one phase

__global__ void __launch_bounds__(BLOCK, MIN_BLOCKS) conv2d_dx_gather(const float* __restrict__ dy, const float* __restrict__ w,
                                 float* __restrict__ dx, int B, int C, int M, int H, int W,
                                 int pad, int mchunk)
{
    extern __shared__ __align__(16) float Ws[];     // [KP][KP][mchunk][CT], zeros past K, M and C

    const int Ho = (H + 2 * pad - KSIZE) / STRIDE + 1;
    const int Wo = (W + 2 * pad - KSIZE) / STRIDE + 1;
    const int strips = ((H + STRIDE - 1) / STRIDE + ROWS - 1) / ROWS;
    const int t = blockIdx.x * BLOCK + threadIdx.x;
    // No early return: every thread must reach the barriers of each mask chunk.
    const bool active = t < B * STRIDE * strips * W;
    const int ix = t % W;
    const int g = (t / W) % strips;
    const int e = (t / (W * strips)) % STRIDE;       // the rows' phase: iy = STRIDE*(g*ROWS + r) + e
    const int b = t / (W * strips * STRIDE);
    const int c0 = blockIdx.y * CT;

    // Rows: iy_r + pad = STRIDE*(g*ROWS + r + (e+pad)/STRIDE) + qy, so mask row ky = qy + STRIDE*tt
    // meets dy row oy = g*ROWS + r + (e+pad)/STRIDE - tt. dv[.][j] holds dy row oyb + j.
    const int qy = (e + pad) % STRIDE;
    const int oyb = g * ROWS + (e + pad) / STRIDE - (KS - 1);
    // Columns: mask column kx = qx + STRIDE*u meets dy column oxb - u.
    const int qx = (ix + pad) % STRIDE;
    const int oxb = (ix + pad) / STRIDE;

    float acc[CT][ROWS];
#pragma unroll
    for (int ct = 0; ct < CT; ++ct)
#pragma unroll
        for (int r = 0; r < ROWS; ++r) acc[ct][r] = 0.0f;

    for (int mc = 0; mc < M; mc += mchunk) {
        // ---- this chunk's slice of the mask into shared memory: consecutive threads take
        // consecutive channels, then maps, then taps (w is tiny and stays in L1/L2).
        __syncthreads();                               // everyone is done with the last chunk
        for (int i = threadIdx.x; i < KP * KP * mchunk * CT; i += BLOCK) {
            const int ct = i % CT, mi = (i / CT) % mchunk, tap = i / (CT * mchunk);
            const int ky = tap / KP, kx = tap % KP, m = mc + mi, c = c0 + ct;
            Ws[i] = (ky < KSIZE && kx < KSIZE && m < M && c < C) ? w[((m * C + c) * KSIZE + ky) * KSIZE + kx] : 0.0f;
        }
        __syncthreads();
        if (!active) continue;

        const int mn = min(mchunk, M - mc);
#pragma unroll 1
        for (int mi = 0; mi < mn; mi += MV) {
#pragma unroll
            for (int u = 0; u < KS; ++u) {
                // The dy column under this thread's rows, for mask column kx = qx + STRIDE*u.
                const int ox = oxb - u;
                const bool col_in = ox >= 0 && ox < Wo;
                float dv[MV][DROWS];
#pragma unroll
                for (int v = 0; v < MV; ++v) {
                    const int m = mc + mi + v;
                    const int base = (b * M + m) * Ho * Wo + ox;
#pragma unroll
                    for (int j = 0; j < DROWS; ++j) {
                        const int oy = oyb + j;
                        dv[v][j] = (col_in && m < M && oy >= 0 && oy < Ho) ? __ldg(&dy[base + oy * Wo]) : 0.0f;
                    }
                }
                const int kx = qx + STRIDE * u;
#pragma unroll
                for (int tt = 0; tt < KS; ++tt) {
                    const int ky = qy + STRIDE * tt;
                    // The MV*CT mask values of this tap: w[mc+mi .. +MV][c0 .. c0+CT][ky][kx].
                    const float* wp = &Ws[((ky * KP + kx) * mchunk + mi) * CT];
                    float wv[VEC];
#if VEC % 4 == 0
#pragma unroll
                    for (int q = 0; q < VEC / 4; ++q) {
                        const float4 f = *(const float4*)&wp[4 * q];   // broadcast when STRIDE == 1
                        wv[4 * q] = f.x; wv[4 * q + 1] = f.y; wv[4 * q + 2] = f.z; wv[4 * q + 3] = f.w;
                    }
#else
#pragma unroll
                    for (int q = 0; q < VEC; ++q) wv[q] = wp[q];
#endif
#pragma unroll  // listing: tap_product
                    for (int v = 0; v < MV; ++v)
#pragma unroll
                        for (int r = 0; r < ROWS; ++r) {
                            const float d = dv[v][r - tt + KS - 1];
#pragma unroll
                            for (int ct = 0; ct < CT; ++ct)
                                acc[ct][r] += wv[v * CT + ct] * d;
                        }  // end listing: tap_product
                }
            }
        }
    }

    if (!active) return;  // listing: store
    // Each dx element once, by this thread: for each (channel, row) the warp writes consecutive
    // columns (coalesced).
#pragma unroll
    for (int ct = 0; ct < CT; ++ct) {
        const int c = c0 + ct;
        if (c < C) {
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
                const int iy = STRIDE * (g * ROWS + r) + e;
                if (iy < H)
                    dx[((b * C + c) * H + iy) * W + ix] = acc[ct][r];
            }
        }
    }  // end listing: store
}
