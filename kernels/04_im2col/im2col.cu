// Chapter 4: the unroll (im2col). Convolution becomes a matrix product once every input window
// is laid out as a column:
//
//     U[b][(c*K + ky)*K + kx][oy*Wo + ox] = x[b][c][oy*stride - pad + ky][ox*stride - pad + kx]
//
// so that for each image b:   Y[b] (M x Ho*Wo) = W (M x C*K*K) . U[b] (C*K*K x Ho*Wo)
//
// Layout choice: one (C*K*K) x (Ho*Wo) matrix per image, stacked as U (B, C*K*K, Ho*Wo), not one
// (C*K*K) x (B*Ho*Wo) matrix for the whole batch. With the per-image layout the product W.U[b] is
// already image b's (M, Ho, Wo) block of the NCHW output, so no layout fix-up (transpose from
// (M, B, Ho, Wo) to (B, M, Ho, Wo)) is needed after the GEMM: a batched GEMM with a shared A
// writes y in place. The price of im2col is memory: U is K*K times larger than x (49x for K=7;
// 12.5 GB for lenet_c1's whole batch), so the launcher unrolls a chunk of images at a time.
//
// One thread per (image, channel, output pixel) writes the K*K values of that pixel's window for
// that channel. Consecutive threads take consecutive output pixels, so for each (ky, kx) the
// writes of a warp go to consecutive addresses of one row of U (coalesced) and the reads come
// from neighbouring input pixels.
//
// Grid: (ceil(Ho*Wo / BLOCK), C, B) with block BLOCK. Padding: any (zeros). Stride: any.

#ifndef BLOCK
#define BLOCK 256
#endif

__global__ void im2col(const float* __restrict__ x, float* __restrict__ u, int B, int C, int H, int W,
                       int K, int pad, int stride)
{
    const int Ho = (H + 2 * pad - K) / stride + 1;
    const int Wo = (W + 2 * pad - K) / stride + 1;
    const int P = Ho * Wo;
    const int p = blockIdx.x * BLOCK + threadIdx.x;   // output pixel = column of U
    const int c = blockIdx.y, b = blockIdx.z;
    if (p >= P) return;

    const int oy = p / Wo, ox = p % Wo;
    const int iy0 = oy * stride - pad, ix0 = ox * stride - pad;
    const int xbase = (b * C + c) * H * W;
    // Row (c*K*K + ky*K + kx) of image b's matrix; size_t because U can be several GB.
    const size_t ubase = ((size_t)b * C * K * K + (size_t)c * K * K) * P + p;

    for (int ky = 0; ky < K; ++ky) {
        const int iy = iy0 + ky;
        for (int kx = 0; kx < K; ++kx) {
            const int ix = ix0 + kx;
            u[ubase + (size_t)(ky * K + kx) * P] =
                (iy >= 0 && iy < H && ix >= 0 && ix < W) ? x[xbase + iy * W + ix] : 0.0f;
        }
    }
}
