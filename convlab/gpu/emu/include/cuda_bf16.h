// cuda_bf16.h for convlab's emulator: __nv_bfloat16 and __nv_bfloat162, the conversions the
// course's kernels use, bit-exact with torch.bfloat16 (float -> bf16 rounds to nearest even; NaN
// stays a quiet NaN). Arithmetic goes through float, as the kernels do.
#pragma once
#include <cstdint>
#include <cstring>
#include "cuda_fp16.h"

namespace clemu {
static inline uint16_t f2bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
#ifdef CONVLAB_EMULATOR
    if (__builtin_expect(u == CLEMU_WGMMA_POISON, 0)) clemu_poison_read();
#endif
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);     // NaN: quiet
    u += 0x7fffu + ((u >> 16) & 1u);                                               // to nearest, ties to even
    return (uint16_t)(u >> 16);
}
static inline float bf2f(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
}

struct __nv_bfloat16 {
    uint16_t __x;
    __nv_bfloat16() = default;
    __nv_bfloat16(float f) : __x(clemu::f2bf(f)) {}
    __nv_bfloat16(double d) : __x(clemu::f2bf((float)d)) {}
    __nv_bfloat16(int i) : __x(clemu::f2bf((float)i)) {}
    operator float() const { return clemu::bf2f(__x); }
    __nv_bfloat16& operator=(float f) { __x = clemu::f2bf(f); return *this; }
};
struct __align__(4) __nv_bfloat162 {
    __nv_bfloat16 x, y;
    __nv_bfloat162() = default;
    __nv_bfloat162(__nv_bfloat16 a, __nv_bfloat16 b) : x(a), y(b) {}
};
typedef __nv_bfloat16 nv_bfloat16;
typedef __nv_bfloat162 nv_bfloat162;
CLEMU_COUNTED(__nv_bfloat16, 0) CLEMU_COUNTED(__nv_bfloat162, 2)   // the profiler counts their loads and stores

static inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
static inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
static inline float __bfloat162float(__nv_bfloat16 h) { return (float)h; }
static inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
    return __nv_bfloat162(__nv_bfloat16(a), __nv_bfloat16(b));
}
static inline __nv_bfloat162 __float22bfloat162_rn(float2 f) { return __floats2bfloat162_rn(f.x, f.y); }
static inline float2 __bfloat1622float2(__nv_bfloat162 h) { return make_float2((float)h.x, (float)h.y); }
static inline float __low2float(__nv_bfloat162 h) { return (float)h.x; }
static inline float __high2float(__nv_bfloat162 h) { return (float)h.y; }
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
static inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short s) { __nv_bfloat16 h; h.__x = s; return h; }
static CLEMU_INLINE __nv_bfloat16 __ldg(const __nv_bfloat16* p) { return clemu::ldg(p); }
static CLEMU_INLINE __nv_bfloat162 __ldg(const __nv_bfloat162* p) { return clemu::ldg(p); }
