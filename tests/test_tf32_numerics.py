"""The tensor cores' TF32 arithmetic on the emulator (clemu_mma_numerics.h: tf32_operand, mma_k8,
cvt_rna_tf32; clemu_tensor_core.h's mma_1688_tf32, runtime.cpp's wgmma m64nNk8 .tf32).

The model is a hypothesis until an H100/H200 has run scripts/probe_tf32.py and its output is
committed as tests/data/tf32_mma_numerics.npz: the tensor core reads each operand's top 19 bits,
multiplies exactly, and adds the 8 products and the accumulator as it adds fp16's 16 (aligned to
the largest exponent, each term truncated to 2^(E-25), the sum rounded toward zero). Until then:
- cvt.rna.tf32.f32 is checked on cases worked out by hand from its definition;
- the emulator's mma.sync and wgmma are checked against this file's own statement of the model
  (numpy), on every probe input, and on small integers against exact sums (the fragment layouts);
and the test against the GPU's bits skips, saying why.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

import convlab as cl
from convlab.ops.tf32 import round_tf32, split_tf32

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
GPU_DATA = DATA / "tf32_mma_numerics.npz"
KERNEL = DATA / "tf32" / "tf32_numerics.cu"

_spec = importlib.util.spec_from_file_location("probe_tf32", ROOT / "scripts" / "probe_tf32.py")
probe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(probe)


# ------------------------------------------------------------------------------------------
# the model, in numpy (the statement the emulator's C++ is held to)

def tf32_operand(x: np.ndarray) -> np.ndarray:
    """A 32-bit register as a .tf32 operand: its top 19 bits."""
    return (x.astype(np.float32).view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)


def mma_step(c: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """c (n,) + sum_k a[:, k] * b[:, k] (k < 8) as the model adds them, for float32 operands."""
    c, a, b = c.astype(np.float32), a.astype(np.float32), b.astype(np.float32)
    out = np.empty_like(c)
    finite = np.isfinite(c) & np.isfinite(a).all(1) & np.isfinite(b).all(1)
    with np.errstate(invalid="ignore", over="ignore"):      # inf - inf: NaN, as the GPU's
        plain = (c.astype(np.float64) + (a.astype(np.float64) * b.astype(np.float64)).sum(1)).astype(np.float32)
    out[~finite] = plain[~finite]
    c, a, b = c[finite].astype(np.float64), a[finite].astype(np.float64), b[finite].astype(np.float64)

    def ex(v):   # floor(log2 |v|), v finite and nonzero; a subnormal counts as -126 (its exponent field's)
        return np.maximum(np.frexp(v)[1].astype(np.int64) - 1, -126)

    low = np.int64(-(1 << 40))                     # below every exponent: no term
    e_c = np.where(c != 0, ex(np.where(c != 0, c, 1.0)), low)
    nz = (a != 0) & (b != 0)
    e_p = np.where(nz, ex(np.where(a != 0, a, 1.0)) + ex(np.where(b != 0, b, 1.0)), low)
    E = np.maximum(e_c, e_p.max(1))
    none = E == low
    ulp = np.ldexp(1.0, np.where(none, 0, E - 25))
    s = np.trunc(c / ulp) * ulp + (np.trunc(a * b / ulp[:, None]) * ulp[:, None]).sum(1)
    f = s.astype(np.float32)
    f = np.where(np.isinf(f), np.copysign(np.finfo(np.float32).max, f), f).astype(np.float32)
    away = np.abs(f.astype(np.float64)) > np.abs(s)
    f[away] = np.nextafter(f[away], np.float32(0))
    f[f == 0] = np.float32(0)                      # a zero result is +0
    f[none] = (c[none] + 0.0).astype(np.float32)
    out[finite] = f
    return out


def model_chain(C: np.ndarray, A: np.ndarray, B: np.ndarray, KS: int) -> np.ndarray:
    """D = C + A[:, :8 KS] . B[:, :8 KS]^T as KS chained steps of the model."""
    a, b = tf32_operand(A), tf32_operand(B)
    m, n = C.shape
    d = C.astype(np.float32).reshape(-1)
    rows, cols = np.repeat(np.arange(m), n), np.tile(np.arange(n), m)
    for k in range(KS):
        d = mma_step(d, a[rows, 8 * k:8 * k + 8], b[cols, 8 * k:8 * k + 8])
    return d.reshape(m, n)


def same_bits(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Equal bits, or both NaN (a NaN's payload is not compared)."""
    return (x.view(np.uint32) == y.view(np.uint32)) | (np.isnan(x) & np.isnan(y))


# ------------------------------------------------------------------------------------------
# the emulator's runs of the probe's kernels (memoised: each test reads the ones it needs)

@pytest.fixture(scope="module")
def inputs():
    return probe.trials()


@pytest.fixture(scope="module")
def emulated(inputs):
    if cl.device().backend != "emu":
        pytest.skip("the emulator's model (on a GPU, test_gpu_matches_probe_data checks the GPU itself)")
    return probe.run(inputs)


# ------------------------------------------------------------------------------------------
# cvt.rna.tf32.f32

# (input bits, result bits) worked out from the definition: 10 mantissa bits, to nearest, ties away
CVT_CASES = [
    (0x3F800000, 0x3F800000),    # 1.0
    (0x3F801000, 0x3F802000),    # 1 + 2^-11, a tie: away from zero
    (0xBF801000, 0xBF802000),    # -(1 + 2^-11): away from zero is down
    (0x3F800FFF, 0x3F800000),    # just below the tie
    (0x3F801FFF, 0x3F802000),    # just below the next TF32 value
    (0x3FFFF000, 0x40000000),    # the carry moves into the exponent: 2.0
    (0x7F7FF000, 0x7F800000),    # the largest float's tie: infinity
    (0x7F7FEFFF, 0x7F7FE000),    # below it: the largest TF32 value
    (0x00001000, 0x00002000),    # a subnormal tie
    (0x00000FFF, 0x00000000),    # a subnormal that rounds to zero
    (0x807FF000, 0x80800000),    # the largest subnormal's tie: the smallest normal
    (0x7F800000, 0x7F800000),    # +inf
    (0xFF800000, 0xFF800000),    # -inf
    (0x80000000, 0x80000000),    # -0
]


def test_cvt_rna_on_worked_cases():
    m = cl.load(KERNEL)
    x = np.array([c for c, _ in CVT_CASES] + [0x7FC00000, 0x7F800001], np.uint32)
    out = cl.to_device(torch.zeros(len(x), dtype=torch.int32))
    m.kernel("cvt_rna")(out, cl.to_device(torch.from_numpy(x.view(np.float32))), len(x), grid=(1, 1, 1),
                        block=(32, 1, 1))
    got = out.cpu().numpy().view(np.uint32)
    if cl.device().backend == "emu":
        want = np.array([r for _, r in CVT_CASES], np.uint32)
    else:                                          # the GPU may leave bits below the TF32 value
        got, want = got[:len(CVT_CASES)] & np.uint32(0xFFFFE000), np.array([r for _, r in CVT_CASES], np.uint32)
    assert [hex(v) for v in got[:len(CVT_CASES)]] == [hex(v) for v in want]
    # a NaN keeps its top 19 bits (an H200's answer): with its payload in the low 13, an infinity
    assert [hex(v) for v in got[-2:]] == ["0x7fc00000", "0x7f800000"]


def test_round_and_split_in_torch_as_the_kernels():
    """convlab.ops.tf32.round_tf32 (the book's and the exercise's) gives cvt.rna's bits, and
    split_tf32's hi + lo is x to within 2^-22 |x| (normal x)."""
    x = np.array([c for c, _ in CVT_CASES], np.uint32).view(np.float32)
    got = round_tf32(torch.from_numpy(x)).numpy().view(np.uint32)
    assert [hex(v) for v in got] == [hex(r) for _, r in CVT_CASES]
    t = torch.randn(200_000) * torch.exp2(torch.randint(-60, 60, (200_000,)).float())
    hi, lo = split_tf32(t)
    assert (hi.view(torch.int32) & 0x1FFF).eq(0).all() and (lo.view(torch.int32) & 0x1FFF).eq(0).all()
    err = ((hi.double() + lo.double()) - t.double()).abs() / t.double().abs()
    assert err.max() <= 2.0 ** -22
    assert err.max() > 2.0 ** -24             # and it is not exact: lo keeps 11 of the 13 bits hi drops


# ------------------------------------------------------------------------------------------
# the emulator against the model's statement

def test_emulator_mma_and_wgmma_are_the_model(inputs, emulated):
    for t, kind in enumerate(inputs["kind"]):
        A, B, C, KS = inputs["A"][t], inputs["B"][t], inputs["C"][t], int(inputs["KS"][t])
        want = model_chain(C, A, B, KS)
        assert same_bits(emulated["D"][t], want).all(), f"wgmma, trial {t} ({kind}, KS={KS})"
        assert same_bits(emulated["D16"][t], want[:16, :8]).all(), f"mma.sync, trial {t} ({kind}, KS={KS})"
    for t in range(len(inputs["long_A"])):
        want = model_chain(inputs["long_C"][t][:16, :8], inputs["long_A"][t], inputs["long_B"][t], probe.LONG_K // 8)
        assert same_bits(emulated["long_D"][t], want).all(), f"long mma.sync chain {t}"


def test_fragment_layouts_on_exact_sums(inputs, emulated):
    """Small integers: every product and sum exact, so D is the plain matrix product: a lane's
    fragment registers hold the elements the PTX ISA's layouts say (mma.sync m16n8k8, wgmma's tiles)."""
    for t in np.flatnonzero(inputs["kind"] == "integers"):
        KS = int(inputs["KS"][t])
        A, B = inputs["A"][t][:, :8 * KS].astype(np.float64), inputs["B"][t][:, :8 * KS].astype(np.float64)
        exact = inputs["C"][t] + A @ B.T
        assert np.array_equal(emulated["D"][t], exact)
        assert np.array_equal(emulated["D16"][t], exact[:16, :8])


def test_the_model_drifts_toward_zero_on_a_long_chain(inputs, emulated):
    """512 chained steps of positive products: each step's sum rounds toward zero, so the chain ends
    below the exact sum, by far more than a rounded-to-nearest fp32 sum would: the reason the
    chapter's kernels promote each step's sum to an fp32 accumulator."""
    exact = inputs["long_C"][1][:16, :8] + tf32_operand(inputs["long_A"][1]).astype(np.float64) @ \
        tf32_operand(inputs["long_B"][1]).astype(np.float64).T
    rel = (emulated["long_D"][1] - exact) / exact
    assert (rel < 0).all()
    assert np.median(-rel) > 100 * 2.0 ** -24


# ------------------------------------------------------------------------------------------
# the GPU's bits

def test_gpu_matches_probe_data():
    if not GPU_DATA.exists():
        pytest.skip("tests/data/tf32_mma_numerics.npz is not committed yet: the emulator's TF32 model is a "
                    "hypothesis until an H100/H200 runs scripts/probe_tf32.py")
    data = dict(np.load(GPU_DATA))
    got = probe.run(data)         # on the emulator, or on the GPU itself (the same bits either way)
    for name in ("D", "D16", "long_D"):
        bad = ~same_bits(got[name], data[name])
        assert not bad.any(), (f"{name}: {int(bad.sum())} of {bad.size} outputs differ from the GPU's "
                               f"({data['gpu']}); first at {np.argwhere(bad)[0].tolist()}")
    bad = got["cvt_out"] != data["cvt_out"]          # all 32 bits: what the low 13 hold too
    assert not bad.any(), (f"cvt.rna.tf32.f32: {int(bad.sum())} results differ, first for input "
                           f"{data['cvt_in'].view(np.uint32)[bad][0]:#010x}")
    plain = np.stack([(data["C"][t].astype(np.float64) + tf32_operand(data["A"][t][:, :8 * k]).astype(np.float64)
                       @ tf32_operand(data["B"][t][:, :8 * k]).astype(np.float64).T).astype(np.float32)
                      for t, k in enumerate(data["KS"])])
    assert (~same_bits(plain, data["D"])).sum() > 0        # the data tells the models apart
