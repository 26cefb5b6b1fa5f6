"""Chapter 10: the network's kernels against fp64 references, and whole networks against torch at
the same weights, layer by layer and gradient by gradient, on the active backend.

Inputs are fresh random numbers, outputs start poisoned with NaN (the emulator; cl.debug on a GPU),
and the shapes are awkward: odd conv outputs whose last row and column no pooling window takes,
padding, sizes no multiple of a GEMM tile, one image. The last tests replay the launchers at the
class project's full size (batch 10,000) on meta tensors and check every grid against the limits.
"""
import pytest
import torch
import torch.nn.functional as F

import convlab as cl
from convlab.gpu._args import check_launch
from convlab.measuring.workloads import Workload
from convlab.ops import layers as ops
from convlab.programs import network as net

ACT = {"none": lambda t: t, "relu": torch.relu, "tanh": torch.tanh}
POOL = {"none": lambda t: t, "max": lambda t: F.max_pool2d(t, 2), "avg": lambda t: F.avg_pool2d(t, 2)}

# (B, C, M, H, W, K, padding)
STAGES = [
    dict(B=1, C=1, M=4, H=20, W=20, K=7, padding=0),      # conv out 14x14, the project's first layer's shape
    dict(B=2, C=3, M=5, H=17, W=22, K=5, padding=2),      # odd 17 rows: the last conv row is in no window
    dict(B=2, C=4, M=16, H=15, W=13, K=7, padding=0),     # 9x7 out: odd both ways
    dict(B=3, C=2, M=6, H=9, W=10, K=3, padding=1),
]


def _id(d):
    return " ".join(f"{k}={v}" for k, v in d.items())


def _stage_case(s):
    x = cl.randn(s["B"], s["C"], s["H"], s["W"])
    w = cl.randn(s["M"], s["C"], s["K"], s["K"])
    b = cl.randn(s["M"])
    z = F.conv2d(x.double(), w.double(), b.double(), padding=s["padding"])
    return x, w, b, z


@pytest.mark.parametrize("shape", STAGES, ids=_id)
@pytest.mark.parametrize("act, pool", [("relu", "max"), ("tanh", "avg"), ("none", "max"), ("relu", "none")])
@pytest.mark.parametrize("launcher", [ops.conv2d_bias_act_pool, ops.conv2d_separate_epilogue])
def test_conv_stage(shape, act, pool, launcher):
    x, w, b, z = _stage_case(shape)
    a_ref = ACT[act](z)
    y_ref = POOL[pool](a_ref)
    a = cl.empty(*a_ref.shape)
    y = launcher(x, w, padding=shape["padding"], bias=b, act=act, pool=pool, act_out=a)
    cl.check(y, y_ref, name=f"{launcher.__name__} {act} {pool}")
    cl.check(a, a_ref, name=f"{launcher.__name__} activations")


@pytest.mark.parametrize("tunables", [{"UNROLL": 1}, {"UNROLL": 3}, {"BLOCK": 32}, {"BLOCK": 256, "UNROLL": 8},
                                      {"MG": 8}, {"MG": 4, "UNROLL": 2}])
def test_fused_tunables(tunables):
    shape = STAGES[2]
    x, w, b, z = _stage_case(shape)
    y = ops.conv2d_bias_act_pool(x, w, bias=b, act="relu", pool="max", **tunables)
    cl.check(y, F.max_pool2d(torch.relu(z), 2), name=f"fused {tunables}")


def test_fused_refuses_what_it_cannot_take():
    x, w, b = cl.randn(1, 2, 12, 12), cl.randn(3, 2, 3, 3), cl.randn(3)
    with pytest.raises(ValueError, match="stride 1"):
        ops.conv2d_bias_act_pool(x, w, stride=2, bias=b)
    with pytest.raises(ValueError, match=r"expected \(3,\)"):
        ops.conv2d_bias_act_pool(x, w, bias=cl.randn(4))
    with pytest.raises(ValueError, match="UNROLL"):
        ops.conv2d_bias_act_pool(x, w, bias=b, UNROLL=5)
    with pytest.raises(ValueError, match="must divide M=3"):
        ops.conv2d_bias_act_pool(x, w, bias=b, MG=2)
    with pytest.raises(ValueError, match="act="):
        ops.conv2d_bias_act_pool(x, w, bias=b, act="sigmoid")
    with pytest.raises(ValueError, match="conv2d_separate_epilogue"):
        ops.conv2d_bias_act_pool(cl.randn(1, 2, 12, 12), cl.randn(40, 2, 3, 3), bias=cl.randn(40))


def test_epilogue_kernels_one_by_one():
    x, bias = cl.randn(2, 3, 9, 11), cl.randn(3)
    for act in ("none", "relu", "tanh"):
        cl.check(ops.bias_act(x, bias, act=act), ACT[act](x.double() + bias.double().view(1, 3, 1, 1)), name=act)
    for pool in ("max", "avg"):
        cl.check(ops.pool2x2(x, pool=pool), POOL[pool](x.double()), name=pool)
    fc = cl.randn(7, 5)
    fb = cl.randn(5)
    cl.check(ops.bias_act(fc, fb, act="relu"), torch.relu(fc.double() + fb.double()), name="(N, M)")


@pytest.mark.parametrize("act, pool", [("relu", "max"), ("tanh", "avg"), ("tanh", "none")])
def test_pool_act_backward_is_autograds(act, pool):
    z = cl.randn(2, 3, 9, 10).double().requires_grad_()
    a = ACT[act](z)
    p = POOL[pool](a)
    dp = cl.randn(*p.shape)
    p.backward(dp.double())
    dz = ops.pool_act_backward(a.detach().float(), dp, act=act, pool=pool)
    cl.check(dz, z.grad, name=f"pool_act_backward {act} {pool}")


def test_channel_sum():
    dz = cl.randn(3, 5, 7, 6)
    cl.check(ops.channel_sum(dz), dz.double().sum((0, 2, 3)), name="channel_sum")
    fc = cl.randn(37, 19)
    cl.check(ops.channel_sum(fc), fc.double().sum(0), name="channel_sum (N, M)")


@pytest.mark.parametrize("N, fin, fout", [(37, 45, 19), (1, 16, 16), (64, 400, 120), (5, 3, 130)])
def test_linear_forward_and_gradients(N, fin, fout):
    x, w, b, dy = cl.randn(N, fin), cl.randn(fout, fin), cl.randn(fout), cl.randn(N, fout)
    xd, wd = x.double(), w.double()
    for act in ("none", "relu", "tanh"):
        cl.check(ops.linear(x, w, bias=b, act=act), ACT[act](xd @ wd.T + b.double()), name=f"linear {act}")
    cl.check(ops.linear(x, w), xd @ wd.T, name="linear, no bias")
    cl.check(ops.linear_dx(dy, w), dy.double() @ wd, name="linear_dx")
    cl.check(ops.linear_dw(dy, x), dy.double().T @ xd, name="linear_dw")


# (N, in, out, SPLIT): one image through a layer wider than a tile; in not a multiple of the tile
# and slices that do not divide K's steps (300: 19 steps in 4 slices of 5, 5, 5, 4); three images.
SPLITS = [(1, 300, 40, None), (3, 45, 19, 2), (1, 16, 16, None), (2, 100, 130, 7), (5, 3, 130, 1)]


@pytest.mark.parametrize("N, fin, fout, split", SPLITS, ids=lambda v: str(v))
def test_linear_split_k(N, fin, fout, split):
    x, w, b, dy = cl.randn(N, fin), cl.randn(fout, fin), cl.randn(fout), cl.randn(N, fout)
    xd, wd = x.double(), w.double()
    for act in ("none", "relu", "tanh"):
        cl.check(ops.linear(x, w, bias=b, act=act, SPLIT=split), ACT[act](xd @ wd.T + b.double()),
                 name=f"linear {act}, SPLIT={split}")
    cl.check(ops.linear(x, w, SPLIT=split), xd @ wd.T, name=f"linear, no bias, SPLIT={split}")
    cl.check(ops.linear_dx(dy, w), dy.double() @ wd, name="linear_dx")
    cl.check(ops.linear_dw(dy, x), dy.double().T @ xd, name="linear_dw")


def test_split_k_is_deterministic_and_the_rule_splits_small_products():
    x, w, b = cl.randn(1, 300), cl.randn(40, 300), cl.randn(40)
    assert ops.gemm_split(1, 40, 300) > 1            # 3 tiles of output on 132 SMs (the emulator's count)
    first = ops.linear(x, w, bias=b, act="tanh")
    assert torch.equal(first, ops.linear(x, w, bias=b, act="tanh"))   # slices added in one order: no atomics
    # the long reduction of dW at a large batch splits, at batch 64 it does not
    dy, h = cl.randn(1000, 10), cl.randn(1000, 20)
    assert ops.gemm_split(10, 20, 1000) > 1
    cl.check(ops.linear_dw(dy, h), dy.double().T @ h.double(), name="linear_dw, batch 1000, split")


@pytest.mark.parametrize("M, N, K", [(1, 128, 4624), (1, 10, 128), (10, 84, 10_000), (84, 120, 64),
                                     (10_000, 128, 4624), (64, 4624, 128), (128, 4624, 64), (1, 1, 1)])
@pytest.mark.parametrize("sms", [132, 16])
def test_gemm_split_rule(M, N, K, sms):
    split = ops.gemm_split(M, N, K, 16, sms)
    blocks, steps = -(-M // 16) * -(-N // 16), -(-K // 16)
    assert 1 <= split <= ops.MAX_SPLIT
    if blocks >= ops.SPLIT_BELOW * sms:
        assert split == 1                      # a large batch: the tiles fill the GPU already
    elif split > 1:
        assert steps // split >= ops.MIN_SPLIT_STEPS
        assert blocks * (split - 1) < sms      # no more slices than it takes to cover the SMs
    else:
        assert steps < 2 * ops.MIN_SPLIT_STEPS or blocks >= sms
    if (M, N, K) == (1, 128, 4624):             # one image through the project's first FC layer
        assert blocks * split >= sms


FUSED_LAYERS = [wl for arch in (net.CLASS_PROJECT, net.LENET5) for B in (1, 3, 10, 100, 1000, 10_000)
                for wl in arch.conv_workloads(B)] + [Workload("awkward", 2, 4, 6, 15, 13, 7), Workload("c1", 1, 1, 5, 9, 9, 3)]


@pytest.mark.parametrize("sms", [132, 8])
def test_fused_config_fills_the_sms(sms):
    for wl in FUSED_LAYERS:
        cfg = ops.fused_config(wl, sms)
        assert wl.M % cfg["MG"] == 0 and cfg["BLOCK"] % 32 == 0 and 32 <= cfg["BLOCK"] <= 128, (wl.name, cfg)
        assert 1 <= cfg["UNROLL"] <= wl.K + 1
        blocks = -(-wl.B * -(-wl.Ho // 2) * -(-wl.Wo // 2) // cfg["BLOCK"]) * (wl.M // cfg["MG"])
        # enough blocks for every SM, or nothing left to split: one map per thread in one-warp blocks
        assert blocks >= sms or (cfg["MG"] == 1 and cfg["BLOCK"] == 32), (wl.name, wl.B, cfg, blocks)
        if wl.B == 10_000:
            assert cfg == {"UNROLL": 4, "MG": wl.M, "BLOCK": 128}     # a full GPU: the sweep's fastest
    assert ops.FUSED.config(net.CLASS_PROJECT.conv_workloads(1)[1]) == ops.fused_config(
        net.CLASS_PROJECT.conv_workloads(1)[1])


@pytest.mark.parametrize("shape", STAGES, ids=_id)
def test_fused_small_batch_configs(shape):
    """The configs fused_config gives one image on a big GPU (few maps per thread, one-warp blocks)
    and on a small one, each against fp64."""
    x, w, b, z = _stage_case(shape)
    wl = Workload.of(x, w, padding=shape["padding"])
    ref = F.max_pool2d(torch.relu(z), 2)
    seen = set()
    for sms in (132, 4, 1):
        cfg = ops.fused_config(wl, sms)
        seen.add(tuple(cfg.values()))
        cl.check(ops.conv2d_bias_act_pool(x, w, padding=shape["padding"], bias=b, **cfg), ref, name=f"fused {cfg}")
    assert len(seen) > 1            # the SM count changed the config


def test_kept_plans_take_new_shapes_and_tensors():
    """A launcher's kept plan is per shape: a second shape gets its own, and going back to the first
    with new tensors (new weights in the fused kernel's constant memory too) is still right."""
    for s in (STAGES[2], STAGES[1], STAGES[2]):
        x, w, b, z = _stage_case(s)
        cl.check(ops.conv2d_bias_act_pool(x, w, padding=s["padding"], bias=b, act="tanh", pool="avg"),
                 F.avg_pool2d(torch.tanh(z), 2), name=f"fused stage {_id(s)}")
    for N, fin, fout in ((1, 300, 40), (7, 33, 12), (1, 300, 40)):
        x, w, b = cl.randn(N, fin), cl.randn(fout, fin), cl.randn(fout)
        cl.check(ops.linear(x, w, bias=b, act="relu"), torch.relu(x.double() @ w.double().T + b.double()),
                 name=f"linear {N}x{fin}->{fout}")
        cl.check(ops.channel_sum(x), x.double().sum(0), name="channel_sum")
        cl.check(ops.softmax(x), torch.softmax(x.double(), 1), name="softmax")


def _sabotaged(key_kind, call):
    """Run call() once so its plan is kept, shrink the kept launch's grid by one block along its
    last split axis, and run it again: part of the output is never written."""
    ops._plans.clear()
    call()
    (key,) = [k for k in ops._plans if k[0] == key_kind]
    plan = ops._plans[key]
    launch = plan[2] if key_kind == "fused" else plan[1]
    gx, gy, gz = launch.grid
    launch.grid = (gx, gy, gz - 1) if gz > 1 else (gx, gy - 1, gz) if gy > 1 else (gx - 1, gy, gz)
    launch.mod = None                         # bind again, with the short grid
    try:
        return call()
    finally:
        del ops._plans[key]


def test_kept_plans_still_catch_an_output_never_written():
    x, w, b = cl.randn(1, 4, 15, 13), cl.randn(16, 4, 7, 7), cl.randn(16)
    with cl.debug():
        y = _sabotaged("fused", lambda: ops.conv2d_bias_act_pool(x, w, bias=b, act="relu", pool="max", MG=4))
        with pytest.raises(cl.CheckError):
            cl.check(y, F.max_pool2d(torch.relu(F.conv2d(x.double(), w.double(), b.double())), 2), name="fused")
        xs, ws = cl.randn(1, 300), cl.randn(40, 300)
        y = _sabotaged("linear", lambda: ops.linear(xs, ws, SPLIT=4))    # one slice of K never written
        with pytest.raises(cl.CheckError):
            cl.check(y, xs.double() @ ws.double().T, name="linear, a slice short")


def test_linear_refuses_a_split_longer_than_k():
    with pytest.raises(ValueError, match="SPLIT=9: between 1 and the 3 steps"):
        ops.linear(cl.randn(2, 45), cl.randn(5, 45), SPLIT=9)


def test_softmax_and_cross_entropy():
    z = cl.randn(33, 10) * 4 + 80        # large logits: the shift by the row's max keeps exp finite
    labels = torch.randint(0, 10, (33,)).to(z.device)
    cl.check(ops.softmax(z), torch.softmax(z.double(), 1), name="softmax")
    zd = z.double().requires_grad_()
    ref = F.cross_entropy(zd, labels, reduction="none")
    ref.mean().backward()
    loss, dz = ops.softmax_xent(z, labels)
    cl.check(loss, ref, name="loss per image")
    cl.check(dz, zd.grad, name="d loss / d logits")
    with pytest.raises(ValueError, match="int64"):
        ops.softmax_xent(z, labels.int())


def test_sgd_momentum_is_torchs_and_the_fused_kernel_sees_the_new_weights():
    p, v = cl.randn(4, 1, 3, 3), cl.randn(4, 1, 3, 3)
    tp = p.clone().requires_grad_()
    opt = torch.optim.SGD([tp], lr=0.1, momentum=0.9)
    opt.state[tp]["momentum_buffer"] = v.clone()
    x, b = cl.randn(2, 1, 10, 10), cl.randn(4)
    ops.conv2d_bias_act_pool(x, p, bias=b)            # p is now in the kernel's constant memory
    for _ in range(2):
        g = cl.randn(*p.shape)
        tp.grad = g.clone()
        opt.step()
        ops.sgd_momentum(p, g, v, lr=0.1, momentum=0.9)
    cl.check(p, tp.detach().double(), name="sgd_momentum")
    y = ops.conv2d_bias_act_pool(x, p, bias=b)        # must upload the updated p again
    cl.check(y, F.max_pool2d(torch.relu(F.conv2d(x.double(), p.double(), b.double())), 2), name="after the update")


SMALL_NETS = [net.LENET5, net.CLASS_PROJECT.at_size(30)]


@pytest.mark.parametrize("arch", SMALL_NETS, ids=lambda a: a.key)
@pytest.mark.parametrize("fused", [True, False, None], ids=["fused", "separate", "fused-where-it-pays"])
def test_network_layer_by_layer_against_torch(arch, fused):
    params = net.init(arch, seed=1)
    x = cl.randn(3, 1, arch.image_size, arch.image_size)
    labels = torch.tensor([1, 7, 3], device=x.device)
    logits, tape = net.forward(arch, params, x, keep=True, fused=fused)
    loss, grads = net.backward(arch, params, tape, labels)

    model = net.load_into(net.torch_model(arch), params).to(x.device).double()
    ref_tape = {}
    out = model(x.double(), ref_tape)
    ref_loss = F.cross_entropy(out, labels, reduction="none")
    ref_loss.mean().backward()
    for key, ref in ref_tape.items():
        cl.check(tape[key], ref, name=f"{arch.key} {key}")
    cl.check(loss, ref_loss, name=f"{arch.key} loss")
    for name, p in model.named_parameters():
        cl.check(grads[net.param_name(name)], p.grad, name=f"{arch.key} d loss / d {net.param_name(name)}")
    assert net.mean_loss(loss) == pytest.approx(float(ref_loss.detach().mean()), rel=1e-5)


def test_training_follows_torchs_step_by_step():
    arch = net.LENET5
    data = net.digits(28).subset(40, 50)      # batches of 16, 16 and 8: the last mean is over 8
    params, ours = net.train(arch, data, epochs=1, batch_size=16, max_steps=3, seed=2)
    model, theirs = net.train_torch(arch, data, epochs=1, batch_size=16, max_steps=3, seed=2)
    assert ours.steps == theirs.steps == 3
    assert ours.losses == pytest.approx(theirs.losses, rel=1e-4)
    for name, p in model.named_parameters():
        cl.check(params[net.param_name(name)], p.detach().double(), name=f"{net.param_name(name)} after 3 steps")
    assert 0.0 <= ours.test_accuracy <= 1.0


def test_architectures():
    assert [s for s in net.CLASS_PROJECT.sizes()] == [(80, 40), (34, 17)]
    assert net.CLASS_PROJECT.features == 16 * 17 * 17
    assert net.LENET5.sizes() == [(28, 14), (10, 5)] and net.LENET5.features == 400
    c1, c3 = net.CLASS_PROJECT.conv_workloads(10_000)
    assert (c1.C, c1.M, c1.H, c1.K, c3.C, c3.M, c3.H) == (1, 4, 86, 7, 4, 16, 40)
    d = net.digits(86).subset(10, 5)
    assert tuple(d.x_train.shape) == (10, 1, 86, 86) and d.x_train.dtype == torch.float32


@pytest.mark.parametrize("chunks", [1, 3])
def test_pipeline_gives_the_forwards_logits(chunks):
    arch = net.LENET5
    params = net.init(arch, seed=0)
    x = torch.randn(7, 1, 28, 28)
    p = net.Pipeline(lambda xb, out: net.forward(arch, params, xb, logits=out), x, chunks=chunks)
    got = p.run().clone()
    cl.check(got, net.forward(arch, params, cl.to_device(x)), name=f"pipeline, {chunks} chunks")
    assert {s[0] for s in p.spans} == {"copy in", "compute", "copy out"} and len(p.spans) == 3 * chunks
    with pytest.raises(ValueError, match="chunks"):
        net.Pipeline(lambda xb, out: None, x, chunks=8)


def test_pipeline_takes_chunk_sizes():
    arch = net.LENET5
    params = net.init(arch, seed=0)
    x = torch.randn(9, 1, 28, 28)
    p = net.Pipeline(lambda xb, out: net.forward(arch, params, xb, logits=out), x, chunks=[2, 3, 4])
    assert p.bounds == [(0, 2), (2, 5), (5, 9)]
    cl.check(p.run().clone(), net.forward(arch, params, cl.to_device(x)), name="pipeline, sized chunks")
    for bad in ([2, 3], [0, 9], []):
        with pytest.raises(ValueError, match="add up"):
            net.Pipeline(lambda xb, out: None, x, chunks=bad)


@pytest.mark.parametrize("n, first, ratio", [(10_000, 625, 1.48), (10_000, 625, 0.7), (10, 3, 1.5),
                                             (100, 100, 2.0), (1000, 50, 5.0)])
def test_graded_chunks(n, first, ratio):
    sizes = net.graded_chunks(n, first, ratio)
    assert sum(sizes) == n and min(sizes) >= 1
    r = min(2.0, max(0.5, ratio))
    if r < 1:          # shrinking: the same sizes as growing by 1/r, last chunk first
        assert sizes == net.graded_chunks(n, first, 1 / r)[::-1]
        return
    assert sizes[0] == first
    # each chunk about r times the one before, but the last (which took the rest)
    for a, b in zip(sizes[:-2], sizes[1:-1]):
        assert abs(b - r * a) <= 1
    assert sizes[-1] >= sizes[-2] / 2 if len(sizes) > 1 else True


@pytest.mark.parametrize("arch", [net.CLASS_PROJECT, net.LENET5], ids=lambda a: a.key)
def test_full_size_grids_fit(record_launches, arch):
    """Forward and backward at batch 10,000 on meta tensors: every launch within the GPU's limits."""
    launches = record_launches()
    meta = lambda *s: torch.empty(s, device="meta")  # noqa: E731
    params = {k: torch.empty(v.shape, device="meta") for k, v in net.init(arch).items()}
    x = meta(10_000, 1, arch.image_size, arch.image_size)
    for fused in (True, False):
        logits, tape = net.forward(arch, params, x, keep=True, fused=fused)
    ops.softmax_xent(logits, torch.empty(10_000, dtype=torch.int64, device="meta"))
    n = len(arch.widths)
    dz = meta(10_000, arch.classes)
    for j in reversed(range(n)):
        h = tape[f"fc{j}.out"] if j else tape[f"conv{len(arch.convs)}.out"].view(10_000, -1)
        ops.linear_dw(dz, h)
        ops.channel_sum(dz)
        dz = ops.linear_dx(dz, params[f"fc{j + 1}.weight"])
    for s, conv in zip(arch.convs, arch.sizes()):
        a = meta(10_000, s.M, conv[0], conv[0])
        ops.pool_act_backward(a, meta(10_000, s.M, conv[1], conv[1]), act=s.act, pool=s.pool)
    assert launches
    for name, grid, block, shared, _ in launches:
        check_launch(name, grid, block, shared)


def test_batch_one_forward_splits_and_spreads(record_launches):
    """One image through the project's network, every stage fused: each fused stage's grid covers
    the SMs (or has nothing left to split), and the 4,624-wide FC layer's product is split along K
    and reduced."""
    launches = record_launches()
    arch = net.CLASS_PROJECT
    params = {k: torch.empty(v.shape, device="meta") for k, v in net.init(arch).items()}
    net.forward(arch, params, torch.empty(1, 1, arch.image_size, arch.image_size, device="meta"),
                fused=True)
    names = [name for name, *_ in launches]
    assert names[:4] == ["conv2d_bias_act_pool"] * 2 + ["gemm_bias_act", "gemm_splitk_reduce"]
    assert names[4:] in (["gemm_bias_act"], ["gemm_bias_act", "gemm_splitk_reduce"])   # 128 -> 10: 8 steps
    for name, grid, block, _, defines in launches[:2]:
        d = dict(defines)
        assert grid[0] * grid[1] >= 132 or (d["MG"] == "1" and block[0] == 32), (grid, block, d)
    assert launches[2][1][2] > 1             # the first FC layer: slices of K on gridDim.z


def test_measure_stages_checks_before_it_times():
    wls = net.LENET5.conv_workloads(10_000)
    df = net.measure_stages(ops.IMPLEMENTATIONS, wls, act="tanh", pool="avg", torch_too=False)
    assert list(df["impl"]) == [ops.FUSED.name, ops.SEPARATE.name] * 2
    assert (df["pass"] == "forward").all() and df["ms"].notna().all()
    skewed = ops.Impl("bias off by one map", lambda x, w, y=None, *, bias, **kw:
                      ops.conv2d_bias_act_pool(x, w, y, bias=bias.roll(1), **kw), op="conv2d_stage")
    with pytest.raises(cl.CheckError):
        net.measure_stages([skewed], wls[:1], act="tanh", pool="avg", torch_too=False)


def test_measure_networks_checks_both_paths():
    df = net.measure_networks(net.LENET5, [1, 2], torch_too=False)
    assert list(df["impl"]) == ["ours: fused stages", "ours: separate epilogue"] * 2
    assert list(df["workload"].unique()) == ["lenet5"] and df["shape"].str.contains("whole network").all()


def test_occupancy_is_not_a_number_without_registers():
    assert net.occupancy(None, 128) != net.occupancy(None, 128)


@pytest.mark.parametrize("N,fin,fout,act", [(1, 45, 7, "tanh"), (3, 100, 10, "none"), (5, 33, 12, "relu")])
def test_linear_as_a_1x1_convolution(N, fin, fout, act):
    """GEMM='igemm' (the layer as chapter 9's 1x1 convolution, then bias_act) gives the fp64 result on
    awkward sizes, into a given output too; an activation without a bias is refused with the reason."""
    x, w, b = cl.randn(N, fin), cl.randn(fout, fin), cl.randn(fout)
    ref = ops.reference_linear(x, w, b, act)
    cl.check(ops.linear(x, w, bias=b, act=act, GEMM="igemm"), ref, name="igemm")
    y = cl.empty(N, fout)
    assert ops.linear(x, w, y, bias=b, act=act, GEMM="igemm") is y
    cl.check(y, ref, name="igemm into y")
    if act != "none":
        with pytest.raises(ValueError, match="needs a bias"):
            ops.linear(x, w, act=act, GEMM="igemm")
    with pytest.raises(ValueError, match="one of"):
        ops.linear(x, w, bias=b, GEMM="cublas")


def test_linear_gemm_rule():
    """One image stays on the tiled GEMM (and its split); a deep layer at a batch of 64, or any layer
    with 1e8 multiply-adds, goes to the implicit GEMM; the chosen route gives the fp64 result."""
    assert ops.linear_gemm(1, 4624, 128) == "tiled"
    assert ops.linear_gemm(64, 4624, 128) == "igemm"
    assert ops.linear_gemm(1250, 400, 120) == "tiled"
    assert ops.linear_gemm(10_000, 400, 120) == "igemm"
    assert ops.linear_gemm(10_000, 84, 10) == "tiled"
    x, w, b = cl.randn(64, 1030), cl.randn(9, 1030), cl.randn(9)
    cl.check(ops.linear(x, w, bias=b, act="relu"), ops.reference_linear(x, w, b, "relu"), name="deep layer")


def test_tapered_chunks():
    """Sizes 1, 2, ..., k, ..., 2, 1 times n/k², summing to n (rounding to the middle), small at both
    ends; too few images for k steps is refused."""
    assert net.tapered_chunks(10_000, 4) == [625, 1250, 1875, 2500, 1875, 1250, 625]
    for n, k in ((9_999, 5), (6, 2), (7, 1)):
        sizes = net.tapered_chunks(n, k)
        assert sum(sizes) == n and len(sizes) == 2 * k - 1 and min(sizes) >= 1
        assert sizes[0] == sizes[-1] == min(sizes) and max(sizes) == sizes[k - 1]
    with pytest.raises(ValueError, match="at least"):
        net.tapered_chunks(3, 2)


def test_forward_fuses_only_the_stages_whose_mask_fits_the_constant_cache():
    """The fused stage won where its mask fits the 8 KB constant cache and lost where it does not
    (book/data/details/10_network_stages.csv): network.forward fuses by that rule."""
    assert [net.fuses(s) for s in net.CLASS_PROJECT.convs] == [True, False]
    assert [net.fuses(s) for s in net.LENET5.convs] == [True, False]
    from convlab.measuring import results
    stages = results.load("details/10_network_stages")
    ms = stages.pivot_table(index="workload", columns="key", values="ms")
    won = (ms["stage_fused"] < ms["stage_separate"]).to_dict()
    convs = dict(zip(("project_conv1", "project_conv2"), net.CLASS_PROJECT.convs))
    convs.update(zip(("lenet5_conv1", "lenet5_conv2"), net.LENET5.convs))
    assert {name: net.fuses(s) for name, s in convs.items()} == {name: won[name] for name in convs}
