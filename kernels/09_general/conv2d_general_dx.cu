// Chapter 9: the general direct convolution, dE/dX: chapter 8's gather (a transposed convolution
// with the flipped mask), for every layer conv2d_general.cu takes.
//
//   dx[b][c][iy][ix] = sum over maps m of c's group, ky, kx with
//       iy + ph - ky*dh = oy*sh  and  ix + pw - kx*dw = ox*sw  (0 <= oy < Ho, 0 <= ox < Wo)
//   of dy[b][m][oy][ox] * w[m][c - g*C/groups][ky][kx].
//
// One thread per dx element, ix fastest (coalesced stores), no atomics, so the result is the same
// on every run. For each tap the thread checks whether some output read this input through it:
// with stride s only one tap in s along each axis did (the divisibility test). Taps outer, maps
// inner: the test is done once per tap, not once per (tap, map). The flat index and plane offsets
// are 64-bit; indices inside a plane are int.
//
// conv2d_general_dx_f32: float tensors; conv2d_general_dx_f16: half tensors, float sums (general.cuh).
// Grid: (min(ceil(B*C*H*W / BLOCK), cap), 1, 1), block (BLOCK, 1, 1).

#include "general.cuh"

#ifndef BLOCK
#define BLOCK 256
#endif

template <class In, class Out>
__device__ __forceinline__ void conv2d_general_dx_body(In dy, In w, Out dx,
        int B, int C, int H, int W, int M, int Kh, int Kw, int Ho, int Wo,
        int sh, int sw, int ph, int pw, int dh, int dw, int groups)
{
    const int Cg = C / groups, Mg = M / groups;
    const long long total = (long long)B * C * H * W;
    const long long step = (long long)gridDim.x * BLOCK;
    const long long P = (long long)Ho * Wo;
    const long long wstride = (long long)Cg * Kh * Kw;        // from one map's mask to the next
    for (long long i = (long long)blockIdx.x * BLOCK + threadIdx.x; i < total; i += step) {
        const int ix = (int)(i % W);
        const long long r = i / W;
        const int iy = (int)(r % H);
        const int c = (int)((r / H) % C);
        const int b = (int)(r / ((long long)H * C));
        const int g = c / Cg, cl = c - g * Cg;
        const auto dyg = dy + ((long long)b * M + (long long)g * Mg) * P;        // this group's maps
        const auto wg = w + ((long long)g * Mg * Cg + cl) * Kh * Kw;             // w[g*Mg][cl][0][0]

        float acc = 0.0f;
        for (int ky = 0; ky < Kh; ++ky) {
            const int ty = iy + ph - ky * dh;                  // = oy * sh for the output that read it
            if (ty < 0) break;                                 // ty only falls as ky grows
            if (ty % sh) continue;
            const int oy = ty / sh;
            if (oy >= Ho) continue;
            for (int kx = 0; kx < Kw; ++kx) {
                const int tx = ix + pw - kx * dw;
                if (tx < 0) break;
                if (tx % sw) continue;
                const int ox = tx / sw;
                if (ox >= Wo) continue;
                const auto d = dyg + oy * Wo + ox;
                const auto k = wg + ky * Kw + kx;
                for (int m = 0; m < Mg; ++m)
                    acc += to_f(d[m * P]) * to_f(k[m * wstride]);
            }
        }
        put(dx[i], acc);
    }
}

__global__ void __launch_bounds__(BLOCK)
conv2d_general_dx_f32(const float* __restrict__ dy, const float* __restrict__ w, float* __restrict__ dx,
                      int B, int C, int H, int W, int M, int Kh, int Kw, int Ho, int Wo,
                      int sh, int sw, int ph, int pw, int dh, int dw, int groups)
{
    conv2d_general_dx_body(dy, w, dx, B, C, H, W, M, Kh, Kw, Ho, Wo, sh, sw, ph, pw, dh, dw, groups);
}

__global__ void __launch_bounds__(BLOCK)
conv2d_general_dx_f16(const half* __restrict__ dy, const half* __restrict__ w, half* __restrict__ dx,
                      int B, int C, int H, int W, int M, int Kh, int Kw, int Ho, int Wo,
                      int sh, int sw, int ph, int pw, int dh, int dw, int groups)
{
    conv2d_general_dx_body(dy, w, dx, B, C, H, W, M, Kh, Kw, Ho, Wo, sh, sw, ph, pw, dh, dw, groups);
}
