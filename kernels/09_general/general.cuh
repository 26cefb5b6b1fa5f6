// Chapter 9: what the general kernels (conv2d_general*.cu) share: one source for float and half.
//
// Each kernel's body is a __device__ template over its pointer types, and the file defines two
// __global__ entry points around it, *_f32 (float tensors) and *_f16 (half tensors). In half, the
// input, the mask, the bias and the output are half in global memory, every product and sum is in
// float, and the result is rounded to half once, at the store. That is what cuDNN and torch do
// for fp16 convolutions, and why these kernels' fp16 error does not grow with the reduction
// length as chapter 6's half accumulators did: it is the inputs' and the output's rounding.
//
// The bodies take their pointers as template types (not `const T*`): on the GPU they are plain
// pointers; on the emulator they stay bounds-checked, so a wrong offset is caught where it is used.
// Pointers into a tensor are named `auto` for the same reason.
#pragma once
#include <cuda_fp16.h>

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(half v) { return __half2float(v); }
__device__ __forceinline__ void put(float& dst, float v) { dst = v; }
__device__ __forceinline__ void put(half& dst, float v) { dst = __float2half_rn(v); }
// The emulator's race detector hands out a checked element (an object that stands for the
// element) where the GPU has a float& or half&: these take it too, so the file builds with the
// detector and its stores are checked. On the GPU the two overloads above are the ones called.
template <class E> __device__ __forceinline__ auto put(E&& dst, float v) -> decltype(dst = v, void()) { dst = v; }
