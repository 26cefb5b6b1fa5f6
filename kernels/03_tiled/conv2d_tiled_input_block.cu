// Chapter 3, strategy 2: input-tile-sized blocks where some threads only load.
//
// The block is as large as the input tile (IN_TILE x IN_TILE threads, halo included), so every
// thread loads exactly one input pixel per channel: no loop, no division in the load. The price:
// only the OUT_TILE x OUT_TILE threads in the top-left corner compute an output, with
// OUT_TILE = (IN_TILE - K)/stride + 1. For K = 7 and IN_TILE = 32 that is 26*26 = 676 of 1024
// threads (66%); for IN_TILE = 16 only 10*10 = 100 of 256 (39%): the idle threads still hold
// registers and warp slots, and the whole warps that only load do no arithmetic at all.
//
// Layout: x (B,C,H,W), y (B,M,Ho,Wo), w (M,C,K,K), float32 NCHW, cross-correlation.
// Grid: (tiles_y * tiles_x, M, B) with block (IN_TILE, IN_TILE); static shared memory.
// Padding: any. Stride: any, as long as IN_TILE >= K (the launcher checks).

#ifndef IN_TILE
#define IN_TILE 32           // block width = input tile width: 32x32 = 1024 threads, the maximum
#endif

// The mask in __constant__ memory (see conv2d_tiled_halo_multi_pass.cu for why), or from the
// global pointer w with MASK_IN_CONSTANT=0.
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

__global__ void conv2d_tiled_input_block(const float* __restrict__ x, const float* __restrict__ w,
                                         float* __restrict__ y, int B, int C, int M, int H, int W,
                                         int K, int pad, int stride)
{
    // Static size: the block shape is fixed at compile time, whatever K is.
    __shared__ float tile[IN_TILE][IN_TILE];

    const int Ho = (H + 2 * pad - K) / stride + 1;
    const int Wo = (W + 2 * pad - K) / stride + 1;
    const int out_tile = (IN_TILE - K) / stride + 1;    // outputs per block edge
    const int tiles_x = (Wo + out_tile - 1) / out_tile;
    const int m = blockIdx.y, b = blockIdx.z;
    const int oy0 = (blockIdx.x / tiles_x) * out_tile;
    const int ox0 = (blockIdx.x % tiles_x) * out_tile;
    const int ty = threadIdx.y, tx = threadIdx.x;
    const int iy = oy0 * stride - pad + ty;              // the one input pixel this thread loads
    const int ix = ox0 * stride - pad + tx;
    const bool in_image = iy >= 0 && iy < H && ix >= 0 && ix < W;
    const int oy = oy0 + ty, ox = ox0 + tx;
    // Computing threads: the top-left out_tile x out_tile corner of the block, inside the output.
    const bool computes = ty < out_tile && tx < out_tile && oy < Ho && ox < Wo;

    float acc = 0.0f;
    for (int c = 0; c < C; ++c) {
        tile[ty][tx] = in_image ? x[((b * C + c) * H + iy) * W + ix] : 0.0f;   // one load, coalesced
        __syncthreads();

        if (computes) {
            const int mbase = (m * C + c) * K * K;
            for (int ky = 0; ky < K; ++ky)
                for (int kx = 0; kx < K; ++kx)
                    acc += tile[ty * stride + ky][tx * stride + kx] * MASK(mbase + ky * K + kx);
        }
        __syncthreads();               // before the next channel overwrites the tile
    }
    if (computes)
        y[((b * M + m) * Ho + oy) * Wo + ox] = acc;
}
