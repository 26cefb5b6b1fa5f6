#!/usr/bin/env python3
"""What the tensor cores compute, bit for bit, in fp16 and bf16: wgmma m64n64k16 (operands K-major,
and transposed: M-/N-major tiles) and mma.sync m16n8k16, chained over KS k16 steps onto an fp32
accumulator C, on random and adversarial inputs (tests/data/hopper/wgmma_kinds.cu). On an H100/H200
it records the GPU's outputs; the emulator's model (convlab/gpu/emu/include/clemu_mma_numerics.h, measured
for fp16 in tests/data/hopper_mma_numerics.npz) is then checked against them by
tests/test_hopper_emulator.py.

    python benchmarks/mma_numerics_probe.py --out DIR     # DIR/hopper_mma_numerics_bf16.npz (and _fp16)

Each file holds, per trial t: A[t], B[t] (64 x 64, the dtype's bits as uint16), C[t] (64 x 64
float32), KS[t], and the GPU's D[t] (wgmma, K-major), DT[t] (wgmma, transposed operands) and D16[t]
(mma.sync, rows 0..15 x 0..7), float32; the GPU's name. It prints how many outputs the model
(mma_model below, the header's rule in numpy) gets exactly, per kind of trial. Copy the bf16 file
to tests/data/ to make the emulator's bf16 test compare against it. Runs in seconds.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

KERNEL = ROOT / "tests" / "data" / "hopper" / "wgmma_kinds.cu"
DTYPES = ("fp16", "bf16")
#: kinds of A and B (the H100 fp16 data's four, in each dtype's range), then of C
AB_KINDS = ("sparse", "wide", "integers", "one_to_two", "cancel", "tiny")
C_KINDS = ("zero", "large", "wide", "small")


def _round(v: np.ndarray, dtype: str) -> np.ndarray:
    """float64 values to the dtype's nearest (to even), as float64."""
    import torch

    t = torch.from_numpy(np.ascontiguousarray(v, dtype=np.float64))
    return t.to(torch.float16 if dtype == "fp16" else torch.bfloat16).double().numpy()


def operands(rng, kind: str, dtype: str) -> tuple:
    """A and B (64 x 64, float64 holding the dtype's values) of one kind."""
    big = 12 if dtype == "fp16" else 40          # the exponents the dtype holds comfortably
    if kind == "sparse":                        # 3 of 4 zero: products that set no exponent
        a, b = rng.standard_normal((2, 64, 64))
        a[rng.random((64, 64)) < 0.75] = 0
    elif kind == "wide":                        # magnitudes 2^-14 .. 2^12 (bf16: 2^-40 .. 2^40), both signs
        a, b = np.exp2(rng.uniform(-big - 2, big, (2, 64, 64))) * rng.choice([-1, 1], (2, 64, 64))
    elif kind == "integers":                    # exact integers: many ties in the truncation
        top = 2048 if dtype == "fp16" else 256
        a, b = rng.integers(-top, top + 1, (2, 64, 64)).astype(np.float64)
    elif kind == "one_to_two":                  # one exponent: everything aligned, long carries
        a, b = rng.uniform(1, 2, (2, 64, 64))
    elif kind == "cancel":                      # pairs of equal and opposite products, a small rest
        a, b = rng.standard_normal((2, 64, 64))
        a[:, 1::2] = -a[:, 0::2]
        b[:, 1::2] = b[:, 0::2] * (1 + rng.choice([0, 2.0 ** -6], (64, 32)))
    elif kind == "tiny":                        # subnormal inputs and products far below C
        lo = -24 if dtype == "fp16" else -133
        a, b = np.exp2(rng.uniform(lo, lo + 10, (2, 64, 64))) * rng.choice([-1, 1], (2, 64, 64))
    else:
        raise ValueError(kind)
    return _round(a, dtype), _round(b, dtype)


def accumulator(rng, kind: str) -> np.ndarray:
    if kind == "zero":
        return np.zeros((64, 64), np.float32)
    if kind == "large":
        return rng.uniform(0, 4096, (64, 64)).astype(np.float32) * rng.choice([-1, 1], (64, 64)).astype(np.float32)
    if kind == "wide":
        return (np.exp2(rng.uniform(-30, 21, (64, 64))) * rng.choice([-1, 1], (64, 64))).astype(np.float32)
    return rng.uniform(-4, 4, (64, 64)).astype(np.float32)


def trials(dtype: str, seed: int = 0, kinds=AB_KINDS) -> list:
    """[(A, B, C, KS, kind)]: every AB kind with every C kind, KS 1 and 4."""
    rng = np.random.default_rng([seed, DTYPES.index(dtype)])
    out = []
    for ab in kinds:
        for c in C_KINDS:
            for KS in (1, 4):
                A, B = operands(rng, ab, dtype)
                out.append((A, B, accumulator(rng, c), KS, f"{ab}/{c}/KS{KS}"))
    return out


NONE = -(10 ** 6)        # the exponent of a zero: below any term's


def _ex(v: np.ndarray) -> np.ndarray:
    """floor(log2 |v|) of nonzero values, NONE for zeros; fp32's subnormals count as -126, their
    exponent field's (clemu_mma_numerics.h's mma_ex)."""
    _, e = np.frexp(v)
    e = np.maximum(e.astype(np.int64) - 1, -126)
    return np.where(v != 0, e, NONE)


def mma_k16(c: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """clemu_mma_numerics.h's mma_k16 for every output at once: c (R x N) float32, a (R x 16) and
    b (N x 16) float64 holding fp16 or bf16 values. Finite inputs only."""
    c64 = c.astype(np.float64)
    prod = a[:, None, :] * b[None, :, :]                          # exact: 16-bit significands
    pe = np.where((a[:, None, :] != 0) & (b[None, :, :] != 0), _ex(a)[:, None, :] + _ex(b)[None, :, :], NONE)
    E = np.maximum(pe.max(axis=2), _ex(c64))
    none = E == NONE                                              # nothing nonzero to add
    ulp = np.exp2(np.where(none, 0, E - 25).astype(np.float64))
    s = np.trunc(c64 / ulp) * ulp + (np.trunc(prod / ulp[:, :, None]) * ulp[:, :, None]).sum(axis=2)
    f = s.astype(np.float32)
    away = np.abs(f.astype(np.float64)) > np.abs(s)
    f = np.where(away, np.nextafter(f, np.float32(0)), f)
    f = np.where(np.isinf(f), np.copysign(np.float32(np.finfo(np.float32).max), f), f)
    f = np.where(f == 0, np.float32(0), f)                        # a zero result is +0
    return np.where(none, c + np.float32(0), f).astype(np.float32)


def mma_model(C: np.ndarray, A: np.ndarray, B: np.ndarray, KS: int) -> np.ndarray:
    """D after KS chained k16 steps (the emulator's rule): D = mma_k16(D, A[:, 16k:16k+16], B[...])."""
    D = C.astype(np.float32)
    for k in range(KS):
        D = mma_k16(D, A[:, 16 * k:16 * k + 16], B[:, 16 * k:16 * k + 16])
    return D


def run_kernels(A, B, C, KS: int, dtype: str) -> tuple:
    """(D, DT, D16): wgmma_kinds with K-major and with transposed operands, mma_kinds, on the backend."""
    import torch

    import convlab as cl

    td = torch.float16 if dtype == "fp16" else torch.bfloat16
    a, b = (cl.to_device(torch.from_numpy(v).to(td)) for v in (A, B))
    c = cl.to_device(torch.from_numpy(C))
    out = []
    for trans in (0, 1):
        m = cl.load(KERNEL, defines=dict(DTYPE=DTYPES.index(dtype), TRANSPOSED=trans))
        ta, tb = (a.T.contiguous(), b.T.contiguous()) if trans else (a, b)
        D = cl.to_device(torch.full((64, 64), float("nan")))
        m.kernel("wgmma_kinds")(D, c, cl.tensor_map(ta, (64, 64)), cl.tensor_map(tb, (64, 64)), KS,
                                grid=(1, 1, 1), block=(128, 1, 1), shared=2 * 8192 + 1024)
        out.append(D.cpu().numpy())
    m = cl.load(KERNEL, defines=dict(DTYPE=DTYPES.index(dtype), TRANSPOSED=0))
    D16 = cl.to_device(torch.full((64, 64), float("nan")))
    m.kernel("mma_kinds")(D16, c, a, b, KS, grid=(1, 1, 1), block=(32, 1, 1))
    out.append(D16.cpu().numpy()[:16, :8])
    return tuple(out)


def bits(v: np.ndarray, dtype: str) -> np.ndarray:
    """A float64 array of the dtype's values as its uint16 bits."""
    import torch

    return torch.from_numpy(v).to(torch.float16 if dtype == "fp16" else torch.bfloat16).view(torch.int16).numpy() \
        .view(np.uint16)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for hopper_mma_numerics_{fp16,bf16}.npz")
    ap.add_argument("--seed", type=int, default=2026)
    args = ap.parse_args(argv)
    import convlab as cl

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"# {cl.device()}")
    for dtype in DTYPES:
        rec = {k: [] for k in ("A", "B", "C", "KS", "D", "DT", "D16", "kind")}
        for A, B, C, KS, kind in trials(dtype, args.seed):
            D, DT, D16 = run_kernels(A, B, C, KS, dtype)
            model = mma_model(C, A, B, KS)
            same = (D.view(np.uint32) == model.view(np.uint32)).mean()
            same16 = (D16.view(np.uint32) == model[:16, :8].view(np.uint32)).mean()
            layout = np.array_equal(D.view(np.uint32), DT.view(np.uint32))
            print(f"{dtype} {kind:24s} wgmma = model on {same:7.2%}, mma.sync {same16:7.2%}, transposed = "
                  f"K-major: {layout}")
            for k, v in (("A", bits(A, dtype)), ("B", bits(B, dtype)), ("C", C), ("KS", KS), ("D", D), ("DT", DT),
                         ("D16", D16), ("kind", kind)):
                rec[k].append(v)
        path = out / f"hopper_mma_numerics_{dtype}.npz"
        np.savez_compressed(path, gpu=str(cl.device()), **{k: np.array(v) for k, v in rec.items()})
        print(f"# wrote {path.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
