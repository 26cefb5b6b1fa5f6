// cuda_fp16.h for convlab's emulator: half and half2 bit-exact with numpy.float16.
// Each operation is computed in float (or double for fma) and rounded once to half,
// round-to-nearest-even; for +,-,*,/ this equals a correctly rounded half operation
// (float's 24 bits >= 2*11+2), which is what the GPU computes.
#pragma once
#include <cstdint>
#include <cmath>
#include <cstring>

namespace clemu {
static inline uint16_t f2h(float f) {
    uint32_t u; memcpy(&u, &f, 4);
    uint32_t sign = u & 0x80000000u;
    u ^= sign;
    uint16_t o;
    if (u >= 0x47800000u) {                                             // >= 65536, inf, nan
#ifdef CONVLAB_EMULATOR
        if (__builtin_expect(u == CLEMU_WGMMA_POISON, 0)) clemu_poison_read();
#endif
        o = u > 0x7f800000u ? 0x7e00 : 0x7c00;
    }
    else if (u < 0x38800000u) {                                         // half subnormal or zero
        float g; memcpy(&g, &u, 4);
        g += 0.5f;                                                      // aligns the 10 bits, rounds to even
        uint32_t gu; memcpy(&gu, &g, 4);
        o = (uint16_t)(gu - 0x3f000000u);
    } else {
        uint32_t odd = (u >> 13) & 1u;
        u += 0xc8000fffu + odd;                                         // rebias exponent, round to even
        o = (uint16_t)(u >> 13);
    }
    return (uint16_t)(o | (sign >> 16));
}
static inline float h2f(uint16_t h) {
    uint32_t u = (uint32_t)(h & 0x7fff) << 13, e = u & 0x0f800000u;
    u += 0x38000000u;
    float f;
    if (e == 0x0f800000u) u += 0x38000000u;                             // inf, nan
    else if (e == 0) { u += 0x00800000u; memcpy(&f, &u, 4); f -= 6.10351562e-05f; memcpy(&u, &f, 4); }
    u |= (uint32_t)(h & 0x8000) << 16;
    memcpy(&f, &u, 4);
    return f;
}
}

namespace clemu {
// double -> half with one rounding (to nearest, ties to even). Going through float would round
// twice, which is wrong for an fma's exact result about once in 20,000.
// `tail` is what rounding to double lost (the exact value is d + tail): it breaks a false tie.
static inline uint16_t d2h(double d, double tail = 0.0) {
    if (d != d) return 0x7e00;
    uint16_t sign = std::signbit(d) ? 0x8000 : 0;
    double m = std::fabs(d), tail_m = sign ? -tail : tail;
    if (m >= 65520.0) return sign | 0x7c00;
    uint16_t h = f2h((float)m), best = h;          // within one unit of the answer
    double err = std::fabs((double)h2f(h) - m);
    for (int dh = -1; dh <= 1; dh += 2) {
        int c = (int)h + dh;
        if (c < 0 || c > 0x7bff) continue;
        double e = std::fabs((double)h2f((uint16_t)c) - m);
        bool wins_tie = tail_m != 0.0 ? (tail_m > 0) == (c > (int)best) : (c & 1) == 0;
        if (e < err || (e == err && wins_tie)) { best = (uint16_t)c; err = e; }
    }
    return sign | best;
}
}

struct __half {
    uint16_t __x;
    __half() = default;
    __half(float f) : __x(clemu::f2h(f)) {}
    __half(double d) : __x(clemu::f2h((float)d)) {}
    __half(int i) : __x(clemu::f2h((float)i)) {}
    __half(unsigned i) : __x(clemu::f2h((float)i)) {}
    __half(long long i) : __x(clemu::f2h((float)i)) {}
    operator float() const { return clemu::h2f(__x); }
    __half& operator=(float f) { __x = clemu::f2h(f); return *this; }
    __half& operator+=(const __half& o) { *this = __half((float)*this + (float)o); return *this; }
    __half& operator-=(const __half& o) { *this = __half((float)*this - (float)o); return *this; }
    __half& operator*=(const __half& o) { *this = __half((float)*this * (float)o); return *this; }
    __half& operator/=(const __half& o) { *this = __half((float)*this / (float)o); return *this; }
};
struct __half_raw { uint16_t x; };
struct __align__(4) __half2 {
    __half x, y;
    __half2() = default;
    __half2(__half a, __half b) : x(a), y(b) {}
    __half2& operator+=(const __half2& o);
    __half2& operator*=(const __half2& o);
};
typedef __half half;
typedef __half2 half2;
CLEMU_COUNTED(__half, 0) CLEMU_COUNTED(__half2, 2)   // the profiler counts their loads and stores

static inline __half clemu_hbits(uint16_t b) { __half h; h.__x = b; return h; }
static inline __half operator+(__half a, __half b) { return __half((float)a + (float)b); }
static inline __half operator-(__half a, __half b) { return __half((float)a - (float)b); }
static inline __half operator*(__half a, __half b) { return __half((float)a * (float)b); }
static inline __half operator/(__half a, __half b) { return __half((float)a / (float)b); }
static inline __half operator-(__half a) { return clemu_hbits((uint16_t)(a.__x ^ 0x8000)); }
static inline bool operator==(__half a, __half b) { return (float)a == (float)b; }
static inline bool operator!=(__half a, __half b) { return (float)a != (float)b; }
static inline bool operator<(__half a, __half b) { return (float)a < (float)b; }
static inline bool operator>(__half a, __half b) { return (float)a > (float)b; }
static inline bool operator<=(__half a, __half b) { return (float)a <= (float)b; }
static inline bool operator>=(__half a, __half b) { return (float)a >= (float)b; }

static inline __half __float2half(float f) { return __half(f); }
static inline __half __float2half_rn(float f) { return __half(f); }
static inline __half __double2half(double d) { return __half((float)d); }
static inline float __half2float(__half h) { return (float)h; }
static inline __half __int2half_rn(int i) { return __half((float)i); }
static inline int __half2int_rn(__half h) { return (int)nearbyintf((float)h); }
static inline int __half2int_rz(__half h) { return (int)(float)h; }
static inline short __half_as_short(__half h) { return (short)h.__x; }
static inline unsigned short __half_as_ushort(__half h) { return h.__x; }
static inline __half __short_as_half(short s) { return clemu_hbits((uint16_t)s); }
static inline __half __ushort_as_half(unsigned short s) { return clemu_hbits(s); }
static inline __half __hadd(__half a, __half b) { return a + b; }
static inline __half __hsub(__half a, __half b) { return a - b; }
static inline __half __hmul(__half a, __half b) { return a * b; }
static inline __half __hdiv(__half a, __half b) { return a / b; }
static inline __half __hneg(__half a) { return -a; }
static inline __half __habs(__half a) { return clemu_hbits((uint16_t)(a.__x & 0x7fff)); }
static inline __half __hfma(__half a, __half b, __half c) {   // a*b exact in double; one rounding
    double p = (double)(float)a * (double)(float)b, q = (double)(float)c, s = p + q;
    double t = std::fabs(p) >= std::fabs(q) ? (p - s) + q : (q - s) + p;   // Fast2Sum: the exact error
    return clemu_hbits(clemu::d2h(s, t)); }
static inline __half __hmax(__half a, __half b) { return (float)a < (float)b ? b : a; }
static inline __half __hmin(__half a, __half b) { return (float)b < (float)a ? b : a; }
static inline bool __heq(__half a, __half b) { return a == b; }
static inline bool __hlt(__half a, __half b) { return a < b; }
static inline bool __hgt(__half a, __half b) { return a > b; }
static inline bool __hisnan(__half a) { return (a.__x & 0x7fff) > 0x7c00; }
static inline __half hsqrt(__half a) { return __half(sqrtf((float)a)); }
static inline __half hexp(__half a) { return __half(expf((float)a)); }
static inline __half hlog(__half a) { return __half(logf((float)a)); }
static inline __half hrcp(__half a) { return __half(1.0f / (float)a); }
static CLEMU_INLINE __half __ldg(const __half* p) { return clemu::ldg(p); }

static inline __half2 __halves2half2(__half a, __half b) { return __half2(a, b); }
static inline __half2 __half2half2(__half a) { return __half2(a, a); }
static inline __half2 __float2half2_rn(float f) { return __half2(__half(f), __half(f)); }
static inline __half2 __floats2half2_rn(float a, float b) { return __half2(__half(a), __half(b)); }
static inline float2 __half22float2(__half2 h) { return make_float2((float)h.x, (float)h.y); }
static inline __half2 __float22half2_rn(float2 f) { return __half2(__half(f.x), __half(f.y)); }
static inline float __low2float(__half2 h) { return (float)h.x; }
static inline float __high2float(__half2 h) { return (float)h.y; }
static inline __half __low2half(__half2 h) { return h.x; }
static inline __half __high2half(__half2 h) { return h.y; }
static inline __half2 __lows2half2(__half2 a, __half2 b) { return __half2(a.x, b.x); }
static inline __half2 __highs2half2(__half2 a, __half2 b) { return __half2(a.y, b.y); }
static inline __half2 __lowhigh2highlow(__half2 a) { return __half2(a.y, a.x); }
static inline __half2 __hadd2(__half2 a, __half2 b) { return __half2(a.x + b.x, a.y + b.y); }
static inline __half2 __hsub2(__half2 a, __half2 b) { return __half2(a.x - b.x, a.y - b.y); }
static inline __half2 __hmul2(__half2 a, __half2 b) { return __half2(a.x * b.x, a.y * b.y); }
static inline __half2 __h2div(__half2 a, __half2 b) { return __half2(a.x / b.x, a.y / b.y); }
static inline __half2 __hfma2(__half2 a, __half2 b, __half2 c) { return __half2(__hfma(a.x, b.x, c.x), __hfma(a.y, b.y, c.y)); }
static inline __half2 __hneg2(__half2 a) { return __half2(-a.x, -a.y); }
static inline __half2 __hmax2(__half2 a, __half2 b) { return __half2(__hmax(a.x, b.x), __hmax(a.y, b.y)); }
static inline __half2 __hmin2(__half2 a, __half2 b) { return __half2(__hmin(a.x, b.x), __hmin(a.y, b.y)); }
static inline __half2 operator+(__half2 a, __half2 b) { return __hadd2(a, b); }
static inline __half2 operator-(__half2 a, __half2 b) { return __hsub2(a, b); }
static inline __half2 operator*(__half2 a, __half2 b) { return __hmul2(a, b); }
static inline __half2 operator/(__half2 a, __half2 b) { return __h2div(a, b); }
inline __half2& __half2::operator+=(const __half2& o) { *this = *this + o; return *this; }
inline __half2& __half2::operator*=(const __half2& o) { *this = *this * o; return *this; }
static CLEMU_INLINE __half2 __ldg(const __half2* p) { return clemu::ldg(p); }
static inline __half atomicAdd(__half* a, __half v) {
    uint16_t o = __atomic_load_n(&a->__x, __ATOMIC_RELAXED), n;
    do { n = __half(clemu::h2f(o) + (float)v).__x; } while (!__atomic_compare_exchange_n(&a->__x, &o, n, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return clemu_hbits(o); }
static inline __half2 atomicAdd(__half2* a, __half2 v) {
    __half2 r; r.x = atomicAdd(&a->x, v.x); r.y = atomicAdd(&a->y, v.y); return r; }
