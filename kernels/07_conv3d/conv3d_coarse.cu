// Chapter 7, step 3: thread coarsening along z, warp-wide rows, a rolling window of outputs.
//
// Step 2 paid one shared-memory load per FMA, and a halo in all three dimensions. Here each
// thread walks down z through ZC output planes, and the window that rolls is made of outputs:
//
//  - A block is BY warps; a warp is 32 threads along x (one row: its loads and stores coalesce),
//    and each thread owns TX consecutive outputs of TY rows. The block covers a
//    (32*TX) x (BY*TY) patch of every output plane z0 .. z0+ZC-1.
//  - The block reads the input one plane at a time: plane iz, with its halo in x and y only,
//    (BY*TY + KY-1) rows x (32*TX + KX-1) columns, goes into shared memory with 16-byte loads.
//    There is no halo in z: each input plane is read once per block.
//  - Input plane iz contributes to the KZ output planes iz-KZ+1 .. iz (with mask plane
//    kz = iz - oz). Each thread keeps those KZ partial outputs in registers, acc[0..KZ-1]: it reads
//    its (TY+KY-1) x (TX+KX-1) window of the plane from shared memory once, and adds it, with the
//    KZ mask planes, into all KZ accumulators. After plane iz, acc[0] (output iz-KZ+1) is complete:
//    it is stored, the window rolls (acc[j] = acc[j+1]) and a fresh acc[KZ-1] starts.
//    Per plane and thread: (TY+KY-1) * (TX+KX-1) values read (2 x 16-byte loads per row for TX=4,
//    K=5), KZ*KY*KX*TY*TX FMAs (500): the FMA pipe, not shared memory, is now the limit.
//  - The mask. Every loop over taps unrolls, so each mask value's index is a compile-time
//    constant. With MASK_REGS=0 the mask is in __constant__ memory (c_mask), as in step 2; but on
//    sm_90 ptxas does not give FFMA a constant-bank operand here: it loads the values into uniform
//    registers (ULDC), 45 loads per plane next to the 500 FFMAs, every plane. With MASK_REGS=1 (the
//    default) each thread reads the KZ*KY*KX values once, from the pointer `mask`, into registers:
//    per plane (TX=4, K=5; nvcc 13, sm_90) the loop is 580 instructions, 500 of them FFMA, 10
//    16-byte shared loads, 3 global loads and a little integer work. The price is registers (~195
//    per thread: two 128-thread blocks per SM, as many as the challenge's grid gives an SM anyway).
//  - Double buffering: the next plane's global loads are issued into registers before the
//    arithmetic on this plane, and stored to the other buffer after it: one __syncthreads() per
//    plane, the load latency hidden behind ~500 FMAs per thread.
//  - Edges: the tile's rows past H and columns past W feed only outputs that are never stored, so
//    they are loaded from a clamped (in-bounds) address instead of being tested and zeroed: the
//    loop has no branches around its loads.
//  - The price of coarsening: a block reads ZC+KZ-1 input planes for its ZC output planes, and
//    KZ-1 planes' worth of its work (filling the window at the start, and the contributions to
//    planes past zend-1 at the end) feeds outputs of the neighbouring blocks: (KZ-1)/(ZC+KZ-1) of
//    the planes read and of the FMAs are wasted (11% at ZC=32, 33% at ZC=8); and fewer,
//    longer-lived blocks.
//    The sweep over TX, TY, BY and ZC finds the balance on a given GPU.
//
// Layout: x (D,H,W), mask (KZ,KY,KX), y (Do,Ho,Wo), float32, valid cross-correlation, stride 1.
// Grid: (ceil(Wo/(32*TX)), ceil(Ho/(BY*TY)), ceil(Do/ZC)) with block (32, BY).
// Tunables: TX, TY (outputs per thread along x and y), BY (warps per block), ZC (output planes
// per block), MASK_REGS, KZ, KY, KX (the mask size); VEC_LOAD (W % 4 == 0 and x 16-byte aligned:
// 16-byte global loads) and VEC_STORE (Wo % 4 == 0 and y 16-byte aligned: 16-byte stores), which
// the launcher sets.

#ifndef TX
#define TX 4                 // consecutive outputs per thread along x (1, 2, 4 or 8)
#endif
#ifndef TY
#define TY 1                 // output rows per thread
#endif
#ifndef BY
#define BY 4                 // warps per block, one above the other
#endif
#ifndef ZC
#define ZC 32                // output planes per block: the coarsening factor along z
#endif
#ifndef MASK_REGS
#define MASK_REGS 1          // 1: mask in registers (read from `mask`); 0: __constant__ c_mask
#endif
#ifndef KZ
#define KZ 5
#endif
#ifndef KY
#define KY 5
#endif
#ifndef KX
#define KX 5
#endif
#ifndef VEC_LOAD
#define VEC_LOAD 1           // input rows start 16-byte aligned: float4 global loads
#endif
#ifndef VEC_STORE
#define VEC_STORE 1          // output rows start 16-byte aligned: float4 stores (with TX % 4 == 0)
#endif

#define NT (32 * BY)                                       // threads per block
#define VEC (TX % 4 == 0 ? 4 : (TX % 2 == 0 ? 2 : 1))      // width of a thread's shared loads
#define WIN (TX + KX - 1)                                  // input columns under a thread's outputs
#define WINV (((WIN + VEC - 1) / VEC) * VEC)               // ... read in VEC-wide pieces
#define PITCH ((((32 * TX + WINV - TX) + 3) / 4) * 4)      // floats per tile row (16-byte multiple)
#define TROWS (BY * TY + KY - 1)                           // tile rows: the block's rows + halo
#define TILE4 ((TROWS * PITCH) / 4)                        // float4s per plane tile
#define LOADS ((TILE4 + NT - 1) / NT)                      // float4s each thread loads per plane
#define TAPS (KZ * KY * KX)

static_assert(NT <= 1024, "at most 1024 threads per block");
static_assert(2 * TROWS * PITCH * 4 <= 48 * 1024, "two plane tiles must fit in 48 KB of shared memory");

__constant__ float c_mask[TAPS];   // MASK_REGS=0: the launcher fills it with mod.set_constant("c_mask", mask)

__global__ void __launch_bounds__(NT) conv3d_coarse(const float* __restrict__ x, const float* __restrict__ mask,
                                                    float* __restrict__ y, int D, int H, int W)
{
    __shared__ __align__(16) float tile[2][TROWS][PITCH];
    const int Do = D - KZ + 1, Ho = H - KY + 1, Wo = W - KX + 1;
    const int lane = threadIdx.x, warp = threadIdx.y, tid = warp * 32 + lane;
    const int x0 = blockIdx.x * 32 * TX, y0 = blockIdx.y * BY * TY, z0 = blockIdx.z * ZC;
    const int zend = min(z0 + ZC, Do);
    const int nplanes = zend - z0 + KZ - 1;        // input planes z0 .. zend+KZ-2
    const size_t plane = (size_t)H * W;

#if MASK_REGS
    float m[TAPS];                                  // the whole mask, in registers
#pragma unroll
    for (int i = 0; i < TAPS; ++i) m[i] = __ldg(&mask[i]);
#define MASK(i) m[i]
#else
#define MASK(i) c_mask[i]
#endif

    // This thread's part of the plane tile: float4 number tid + e*NT, at row (4i)/PITCH and column
    // (4i)%PITCH of the tile. Rows and columns past the volume are clamped into it (see Edges).
    int off[LOADS];
#pragma unroll
    for (int e = 0; e < LOADS; ++e) {
        const int i = min(tid + e * NT, TILE4 - 1);
        const int gy = min(y0 + (4 * i) / PITCH, H - 1);
        const int gx = x0 + (4 * i) % PITCH;
#if VEC_LOAD
        off[e] = gy * W + min(gx, W - 4);           // W % 4 == 0 and gx % 4 == 0: in or out as a whole
#else
        off[e] = gy * W + min(gx, W - 1);           // clamped element by element below
#endif
    }
    float4 pre[LOADS];
    auto prefetch = [&](int iz) {
        const float* src = &x[(size_t)iz * plane];
#pragma unroll
        for (int e = 0; e < LOADS; ++e) {
#if VEC_LOAD
            pre[e] = __ldg((const float4*)&src[off[e]]);
#else
            const int row = off[e] - (off[e] % W), col = off[e] % W;
            pre[e].x = __ldg(&src[row + min(col, W - 1)]);
            pre[e].y = __ldg(&src[row + min(col + 1, W - 1)]);
            pre[e].z = __ldg(&src[row + min(col + 2, W - 1)]);
            pre[e].w = __ldg(&src[row + min(col + 3, W - 1)]);
#endif
        }
    };
    auto commit = [&](int buf) {
        float4* t4 = (float4*)&tile[buf][0][0];
#pragma unroll
        for (int e = 0; e < LOADS; ++e)
            if ((TILE4 % NT) == 0 || tid + e * NT < TILE4) t4[tid + e * NT] = pre[e];
    };

    // acc[j][t][i]: output plane (iz - KZ + 1 + j), row t, column i of this thread.
    float acc[KZ][TY][TX];
#pragma unroll
    for (int j = 0; j < KZ; ++j)
#pragma unroll
        for (int t = 0; t < TY; ++t)
#pragma unroll
            for (int i = 0; i < TX; ++i) acc[j][t][i] = 0.0f;

    prefetch(z0);
    commit(0);
    __syncthreads();

#pragma unroll 1
    for (int p = 0; p < nplanes; ++p) {
        if (p + 1 < nplanes) prefetch(z0 + p + 1);           // in flight during the arithmetic

        // ---- the arithmetic: this plane into the KZ accumulators
        const float* win = &tile[p & 1][warp * TY][lane * TX];
#pragma unroll
        for (int r = 0; r < TY + KY - 1; ++r) {
            float v[WINV];
#pragma unroll
            for (int q = 0; q < WINV / VEC; ++q) {
#if VEC == 4
                const float4 f = *(const float4*)&win[r * PITCH + 4 * q];
                v[4 * q] = f.x; v[4 * q + 1] = f.y; v[4 * q + 2] = f.z; v[4 * q + 3] = f.w;
#elif VEC == 2
                const float2 f = *(const float2*)&win[r * PITCH + 2 * q];
                v[2 * q] = f.x; v[2 * q + 1] = f.y;
#else
                v[q] = win[r * PITCH + q];
#endif
            }
#pragma unroll  // listing: plane_into_accumulators
            for (int t = 0; t < TY; ++t) {
                const int ky = r - t;                        // a compile-time constant after unrolling
                if (ky < 0 || ky >= KY) continue;
#pragma unroll
                for (int j = 0; j < KZ; ++j)                 // acc[j] takes mask plane kz = KZ-1-j
#pragma unroll
                    for (int kx = 0; kx < KX; ++kx)
#pragma unroll
                        for (int i = 0; i < TX; ++i)
                            acc[j][t][i] = fmaf(MASK(((KZ - 1 - j) * KY + ky) * KX + kx), v[i + kx], acc[j][t][i]);
            }  // end listing: plane_into_accumulators
        }

        // ---- acc[0] is output plane z0 + p - KZ + 1: complete once p >= KZ-1 (earlier planes
        // belong to the block below). Store it, then roll the window.
        if (p >= KZ - 1) {
            const int oz = z0 + p - (KZ - 1);
#pragma unroll
            for (int t = 0; t < TY; ++t) {
                const int oy = y0 + warp * TY + t, ox = x0 + lane * TX;
                if (oy >= Ho) continue;
                float* dst = &y[((size_t)oz * Ho + oy) * Wo];
#if TX % 4 == 0 && VEC_STORE
#pragma unroll
                for (int i = 0; i < TX; i += 4)                  // ox % 4 == 0, Wo % 4 == 0: 16-byte stores
                    if (ox + i < Wo)
                        *(float4*)&dst[ox + i] = make_float4(acc[0][t][i], acc[0][t][i + 1], acc[0][t][i + 2], acc[0][t][i + 3]);
#else
#pragma unroll
                for (int i = 0; i < TX; ++i)
                    if (ox + i < Wo) dst[ox + i] = acc[0][t][i];
#endif
            }
        }
#pragma unroll  // listing: window_rolls
        for (int j = 0; j < KZ - 1; ++j)
#pragma unroll
            for (int t = 0; t < TY; ++t)
#pragma unroll
                for (int i = 0; i < TX; ++i) acc[j][t][i] = acc[j + 1][t][i];
#pragma unroll
        for (int t = 0; t < TY; ++t)
#pragma unroll
            for (int i = 0; i < TX; ++i) acc[KZ - 1][t][i] = 0.0f;
        // end listing: window_rolls
        // ---- the next plane into the other buffer. That buffer was last read in step p-1, before
        // its barrier, so nothing still needs it.
        if (p + 1 < nplanes) commit((p + 1) & 1);
        __syncthreads();
    }
}
