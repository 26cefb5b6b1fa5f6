// Requires sm_80 or newer: cvt.rna.tf32.f32
//
// Chapter 12's passes around the tensor-core convolutions (convlab/ops/tf32.py launches them).
//
// nhwc_tf32: x's channels made the fastest axis, padded with zeros to C4 (a multiple of 4: 16-byte
// rows for cp.async and the copy engine), and, as they pass, each element
//   MODE 0  copied as it is (conv2d_tf32_mma rounds or splits in registers);
//   MODE 1  rounded to TF32: hi = tf32_round(v);
//   MODE 2  split: hi, lo = tf32_split(v) (3xTF32; conv2d_wgmma_tf32 reads its operands from shared
//           memory through descriptors, so the split is made here, once per element).
// x (B, C, P) by strides (x_bs, x_cs, x_ps: an NCHW tensor has (C*P, P, 1), a channels_last one
// (P*C, 1, C)), P = H*W pixels; hi and lo (B, P, C4) contiguous. The mask (M, C, Kh, Kw) is the
// same pass with its maps as the images and its taps as the pixels: (M, Kh, Kw, C4).
// A block moves a 32-channel x 32-pixel tile through shared memory, so both the read (along the
// pixels of an NCHW x) and the write (along the channels) are whole rows of a warp.
// Grid (ceil(P/32), ceil(C4/32), B), block (32, 8).
//
// tf32_splitk_reduce: y = the sum of `splits` partial outputs (each laid out as y, NCHW) plus the
// bias, in a fixed order (the same bits every run). One thread per output element.
#include "tf32.cuh"

#ifndef MODE
#define MODE 0
#endif

__global__ void nhwc_tf32(const float* __restrict__ x, float* __restrict__ hi, float* __restrict__ lo, int C, int P,
                          int C4, long long x_bs, int x_cs, int x_ps)
{
    __shared__ float tile[32][33];                   // [channel][pixel], padded: the transposed read has no conflicts
    const int b = blockIdx.z, c0 = blockIdx.y * 32, p0 = blockIdx.x * 32;
    for (int r = threadIdx.y; r < 32; r += 8) {
        const int c = c0 + r, p = p0 + threadIdx.x;
        tile[r][threadIdx.x] = c < C && p < P ? x[b * x_bs + (long long)c * x_cs + (long long)p * x_ps] : 0.f;
    }
    __syncthreads();
    for (int r = threadIdx.y; r < 32; r += 8) {
        const int p = p0 + r, c = c0 + threadIdx.x;
        if (p >= P || c >= C4) continue;
        const float v = tile[threadIdx.x][r];
        const long long o = ((long long)b * P + p) * C4 + c;
#if MODE == 0
        hi[o] = v;
#elif MODE == 1
        hi[o] = tf32_round(v);
#else
        float h, l;
        tf32_split(v, h, l);
        hi[o] = h;
        lo[o] = l;
#endif
    }
}

__global__ void tf32_splitk_reduce(const float* __restrict__ ws, const float* __restrict__ bias, float* __restrict__ y,
                                   int has_bias, long long total, int M, int HoWo, int splits)
{
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total;
         e += (long long)gridDim.x * blockDim.x) {
        float v = ws[e];
        for (int z = 1; z < splits; z++) v += ws[z * total + e];
        if (has_bias) v += bias[(e / HoWo) % M];
        y[e] = v;
    }
}
