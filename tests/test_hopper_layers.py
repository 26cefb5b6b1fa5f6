"""The Hopper kernels for the layers of today's CNNs (convlab.ops.hopper: kernels/11_hopper/
conv2d_hopper.cu, conv2d_hopper_dw.cu, splitk_reduce.cu) against torch in float64, on awkward
small shapes, fp16 and bf16, outputs poisoned first: strided and dilated layers (TMA element
strides), 1x1 layers as a GEMM over pixels, few channels (8 taps a stage), split-K, dX in stride
phases with the mask read N-major, dW as a GEMM over pixels with both operands transposed. The same
tests run on an H100/H200 (the emulator's kernels are the GPU's); the launch plans' tests read the
launchers' choices only.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import convlab as cl
from convlab.measuring.workloads import Workload
from convlab.ops import hopper
from convlab.ops.fp16 import U16, fp16_tolerance

U_BF16 = 2.0 ** -8      # bf16's unit roundoff: 8 significant bits


def _check(out, ref, terms: int, dtype, name: str):
    """Half or bf16 inputs (ref from their exact values), fp32 sums of `terms` products, the result
    rounded once: fp16.fp16_tolerance's bound for float sums, with bf16's unit roundoff for the
    final rounding of a bf16 output."""
    rtol, atol_rms = fp16_tolerance(terms, 1, "float", rounded_inputs=True)
    if dtype == torch.bfloat16:
        rtol = rtol - U16 + U_BF16
    rms = float(ref.pow(2).mean().sqrt())
    cl.check(out, ref, rtol=rtol, atol=atol_rms * max(rms, 1e-30), name=name)


def _inputs(B, C, M, H, W, K, dtype, stride=1, padding=0, dilation=1, layout="channels_last"):
    Kh, Kw = (K, K) if isinstance(K, int) else K
    x, w = cl.randn(B, C, H, W).to(dtype), cl.randn(M, C, Kh, Kw).to(dtype)
    if layout == "channels_last":
        x, w = x.contiguous(memory_format=torch.channels_last), w.contiguous(memory_format=torch.channels_last)
    y = F.conv2d(x.double(), w.double(), stride=stride, padding=padding, dilation=dilation)
    dy = cl.randn(*y.shape).to(dtype)
    if layout == "channels_last":
        dy = dy.contiguous(memory_format=torch.channels_last)
    return x, w, dy


def _poisoned(shape, dtype):
    N, C, H, W = shape
    return cl.to_device(torch.full((N, H, W, C), float("nan"), dtype=dtype)).permute(0, 3, 1, 2)


F16, BF16 = torch.float16, torch.bfloat16

# (B, C, M, H, W, K, stride, padding, dilation, bias, relu, dtype, tunables, what it exercises)
FORWARD = [
    (1, 16, 24, 6, 7, 3, 1, 1, 1, True, True, F16, {}, "3x3, M = 24 of a 64-wide tile"),
    (2, 24, 16, 9, 10, 3, 2, 1, 1, False, False, BF16, {}, "stride 2 by element strides, odd sizes"),
    (2, 3, 16, 10, 9, 7, 2, 3, 1, True, False, F16, {}, "RGB stem: 8 taps of 8 channels a stage"),
    (1, 3, 8, 7, 6, 3, 1, 1, 1, False, True, BF16, {}, "VGG's first layer: few channels at stride 1"),
    (2, 72, 136, 5, 6, 1, 1, 0, 1, True, False, F16, {}, "1x1 as a GEMM over pixels, 72 = 64 + 8 channels"),
    (2, 16, 24, 7, 9, 1, 2, 0, 1, False, False, BF16, {}, "1x1 at stride 2 (a downsampling shortcut)"),
    (1, 8, 16, 9, 8, 3, 1, 2, 2, False, False, F16, {}, "dilation 2"),
    (1, 72, 24, 7, 7, 3, 1, 1, 1, True, True, BF16, dict(SPLIT_K=3), "split-K: bias and ReLU in the reduction"),
    (1, 16, 20, 5, 6, 3, 1, 1, 1, True, False, F16, {}, "M = 20: element stores"),
    (1, 16, 13, 5, 6, 3, 1, 1, 1, False, False, F16, dict(SPLIT_K=2), "M = 13, odd, split"),
    (2, 16, 24, 9, 9, 3, 2, 1, 1, True, False, F16, dict(RINGS=2), "two rings at stride 2"),
    (1, 8, 16, 9, 7, (5, 3), (2, 1), (2, 1), 1, False, False, BF16, {}, "5x3 mask, stride (2, 1)"),
    (1, 16, 24, 5, 5, 3, 1, 1, 1, False, False, F16, dict(BN=256, STAGES=2), "BN = 256, one stage refilled"),
    (2, 16, 136, 6, 7, 3, 1, 1, 1, True, True, F16, dict(BN=128, TMA_STORE=1), "TMA store: 136 maps, boxes clipped"),
    (2, 72, 16, 5, 7, 1, 1, 0, 1, False, False, BF16, dict(TMA_STORE=1), "TMA store of a 1x1 layer's pixel rows"),
]


@pytest.mark.parametrize("case", FORWARD, ids=[c[-1] for c in FORWARD])
def test_forward_on_awkward_shapes(case):
    B, C, M, H, W, K, stride, padding, dilation, has_bias, relu, dtype, tun, _ = case
    x, w, _ = _inputs(B, C, M, H, W, K, dtype, stride, padding, dilation)
    b = cl.randn(M).to(dtype) if has_bias else None
    ref = F.conv2d(x.double(), w.double(), None if b is None else b.double(), stride=stride, padding=padding,
                   dilation=dilation)
    if relu:
        ref = ref.relu()
    y = _poisoned(ref.shape, dtype)
    out = hopper.conv2d_hopper(x, w, y, stride=stride, padding=padding, dilation=dilation, bias=b, relu=relu, **tun)
    assert out is y
    _check(y, ref, C * w.shape[2] * w.shape[3] + (b is not None), dtype, "y")


def test_tma_store_epilogue_over_several_tiles_a_block(monkeypatch):
    """Two blocks for many tiles (the launcher gives one block per SM: here 2): each block's staging
    tile is stored by the copy engine, then rewritten for its next tile after the bulk wait."""
    monkeypatch.setattr(hopper, "sm_count", lambda: 2)
    hopper._plans.clear()
    try:
        x, w, _ = _inputs(2, 16, 72, 9, 11, 3, BF16)
        b = cl.randn(72).to(BF16)
        y = _poisoned((2, 72, 9, 11), BF16)
        hopper.conv2d_hopper(x, w, y, padding=1, bias=b, relu=True, BN=64, BW=8, BH=2, BI=1, TMA_STORE=1)
    finally:
        hopper._plans.clear()
    ref = F.conv2d(x.double(), w.double(), b.double(), padding=1).relu()
    _check(y, ref, 16 * 9 + 1, BF16, "y")


# a mistake in conv2d_hopper.cu's TMA-store epilogue -> (the lines as they are, as changed, the error's words)
STORE_MISTAKES = {
    "no bulk wait": ("                if (t == 0 && wg == 1) bulk_wait_read<0>();\n                named_barrier_sync(3, 256);",
                     "                named_barrier_sync(3, 256);", "while the tma_store at .* may still read it"),
    "no fence": ("                fence_proxy_async();                 // the stores visible to the copy engine\n",
                 "", "no fence_proxy_async.. makes that store visible to the copy engine"),
}


@pytest.mark.emu_only
@pytest.mark.parametrize("mistake", sorted(STORE_MISTAKES))
def test_a_tma_store_epilogue_mistake_is_reported(monkeypatch, mistake):
    """conv2d_hopper.cu's TMA-store epilogue without the bulk wait (the next tile's values go into
    the staging tile while the copy engine may still read the last one) or without the fence (the
    copy engine may read the staging tile before the threads' stores reach it)."""
    from pathlib import Path

    old, new, words = STORE_MISTAKES[mistake]
    root = Path(cl.book.repo_root())
    src = (root / hopper.FILE).read_text()
    assert old in src, "conv2d_hopper.cu changed: update the lines this test edits"
    mod = cl.load_source(src.replace(old, new), name="store_mistake",
                         defines=dict(DTYPE=0, BN=64, STAGES=2, RINGS=1, DX=0, SMALL_C=0, TMA_STORE=1),
                         directory=root / "kernels" / "11_hopper")
    x, w, _ = _inputs(1, 16, 64, 6, 6, 3, F16)
    plan = hopper._fwd_plan(x.shape, w.shape, F16, 1, 1, 1, 1, False, False,
                            dict(BN=64, STAGES=2, BW=8, BH=2, BI=1, TMA_STORE=1))
    yn = _poisoned((1, 64, 6, 6), F16).permute(0, 2, 3, 1)
    maps = [cl.tensor_map(x.permute(0, 2, 3, 1), plan.a_box), cl.tensor_map(w.permute(0, 2, 3, 1), plan.b_box),
            cl.tensor_map(yn, plan.y_box)]
    with pytest.raises(cl.RaceError, match=words):      # one block takes all three tiles
        mod.kernel("conv2d_hopper")(yn, yn, torch.zeros(1), *maps, *plan.launch.scalars, grid=(1, 1, 1),
                                    block=(384, 1, 1), shared=plan.launch.shared, max_shared=hopper.SHARED_OPTIN_MAX)


def test_forward_from_nchw_converts_inside_the_call():
    x, w, _ = _inputs(1, 16, 8, 6, 5, 3, F16, layout="nchw")
    y = hopper.conv2d_hopper(x, w, padding=1)
    assert y.is_contiguous(memory_format=torch.channels_last)
    _check(y, F.conv2d(x.double(), w.double(), padding=1), 16 * 9, F16, "y")


# (B, C, M, H, W, K, stride, padding, dilation, dtype, tunables, what)
DX = [
    (1, 16, 24, 6, 7, 3, 1, 1, 1, F16, {}, "3x3, stride 1: one phase"),
    (2, 24, 16, 9, 10, 3, 2, 1, 1, BF16, {}, "stride 2: four phases of different sizes"),
    (1, 16, 8, 7, 8, 1, 2, 0, 1, F16, {}, "1x1 at stride 2: three phases no tap reaches (zeros)"),
    (1, 8, 16, 9, 9, 3, 2, 2, 2, F16, {}, "stride 2 with dilation 2: every other phase empty"),
    (1, 8, 72, 7, 7, 3, 1, 1, 1, BF16, dict(SPLIT_K=4), "split-K over 72 maps"),
    (1, 136, 16, 5, 4, 3, 1, 1, 1, F16, dict(BN=128), "136 channels: two 64-wide boxes a tile (the LBO)"),
    (2, 16, 24, 9, 8, (3, 5), (1, 2), (1, 2), 1, BF16, dict(BN=64, STAGES=3), "3x5 mask, stride (1, 2)"),
]


@pytest.mark.parametrize("case", DX, ids=[c[-1] for c in DX])
def test_dx_on_awkward_shapes(case):
    B, C, M, H, W, K, stride, padding, dilation, dtype, tun, _ = case
    x, w, dy = _inputs(B, C, M, H, W, K, dtype, stride, padding, dilation)
    ref = torch.nn.grad.conv2d_input(x.shape, w.double(), dy.double(), stride=stride, padding=padding,
                                     dilation=dilation)
    dx = _poisoned(ref.shape, dtype)
    out = hopper.conv2d_hopper_dx(dy, w, dx, stride=stride, padding=padding, dilation=dilation, input_size=(H, W),
                                  **tun)
    assert out is dx
    _check(dx, ref, M * w.shape[2] * w.shape[3], dtype, "dx")


# (B, C, M, H, W, K, stride, padding, dilation, dtype, tunables, what)
DW = [
    (1, 16, 24, 6, 7, 3, 1, 1, 1, F16, {}, "3x3: one consumer warpgroup"),
    (2, 72, 72, 9, 10, 3, 2, 1, 1, BF16, {}, "stride 2, 72 maps: two consumers, 72 channels: two tiles"),
    (2, 3, 16, 10, 9, 7, 2, 3, 1, F16, {}, "RGB stem: x padded to 8 channels, dw's 3 stored one by one"),
    (1, 136, 16, 5, 6, 1, 1, 0, 1, F16, dict(BN=128, SPLIT_K=2), "1x1, 136 channels: two boxes a tile, split"),
    (2, 16, 8, 9, 9, 3, 1, 2, 2, BF16, dict(SPLIT_K=5), "dilation 2, five splits"),
    (1, 8, 16, 7, 9, (3, 5), (2, 1), (1, 2), 1, F16, dict(BW=4, BH=4, BI=4), "3x5 mask, a box of 4x4x4"),
]


@pytest.mark.parametrize("case", DW, ids=[c[-1] for c in DW])
def test_dw_on_awkward_shapes(case):
    B, C, M, H, W, K, stride, padding, dilation, dtype, tun, _ = case
    x, w, dy = _inputs(B, C, M, H, W, K, dtype, stride, padding, dilation)
    ref = torch.nn.grad.conv2d_weight(x.double(), w.shape, dy.double(), stride=stride, padding=padding,
                                      dilation=dilation)
    dw = _poisoned(ref.shape, dtype)
    out = hopper.conv2d_hopper_dw(x, dy, dw, stride=stride, padding=padding, dilation=dilation,
                                  kernel_size=tuple(w.shape[2:]), **tun)
    assert out is dw
    _check(dw, ref, dy.shape[0] * dy.shape[2] * dy.shape[3], dtype, "dw")


def test_split_k_gives_the_same_bits_on_every_run():
    """The splits are added in order by a second pass (no atomics): two runs, the same bits."""
    x, w, dy = _inputs(1, 72, 16, 7, 7, 3, BF16, padding=1)
    a = hopper.conv2d_hopper(x, w, padding=1, SPLIT_K=4)
    b = hopper.conv2d_hopper(x, w, padding=1, SPLIT_K=4)
    assert torch.equal(a.view(torch.int16), b.view(torch.int16))
    da = hopper.conv2d_hopper_dw(x, dy, padding=1, kernel_size=3, SPLIT_K=6)
    db = hopper.conv2d_hopper_dw(x, dy, padding=1, kernel_size=3, SPLIT_K=6)
    assert torch.equal(da.view(torch.int16), db.view(torch.int16))


# ---- the launchers' choices -------------------------------------------------------------------------

def test_the_config_splits_k_only_where_tiles_leave_sms_idle():
    small = Workload("r7_b1", B=1, C=512, M=512, H=7, W=7, K=3, padding=1)
    big = Workload("r56", B=32, C=64, M=64, H=56, W=56, K=3, padding=1)
    assert hopper.hopper_config(small, sms=132)["SPLIT_K"] > 1
    assert hopper.hopper_config(big, sms=132)["SPLIT_K"] == 1
    assert hopper.hopper_dw_config(big, sms=132)["SPLIT_K"] > 1         # dW: 9 tiles, 100,352 pixels


def test_a_1x1_layer_is_a_gemm_over_pixels_in_128_row_tiles():
    wl = Workload("r1x1", B=32, C=256, M=64, H=56, W=56, K=1)
    cfg = hopper.hopper_config(wl, sms=132)
    assert (cfg["BW"], cfg["BH"], cfg["BI"]) == (128, 1, 1)


def test_a_strided_box_stays_inside_the_copy_engines_256():
    wl = Workload("s4", B=8, C=64, M=64, H=224, W=224, K=3, stride=4, padding=1)
    cfg = hopper.hopper_config(wl, sms=132)
    assert cfg["BW"] * 4 <= 256 and cfg["BH"] * 4 <= 256
    with pytest.raises(ValueError, match="at most 256"):
        x, w, _ = _inputs(1, 8, 8, 40, 40, 3, F16)
        hopper.conv2d_hopper(x, w, stride=4, BW=128, BH=1, BI=1)


@pytest.mark.parametrize("shape,op,words", [
    (Workload("g", B=1, C=16, M=16, H=8, W=8, K=3, groups=2), "forward", "groups 2"),
    (Workload("c12", B=1, C=12, M=16, H=8, W=8, K=3), "dx", "multiples of 8"),
    (Workload("m4", B=1, C=16, M=4, H=8, W=8, K=3), "dw", "M=4"),
    (Workload("s9", B=1, C=16, M=16, H=40, W=40, K=3, stride=9), "forward", "at most 8"),
])
def test_refuses_says_why(shape, op, words):
    assert words in hopper.refuses(shape, op)


def test_other_dtypes_are_refused_with_what_to_pass():
    x, w, _ = _inputs(1, 8, 8, 5, 5, 3, F16)
    with pytest.raises(TypeError, match="float16 or bfloat16"):
        hopper.conv2d_hopper(x.float(), w.float())
    with pytest.raises(TypeError, match="all of one dtype"):
        hopper.conv2d_hopper(x, w.to(BF16))


@pytest.mark.gpu_only
def test_one_launch_from_channels_last_and_two_with_a_split():
    from convlab.measuring.bench import count_launches

    x, w, _ = _inputs(2, 64, 64, 14, 14, 3, BF16)
    hopper.conv2d_hopper(x, w, padding=1, SPLIT_K=1)
    hopper.conv2d_hopper(x, w, padding=1, SPLIT_K=2)
    assert count_launches(lambda: hopper.conv2d_hopper(x, w, padding=1, SPLIT_K=1)) == 1
    assert count_launches(lambda: hopper.conv2d_hopper(x, w, padding=1, SPLIT_K=2)) == 2


def test_the_impl_records_name_their_ops():
    ops = {i.key: (i.op, i.dtypes) for i in hopper.IMPLEMENTATIONS}
    assert ops == {"hopper": ("conv2d_fp16", ("fp16",)), "hopper_bf16": ("conv2d_fp16", ("bf16",)),
                   "hopper_dx": ("conv2d_dx_fp16", ("fp16",)), "hopper_dx_bf16": ("conv2d_dx_fp16", ("bf16",)),
                   "hopper_dw": ("conv2d_dw_fp16", ("fp16",)), "hopper_dw_bf16": ("conv2d_dw_fp16", ("bf16",))}
    assert all(i.layouts == ("channels_last",) and i.out_layout == "channels_last" for i in hopper.IMPLEMENTATIONS)
    assert [i.key for i in hopper.IMPLEMENTATIONS if i.bias] == ["hopper", "hopper_bf16"], "the forward's epilogue"
    wl = Workload("stem", B=32, C=3, M=64, H=224, W=224, K=7, stride=2, padding=3)
    assert hopper.HOPPER.takes(wl) and hopper.HOPPER_DW.takes(wl) and not hopper.HOPPER_DX.takes(wl)
    assert math.isfinite(hopper.hopper_dx_config(Workload("r", B=2, C=64, M=64, H=9, W=9, K=3, stride=2))["BN"])


def test_the_measuring_harness_runs_the_forward_record():
    """measure.run (chapter 9's every-kernel tables, benchmarks/general_layers.py --all) checks the
    fp16 record like any other kernel on a layer's small twin."""
    from convlab.measuring import workloads
    from convlab.programs import measure

    df = measure.run([hopper.HOPPER], [workloads.get("resnet_stem_7x7_s2"), workloads.get("deeplab_d2_28")],
                     dtype="fp16", layout="channels_last", torch_baseline=False)
    assert list(df["key"]) == ["hopper", "hopper"]
