"""The dispatcher for any layer (convlab.ops.dispatch): its rule names real kernels, agrees with
the fastest kernel measured on every shape the chapters' committed results hold, and the kernel
it picks on random layers (groups, dilation, non-square masks, per-axis stride and padding, plain
ones too) matches the fp64 reference in float32 and float16."""
from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import convlab as cl
from convlab.measuring import workloads
from convlab.measuring.workloads import Workload
from convlab.ops import depthwise, dispatch, dropin, fp16, igemm, wgmma


@pytest.mark.parametrize("direction", list(dispatch.TABLES))
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_every_rule_names_a_registered_kernel_and_the_last_takes_any_layer(dtype, direction):
    # the 16-bit table is bf16's too: a row of it may name a kernel whose record takes bf16
    readers = [d for d, table in dispatch.TABLE_OF.items() if table == dtype]
    keys = {i.key for d in readers for i in dispatch.implementations(d, direction)}
    for rule in dispatch.TABLES[direction][dtype]:
        assert rule.kernel in keys, (f"{dtype} {direction} rule {rule.condition!r} names {rule.kernel!r}, not a "
                                     "registered candidate of that pass and dtype")
        assert dispatch.by_key(rule.kernel).name in dispatch.dispatch_rule(dtype, direction)
    last = dispatch.TABLES[direction][dtype][-1]
    kernel = dispatch.by_key(last.kernel)
    for wl in [*workloads.WORKLOADS_2D, *workloads.LAYERS]:
        assert last.holds(wl) and kernel.takes(wl), f"the last {dtype} {direction} rule must take {wl}"


def test_the_rules_reasons_hold_claims_and_their_data_files_the_numbers():
    """The reasons are printed on chapter 9a's page: a measured figure typed into one would drift
    from the data it came from, so a reason names the data file and keeps no ratio or decimal; every
    results file it names is committed."""
    root = Path(__file__).resolve().parent.parent
    rows = [r for table in (*dispatch.TABLES.values(), dispatch.PRECISION_RULES) for rules in table.values()
            for r in rules]
    for r in rows:
        assert not re.search(r"\d\.\d|\b\d+(\.\d+)?x\b", r.why), (r.kernel, r.why)
        for name in re.findall(r"(?:benchmarks|book)/[\w/.-]+\.(?:csv|py)", r.why):
            assert (root / name).is_file(), (r.kernel, name)


@pytest.mark.parametrize("precision", list(dispatch.PRECISION_RULES))
def test_a_precisions_rows_name_its_kernels_and_fall_through_to_fp32s(precision):
    """A float32 forward in TF32 or 3xTF32 reads PRECISION_RULES' rows (kernels whose record computes
    in that precision) first, then the fp32 table; the fp32 table alone never runs them."""
    keys = {i.key for i in dispatch.implementations("fp32", "forward", precision)}
    rows = dispatch.PRECISION_RULES[precision]
    assert tuple(r.kernel for r in rows) == dispatch.TENSOR_CORE_FP32[precision]
    for r in rows:
        assert r.kernel in keys and dispatch.by_key(r.kernel).precision == precision
        assert dispatch.by_key(r.kernel).name in dispatch.dispatch_rule("fp32")
    assert not any(i.precision for i in dispatch.implementations("fp32"))
    for wl in [*workloads.WORKLOADS_2D, *workloads.LAYERS]:
        for layout in dispatch.LAYOUTS:
            impl = dispatch.pick(wl, "fp32", layout, precision=precision)
            tc = [dispatch.by_key(r.kernel) for r in rows if dispatch.by_key(r.kernel).takes(wl)]
            assert impl is (tc[0] if tc else dispatch.pick(wl, "fp32", layout)), (wl, layout)
            assert dispatch.pick(wl, "fp16", layout, precision=precision) is dispatch.pick(wl, "fp16", layout)


def test_bf16_reads_the_16_bit_tables_among_the_kernels_whose_record_takes_bf16():
    """bf16 has no table of its own: the first fp16 row whose kernel's record lists bf16 and takes
    the layer. A layer no such kernel takes has none: the drop-in hands it to torch, saying why."""
    for wl in [*workloads.WORKLOADS_2D, *workloads.LAYERS]:
        for layout in dispatch.LAYOUTS:
            rows = [r for r in dispatch.RULES["fp16"] if layout in r.layouts and r.holds(wl)
                    and "bf16" in dispatch.by_key(r.kernel).dtypes and dispatch.by_key(r.kernel).takes(wl)]
            if rows:
                assert dispatch.pick(wl, "bf16", layout).key == rows[0].kernel
            else:
                with pytest.raises(dispatch.NoKernel):
                    dispatch.pick(wl, "bf16", layout)
    # an RGB stem: no 16-bit tensor-core kernel reads 3 channels in bf16
    x = torch.zeros(1, 3, 5, 5, dtype=torch.bfloat16, device=cl.device().torch_device)
    w = torch.zeros(4, 3, 3, 3, dtype=torch.bfloat16, device=x.device)
    assert "no bf16 forward kernel" in dropin.kernel_fallback_reason(x, w)
    cl.check(dropin.conv2d(x, w), F.conv2d(x, w))


def test_pick_agrees_with_the_fastest_measured_kernel():
    """On each shape the committed results measured (book/data/05_fused, 06_fp16, 09_general), the
    picked kernel is the fastest measured one, within the measurement's spread (its median at most
    the fastest's 75th percentile)."""
    ev = dispatch.evidence()
    if ev is None:
        pytest.skip("no committed results of the current harness")
    bad = ev[~ev["agrees"]]
    assert not len(bad), ("pick() is slower than another measured kernel: change dispatch.RULES (or re-measure):\n"
                          + bad[["chapter", "workload", "dtype", "pick()", "pick() ms", "fastest", "fastest ms"]]
                          .to_string(index=False))


def test_pick_never_takes_a_kernel_that_cannot_run_the_layer():
    for wl in [*workloads.WORKLOADS_2D, *workloads.LAYERS]:
        for dtype in dispatch.RULES:
            for direction, ops in dispatch.DIRECTIONS.items():
                impl = dispatch.pick(wl, dtype, direction=direction)
                assert impl.takes(wl) and impl in dispatch.candidates(wl, dtype, direction)
                assert impl.op in ops and dtype in impl.dtypes


def _random_layer(rng: random.Random) -> Workload:
    """A small layer: plain (the chapters' kernels) half the time, else any mix of groups (depthwise
    with a channel multiplier too), dilation, a non-square mask, per-axis stride and padding."""
    B = rng.choice([1, 2])
    if rng.random() < 0.5:
        C, M, K, s, p = rng.choice([1, 2, 3, 5]), rng.choice([1, 3, 4, 8, 12]), rng.choice([1, 2, 3, 5]), \
            rng.choice([1, 1, 2]), rng.choice([0, 1, 2])
        H, W = rng.randint(K + 1, 13), rng.randint(K + 1, 13)
        return Workload("plain", B=B, C=C, M=M, H=H, W=W, K=K, stride=s, padding=p)
    groups = rng.choice([1, 2, 3])
    C = groups * rng.choice([1, 2])
    M = groups * rng.choice([1, 2, 3])
    if rng.random() < 0.3:
        C = groups = rng.choice([2, 4, 5])
        M = C * rng.choice([1, 2])
    K = (rng.choice([1, 2, 3, 5]), rng.choice([1, 2, 3, 4]))
    d = (rng.choice([1, 2]), rng.choice([1, 2, 3]))
    s = (rng.choice([1, 2]), rng.choice([1, 3]))
    p = (rng.choice([0, 1, 2]), rng.choice([0, 1]))
    span = [di * (k - 1) + 1 for di, k in zip(d, K)]
    H, W = (rng.randint(max(1, sp - 2 * pi), sp + 8) for sp, pi in zip(span, p))
    return Workload("general", B=B, C=C, M=M, H=H, W=W, K=K, stride=s, padding=p, dilation=d, groups=groups)


@pytest.mark.parametrize("seed", range(4))
def test_picked_kernels_on_random_layers_match_the_reference(seed):
    rng = random.Random(seed)
    for _ in range(6):
        wl = _random_layer(rng)
        kw = wl.conv_kwargs()
        x32, w32, b32 = cl.randn(*wl.x_shape), cl.randn(*wl.w_shape), cl.randn(wl.M)
        for dtype, tdtype in (("fp32", torch.float32), ("fp16", torch.float16)):
            impl = dispatch.pick(wl, dtype)
            x, w, b = x32.to(tdtype), w32.to(tdtype), b32.to(tdtype)
            ref = F.conv2d(x.double().cpu(), w.double().cpu(), b.double().cpu(), **kw)
            name = f"{impl.name} on {wl}"
            ref0 = F.conv2d(x.double().cpu(), w.double().cpu(), **kw)
            with cl.debug():            # outputs poisoned with NaN: one never written cannot pass
                y = impl(x, w, **kw, **impl.config(wl))                        # the kernel pick() names
                y_dropin = dispatch.forward(x, w, bias=b, **kw)                  # the drop-in's route to it
            if dtype == "fp32":
                cl.check(y, ref0, name=name)
                cl.check(y_dropin, ref, name="dispatch.forward: " + name)
            else:
                acc = impl.accumulation_on()
                assert dispatch.forward_accumulation(wl.x_shape, wl.w_shape, **kw) == acc
                fp16.check_fp16(y, ref0, C=wl.reduction, K=1, accumulate=acc, rounded_inputs=True, name=name)
                dispatch.check_fp16_forward(y_dropin, ref, wl.x_shape, wl.w_shape, b, **kw,
                                            name="dispatch.forward: " + name)


def test_the_drop_in_routes_through_pick():
    """dispatch.forward (the drop-in's forward) runs the kernel pick() names, and gives its result."""
    wl = Workload("t", B=2, C=4, M=4, H=9, W=8, K=3, padding=1, groups=4)
    x, w = cl.randn(*wl.x_shape), cl.randn(*wl.w_shape)
    assert dispatch.forward_impl(x, w, padding=1, groups=4) is dispatch.pick(wl, "fp32") is depthwise.DEPTHWISE
    cl.check(dispatch.forward(x, w, padding=1, groups=4), F.conv2d(x, w, padding=1, groups=4))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_a_channels_last_depthwise_layer_runs_the_nhwc_kernel_and_keeps_its_layout(dtype):
    x = cl.randn(2, 8, 9, 7, dtype=dtype).to(memory_format=torch.channels_last)
    w, b = cl.randn(8, 1, 3, 3, dtype=dtype), cl.randn(8, dtype=dtype)
    kw = dict(stride=(2, 1), padding=1, groups=8)
    assert dispatch.forward_impl(x, w, b, **kw).launcher is depthwise.conv2d_depthwise_nhwc, \
        "a channels_last depthwise input must run depthwise.conv2d_depthwise_nhwc"
    with cl.debug():
        y = dispatch.forward(x, w, bias=b, **kw)
    assert y.is_contiguous(memory_format=torch.channels_last), "the result keeps x's layout, as torch's"
    ref = F.conv2d(x.double().cpu(), w.double().cpu(), b.double().cpu(), **kw)
    if dtype == torch.float32:
        cl.check(y, ref)
    else:
        dispatch.check_fp16_forward(y, ref, x.shape, w.shape, b, **kw, layout="channels_last")


@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last])
def test_the_tensor_core_routes_take_either_layout_and_return_torchs(layout):
    plain = Workload("t", B=2, C=16, M=24, H=7, W=9, K=3, padding=1)
    # a plain layer: from channels_last, wgmma on an H100/H200 (the emulator is one), else mma.sync;
    # from NCHW, WMMA (the conversion costs more)
    hopper = "wgmma" if wgmma.runs_here() else "mma"
    assert dispatch.pick(plain, "fp16", "channels_last").key == hopper
    assert dispatch.pick(plain, "fp16").key == "wmma"
    # one 64-channel step of reduction (a 1x1 layer from 64 channels): mma.sync
    short = Workload("s", B=2, C=64, M=32, H=7, W=9, K=1)
    assert dispatch.pick(short, "fp16", "channels_last").key == "mma"
    # a dilated one, which WMMA and chapter 11's wgmma do not take: mma.sync from NCHW; from
    # channels_last, the Hopper layers' kernel on an H100/H200, else mma.sync
    wl = Workload("d", B=2, C=16, M=24, H=9, W=11, K=3, padding=2, dilation=2)
    assert dispatch.pick(wl, "fp16").key == "mma"
    assert dispatch.pick(wl, "fp16", "channels_last").key == ("hopper" if wgmma.runs_here() else "mma")
    for shape in (wl, plain):
        x = cl.randn(*shape.x_shape, dtype=torch.float16).contiguous(memory_format=layout)
        w, b = cl.randn(*shape.w_shape, dtype=torch.float16), cl.randn(shape.M, dtype=torch.float16)
        kw = shape.conv_kwargs()
        with cl.debug():
            y = dispatch.forward(x, w, bias=b, **kw)
        assert y.is_contiguous(memory_format=layout)
        ref = F.conv2d(x.double().cpu(), w.double().cpu(), b.double().cpu(), **kw)
        dispatch.check_fp16_forward(y, ref, x.shape, w.shape, b, **kw, layout=dispatch.layout_of(x))


def _check_dropin_dx(x, w, y, dy):
    """The drop-in's dx for y = dropin.conv2d(x, w, padding=1) against fp64."""
    (dx,) = torch.autograd.grad(y, x, dy)
    xd = x.detach().double().cpu().requires_grad_()
    (ref,) = torch.autograd.grad(F.conv2d(xd, w.double().cpu(), padding=1), xd, dy.double().cpu())
    cl.check(dx, ref, name="dx")


def test_the_drop_ins_dx_runs_the_fp32_implicit_gemm_where_pick_gives_it_the_dx_convolution():
    x = cl.randn(2, 32, 6, 5).requires_grad_()
    w = cl.randn(16, 32, 3, 3)
    y = dropin.conv2d(x, w, padding=1)
    dy = cl.randn(*y.shape)
    assert dispatch.dx_impl(dy, w, padding=1, input_size=(6, 5)) is igemm.IGEMM_F32_DX, \
        "a stride-1 fp32 layer of 32 channels: dX by igemm.conv2d_igemm_f32_dx"
    _check_dropin_dx(x, w, y, dy)
    # one channel: dX's one map is chapter 8's gather
    assert dispatch.dx_impl(cl.randn(2, 4, 6, 5), cl.randn(4, 1, 3, 3), padding=1, input_size=(6, 5)).key == "dx_gather"


def test_a_small_layers_dx_is_chapter_8s_gather_in_one_launch_and_a_large_ones_the_implicit_gemm():
    """Under GATHER_DX_MACS multiply-adds, with fewer than 32 channels, the gather's one launch (the
    implicit GEMM's dX takes three); above it, the GEMM. Only shapes matter: meta tensors."""
    def dx_key(B, C, M, side):
        dy, w = torch.empty(B, M, side, side, device="meta"), torch.empty(M, C, 3, 3, device="meta")
        return dispatch.dx_impl(dy, w, padding=1, input_size=(side, side)).key

    assert dx_key(2, 12, 16, 6) == "dx_gather"
    assert dx_key(256, 16, 32, 20) == "dx_gather"              # GATHER_DX_MACS: the largest layer measured
    assert dx_key(512, 16, 32, 20) == "igemm_f32_dx"           # twice that
    assert dx_key(2, 32, 16, 6) == "igemm_f32_dx"              # 32 channels: not chapter 8's gather
    x, w = cl.randn(2, 12, 6, 5).requires_grad_(), cl.randn(16, 12, 3, 3)
    y = dropin.conv2d(x, w, padding=1)
    _check_dropin_dx(x, w, y, cl.randn(*y.shape))


def test_the_drop_in_keeps_its_gradient_routes_with_its_forward_route():
    """A repeated backward runs the kept pair (dispatch.grad_routes), worked out on the first one;
    a forward alone works out none."""
    x, w = cl.randn(2, 3, 7, 6).requires_grad_(), cl.randn(5, 3, 3, 3).requires_grad_()
    dropin._routes.clear()
    dropin.conv2d(x.detach(), w.detach(), None, 1, 1)
    dropin.conv2d(x, w, None, 1, 1)
    assert [k[-2] for k in dropin._routes] == [False, True], "the call signature says whether a gradient is wanted"
    (_, _, none), (_, _, grads) = dropin._routes.values()
    assert none == grads == [None], "a forward plans no gradient routes"
    dy = cl.randn(2, 5, 7, 6)
    xd, wd = x.detach().double().cpu().requires_grad_(), w.detach().double().cpu().requires_grad_()
    F.conv2d(xd, wd, padding=1).backward(dy.double().cpu())
    for _ in range(2):
        gx, gw = torch.autograd.grad(dropin.conv2d(x, w, None, 1, 1), (x, w), dy)
        cl.check(gx, xd.grad, name="dx")
        cl.check(gw, wd.grad, name="dw")
    kept = grads[0]
    routes = dispatch.grad_routes(x.shape, w.shape, dy.shape, "fp32", stride=1, padding=1)
    assert tuple(k.route for k in kept) == routes
    assert kept[0].impl is dispatch.dx_impl(dy, w, padding=1, input_size=(7, 6))


def test_every_registered_kernel_has_a_unique_key_and_the_api_documents_table_is_its_records():
    """A new kernel is its .cu, its Impl record and its test: the dispatcher finds the record, and
    the document's table of registered kernels is generated from the records (kernel_table)."""
    from pathlib import Path

    records = dispatch.registered()
    keys = [i.key for i in records]
    assert all(keys) and len(set(keys)) == len(keys), f"keys must be unique and non-empty: {keys}"
    doc = (Path(__file__).resolve().parent.parent / "docs" / "convlab-api.md").read_text()
    table = doc[doc.index(dispatch.KERNEL_TABLE_BEGIN) + len(dispatch.KERNEL_TABLE_BEGIN):
                doc.index(dispatch.KERNEL_TABLE_END)].strip()
    assert table == dispatch.kernel_table(), ("docs/convlab-api.md's kernel table differs from the records: run "
                                             "python scripts/kernel_table.py")
