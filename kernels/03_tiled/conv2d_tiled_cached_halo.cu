// Chapter 3, strategy 3: the interior from shared memory, the halo from global memory (L1/L2).
//
// The block is output-tile-sized (TILE x TILE threads) and each thread loads exactly one pixel:
// the TILE x TILE "interior" of the input tile. The halo (the K-1 extra rows and columns) is not
// loaded into shared memory at all: when a thread needs a halo pixel it reads it from global
// memory and counts on the caches, because the neighbouring block loads the same pixel as part of
// its own interior at about the same time, so it is likely in L1 (same SM) or L2.
// This keeps the simple one-load-per-thread shape of strategy 2 without idle threads, at the
// cost of a branch in the inner loop (interior or halo?) that diverges along the tile's edges.
//
// Which pixels are "interior": the centre of the needed input window. The window for output
// (oy, ox) starts at input (oy - pad, ox - pad); thread (ty, tx) loads input
// (oy0 - pad + h + ty, ox0 - pad + h + tx) with h = (K-1)/2, so for "same" padding (pad = h) it
// loads exactly the pixel under its own output, the textbook form.
//
// Layout: x (B,C,H,W), y (B,M,Ho,Wo), w (M,C,K,K), float32 NCHW, cross-correlation.
// Grid: (tiles_y * tiles_x, M, B) with block (TILE, TILE); static shared memory.
// Padding: any. Stride: 1 only (with stride s the block's outputs do not read a contiguous
// TILE x TILE interior; strategies 1 and 2 handle strides).

#ifndef TILE
#define TILE 16
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

__global__ void conv2d_tiled_cached_halo(const float* __restrict__ x, const float* __restrict__ w,
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
    const int h = (K - 1) / 2;
    const int iy = oy0 - pad + h + ty;                   // this thread's interior pixel
    const int ix = ox0 - pad + h + tx;
    const bool in_image = iy >= 0 && iy < H && ix >= 0 && ix < W;
    const bool active = oy < Ho && ox < Wo;

    float acc = 0.0f;
    for (int c = 0; c < C; ++c) {
        const int xbase = (b * C + c) * H * W;
        tile[ty][tx] = in_image ? x[xbase + iy * W + ix] : 0.0f;
        __syncthreads();

        if (active) {
            const int mbase = (m * C + c) * K * K;
            for (int ky = 0; ky < K; ++ky) {
                const int sy = ty + ky - h;                  // row in the shared tile
                const int gy = oy - pad + ky;                // the same row in the image
                for (int kx = 0; kx < K; ++kx) {
                    const int sx = tx + kx - h;
                    float v;
                    if (sy >= 0 && sy < TILE && sx >= 0 && sx < TILE) {
                        v = tile[sy][sx];                    // interior: shared memory
                    } else {
                        const int gx = ox - pad + kx;        // halo: global memory, through the caches
                        v = (gy >= 0 && gy < H && gx >= 0 && gx < W) ? x[xbase + gy * W + gx] : 0.0f;
                    }
                    acc += v * MASK(mbase + ky * K + kx);
                }
            }
        }
        __syncthreads();
    }
    if (active)
        y[((b * M + m) * Ho + oy) * Wo + ox] = acc;
}  // end listing: body
