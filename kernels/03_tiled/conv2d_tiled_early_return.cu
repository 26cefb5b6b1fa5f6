// Chapter 3: strategy 3 (conv2d_tiled_cached_halo.cu) in the form of the PyCUDA blog the course
// started from, as the course material describes it: 32x32 blocks and an early `return` for the
// threads whose output lies past the image. It is WRONG, kept to show why; the fix is strategy 3.
//
// The returned threads never reach the __syncthreads() the others wait at. The CUDA C++
// Programming Guide allows __syncthreads() in conditional code only if the condition evaluates
// identically across the entire thread block; otherwise execution is likely to hang or produce
// unintended side effects. It may seem to work on a GPU: the PTX ISA says a barrier waits for the
// non-exited threads and is released when exiting threads are the only ones holding it up. But a
// returned thread has not loaded its interior pixel, so a neighbour whose tap lands on that entry
// reads shared memory this block never wrote. The emulator stops the launch with a BarrierError
// naming this file and the barrier's line.
//
// Only a block with out-of-range threads is wrong: when TILE divides both Ho and Wo, no thread
// returns and the kernel is correct. The fix keeps every thread through the barriers, guards the
// store (and computes only where the output exists), and loads the interior pixel in every
// thread: that is conv2d_tiled_cached_halo.cu.
//
// Layout, grid and mask: as conv2d_tiled_cached_halo.cu (block (TILE, TILE), stride 1).

#ifndef TILE
#define TILE 32              // the blog's block: 32x32 = 1,024 threads
#endif

#ifndef MASK_IN_CONSTANT
#define MASK_IN_CONSTANT 1
#endif
#ifndef MASK_MAX
#define MASK_MAX 16384
#endif

__constant__ float c_mask[MASK_MAX];   // the launcher fills it with mod.set_constant("c_mask", w)
#if MASK_IN_CONSTANT
#define MASK(i) c_mask[i]
#else
#define MASK(i) w[i]
#endif

__global__ void conv2d_tiled_early_return(const float* __restrict__ x, const float* __restrict__ w,
                                          float* __restrict__ y, int B, int C, int M, int H, int W,
                                          int K, int pad)
{
    __shared__ float tile[TILE][TILE];
    // listing: body
    const int Ho = H + 2 * pad - K + 1;
    const int Wo = W + 2 * pad - K + 1;
    const int tiles_x = (Wo + TILE - 1) / TILE;
    const int m = blockIdx.y, b = blockIdx.z;
    const int oy0 = (blockIdx.x / tiles_x) * TILE;
    const int ox0 = (blockIdx.x % tiles_x) * TILE;
    const int ty = threadIdx.y, tx = threadIdx.x;
    const int oy = oy0 + ty, ox = ox0 + tx;
    if (oy >= Ho || ox >= Wo) return;                   // the bug: before the barriers below
    const int h = (K - 1) / 2;
    const int iy = oy0 - pad + h + ty;
    const int ix = ox0 - pad + h + tx;
    const bool in_image = iy >= 0 && iy < H && ix >= 0 && ix < W;

    float acc = 0.0f;
    for (int c = 0; c < C; ++c) {
        const int xbase = (b * C + c) * H * W;
        tile[ty][tx] = in_image ? x[xbase + iy * W + ix] : 0.0f;
        __syncthreads();

        const int mbase = (m * C + c) * K * K;
        for (int ky = 0; ky < K; ++ky) {
            const int sy = ty + ky - h;
            const int gy = oy - pad + ky;
            for (int kx = 0; kx < K; ++kx) {
                const int sx = tx + kx - h;
                const int gx = ox - pad + kx;
                float v;
                if (sy >= 0 && sy < TILE && sx >= 0 && sx < TILE)
                    v = tile[sy][sx];                                   // in the block's tile
                else if (gy >= 0 && gy < H && gx >= 0 && gx < W)
                    v = x[xbase + gy * W + gx];                         // in the image: global
                else
                    v = 0.0f;                                           // outside the image
                acc += v * MASK(mbase + ky * K + kx);
            }
        }
        __syncthreads();
    }
    y[((b * M + m) * Ho + oy) * Wo + ox] = acc;
}  // end listing: body
