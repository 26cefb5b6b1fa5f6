// cuda_emu.h — gives CUDA C's names a CPU meaning, so a .cu file compiles with g++ and runs in
// convlab's emulator. Force-included (g++ -include) before the kernel source. Faithful where
// students learn from it, strict where a GPU would silently misbehave.
#pragma once
#include <cmath>
#include <cfloat>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <type_traits>
#include "clemu_abi.h"

// ---- qualifiers --------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __noinline__ __attribute__((noinline))
#define __forceinline__ inline __attribute__((always_inline))
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static thread_local      // one copy per OS thread = per running block
#define __constant__                         // plain globals, set by name from Python
#define __managed__
#define __grid_constant__                    // a kernel's by-value parameter (a CUtensorMap): a copy per thread
#define __CUDA_ARCH__ 900
#define __CUDACC__ 1
#define CONVLAB_EMULATOR 1

typedef clemu_tensor_map CUtensorMap;        // cuda.h's, for cl.tensor_map (clemu_hopper.h reads it)

// ---- built-in variables -----------------------------------------------------------------
#define threadIdx (clemu_cur->idx)
#define blockIdx (clemu_cur->blk->idx)
#define blockDim (clemu_cur->blk->dim)
#define gridDim (clemu_cur->blk->grid)
#define warpSize 32

// ---- vector types ------------------------------------------------------------------------
// clemu::vec<T>: the element types besides arithmetic ones whose accesses the profiler counts
// (CUDA's vector types here, half and half2 in cuda_fp16.h), with their number of fields x, y, z, w.
namespace clemu { template <class T> struct vec { enum { counted = 0, fields = 0 }; }; }
#define CLEMU_COUNTED(V, N) namespace clemu { template <> struct vec<V> { enum { counted = 1, fields = N }; }; }
#define CLEMU_VEC2(T, N, A) struct __align__(A) N##2 { T x, y; }; CLEMU_COUNTED(N##2, 2) \
    static inline N##2 make_##N##2(T x, T y) { return N##2{x, y}; }
#define CLEMU_VEC3(T, N) struct N##3 { T x, y, z; }; CLEMU_COUNTED(N##3, 3) \
    static inline N##3 make_##N##3(T x, T y, T z) { return N##3{x, y, z}; }
#define CLEMU_VEC4(T, N, A) struct __align__(A) N##4 { T x, y, z, w; }; CLEMU_COUNTED(N##4, 4) \
    static inline N##4 make_##N##4(T x, T y, T z, T w) { return N##4{x, y, z, w}; }
CLEMU_VEC2(float, float, 8) CLEMU_VEC3(float, float) CLEMU_VEC4(float, float, 16)
CLEMU_VEC2(double, double, 16) CLEMU_VEC3(double, double) CLEMU_VEC4(double, double, 16)
CLEMU_VEC2(int, int, 8) CLEMU_VEC3(int, int) CLEMU_VEC4(int, int, 16)
CLEMU_VEC2(unsigned int, uint, 8) CLEMU_VEC4(unsigned int, uint, 16)
CLEMU_VEC2(unsigned char, uchar, 2) CLEMU_VEC3(unsigned char, uchar) CLEMU_VEC4(unsigned char, uchar, 4)
CLEMU_VEC2(char, char, 2) CLEMU_VEC4(char, char, 4)
CLEMU_VEC2(long long, longlong, 16)
static inline uint3 make_uint3(unsigned x, unsigned y, unsigned z) { return uint3{x, y, z}; }

// ---- min/max as CUDA overloads them ------------------------------------------------------
template <class A, class B> static inline typename std::common_type<A, B>::type min(A a, B b) {
    typedef typename std::common_type<A, B>::type T; return (T)b < (T)a ? (T)b : (T)a; }
template <class A, class B> static inline typename std::common_type<A, B>::type max(A a, B b) {
    typedef typename std::common_type<A, B>::type T; return (T)a < (T)b ? (T)b : (T)a; }

// ---- math intrinsics (no fast-math: results as IEEE on the CPU) --------------------------
// (__expf, __logf, __sinf, __cosf, __tanf, __log2f, __powf come from glibc's math.h)
static inline float __fdividef(float a, float b) { return a / b; }
static inline float __frcp_rn(float a) { return 1.0f / a; }
static inline float __fsqrt_rn(float a) { return sqrtf(a); }
static inline float rsqrtf(float a) { return 1.0f / sqrtf(a); }
static inline double rsqrt(double a) { return 1.0 / sqrt(a); }
static inline float __saturatef(float a) { return a < 0.f ? 0.f : a > 1.f ? 1.f : a; }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }
static inline int __float2int_rn(float a) { return (int)nearbyintf(a); }
static inline int __float2int_rz(float a) { return (int)a; }
static inline int __float2int_rd(float a) { return (int)floorf(a); }
static inline int __float2int_ru(float a) { return (int)ceilf(a); }
static inline float __int2float_rn(int a) { return (float)a; }
static inline int __float_as_int(float a) { int r; memcpy(&r, &a, 4); return r; }
static inline float __int_as_float(int a) { float r; memcpy(&r, &a, 4); return r; }
static inline unsigned __float_as_uint(float a) { unsigned r; memcpy(&r, &a, 4); return r; }
static inline float __uint_as_float(unsigned a) { float r; memcpy(&r, &a, 4); return r; }
static inline long long __double_as_longlong(double a) { long long r; memcpy(&r, &a, 8); return r; }
static inline double __longlong_as_double(long long a) { double r; memcpy(&r, &a, 8); return r; }
static inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
static inline int __clzll(long long x) { return x ? __builtin_clzll((unsigned long long)x) : 64; }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __ffsll(long long x) { return __builtin_ffsll(x); }
static inline unsigned __brev(unsigned x) {
    x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1); x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
    x = ((x >> 4) & 0x0F0F0F0Fu) | ((x & 0x0F0F0F0Fu) << 4); x = ((x >> 8) & 0x00FF00FFu) | ((x & 0x00FF00FFu) << 8);
    return (x >> 16) | (x << 16); }
static inline int __mul24(int a, int b) { return (int)((long long)(a << 8 >> 8) * (b << 8 >> 8)); }
static inline unsigned __umul24(unsigned a, unsigned b) { return (a & 0xffffffu) * (b & 0xffffffu); }
static inline int __mulhi(int a, int b) { return (int)(((long long)a * b) >> 32); }
static inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
static inline long long clock64() { return (long long)__builtin_ia32_rdtsc(); }
// the device's clock(): a macro, so that <ctime>'s (included above, and so never again) stays declared
#define clock() ((int)__builtin_ia32_rdtsc())

// ---- synchronisation ---------------------------------------------------------------------
#define __syncthreads() clemu_syncthreads(__FILE__, __LINE__)
#define __syncthreads_count(p) clemu_syncthreads_reduce((p), 0, __FILE__, __LINE__)
#define __syncthreads_and(p) clemu_syncthreads_reduce((p), 1, __FILE__, __LINE__)
#define __syncthreads_or(p) clemu_syncthreads_reduce((p), 2, __FILE__, __LINE__)
static inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

// ---- warp operations: every lane deposits a value, meets the others, reads what it needs ---
namespace clemu {
template <class T> static inline unsigned long long to_bits(T v) {
    static_assert(sizeof(T) <= 8, "warp shuffles move at most 8 bytes");
    unsigned long long b = 0; memcpy(&b, &v, sizeof(T)); return b; }
template <class T> static inline T from_bits(unsigned long long b) { T v; memcpy(&v, &b, sizeof(T)); return v; }
static inline int lane() { return clemu_cur->linear & 31; }
}
#define CLEMU_XCHG(mask, v) clemu_warp_exchange((mask), clemu::to_bits(v), __FILE__, __LINE__)
#define __syncwarp(...) ((void)CLEMU_XCHG(clemu_syncwarp_mask(__VA_ARGS__), 0))
static inline unsigned clemu_syncwarp_mask(unsigned m = 0xffffffffu) { return m; }
#define __shfl_sync(mask, v, src, ...) clemu::shfl_idx(CLEMU_XCHG(mask, v), v, (int)(src), clemu::width(__VA_ARGS__))
#define __shfl_down_sync(mask, v, d, ...) clemu::shfl_down(CLEMU_XCHG(mask, v), v, (int)(d), clemu::width(__VA_ARGS__))
#define __shfl_up_sync(mask, v, d, ...) clemu::shfl_up(CLEMU_XCHG(mask, v), v, (int)(d), clemu::width(__VA_ARGS__))
#define __shfl_xor_sync(mask, v, m, ...) clemu::shfl_xor(CLEMU_XCHG(mask, v), v, (int)(m), clemu::width(__VA_ARGS__))
#define __ballot_sync(mask, p) clemu::ballot(CLEMU_XCHG(mask, (int)((p) != 0)), (mask))
#define __any_sync(mask, p) (clemu::ballot(CLEMU_XCHG(mask, (int)((p) != 0)), (mask)) != 0)
// the lanes that can vote are taken before the exchange: after it, lanes released first may have returned
#define __all_sync(mask, p) __extension__ ({ unsigned clemu_voters_ = (mask) & clemu_activemask(); \
    clemu::ballot(CLEMU_XCHG(mask, (int)((p) != 0)), (mask)) == clemu_voters_; })
#define __match_any_sync(mask, v) clemu::match_any(CLEMU_XCHG(mask, v), (mask))
#define __match_all_sync(mask, v, pred) clemu::match_all(CLEMU_XCHG(mask, v), (mask), (pred))
#define __reduce_add_sync(mask, v) clemu::reduce(CLEMU_XCHG(mask, v), (mask), +(v), 0)
#define __reduce_min_sync(mask, v) clemu::reduce(CLEMU_XCHG(mask, v), (mask), +(v), 1)
#define __reduce_max_sync(mask, v) clemu::reduce(CLEMU_XCHG(mask, v), (mask), +(v), 2)
#define __reduce_and_sync(mask, v) clemu::reduce(CLEMU_XCHG(mask, v), (mask), +(v), 3)
#define __reduce_or_sync(mask, v) clemu::reduce(CLEMU_XCHG(mask, v), (mask), +(v), 4)
#define __reduce_xor_sync(mask, v) clemu::reduce(CLEMU_XCHG(mask, v), (mask), +(v), 5)
#define __activemask() clemu_activemask()
namespace clemu {
static inline int width(int w = 32) { return w; }
template <class T> static inline T shfl_idx(unsigned long long* s, T, int src, int w) {
    int base = lane() & ~(w - 1); return from_bits<T>(s[base + (src & (w - 1))]); }
template <class T> static inline T shfl_down(unsigned long long* s, T v, int d, int w) {
    int l = lane(), base = l & ~(w - 1); return (l - base) + d < w ? from_bits<T>(s[l + d]) : v; }
template <class T> static inline T shfl_up(unsigned long long* s, T v, int d, int w) {
    int l = lane(), base = l & ~(w - 1); return (l - base) - d >= 0 ? from_bits<T>(s[l - d]) : v; }
template <class T> static inline T shfl_xor(unsigned long long* s, T v, int m, int w) {
    int l = lane(), t = l ^ m; return (t & ~(w - 1)) == (l & ~(w - 1)) ? from_bits<T>(s[t]) : v; }
static inline unsigned ballot(unsigned long long* s, unsigned mask) {
    unsigned r = 0;
    for (int l = 0; l < 32; l++) if (((mask >> l) & 1u) && s[l]) r |= 1u << l;
    return r; }
// the lanes of the mask whose value has the same bits as this lane's
static inline unsigned match_any(unsigned long long* s, unsigned mask) {
    unsigned r = 0;
    for (int l = 0; l < 32; l++) if (((mask >> l) & 1u) && s[l] == s[lane()]) r |= 1u << l;
    return r; }
template <class P> static inline unsigned match_all(unsigned long long* s, unsigned mask, P* pred) {
    bool all = match_any(s, mask) == mask;
    *pred = all;
    return all ? mask : 0u; }
// __reduce_*_sync: int or unsigned, over the lanes of the mask
template <class T> static inline T reduce(unsigned long long* s, unsigned mask, T v, int op) {
    static_assert(std::is_integral<T>::value && sizeof(T) == 4, "__reduce_*_sync takes int or unsigned values");
    T r = op == 3 ? (T)~0u : op == 1 ? v : op == 2 ? v : (T)0;
    for (int l = 0; l < 32; l++) {
        if (!((mask >> l) & 1u)) continue;
        T x = from_bits<T>(s[l]);
        r = op == 0 ? (T)(r + x) : op == 1 ? (x < r ? x : r) : op == 2 ? (x > r ? x : r)
          : op == 3 ? (T)(r & x) : op == 4 ? (T)(r | x) : (T)(r ^ x);
    }
    return r; }
}

// ---- atomics -----------------------------------------------------------------------------
// The value parameter is a non-deduced context (as CUDA's overloads behave): atomicAdd(&u, 1)
// with an unsigned u works.
namespace clemu { template <class T> using nd = typename std::common_type<T>::type; }
// In the hooked build, each atomic tells the per-access hook (clemu_abi.h) that it happened, for
// the profiler's counts.
template <class T> static inline void clemu_atomic_hook(T* a) {
#ifdef CLEMU_HOOKS
    if (__builtin_expect(clemu_hook_on, 0)) clemu_access(CLEMU_ATOM, a, sizeof(T), nullptr, nullptr);
#else
    (void)a;
#endif
}
template <class T> static inline T atomicAdd(T* a, clemu::nd<T> v) { clemu_atomic_hook(a); return __atomic_fetch_add(a, v, __ATOMIC_RELAXED); }
template <class T, class B> static inline T clemu_atomic_float(T* a, T v, B) { clemu_atomic_hook(a);
    B o = __atomic_load_n((B*)a, __ATOMIC_RELAXED), n;
    T old, want;
    do { memcpy(&old, &o, sizeof(T)); want = old + v; memcpy(&n, &want, sizeof(T)); }
    while (!__atomic_compare_exchange_n((B*)a, &o, n, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return old; }
static inline float atomicAdd(float* a, float v) { return clemu_atomic_float(a, v, 0u); }
static inline double atomicAdd(double* a, double v) { return clemu_atomic_float(a, v, 0ull); }
template <class T> static inline T atomicSub(T* a, clemu::nd<T> v) { clemu_atomic_hook(a); return __atomic_fetch_sub(a, v, __ATOMIC_RELAXED); }
template <class T> static inline T atomicExch(T* a, clemu::nd<T> v) { clemu_atomic_hook(a); return __atomic_exchange_n(a, v, __ATOMIC_RELAXED); }
static inline float atomicExch(float* a, float v) { clemu_atomic_hook(a);
    unsigned n; memcpy(&n, &v, 4); unsigned o = __atomic_exchange_n((unsigned*)a, n, __ATOMIC_RELAXED);
    float r; memcpy(&r, &o, 4); return r; }
template <class T> static inline T atomicCAS(T* a, clemu::nd<T> cmp, clemu::nd<T> v) { clemu_atomic_hook(a);
    __atomic_compare_exchange_n(a, &cmp, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED); return cmp; }
template <class T> static inline T atomicMax(T* a, clemu::nd<T> v) { clemu_atomic_hook(a);
    T o = __atomic_load_n(a, __ATOMIC_RELAXED);
    while (o < v && !__atomic_compare_exchange_n(a, &o, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
    return o; }
template <class T> static inline T atomicMin(T* a, clemu::nd<T> v) { clemu_atomic_hook(a);
    T o = __atomic_load_n(a, __ATOMIC_RELAXED);
    while (v < o && !__atomic_compare_exchange_n(a, &o, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
    return o; }
template <class T> static inline T atomicAnd(T* a, clemu::nd<T> v) { clemu_atomic_hook(a); return __atomic_fetch_and(a, v, __ATOMIC_RELAXED); }
template <class T> static inline T atomicOr(T* a, clemu::nd<T> v) { clemu_atomic_hook(a); return __atomic_fetch_or(a, v, __ATOMIC_RELAXED); }
template <class T> static inline T atomicXor(T* a, clemu::nd<T> v) { clemu_atomic_hook(a); return __atomic_fetch_xor(a, v, __ATOMIC_RELAXED); }
static inline unsigned atomicInc(unsigned* a, unsigned lim) { clemu_atomic_hook(a);
    unsigned o = __atomic_load_n(a, __ATOMIC_RELAXED), n;
    do { n = o >= lim ? 0 : o + 1; } while (!__atomic_compare_exchange_n(a, &o, n, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return o; }
#define atomicAdd_block atomicAdd
#define atomicAdd_system atomicAdd

// ---- printf, assert, trap ----------------------------------------------------------------
#undef assert
#define assert(c) ((c) ? (void)0 : clemu_fault(CLEMU_ASSERT, "assertion `%s` failed at %s:%d", #c, __FILE__, __LINE__))
#define __trap() clemu_fault(CLEMU_ASSERT, "__trap() at %s:%d", __FILE__, __LINE__)
#define __brkpt() ((void)0)

// ---- checked elements ---------------------------------------------------------------------
namespace clemu {
// An element of checked memory (a kernel pointer parameter, a __shared__ array, and in the hooked
// build a local pointer), as an lvalue: reading it and writing it are told apart, so the
// per-access hook (clemu_abi.h) sees which one happened. The emulator builds each module twice,
// on demand: with CLEMU_HOOKS (these proxies, for the race detector and the profiler) and without
// (plain T&, for launches at full speed). Arithmetic elements of kernel pointers and __shared__
// arrays go to both; half, half2 and the vector types (float4 ...) to the profiler only
// (CLEMU_COUNT), and their fields are proxies too (x4[i].x = v stores 4 bytes, as on a GPU).
// Other element types (structs) come back as plain T&.
#define CLEMU_INLINE inline __attribute__((always_inline))   // the hook's return address is the kernel's line
template <class T> struct ref;
template <class T> using field_of = typename std::conditional<std::is_const<T>::value,
    const decltype(std::remove_cv<T>::type::x), decltype(std::remove_cv<T>::type::x)>::type;
template <class T, int N> struct ref_fields { ref_fields(T*, unsigned) {} };
template <class T> struct ref_fields<T, 2> {
    ref<field_of<T>> x, y;
    ref_fields(T* p, unsigned sp) : x(&p->x, nullptr, nullptr, sp), y(&p->y, nullptr, nullptr, sp) {}
};
template <class T> struct ref_fields<T, 3> {
    ref<field_of<T>> x, y, z;
    ref_fields(T* p, unsigned sp) : x(&p->x, nullptr, nullptr, sp), y(&p->y, nullptr, nullptr, sp),
                                    z(&p->z, nullptr, nullptr, sp) {}
};
template <class T> struct ref_fields<T, 4> {
    ref<field_of<T>> x, y, z, w;
    ref_fields(T* p, unsigned sp) : x(&p->x, nullptr, nullptr, sp), y(&p->y, nullptr, nullptr, sp),
                                    z(&p->z, nullptr, nullptr, sp), w(&p->w, nullptr, nullptr, sp) {}
};
template <class T> struct ref : ref_fields<T, vec<typename std::remove_cv<T>::type>::fields> {
    typedef typename std::remove_cv<T>::type V;
    typedef ref_fields<T, vec<V>::fields> fields;
    T* p; const char* name; const void* base; unsigned sp;
    CLEMU_INLINE ref(T* p_, const char* n, const void* b, unsigned s) : fields(p_, s), p(p_), name(n), base(b), sp(s) {}
    ref(const ref&) = default;
    CLEMU_INLINE void hook(unsigned op) const {
        if (__builtin_expect((sp & CLEMU_COUNT) ? clemu_count_on : clemu_hook_on, 0))
            clemu_access(op | sp, p, sizeof(T), name, base); }
    CLEMU_INLINE operator V() const { hook(CLEMU_RD); return *p; }
    T* operator&() const { return p; }
    // by value: the right side is read here (a local array's a[i] is then bounds-checked as a read)
    CLEMU_INLINE ref& operator=(V v) { hook(CLEMU_WR); poisoned(v); *p = v; return *this; }
    // a float store of a wgmma accumulator's poison: read before the wait that delivers it (clemu_hopper.h)
    template <class U> CLEMU_INLINE static void poisoned(const U&) {}
    CLEMU_INLINE static void poisoned(const float& v) {
        unsigned u;
        memcpy(&u, &v, 4);
        if (__builtin_expect(u == CLEMU_WGMMA_POISON, 0)) clemu_poison_read();
    }
    CLEMU_INLINE ref& operator=(const ref& o) { V v = o; return *this = v; }
#define CLEMU_REF_OP(OP) template <class U> CLEMU_INLINE ref& operator OP(U v) { \
        hook(CLEMU_RD | CLEMU_WR); V t = *p; t OP v; *p = t; return *this; }
    CLEMU_REF_OP(+=) CLEMU_REF_OP(-=) CLEMU_REF_OP(*=) CLEMU_REF_OP(/=) CLEMU_REF_OP(%=)
    CLEMU_REF_OP(&=) CLEMU_REF_OP(|=) CLEMU_REF_OP(^=) CLEMU_REF_OP(<<=) CLEMU_REF_OP(>>=)
#undef CLEMU_REF_OP
    CLEMU_INLINE ref& operator++() { hook(CLEMU_RD | CLEMU_WR); V t = *p; ++t; *p = t; return *this; }
    CLEMU_INLINE ref& operator--() { hook(CLEMU_RD | CLEMU_WR); V t = *p; --t; *p = t; return *this; }
    CLEMU_INLINE V operator++(int) { hook(CLEMU_RD | CLEMU_WR); V t = *p, r = t; ++t; *p = t; return r; }
    CLEMU_INLINE V operator--(int) { hook(CLEMU_RD | CLEMU_WR); V t = *p, r = t; --t; *p = t; return r; }
};
#ifdef CLEMU_HOOKS
template <class T> struct is_plain : std::is_arithmetic<typename std::remove_cv<T>::type> {};
template <class T> struct is_counted
    : std::integral_constant<bool, is_plain<T>::value || vec<typename std::remove_cv<T>::type>::counted> {};
#else
template <class T> struct is_plain : std::false_type {};
template <class T> struct is_counted : std::false_type {};
#endif
template <class T> using elem = typename std::conditional<is_counted<T>::value, ref<T>, T&>::type;

// An index: an integer, an enum, or a checked integer element that reads as one (`bins[data[i]]`,
// `p + idx[k]`). Without the last, such an index took the built-in subscript through `operator T*`
// and went unchecked: no bounds check, no race check.
template <class I> struct is_index : std::integral_constant<bool, std::is_integral<I>::value || std::is_enum<I>::value> {};
template <class J> struct is_index<ref<J>> : std::integral_constant<bool, std::is_integral<J>::value> {};
template <class T> static CLEMU_INLINE typename std::enable_if<is_counted<T>::value, ref<T>>::type
at(T* p, unsigned sp, const char* name, const void* base) {
    return ref<T>(p, name, base, sp | (is_plain<T>::value ? 0u : (unsigned)CLEMU_COUNT)); }
template <class T> static CLEMU_INLINE typename std::enable_if<!is_counted<T>::value, T&>::type
at(T* p, unsigned, const char*, const void*) { return *p; }
template <class T> static inline T unref(T v) { return v; }
template <class T> static inline typename ref<T>::V unref(const ref<T>& r) { return r; }
template <class... A> static inline void printf_(const char* fmt, A... a) { clemu_printf(fmt, unref(a)...); }
}
#undef printf
#define printf(...) clemu::printf_(__VA_ARGS__)

// ---- static shared memory ------------------------------------------------------------------
// `__shared__ T name[N0][N1]...;` inside a function becomes a store per OS thread and a view of
// it (convlab/_source.py rewrites the declaration in place):
//     static thread_local clemu::shared_store<T[N0][N1]> name__clemu; const clemu::sview<T[N0][N1]> name = clemu::shared_open(name__clemu, "name");
// The first thread of each block that reaches the declaration fills the store with 0xFF bytes
// (NaN for floating types, -1 for integers), so values left by the previous block, or never
// loaded, show. Every index is checked against its dimension; the view converts to a pointer
// (as an array decays) where one is needed, and accesses through that pointer are not checked.
// The runtime is told where the store is, so ldmatrix and cp.async can check their addresses.
namespace clemu {
template <class A> struct alignas(256) shared_store { A data; unsigned long long serial; };
template <class A> struct sview;
template <class E, size_t N> struct sview<E[N]> {
    E* p; const char* name; const void* base; int depth, rank; long long prefix[4];
    operator E*() const { return p; }
    template <class U> explicit operator U*() const { return (U*)p; }
    // (uintptr_t)p, (size_t)p: the address as an integer, as CUDA allows a pointer
    template <class I, class = typename std::enable_if<std::is_integral<I>::value && !std::is_same<I, bool>::value>::type>
    explicit operator I() const { return (I)(uintptr_t)p; }

    // inlined, so that a fault's return address is the kernel's line
    template <class I, class = typename std::enable_if<is_index<I>::value>::type>
    CLEMU_INLINE typename std::conditional<std::is_array<E>::value, sview<E>, elem<E>>::type operator[](I i) const {
        long long k = (long long)i;
        if (__builtin_expect(k < 0 || k >= (long long)N, 0)) {
            if (!clemu_flat_shared)
                clemu_fault_shared_index(name, depth, k, (long long)N, prefix, rank);
            if constexpr (!std::is_array<E>::value)
                if (!inside(k)) return at(past_end(), CLEMU_SHARED, name, base);
            if (!inside(k))
                clemu_fault_shared_index(name, depth, k, (long long)N, prefix, rank);
        }
        return sub(k, std::is_array<E>());
    }
    // clemu_flat_shared: an index past its dimension reads on into the array, as on a GPU; an
    // element past the whole array reads as memory no thread wrote (NaN bytes), and a write there
    // is lost (on a GPU it lands in whatever lies beyond)
    __attribute__((noinline)) bool inside(long long k) const {
        const char *lo, *nm, *a = (const char*)p + k * (long long)sizeof(E);
        long long bytes;
        return clemu_shared_span(base, &lo, &bytes, &nm) && a >= lo && a + sizeof(E) <= lo + bytes;
    }
    __attribute__((noinline)) static E* past_end() {
        static thread_local E slot;
        clemu_own((const void*)&slot, sizeof(E));
        memset((void*)&slot, 0xFF, sizeof(E));
        return &slot;
    }
    sview<E> sub(long long k, std::true_type) const {
        sview<E> r{p[k], name, base, depth + 1, rank, {prefix[0], prefix[1], prefix[2], prefix[3]}};
        if (depth < 4) r.prefix[depth] = k;
        return r;
    }
    elem<E> sub(long long k, std::false_type) const { return at(p + k, CLEMU_SHARED, name, base); }
};
// Not checked by the guard: it fills the store before the runtime knows it is the block's shared memory.
template <class A> __attribute__((noinline, no_sanitize_address)) static sview<A> shared_open(shared_store<A>& s,
                                                                                               const char* name) {
    unsigned long long serial = clemu_cur->blk->serial;
    if (s.serial != serial) {
        memset((void*)&s.data, 0xFF, sizeof(A));
        s.serial = serial;
        clemu_shared_region((const void*)&s.data, sizeof(A), sizeof(typename std::remove_all_extents<A>::type), name);
    }
    return sview<A>{s.data, name, (const void*)&s.data, 0, (int)std::rank<A>::value, {0, 0, 0, 0}};
}
}

// ---- __constant__ arrays -------------------------------------------------------------------
// `__constant__ T name[N];` at file scope (T arithmetic) becomes the array and a view of it
// (convlab/_source.py rewrites the declaration in place):
//     T name__clemu[N]; static const clemu::cview<T[N]> name{name__clemu};
// so the profiler sees each read (CLEMU_CONST: how many distinct addresses a warp's request
// reads, which the constant cache serves one after the other). Not checked, not raced: a kernel
// only reads it. The view converts to a pointer where one is needed, as the array decays.
namespace clemu {
template <class A> struct cview;
template <class E, size_t N> struct cview<E[N]> {
    E* p;
    operator E*() const { return p; }
    template <class U> explicit operator U*() const { return (U*)p; }
    template <class I, class = typename std::enable_if<is_index<I>::value>::type>
    typename std::conditional<std::is_array<E>::value, cview<E>, elem<const E>>::type operator[](I i) const {
        return sub((long long)i, std::is_array<E>());
    }
    cview<E> sub(long long k, std::true_type) const { return cview<E>{p[k]}; }
    elem<const E> sub(long long k, std::false_type) const {
        return at((const E*)(p + k), CLEMU_CONST | CLEMU_COUNT, "__constant__", (const void*)p); }
};
}

// ---- dynamic shared memory -----------------------------------------------------------------
static inline void* clemu_dyn_shared() { return clemu_cur->blk->dyn_shared; }
namespace clemu {
// `extern __shared__ T name[];` becomes `static const clemu::dyn_shared<T> name{};`: it reads
// the running block's buffer (filled with NaN bytes at the block's start) at each use.
template <class T> struct dyn_shared {
    const char* name;
    operator T*() const { return (T*)clemu_dyn_shared(); }
    template <class U> explicit operator U*() const { return (U*)clemu_dyn_shared(); }
    explicit operator uintptr_t() const { return (uintptr_t)clemu_dyn_shared(); }   // rounding it up to an alignment
    template <class I, class U = T> elem<U> operator[](I i) const {
        long long n = clemu_cur->blk->dyn_bytes / (long long)sizeof(T);
        if (__builtin_expect((long long)i < 0 || (long long)i >= n, 0))
            clemu_fault_shared(name, (long long)i, n, (long long)sizeof(T));
        return at((U*)clemu_dyn_shared() + (long long)i, CLEMU_SHARED, name, clemu_dyn_shared()); }
};
}

// ---- bounds-checked kernel pointer parameters ----------------------------------------------
// The emulator rewrites each pointer parameter of a __global__ function, T* x, into
// clemu::ptr<T> x: x[i], *x and x->f check that the element lies inside the buffer the
// launch passed. It converts to T* wherever a plain pointer is needed (e.g. a __device__
// function's parameter); accesses through that plain pointer are no longer checked.
namespace clemu {
template <class T> struct ptr {
    T* p; T* lo; T* hi; int arg;
    ptr() : p(nullptr), lo(nullptr), hi(nullptr), arg(-1) {}
    ptr(T* p_, T* lo_, T* hi_, int a) : p(p_), lo(lo_), hi(hi_), arg(a) {}
    ptr(std::nullptr_t) : ptr() {}
    template <class U, class = typename std::enable_if<std::is_convertible<U*, T*>::value>::type>
    ptr(const ptr<U>& o) : p(o.p), lo(o.lo), hi(o.hi), arg(o.arg) {}
    // inlined into the launcher, which the guard does not check (it reads Python's argument block)
    __attribute__((always_inline)) static ptr make(void* slot, int arg) {
        clemu_buf* b = (clemu_buf*)slot;
        T* base = (T*)b->p;
        return ptr(base, base, base + b->nbytes / (long long)elem_size(), arg);
    }
    static constexpr long long elem_size() { return (long long)sizeof(typename std::conditional<std::is_void<T>::value, char, T>::type); }
    inline void check(const T* q) const {
        if (__builtin_expect(q < lo || q >= hi, 0) && lo)
            clemu_fault_oob(arg, (long long)(q - lo), (long long)(hi - lo), elem_size());
    }
    operator T*() const { return p; }
    template <class U> explicit operator U*() const { return (U*)p; }
    // (uintptr_t)p, (size_t)p: the address as an integer, as CUDA allows a pointer
    template <class I, class = typename std::enable_if<std::is_integral<I>::value && !std::is_same<I, bool>::value>::type>
    explicit operator I() const { return (I)(uintptr_t)p; }
    template <class I, class U = T, class = typename std::enable_if<is_index<I>::value>::type>
    elem<U> operator[](I i) const { check(p + (long long)i); return at(p + (long long)i, 0u, nullptr, (const void*)lo); }
    template <class U = T> elem<U> operator*() const { check(p); return at(p, 0u, nullptr, (const void*)lo); }
    T* operator->() const { check(p); return p; }
    template <class I> ptr operator+(I i) const { return ptr(p + (long long)i, lo, hi, arg); }
    template <class I> ptr operator-(I i) const { return ptr(p - (long long)i, lo, hi, arg); }
    long long operator-(const ptr& o) const { return p - o.p; }
    long long operator-(const T* o) const { return p - o; }
    template <class I> ptr& operator+=(I i) { p += (long long)i; return *this; }
    template <class I> ptr& operator-=(I i) { p -= (long long)i; return *this; }
    ptr& operator++() { ++p; return *this; }
    ptr operator++(int) { ptr r = *this; ++p; return r; }
    ptr& operator--() { --p; return *this; }
    ptr operator--(int) { ptr r = *this; --p; return r; }
};
template <class I, class T> static inline ptr<T> operator+(I i, const ptr<T>& q) { return q + i; }

// ---- local pointers (hooked build) -----------------------------------------------------------
// In the hooked build the emulator rewrites a kernel file's local pointer variables, its pointer
// casts and reinterpret_casts (convlab/_source.py: `const float* p = x + off;` becomes
// `CLEMU_P(const float) p = x + off;`) into lptr<T>: a plain pointer whose elements are proxies,
// so the profiler counts `p[i]` and `*(const float4*)&s[j]` as the GPU's loads and stores. It
// does not know which memory it points into: the runtime looks each address up (CLEMU_ANY), and
// leaves out a thread's own arrays. Its arithmetic elements that lie in shared memory go to the race
// detector too (`volatile float* vs = s;` in a warp-synchronous tail), and one past the launch's
// extern shared bytes is a fault; otherwise it checks no bounds (the kernel's pointer parameters do).
template <class T> struct lptr {
    T* p;
    // the static __shared__ array p pointed into when the pointer was made (hooked launches): what
    // its elements are checked against, whatever arithmetic follows
    const char* lo = nullptr; long long bytes = 0; const char* name = nullptr;
    lptr() = default;
    CLEMU_INLINE lptr(T* q) : p(q) { locate(); }
    CLEMU_INLINE lptr(std::nullptr_t) : p(nullptr) {}
    // whatever converts to T* (a checked kernel pointer, a __shared__ array, another lptr)
    template <class S, class = typename std::enable_if<!std::is_pointer<S>::value &&
                                                       std::is_convertible<const S&, T*>::value>::type>
    CLEMU_INLINE lptr(const S& s) : p(s) { locate(); }
    // a cast: (const float4*)&x[i], reinterpret_cast<uint4*>(p), (half*)smem
    template <class S, class = typename std::enable_if<!std::is_convertible<const S&, T*>::value>::type,
              class = decltype((T*)std::declval<const S&>())>
    CLEMU_INLINE explicit lptr(const S& s) : p((T*)s) { locate(); }
    CLEMU_INLINE void locate() { if (__builtin_expect(clemu_hook_on, 0) && p) clemu_shared_span((const void*)p, &lo, &bytes, &name); }
    CLEMU_INLINE void check(const T* q) const {
        if (__builtin_expect(lo != nullptr, 0) &&
            ((const char*)q < lo || (const char*)q + elem_bytes() > lo + bytes))
            clemu_fault_shared_ptr(name, (long long)((const char*)q - lo), bytes, elem_bytes());
        // a vector access through a cast pointer (`*(const float4*)&s[1]`) off its alignment: a GPU faults
        if (__builtin_expect((uintptr_t)q % elem_align(), 0))
            clemu_fault_misaligned((const void*)q, (int)elem_align(), (int)elem_bytes());
    }
    static constexpr size_t elem_align() {
        return alignof(typename std::conditional<std::is_void<T>::value, char, T>::type); }
    static constexpr long long elem_bytes() { return (long long)sizeof(typename std::conditional<std::is_void<T>::value, char, T>::type); }
    CLEMU_INLINE operator T*() const { return p; }
    template <class U> CLEMU_INLINE explicit operator U*() const { return (U*)p; }
    // (uintptr_t)p, (size_t)p: the address as an integer, as CUDA allows a pointer
    template <class I, class = typename std::enable_if<std::is_integral<I>::value && !std::is_same<I, bool>::value>::type>
    explicit operator I() const { return (I)(uintptr_t)p; }

    template <class I, class U = T, class = typename std::enable_if<is_index<I>::value>::type>
    CLEMU_INLINE elem<U> operator[](I i) const { check(p + (long long)i); return at(p + (long long)i, CLEMU_ANY, nullptr, nullptr); }
    template <class U = T> CLEMU_INLINE elem<U> operator*() const { check(p); return at(p, CLEMU_ANY, nullptr, nullptr); }
    T* operator->() const { return p; }
#define CLEMU_INT template <class I, class = typename std::enable_if<is_index<I>::value>::type>
    CLEMU_INT lptr operator+(I i) const { lptr r = *this; r.p += (long long)i; return r; }
    CLEMU_INT lptr operator-(I i) const { lptr r = *this; r.p -= (long long)i; return r; }
    CLEMU_INT lptr& operator+=(I i) { p += (long long)i; return *this; }
    CLEMU_INT lptr& operator-=(I i) { p -= (long long)i; return *this; }
    long long operator-(const lptr& o) const { return p - o.p; }
    long long operator-(const T* o) const { return p - o; }
    lptr& operator++() { ++p; return *this; }
    lptr operator++(int) { lptr r = *this; ++p; return r; }
    lptr& operator--() { --p; return *this; }
    lptr operator--(int) { lptr r = *this; --p; return r; }
};
template <class I, class T, class = typename std::enable_if<is_index<I>::value>::type>
static inline lptr<T> operator+(I i, const lptr<T>& q) { return q + i; }
#undef CLEMU_INT
template <class T> static inline T* unref(const lptr<T>& p) { return p.p; }

// a plain pointer from a pointer or a checked pointer (the checked one checks its first element)
template <class T> static inline T* raw(T* p) { return p; }
template <class T> static inline T* raw(const ptr<T>& p) { p.check(p.p); return p.p; }
template <class T> static inline T* raw(const lptr<T>& p) { return p.p; }
// a __shared__ array or one of its rows, as it decays to a pointer (wmma::load_matrix_sync(a, As[k], ld))
template <class E, size_t N> static inline E* raw(const sview<E[N]>& v) { return v.p; }
template <class T> static inline T* raw(const dyn_shared<T>& d) { return (T*)d; }
// the same, where the source rewrite finds such an array passed as an argument (convlab/_source.py)
template <class E, size_t N> static inline E* decay(const sview<E[N]>& v) { return v.p; }
template <class T> static inline T* decay(const dyn_shared<T>& d) { return (T*)d; }
// __ldg through a plain pointer, in the hooked build: the profiler counts it as a load
template <class T> static CLEMU_INLINE typename std::remove_cv<T>::type ldg(const T* p) {
#ifdef CLEMU_HOOKS
    return at(p, CLEMU_ANY | CLEMU_COUNT, nullptr, nullptr);
#else
    return *p;
#endif
}
}
// __ldcs and __ldcg pick a cache policy on a GPU (streaming; L2 only, not L1): here loads like __ldg,
// on a plain pointer or a kernel's checked one
#define CLEMU_LOAD(F) \
    template <class T> static CLEMU_INLINE T F(const T* p) { return clemu::ldg(p); } \
    template <class T> static CLEMU_INLINE T F(const clemu::ptr<T>& p) { return *p; } \
    template <class T> static CLEMU_INLINE T F(const clemu::ptr<const T>& p) { return *p; } \
    template <class T> static CLEMU_INLINE T F(const clemu::lptr<T>& p) { return *p; } \
    template <class T> static CLEMU_INLINE T F(const clemu::lptr<const T>& p) { return *p; }
CLEMU_LOAD(__ldg) CLEMU_LOAD(__ldcs) CLEMU_LOAD(__ldcg)
#undef CLEMU_LOAD
template <class T> static inline void __stcs(T* p, T v) { *p = v; }
template <class T> static inline void __stcg(T* p, T v) { *p = v; }

// Atomics on a kernel's pointer parameter itself (atomicAdd(sum, v)): check, then as usual.
#define CLEMU_ATOMIC_PTR(F) \
    template <class T, class... A> static inline auto F(const clemu::ptr<T>& a, A... v) -> decltype(F((T*)a.p, v...)) { \
        a.check(a.p); return F((T*)a.p, v...); }
CLEMU_ATOMIC_PTR(atomicAdd) CLEMU_ATOMIC_PTR(atomicSub) CLEMU_ATOMIC_PTR(atomicExch) CLEMU_ATOMIC_PTR(atomicCAS)
CLEMU_ATOMIC_PTR(atomicMax) CLEMU_ATOMIC_PTR(atomicMin) CLEMU_ATOMIC_PTR(atomicAnd) CLEMU_ATOMIC_PTR(atomicOr)
CLEMU_ATOMIC_PTR(atomicXor) CLEMU_ATOMIC_PTR(atomicInc)
// and on a local pointer (hooked build)
#define CLEMU_ATOMIC_LPTR(F) \
    template <class T, class... A> static inline auto F(const clemu::lptr<T>& a, A... v) -> decltype(F((T*)a.p, v...)) { \
        return F((T*)a.p, v...); }
CLEMU_ATOMIC_LPTR(atomicAdd) CLEMU_ATOMIC_LPTR(atomicSub) CLEMU_ATOMIC_LPTR(atomicExch) CLEMU_ATOMIC_LPTR(atomicCAS)
CLEMU_ATOMIC_LPTR(atomicMax) CLEMU_ATOMIC_LPTR(atomicMin) CLEMU_ATOMIC_LPTR(atomicAnd) CLEMU_ATOMIC_LPTR(atomicOr)
CLEMU_ATOMIC_LPTR(atomicXor) CLEMU_ATOMIC_LPTR(atomicInc)

// What the source rewrite writes for a pointer type and for reinterpret_cast<T*>, static_cast<T*>
// (convlab/_source.py): a plain pointer and the cast as written, or in the hooked build an lptr.
// CLEMU_RESTRICT keeps a local pointer's __restrict__ in the plain build.
#ifdef CLEMU_HOOKS
#define CLEMU_P(...) ::clemu::lptr<__VA_ARGS__>
#define CLEMU_RCAST(...) ::clemu::lptr<__VA_ARGS__>
#define CLEMU_SCAST(...) ::clemu::lptr<__VA_ARGS__>
#define CLEMU_RESTRICT
#else
#define CLEMU_P(...) __VA_ARGS__*
#define CLEMU_RCAST(...) ::clemu::ptr_cast<__VA_ARGS__>
#define CLEMU_SCAST(...) ::clemu::ptr_cast<__VA_ARGS__>
#define CLEMU_RESTRICT __restrict
#endif
namespace clemu {
// reinterpret_cast<T*>(p) and static_cast<T*>(p) of a plain pointer or of a checked one (a kernel's
// parameter, a shared array): the address, as T*
template <class T, class S> static CLEMU_INLINE T* ptr_cast(const S& s) { return (T*)s; }
// reinterpret_cast<X>(v) to a non-pointer type (an integer, a reference): as the C cast does it,
// which takes the checked pointers' conversions too (convlab/_source.py rewrites the name)
template <class X, class S> static CLEMU_INLINE X rcast(S&& s) { return (X)s; }
}

// ---- loops (hooked build) -------------------------------------------------------------------
// A warp runs a loop's i-th iteration for all its lanes that are in the loop at once, whatever
// each lane did before: a lane that took the other side of a branch in iterations 0 and 1 is
// still in iteration 2 with the others. So each thread keeps which iteration of which loops it
// is in (clemu_thread::loop, a hash), every access it makes carries it, and the profiler makes
// one request of the lanes' accesses at one site with the same one (profile.cpp). `for` becomes
// a loop that opens such a scope around itself and steps it at the top of each iteration; the
// scope's end (after the loop, a break, a return) gives the thread its outer loops' value back.
#ifdef CLEMU_HOOKS
namespace clemu {
struct loop_scope {
    clemu_thread* t; unsigned long long outer, iter;
    CLEMU_INLINE loop_scope() : t(clemu_cur), outer(t ? t->loop : 0), iter(0) {}
    CLEMU_INLINE ~loop_scope() { if (t) t->loop = outer; }
    CLEMU_INLINE bool next(unsigned long long id) {
        if (t) {
            unsigned long long h = (outer + 0x9E3779B97F4A7C15ull * (id + 1)) ^ (iter++ * 0xC2B2AE3D27D4EB4Full);
            h ^= h >> 31; h *= 0xBF58476D1CE4E5B9ull; h ^= h >> 29;
            t->loop = h | 1;    // never 0: 0 is outside every loop
        }
        return false;
    }
};
}
#define for(...) if (::clemu::loop_scope clemu_loop_; false) {} else for (__VA_ARGS__) if (clemu_loop_.next(__COUNTER__)) {} else
#endif
