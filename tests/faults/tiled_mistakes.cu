// Exercise 3a.1's tiled conv2d (extern __shared__ tile, halo included) with one mistake by MISTAKE:
// 1 no barrier between loading the tile and reading it, 2 no barrier before the next channel's
// load overwrites it, 3 the load loop covers TILE*TILE values instead of the whole in_w*in_w tile.
#define TILE 8
__global__ void conv2d_tiled(const float* x, const float* w, float* y, int B, int C, int M, int H, int W,
                             int K, int stride, int pad)
{
    extern __shared__ float tile[];
    const int Ho = (H + 2 * pad - K) / stride + 1, Wo = (W + 2 * pad - K) / stride + 1;
    const int in_w = (TILE - 1) * stride + K, tiles_x = (Wo + TILE - 1) / TILE;
    const int m = blockIdx.y, b = blockIdx.z;
    const int oy0 = (blockIdx.x / tiles_x) * TILE, ox0 = (blockIdx.x % tiles_x) * TILE;
    const int oy = oy0 + threadIdx.y, ox = ox0 + threadIdx.x;
    const int iy0 = oy0 * stride - pad, ix0 = ox0 * stride - pad, tid = threadIdx.y * TILE + threadIdx.x;
    const bool active = oy < Ho && ox < Wo;
    float acc = 0.0f;
    for (int c = 0; c < C; ++c) {
        const int xbase = (b * C + c) * H * W;
#if MISTAKE == 3
        for (int i = tid; i < TILE * TILE; i += TILE * TILE) {
#else
        for (int i = tid; i < in_w * in_w; i += TILE * TILE) {
#endif
            const int iy = iy0 + i / in_w, ix = ix0 + i % in_w;
            tile[i] = (iy >= 0 && iy < H && ix >= 0 && ix < W) ? x[xbase + iy * W + ix] : 0.0f;
        }
#if MISTAKE != 1
        __syncthreads();
#endif
        if (active)
            for (int p = 0; p < K; ++p)
                for (int q = 0; q < K; ++q)
                    acc += tile[(threadIdx.y * stride + p) * in_w + threadIdx.x * stride + q] * w[((m * C + c) * K + p) * K + q];
                    // (one line: a report names the line where the value is used)
#if MISTAKE != 2
        __syncthreads();
#endif
    }
    if (active)
        y[((b * M + m) * Ho + oy) * Wo + ox] = acc;
}
