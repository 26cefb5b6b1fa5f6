// Chapter 8, step 3: dE/dW with atomics, the course's pseudo-code parallelised as it stands.
//
//   for every (b, m, oy, ox) and every (c, ky, kx):
//       dw[m][c][ky][kx] += dy[b][m][oy][ox] * x[b][c][oy*s + ky - pad][ox*s + kx - pad]
//
// One thread per element of dE/dY, as in conv2d_dx_scatter.cu. The difference is where the sums
// land: dx has as many elements as x, but dw has only M*C*K*K of them (lenet_c1: 196), and every
// thread adds into all of its map's C*K*K. So B*Ho*Wo threads (lenet_c1: 64 M) queue on each
// single address. Atomics on one address are serialised in the L2 slice that owns it, whatever
// the rest of the GPU is doing: this kernel runs at the speed of a few hundred L2 atomic units,
// not of 16,896 FP32 lanes. Measure it, then see conv2d_dw_direct.cu: sum in registers first, then
// in shared memory, and let each block send one value per weight (or none: a second pass).
//
// The float sum depends on the order the atomics arrive in: not bit-for-bit repeatable.
// The launcher must zero dw first.
//
// Layout: x (B,C,H,W), dy (B,M,Ho,Wo), dw (M,C,K,K), float32 NCHW. Everything at run time.
// Grid: ceil(B*M*Ho*Wo / BLOCK) blocks of BLOCK threads (1-D, grid-stride loop).

#ifndef BLOCK
#define BLOCK 256
#endif

__global__ void conv2d_dw_atomic(const float* __restrict__ x, const float* __restrict__ dy,
                                 float* __restrict__ dw, int B, int C, int M, int H, int W, int K,
                                 int pad, int stride)
{
    const int Ho = (H + 2 * pad - K) / stride + 1;
    const int Wo = (W + 2 * pad - K) / stride + 1;
    const int total = B * M * Ho * Wo;
    for (int i = blockIdx.x * BLOCK + threadIdx.x; i < total; i += gridDim.x * BLOCK) {
        const int ox = i % Wo;
        const int oy = (i / Wo) % Ho;
        const int m = (i / (Wo * Ho)) % M;
        const int b = i / (Wo * Ho * M);
        const float g = dy[i];
        for (int c = 0; c < C; ++c) {
            for (int ky = 0; ky < K; ++ky) {
                const int iy = oy * stride + ky - pad;
                if (iy < 0 || iy >= H) continue;
                for (int kx = 0; kx < K; ++kx) {
                    const int ix = ox * stride + kx - pad;
                    if (ix < 0 || ix >= W) continue;
                    atomicAdd(&dw[((m * C + c) * K + ky) * K + kx], g * __ldg(&x[((b * C + c) * H + iy) * W + ix]));
                }
            }
        }
    }
}
