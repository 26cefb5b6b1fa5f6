#!/usr/bin/env python3
"""Probe the tensor cores' TF32 arithmetic on an H100/H200: wgmma m64n64k8 and mma.sync m16n8k8 with
.tf32 operands, and cvt.rna.tf32.f32, on random and adversarial inputs (tests/data/tf32/tf32_numerics.cu).
Writes OUT/tf32_mma_numerics.npz: every input and the GPU's outputs, which
tests/test_tf32_numerics.py replays on the emulator, bit for bit, once the file is committed as
tests/data/tf32_mma_numerics.npz.

    source .gpu/setup.sh
    python scripts/probe_tf32.py --out $OUT          # about a minute, most of it compiling

Trials (the same seeded inputs every run; KS wgmma/mma steps of 8 products each):
  raw         normal values with all 32 bits random: does the tensor core truncate the low 13 bits?
  rounded     the same, rounded by cvt.rna first (what the course's kernels feed it)
  half_ulp    low 13 bits 0x0fff, 0x1000 or 0x1fff: truncation and rounding tell apart
  cancel      pairs of products that cancel to a few bits, and C the negated sum
  spread      each element scaled by 2^-30..2^30
  denormal    subnormal operands, products below fp32's range, a subnormal C
  big_c       |C| ~ 2^20 over products ~ 2^-5: the accumulator sets the alignment
  near_two    significands in [1.9, 2): products of significand >= 2
  special     an inf and a NaN among finite values
  sparse      mostly zeros
  integers    small integers: exact sums, the fragment layout alone
  long        mma.sync only: 512 chained steps (K = 4096), the accumulator's drift
cvt: ties, carries into the exponent and past the largest float, subnormals, infinities, NaN
payloads, and 4096 random bit patterns.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
KERNEL = ROOT / "tests" / "data" / "tf32" / "tf32_numerics.cu"
KINDS = ("raw", "rounded", "half_ulp", "cancel", "spread", "denormal", "big_c", "near_two", "special", "sparse",
         "integers")
LONG_K = 4096


def _bits(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float32).view(np.uint32)


def _float(u: np.ndarray) -> np.ndarray:
    return u.astype(np.uint32).view(np.float32)


def _rna(x: np.ndarray) -> np.ndarray:
    u = _bits(x).astype(np.uint64)
    return _float(((u + 0x1000) & 0xFFFFE000).astype(np.uint32))


def trial(kind: str, rng: np.random.Generator) -> tuple:
    """(A (64, 32), B (64, 32), C (64, 64)) float32 of one kind."""
    def normal(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    def random_low(x):                              # every low 13 bits random
        return _float((_bits(x) & 0xFFFFE000) | rng.integers(0, 0x2000, x.shape, dtype=np.uint32))

    A, B, C = normal(64, 32), normal(64, 32), normal(64, 64)
    if kind == "raw":
        A, B = random_low(A), random_low(B)
    elif kind == "rounded":
        A, B = _rna(random_low(A)), _rna(random_low(B))
    elif kind == "half_ulp":
        pick = np.array([0x0FFF, 0x1000, 0x1FFF], np.uint32)
        A = _float((_bits(A) & 0xFFFFE000) | rng.choice(pick, A.shape))
        B = _float((_bits(B) & 0xFFFFE000) | rng.choice(pick, B.shape))
    elif kind == "cancel":
        A[:, 1::2] = A[:, 0::2] * np.float32(1 + 2 ** -9)     # a_{2i+1} b_{2i+1} ~ -a_{2i} b_{2i}
        B[:, 1::2] = -B[:, 0::2]
        prod = _rna(A).astype(np.float64) @ _rna(B).astype(np.float64).T
        C = (-prod + rng.standard_normal(prod.shape) * 2 ** -20).astype(np.float32)
    elif kind == "spread":
        A = A * np.exp2(rng.integers(-30, 31, A.shape)).astype(np.float32)
        B = B * np.exp2(rng.integers(-30, 31, B.shape)).astype(np.float32)
        C = C * np.exp2(rng.integers(-30, 31, C.shape)).astype(np.float32)
    elif kind == "denormal":
        A = _float(rng.integers(1, 0x00800000, A.shape, dtype=np.uint32) | (rng.integers(0, 2, A.shape,
                                                                                         dtype=np.uint32) << 31))
        A[::3] = normal(*A[::3].shape) * np.float32(2 ** -120)   # some rows small but normal
        B = B * np.exp2(rng.integers(-20, 21, B.shape)).astype(np.float32)
        C = _float(rng.integers(0, 0x00800000, C.shape, dtype=np.uint32))
    elif kind == "big_c":
        A, B, C = A * np.float32(2 ** -3), B * np.float32(2 ** -2), C * np.float32(2 ** 20)
    elif kind == "near_two":
        A = rng.uniform(1.9, 2.0, A.shape).astype(np.float32) * rng.choice([-1, 1], A.shape).astype(np.float32)
        B = rng.uniform(1.9, 2.0, B.shape).astype(np.float32) * rng.choice([-1, 1], B.shape).astype(np.float32)
        C = C * np.float32(2 ** -4)
    elif kind == "special":
        A[3, 5] = np.inf
        B[7, 2] = np.nan
        A[40, 0], B[40, 0] = np.inf, -np.inf
    elif kind == "sparse":
        A[rng.random(A.shape) < 0.8] = 0
        B[rng.random(B.shape) < 0.8] = 0
        C[rng.random(C.shape) < 0.5] = 0
    elif kind == "integers":
        A = rng.integers(-8, 9, A.shape).astype(np.float32)
        B = rng.integers(-8, 9, B.shape).astype(np.float32)
        C = rng.integers(-64, 65, C.shape).astype(np.float32)
    else:
        raise ValueError(kind)
    return A, B, C


def trials(seed: int = 35) -> dict:
    """Every input of the probe (the same for a seed): wgmma/mma trials, the long mma chains and cvt's."""
    rng = np.random.default_rng(seed)
    kinds, A, B, C, KS = [], [], [], [], []
    for kind in KINDS:
        for ks in (1, 4):
            a, b, c = trial(kind, rng)
            kinds.append(kind)
            A.append(a)
            B.append(b)
            C.append(c)
            KS.append(ks)
    long_a = rng.standard_normal((2, 16, LONG_K)).astype(np.float32)
    long_b = rng.standard_normal((2, 8, LONG_K)).astype(np.float32)
    long_b[1] = np.abs(long_b[1])                       # a one-signed sum: the largest drift toward zero
    long_a[1] = np.abs(long_a[1])
    long_c = np.zeros((2, 64, 64), np.float32)
    special = np.array([0x3F801000, 0xBF801000, 0x3F800FFF, 0x3F801FFF, 0x3FFFF000, 0x7F7FF000, 0x7F7FFFFF,
                        0x7F7FEFFF, 0x00000FFF, 0x00001000, 0x00001FFF, 0x807FF000, 0x00000001, 0x7F800000,
                        0xFF800000, 0x7F800001, 0x7F801000, 0x7FC00000, 0xFFC00001, 0x7FFFFFFF, 0x00000000,
                        0x80000000], np.uint32)
    cvt_in = np.concatenate([special, rng.integers(0, 2 ** 32, 4096, dtype=np.uint64).astype(np.uint32)])
    return dict(kind=np.array(kinds), A=np.stack(A), B=np.stack(B), C=np.stack(C), KS=np.array(KS),
                long_A=long_a, long_B=long_b, long_C=long_c, cvt_in=_float(cvt_in))


def run(data: dict) -> dict:
    """The probe's kernels on the active backend: D (wgmma), D16 (mma.sync), long_D, cvt_out."""
    import torch

    import convlab as cl

    m = cl.load(KERNEL)
    D, D16 = [], []
    for t in range(len(data["KS"])):
        A, B = cl.to_device(torch.from_numpy(data["A"][t])), cl.to_device(torch.from_numpy(data["B"][t]))
        C, KS = cl.to_device(torch.from_numpy(data["C"][t])), int(data["KS"][t])
        out = cl.to_device(torch.full((64, 64), float("nan")))
        m.kernel("wgmma_tf32_chain")(out, C, cl.tensor_map(A, (64, 32)), cl.tensor_map(B, (64, 32)), KS,
                                     grid=(1, 1, 1), block=(128, 1, 1), shared=2 * 8192 + 1024)
        D.append(out.cpu().numpy())
        out16 = cl.to_device(torch.full((64, 64), float("nan")))
        m.kernel("mma_tf32_chain")(out16, C, A, B, KS, 32, grid=(1, 1, 1), block=(32, 1, 1))
        D16.append(out16.cpu().numpy()[:16, :8])
    long_D = []
    for t in range(len(data["long_A"])):
        A, B = cl.to_device(torch.from_numpy(data["long_A"][t])), cl.to_device(torch.from_numpy(data["long_B"][t]))
        C = cl.to_device(torch.from_numpy(data["long_C"][t]))
        out = cl.to_device(torch.full((64, 64), float("nan")))
        m.kernel("mma_tf32_chain")(out, C, A, B, LONG_K // 8, LONG_K, grid=(1, 1, 1), block=(32, 1, 1))
        long_D.append(out.cpu().numpy()[:16, :8])
    n = len(data["cvt_in"])
    cvt_out = cl.to_device(torch.zeros(n, dtype=torch.int32))
    m.kernel("cvt_rna")(cvt_out, cl.to_device(torch.from_numpy(data["cvt_in"])), n, grid=((n + 255) // 256, 1, 1),
                        block=(256, 1, 1))
    return dict(D=np.stack(D), D16=np.stack(D16), long_D=np.stack(long_D),
                cvt_out=cvt_out.cpu().numpy().view(np.uint32))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for tf32_mma_numerics.npz")
    args = parser.parse_args()
    import convlab as cl

    dev = cl.device()
    if dev.backend != "cuda" or tuple(dev.cc) != (9, 0):
        raise SystemExit(f"the probe measures an H100/H200 (sm_90); this is {dev.name}")
    data = trials()
    data.update(run(data))
    args.out.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out / "tf32_mma_numerics.npz", gpu=np.array(dev.name), **data)
    print(f"{dev.name}: {len(data['KS'])} wgmma/mma trials, {len(data['long_A'])} long mma chains, "
          f"{len(data['cvt_in'])} cvt inputs -> {args.out / 'tf32_mma_numerics.npz'}")


if __name__ == "__main__":
    main()
