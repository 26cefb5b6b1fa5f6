// Chapter 8, step 1: dE/dX in the scatter form of the course's pseudo-code, parallelised as it
// stands: one thread per element of dE/dY, adding its share into every dE/dX element it came from.
//
// The forward pass read x[b][c][oy*s + ky - pad][ox*s + kx - pad] into y[b][m][oy][ox] with weight
// w[m][c][ky][kx]. The chain rule sends the gradient back along the same edges:
//
//   for every (b, m, oy, ox) and every (c, ky, kx):
//       dx[b][c][oy*s + ky - pad][ox*s + kx - pad] += dy[b][m][oy][ox] * w[m][c][ky][kx]
//
// (taps that fell into the zero padding received nothing in the forward pass, so they send
// nothing back). Every dx element receives from up to M*K*K/s^2 threads at the same time, so each
// "+=" must be an atomicAdd: a read-modify-write done in the L2 cache, one at a time per address.
//
// What it costs (lenet_c1: B=10000, C=1, M=4, 86x86, K=7): 256 M threads x 49 atomics = 12.5 G
// atomic adds, against 74 M dx elements: every element is hit by 196 atomics. A warp's 32 atomics
// for one (c, ky, kx) go to 32 consecutive addresses (coalesced), but each is still a separate L2
// operation, and the float sum depends on the order they arrive in: the result is not bit-for-bit
// repeatable. The launcher must zero dx first. conv2d_dx_gather.cu turns the loops around.
//
// Layout: dy (B,M,Ho,Wo), w (M,C,K,K), dx (B,C,H,W), float32 NCHW. Everything at run time.
// Grid: ceil(B*M*Ho*Wo / BLOCK) blocks of BLOCK threads (1-D; a grid-stride loop covers any rest).

#ifndef BLOCK
#define BLOCK 256
#endif

__global__ void conv2d_dx_scatter(const float* __restrict__ dy, const float* __restrict__ w,
                                  float* __restrict__ dx, int B, int C, int M, int H, int W, int K,
                                  int pad, int stride)
{
    const int Ho = (H + 2 * pad - K) / stride + 1;
    const int Wo = (W + 2 * pad - K) / stride + 1;
    const int total = B * M * Ho * Wo;
    for (int i = blockIdx.x * BLOCK + threadIdx.x; i < total; i += gridDim.x * BLOCK) {
        // Consecutive threads take consecutive ox: coalesced reads of dy, neighbouring atomics.
        const int ox = i % Wo;
        const int oy = (i / Wo) % Ho;
        const int m = (i / (Wo * Ho)) % M;
        const int b = i / (Wo * Ho * M);
        const float g = dy[i];
        for (int c = 0; c < C; ++c) {
            for (int ky = 0; ky < K; ++ky) {
                const int iy = oy * stride + ky - pad;
                if (iy < 0 || iy >= H) continue;           // a padding row
                for (int kx = 0; kx < K; ++kx) {
                    const int ix = ox * stride + kx - pad;
                    if (ix < 0 || ix >= W) continue;       // a padding column
                    atomicAdd(&dx[((b * C + c) * H + iy) * W + ix], g * __ldg(&w[((m * C + c) * K + ky) * K + kx]));
                }
            }
        }
    }
}
