// Chapter 6, step 0: converting between float and half, and the cost of doing it.
//
// The layers' inputs and masks arrive in float32. Computing in half means converting them first,
// and converting the half output back when the next step wants float32. These kernels are pure
// memory traffic (4 bytes read and 2 written per value, or the reverse), so their cost is the
// roofline's memory floor: lenet_c3's input (10000x4x40x40 floats, 256 MB) takes ~0.09 ms to
// convert on an H200, its output (185 M values) ~0.27 ms to convert back: on the scale of the
// convolution itself. The chapter counts them, in the timings marked "with conversions".
//
// Rounding: __float2half rounds to nearest, ties to even (the same as torch's .half() and
// numpy's float16), so x.half() and float_to_half(x) agree bit for bit. Values beyond 65504
// become inf; below 2^-24 they round to zero (fp16 has 5 exponent bits).
//
//  - float_to_half / half_to_float: 4 values per thread, one 16-byte float load and one 8-byte
//    half store (or the reverse); the last n % 4 values one by one. The launcher checks the
//    16-byte alignment (torch's allocations are 256-byte aligned; a slice may not be).
//  - mask_to_tap_major: the half mask (M, C, K, K) reordered to (M, K, K, C), "tap-major", the
//    reduction order of conv2d_wmma.cu (there, a tile of the reduction is one (ky, kx) and a run
//    of channels). conv2d_wmma's launcher runs it on every call, so its cost is in the timing.
//
// Grid: ceil((n/4 + n%4) / BLOCK) blocks of BLOCK threads, 1-D.

#include <cuda_fp16.h>

#ifndef BLOCK
#define BLOCK 256
#endif

__global__ void float_to_half(const float* __restrict__ x, half* __restrict__ y, int n)
{
    const int i = blockIdx.x * BLOCK + threadIdx.x;
    const int n4 = n / 4;
    if (i < n4) {
        const float4 v = *(const float4*)&x[4 * i];
        const half2 lo = __floats2half2_rn(v.x, v.y), hi = __floats2half2_rn(v.z, v.w);
        uint2 out;
        out.x = *(const unsigned*)&lo;
        out.y = *(const unsigned*)&hi;
        *(uint2*)&y[4 * i] = out;
    } else if (i - n4 < n % 4) {
        const int j = 4 * n4 + (i - n4);
        y[j] = __float2half(x[j]);
    }
}

__global__ void half_to_float(const half* __restrict__ x, float* __restrict__ y, int n)
{
    const int i = blockIdx.x * BLOCK + threadIdx.x;
    const int n4 = n / 4;
    if (i < n4) {
        const uint2 in = *(const uint2*)&x[4 * i];
        const float2 lo = __half22float2(*(const half2*)&in.x), hi = __half22float2(*(const half2*)&in.y);
        *(float4*)&y[4 * i] = make_float4(lo.x, lo.y, hi.x, hi.y);
    } else if (i - n4 < n % 4) {
        const int j = 4 * n4 + (i - n4);
        y[j] = __half2float(x[j]);
    }
}

// wt[m][ky][kx][c] = w[m][c][ky][kx]; one thread per output element, consecutive threads on
// consecutive c (coalesced stores; the mask is small, its reads come from L2).
__global__ void mask_to_tap_major(const half* __restrict__ w, half* __restrict__ wt, int M, int C, int KK)
{
    const int i = blockIdx.x * BLOCK + threadIdx.x;
    if (i >= M * C * KK) return;
    const int c = i % C, tap = (i / C) % KK, m = i / (C * KK);
    wt[i] = w[(m * C + c) * KK + tap];
}
