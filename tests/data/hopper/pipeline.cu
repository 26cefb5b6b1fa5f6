// Requires sm_90a
// A small TMA -> mbarrier -> wgmma pipeline for tests/test_hopper_emulator.py: D (64 x 64 floats) =
// alpha * sum over rounds r of A_r . B^T, A_r rows 64r..64r+63 of A (64 * rounds x 64 halves), B 64 x 64
// halves, K = 64 (four m64n64k16 steps a round). Warpgroup 0's thread 0 loads each round's A_r (and B,
// unless b_by_threads: then warpgroup 1 writes B into shared memory itself, in the 128-byte swizzle)
// into one of two stages; warpgroup 1 multiplies. `bug` makes one of the mistakes the emulator reports
// (0: none); the lines it names carry a [tag] comment the test finds.
#include <cuda_fp16.h>
#include "11_hopper/hopper.cuh"

#define STAGES 2
constexpr int TILE = 64 * 64 * 2;                 // one 64 x 64 tile of halves: 8 KB

__global__ void __launch_bounds__(256, 1)
pipeline(float* D, const half* B, const __grid_constant__ CUtensorMap a_map, const __grid_constant__ CUtensorMap b_map,
         int rounds, float alpha, int b_by_threads, int bug) {
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = (unsigned char*)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    unsigned char* b_tile = smem + STAGES * TILE;
    __shared__ uint64_t full[STAGES], empty[STAGES], extra[1];
    int t = threadIdx.x;
    // the producer's threads and the consumers': bug 11 leaves warp 4 out of the consumers, bug 12 makes
    // warps 1-4 the consumers (a warpgroup that starts at warp 1)
    int split = bug == 12 ? 32 : 128, consumer0 = bug == 11 ? 160 : split;
    if (t == 0) {
        for (int s = 0; s < STAGES; s++) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], 1);
        }
        if (bug != 13) mbar_init(&extra[0], 1);
        fence_mbar_init();
    }
    __syncthreads();
    if (t < split) {
        if (t == 0) {
            for (int r = 0; r < rounds; r++) {
                int s = r % STAGES;
                if (r >= STAGES && bug != 21) mbar_wait(&empty[s], (r / STAGES - 1) & 1);
                int b_now = !b_by_threads && r == 0;             // B comes once, with round 0's A
                int bytes = TILE + (b_now ? TILE : 0) + (bug == 9 ? -TILE : bug == 10 ? 1024 : 0);
                mbar_arrive_expect_tx(&full[s], bytes);                                  // [expect]
                tma_load_2d(smem + s * TILE, &a_map, &full[s], 0, 64 * r);               // [tma_a]
                if (b_now) tma_load_2d(b_tile, &b_map, &full[s], 0, 0);                  // [tma_b]
            }
        }
    } else if (t >= consumer0 && t < split + 128) {
        int u = t - split, warp = u / 32, lane = u % 32;
        if (b_by_threads) {
            // B row n, bytes 4w..4w+3 (halves 2w, 2w+1) -> the 128-byte swizzle: chunk (4w/16) ^ (n % 8)
            for (int i = u; i < 64 * 32; i += 128) {
                int n = i / 32, w = i % 32, byte = 4 * w;
                int at = (n / 8) * 1024 + (n % 8) * 128 + (((byte / 16) ^ (n % 8)) * 16) + byte % 16;
                ((unsigned*)b_tile)[at / 4] = ((const unsigned*)B)[n * 32 + w];   // [store_b]
            }
            if (bug != 8) fence_proxy_async();
            named_barrier_sync(1, 128);
        }
        float acc[32];
        for (int i = 0; i < 32; i++) acc[i] = 0.f;
        for (int r = 0; r < rounds; r++) {
            int s = r % STAGES;
            if (bug == 7) D[u] = (float)((const unsigned*)(smem + s * TILE))[u];   // [early_read]
            if (bug != 6) mbar_wait(&full[s], (r / STAGES + (bug == 17)) & 1);        // [wait_full]
            uint64_t da = smem_desc_128b(smem + s * TILE + (bug == 14 ? 512 : 0));   // [desc]
            uint64_t db = smem_desc_128b(bug == 15 ? (void*)D : (void*)b_tile);      // [desc_b]
            if (bug == 20 && warp == 0) __syncthreads();                             // [stray_sync]
            if (bug != 22) wgmma_fence();                                            // [fence]
            for (int k = 0; k < 4; k++) wgmma_m64n64k16(acc, da + 2 * k, db + 2 * k);   // [wgmma]
            wgmma_commit();
            if (bug == 3) acc[5] = 1.f;                                              // [touch]
            if (bug == 4 && u == 7) ((unsigned*)(smem + s * TILE))[u] = 0u;          // [overwrite]
            if (bug == 5 && u == 0) {
                mbar_arrive_expect_tx(&extra[0], TILE);
                tma_load_2d(smem + s * TILE, &a_map, &extra[0], 0, 0);               // [tma_over]
            }
            if (bug == 13 && u == 0) mbar_arrive(&extra[0]);                         // [uninit]
            if (bug != 1 && bug != 18 && bug != 19) wgmma_wait<0>();
            if (u == 0) mbar_arrive(&empty[s]);
        }
        if (bug == 2) {                       // one more round's MMAs, and a wait that leaves them in flight
            wgmma_fence();
            uint64_t da = smem_desc_128b(smem), db = smem_desc_128b(b_tile);
            for (int k = 0; k < 4; k++) wgmma_m64n64k16(acc, da + 2 * k, db + 2 * k);
            wgmma_commit();
            wgmma_wait<1>();                                                         // [wait1]
        }
        if (bug == 18) {                      // the accumulators copied out, no arithmetic on them
            for (int i = 0; i < 32; i++) D[64 * 64 - 32 * 128 + 32 * u + i] = acc[i];           // [copy_out]
            return;
        }
        if (bug == 19) {                      // the same as float4s: stores the emulator does not check
            for (int i = 0; i < 8; i++) *(float4*)&D[64 * 64 - 32 * 128 + 32 * u + 4 * i] = *(const float4*)&acc[4 * i];
            return;
        }
        for (int j = 0; j < 8; j++)
            for (int q = 0; q < 4; q++)
                D[(16 * warp + lane / 4 + 8 * (q / 2)) * 64 + 8 * j + 2 * (lane % 4) + q % 2] =
                    alpha * acc[4 * j + q];                                                  // [epilogue]
    }
    if (bug == 16 && t == 0) {
        uint64_t mine;
        mbar_init(&mine, 1);                                                         // [local_bar]
    }
}
