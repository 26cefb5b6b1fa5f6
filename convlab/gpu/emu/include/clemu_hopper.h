// clemu_hopper.h — the CPU emulator's model of the Hopper instructions that
// kernels/11_hopper/hopper.cuh wraps in PTX: wgmma (warpgroup MMA from shared-memory descriptors,
// fp16 or bf16, operands K-major or transposed; and tf32, K-major, for kernels/12_tf32/wgmma_tf32.cuh)
// with its fence, commit and wait, mbarriers with transaction counts, TMA tiled loads (element
// strides too) and stores,
// fence.proxy.async and setmaxnreg. Same names and parameters as hopper.cuh; file and line (default
// arguments) name the call in messages. The runtime (runtime.cpp) does the work and the checks:
//  - a warpgroup instruction waits until all 128 threads of the warpgroup (4 warps from a warp
//    index divisible by 4) reach it, at the same line, with the same operands;
//  - wgmma computes at issue from the shared tiles (checked: each chunk a TMA wrote was waited
//    for, each chunk an ordinary store wrote was fenced with fence_proxy_async), leaves a
//    signalling NaN in d, and delivers the result at the wgmma_wait that covers its group; until
//    then d must not be touched, nor the tiles overwritten;
//  - an mbarrier completes a phase when its arrivals and expected bytes are in; mbar_wait yields to
//    the other threads until the phase of that parity has completed (never: a deadlock that says
//    what the barrier still waits for);
//  - a TMA load writes its box at once (zeros outside the tensor, in the map's swizzle) and counts
//    its bytes against the barrier; a thread that reads the box before it has waited for that
//    phase is a fault;
//  - named_barrier_sync(id, threads) lets its threads through together, once `threads` have come.
// While a thread has a wgmma in flight, arithmetic on the poisoned accumulators traps (SIGFPE, with
// a message naming the line) and converting or storing the poison faults.
#pragma once
#include <cstdint>
#include "cuda_fp16.h"

#define CLEMU_HP_INLINE static inline __attribute__((always_inline))
#define CLEMU_HP_SITE const char* file = __builtin_FILE(), int line = __builtin_LINE()

CLEMU_HP_INLINE uint64_t smem_desc_128b(const void* tile, CLEMU_HP_SITE) { return clemu_smem_desc(tile, file, line); }
CLEMU_HP_INLINE uint64_t smem_desc_128b_mn(const void* tile, unsigned lbo, CLEMU_HP_SITE) {
    return clemu_smem_desc_any(tile, 1, lbo, 1024, file, line);
}
CLEMU_HP_INLINE uint64_t smem_desc_plain(const void* tile, unsigned lbo, unsigned sbo, CLEMU_HP_SITE) {
    return clemu_smem_desc_any(tile, 0, lbo, sbo, file, line);
}

CLEMU_HP_INLINE void wgmma_fence(CLEMU_HP_SITE) { clemu_wg_op(CLEMU_WG_FENCE, 0, file, line); }
CLEMU_HP_INLINE void wgmma_commit(CLEMU_HP_SITE) { clemu_wg_op(CLEMU_WG_COMMIT, 0, file, line); }
template <int N> CLEMU_HP_INLINE void wgmma_wait(CLEMU_HP_SITE) {
    static_assert(N >= 0 && N <= 7, "wgmma_wait<N>: N is how many of the most recent groups may stay in flight (0..7)");
    clemu_wg_op(CLEMU_WG_WAIT, N, file, line);
}

CLEMU_HP_INLINE void wgmma_m64n64k16(float (&d)[32], uint64_t desc_a, uint64_t desc_b, bool accumulate = true,
                                     CLEMU_HP_SITE) {
    clemu_wgmma(d, 64, desc_a, desc_b, accumulate, CLEMU_WG_F16, file, line);
}
CLEMU_HP_INLINE void wgmma_m64n128k16(float (&d)[64], uint64_t desc_a, uint64_t desc_b, bool accumulate = true,
                                      CLEMU_HP_SITE) {
    clemu_wgmma(d, 128, desc_a, desc_b, accumulate, CLEMU_WG_F16, file, line);
}
CLEMU_HP_INLINE void wgmma_m64n256k16(float (&d)[128], uint64_t desc_a, uint64_t desc_b, bool accumulate = true,
                                      CLEMU_HP_SITE) {
    clemu_wgmma(d, 256, desc_a, desc_b, accumulate, CLEMU_WG_F16, file, line);
}

// hopper.cuh's wgmma_k16<N, KIND>: fp16 or bf16 operands, A and B K-major or transposed
enum { WG_F16 = CLEMU_WG_F16, WG_BF16 = CLEMU_WG_BF16, WG_TRANS_A = CLEMU_WG_TRANS_A, WG_TRANS_B = CLEMU_WG_TRANS_B };
template <int N, int KIND>
CLEMU_HP_INLINE void wgmma_k16(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate = true,
                               CLEMU_HP_SITE) {
    static_assert(N == 64 || N == 128 || N == 256, "wgmma_k16<N>: N is 64, 128 or 256");
    static_assert((KIND & 3) == WG_F16 || (KIND & 3) == WG_BF16, "wgmma_k16<N, KIND>: KIND & 3 is WG_F16 or WG_BF16");
    clemu_wgmma(d, N, desc_a, desc_b, accumulate, KIND, file, line);
}

// wgmma m64nNk8 with .tf32 operands (kernels/12_tf32/wgmma_tf32.cuh): tiles of 32 floats a row,
// desc + 2 per 8 of them; each float read as a tf32 operand (its top 19 bits)
CLEMU_HP_INLINE void wgmma_m64n64k8_tf32(float (&d)[32], uint64_t desc_a, uint64_t desc_b, bool accumulate = true,
                                         CLEMU_HP_SITE) {
    clemu_wgmma_tf32(d, 64, desc_a, desc_b, accumulate, file, line);
}
CLEMU_HP_INLINE void wgmma_m64n128k8_tf32(float (&d)[64], uint64_t desc_a, uint64_t desc_b, bool accumulate = true,
                                          CLEMU_HP_SITE) {
    clemu_wgmma_tf32(d, 128, desc_a, desc_b, accumulate, file, line);
}

CLEMU_HP_INLINE void mbar_init(uint64_t* bar, unsigned count, CLEMU_HP_SITE) {
    clemu_mbar_init(bar, count, file, line);
}
// makes the thread's inits visible (the runtime checks every later use: mbar_visible)
CLEMU_HP_INLINE void fence_mbar_init(CLEMU_HP_SITE) { clemu_fence_mbar_init(file, line); }
CLEMU_HP_INLINE void fence_proxy_async(CLEMU_HP_SITE) { clemu_fence_proxy_async(file, line); }
CLEMU_HP_INLINE void mbar_arrive_expect_tx(uint64_t* bar, unsigned bytes, CLEMU_HP_SITE) {
    clemu_mbar_arrive(bar, bytes, 1, file, line);
}
CLEMU_HP_INLINE void mbar_arrive(uint64_t* bar, CLEMU_HP_SITE) { clemu_mbar_arrive(bar, 0, 0, file, line); }
CLEMU_HP_INLINE void mbar_wait(uint64_t* bar, unsigned parity, CLEMU_HP_SITE) {
    clemu_mbar_wait(bar, parity, file, line);
}

CLEMU_HP_INLINE void tma_load_2d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1, CLEMU_HP_SITE) {
    int c[2] = {c0, c1};
    clemu_tma_load(dst, map, bar, c, 2, file, line);
}
CLEMU_HP_INLINE void tma_load_3d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1, int c2,
                                 CLEMU_HP_SITE) {
    int c[3] = {c0, c1, c2};
    clemu_tma_load(dst, map, bar, c, 3, file, line);
}
CLEMU_HP_INLINE void tma_load_4d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1, int c2, int c3,
                                 CLEMU_HP_SITE) {
    int c[4] = {c0, c1, c2, c3};
    clemu_tma_load(dst, map, bar, c, 4, file, line);
}

// hopper.cuh's TMA store and its bulk groups (per thread)
CLEMU_HP_INLINE void tma_store_4d(const CUtensorMap* map, const void* src, int c0, int c1, int c2, int c3,
                                  CLEMU_HP_SITE) {
    int c[4] = {c0, c1, c2, c3};
    clemu_tma_store(src, map, c, 4, file, line);
}
CLEMU_HP_INLINE void bulk_commit(CLEMU_HP_SITE) { clemu_bulk_op(0, 0, file, line); }
template <int N> CLEMU_HP_INLINE void bulk_wait_read(CLEMU_HP_SITE) {
    static_assert(N >= 0 && N <= 63, "bulk_wait_read<N>: N groups may still be reading");
    clemu_bulk_op(1, N, file, line);
}

// bar.sync id, threads: the `threads` threads (whole warps) that call it with this id meet
CLEMU_HP_INLINE void named_barrier_sync(int id, int threads, CLEMU_HP_SITE) {
    clemu_named_barrier(id, threads, file, line);
}

// The emulator has no register file: setmaxnreg checks that the whole warpgroup executes it.
template <int N> CLEMU_HP_INLINE void setmaxnreg_inc(CLEMU_HP_SITE) {
    static_assert(N % 8 == 0 && N >= 24 && N <= 256, "setmaxnreg: a multiple of 8 from 24 to 256");
    clemu_wg_op(CLEMU_WG_SETMAXNREG, N, file, line);
}
template <int N> CLEMU_HP_INLINE void setmaxnreg_dec(CLEMU_HP_SITE) {
    static_assert(N % 8 == 0 && N >= 24 && N <= 256, "setmaxnreg: a multiple of 8 from 24 to 256");
    clemu_wg_op(CLEMU_WG_SETMAXNREG, N, file, line);
}
#undef CLEMU_HP_SITE
