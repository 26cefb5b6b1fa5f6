// Chapter 7, step 2b: coarsening in a cube. Step 2's shared tile, each thread CX x CY x CZ outputs.
//
// The coarsening an article on 3D convolution (one of the course's sources) tried, and measured no
// gain from: keep step 2's kernel, but let every thread compute a small cube of outputs, so the
// same threads cover a box CX*CY*CZ times larger.
//
// What that changes: the halo is shared by more outputs. With the default 32 x 4 x 4 threads and
// 2 x 2 x 2 outputs each, a block computes a 64 x 8 x 8 box of outputs from a 68 x 12 x 12 box of
// inputs: 9,792 loads for 4,096 outputs (2.4 per output, against step 2's 4.5), and an eighth of
// the blocks. What it does not change: every FMA still reads its input value from shared memory,
// one shared-memory load per FMA, which step 2 named as its limit; and each thread holds its
// outputs' CX*CY*CZ sums, not a window it can reuse (step 3's rolling window does that).
//
// A thread's outputs are a block's width apart along each axis (x: threadIdx.x + cx*TX, ...), not
// adjacent: then the 32 lanes of a warp read 32 consecutive shared words at every step (no bank
// conflict); two adjacent outputs per lane would put the lanes two words apart (two-way conflicts).
//
// Layout: x (D,H,W), y (Do,Ho,Wo), float32, valid cross-correlation, stride 1.
// Grid: (ceil(Wo/(TX*CX)), ceil(Ho/(TY*CY)), ceil(Do/(TZ*CZ))) with block (TX, TY, TZ).
// Tunables: TX, TY, TZ (threads), CX, CY, CZ (outputs per thread along each axis), KZ, KY, KX.

#ifndef TX
#define TX 32
#endif
#ifndef TY
#define TY 4
#endif
#ifndef TZ
#define TZ 4
#endif
#ifndef CX
#define CX 2
#endif
#ifndef CY
#define CY 2
#endif
#ifndef CZ
#define CZ 2
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

#define OX (TX * CX)               // the block's box of outputs
#define OY (TY * CY)
#define OZ (TZ * CZ)
#define IX (OX + KX - 1)           // ... and of inputs, halo included
#define IY (OY + KY - 1)
#define IZ (OZ + KZ - 1)
#define NT (TX * TY * TZ)

static_assert(NT <= 1024, "at most 1024 threads per block");
static_assert(IX * IY * IZ * 4 <= 48 * 1024, "the input box must fit in 48 KB of shared memory");

__constant__ float c_mask[KZ * KY * KX];   // the launcher fills it with mod.set_constant("c_mask", mask)

// __launch_bounds__: without it ptxas gives this kernel 168 registers for a 5x5x5 mask (sm_90), and a
// 512-thread block cannot launch; with it ptxas fits NT threads (128 registers at 512).
__global__ void __launch_bounds__(NT) conv3d_cube(const float* __restrict__ x, float* __restrict__ y, int D, int H, int W)
{
    __shared__ float tile[IZ][IY][IX];
    const int Do = D - KZ + 1, Ho = H - KY + 1, Wo = W - KX + 1;
    const int x0 = blockIdx.x * OX, y0 = blockIdx.y * OY, z0 = blockIdx.z * OZ;
    const int tid = (threadIdx.z * TY + threadIdx.y) * TX + threadIdx.x;

    // Step 2's cooperative load, over the larger box: consecutive threads on consecutive x.
    for (int i = tid; i < IZ * IY * IX; i += NT) {
        const int lx = i % IX, ly = (i / IX) % IY, lz = i / (IX * IY);
        const int gx = x0 + lx, gy = y0 + ly, gz = z0 + lz;
        tile[lz][ly][lx] = (gx < W && gy < H && gz < D) ? x[((size_t)gz * H + gy) * W + gx] : 0.0f;
    }
    __syncthreads();

    float acc[CZ][CY][CX];
#pragma unroll
    for (int a = 0; a < CZ; ++a)
#pragma unroll
        for (int b = 0; b < CY; ++b)
#pragma unroll
            for (int c = 0; c < CX; ++c) acc[a][b][c] = 0.0f;

#pragma unroll
    for (int i = 0; i < KZ; ++i)
#pragma unroll
        for (int j = 0; j < KY; ++j)
#pragma unroll
            for (int k = 0; k < KX; ++k) {
                const float m = c_mask[(i * KY + j) * KX + k];
#pragma unroll
                for (int a = 0; a < CZ; ++a)
#pragma unroll
                    for (int b = 0; b < CY; ++b)
#pragma unroll
                        for (int c = 0; c < CX; ++c)
                            acc[a][b][c] += tile[threadIdx.z + a * TZ + i][threadIdx.y + b * TY + j]
                                                [threadIdx.x + c * TX + k] * m;
            }

#pragma unroll
    for (int a = 0; a < CZ; ++a)
#pragma unroll
        for (int b = 0; b < CY; ++b)
#pragma unroll
            for (int c = 0; c < CX; ++c) {
                const int ox = x0 + threadIdx.x + c * TX, oy = y0 + threadIdx.y + b * TY;
                const int oz = z0 + threadIdx.z + a * TZ;
                if (ox < Wo && oy < Ho && oz < Do) y[((size_t)oz * Ho + oy) * Wo + ox] = acc[a][b][c];
            }
}
