// The second pass of the split-K kernels of chapter 11's layers (conv2d_hopper.cu, conv2d_hopper_dw.cu):
// out[e] = sum over s = 0, 1, ..., splits-1 of ws[s*n + e], in that order (the same bits on every
// run, whichever unit finished first), plus bias[e % NM] when has_bias, ReLU if relu, rounded once
// to elem (DTYPE: hopper_elem.cuh). ws holds `splits` fp32 copies of out's n elements.
// Grid: ceil(n / (4 * 256)) blocks of 256 threads, 4 elements a thread (float4 reads when n % 4 == 0).
#include "hopper_elem.cuh"

__global__ void splitk_reduce(elem* out, const float* ws, const elem* bias, int has_bias, int relu, int splits,
                              long long n, int NM) {
    long long e0 = 4 * ((long long)blockIdx.x * blockDim.x + threadIdx.x);
    if (e0 >= n) return;
    float v[4] = {0.f, 0.f, 0.f, 0.f};
    bool whole = n % 4 == 0;                 // then every thread has 4 and float4 reads are aligned
    for (int s = 0; s < splits; s++) {
        const float* p = ws + (long long)s * n + e0;
        if (whole) {
            float4 q = *(const float4*)p;
            v[0] += q.x, v[1] += q.y, v[2] += q.z, v[3] += q.w;
        } else {
#pragma unroll
            for (int i = 0; i < 4; i++)
                if (e0 + i < n) v[i] += p[i];
        }
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if (e0 + i >= n) break;
        float r = v[i];
        if (has_bias) r += to_float(bias[(e0 + i) % NM]);
        if (relu) r = fmaxf(r, 0.f);
        out[e0 + i] = to_elem(r);
    }
}
