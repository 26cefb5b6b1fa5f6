// clemu_mma_numerics.h — how the tensor cores add one k16 step of fp16 products into an fp32
// accumulator, as measured on an H100 (tests/data/hopper_mma_numerics.npz: wgmma m64n64k16 and
// mma.sync m16n8k16, bit-exact on every output of 160 trials). Used by wgmma (runtime.cpp) and
// mma_16816 (clemu_tensor_core.h), so the emulator gives the GPU's bits.
//
// For one output element, from the accumulator c and a[0..15], b[0..15] (fp16 values as floats):
//  1. the products a_k * b_k, exact (in double);
//  2. the alignment exponent E: the largest of ex(a_k) + ex(b_k) over the nonzero products and
//     ex(c) if c != 0, where ex(v) = floor(log2 |v|) (a product whose significand is >= 2 is not
//     counted one higher);
//  3. each term (c and the 16 products) truncated toward zero to a multiple of 2^(E - 25);
//  4. the truncated terms summed exactly (they lie on one grid: a double holds the sum);
//  5. the sum rounded toward zero to float.
// Zero terms add nothing and set no exponent. Not covered by the measurements, and following the
// same rule untested: fp16 subnormal inputs and fp32 overflow. An infinite or NaN operand makes the
// result the plain sum's (inf or NaN), as IEEE arithmetic gives it.
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

static inline int mma_ex(float v) {     // floor(log2 |v|) of a finite nonzero float (subnormals too)
    unsigned u;
    memcpy(&u, &v, 4);
    int e = (int)((u >> 23) & 0xff);
    return e ? e - 127 : std::ilogb(v);
}

static inline float mma_k16(float c, const float* a, const float* b) {
    int E = INT_MIN;
    bool finite = std::isfinite(c);
    if (c != 0.0f && finite) E = mma_ex(c);
    for (int k = 0; k < 16; k++) {
        if (!std::isfinite(a[k]) || !std::isfinite(b[k])) finite = false;
        else if (a[k] != 0.0f && b[k] != 0.0f && mma_ex(a[k]) + mma_ex(b[k]) > E) E = mma_ex(a[k]) + mma_ex(b[k]);
    }
    if (!finite) {
        double s = c;
        for (int k = 0; k < 16; k++) s += (double)a[k] * (double)b[k];
        return (float)s;
    }
    if (E == INT_MIN) return c + 0.0f;      // nothing nonzero to add
    double ulp = std::ldexp(1.0, E - 25);
    double s = std::trunc((double)c / ulp) * ulp;
    for (int k = 0; k < 16; k++) s += std::trunc((double)a[k] * (double)b[k] / ulp) * ulp;
    float f = (float)s;                      // to nearest; then toward zero where that rounded away
    if (std::isinf(f)) return std::copysign(FLT_MAX, f);
    if (std::fabs((double)f) > std::fabs(s)) f = std::nextafter(f, 0.0f);
    return f;
}
}  // namespace clemu
