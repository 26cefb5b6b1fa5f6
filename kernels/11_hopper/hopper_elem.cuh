// hopper_elem.cuh — the element type of the layers' wgmma kernels (conv2d_hopper.cu,
// conv2d_hopper_dw.cu, splitk_reduce.cu), by the DTYPE define: 0 fp16 (half), 1 bf16
// (__nv_bfloat16). elem and elem2 are the type and its pair, WG_TYPE the wgmma operand kind
// (hopper.cuh's WG_F16 or WG_BF16), to_float(v), to_elem(v) and to_elem2(a, b) the conversions (to
// nearest even, as torch rounds), to_bits2(a, b) the pair's 32 bits (a plain word to store: the
// emulator checks a word's store against the copy engine's reads, as it does not a pair's).
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#ifndef DTYPE
#define DTYPE 0
#endif

#if DTYPE == 0
typedef half elem;
typedef half2 elem2;
#define WG_TYPE WG_F16
__device__ __forceinline__ float to_float(elem v) { return __half2float(v); }
__device__ __forceinline__ elem to_elem(float v) { return __float2half_rn(v); }
__device__ __forceinline__ elem2 to_elem2(float a, float b) { return __floats2half2_rn(a, b); }
#elif DTYPE == 1
typedef __nv_bfloat16 elem;
typedef __nv_bfloat162 elem2;
#define WG_TYPE WG_BF16
__device__ __forceinline__ float to_float(elem v) { return __bfloat162float(v); }
__device__ __forceinline__ elem to_elem(float v) { return __float2bfloat16_rn(v); }
__device__ __forceinline__ elem2 to_elem2(float a, float b) { return __floats2bfloat162_rn(a, b); }
#else
#error "DTYPE: 0 (fp16) or 1 (bf16)"
#endif

__device__ __forceinline__ unsigned to_bits2(float a, float b) {
    elem2 v = to_elem2(a, b);
    unsigned u;
    memcpy(&u, &v, 4);
    return u;
}
