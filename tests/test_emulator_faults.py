"""Every fault a student can make gets a clear message that says what to change, and the
process survives it: a good launch works right after each one."""
import pytest
import torch

import convlab as cl

pytestmark = pytest.mark.emu_only


def good_launch_still_works(features):
    mod = cl.load(features / "atomics_warp.cu")
    x, y = cl.randn(100), cl.empty(100)
    mod.set_constant("c_scale", torch.tensor([1.0, 2.0, 3.0, 4.0]))
    mod.scale_by_constant(x, y, 100, grid=1, block=128)
    cl.check(y, x.double() * torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64).repeat(25))


def test_partial_barrier(faults, features):
    mod = cl.load(faults / "partial_barrier.cu")
    with pytest.raises(cl.BarrierError) as e:
        mod.partial_barrier(cl.randn(100), cl.empty(100), 100, grid=2, block=64)
    msg = str(e.value)
    assert "partial_barrier.cu:7" in msg                       # file:line of the barrier
    assert "reached by only 36 of the 64 threads of block (1,0,0)" in msg
    assert "returned" in msg and "instead of returning early" in msg
    good_launch_still_works(features)


def test_divergent_barriers(faults, features):
    mod = cl.load(faults / "divergent_barrier.cu")
    with pytest.raises(cl.BarrierError) as e:
        mod.divergent_barrier(cl.empty(64), grid=1, block=64)
    msg = str(e.value)
    assert "different __syncthreads()" in msg
    assert "32 at" in msg and "divergent_barrier.cu:5" in msg and "divergent_barrier.cu:8" in msg
    good_launch_still_works(features)


def test_read_past_the_end(faults, features):
    mod = cl.load(faults / "out_of_range.cu")
    with pytest.raises(cl.OutOfBoundsError) as e:
        mod.past_end(cl.randn(100), cl.empty(100), 100, grid=4, block=32)
    msg = str(e.value)
    assert "x[100]" in msg and "x has 100 elements" in msg and "one past the end" in msg
    assert "thread (4,0,0) of block (3,0,0)" in msg
    good_launch_still_works(features)


def test_read_before_the_start(faults, features):
    mod = cl.load(faults / "out_of_range.cu")
    with pytest.raises(cl.OutOfBoundsError) as e:
        mod.before_start(cl.randn(6, 7), cl.empty(6, 7), 6, 7, grid=(1, 1), block=(8, 8))
    msg = str(e.value)
    assert "x[-7]" in msg and "before the start" in msg and "block (0,0,0)" in msg
    good_launch_still_works(features)


def test_kernel_that_never_returns(faults, features):
    mod = cl.load(faults / "never_returns.cu")
    with pytest.raises(cl.KernelTimeout) as e:
        mod.never_returns(cl.empty(64), 64, grid=2, block=32, timeout=0.5)
    assert "did not finish within 0 s" not in str(e.value)
    assert "was stopped" in str(e.value) and "block (" in str(e.value)
    good_launch_still_works(features)


def test_compile_error_names_file_and_line(faults, features):
    with pytest.raises(cl.CompileError) as e:
        cl.load(faults / "compile_error.cu")
    msg = str(e.value)
    assert "compile_error.cu:5" in msg and "undeclared_value" in msg
    good_launch_still_works(features)


def test_race_found_by_thread_orders(faults):
    mod = cl.load(faults / "racy_reduction.cu")
    x = cl.randn(4 * 128)
    out = cl.empty(4)
    msg = cl.find_race(lambda: mod.racy_reduction(x, out, grid=4, block=128), out)
    assert msg is not None and "race" in msg and "__syncthreads()" in msg
    assert cl.find_race(lambda: mod.good_reduction(x, out, grid=4, block=128), out) is None
    cl.check(out, x.double().view(4, 128).sum(1))


def test_local_array_too_large(faults, features):
    with pytest.raises(cl.CompileError) as e:
        cl.load(faults / "big_local_array.cu")
    assert "stack" in str(e.value) and "shared memory" in str(e.value)
    good_launch_still_works(features)


def test_wild_pointer_and_division_by_zero(faults, features):
    mod = cl.load(faults / "wild_pointer.cu")
    with pytest.raises(cl.OutOfBoundsError) as e:
        mod.wild_pointer(cl.empty(16), 1 << 40, grid=1, block=1)
    assert "invalid memory access" in str(e.value)
    with pytest.raises(cl.KernelFault) as e:
        mod.divide_by_zero(cl.empty(32, dtype=torch.int32), 5, grid=1, block=32)
    assert "division" in str(e.value) and "thread (5,0,0)" in str(e.value)
    good_launch_still_works(features)


def test_failed_assert(faults, features):
    mod = cl.load(faults / "assert_fails.cu")
    x = cl.randn(64).abs()
    x[17] = -1.0
    with pytest.raises(cl.KernelFault) as e:
        mod.assert_fails(x, 64, grid=1, block=64)
    assert "x[i] >= 0.0f" in str(e.value) and "assert_fails.cu:5" in str(e.value)
    assert "thread (17,0,0)" in str(e.value)
    good_launch_still_works(features)


def test_shared_memory_smaller_than_the_launch_needs(faults, features):
    mod = cl.load(faults / "out_of_range.cu")
    with pytest.raises(cl.OutOfBoundsError) as e:
        mod.shared_too_small(cl.randn(64), cl.empty(64), 64, grid=1, block=64, shared=63 * 4)
    msg = str(e.value)
    assert "extern __shared__ tile[63]" in msg and "shared=252 bytes" in msg and "thread (63,0,0)" in msg
    good_launch_still_works(features)
