// hopper.cuh — Hopper's asynchronous tensor-core path below CUTLASS: each function is one PTX
// instruction (or the loop around one), in the style of ../09_general/tensor_core.cuh.
//
// Requires sm_90a (compiled with -arch=compute_90a -code=sm_90a): wgmma and setmaxnreg exist only
// in the "a" (architecture-specific) target of compute capability 9.0, the H100 and H200.
//
// Warpgroup MMA (a warpgroup: 4 consecutive warps, 128 threads, whose first warp index is a
// multiple of 4; all 128 execute each of these together):
//   desc = smem_desc_128b(tile)            a matrix descriptor: tile in shared memory, 1024-byte
//       aligned, rows of 64 halves (128 bytes) in the 128-byte swizzle (16-byte chunk c of row r
//       stored at chunk c ^ (r % 8)), 8-row groups 1024 bytes apart; the layout a TMA copy with
//       CU_TENSOR_MAP_SWIZZLE_128B writes. K-major: a row is one M (or N) index, its 64 halves
//       consecutive K. desc + 2 (32 bytes further) starts at the row's next 16 halves.
//   wgmma_m64nNk16(d, desc_a, desc_b, accumulate)     wgmma.mma_async.sync.aligned.m64nNk16.f32.f16.f16
//       D (64 x N, fp32) = A (64 x 16) . B^T (N x 16)^T + (accumulate ? D : 0), N in {64, 128, 256},
//       A and B both K-major in shared memory. Thread t of the warpgroup (warp w = t/32, lane l)
//       holds rows 16w + l/4 (d[4j], d[4j+1]) and 16w + l/4 + 8 (d[4j+2], d[4j+3]), columns
//       8j + 2(l%4) and 8j + 2(l%4) + 1, j = 0 .. N/8 - 1.
//       Asynchronous: d and the shared tiles are in use until a wgmma_wait covers the group.
//   wgmma_fence()        wgmma.fence.sync.aligned: before the first wgmma, and after any ordinary
//                        write of d, so the MMA sees it
//   wgmma_commit()       wgmma.commit_group.sync.aligned: the wgmmas issued since the last commit form a group
//   wgmma_wait<N>()      wgmma.wait_group.sync.aligned N: all but the N most recent groups are done;
//                        only then may d be read, or the shared tiles they read be overwritten
//
// Transaction barriers (a 64-bit mbarrier in shared memory; it completes a phase when `count`
// arrivals and every expected byte have come; phases alternate parity 0, 1, 0, ...):
//   mbar_init(bar, count)              mbarrier.init.shared::cta.b64, by one thread, then fence_mbar_init()
//                                      and a __syncthreads() before anyone else uses it
//   mbar_arrive_expect_tx(bar, bytes)  mbarrier.arrive.expect_tx: one arrival, and `bytes` more to come by TMA
//   mbar_arrive(bar)                   mbarrier.arrive.shared::cta.b64: one arrival
//   mbar_wait(bar, parity)             mbarrier.try_wait.parity in a loop: returns once the phase of
//                                      that parity has completed
//   fence_mbar_init()                  fence.mbarrier_init.release.cluster: the init visible to the copy engine
//   fence_proxy_async()                fence.proxy.async.shared::cta: this thread's ordinary shared-memory
//                                      writes visible to the copy engine and the tensor cores (wgmma) that
//                                      read it next (then a barrier orders them)
//
// The tensor memory accelerator (TMA), from a CUtensorMap made on the host by
// convlab.runtime.tensor_map and passed as a `const __grid_constant__ CUtensorMap` parameter:
//   tma_load_2d/3d/4d(dst, &map, bar, c0, c1, ...)   cp.async.bulk.tensor.Nd.shared::cluster.global.tile
//       .mbarrier::complete_tx::bytes: one thread asks the copy engine for the box of the tensor
//       at coordinates (c0 innermost, c1, ...), in elements; coordinates outside the tensor
//       (negative ones too) read as zeros. The box lands in dst (1024-byte aligned for the 128-byte
//       swizzle) and its bytes count against bar's expected transactions.
//
// Named barriers: named_barrier_sync(id, threads) (bar.sync id, threads): waits until `threads`
// threads (a multiple of 32, whole warps) have arrived at barrier id (1..15; __syncthreads is 0):
// a warpgroup syncs its 128 threads without holding up the others.
//
// Registers: setmaxnreg_inc<N>() / setmaxnreg_dec<N>() (setmaxnreg.inc/dec.sync.aligned.u32 N):
// a warpgroup gives registers back to (or takes them from) the block's pool; the kernel needs
// __launch_bounds__(threads, 1) and every warpgroup's role in one branch of an if/else.
//
// On convlab's CPU emulator the same names come from clemu_hopper.h: an exact model that checks
// the warpgroup, the descriptors, the barriers' phases and byte counts, and every shared-memory
// access against the copies and MMAs still in flight.
#pragma once

#ifdef CONVLAB_EMULATOR
#include "clemu_hopper.h"
#else
#include <cuda.h>
#include <cstdint>

__device__ __forceinline__ unsigned hp_smem(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ uint64_t smem_desc_128b(const void* tile) {
    uint64_t addr = hp_smem(tile);
    return ((addr & 0x3FFFF) >> 4)          // start address, 16-byte units
           | (uint64_t(16 >> 4) << 16)      // leading byte offset (unused by a swizzled K-major tile)
           | (uint64_t(1024 >> 4) << 32)    // stride byte offset: 8 rows of 128 bytes
           | (uint64_t(1) << 62);           // layout: 128-byte swizzle
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait() {
    static_assert(N >= 0 && N <= 7, "wgmma_wait<N>: N is how many of the most recent groups may stay in flight (0..7)");
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(N) : "memory");
}

__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[32], uint64_t desc_a, uint64_t desc_b, bool accumulate = true) {
    asm volatile("{\n.reg .pred p;\n"
                 "setp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
                 "{"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
                 "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)));
}
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], uint64_t desc_a, uint64_t desc_b, bool accumulate = true) {
    asm volatile("{\n.reg .pred p;\n"
                 "setp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
                 "{"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
                 "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)));
}
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t desc_a, uint64_t desc_b, bool accumulate = true) {
    asm volatile("{\n.reg .pred p;\n"
                 "setp.ne.b32 p, %130, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 "
                 "{"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
                 "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
                 "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
                 "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
                 "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
                 "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
                   "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
                   "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
                   "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
                   "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
                   "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
                   "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
                   "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
                   "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
                 : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)));
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(hp_smem(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void fence_mbar_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, unsigned bytes) {  // listing: mbarrier
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" :: "r"(hp_smem(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(hp_smem(bar)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, unsigned parity) {
    asm volatile("{\n.reg .pred done;\n"
                 "WAIT_%=:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra WAIT_%=;\n}\n" :: "r"(hp_smem(bar)), "r"(parity) : "memory");
}  // end listing: mbarrier

__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%3, %4}], [%2];\n"
                 :: "r"(hp_smem(dst)), "l"(map), "r"(hp_smem(bar)), "r"(c0), "r"(c1) : "memory");
}
__device__ __forceinline__ void tma_load_3d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1, int c2) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%3, %4, %5}], [%2];\n"
                 :: "r"(hp_smem(dst)), "l"(map), "r"(hp_smem(bar)), "r"(c0), "r"(c1), "r"(c2) : "memory");
}
__device__ __forceinline__ void tma_load_4d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1, int c2,
                                            int c3) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%3, %4, %5, %6}], [%2];\n"
                 :: "r"(hp_smem(dst)), "l"(map), "r"(hp_smem(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3) : "memory");
}

__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" :: "r"(id), "r"(threads) : "memory");
}

template <int N> __device__ __forceinline__ void setmaxnreg_inc() {
    static_assert(N % 8 == 0 && N >= 24 && N <= 256, "setmaxnreg: a multiple of 8 from 24 to 256");
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(N));
}
template <int N> __device__ __forceinline__ void setmaxnreg_dec() {
    static_assert(N % 8 == 0 && N >= 24 && N <= 256, "setmaxnreg: a multiple of 8 from 24 to 256");
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(N));
}
// ---- more of wgmma: bf16, transposed operands, other shared-memory layouts (the layers' kernels) ----
//   wgmma_k16<N, KIND>(d, desc_a, desc_b, accumulate)   wgmma.mma_async.sync.aligned.m64nNk16.f32.T.T
//       with T = f16 (KIND & 3 == WG_F16) or bf16 (WG_BF16), N in {64, 128, 256}; imm-trans-a = 1 when
//       KIND & WG_TRANS_A (A M-major: a row of the tile is one K index, its 64 M values consecutive),
//       imm-trans-b = 1 when KIND & WG_TRANS_B (B N-major). d is laid out as wgmma_m64nNk16's.
//   smem_desc_128b_mn(tile, lbo)   an M- or N-major tile in the 128-byte swizzle, 1024-byte aligned:
//       rows of 64 M (or N) values (128 bytes), one row per K index, 8-row groups 1024 bytes apart
//       (the layout a TMA box of 64 channels x pixels writes); the next 64 M/N values `lbo` bytes
//       further. desc + 128 (2048 bytes on) starts at K + 16.
//   smem_desc_plain(tile, lbo, sbo)   a K-major tile without swizzle, 16-byte aligned: core matrices
//       of 8 rows x 8 values (16 bytes a row, rows consecutive); rows 8..15 `sbo` bytes on, K values
//       8..15 `lbo` bytes on (the layout two TMA boxes of 8 channels each write, lbo apart).
//   tma_store_4d(&map, src, c0, c1, c2, c3)   cp.async.bulk.tensor.4d.global.shared::cta.bulk_group:
//       the copy engine writes the box at src (laid out as a load of that box would land, in the
//       map's swizzle) to the tensor at (c0 innermost, ...), only the elements inside it. Reads src
//       after it is issued: the writing threads' fence_proxy_async() and a barrier before it, and
//       src is not overwritten before this thread's bulk_wait_read<N>() that covers its group.
//   bulk_commit()          cp.async.bulk.commit_group: this thread's stores since the last commit form a group
//   bulk_wait_read<N>()    cp.async.bulk.wait_group.read N: all but this thread's N most recent groups
//                          have read their sources
enum { WG_F16 = 0, WG_BF16 = 1, WG_TRANS_A = 4, WG_TRANS_B = 8 };

__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, const void* src, int c0, int c1, int c2, int c3) {
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n"
                 :: "l"(map), "r"(hp_smem(src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3) : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void bulk_wait_read() {
    static_assert(N >= 0 && N <= 63, "bulk_wait_read<N>: N groups may still be reading");
    asm volatile("cp.async.bulk.wait_group.read %0;\n" :: "n"(N) : "memory");
}

__device__ __forceinline__ uint64_t smem_desc_128b_mn(const void* tile, unsigned lbo) {
    return ((hp_smem(tile) & 0x3FFFF) >> 4) | (uint64_t((lbo & 0x3FFFF) >> 4) << 16) | (uint64_t(1024 >> 4) << 32)
           | (uint64_t(1) << 62);
}
__device__ __forceinline__ uint64_t smem_desc_plain(const void* tile, unsigned lbo, unsigned sbo) {
    return ((hp_smem(tile) & 0x3FFFF) >> 4) | (uint64_t((lbo & 0x3FFFF) >> 4) << 16)
           | (uint64_t((sbo & 0x3FFFF) >> 4) << 32);    // layout 0: no swizzle
}

#define HP_D8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
                 "+f"(d[i + 6]), "+f"(d[i + 7])
#define HP_D32(i) HP_D8(i), HP_D8(i + 8), HP_D8(i + 16), HP_D8(i + 24)
#define HP_REGS32 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
                  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define HP_REGS64 HP_REGS32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
                  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define HP_REGS128 HP_REGS64 ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
                   "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, " \
                   "%98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, " \
                   "%113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
// one instruction: SHAPE and TYPE spelled out, REGS the accumulators, A/B/P/TA/TB the numbers of the
// operands after them
#define HP_WGMMA(SHAPE, TYPE, REGS, A, B, P, TA, TB, ...)                                                       \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" P ", 0;\n"                                               \
                 "wgmma.mma_async.sync.aligned." SHAPE ".f32." TYPE "." TYPE " {" REGS "}, %" A ", %" B        \
                 ", p, 1, 1, %" TA ", %" TB ";\n}\n"                                                              \
                 : __VA_ARGS__ : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)), "n"((KIND & WG_TRANS_A) ? 1 : 0),  \
                   "n"((KIND & WG_TRANS_B) ? 1 : 0))

template <int N, int KIND>
__device__ __forceinline__ void wgmma_k16(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate = true) {
    static_assert(N == 64 || N == 128 || N == 256, "wgmma_k16<N>: N is 64, 128 or 256");
    static_assert((KIND & 3) == WG_F16 || (KIND & 3) == WG_BF16, "wgmma_k16<N, KIND>: KIND & 3 is WG_F16 or WG_BF16");
    constexpr bool bf16 = (KIND & 3) == WG_BF16;
    if constexpr (N == 64) {
        if constexpr (bf16) HP_WGMMA("m64n64k16", "bf16", HP_REGS32, "32", "33", "34", "35", "36", HP_D32(0));
        else HP_WGMMA("m64n64k16", "f16", HP_REGS32, "32", "33", "34", "35", "36", HP_D32(0));
    } else if constexpr (N == 128) {
        if constexpr (bf16) HP_WGMMA("m64n128k16", "bf16", HP_REGS64, "64", "65", "66", "67", "68", HP_D32(0), HP_D32(32));
        else HP_WGMMA("m64n128k16", "f16", HP_REGS64, "64", "65", "66", "67", "68", HP_D32(0), HP_D32(32));
    } else {
        if constexpr (bf16)
            HP_WGMMA("m64n256k16", "bf16", HP_REGS128, "128", "129", "130", "131", "132", HP_D32(0), HP_D32(32),
                     HP_D32(64), HP_D32(96));
        else
            HP_WGMMA("m64n256k16", "f16", HP_REGS128, "128", "129", "130", "131", "132", HP_D32(0), HP_D32(32),
                     HP_D32(64), HP_D32(96));
    }
}
#undef HP_WGMMA
#undef HP_REGS128
#undef HP_REGS64
#undef HP_REGS32
#undef HP_D32
#undef HP_D8
#endif
