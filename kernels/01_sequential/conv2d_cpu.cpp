// Chapter 1: the sequential convolution, the loop nest of the course material, in plain C++.
//
// NCHW float32, cross-correlation (the mask is not flipped, as in torch):
//   y[b][m][h][w] = sum over c, p, q of  x[b][c][h*stride + p][w*stride + q] * k[m][c][p][q]
// with Ho = (H - K) / stride + 1 and Wo = (W - K) / stride + 1 (no padding: "valid").
//
// One multiply-add per (b, m, h, w, c, p, q): B*M*Ho*Wo*C*K*K of them. Compiled with g++ -O3 by
// convlab.load_cpu and called from Python with CPU tensors; extern "C" keeps the name unmangled.

extern "C" void conv2d_cpu(const float* x, const float* k, float* y,
                           int B, int C, int M, int H, int W, int K, int stride)
{
    const int Ho = (H - K) / stride + 1;
    const int Wo = (W - K) / stride + 1;
    // listing: loop_nest
    for (int b = 0; b < B; ++b)                    // for each image in the batch
        for (int m = 0; m < M; ++m)                // for each output feature map
            for (int h = 0; h < Ho; ++h)           // for each output pixel
                for (int w = 0; w < Wo; ++w) {
                    float acc = 0.0f;              // a register, not y: y is written once
                    for (int c = 0; c < C; ++c)    // sum over input feature maps
                        for (int p = 0; p < K; ++p)        // and the K x K mask
                            for (int q = 0; q < K; ++q)
                                acc += x[((b * C + c) * H + h * stride + p) * W + w * stride + q]
                                     * k[((m * C + c) * K + p) * K + q];
                    y[((b * M + m) * Ho + h) * Wo + w] = acc;  // end listing: loop_nest
                }
}
