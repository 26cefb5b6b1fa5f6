// mma.h for convlab's emulator: WMMA 16x16x16 fragments (half or float inputs, float or half
// accumulators). On a GPU a fragment is spread over the 32 lanes of a warp in an unspecified
// layout; here every lane holds the whole tile, so each lane's load, mma and store give the
// same values the warp would. Element-wise loops over frag.num_elements work the same way.
// The alignment and leading-dimension rules of the GPU are checked, because breaking them is
// undefined behaviour there.
#pragma once
#include "cuda_fp16.h"

namespace nvcuda {
namespace wmma {
struct matrix_a {}; struct matrix_b {}; struct accumulator {};
struct row_major {}; struct col_major {};
enum layout_t { mem_row_major, mem_col_major };
namespace precision { struct tf32 {}; }

template <class Use, int M, int N, int K> struct shape;
template <int M, int N, int K> struct shape<matrix_a, M, N, K> { enum { rows = M, cols = K }; };
template <int M, int N, int K> struct shape<matrix_b, M, N, K> { enum { rows = K, cols = N }; };
template <int M, int N, int K> struct shape<accumulator, M, N, K> { enum { rows = M, cols = N }; };

template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
    static_assert(M == 16 && N == 16 && K == 16, "the emulator supports the 16x16x16 WMMA shape");
    enum { rows = shape<Use, M, N, K>::rows, cols = shape<Use, M, N, K>::cols, num_elements = rows * cols };
    T x[num_elements];
};

namespace detail {
// file and line: the call's, taken by the default arguments of the functions below
static inline void check_ptr(const void* p, unsigned ldm, int elem, const char* what, const char* file, int line) {
    if (((uintptr_t)p) % 32 != 0)
        clemu_wmma_misaligned(p, elem, what, file, line);
    if ((ldm * (unsigned)elem) % 16 != 0)
        clemu_fault(CLEMU_FAULT, "wmma::%s at %s:%d: ldm=%u must be a multiple of %d elements (16 bytes)", what, file,
                    line, ldm, 16 / elem);
}
template <class T> static inline float f(T v) { return (float)v; }
}

template <class T, class S> static inline void fill_fragment(fragment<accumulator, 16, 16, 16, T>& a, S v) {
    for (int i = 0; i < 256; i++) a.x[i] = T(v); }
template <class Use, class T, class L, class S> static inline void fill_fragment(fragment<Use, 16, 16, 16, T, L>& a, S v) {
    for (int i = 0; i < 256; i++) a.x[i] = T(v); }

template <class Use, class T, class Ptr>
static inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, row_major>& a, const Ptr& pp, unsigned ldm,
                                    const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    auto* p = clemu::raw(pp);
    detail::check_ptr(p, ldm, sizeof(*p), "load_matrix_sync", file, line);
    for (int r = 0; r < 16; r++) for (int c = 0; c < 16; c++) a.x[r * 16 + c] = p[(size_t)r * ldm + c]; }
template <class Use, class T, class Ptr>
static inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, col_major>& a, const Ptr& pp, unsigned ldm,
                                    const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    auto* p = clemu::raw(pp);
    detail::check_ptr(p, ldm, sizeof(*p), "load_matrix_sync", file, line);
    for (int r = 0; r < 16; r++) for (int c = 0; c < 16; c++) a.x[r * 16 + c] = p[(size_t)c * ldm + r]; }
template <class T, class Ptr>
static inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, T>& a, const Ptr& pp, unsigned ldm, layout_t l,
                                    const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    auto* p = clemu::raw(pp);
    detail::check_ptr(p, ldm, sizeof(*p), "load_matrix_sync", file, line);
    for (int r = 0; r < 16; r++) for (int c = 0; c < 16; c++)
        a.x[r * 16 + c] = l == mem_row_major ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r]; }
template <class T, class Ptr>
static inline void store_matrix_sync(const Ptr& pp, const fragment<accumulator, 16, 16, 16, T>& a, unsigned ldm, layout_t l,
                                    const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    auto* p = clemu::raw(pp);
    typedef typename std::remove_pointer<decltype(p)>::type P;
    detail::check_ptr(p, ldm, sizeof(*p), "store_matrix_sync", file, line);
    for (int r = 0; r < 16; r++) for (int c = 0; c < 16; c++) {
        P& d = l == mem_row_major ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r];
        d = P(a.x[r * 16 + c]); } }

// d = a*b + c, products exact in float, accumulated in float
template <class Td, class Ta, class La, class Tb, class Lb, class Tc>
static inline void mma_sync(fragment<accumulator, 16, 16, 16, Td>& d, const fragment<matrix_a, 16, 16, 16, Ta, La>& a,
                            const fragment<matrix_b, 16, 16, 16, Tb, Lb>& b, const fragment<accumulator, 16, 16, 16, Tc>& c) {
    float out[256];
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) {
            float s = detail::f(c.x[i * 16 + j]);
            for (int k = 0; k < 16; k++) s = fmaf(detail::f(a.x[i * 16 + k]), detail::f(b.x[k * 16 + j]), s);
            out[i * 16 + j] = s;
        }
    for (int i = 0; i < 256; i++) d.x[i] = Td(out[i]);
}
}  // namespace wmma
}  // namespace nvcuda
