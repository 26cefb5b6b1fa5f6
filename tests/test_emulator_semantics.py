"""What the kernels of the course rely on behaves as on a GPU: half arithmetic bit for bit,
tensor-core fragments, atomics, warp operations, barriers, constant and dynamic shared memory.
These run on both backends, so the GPU run checks the emulator's fidelity."""
import numpy as np
import pytest
import torch

import convlab as cl


@pytest.fixture(scope="module")
def fp16(features=None):
    from pathlib import Path
    return cl.load(Path(__file__).parent / "features" / "fp16_ops.cu")


def test_every_half_bit_pattern_converts_like_numpy(fp16):
    bits = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)
    h = cl.to_device(bits.view(torch.float16))
    f = cl.empty(65536)
    fp16.to_float(h, f, 65536, grid=256, block=256)
    want = bits.numpy().view(np.float16).astype(np.float32)
    got = f.cpu().numpy()
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert np.array_equal(got[~np.isnan(got)], want[~np.isnan(want)])


def test_float_to_half_rounds_like_numpy(fp16):
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.standard_normal(20000).astype(np.float32) * s for s in (1e-6, 1e-3, 1, 300, 7e4)])
    x = np.concatenate([x, np.float32([0, -0.0, 65504, 65519.99, 65520, np.inf, -np.inf, 5.96e-8, 2.98e-8,
                                       2.9802322e-08, 6.1e-5])])
    h = cl.empty(len(x), dtype=torch.float16)
    fp16.to_half(cl.to_device(torch.from_numpy(x)), h, len(x), grid=(len(x) + 255) // 256, block=256)
    with np.errstate(over="ignore"):      # values past 65504 become inf, as they should
        want = x.astype(np.float16)
    assert np.array_equal(h.cpu().numpy().view(np.uint16), want.view(np.uint16))


@pytest.mark.parametrize("op", [0, 1, 2, 3, 4])
def test_half_arithmetic_bit_exact(fp16, op):
    rng = np.random.default_rng(op)
    n = 50000
    a = (rng.standard_normal(n) * 30).astype(np.float16)
    b = (rng.standard_normal(n) * 30).astype(np.float16)
    y = cl.empty(n, dtype=torch.float16)
    fp16.half_ops(cl.to_device(torch.from_numpy(a)), cl.to_device(torch.from_numpy(b)), y, n, op,
                  grid=(n + 255) // 256, block=256)
    if op == 4:   # fma rounds once: compute exactly in float64, then round to half
        want = (a.astype(np.float64) * b.astype(np.float64) + a.astype(np.float64)).astype(np.float16)
    else:
        want = [np.add, np.subtract, np.multiply, np.divide][op](a, b)
    assert np.array_equal(y.cpu().numpy().view(np.uint16), want.view(np.uint16))


def test_half2_fma(fp16):
    n = 4096
    a, b = cl.randn(n, dtype=torch.float16), cl.randn(n, dtype=torch.float16)
    y = cl.empty(n, dtype=torch.float16)
    fp16.half2_ops(a, b, y, n // 2, grid=n // 2 // 128, block=128)
    an, bn = a.cpu().numpy().astype(np.float64), b.cpu().numpy().astype(np.float64)
    want = (an * bn + (an * an).astype(np.float16).astype(np.float64)).astype(np.float16)
    assert np.array_equal(y.cpu().numpy().view(np.uint16), want.view(np.uint16))


def test_wmma_tile(features):
    mod = cl.load(features / "wmma_gemm.cu")
    a, b = cl.randn(16, 16, dtype=torch.float16), cl.randn(16, 16, dtype=torch.float16)
    c, d = cl.randn(16, 16), cl.empty(16, 16)
    mod.wmma_16x16x16(a, b.t().contiguous(), c, d, grid=1, block=32)   # b stored column-major
    cl.check(d, 2 * (cl.ref.matmul(a, b) + c.cpu().double()), rtol=1e-5)


def test_atomics(features):
    mod = cl.load(features / "atomics_warp.cu")
    n = 3000
    v = torch.randint(-1000, 1000, (n,), dtype=torch.int32)
    s, mx, mn = cl.zeros(1, dtype=torch.int32), cl.to_device(torch.tensor([-2**31], dtype=torch.int32)), \
        cl.to_device(torch.tensor([2**31 - 1], dtype=torch.int32))
    fs, cas = cl.zeros(1), cl.zeros(1, dtype=torch.int32)
    mod.atomics(cl.to_device(v), s, mx, mn, fs, cas, n, grid=(n + 127) // 128, block=128)
    assert s.item() == int(v.sum()) and mx.item() == int(v.max()) and mn.item() == int(v.min())
    assert fs.item() == float(v.sum()) and cas.item() == n


def test_warp_shuffles_and_ballot(features):
    mod = cl.load(features / "atomics_warp.cu")
    x = cl.randn(256)
    sums, bcast, ballots, xors = cl.empty(8), cl.empty(256), cl.empty(8, dtype=torch.int32), cl.empty(256)
    mod.warp_ops(x, sums, bcast, ballots, xors, grid=2, block=128)
    xc = x.cpu().view(8, 32)
    cl.check(sums, xc.double().sum(1), rtol=1e-5)
    assert torch.equal(bcast.cpu().view(8, 32), xc[:, 7:8].expand(8, 32))
    assert torch.equal(xors.cpu().view(8, 32), xc.view(8, 16, 2).flip(2).reshape(8, 32))
    want = [sum(1 << i for i in range(32) if xc[w, i] > 0) for w in range(8)]
    assert [b & 0xFFFFFFFF for b in ballots.cpu().tolist()] == want


def test_reducing_barriers(features):
    mod = cl.load(features / "atomics_warp.cu")
    x = cl.randn(3 * 96)
    out = cl.empty(9, dtype=torch.int32)
    mod.barrier_reduce(x, out, grid=3, block=96)
    xc = x.cpu().view(3, 96)
    assert out.cpu().view(3, 3)[:, 0].tolist() == (xc > 0).sum(1).tolist()
    assert out.cpu().view(3, 3)[:, 1].tolist() == [1, 1, 1]
    assert out.cpu().view(3, 3)[:, 2].tolist() == [0, 0, 0]


def test_dynamic_shared_and_thread_orders(features):
    mod = cl.load(features / "atomics_warp.cu")
    x, y = cl.randn(3 * 200), cl.empty(3 * 200)
    launch = lambda: mod.dynamic_shared_reverse(x, y, 600, grid=3, block=200, shared=200 * 4)  # noqa: E731
    if cl.backend() == "emu":
        assert cl.find_race(launch, y) is None
    launch()
    assert torch.equal(y.cpu().view(3, 200), x.cpu().view(3, 200).flip(1))


@pytest.mark.emu_only
def test_printf_reaches_python(features, capsys):
    mod = cl.load(features / "atomics_warp.cu")
    mod.say_hello(2, grid=2, block=32)
    out = capsys.readouterr().out
    assert out.count("hello from thread") == 4 and "thread 1 of block 1" in out


@pytest.mark.emu_only
def test_unloaded_shared_memory_reads_nan(tmp_path):
    src = """
    __global__ void read_unloaded(float* y) {
        extern __shared__ float s[];
        if (threadIdx.x < 16) s[threadIdx.x] = 1.0f;   // only half of the tile is loaded
        __syncthreads();
        y[threadIdx.x] = s[threadIdx.x];
    }"""
    mod = cl.load_source(src, "read_unloaded", directory=tmp_path)
    y = cl.zeros(32)
    mod.read_unloaded(y, grid=1, block=32, shared=32 * 4)
    assert torch.all(y[:16] == 1) and torch.all(torch.isnan(y[16:]))


def test_hfma_rounds_once(fp16):
    # a*b + c = -4.6074..., between two halves: rounding through float first gave 0xc49c
    bits = lambda *v: cl.to_device(torch.tensor(v, dtype=torch.int16).view(torch.float16))  # noqa: E731
    a, b = bits(0xb648 - 0x10000), bits(0x3287)
    c = bits(0xc487 - 0x10000)
    y = cl.empty(1, dtype=torch.float16)
    src = """
    #include <cuda_fp16.h>
    __global__ void fma1(const half* a, const half* b, const half* c, half* y) { y[0] = __hfma(a[0], b[0], c[0]); }"""
    from pathlib import Path
    import tempfile
    mod = cl.load_source(src, "fma1", directory=Path(tempfile.gettempdir()))
    mod.fma1(a, b, c, y, grid=1, block=1)
    assert int(y.cpu().view(torch.int16).item()) & 0xFFFF == 0xc49b
