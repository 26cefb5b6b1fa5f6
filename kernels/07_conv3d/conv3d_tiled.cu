// Chapter 7, step 2: a 3D shared-memory tile with halo, the mask in constant memory.
//
// Chapter 3's idea in one more dimension. A block computes a TZ x TY x TX box of outputs; it
// first loads the (TZ+KZ-1) x (TY+KY-1) x (TX+KX-1) input box those outputs need (the tile plus
// its halo) into shared memory, every thread a few elements, then each thread computes its output
// from shared memory. Each input value is read from global memory about once per block instead of
// once per output that uses it (125 times for a 5x5x5 mask).
//
// The mask is in __constant__ memory and its size (KZ, KY, KX) is known at compile time, so the
// tap loops unroll completely and every mask index is a constant. ptxas could make each mask
// value an operand of its FFMA (c[0x3][...]); on sm_90 (nvcc 13) it does not: it loads the values
// into uniform registers first (ULDC, two at a time), and the FFMAs read those (chapter 7 shows
// the SASS). What remains per FMA is one shared-memory load: the shared-memory pipe, not the
// FMA pipe, is the limit here, which step 3 (conv3d_coarse.cu) addresses.
//
// The halo costs: with the default 32 x 4 x 4 box and a 5x5x5 mask, the block loads
// 36*8*8 = 2,304 values for 512 outputs (4.5 loads per output, against 1 without halo).
//
// Layout: x (D,H,W), y (Do,Ho,Wo), float32, valid cross-correlation, stride 1.
// Grid: (ceil(Wo/TX), ceil(Ho/TY), ceil(Do/TZ)) with block (TX, TY, TZ).
// Tunables: TX, TY, TZ (the output box = the block), KZ, KY, KX (the mask size).

#ifndef TX
#define TX 32
#endif
#ifndef TY
#define TY 4
#endif
#ifndef TZ
#define TZ 4
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

#define IX (TX + KX - 1)           // input box, halo included
#define IY (TY + KY - 1)
#define IZ (TZ + KZ - 1)
#define NT (TX * TY * TZ)

static_assert(NT <= 1024, "at most 1024 threads per block");
static_assert(IX * IY * IZ * 4 <= 48 * 1024, "the input box must fit in 48 KB of shared memory");

__constant__ float c_mask[KZ * KY * KX];   // the launcher fills it with mod.set_constant("c_mask", mask)

__global__ void conv3d_tiled(const float* __restrict__ x, float* __restrict__ y, int D, int H, int W)
{
    __shared__ float tile[IZ][IY][IX];
    const int Do = D - KZ + 1, Ho = H - KY + 1, Wo = W - KX + 1;
    const int x0 = blockIdx.x * TX, y0 = blockIdx.y * TY, z0 = blockIdx.z * TZ;
    const int tid = (threadIdx.z * TY + threadIdx.y) * TX + threadIdx.x;

    // Cooperative load, consecutive threads on consecutive x: coalesced. Values past the volume's
    // edge are set to 0; they only reach outputs that are not stored, but every element the
    // compute loop reads must be written.
    for (int i = tid; i < IZ * IY * IX; i += NT) {
        const int lx = i % IX, ly = (i / IX) % IY, lz = i / (IX * IY);
        const int gx = x0 + lx, gy = y0 + ly, gz = z0 + lz;
        tile[lz][ly][lx] = (gx < W && gy < H && gz < D) ? x[(gz * H + gy) * W + gx] : 0.0f;
    }
    __syncthreads();

    const int ox = x0 + threadIdx.x, oy = y0 + threadIdx.y, oz = z0 + threadIdx.z;
    if (ox >= Wo || oy >= Ho || oz >= Do) return;      // after the only barrier: safe

    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < KZ; ++i)
#pragma unroll
        for (int j = 0; j < KY; ++j)
#pragma unroll
            for (int k = 0; k < KX; ++k)
                acc += tile[threadIdx.z + i][threadIdx.y + j][threadIdx.x + k] * c_mask[(i * KY + j) * KX + k];
    y[(oz * Ho + oy) * Wo + ox] = acc;
}
