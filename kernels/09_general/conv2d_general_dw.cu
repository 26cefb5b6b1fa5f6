// Chapter 9: the general direct convolution, dE/dW, for every layer conv2d_general.cu takes.
//
//   dw[m][c][ky][kx] = sum over b, oy, ox of
//       dy[b][m][oy][ox] * x[b][g*C/groups + c][oy*sh - ph + ky*dh][ox*sw - pw + kx*dw].
//
// A weight's sum runs over B*Ho*Wo pixels (a depthwise layer of batch 32 at 56x56: 100,352),
// while a layer may have few weights (C*9 for a depthwise 3x3): one thread per weight would leave
// most of a GPU idle and walk a long serial chain. So, like chapter 8's dW kernels:
//  - a block takes one (map, channel) pair and TAPS taps of its mask (blockIdx.y picks which),
//    its threads take the pixels, ox fastest (coalesced reads of dy and, at stride 1, of x), each
//    loads one dy value and multiplies it into its TAPS register accumulators;
//  - blockIdx.z splits the pixels when pairs x tap chunks alone are too few blocks to fill the GPU;
//  - the block's sums meet in shared memory (a tree, fixed order), and one float per (split,
//    weight) goes to `partial`; conv2d_general_dw_finish adds the splits in order and rounds once.
// No atomics: the same bits on every run.
//
// *_f32: float x, dy and dw; *_f16: half x, dy and dw, float sums (general.cuh). partial is float.
// Grid: (M * C/groups, ceil(Kh*Kw / TAPS), splits), block (BLOCK, 1, 1); finish: a flat grid.

#include "general.cuh"

#ifndef TAPS
#define TAPS 12                // taps per block: a 3x3 mask in one block, 7x7 in 5; 59 registers, no spills
#endif
#ifndef BLOCK
#define BLOCK 256
#endif
static_assert((BLOCK & (BLOCK - 1)) == 0 && BLOCK >= 32 && BLOCK <= 1024, "BLOCK: a power of two, 32 to 1024");
static_assert(BLOCK >= TAPS, "thread t < TAPS writes tap t");

template <class In, class Part>
__device__ __forceinline__ void conv2d_general_dw_body(In x, In dy, Part partial,
        int B, int C, int H, int W, int M, int Kh, int Kw, int Ho, int Wo,
        int sh, int sw, int ph, int pw, int dh, int dw, int groups, long long per_split)
{
    __shared__ float s[TAPS][BLOCK];
    const int Cg = C / groups, Mg = M / groups, KK = Kh * Kw;
    const int m = blockIdx.x / Cg, cl = blockIdx.x % Cg;
    const int c = (m / Mg) * Cg + cl;                     // the input channel of (m, cl)
    const int t0 = blockIdx.y * TAPS;

    // Where each tap reads, relative to (oy*sh, ox*sw). A tap past the mask's end reads row H,
    // which the bounds test below always rejects.
    int offy[TAPS], offx[TAPS];
#pragma unroll
    for (int t = 0; t < TAPS; ++t) {
        const int tap = t0 + t;
        offy[t] = tap < KK ? (tap / Kw) * dh - ph : H;
        offx[t] = tap < KK ? (tap % Kw) * dw - pw : 0;
    }

    float acc[TAPS];
#pragma unroll
    for (int t = 0; t < TAPS; ++t) acc[t] = 0.0f;

    const long long N = (long long)B * Ho * Wo;
    const long long p0 = blockIdx.z * per_split;
    const long long p1 = p0 + per_split < N ? p0 + per_split : N;
    for (long long p = p0 + threadIdx.x; p < p1; p += BLOCK) {
        const int ox = (int)(p % Wo);
        const long long r = p / Wo;
        const int oy = (int)(r % Ho);
        const int b = (int)(r / Ho);
        const float d = to_f(dy[((long long)b * M + m) * Ho * Wo + oy * Wo + ox]);
        const auto xc = x + ((long long)b * C + c) * H * W;
        const int iy0 = oy * sh, ix0 = ox * sw;
#pragma unroll
        for (int t = 0; t < TAPS; ++t) {
            const int iy = iy0 + offy[t], ix = ix0 + offx[t];
            if (iy >= 0 && iy < H && ix >= 0 && ix < W)
                acc[t] += d * to_f(xc[iy * W + ix]);
        }
    }

    // The block's BLOCK partial sums of each tap, added as a tree in shared memory.
#pragma unroll
    for (int t = 0; t < TAPS; ++t) s[t][threadIdx.x] = acc[t];
    __syncthreads();
    for (int half = BLOCK / 2; half > 0; half >>= 1) {
        if (threadIdx.x < half) {
#pragma unroll
            for (int t = 0; t < TAPS; ++t) s[t][threadIdx.x] += s[t][threadIdx.x + half];
        }
        __syncthreads();
    }
    const int t = threadIdx.x;
    if (t < TAPS && t0 + t < KK)
        partial[(long long)blockIdx.z * M * Cg * KK + ((long long)m * Cg + cl) * KK + t0 + t] = s[t][0];
}

// dw[i] = sum over j < splits of partial[j][i], in order, rounded once to dw's type. Flat grid-stride.
template <class Part, class Out>
__device__ __forceinline__ void conv2d_general_dw_finish_body(Part partial, Out dw, int splits, long long n)
{
    for (long long i = (long long)blockIdx.x * BLOCK + threadIdx.x; i < n; i += (long long)gridDim.x * BLOCK) {
        float v = 0.0f;
        for (int j = 0; j < splits; ++j) v += partial[j * n + i];
        put(dw[i], v);
    }
}

__global__ void __launch_bounds__(BLOCK)
conv2d_general_dw_f32(const float* __restrict__ x, const float* __restrict__ dy, float* __restrict__ partial,
                      int B, int C, int H, int W, int M, int Kh, int Kw, int Ho, int Wo,
                      int sh, int sw, int ph, int pw, int dh, int dw, int groups, long long per_split)
{
    conv2d_general_dw_body(x, dy, partial, B, C, H, W, M, Kh, Kw, Ho, Wo, sh, sw, ph, pw, dh, dw, groups, per_split);
}

__global__ void __launch_bounds__(BLOCK)
conv2d_general_dw_f16(const half* __restrict__ x, const half* __restrict__ dy, float* __restrict__ partial,
                      int B, int C, int H, int W, int M, int Kh, int Kw, int Ho, int Wo,
                      int sh, int sw, int ph, int pw, int dh, int dw, int groups, long long per_split)
{
    conv2d_general_dw_body(x, dy, partial, B, C, H, W, M, Kh, Kw, Ho, Wo, sh, sw, ph, pw, dh, dw, groups, per_split);
}

__global__ void __launch_bounds__(BLOCK)
conv2d_general_dw_finish_f32(const float* __restrict__ partial, float* __restrict__ dw, int splits, long long n)
{
    conv2d_general_dw_finish_body(partial, dw, splits, n);
}

__global__ void __launch_bounds__(BLOCK)
conv2d_general_dw_finish_f16(const float* __restrict__ partial, half* __restrict__ dw, int splits, long long n)
{
    conv2d_general_dw_finish_body(partial, dw, splits, n);
}
