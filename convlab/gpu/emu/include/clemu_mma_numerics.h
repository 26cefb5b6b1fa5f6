// clemu_mma_numerics.h — how the tensor cores add one step of products into an fp32 accumulator,
// as measured on an H100 for fp16 (tests/data/hopper_mma_numerics.npz: wgmma m64n64k16 and mma.sync
// m16n8k16, bit-exact on every output of 160 trials). Used by wgmma (runtime.cpp) and mma_16816 /
// mma_1688_tf32 (clemu_tensor_core.h), so the emulator gives the GPU's bits.
//
// For one output element, from the accumulator c and a[0..K-1], b[0..K-1] (the operands as floats;
// K = 16 for fp16, 8 for tf32):
//  1. the products a_k * b_k, exact (in double);
//  2. the alignment exponent E: the largest of ex(a_k) + ex(b_k) over the nonzero products and
//     ex(c) if c != 0, where ex(v) = floor(log2 |v|) (a product whose significand is >= 2 is not
//     counted one higher);
//  3. each term (c and the K products) truncated toward zero to a multiple of 2^(E - 25);
//  4. the truncated terms summed exactly (they lie on one grid: a double holds the sum);
//  5. the sum rounded toward zero to float.
// Zero terms add nothing and set no exponent; a result of zero is +0. An infinite or NaN operand
// makes the result the plain sum's (inf or NaN), as IEEE arithmetic gives it. Not covered by the
// measurements: fp32 overflow.
//
// bf16 (wgmma and mma.sync m16n8k16 .bf16): the same rule, measured on an H200
// (tests/data/hopper_mma_numerics_bf16.npz, 48 trials, subnormal inputs among them: all bits equal).
// TF32 (mma.sync m16n8k8 and wgmma m64nNk8 with .tf32 operands), measured on an H200
// (tests/data/tf32_mma_numerics.npz): the tensor core reads the top 19 bits of each 32-bit operand
// (sign, 8 exponent bits, 10 mantissa bits: tf32_operand truncates the low 13), and adds the 8
// products by the rule above. rna_tf32_bits is the instruction a kernel rounds with instead
// (cvt.rna.tf32.f32: to nearest, ties away from zero; a NaN or infinity keeps its top 19 bits).
#pragma once
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace clemu {
// A bf16 operand's value: its 16 bits are the high half of a float's (subnormals, inf and NaN too).
// bf16 operands go through mma_k16 as fp16 ones do: the same rule is the hypothesis, checked against
// the GPU by tests/data/hopper_mma_numerics_bf16.npz where that file exists (benchmarks/mma_numerics_probe.py).
static inline float bf16_value(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// floor(log2 |v|) of a finite nonzero float, its exponent field's; a subnormal counts as -126, its
// field's exponent, not its value's (measured for TF32 on an H200: tests/data/tf32_mma_numerics.npz,
// operands and accumulators of fp32's subnormal range)
static inline int mma_ex(float v) {
    unsigned u;
    memcpy(&u, &v, 4);
    int e = (int)((u >> 23) & 0xff);
    return e ? e - 127 : -126;
}

template <int K>
static inline float mma_sum(float c, const float* a, const float* b) {
    int E = INT_MIN;
    bool finite = std::isfinite(c);
    if (c != 0.0f && finite) E = mma_ex(c);
    for (int k = 0; k < K; k++) {
        if (!std::isfinite(a[k]) || !std::isfinite(b[k])) finite = false;
        else if (a[k] != 0.0f && b[k] != 0.0f && mma_ex(a[k]) + mma_ex(b[k]) > E) E = mma_ex(a[k]) + mma_ex(b[k]);
    }
    if (!finite) {
        double s = c;
        for (int k = 0; k < K; k++) s += (double)a[k] * (double)b[k];
        return (float)s;
    }
    if (E == INT_MIN) return c + 0.0f;      // nothing nonzero to add
    double ulp = std::ldexp(1.0, E - 25);
    double s = std::trunc((double)c / ulp) * ulp;
    for (int k = 0; k < K; k++) s += std::trunc((double)a[k] * (double)b[k] / ulp) * ulp;
    float f = (float)s;                      // to nearest; then toward zero where that rounded away
    if (std::isinf(f)) return std::copysign(FLT_MAX, f);
    if (std::fabs((double)f) > std::fabs(s)) f = std::nextafter(f, 0.0f);
    return f == 0.0f ? 0.0f : f;             // a zero result is +0, whatever the terms' signs (bf16, H200)
}

static inline float mma_k16(float c, const float* a, const float* b) { return mma_sum<16>(c, a, b); }
static inline float mma_k8(float c, const float* a, const float* b) { return mma_sum<8>(c, a, b); }

// A 32-bit register as a .tf32 operand: its top 19 bits (the low 13 mantissa bits dropped).
static inline float tf32_operand(unsigned r) {
    unsigned u = r & 0xffffe000u;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// cvt.rna.tf32.f32: x rounded to 10 mantissa bits, to nearest, ties away from zero (add half the
// dropped part's range to the magnitude, then truncate; a carry moves into the exponent, and past
// the largest float gives infinity); the low 13 bits of the result are zero. An infinity or a NaN
// keeps its top 19 bits, as an H200 does (so a NaN whose payload lies in the low 13 bits becomes
// an infinity).
static inline unsigned rna_tf32_bits(float x) {
    unsigned u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) == 0x7f800000u) return u & 0xffffe000u;
    return (u + 0x1000u) & 0xffffe000u;
}
}  // namespace clemu
