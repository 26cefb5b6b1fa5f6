"""The emulator's checker against realistic mistakes from edited exercise solutions: each mistake
fails with its named fault and advice that is true, and the correct alternative passes. Small .cu
strings compiled with cl.load_source, run through kernels and the exercise checks (convlab.teach, convlab.chapters)."""
import sys
import time

import pytest
import torch

import convlab as cl
import convlab.teach.checks as ex
from convlab.gpu import emu

pytestmark = pytest.mark.emu_only


# ---- 1. warp operations check their masks ------------------------------------------------------

WARP = r"""
// op: 0 shfl_down, 1 ballot, 2 any, 3 all, 4 syncwarp, 5 reduce_add, 6 match_any, 7 shfl_xor,
// 8 match_all, 9 reduce_max and reduce_min
__global__ void warp_op(const float* x, float* y, unsigned mask, int op) {
    int lane = threadIdx.x % 32;
    float v = x[threadIdx.x];
    float r = 0.0f;
    if (op == 0) { for (int o = 16; o > 0; o /= 2) v += __shfl_down_sync(mask, v, o); r = v; }
    if (op == 1) r = (float)__popc(__ballot_sync(mask, v > 0.0f));
    if (op == 2) r = __any_sync(mask, v > 100.0f) ? 1.0f : 0.0f;
    if (op == 3) r = __all_sync(mask, v < 100.0f) ? 1.0f : 0.0f;
    if (op == 4) { __syncwarp(mask); r = v; }
    if (op == 5) r = (float)__reduce_add_sync(mask, (unsigned)lane);
    if (op == 6) r = (float)__popc(__match_any_sync(mask, lane / 8));
    if (op == 7) { for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(mask, v, o); r = v; }
    if (op == 8) {
        int same, differ;
        unsigned m = __match_all_sync(mask, 7, &same);
        __match_all_sync(mask, lane / 8, &differ);
        r = (m == mask && same && !differ) ? 1.0f : 0.0f;
    }
    if (op == 9) r = (float)(__reduce_max_sync(mask, (unsigned)lane) + __reduce_min_sync(mask, lane - 5));
    y[threadIdx.x] = r;
}

// three mistakes that pass on a GPU most of the time: lanes of one call with different masks, a mask
// that names lanes which have returned, or that wait at a __syncthreads(); and the valid form: each
// half of the warp with its own mask
__global__ void halves(const float* x, float* y, int mistake) {
    int lane = threadIdx.x % 32;
    float v = x[threadIdx.x];
    if (mistake == 1) {
        unsigned m = lane < 16 ? 0xffffffffu : 0xffff0000u;
        v += __shfl_xor_sync(m, v, 1);
    } else if (mistake == 2) {
        if (lane >= 16) return;
        v += __shfl_down_sync(0xffffffffu, v, 1);
    } else if (mistake == 3) {
        if (lane < 16) v += __shfl_down_sync(0xffffffffu, v, 1);
        __syncthreads();
    } else if (lane < 16) {
        v += __shfl_down_sync(0x0000ffffu, v, 1, 16);
    } else {
        v += __shfl_down_sync(0xffff0000u, v, 1, 16);
    }
    y[threadIdx.x] = v;
}
"""


@pytest.fixture(scope="module")
def warp():
    return cl.load_source(WARP, name="mutant_warp")


@pytest.mark.parametrize("op", range(10))
@pytest.mark.parametrize("mask, left_out", [(0x0000FFFF, "lanes 16-31"), (0x1, "lanes 1-31")])
def test_mask_that_leaves_out_calling_lanes_fails(warp, op, mask, left_out):
    x = cl.randn(32)
    with pytest.raises(cl.WarpMaskError) as e:
        warp.warp_op(x, cl.empty(32), mask, op, grid=1, block=32)
    msg = str(e.value)
    assert f"{left_out} of warp 0 call it with mask {mask:#010x}, which leaves them out" in msg
    assert "mutant_warp.cu:" in msg and "lanes 0-31 call it here, so pass 0xffffffff" in msg


@pytest.mark.parametrize("block", [32, 64])
def test_full_mask_warp_operations_pass(warp, block):
    x = cl.randn(block)
    lanes = torch.arange(block) % 32
    expect = {
        0: x.view(-1, 32).double().sum(1).repeat_interleave(32),   # lane 0 of each warp has the sum
        1: (x > 0).view(-1, 32).sum(1).double().repeat_interleave(32),
        2: torch.zeros(block, dtype=torch.float64),
        3: torch.ones(block, dtype=torch.float64),
        4: x.double(),
        5: torch.full((block,), float(sum(range(32))), dtype=torch.float64),
        6: torch.full((block,), 8.0, dtype=torch.float64),
        7: x.view(-1, 32).double().sum(1).repeat_interleave(32),   # every lane has the sum
        8: torch.ones(block, dtype=torch.float64),
        9: torch.full((block,), 31.0 - 5.0, dtype=torch.float64),
    }
    for op, want in expect.items():
        y = cl.empty(block)
        warp.warp_op(x, y, 0xFFFFFFFF, op, grid=1, block=block)
        if op == 0:
            y, want = y[lanes == 0], want[lanes == 0]
        cl.check(y, want, name=f"op {op}")


def test_lanes_of_one_call_with_different_masks_fail(warp):
    with pytest.raises(cl.WarpMaskError) as e:
        warp.halves(cl.randn(32), cl.empty(32), 1, grid=1, block=32)
    msg = str(e.value)
    assert "lanes 0-15 pass mask 0xffffffff" in msg and "lanes 16-31 pass mask 0xffff0000" in msg
    assert "must all pass the same mask" in msg and "mutant_warp.cu:" in msg


def test_mask_naming_returned_lanes_fails(warp):
    with pytest.raises(cl.BarrierError) as e:   # a WarpMaskError is a BarrierError
        warp.halves(cl.randn(32), cl.empty(32), 2, grid=1, block=32)
    assert isinstance(e.value, cl.WarpMaskError)
    msg = str(e.value)
    assert "mask 0xffffffff names lanes 16-31 of warp 0" in msg and "already returned" in msg


def test_mask_naming_lanes_at_a_barrier_fails(warp):
    with pytest.raises(cl.WarpMaskError) as e:
        warp.halves(cl.randn(64), cl.empty(64), 3, grid=1, block=64)
    msg = str(e.value)
    assert "lanes 0-15 of warp 0 wait at a warp operation at mutant_warp.cu:" in msg
    assert "mask 0xffffffff, which names lanes 16-31, but they wait at __syncthreads() at mutant_warp.cu:" in msg


def test_each_half_of_the_warp_with_its_own_mask_passes(warp):
    x, y = cl.randn(32), cl.empty(32)
    warp.halves(x, y, 0, grid=1, block=32)
    h = x.double().view(2, 16)
    want = torch.cat([h[:, :15] + h[:, 1:], 2 * h[:, 15:]], 1).flatten()
    cl.check(y, want)


# ---- 2. __shared__ arrays as CUDA has them: sizeof, decay to pointers ----------------------------

SHARED = r"""
#include <mma.h>
#include <cuda_fp16.h>
using namespace nvcuda;
#define TR 4
#define TC 8
template <class T> __device__ T first(const T* p) { return p[0]; }

__global__ void sized(const float* x, float* y, int mistake) {
    __shared__ float tile[TR][TC];
    static_assert(sizeof(tile) == TR * TC * 4, "the whole tile");
    static_assert(sizeof(tile[0]) == TC * sizeof(float), "one row");
    static_assert(sizeof tile[0][0] == sizeof(float), "one element");
    if (threadIdx.x == 0) memset(tile, 0, sizeof(tile));
    __syncthreads();
    float* flat = &tile[0][0];
    int n = mistake ? (int)sizeof(tile) : (int)(sizeof(tile) / sizeof(float));   // bytes, not elements
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        tile[i / TC][i % TC] += x[i % (TR * TC)];
    __syncthreads();
    y[threadIdx.x] = flat[threadIdx.x] + first(tile[1]) * 0.0f + (float)(sizeof(tile[1]) / sizeof(float)) * 0.0f;
}

// pointers made into a shared tile: their elements are checked against the whole tile
__global__ void through_pointer(float* y, int off) {
    __shared__ float tile[TR][TC];
    float* flat = &tile[0][0];
    for (int i = threadIdx.x; i < TR * TC; i += blockDim.x) flat[i] = (float)i;
    __syncthreads();
    const float* row = tile[1];
    y[threadIdx.x] = row[threadIdx.x + off];
}

// one warp: D = A B with the tiles staged in shared memory, passed as rows to wmma and a template
__global__ void wmma_rows(const half* a, const half* b, float* d) {
    __shared__ __align__(32) half As[2][16 * 16];
    __shared__ __align__(32) half Bs[16][16];
    __shared__ __align__(32) float Cs[16][16];
    for (int i = threadIdx.x; i < 256; i += 32) { As[0][i] = a[i]; Bs[i / 16][i % 16] = b[i]; }
    __syncwarp();
    wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::row_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    wmma::load_matrix_sync(fa, As[0], 16);
    wmma::load_matrix_sync(fb, Bs[0], 16);
    wmma::mma_sync(acc, fa, fb, acc);
    wmma::store_matrix_sync(Cs[0], acc, 16, wmma::mem_row_major);
    __syncwarp();
    for (int i = threadIdx.x; i < 256; i += 32) d[i] = Cs[i / 16][i % 16];
    if (threadIdx.x == 0) d[256] = (Cs[1] == Cs[0] + 16 && first(Cs[0]) == Cs[0][0]) ? 1.0f : 0.0f;
}
"""


@pytest.fixture(scope="module")
def shared():
    return cl.load_source(SHARED, name="mutant_shared")


def test_sizeof_of_a_shared_tile_and_its_rows_is_the_arrays(shared):
    # compiles (the static_asserts), clears the whole tile with memset, loops over sizeof/sizeof(float)
    x, y = cl.randn(32), cl.empty(32)
    shared.sized(x, y, 0, grid=1, block=32)
    cl.check(y, x.double())


def test_loop_to_sizeof_in_bytes_is_out_of_range(shared):
    with pytest.raises(cl.OutOfBoundsError) as e:
        shared.sized(cl.randn(32), cl.empty(32), 1, grid=1, block=32)
    msg = str(e.value)
    assert "__shared__ tile[4]" in msg and "outside its 4 elements" in msg and "mutant_shared.cu:" in msg


def test_pointers_into_a_shared_tile_are_bounds_checked(shared):
    y = cl.empty(24)
    shared.through_pointer(y, 0, grid=1, block=24)
    cl.check(y, torch.arange(8, 32, dtype=torch.float64))
    with pytest.raises(cl.OutOfBoundsError) as e:   # row 1 plus 8 + 23: past the 32 elements
        shared.through_pointer(cl.empty(24), 8, grid=1, block=24)
    msg = str(e.value)
    assert "through a pointer into __shared__ tile, element 32 of 4 bytes (byte 128 from the array's start)" in msg
    assert "tile has 128 bytes" in msg and "(past its end)" in msg and "mutant_shared.cu:" in msg


def test_wmma_and_templates_take_rows_of_shared_arrays(shared):
    a, b = torch.randn(16, 16).half(), torch.randn(16, 16).half()
    d = cl.zeros(257)
    shared.wmma_rows(cl.to_device(a), cl.to_device(b), d, grid=1, block=32)
    cl.check(d[:256].view(16, 16), a.double() @ b.double(), rtol=1e-5, atol=1e-5)
    assert float(d[256]) == 1.0   # a row decays to the address of its first element


# ---- 3. advice that is true ---------------------------------------------------------------------

RACES = r"""
#define N 128
// the warp-synchronous tail of a block reduction: mistake 1 without __syncwarp (as it was written
// for GPUs before Volta), mistake 2 a __syncwarp after each `s[t] += s[t + k]` (the statement still
// reads what other lanes write); correct: read, __syncwarp, write, __syncwarp
__global__ void tail(const float* x, float* y, int mistake) {
    __shared__ float s[N];
    int t = threadIdx.x;
    s[t] = x[blockIdx.x * N + t];
    __syncthreads();
    for (int k = N / 2; k > 32; k /= 2) {
        if (t < k) s[t] += s[t + k];
        __syncthreads();
    }
    if (t < 32) {
        if (mistake == 1) {
            s[t] += s[t + 32];
            s[t] += s[t + 16];
            s[t] += s[t + 8];
            s[t] += s[t + 4];
            s[t] += s[t + 2];
            s[t] += s[t + 1];
        } else if (mistake == 2) {
            for (int k = 32; k > 0; k /= 2) { s[t] += s[t + k]; __syncwarp(); }
        } else if (mistake == 3) {
            volatile float* vs = s;   // the pre-Volta idiom: volatile, and no __syncwarp
            for (int k = 32; k > 0; k /= 2) vs[t] += vs[t + k];
        } else {
            float v = s[t];
            for (int k = 32; k > 0; k /= 2) { v += s[t + k]; __syncwarp(); s[t] = v; __syncwarp(); }
        }
    }
    if (t == 0) y[blockIdx.x] = s[0];
}

// y = 2x over n elements. mistake 1: a grid-stride loop that steps by blockDim.x (every block
// writes every element); 2: every block writes the same row; 3: `+=` from every block
__global__ void twice(const float* x, float* y, int n, int mistake) {
    int step = mistake == 1 ? blockDim.x : blockDim.x * gridDim.x;
    int start = mistake == 2 ? threadIdx.x : blockIdx.x * blockDim.x + threadIdx.x;
    for (int i = start; i < n; i += step) {
        if (mistake == 3) y[i % blockDim.x] += 2.0f * x[i];
        else y[i] = 2.0f * x[i];
    }
}

// a tile of x (and a halo of 2) staged in extern shared memory (through a pointer: `through`)
__global__ void staged(const float* x, float* y, int n, int stride, int through) {
    extern __shared__ float smem[];
    float* p = smem;
    if (through) {
        for (int i = threadIdx.x; i < blockDim.x * stride + 2; i += blockDim.x) p[i] = 0.0f;
        __syncthreads();
    }
    int base = blockIdx.x * blockDim.x * stride;
    for (int i = threadIdx.x; i < blockDim.x * stride + 2; i += blockDim.x)
        smem[i] = base + i < n ? x[base + i] : 0.0f;
    __syncthreads();
    int o = blockIdx.x * blockDim.x + threadIdx.x;
    int s = threadIdx.x * stride;
    if (o < (n - 3) / stride + 1) y[o] = smem[s] + smem[s + 1] + smem[s + 2];
}
"""


@pytest.fixture(scope="module")
def races():
    return cl.load_source(RACES, name="mutant_races")


def test_warp_synchronous_tail_without_syncwarp_is_told_syncwarp(races):
    with pytest.raises(cl.RaceError) as e:
        races.tail(cl.randn(2 * 128), cl.empty(2), 1, grid=2, block=128)
    msg = str(e.value)
    assert "Both threads are lanes of warp 0" in msg and "put a __syncwarp() between mutant_races.cu:" in msg
    assert "__syncthreads() between" not in msg and "right after" not in msg


def test_volatile_tail_through_a_pointer_is_a_race_too(races):
    # accesses through a local pointer into a __shared__ array are watched like the array's own
    with pytest.raises(cl.RaceError) as e:
        races.tail(cl.randn(2 * 128), cl.empty(2), 3, grid=2, block=128)
    msg = str(e.value)
    assert "data race on __shared__ s[" in msg and "mutant_races.cu:27" in msg
    assert "read into a register, then __syncwarp(), then write" in msg


def test_syncwarp_after_a_read_modify_write_is_told_to_split_it(races):
    with pytest.raises(cl.RaceError) as e:
        races.tail(cl.randn(2 * 128), cl.empty(2), 2, grid=2, block=128)
    msg = str(e.value)
    assert "read into a register, then __syncwarp(), then write" in msg and "mutant_races.cu:24" in msg
    assert "__syncthreads() between" not in msg


def test_correct_warp_synchronous_tail_passes(races):
    x, y = cl.randn(2 * 128), cl.empty(2)
    races.tail(x, y, 0, grid=2, block=128)
    cl.check(y, x.double().view(2, 128).sum(1))


@pytest.mark.parametrize("mistake", [1, 2])
def test_stores_of_many_blocks_to_one_element_are_told_one_writer(races, mistake):
    with pytest.raises(cl.RaceError) as e:
        races.twice(cl.randn(256), cl.zeros(256), 256, mistake, grid=4, block=64)
    msg = str(e.value)
    assert "Threads of different blocks store to the same element" in msg
    assert "needs exactly one writer" in msg and "steps by blockDim.x * gridDim.x" in msg
    assert "atomicAdd" not in msg


def test_plus_equals_of_many_blocks_is_told_atomic_add(races):
    with pytest.raises(cl.RaceError) as e:
        races.twice(cl.randn(256), cl.zeros(256), 256, 3, grid=4, block=64)
    assert "combine their contributions with atomicAdd at mutant_races.cu:" in str(e.value)


def test_grid_stride_loop_with_the_whole_grid_step_passes(races):
    x, y = cl.randn(1000), cl.empty(1000)
    races.twice(x, y, 1000, 0, grid=3, block=64)
    cl.check(y, 2 * x.double())


def test_shared_size_hint_comes_from_the_access_not_a_tile_formula(races):
    n, block, stride = 300, 32, 2
    outs = (n - 3) // stride + 1
    grid = (outs + block - 1) // block
    with pytest.raises(cl.OutOfBoundsError) as e:   # shared= for stride 1: (block + 2) floats
        races.staged(cl.randn(n), cl.empty(outs), n, stride, 0, grid=grid, block=block, shared=(block + 2) * 4)
    msg = str(e.value)
    assert "extern __shared__ smem[64]" in msg and "this index needs at least shared=260" in msg
    assert "TILE" not in msg
    with pytest.raises(cl.OutOfBoundsError) as e:   # the same through a pointer
        races.staged(cl.randn(n), cl.empty(outs), n, stride, 1, grid=grid, block=block, shared=(block + 2) * 4)
    msg = str(e.value)
    assert "bytes [256, 260) of extern __shared__ memory" in msg and "through a pointer" in msg
    assert "needs at least 260" in msg and "mutant_races.cu:" in msg
    x, y = cl.randn(n), cl.empty(outs)
    races.staged(x, y, n, stride, 1, grid=grid, block=block, shared=(block * stride + 2) * 4)
    xs = x.double()
    cl.check(y, xs[0:2 * outs:2] + xs[1:2 * outs + 1:2] + xs[2:2 * outs + 2:2])


# ---- 4. smaller: the time limit in checks, the progress line, ldmatrix .x2's unused lanes --------

HANG = r"""
__global__ void copy_forever(const float* x, const float* w, float* y, int n) {
    for (int i = threadIdx.x; i < n; i += 0) y[i] = x[i] + 0.0f * w[0];
}
"""


def test_a_hung_kernel_in_an_exercise_check_stops_after_a_few_seconds(capsys):
    mod = cl.load_source(HANG, name="mutant_hang")

    def launch(x, w, y, stride, pad):
        mod.copy_forever(x, w, y, min(y.numel(), 64), grid=1, block=32)
    t0 = time.monotonic()
    assert not ex.check_kernel(launch)
    took = time.monotonic() - t0
    out = capsys.readouterr().out
    assert "no CUDA thread finished in the last" in out and "cl.set_timeout(60)" in out
    assert "mutant_hang.cu:3" in out
    assert took < cl.DEFAULT_TIMEOUT   # the check's limit, not the 10 s one


def test_set_timeout_overrides_the_checks_limit():
    from convlab.gpu import runtime
    assert cl.launch_timeout() == cl.DEFAULT_TIMEOUT and runtime.total_limit() is None
    with cl.time_limit(ex.CHECK_TIMEOUT_S):
        assert runtime.total_limit() == ex.CHECK_TIMEOUT_S
        old = cl.DEFAULT_TIMEOUT
        cl.set_timeout(60)
        try:
            assert cl.launch_timeout() == 60 and runtime.total_limit() is None
        finally:
            cl.set_timeout(old)
        assert runtime.total_limit() == ex.CHECK_TIMEOUT_S


def test_progress_line_is_emptied_in_a_notebook(monkeypatch, capsys):
    monkeypatch.setenv("CONVLAB_PROGRESS", "1")      # an interactive session (the tests turn it off)
    shown = []

    class Handle:
        def update(self, data, raw):
            shown.append(data["text/plain"])
    display_mod = pytest.importorskip("IPython.display")
    monkeypatch.setattr(display_mod, "display", lambda data, raw, display_id: shown.append(data["text/plain"]) or Handle())
    p = emu._Progress()
    p.notebook = True
    p.show("k: 10 of 100 blocks started, 3 s")
    p.show("k: 20 of 100 blocks started, 4 s")
    p.end("k: done after 4.2 s")
    assert shown == ["k: 10 of 100 blocks started, 3 s", "k: 20 of 100 blocks started, 4 s", ""]
    assert capsys.readouterr().err == ""   # nothing in the saved stream
    p = emu._Progress()
    p.notebook = False
    p.show("k: 10 of 100 blocks started, 3 s")
    p.end("k: done after 4.2 s")
    err = capsys.readouterr().err
    assert err.startswith("\rk: 10 of 100") and "\rk: done after 4.2 s" in err and err.endswith("\n")


LDMATRIX = r"""
#include "09_general/tensor_core.cuh"
// lanes 16-31 pass an address .x2 does not read: a null pointer, or a row past sb
__global__ void load_b(const unsigned short* B, unsigned* regs, int unused) {
    __shared__ __align__(16) unsigned short sb[16][8];
    int l = threadIdx.x;
    for (int i = l; i < 128; i += 32) sb[i / 8][i % 8] = B[i];
    __syncthreads();
    const unsigned short* row = l < 16 ? &sb[l][0] : unused == 0 ? nullptr : &sb[0][0] + 8 * l;
    unsigned b[2];
    ldmatrix_x2_trans(b, row);
    for (int i = 0; i < 2; i++) regs[2 * l + i] = b[i];
}
"""


@pytest.mark.parametrize("unused", [0, 1])
def test_ldmatrix_x2_ignores_the_addresses_of_lanes_16_to_31(unused):
    mod = cl.load_source(LDMATRIX, name="mutant_ldmatrix")
    B = torch.arange(128, dtype=torch.int16)
    regs = cl.zeros(64, dtype=torch.int32)
    mod.load_b(cl.to_device(B), regs, unused, grid=1, block=32)
    r = regs.cpu().view(32, 2).numpy().astype("uint32")
    lane = 0
    # .trans: lane l gets column l/4, rows 2(l%4) and 2(l%4)+1 of matrix i (rows 8i..8i+7 of B)
    for lane in range(32):
        for i in range(2):
            k = 8 * i + 2 * (lane % 4)
            assert r[lane, i] == (k * 8 + lane // 4) | ((k + 1) * 8 + lane // 4) << 16, (lane, i)


# ---- an index read from memory: `bins[data[i]]` is checked like `bins[v]` ---------------------

GATHER_INDEX = r"""
__global__ void hist_plain(const int* data, int* bins, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) bins[data[i]] += 1;              // the index is an element of data
}
__global__ void hist_atomic(const int* data, int* bins, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicAdd(&bins[data[i]], 1);
}
__global__ void gather(const int* idx, const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[idx[i]];
}
"""


@pytest.fixture(scope="module")
def gather_index():
    return cl.load_source(GATHER_INDEX, name="mutant_gather_index")


def test_a_histogram_indexed_by_an_element_races(gather_index):
    """It used to take the built-in subscript through the pointer's conversion: unchecked, a false
    pass of a racy kernel."""
    data, bins = torch.randint(0, 4, (256,), dtype=torch.int32), torch.zeros(4, dtype=torch.int32)
    with pytest.raises(cl.RaceError, match=r"bins\[\d\]"), cl.detect_races(True):
        gather_index.kernel("hist_plain")(data, bins, 256, grid=2, block=128)


def test_the_same_histogram_with_atomics_passes(gather_index):
    data, bins = torch.randint(0, 4, (256,), dtype=torch.int32), torch.zeros(4, dtype=torch.int32)
    with cl.detect_races(True):
        gather_index.kernel("hist_atomic")(data, bins, 256, grid=2, block=128)
    assert bins.tolist() == torch.bincount(data.long(), minlength=4).tolist()


def test_an_index_read_from_memory_is_bounds_checked(gather_index):
    idx = torch.tensor([0, 3, 17, 1], dtype=torch.int32)           # 17: past x's 8 elements
    x, y = torch.randn(8), cl.empty(4)
    with pytest.raises(cl.OutOfBoundsError, match=r"x\[17\]"):
        gather_index.kernel("gather")(idx, x, y, 4, grid=1, block=32)


# ---- a file the race detector cannot build says so -----------------------------------------------

REF_PARAM = r"""
__device__ void store(float& dst, float v) { dst = v; }   // a reference to an element
__global__ void fill(float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) store(y[i], 1.0f);
}
"""


def test_a_file_that_loses_its_race_checks_warns_and_still_runs():
    """It used to fall back to the build without the detector in silence: a racy kernel written
    this way would pass."""
    with pytest.warns(cl.RaceDetectorOff, match=r"(?s)WITHOUT race checks.*mutant_ref_param.cu:5.*`T&` parameter"):
        mod = cl.load_source(REF_PARAM, name="mutant_ref_param")
    assert not mod.race_checked
    y = cl.empty(40)
    mod.kernel("fill")(y, 40, grid=2, block=32)
    assert torch.equal(y.cpu(), torch.ones(40))


def test_the_course_kernels_all_build_with_the_race_detector():
    from convlab.display import book

    lost = [f.name for f in sorted(book.path("kernels").rglob("*.cu")) if not cl.load(f).race_checked]
    assert not lost, f"kernel files that run without race checks on the emulator: {lost}"
