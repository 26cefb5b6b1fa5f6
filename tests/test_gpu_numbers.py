"""The microbenchmark kernels of kernels/00_numbers (the page "The numbers a kernel designer reasons
from") on the active backend: each one's result is the host's prediction, on small awkward sizes.
benchmarks/gpu_numbers.py times them on a GPU; tests/test_benchmarks.py runs it on the emulator."""
import numpy as np
import pytest
import torch

import convlab as cl
from benchmarks import gpu_numbers as G


@pytest.fixture(scope="module")
def mod():
    return cl.load(G.KERNELS)


def ints(n: int):
    return torch.empty(n, dtype=torch.int32, device=cl.device().torch_device)


def test_the_copy_copies_the_array_and_nothing_past_it(mod):
    n4 = 37                                        # not a multiple of the grid's threads nor of UNROLL
    src = cl.randn(4 * n4)
    dst = cl.empty(4 * n4 + 4)                     # poisoned: the float4 past the end must stay NaN
    mod.copy_float4(src, dst, n4, 3, grid=2, block=8)
    cl.sync()
    assert torch.equal(dst[:4 * n4].cpu(), src.cpu())
    assert dst[4 * n4:].isnan().all()


def test_a_cycle_visits_every_node_once_then_returns():
    nxt, order = G.cycle(nodes=50, spacing=3, seed=1)
    seen, j = [], int(order[0])
    for _ in range(50):
        seen.append(j)
        j = int(nxt[j])
    assert j == order[0] and sorted(seen) == list(range(0, 150, 3))
    assert (nxt[np.setdiff1d(np.arange(150), seen)] == -1).all()


@pytest.mark.parametrize("kernel,spacing", [("chase_l1", 32), ("chase_l2", 32), ("chase_shared", 1)])
def test_a_chase_ends_where_the_permutation_says(mod, kernel, spacing):
    nodes, steps = 41, 97                          # more steps than nodes: the walk wraps around
    nxt, order = G.cycle(nodes, spacing, seed=7)
    table = torch.from_numpy(nxt).to(cl.device().torch_device)
    end = ints(1)
    cycles = torch.empty(1, dtype=torch.int64, device=end.device)
    if kernel == "chase_shared":
        mod.chase_shared(table, nodes, int(order[0]), steps, end, cycles, grid=1, block=32)
    else:
        getattr(mod, kernel)(table, int(order[0]), steps, end, cycles, grid=1, block=1)
    cl.sync()
    want = G.chase_end(order, 0, steps)
    assert int(end.item()) == want != G.chase_end(order, 0, steps + 1)
    assert int(cycles.item()) >= 0


def test_l1_and_shared_reads_sum_what_the_host_predicts(mod):
    window, threads, blocks, iters = 8, 48, 2, 21
    rows = np.arange(4 * window, dtype=np.int32).reshape(window, 4) * 3 - 40
    src = torch.from_numpy(rows).reshape(-1).to(cl.device().torch_device)
    out = ints(blocks * threads)
    mod.l1_read(src, window - 1, out, iters, grid=blocks, block=threads)
    cl.sync()
    want = G.read_sums(rows, threads, blocks, iters)
    assert np.array_equal(out.cpu().numpy().view(np.uint32), want)
    assert not np.array_equal(want, G.read_sums(rows, threads, blocks, iters - 1))

    mod.shared_read(out, iters, grid=blocks, block=threads)
    cl.sync()
    shared_rows = np.arange(G.SMEM_VEC)[:, None] * np.arange(1, 5)[None, :]
    assert np.array_equal(out.cpu().numpy().view(np.uint32), G.read_sums(shared_rows, threads, blocks, iters))


@pytest.mark.parametrize("half", [False, True], ids=["ffma", "hfma2"])
def test_fma_chains_give_the_hosts_values(mod, half):
    threads, blocks, iters = 40, 2, 13
    out = cl.empty(blocks * threads)
    getattr(mod, "hfma2_chains" if half else "fma_chains")(out, G.A, G.B, iters, grid=blocks, block=threads)
    cl.sync()
    want = G.fma_sums(blocks * threads, iters, half)
    assert np.array_equal(out.cpu().numpy(), want)
    assert not np.array_equal(want, G.fma_sums(blocks * threads, iters - 1, half))


def test_expect_names_the_first_wrong_value():
    G.expect("same", [1, 2, 3], np.array([1, 2, 3]))
    with pytest.raises(G.WrongResult, match=r"x: 1 of 3 values differ .*first at 2: 9 instead of 3"):
        G.expect("x", [1, 2, 9], [1, 2, 3])


def test_sizes_come_from_the_device():
    s = G.Sizes.for_gpu(sms=132, l2_bytes=50 * 2**20)
    assert s.blocks == 8 * 132
    assert 2 * s.dram_floats * 4 > 8 * 50 * 2**20             # the DRAM copy: far beyond L2
    assert 2 * s.l2_floats * 4 <= 50 * 2**20 // 2 and s.l2_floats % 4 == 0   # the L2 copy fits with room
    assert s.l1_nodes * G.LINE <= 32 * 1024 < s.l2_nodes * G.LINE < 50 * 2**20 < s.dram_nodes * G.LINE
    assert 2 * s.chase_steps <= s.l2_nodes                    # the timed L2 chase touches distinct lines
    assert s.shared_nodes <= G.CHASE_SHARED
