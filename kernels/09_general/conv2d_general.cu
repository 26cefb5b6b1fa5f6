// Chapter 9: the general direct convolution, forward. Every layer torch's conv2d takes, one kernel.
//
//   y[b][m][oy][ox] = bias[m] + sum over c < C/groups, ky < Kh, kx < Kw of
//       x[b][g*C/groups + c][oy*sh - ph + ky*dh][ox*sw - pw + kx*dw] * w[m][c][ky][kx],
//   g = m / (M/groups), the group of map m; a tap outside the input reads zero.
//
// Groups (grouped and depthwise, groups == C), dilation, non-square masks, per-axis stride and
// padding are all run-time arguments, so one compiled kernel serves every shape: this is the
// kernel the dispatcher falls back on when no faster family takes a layer. Padding is the top and
// left amount only; the output size (Ho, Wo) comes from the caller (torch's shape rules), so
// torch's asymmetric 'same' padding of even masks (one more row/column at the bottom/right) needs
// nothing here: those taps fall outside the input like any other padding.
//
// Mapping: chapter 2's flat grid-stride loop, one thread per output, ox fastest: a warp writes 32
// consecutive outputs of a row (coalesced) and, at stride 1, reads 32 consecutive inputs per tap.
// The flat index and the offsets of whole planes are 64-bit (B*M*Ho*Wo may pass 2^31); indices
// inside one plane are int.
//
// conv2d_general_f32: float tensors; conv2d_general_f16: half tensors, float sums (general.cuh).
// has_bias=0: the bias pointer is never read (the launcher passes any tensor of the type there).
// Grid: (min(ceil(B*M*Ho*Wo / BLOCK), cap), 1, 1), block (BLOCK, 1, 1).

#include "general.cuh"

#ifndef BLOCK
#define BLOCK 256
#endif

template <class In, class Out>
__device__ __forceinline__ void conv2d_general_body(In x, In w, In bias, Out y,
        int B, int C, int H, int W, int M, int Kh, int Kw, int Ho, int Wo,
        int sh, int sw, int ph, int pw, int dh, int dw, int groups, int has_bias)
{
    const int Cg = C / groups, Mg = M / groups;
    const long long total = (long long)B * M * Ho * Wo;
    const long long step = (long long)gridDim.x * BLOCK;
    for (long long i = (long long)blockIdx.x * BLOCK + threadIdx.x; i < total; i += step) {
        const int ox = (int)(i % Wo);
        const long long r = i / Wo;
        const int oy = (int)(r % Ho);
        const int m = (int)((r / Ho) % M);
        const int b = (int)(r / ((long long)Ho * M));
        const int iy0 = oy * sh - ph, ix0 = ox * sw - pw;
        const auto xg = x + ((long long)b * C + (long long)(m / Mg) * Cg) * H * W;   // this group's channels
        const auto wm = w + (long long)m * Cg * Kh * Kw;

        float acc = 0.0f;
        for (int c = 0; c < Cg; ++c) {
            const auto xc = xg + (long long)c * H * W;
            const auto wc = wm + c * Kh * Kw;
            for (int ky = 0; ky < Kh; ++ky) {
                const int iy = iy0 + ky * dh;
                if (iy < 0 || iy >= H) continue;               // a padding row: contributes zero
                for (int kx = 0; kx < Kw; ++kx) {
                    const int ix = ix0 + kx * dw;
                    if (ix >= 0 && ix < W)
                        acc += to_f(xc[iy * W + ix]) * to_f(wc[ky * Kw + kx]);
                }
            }
        }
        if (has_bias) acc += to_f(bias[m]);
        put(y[i], acc);
    }
}

__global__ void __launch_bounds__(BLOCK)
conv2d_general_f32(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ bias,
                   float* __restrict__ y, int B, int C, int H, int W, int M, int Kh, int Kw, int Ho, int Wo,
                   int sh, int sw, int ph, int pw, int dh, int dw, int groups, int has_bias)
{
    conv2d_general_body(x, w, bias, y, B, C, H, W, M, Kh, Kw, Ho, Wo, sh, sw, ph, pw, dh, dw, groups, has_bias);
}

__global__ void __launch_bounds__(BLOCK)
conv2d_general_f16(const half* __restrict__ x, const half* __restrict__ w, const half* __restrict__ bias,
                   half* __restrict__ y, int B, int C, int H, int W, int M, int Kh, int Kw, int Ho, int Wo,
                   int sh, int sw, int ph, int pw, int dh, int dw, int groups, int has_bias)
{
    conv2d_general_body(x, w, bias, y, B, C, H, W, M, Kh, Kw, Ho, Wo, sh, sw, ph, pw, dh, dw, groups, has_bias);
}
