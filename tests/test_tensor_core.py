"""ldmatrix, mma.sync and cp.async (kernels/09_general/tensor_core.cuh): every lane's registers
against a model written from the PTX ISA's fragment figures (not from the emulator's code), a
whole 16x8x16 product against fp64, cp.async's copy, zero-fill and groups, and the emulator's
faults for each way to misuse them. With CONVLAB_BACKEND=cuda the same kernels run on the GPU
against the same models, and test_gpu_registers_match_the_emulator compares the GPU's registers
with the emulator's (run in a subprocess)."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import convlab as cl

ROOT = Path(__file__).resolve().parent.parent
FRAGMENTS = ROOT / "kernels" / "09_general" / "mma_fragments.cu"
MISTAKES = ROOT / "tests" / "faults" / "tensor_core_mistakes.cu"


# ---- the PTX ISA's layouts ---------------------------------------------------------------------
# "ldmatrix": thread l receives, of each 8x8 matrix, row l/4, elements 2*(l%4) and 2*(l%4)+1 (the
# lower one in the low half of the register); with .trans the matrix is read column-major.
# "mma.m16n8k16" fragments (groupID = l/4, threadID_in_group = l%4), element i of each lane:
#   A: row groupID for a0,a1,a4,a5, groupID+8 for a2,a3,a6,a7; col 2*tig + (i&1), +8 for i >= 4
#   B: row 2*tig + (i&1), +8 for i >= 2; col groupID
#   C, D: row groupID for c0,c1, groupID+8 for c2,c3; col 2*tig + (i&1)
# Two 16-bit elements per 32-bit register (a0,a1 in register 0, ...), the lower index in the low half.

def a_element(lane, i):
    g, t = lane // 4, lane % 4
    return g + (8 if i in (2, 3, 6, 7) else 0), 2 * t + (i & 1) + (8 if i >= 4 else 0)


def b_element(lane, i):
    g, t = lane // 4, lane % 4
    return 2 * t + (i & 1) + (8 if i >= 2 else 0), g


def c_element(lane, i):
    g, t = lane // 4, lane % 4
    return g + (8 if i >= 2 else 0), 2 * t + (i & 1)


def pack(lo, hi):
    return np.uint32(lo) | (np.uint32(hi) << np.uint32(16))


def halves(reg):
    return int(reg) & 0xFFFF, int(reg) >> 16


def ldmatrix_model(rows, order, n, trans):
    """rows: the 32 shared rows (uint16, 32x8); lane l passes row order[l]."""
    out = np.zeros((32, n), np.uint32)
    for i in range(n):
        m = rows[order[8 * i:8 * i + 8]]          # matrix i: its row r is the one lane 8i+r passes
        if trans:
            m = m.T
        for lane in range(32):
            out[lane, i] = pack(m[lane // 4, 2 * (lane % 4)], m[lane // 4, 2 * (lane % 4) + 1])
    return out


def to_float(bits, bf16):
    bits = np.asarray(bits, np.uint16)
    if bf16:
        return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return bits.view(np.float16).astype(np.float64)


def fragments_to_matrices(a_regs, b_regs, c, bf16):
    A, B, C = np.zeros((16, 16)), np.zeros((16, 8)), np.zeros((16, 8))
    for lane in range(32):
        for i in range(8):
            A[a_element(lane, i)] = to_float(halves(a_regs[lane, i // 2])[i % 2], bf16)
        for i in range(4):
            B[b_element(lane, i)] = to_float(halves(b_regs[lane, i // 2])[i % 2], bf16)
            C[c_element(lane, i)] = c[lane, i]
    return A, B, C


# An fp32 sum of 17 terms is within 17 units of 2^-24 of the sum of their magnitudes when each
# addition rounds to nearest; a GPU's tensor core may truncate instead, so allow 4 times that. A
# fragment mistake puts other products in the sum: off by about the sum itself.
SUM_BOUND = 4 * 17 * 2.0 ** -24


def mma_model(a_regs, b_regs, c, bf16):
    """Each lane's d[0..3] in fp64, and a bound on an fp32 accumulation's error for each."""
    A, B, C = fragments_to_matrices(a_regs, b_regs, c, bf16)
    D, S = C + A @ B, np.abs(C) + np.abs(A) @ np.abs(B)
    d, bound = np.zeros((32, 4)), np.zeros((32, 4))
    for lane in range(32):
        for i in range(4):
            d[lane, i], bound[lane, i] = D[c_element(lane, i)], SUM_BOUND * S[c_element(lane, i)]
    return d, bound


# ---- inputs (numpy, so another process makes the same ones) and launches -----------------------

def random_halves(rng, shape, bf16=False):
    """Random fp16 (or bf16) numbers of both signs and mixed magnitudes, as their bits."""
    v = rng.standard_normal(shape) * 2.0 ** rng.integers(-6, 6, shape)
    if bf16:
        return (v.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)   # truncated: still bf16 values
    return v.astype(np.float16).view(np.uint16)


def as_int16(bits):
    return cl.to_device(torch.from_numpy(np.ascontiguousarray(bits).view(np.int16)))


def as_int32(bits):
    return cl.to_device(torch.from_numpy(np.ascontiguousarray(bits, np.uint32).view(np.int32)))


def registers(t):
    return t.cpu().numpy().view(np.uint32)


def ldmatrix_inputs(seed):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 1 << 16, (32, 8), dtype=np.uint16), rng.permutation(32).astype(np.int32)


def run_ldmatrix(mod, rows, order, variant):
    out = cl.to_device(torch.full((32, 4), -1, dtype=torch.int32))
    mod.ldmatrix_lanes(as_int16(rows), cl.to_device(torch.from_numpy(order)), out, variant, grid=1, block=32)
    return registers(out)


def mma_inputs(seed, bf16):
    rng = np.random.default_rng(seed)
    a = random_halves(rng, (32, 8), bf16).view(np.uint32)     # two halves per register
    b = random_halves(rng, (32, 4), bf16).view(np.uint32)
    c = rng.standard_normal((32, 4)).astype(np.float32)
    return a, b, c


def run_mma_lanes(mod, a, b, c, bf16):
    d = cl.empty(32, 4)
    mod.mma_lanes(as_int32(a), as_int32(b), cl.to_device(torch.from_numpy(c)), d, int(bf16), grid=1, block=32)
    return d.cpu().numpy()


def run_mma_tile(mod, A, B, bf16):
    D = cl.empty(16, 8)
    mod.mma_tile(as_int16(A), as_int16(B), D, int(bf16), grid=1, block=32)
    return D.cpu().numpy()


def cp_async_inputs(seed, n=4 * 77 + 3, n4=50):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(n).astype(np.float32), rng.standard_normal(n4).astype(np.float32)


def run_cp_async(mod, x, x4, threads=128):
    y = cl.empty(5 * threads)
    mod.cp_async_reverse(cl.to_device(torch.from_numpy(x)), cl.to_device(torch.from_numpy(x4)), y, len(x), len(x4),
                         grid=1, block=threads)
    return y.cpu().numpy()


def probe_results(seed):
    """Every probe's outputs for one seed, as numpy arrays (the GPU test compares two backends')."""
    mod = cl.load(FRAGMENTS)
    out = {}
    rows, order = ldmatrix_inputs(seed)
    for v in range(6):
        out[f"ldmatrix{v}"] = run_ldmatrix(mod, rows, order, v)
    for bf16 in (False, True):
        out[f"mma_lanes{int(bf16)}"] = run_mma_lanes(mod, *mma_inputs(seed, bf16), bf16)
        rng = np.random.default_rng(seed)
        out[f"mma_tile{int(bf16)}"] = run_mma_tile(mod, random_halves(rng, (16, 16), bf16),
                                                   random_halves(rng, (16, 8), bf16), bf16)
    out["cp_async"] = run_cp_async(mod, *cp_async_inputs(seed))
    return out


# ---- fragments against the PTX ISA's layouts ---------------------------------------------------

@pytest.mark.parametrize("variant", range(6), ids=["x1", "x2", "x4", "x1_trans", "x2_trans", "x4_trans"])
@pytest.mark.parametrize("seed", [1, 2])
def test_ldmatrix_registers(variant, seed):
    n, trans = 1 << (variant % 3), variant >= 3
    rows, order = ldmatrix_inputs(seed)
    got = run_ldmatrix(cl.load(FRAGMENTS), rows, order, variant)
    want = ldmatrix_model(rows, order, n, trans)
    bad = np.argwhere(got[:, :n] != want)
    assert not len(bad), (f"lane {bad[0][0]} register {bad[0][1]}: {got[tuple(bad[0])]:#010x}, "
                          f"the PTX layout gives {want[tuple(bad[0])]:#010x} ({len(bad)} registers differ)")
    assert (got[:, n:] == 0xFFFFFFFF).all(), "an xN variant wrote registers past its N"


@pytest.mark.parametrize("bf16", [False, True], ids=["f16", "bf16"])
@pytest.mark.parametrize("seed", [3, 4])
def test_mma_registers(bf16, seed):
    a, b, c = mma_inputs(seed, bf16)
    got = run_mma_lanes(cl.load(FRAGMENTS), a, b, c, bf16)
    want, bound = mma_model(a, b, c, bf16)
    err = np.abs(got - want)
    bad = np.argwhere(~(err <= bound))
    assert not len(bad), (f"lane {bad[0][0]} d[{bad[0][1]}] = {got[tuple(bad[0])]!r}, the PTX layout gives "
                          f"{want[tuple(bad[0])]!r} ({len(bad)} of 128 differ by more than fp32 rounding)")


@pytest.mark.parametrize("bf16", [False, True], ids=["f16", "bf16"])
def test_mma_tile_against_fp64(bf16):
    """ldmatrix_x4 (A, row-major) and ldmatrix_x2_trans (B stored k-major) feeding one mma: the
    16x8 product against numpy in fp64."""
    rng = np.random.default_rng(5)
    A, B = random_halves(rng, (16, 16), bf16), random_halves(rng, (16, 8), bf16)
    D = run_mma_tile(cl.load(FRAGMENTS), A, B, bf16)
    a64, b64 = to_float(A, bf16), to_float(B, bf16)
    want, bound = a64 @ b64, SUM_BOUND * (np.abs(a64) @ np.abs(b64))
    bad = np.argwhere(~(np.abs(D - want) <= bound))
    assert not len(bad), f"D{tuple(bad[0])} = {D[tuple(bad[0])]!r}, fp64 {want[tuple(bad[0])]!r} ({len(bad)} wrong)"


@pytest.mark.parametrize("threads", [128, 96])
def test_cp_async_copies_and_zero_fills(threads):
    x, x4 = cp_async_inputs(6)
    y = run_cp_async(cl.load(FRAGMENTS), x, x4, threads)
    want = np.zeros(5 * threads, np.float32)
    for t in range(threads):
        u = threads - 1 - t
        if 4 * u + 4 <= len(x):
            want[4 * t:4 * t + 4] = x[4 * u:4 * u + 4]
        if u < len(x4):
            want[4 * threads + t] = x4[u]
    bad = np.argwhere(y != want).ravel()           # exact: zero-fill is 0.0, not NaN
    assert not len(bad), f"y[{bad[0]}] = {y[bad[0]]}, expected {want[bad[0]]} ({len(bad)} wrong)"


@pytest.mark.gpu_only
def test_gpu_registers_match_the_emulator(tmp_path):
    """The GPU's registers (and products) beside the emulator's, for the same inputs: ldmatrix and
    cp.async bit for bit; mma within fp32 rounding (the order of the GPU's sums is its own)."""
    gpu = probe_results(7)
    out = tmp_path / "emu.npz"
    code = (f"import runpy, numpy as np; m = runpy.run_path({str(Path(__file__))!r}); "
            f"np.savez({str(out)!r}, **m['probe_results'](7))")
    env = dict(os.environ, CONVLAB_BACKEND="emu", PYTHONPATH=str(ROOT))
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=ROOT, timeout=600)
    emu = np.load(out)
    print(f"\n{cl.device()}")
    for k, g in gpu.items():
        e = emu[k]
        if k.startswith("mma"):
            diff = float(np.abs(g.astype(np.float64) - e).max())
            scale = float(np.abs(e).max())
            print(f"{k}: largest |GPU - emulator| {diff:.3g} (values up to {scale:.3g})")
            assert diff <= 1e-5 * scale, k
        else:
            same = np.array_equal(g, e) if k == "cp_async" else np.array_equal(g.view(np.uint32), e.view(np.uint32))
            print(f"{k}: {'identical' if same else 'DIFFERENT'}")
            assert same, f"{k}: the GPU gives {g}, the emulator {e}"


# ---- the emulator's faults (a GPU reports none of them) ----------------------------------------

def line_of(text, path=MISTAKES):
    """The 1-based line of the (only) source line of `path` that contains `text`."""
    lines = [i + 1 for i, s in enumerate(path.read_text().splitlines()) if text in s]
    assert len(lines) == 1, (text, lines)
    return lines[0]


def at(text, kernel):
    """`path:line` of `text`, the first time it occurs after `__global__ void kernel(`."""
    src = MISTAKES.read_text().splitlines()
    start = next(i for i, s in enumerate(src) if f"void {kernel}(" in s)
    line = next(i for i in range(start, len(src)) if text in src[i]) + 1
    return f"tests/faults/tensor_core_mistakes.cu:{line}"


def launch_mistake(kernel, *args, block=64):
    mod = cl.load(MISTAKES)
    x, y = cl.randn(64 * 4 * 2), cl.empty(64 * 4)
    with cl.detect_races():
        getattr(mod, kernel)(x, y, *args, grid=1, block=block)
    return y


@pytest.mark.emu_only
def test_read_before_the_wait_names_both_lines():
    with pytest.raises(cl.RaceError) as e:
        launch_mistake("missing_wait")
    msg = str(e.value)
    cp, read = at("cp_async_16", "missing_wait"), at("y[t] =", "missing_wait")
    assert f"read of __shared__ s[252] at {read}" in msg and f"cp.async at {cp}" in msg
    assert "still in flight" in msg and "cp_async_wait<N>()" in msg and "__syncthreads()" in msg


@pytest.mark.emu_only
def test_wait_without_a_barrier_is_a_race():
    with pytest.raises(cl.RaceError) as e:
        launch_mistake("missing_barrier")
    msg = str(e.value)
    assert msg.startswith("missing_barrier: data race on __shared__ s[")
    assert at("y[t] =", "missing_barrier") in msg and at("cp_async_wait<0>", "missing_barrier") in msg
    assert "__syncthreads() after that wait" in msg or "Put a __syncthreads() between" in msg


@pytest.mark.emu_only
def test_wait_group_leaves_the_most_recent_groups_in_flight():
    launch_mistake("wait_group_one", 0)            # the older group has landed
    with pytest.raises(cl.RaceError) as e:
        launch_mistake("wait_group_one", 1)        # the newer one may still be in flight
    assert f"cp.async at {at('s1[4 * t]', 'wait_group_one')}" in str(e.value)


@pytest.mark.emu_only
def test_a_copy_never_committed_is_not_waited_for():
    with pytest.raises(cl.RaceError) as e:
        launch_mistake("never_committed")
    assert "never committed" in str(e.value) and "cp_async_commit()" in str(e.value)


@pytest.mark.emu_only
def test_overwriting_a_copy_in_flight():
    with pytest.raises(cl.RaceError) as e:
        launch_mistake("overwrite_in_flight")
    msg = str(e.value)
    assert f"write to __shared__ s[0] at {at('s[4 * t] = 0.0f', 'overwrite_in_flight')}" in msg
    assert "lands over this write" in msg


@pytest.mark.emu_only
def test_next_copy_into_a_buffer_still_being_read_is_a_race():
    with pytest.raises(cl.RaceError) as e:
        launch_mistake("reuse_without_barrier")
    msg = str(e.value)
    read, cp = at("y[t] = s[", "reuse_without_barrier"), at("x + 4 * (64 + t)", "reuse_without_barrier")
    assert msg.startswith("reuse_without_barrier: data race on __shared__ s[")
    assert f"Put a __syncthreads() between {read} and {cp}" in msg


@pytest.mark.emu_only
@pytest.mark.parametrize("dst, src, which", [(2, 0, "destination"), (0, 1, "source")])
def test_cp_async_misaligned(dst, src, which):
    launch_mistake("misaligned", 4, 4)             # 16 bytes apart: aligned
    with pytest.raises(cl.KernelFault) as e:
        launch_mistake("misaligned", dst, src)
    msg = str(e.value)
    assert f"cp_async_16 at {at('cp_async_16', 'misaligned')}: the {which}" in msg and "not 16-byte aligned" in msg


@pytest.mark.emu_only
def test_cp_async_source_past_the_end_and_destination_in_global_memory():
    mod = cl.load(MISTAKES)
    with pytest.raises(cl.OutOfBoundsError) as e:
        mod.source_past_end(cl.randn(64 * 4), cl.empty(64 * 4), grid=1, block=64)
    assert "past the end of argument `x`" in str(e.value) and "full=false" in str(e.value)
    with pytest.raises(cl.KernelFault) as e:
        launch_mistake("destination_global")
    assert "inside argument `y` (global memory)" in str(e.value)


@pytest.mark.emu_only
@pytest.mark.parametrize("mistake, error, words", [
    (0, cl.KernelFault, ["lane 0's row address", "inside argument `x` (global memory)"]),
    (1, cl.KernelFault, ["not 16-byte aligned"]),
    (2, cl.OutOfBoundsError, ["lane 16's row address", "bytes [512, 528) of __shared__ s", "outside its 512 bytes"]),
    (3, cl.RaceError, ["read of __shared__ s[0]", "still in flight", "never committed"]),
    (4, cl.RaceError, ["data race on __shared__ s[", "and nothing orders the two"]),
])
def test_ldmatrix_mistakes(mistake, error, words):
    mod = cl.load(MISTAKES)
    with pytest.raises(error) as e, cl.detect_races():
        mod.ldmatrix_mistake(as_int16(np.arange(256, dtype=np.uint16)), cl.empty(64, dtype=torch.int32), mistake,
                             grid=1, block=64)
    msg = str(e.value)
    assert f"{at('ldmatrix_x4(r, row)', 'ldmatrix_mistake')}" in msg
    for w in words:
        assert w in msg, (w, msg)
    if mistake == 3:
        assert at("cp_async_16", "ldmatrix_mistake") in msg
    if mistake == 4:
        assert at("s[l][c] = x", "ldmatrix_mistake") in msg


@pytest.mark.emu_only
def test_mma_needs_a_whole_warp():
    with pytest.raises(cl.BarrierError) as e:
        cl.load(MISTAKES).mma_partial_warp(cl.empty(48), grid=1, block=48)
    assert f"mma_16816 at {at('mma_16816(d, a, b)', 'mma_partial_warp')} needs all 32 lanes" in str(e.value)


# ldmatrix_x4's lanes 8i..8i+7 pass the rows of matrix i; each matrix is one phase of 128 bytes
# (as any 16-byte shared load's quarter-warp): rows 0..31 in lane order are 4 phases without a
# conflict, while lanes 0..7 passing rows 0, 8, 16, 24, 1, 9, 17, 25 put 4 rows on each of banks
# 0-3 and 4-7 (4 wavefronts a phase).
@pytest.mark.emu_only
@pytest.mark.parametrize("order, wavefronts", [(np.arange(32), 4), (8 * (np.arange(32) % 4) + np.arange(32) // 4, 16)],
                         ids=["rows in lane order", "rows 8 apart in each matrix"])
def test_profiler_counts_ldmatrix_as_a_shared_load(order, wavefronts):
    """One ldmatrix_x4 of 32 rows: one request, a phase per 8x8 matrix."""
    rows, _ = ldmatrix_inputs(8)
    order = order.astype(np.int32)
    mod = cl.load(FRAGMENTS)
    card = cl.profile(mod.kernel("ldmatrix_lanes"), as_int16(rows), cl.to_device(torch.from_numpy(order)),
                      cl.empty(32, 4, dtype=torch.int32), 2, grid=1, block=32)
    df = card.lines().reset_index()
    line = f"mma_fragments.cu:{line_of('case 2: ldmatrix_x4', FRAGMENTS)}"
    row = df[df["source line"].str.endswith(line) & df["access"].str.startswith("shared")]
    assert len(row) == 1, df
    assert row["requests"].iloc[0] == 1 and row["wavefronts per request"].iloc[0] == wavefronts, row
    assert row["bank conflicts"].iloc[0] == wavefronts - 4, row
