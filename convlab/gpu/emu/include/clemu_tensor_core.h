// clemu_tensor_core.h — the CPU emulator's model of the warp-level instructions that
// kernels/09_general/tensor_core.cuh wraps in PTX: ldmatrix, mma.sync m16n8k16, cp.async; and the
// TF32 ones of kernels/12_tf32/tf32.cuh: mma.sync m16n8k8 with .tf32 operands, cvt.rna.tf32.f32.
// Each lane's registers hold exactly what the PTX ISA's fragment layouts put there. ldmatrix
// reads through the rows the lanes pass (after checking each: 16-byte aligned, inside a shared
// array, no cp.async in flight), so shared memory never loaded shows as NaN. A cp.async lands at
// the wait that covers it (runtime.cpp); until then its destination holds NaN bytes, and an access
// to it is a fault that names both lines.
#pragma once
#include "cuda_fp16.h"
#include "clemu_mma_numerics.h"

#define CLEMU_TC_INLINE static inline __attribute__((always_inline))

namespace clemu {
namespace tc {
// the address a pointer, a checked kernel pointer or a shared array holds
template <class T> CLEMU_TC_INLINE const void* addr(T* p) { return (const void*)p; }
template <class T> CLEMU_TC_INLINE const void* addr(const ptr<T>& p) { return (const void*)p.p; }
template <class T> CLEMU_TC_INLINE const void* addr(const lptr<T>& p) { return (const void*)p.p; }
template <class A> CLEMU_TC_INLINE const void* addr(const sview<A>& v) { return (const void*)v.p; }
template <class T> CLEMU_TC_INLINE const void* addr(const dyn_shared<T>& d) { return (const void*)(T*)d; }

// A warp-wide instruction (.sync.aligned): every lane of a full warp executes it together.
CLEMU_TC_INLINE void full_warp(const char* what, const char* file, int line) {
    unsigned m = clemu_activemask();
    if (m != 0xffffffffu)
        clemu_fault(CLEMU_BARRIER, "%s at %s:%d needs all 32 lanes of the warp, but only %d are running (mask %#x): "
                    "launch blocks of a multiple of 32 threads and let no lane return before the warp's last %s",
                    what, file, line, __builtin_popcount(m), m, what);
}

// ldmatrix.sync.aligned.m8n8.xN[.trans].shared.b16: lanes 8i..8i+7 pass the rows of matrix i; lane
// l receives row l/4, columns 2(l%4) and 2(l%4)+1 of each (the lower column in the low 16 bits),
// or with .trans column l/4, rows 2(l%4) and 2(l%4)+1.
template <int N, bool TRANS>
CLEMU_TC_INLINE void ldmatrix(unsigned* r, const void* row, const char* what, const char* file, int line) {
    full_warp(what, file, line);
    int l = lane();
    if (l < 8 * N) clemu_ldmatrix_check(row, what);
    unsigned long long* rows = clemu_warp_exchange(0xffffffffu, (unsigned long long)(uintptr_t)row, file, line);
#ifdef CLEMU_HOOKS
    if (l < 8 * N && clemu_hook_on) clemu_ldmatrix_hook(row);
#endif
    int g = l / 4, c = l % 4;
    for (int i = 0; i < N; i++) {
        const unsigned char* const* m = (const unsigned char* const*)&rows[8 * i];
        if (!TRANS) {
            memcpy(&r[i], m[g] + 4 * c, 4);
        } else {
            uint16_t lo, hi;
            memcpy(&lo, m[2 * c] + 2 * g, 2);
            memcpy(&hi, m[2 * c + 1] + 2 * g, 2);
            r[i] = (unsigned)lo | (unsigned)hi << 16;
        }
    }
}

CLEMU_TC_INLINE float from_f16(unsigned r, int high) { return h2f((uint16_t)(r >> (16 * high))); }
CLEMU_TC_INLINE float from_bf16(unsigned r, int high) {
    unsigned u = high ? (r & 0xffff0000u) : (r << 16);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32, d += A*B. Lane l (group g = l/4,
// t = l%4) holds A's rows g and g+8, columns 2t, 2t+1 (a[0], a[1]) and 2t+8, 2t+9 (a[2], a[3]),
// row g+8 in a[1] and a[3]; B's rows (k) 2t, 2t+1 (b[0]) and 2t+8, 2t+9 (b[1]) of column g; D's
// rows g (d[0], d[1]) and g+8 (d[2], d[3]), columns 2t and 2t+1. The 16 products are added into d
// as the GPU's tensor cores add them (clemu_mma_numerics.h, measured for fp16 on an H100; bf16,
// not measured, takes the same rule).
template <bool BF16>
CLEMU_TC_INLINE void mma16816(float* d, const unsigned* a, const unsigned* b, const char* what, const char* file,
                              int line) {
    full_warp(what, file, line);
    unsigned mine[6] = {a[0], a[1], a[2], a[3], b[0], b[1]};
    const unsigned* s = clemu_warp_exchange_regs(0xffffffffu, mine, 6, file, line);
    int l = lane(), g = l / 4, t = l % 4;
    float A[2][16], B[16][2];
    for (int h = 0; h < 2; h++)             // this lane's rows of A: g and g + 8
        for (int k = 0; k < 16; k++) {
            unsigned r = s[(g * 4 + (k % 8) / 2) * CLEMU_XCHG_REGS + h + 2 * (k / 8)];
            A[h][k] = BF16 ? from_bf16(r, k & 1) : from_f16(r, k & 1);
        }
    for (int j = 0; j < 2; j++)             // this lane's columns of B: 2t and 2t + 1
        for (int k = 0; k < 16; k++) {
            unsigned r = s[((2 * t + j) * 4 + (k % 8) / 2) * CLEMU_XCHG_REGS + 4 + k / 8];
            B[k][j] = BF16 ? from_bf16(r, k & 1) : from_f16(r, k & 1);
        }
    for (int i = 0; i < 4; i++) {
        float b[16];
        for (int k = 0; k < 16; k++) b[k] = B[k][i % 2];
        d[i] = mma_k16(d[i], A[i / 2], b);
    }
}

// mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32, d += A*B. Lane l (group g = l/4, t = l%4)
// holds A's rows g (a[0], a[2]) and g+8 (a[1], a[3]), columns t (a[0], a[1]) and t+4 (a[2], a[3]);
// B's rows (k) t (b[0]) and t+4 (b[1]) of column g; D as mma16816's. Each register is read as a
// .tf32 operand (its top 19 bits) and the 8 products are added as the tensor cores add them
// (clemu_mma_numerics.h: a hypothesis for TF32 until the probe's data confirms it).
CLEMU_TC_INLINE void mma1688_tf32(float* d, const unsigned* a, const unsigned* b, const char* what, const char* file,
                                  int line) {
    full_warp(what, file, line);
    unsigned mine[6] = {a[0], a[1], a[2], a[3], b[0], b[1]};
    const unsigned* s = clemu_warp_exchange_regs(0xffffffffu, mine, 6, file, line);
    int l = lane(), g = l / 4, t = l % 4;
    float A[2][8], B[2][8];
    for (int h = 0; h < 2; h++)             // this lane's rows of A: g and g + 8
        for (int k = 0; k < 8; k++) A[h][k] = tf32_operand(s[(g * 4 + k % 4) * CLEMU_XCHG_REGS + h + 2 * (k / 4)]);
    for (int j = 0; j < 2; j++)             // this lane's columns of B: 2t and 2t + 1
        for (int k = 0; k < 8; k++) B[j][k] = tf32_operand(s[((2 * t + j) * 4 + k % 4) * CLEMU_XCHG_REGS + 4 + k / 4]);
    for (int i = 0; i < 4; i++) d[i] = mma_k8(d[i], A[i / 2], B[i % 2]);
}
}  // namespace tc
}  // namespace clemu

// The names kernels call (tensor_core.cuh's, with the same parameters). The pointer parameters
// are templates, so a checked kernel pointer or a __shared__ array may be passed as on a GPU;
// file and line name the call in messages.
#define CLEMU_TC_SITE const char* file = __builtin_FILE(), int line = __builtin_LINE()
template <class P> CLEMU_TC_INLINE void ldmatrix_x1(unsigned& r, const P& row, CLEMU_TC_SITE) {
    clemu::tc::ldmatrix<1, false>(&r, clemu::tc::addr(row), "ldmatrix_x1", file, line); }
template <class P> CLEMU_TC_INLINE void ldmatrix_x2(unsigned (&r)[2], const P& row, CLEMU_TC_SITE) {
    clemu::tc::ldmatrix<2, false>(r, clemu::tc::addr(row), "ldmatrix_x2", file, line); }
template <class P> CLEMU_TC_INLINE void ldmatrix_x4(unsigned (&r)[4], const P& row, CLEMU_TC_SITE) {
    clemu::tc::ldmatrix<4, false>(r, clemu::tc::addr(row), "ldmatrix_x4", file, line); }
template <class P> CLEMU_TC_INLINE void ldmatrix_x1_trans(unsigned& r, const P& row, CLEMU_TC_SITE) {
    clemu::tc::ldmatrix<1, true>(&r, clemu::tc::addr(row), "ldmatrix_x1_trans", file, line); }
template <class P> CLEMU_TC_INLINE void ldmatrix_x2_trans(unsigned (&r)[2], const P& row, CLEMU_TC_SITE) {
    clemu::tc::ldmatrix<2, true>(r, clemu::tc::addr(row), "ldmatrix_x2_trans", file, line); }
template <class P> CLEMU_TC_INLINE void ldmatrix_x4_trans(unsigned (&r)[4], const P& row, CLEMU_TC_SITE) {
    clemu::tc::ldmatrix<4, true>(r, clemu::tc::addr(row), "ldmatrix_x4_trans", file, line); }

CLEMU_TC_INLINE void mma_16816(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2], CLEMU_TC_SITE) {
    clemu::tc::mma16816<false>(d, a, b, "mma_16816", file, line); }
CLEMU_TC_INLINE void mma_16816_bf16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2], CLEMU_TC_SITE) {
    clemu::tc::mma16816<true>(d, a, b, "mma_16816_bf16", file, line); }

CLEMU_TC_INLINE void mma_1688_tf32(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2], CLEMU_TC_SITE) {
    clemu::tc::mma1688_tf32(d, a, b, "mma_1688_tf32", file, line); }
CLEMU_TC_INLINE unsigned cvt_rna_tf32(float x) { return clemu::rna_tf32_bits(x); }

template <class D, class S> CLEMU_TC_INLINE void cp_async_16(const D& smem_dst, const S& gmem_src, bool full = true) {
    clemu_cp_async((void*)clemu::tc::addr(smem_dst), clemu::tc::addr(gmem_src), 16, full); }
template <class D, class S> CLEMU_TC_INLINE void cp_async_4(const D& smem_dst, const S& gmem_src, bool full = true) {
    clemu_cp_async((void*)clemu::tc::addr(smem_dst), clemu::tc::addr(gmem_src), 4, full); }
CLEMU_TC_INLINE void cp_async_commit() { clemu_cp_async_commit(); }
template <int N> CLEMU_TC_INLINE void cp_async_wait() {
    static_assert(N >= 0, "cp_async_wait<N>: N is how many of the most recent groups may stay in flight (0: none)");
    clemu_cp_async_wait(N); }
#undef CLEMU_TC_SITE
