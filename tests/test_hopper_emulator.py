"""Hopper's asynchronous path on the CPU emulator (convlab/gpu/emu/include/clemu_hopper.h and runtime.cpp):
wgmma from shared-memory descriptors, mbarriers, TMA tiled loads, named barriers. The tests of
results run on an H100/H200 too (the same kernels, checked against the same expectations); the
sanitizer's are the emulator's alone (emu_only).

- The tensor cores' accumulation: wgmma m64n64k16 (fed by TMA in the 128-byte swizzle) and mma.sync
  m16n8k16 give the H100's bits on the measured trials (tests/data/hopper_mma_numerics.npz); fp16
  and bf16, K-major and transposed operands, follow the same rule (benchmarks/mma_numerics_probe.py's
  trials; its recorded GPU bits, tests/data/hopper_mma_numerics_bf16.npz, once committed).
- conv2d_wgmma (kernels/11_hopper) against torch in float64 on awkward shapes, outputs poisoned first.
- TMA: a box's zero fill outside the tensor (negative coordinates too) and each swizzle, and a box
  read with element strides, against a direct computation.
- The sanitizer: tests/data/hopper/pipeline.cu makes one mistake per `bug` value; each is reported
  with its error type and the lines it names (tagged `// [tag]` in the file), and the same kernel
  without the mistake runs and computes the right product, over several rounds of the ring.
"""
from __future__ import annotations

import re
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import convlab as cl
from convlab.ops.fp16 import check_fp16
from convlab.ops.wgmma import conv2d_wgmma

DATA = Path(__file__).resolve().parent / "data"
PIPELINE = DATA / "hopper" / "pipeline.cu"


def _line(tag: str) -> str:
    """'tests/data/hopper/pipeline.cu:N' of the line tagged `// [tag]`."""
    for i, text in enumerate(PIPELINE.read_text().splitlines(), 1):
        if f"// [{tag}]" in text:
            return f"tests/data/hopper/pipeline.cu:{i}"
    raise KeyError(tag)


# ------------------------------------------------------------------------------------------
# numerics

def _sequential_fmaf(C, A, B, KS):
    """What the emulator computed before the measurement: fmaf over k in float32 (for contrast)."""
    d = C.astype(np.float32).copy()
    a, b = A.astype(np.float32), B.astype(np.float32)
    for k in range(16 * KS):
        d = (d.astype(np.float64) + np.outer(a[:, k], b[:, k]).astype(np.float64)).astype(np.float32)
    return d


def test_wgmma_and_mma_give_the_h100s_bits():
    data = np.load(DATA / "hopper_mma_numerics.npz")
    m = cl.load(DATA / "hopper" / "wgmma_numerics.cu")
    differs = 0
    for t in range(len(data["KS"])):
        A, B = cl.to_device(torch.from_numpy(data["A"][t])), cl.to_device(torch.from_numpy(data["B"][t]))
        C, KS = cl.to_device(torch.from_numpy(data["C"][t])), int(data["KS"][t])
        D = cl.to_device(torch.full((64, 64), float("nan")))
        m.kernel("wgmma_chain")(D, C, cl.tensor_map(A, (64, 64)), cl.tensor_map(B, (64, 64)), KS,
                                grid=(1, 1, 1), block=(128, 1, 1), shared=2 * 8192 + 1024)
        assert np.array_equal(D.cpu().numpy().view(np.uint32), data["D"][t].view(np.uint32)), f"wgmma, trial {t}"
        D16 = cl.to_device(torch.full((64, 64), float("nan")))
        m.kernel("mma_chain")(D16, C, A, B, KS, grid=(1, 1, 1), block=(32, 1, 1))
        assert np.array_equal(D16.cpu().numpy()[:16, :8].view(np.uint32), data["D16"][t].view(np.uint32)), \
            f"mma, trial {t}"
        differs += int((_sequential_fmaf(data["C"][t], data["A"][t], data["B"][t], KS) != data["D"][t]).sum())
    assert differs > 0      # the data tells the models apart: plain float sums would not pass


def test_the_numpy_model_is_the_emulators_rule_on_the_h100_data():
    """benchmarks/mma_numerics_probe.py's mma_model (clemu_mma_numerics.h's rule in numpy, which the
    bf16 checks below use) gives the H100's fp16 bits too."""
    from benchmarks.mma_numerics_probe import mma_model

    data = np.load(DATA / "hopper_mma_numerics.npz")
    for t in range(len(data["KS"])):
        A, B = data["A"][t].astype(np.float64), data["B"][t].astype(np.float64)
        D = mma_model(data["C"][t], A, B, int(data["KS"][t]))
        assert np.array_equal(D.view(np.uint32), data["D"][t].view(np.uint32)), f"trial {t}"
        assert np.array_equal(D[:16, :8].view(np.uint32), data["D16"][t].view(np.uint32)), f"trial {t}"


def _follow_the_model(dtype, kinds):
    from benchmarks import mma_numerics_probe as P

    for A, B, C, KS, kind in P.trials(dtype, seed=7, kinds=kinds)[::3]:
        D, DT, D16 = P.run_kernels(A, B, C, KS, dtype)
        want = P.mma_model(C, A, B, KS).view(np.uint32)
        assert np.array_equal(D.view(np.uint32), want), f"wgmma, {dtype} {kind}"
        assert np.array_equal(DT.view(np.uint32), want), f"wgmma with transposed operands, {dtype} {kind}"
        assert np.array_equal(D16.view(np.uint32), want[:16, :8]), f"mma.sync, {dtype} {kind}"


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_wgmma_and_mma_follow_the_model_in_fp16_and_bf16(dtype):
    """wgmma with K-major and with transposed (M-/N-major) operands and mma.sync, on random and
    adversarial trials of each kind but subnormal inputs (mma_numerics_probe.trials), give the
    model's bits. On an H100/H200 this is the model's test for bf16 and for the transposed tiles'
    layout; on the emulator, that bf16 and the transposed tiles reach the model."""
    from benchmarks.mma_numerics_probe import AB_KINDS

    _follow_the_model(dtype, [k for k in AB_KINDS if k != "tiny"])


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_subnormal_inputs_follow_the_model(dtype):
    """The same for subnormal inputs, which no measurement covered before (the rule extended to them:
    clemu_mma_numerics.h). A failure here on a GPU says the tensor cores treat them otherwise."""
    _follow_the_model(dtype, ["tiny"])


def _kinds_variant(old: str, new: str, **defines):
    """tests/data/hopper/wgmma_kinds.cu with one line changed, loaded beside it."""
    text = (DATA / "hopper" / "wgmma_kinds.cu").read_text()
    assert old in text, "wgmma_kinds.cu changed: update the line this test edits"
    return cl.load_source(text.replace(old, new), name="wgmma_kinds_variant", defines=defines,
                          directory=DATA / "hopper")


def _run_kinds(m, transposed: bool):
    A, B, C = cl.randn(64, 64).half(), cl.randn(64, 64).half(), cl.randn(64, 64)
    ta, tb = (A.T.contiguous(), B.T.contiguous()) if transposed else (A, B)
    m.kernel("wgmma_kinds")(torch.empty(64, 64), C, cl.tensor_map(ta, (64, 64)), cl.tensor_map(tb, (64, 64)), 1,
                            grid=(1, 1, 1), block=(128, 1, 1), shared=2 * 8192 + 1024)


@pytest.mark.emu_only
def test_an_m_n_major_tile_off_its_1024_byte_boundary_is_refused():
    m = _kinds_variant("uint64_t db = TRANSPOSED ? smem_desc_128b_mn(smem + 8192, 8192) : smem_desc_128b(smem + 8192);",
                       "uint64_t db = smem_desc_128b_mn(smem + 8192, 8192) + 32;", TRANSPOSED=1)
    with pytest.raises(cl.KernelFault, match="B's descriptor starts 512 bytes past a 1024-byte boundary: an M/N-major"):
        _run_kinds(m, True)


@pytest.mark.emu_only
def test_a_strided_box_announced_at_its_traversal_size_never_completes():
    """With element strides a copy brings ceil(box / stride) elements a dimension, not the box:
    announcing the box's bytes leaves the phase waiting for bytes that never come."""
    t = cl.randn(7, 9, 64).half()
    with pytest.raises(cl.BarrierError, match="fewer than announced"):
        cl.load(DATA / "hopper" / "tma_box.cu").kernel("tma_box")(
            torch.zeros(4 * 6 * 64 // 2, dtype=torch.int32), cl.tensor_map(t, (4, 6, 64), element_strides=(2, 3, 1)),
            0, 0, 0, 4 * 6 * 64 * 2, grid=(1, 1, 1), block=(64, 1, 1), shared=4 * 6 * 64 * 2 + 1024)


def test_bf16_gives_the_gpus_recorded_bits():
    """The emulator against the GPU's bf16 outputs that benchmarks/mma_numerics_probe.py recorded."""
    from benchmarks import mma_numerics_probe as P

    path = DATA / "hopper_mma_numerics_bf16.npz"
    if not path.exists():
        pytest.skip("no recorded bf16 outputs yet: run benchmarks/mma_numerics_probe.py on an H100/H200 and "
                    "commit its hopper_mma_numerics_bf16.npz to tests/data/")
    data = np.load(path)
    for t in range(len(data["KS"])):
        A, B = (torch.from_numpy(data[k][t].view(np.int16)).view(torch.bfloat16).double().numpy() for k in "AB")
        D, DT, D16 = P.run_kernels(A, B, data["C"][t], int(data["KS"][t]), "bf16")
        for got, key in ((D, "D"), (DT, "DT"), (D16, "D16")):
            assert np.array_equal(got.view(np.uint32), data[key][t].view(np.uint32)), f"{key}, {data['kind'][t]}"


# ------------------------------------------------------------------------------------------
# conv2d_wgmma

# (B, C, H, W, M, K, padding, bias, relu, tunables)
CASES = [
    (1, 8, 5, 7, 8, 3, 1, False, False, {}),                  # C = 8: most of the 64-channel box is zeros
    (1, 72, 9, 18, 24, 3, 1, True, True, dict(BN=64)),        # a partial second channel step; M = 24 of BN = 64
    (3, 16, 7, 7, 136, 3, 2, True, False, dict(STAGES=2)),    # boxes of several images, M = 136: two map tiles
    (2, 8, 6, 5, 16, 5, 3, False, True, dict(BW=4, BH=3, BI=1)),   # padding 3 of a 5x5 mask: boxes far outside
    (2, 24, 7, 9, 40, 3, 1, True, False, dict(RINGS=2)),     # ping-pong: a ring and a producer per warpgroup
    (1, 72, 5, 6, 136, 1, 0, False, True, dict(RINGS=2, BN=64, STAGES=3)),   # 1x1, three map tiles, two rings
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{}C{}-{}x{}-M{}-k{}p{}".format(*c[:7]))
def test_conv2d_wgmma_on_awkward_shapes(case):
    B, C, H, W, M, K, pad, bias, relu, tun = case
    x, w = cl.randn(B, C, H, W).half(), cl.randn(M, C, K, K).half()
    b = cl.randn(M).half() if bias else None
    Ho, Wo = H + 2 * pad - K + 1, W + 2 * pad - K + 1
    y = cl.to_device(torch.full((B, Ho, Wo, M), float("nan"), dtype=torch.float16)).permute(0, 3, 1, 2)
    conv2d_wgmma(x, w, y, padding=pad, bias=b, relu=relu, **tun)
    ref = F.conv2d(x.double().cpu(), w.double().cpu(), None if b is None else b.double().cpu(), padding=pad)
    if relu:
        ref = ref.relu()
    check_fp16(y, ref, C=C * K * K, K=1, accumulate="float", rounded_inputs=True)


@pytest.mark.parametrize("rings", [1, 2])
def test_conv2d_wgmma_persistent_blocks_take_several_tiles(monkeypatch, rings):
    """Two blocks for twelve tiles (the launcher gives one block per SM: here 2): the rings' phases
    run on across tiles and each warpgroup's staging tile is reused behind its named barrier."""
    import convlab.ops.wgmma as wg
    monkeypatch.setattr(wg, "sm_count", lambda: 2)
    wg._plans.clear()
    x, w, b = cl.randn(1, 16, 11, 13).half(), cl.randn(136, 16, 3, 3).half(), cl.randn(136).half()
    y = cl.to_device(torch.full((1, 11, 13, 136), float("nan"), dtype=torch.float16)).permute(0, 3, 1, 2)
    try:
        conv2d_wgmma(x, w, y, padding=1, bias=b, relu=True, BW=8, BH=4, BI=1, STAGES=3, RINGS=rings)
    finally:
        wg._plans.clear()
    ref = F.conv2d(x.double().cpu(), w.double().cpu(), b.double().cpu(), padding=1).relu()
    check_fp16(y, ref, C=16 * 9, K=1, accumulate="float", rounded_inputs=True)


# ------------------------------------------------------------------------------------------
# TMA

def _swizzled(offset: np.ndarray, swizzle: int) -> np.ndarray:
    """The 16-byte chunk bits [4:4+log2(swizzle/16)] of an address XORed with bits [7:...]."""
    mask = {0: 0, 32: 1, 64: 3, 128: 7}[swizzle]
    return offset ^ (((offset >> 7) & mask) << 4)


@pytest.mark.parametrize("dtype,swizzle,box", [(torch.float16, 128, (3, 5, 64)), (torch.float16, 64, (2, 4, 32)),
                                               (torch.float32, 32, (2, 9, 8)), (torch.float32, 0, (3, 3, 12))])
def test_tma_box_zero_fill_and_swizzle(dtype, swizzle, box):
    m = cl.load(DATA / "hopper" / "tma_box.cu")
    t = cl.to_device(torch.randn(4, 6, 40).to(dtype) + 3)       # no zeros inside the tensor
    es = t.element_size()
    nbytes = int(np.prod(box)) * es
    for c2, c1, c0 in [(0, 0, 0), (-1, 4, -8), (2, -3, 32), (-5, 0, 0)]:
        out = cl.to_device(torch.zeros(nbytes // 4, dtype=torch.int32))
        m.kernel("tma_box")(out, cl.tensor_map(t, box, swizzle=swizzle), c0, c1, c2, nbytes,
                            grid=(1, 1, 1), block=(64, 1, 1), shared=nbytes + 1024)
        got = out.cpu().numpy().view(np.uint8)
        want = np.zeros(nbytes, np.uint8)
        src = t.cpu().view(torch.int16 if es == 2 else torch.int32).numpy()
        for i2 in range(box[0]):
            for i1 in range(box[1]):
                for i0 in range(box[2]):
                    g2, g1, g0 = c2 + i2, c1 + i1, c0 + i0
                    inside = 0 <= g2 < t.shape[0] and 0 <= g1 < t.shape[1] and 0 <= g0 < t.shape[2]
                    v = src[g2, g1, g0] if inside else src.dtype.type(0)
                    off = int(_swizzled(np.array(((i2 * box[1] + i1) * box[2] + i0) * es), swizzle))
                    want[off:off + es] = np.frombuffer(v.tobytes(), np.uint8)
        assert np.array_equal(got, want), f"box at {(c2, c1, c0)}"


@pytest.mark.parametrize("steps,box", [((2, 3, 1), (4, 6, 64)), ((1, 2, 1), (3, 5, 32)), ((3, 1, 1), (5, 4, 8))])
def test_tma_box_with_element_strides(steps, box):
    """A copy steps through each outer dimension by its element stride and loads ceil(box / stride)
    elements of it (the box of a strided convolution's pixels); zeros outside the tensor."""
    m = cl.load(DATA / "hopper" / "tma_box.cu")
    t = cl.to_device(torch.randn(7, 9, 64).half() + 3)
    got_box = tuple(-(-b // s) for b, s in zip(box, steps))
    nbytes = int(np.prod(got_box)) * 2
    src = t.cpu().view(torch.int16).numpy()
    for c2, c1, c0 in [(0, 0, 0), (-1, -2, 0), (5, 4, 32)]:
        out = cl.to_device(torch.zeros(nbytes // 4, dtype=torch.int32))
        m.kernel("tma_box")(out, cl.tensor_map(t, box, swizzle=128 if box[2] == 64 else 0, element_strides=steps),
                            c0, c1, c2, nbytes, grid=(1, 1, 1), block=(64, 1, 1), shared=nbytes + 1024)
        got = out.cpu().numpy().view(np.uint8)
        want = np.zeros(nbytes, np.uint8)
        for i2 in range(got_box[0]):
            for i1 in range(got_box[1]):
                for i0 in range(got_box[2]):
                    g2, g1, g0 = c2 + i2 * steps[0], c1 + i1 * steps[1], c0 + i0
                    inside = 0 <= g2 < t.shape[0] and 0 <= g1 < t.shape[1] and 0 <= g0 < t.shape[2]
                    v = src[g2, g1, g0] if inside else np.int16(0)
                    off = ((i2 * got_box[1] + i1) * got_box[2] + i0) * 2
                    off = int(_swizzled(np.array(off), 128 if box[2] == 64 else 0))
                    want[off:off + 2] = np.frombuffer(v.tobytes(), np.uint8)
        assert np.array_equal(got, want), f"box at {(c2, c1, c0)}"


def test_tensor_map_element_strides_are_checked():
    t = cl.randn(4, 6, 64).half()
    for bad in [(1, 2), (9, 1, 1), (1, 1, 2), (0, 1, 1)]:
        with pytest.raises(cl.ArgumentError, match="element_strides"):
            cl.tensor_map(t, (2, 4, 64), element_strides=bad)


@pytest.mark.emu_only
def test_a_box_off_a_16_byte_boundary_is_refused():
    """An H100 stops the kernel with an illegal instruction when a box's innermost coordinate is not
    a multiple of 16 bytes (36 halves: 72 bytes), even inside the tensor; the emulator says why."""
    t = cl.randn(4, 6, 40).half()
    with pytest.raises(cl.KernelFault, match="innermost coordinate 36 is 72 bytes into a row, not a multiple of 16"):
        cl.load(DATA / "hopper" / "tma_box.cu").kernel("tma_box")(torch.zeros(1920 // 4, dtype=torch.int32),
                                                                  cl.tensor_map(t, (3, 5, 64)), 36, 0, 0, 1920,
                                                                  grid=(1, 1, 1), block=(64, 1, 1), shared=2944)


@pytest.mark.emu_only
def test_a_map_of_another_rank_is_refused():
    t = cl.randn(8, 64).half()
    with pytest.raises(cl.KernelFault, match="the tensor map has 2 dimensions, but 3 coordinates were given"):
        cl.load(DATA / "hopper" / "tma_box.cu").kernel("tma_box")(torch.zeros(256, dtype=torch.int32),
                                                                  cl.tensor_map(t, (8, 64)), 0, 0, 0, 1024,
                                                                  grid=(1, 1, 1), block=(64, 1, 1), shared=2048)


@pytest.mark.emu_only
def test_the_emulators_tensor_map_holds_the_fields():
    t = cl.randn(3, 5, 64).half()
    m = cl.tensor_map(t, (2, 4, 32), swizzle=64)
    f = struct.unpack("<IiiiQ5q4q5II8x", m.encoded)
    assert len(m.encoded) == 128
    assert f[:5] == (0x4D544C43, 6, 3, 2, t.data_ptr())
    assert f[5:10] == (64, 5, 3, 0, 0) and f[10:14] == (128, 640, 0, 0) and f[14:19] == (32, 4, 2, 0, 0)
    assert f[19] == 2


# ------------------------------------------------------------------------------------------
# the sanitizer

def _pipeline(bug, rounds=1, b_by_threads=0, alpha=1.0):
    k = cl.load(PIPELINE).kernel("pipeline")
    A, B = cl.randn(64 * rounds, 64).half(), cl.randn(64, 64).half()
    D = cl.to_device(torch.full((64, 64), float("nan")))
    k(D, B, cl.tensor_map(A, (64, 64)), cl.tensor_map(B, (64, 64)), rounds, alpha, b_by_threads, bug,
      grid=(1, 1, 1), block=(256, 1, 1), shared=3 * 8192 + 1024)
    return D.cpu(), sum(A[64 * r:64 * r + 64].double().cpu() @ B.double().cpu().T for r in range(rounds)) * alpha


@pytest.mark.parametrize("rounds,b_by_threads", [(1, 0), (5, 0), (5, 1)])
def test_pipeline_without_mistakes_computes_the_product(rounds, b_by_threads):
    """Two stages, five rounds: each mbarrier goes through phases 0, 1, 0 (parity flips), the
    producer waits for 'empty' before it refills; B by TMA or by the threads' own swizzled stores
    (then fenced and named-barrier synced)."""
    D, ref = _pipeline(0, rounds, b_by_threads, alpha=0.5)
    assert torch.allclose(D.double(), ref, rtol=1e-5, atol=1e-4)


@pytest.mark.emu_only
@pytest.mark.parametrize("order", ["reverse", "shuffled"])
def test_pipeline_in_other_thread_orders(order):
    with cl.thread_order(order):
        D, ref = _pipeline(0, 5, 1)
    assert torch.allclose(D.double(), ref, rtol=1e-5, atol=1e-4)


# bug -> (error, the message's words, the tagged lines it names)
MISTAKES = {
    1: (cl.RaceError, "read of a wgmma accumulator", ["epilogue", "wgmma"]),                 # no wgmma_wait at all
    2: (cl.RaceError, "read of a wgmma accumulator", ["epilogue"]),                          # wgmma_wait<1> for <0>
    3: (cl.RaceError, "wrote its accumulator d[5] while the wgmma", ["wgmma"]),             # acc written in flight
    4: (cl.RaceError, "still reads it", ["overwrite", "wgmma"]),                              # tile stored in flight
    5: (cl.RaceError, "which the wgmma", ["tma_over", "wgmma"]),                             # TMA into a tile in use
    6: (cl.RaceError, "has waited for the copy", ["wgmma", "tma_a"]),                        # no mbar_wait
    7: (cl.RaceError, "before this thread has waited for the copy", ["early_read", "tma_a"]),   # read before the wait
    8: (cl.RaceError, "add fence_proxy_async() after the stores at", ["wgmma", "store_b"]),  # no fence
    9: (cl.BarrierError, "transaction count would go negative", ["tma_b", "expect"]),         # fewer bytes announced
    10: (cl.BarrierError, "1024 bytes fewer than announced", ["wait_full", "expect"]),       # more bytes announced
    11: (cl.BarrierError, "only 96 of the 128 threads of warpgroup 1", []),                   # warp 4 sits out
    12: (cl.BarrierError, "span two warpgroups", []),                                      # warps 1-4 as a warpgroup
    13: (cl.KernelFault, "used before mbar_init", ["uninit"]),
    14: (cl.KernelFault, "512 bytes past a 1024-byte boundary", ["desc"]),
    15: (cl.KernelFault, "inside argument `D`, global memory", ["desc_b"]),
    16: (cl.KernelFault, "it is a local variable", ["local_bar"]),
    17: (cl.BarrierError, "its parity is off by one", ["wait_full"]),                         # waits a phase too late
    18: (cl.RaceError, "read of a wgmma accumulator", ["copy_out", "wgmma"]),                 # acc copied out, no wait
    20: (cl.BarrierError, "waits for threads that never come: warps 5-7 of warpgroup 1", ["fence", "stray_sync"]),
    21: (cl.RaceError, "3 of its phases (0 to 2) have completed", ["wait_full"]),            # refill without 'empty'
    22: (cl.RaceError, "no wgmma_fence() since the warpgroup last touched its accumulators", ["wgmma"]),
}


@pytest.mark.emu_only
@pytest.mark.parametrize("bug", sorted(MISTAKES))
def test_each_mistake_is_reported_with_its_lines(bug):
    error, words, tags = MISTAKES[bug]
    with pytest.raises(error) as e:
        _pipeline(bug, rounds=1 if bug in (1, 2, 18) else 5 if bug == 21 else 3, b_by_threads=int(bug == 8))
    msg = str(e.value)
    assert words in msg, msg
    for tag in tags:
        assert re.search(re.escape(_line(tag)) + r"\b", msg), (tag, msg)


@pytest.mark.emu_only
def test_a_thread_that_returns_with_a_wgmma_in_flight_is_reported():
    """float4 stores are not checked for the poison: the copy of the accumulators goes through,
    and the thread's end names the wgmma that never got its wait."""
    with pytest.raises(cl.RaceError) as e:
        _pipeline(19)
    assert "returned while the wgmma at " + _line("wgmma") in str(e.value)


@pytest.mark.emu_only
def test_a_block_that_is_not_whole_warpgroups_cannot_run_wgmma():
    A, B, C = cl.randn(64, 64).half(), cl.randn(64, 64).half(), cl.randn(64, 64)
    with pytest.raises(cl.BarrierError, match="warpgroup 0 has only 96 threads"):
        cl.load(DATA / "hopper" / "wgmma_numerics.cu").kernel("wgmma_chain")(
            torch.empty(64, 64), C, cl.tensor_map(A, (64, 64)), cl.tensor_map(B, (64, 64)), 1,
            grid=(1, 1, 1), block=(96, 1, 1), shared=2 * 8192 + 1024)


@pytest.mark.emu_only
def test_wgmma_wait_names_the_wait_that_found_a_touched_accumulator():
    with pytest.raises(cl.RaceError, match=r"found at the wgmma_wait at tests/data/hopper/pipeline\.cu:\d+"):
        _pipeline(3, rounds=1)


# ------------------------------------------------------------------------------------------
# named barriers

def _neighbours(sync, count=128):
    out = torch.full((256,), float("nan"))
    cl.load(DATA / "hopper" / "named_barrier.cu").kernel("neighbours")(out, sync, count, grid=(1, 1, 1),
                                                                       block=(256, 1, 1))
    return out


def _nb_line(tag):
    text = (DATA / "hopper" / "named_barrier.cu").read_text().splitlines()
    return f"tests/data/hopper/named_barrier.cu:{next(i for i, t in enumerate(text, 1) if f'// [{tag}]' in t)}"


@pytest.mark.emu_only
def test_a_named_barrier_orders_its_threads_for_the_race_detector():
    t = torch.arange(256)
    assert torch.equal(_neighbours(1), 2.0 * (128 * (t // 128) + (t + 1) % 128))
    with pytest.raises(cl.RaceError) as e:
        _neighbours(0)
    assert _nb_line("write") in str(e.value) and _nb_line("read") in str(e.value)


@pytest.mark.emu_only
def test_a_named_barrier_that_never_fills_is_a_deadlock():
    with pytest.raises(cl.BarrierError, match=re.escape(f"named_barrier_sync(1, 256) at {_nb_line('nbar')} waits "
                                                        "for 256 threads, but only 128 arrive")):
        _neighbours(1, 256)


@pytest.mark.emu_only
def test_several_shared_arrays_in_one_declaration(tmp_path):
    """`__shared__ uint64_t full[S], empty[S];` (conv2d_wgmma's mbarriers): each array is a checked
    shared array of its own, with its own size."""
    mod = cl.load_source("""
__global__ void two(float* out, int past) {
    __shared__ float a[32], b[2][32];
    int t = threadIdx.x;
    a[t] = t;
    b[1][t] = 2 * t;
    __syncthreads();
    out[t] = a[31 - t] + b[1][t] + sizeof(b) / sizeof(float);
    if (past && t == 0) out[0] = b[past][0];
}""", "two", directory=tmp_path)
    out = torch.zeros(32)
    mod.kernel("two")(out, 0, grid=(1, 1, 1), block=(32, 1, 1))
    t = torch.arange(32.0)
    assert torch.equal(out, 31 - t + 2 * t + 64)
    with pytest.raises(cl.OutOfBoundsError, match=r"__shared__ b\[2\]"):
        mod.kernel("two")(out, 2, grid=(1, 1, 1), block=(32, 1, 1))


@pytest.mark.emu_only
def test_a_warp_operation_passes_on_what_a_lane_saw_of_an_mbarrier():
    """Lane 0 waits for the copy; after a __syncwarp() the other lanes may read it, without it they
    read before anything orders them after the copy."""
    m = cl.load(DATA / "hopper" / "warp_wait.cu").kernel("warp_wait")
    t = cl.randn(1, 32)
    out = torch.zeros(32)
    m(out, cl.tensor_map(t, (1, 32), swizzle=0), 1, grid=(1, 1, 1), block=(32, 1, 1), shared=2048)
    assert torch.equal(out, t[0])
    line = next(i for i, s in enumerate((DATA / "hopper" / "warp_wait.cu").read_text().splitlines(), 1) if "[read]" in s)
    with pytest.raises(cl.RaceError, match=rf"read of .* at tests/data/hopper/warp_wait\.cu:{line} by thread \(1,0,0\)"):
        m(out, cl.tensor_map(t, (1, 32), swizzle=0), 0, grid=(1, 1, 1), block=(32, 1, 1), shared=2048)
