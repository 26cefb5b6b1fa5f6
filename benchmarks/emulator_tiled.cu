// The emulator's speed benchmark: a teaching-size tiled conv2d, 16x16 output tiles with a halo
// in shared memory and two barriers per input channel, and the same convolution without a barrier.
#ifndef TILE
#define TILE 16
#endif
#define KMAX 7
#define IN_TILE (TILE + KMAX - 1)

__global__ void conv2d_tiled(const float* x, const float* w, float* y, int C, int M, int H, int W, int K) {
    __shared__ float tile[IN_TILE][IN_TILE];
    int Ho = H - K + 1, Wo = W - K + 1;
    int b = blockIdx.z / M, m = blockIdx.z % M;
    int r0 = blockIdx.y * TILE, c0 = blockIdx.x * TILE;
    int r = r0 + threadIdx.y, c = c0 + threadIdx.x;
    float acc = 0.0f;
    for (int ch = 0; ch < C; ch++) {
        for (int i = threadIdx.y; i < TILE + K - 1; i += TILE)
            for (int j = threadIdx.x; j < TILE + K - 1; j += TILE) {
                int rr = r0 + i, cc = c0 + j;
                tile[i][j] = (rr < H && cc < W) ? x[((b * C + ch) * H + rr) * W + cc] : 0.0f;
            }
        __syncthreads();
        for (int p = 0; p < K; p++)
            for (int q = 0; q < K; q++)
                acc += tile[threadIdx.y + p][threadIdx.x + q] * w[((m * C + ch) * K + p) * K + q];
        __syncthreads();
    }
    if (r < Ho && c < Wo) y[((b * M + m) * Ho + r) * Wo + c] = acc;
}

__global__ void conv2d_direct(const float* x, const float* w, float* y, int C, int M, int H, int W, int K) {
    int Ho = H - K + 1, Wo = W - K + 1;
    int b = blockIdx.z / M, m = blockIdx.z % M;
    int r = blockIdx.y * TILE + threadIdx.y, c = blockIdx.x * TILE + threadIdx.x;
    if (r >= Ho || c >= Wo) return;
    float acc = 0.0f;
    for (int ch = 0; ch < C; ch++)
        for (int p = 0; p < K; p++)
            for (int q = 0; q < K; q++)
                acc += x[((b * C + ch) * H + r + p) * W + c + q] * w[((m * C + ch) * K + p) * K + q];
    y[((b * M + m) * Ho + r) * Wo + c] = acc;
}
