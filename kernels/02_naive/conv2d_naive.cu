// Chapter 2: the naive CUDA convolution, one thread per output element.
//
// NCHW float32, cross-correlation (no flip), stride and zero padding:
//   y[b][m][h][w] = sum over c, p, q of  x[b][c][h*stride + p - pad][w*stride + q - pad] * k[m][c][p][q]
// where a tap that falls outside the input reads zero. Ho = (H + 2*pad - K) / stride + 1, same for Wo.
//
// Three ways to map threads to outputs. The arithmetic is the same; only the grid differs.

// Mapping 1, the ECE408 project's: a 2D block covers a tile of output pixels and
// blockIdx.z enumerates the (image, output map) pairs, b*M + m.
// It reads well, but gridDim.z is at most 65,535: the launch fails once B*M > 65,535
// (the fa17 workload has B*M = 10,000 * 50 = 500,000).
__global__ void conv2d_naive_z(const float* __restrict__ x, const float* __restrict__ k,
                               float* __restrict__ y,
                               int B, int C, int M, int H, int W, int K, int pad, int stride)
{
    const int Ho = (H + 2 * pad - K) / stride + 1;
    const int Wo = (W + 2 * pad - K) / stride + 1;
    const int w = blockIdx.x * blockDim.x + threadIdx.x;
    const int h = blockIdx.y * blockDim.y + threadIdx.y;
    const int b = blockIdx.z / M;
    const int m = blockIdx.z % M;
    // The grid is rounded up to whole blocks, so threads past the edge have no output.
    if (h >= Ho || w >= Wo || b >= B)
        return;

    float acc = 0.0f;
    for (int c = 0; c < C; ++c)
        for (int p = 0; p < K; ++p) {
            const int ih = h * stride + p - pad;
            if (ih < 0 || ih >= H)             // a padding row: contributes zero
                continue;
            for (int q = 0; q < K; ++q) {
                const int iw = w * stride + q - pad;
                if (iw >= 0 && iw < W)
                    acc += x[((b * C + c) * H + ih) * W + iw] * k[((m * C + c) * K + p) * K + q];
            }
        }
    y[((b * M + m) * Ho + h) * Wo + w] = acc;
}

// Mapping 2, one that scales: a flat 1D grid over all B*M*Ho*Wo outputs (gridDim.x may reach
// 2^31 - 1). Consecutive threads take consecutive w, so a warp's writes to y are coalesced.
// The grid-stride loop keeps the kernel right for any grid size, so a launcher may cap the grid.
// Indices are int: the launcher checks that every tensor has fewer than 2^31 elements.
__global__ void conv2d_naive_flat(const float* __restrict__ x, const float* __restrict__ k,
                                  float* __restrict__ y,
                                  int B, int C, int M, int H, int W, int K, int pad, int stride)
{
    const int Ho = (H + 2 * pad - K) / stride + 1;
    const int Wo = (W + 2 * pad - K) / stride + 1;
    const int total = B * M * Ho * Wo;

    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        // i = ((b * M + m) * Ho + h) * Wo + w, unpicked from the fastest index out
        const int w = i % Wo;
        const int h = (i / Wo) % Ho;
        const int m = (i / (Wo * Ho)) % M;
        const int b = i / (Wo * Ho * M);

        float acc = 0.0f;
        for (int c = 0; c < C; ++c)
            for (int p = 0; p < K; ++p) {
                const int ih = h * stride + p - pad;
                if (ih < 0 || ih >= H)
                    continue;
                for (int q = 0; q < K; ++q) {
                    const int iw = w * stride + q - pad;
                    if (iw >= 0 && iw < W)
                        acc += x[((b * C + c) * H + ih) * W + iw] * k[((m * C + c) * K + p) * K + q];
                }
            }
        y[i] = acc;
    }
}

// Mapping 3, the textbook's: blockIdx.x is the image, blockIdx.y the output map, and blockIdx.z
// numbers the tiles of the output, tiles_x per row (the textbook's W_grid). B may reach
// 2^31 - 1 on x; only M and the number of tiles must stay under 65,535, which every layer of
// the course does. A tile's first row is (blockIdx.z / tiles_x) * blockDim.y: the textbook's
// `h = blockIdx.z / W_grid + threadIdx.y` leaves out the tile width.
__global__ void conv2d_naive_textbook(const float* __restrict__ x, const float* __restrict__ k,
                                      float* __restrict__ y,
                                      int B, int C, int M, int H, int W, int K, int pad, int stride)
{
    const int Ho = (H + 2 * pad - K) / stride + 1;
    const int Wo = (W + 2 * pad - K) / stride + 1;
    const int tiles_x = (Wo + blockDim.x - 1) / blockDim.x;
    const int b = blockIdx.x;
    const int m = blockIdx.y;
    const int h = (blockIdx.z / tiles_x) * blockDim.y + threadIdx.y;
    const int w = (blockIdx.z % tiles_x) * blockDim.x + threadIdx.x;
    if (h >= Ho || w >= Wo || b >= B)
        return;

    float acc = 0.0f;
    for (int c = 0; c < C; ++c)
        for (int p = 0; p < K; ++p) {
            const int ih = h * stride + p - pad;
            if (ih < 0 || ih >= H)
                continue;
            for (int q = 0; q < K; ++q) {
                const int iw = w * stride + q - pad;
                if (iw >= 0 && iw < W)
                    acc += x[((b * C + c) * H + ih) * W + iw] * k[((m * C + c) * K + p) * K + q];
            }
        }
    y[((b * M + m) * Ho + h) * Wo + w] = acc;
}
