"""torch's own conformance inputs for nn.functional.conv2d (the OpInfo sample inputs of
torch.testing._internal) through the course's drop-in conv2d (convlab.ops.general), on the active
backend: the output and the gradients for the input, the weight and the bias, in float32 and
float16, and in float32 the second derivatives (double backward), against torch in float64 on the
same values. Every sample must pass, on the chapter's kernels (none may be handed to torch).

Tolerances: float32, cl.check's (1e-4 of |ref| plus 1e-4 of the reference's RMS). float16: the
kernels read half, sum in float and round the result to half once, so, as chapter 6 derives it
(convlab.ops.fp16.fp16_tolerance, inputs already half, float accumulation), the bound is the
output's rounding (2^-11 of |ref|) plus the float sum's error over the result's reduction length n
(dX: M/groups*Kh*Kw; dW and dbias: B*Ho*Wo pixels). The forward runs the kernel the dispatcher
picks, which may sum in half and leave the bias to a second rounding: dispatch.check_fp16_forward
derives its bound.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

import convlab as cl
from convlab.ops import dispatch, dropin
from convlab.ops.fp16 import check_fp16

OP = "nn.functional.conv2d"


@functools.lru_cache(maxsize=None)
def _opinfo():
    from torch.testing._internal.common_methods_invocations import op_db   # slow: imports all of op_db once

    ops = [op for op in op_db if op.name == OP]
    assert len(ops) == 1, f"torch's op_db has {len(ops)} OpInfos named {OP!r}"
    return ops[0]


def _check(out, ref, dtype, n: int, name: str):
    if dtype == torch.float16:
        return check_fp16(out, ref, C=max(n, 1), K=1, accumulate="float", rounded_inputs=True, name=name)
    return cl.check(out, ref, name=name)


def _run(sample, dtype) -> list[str]:
    """Forward and gradients of one sample; the names of what passed."""
    x = sample.input
    w, b = sample.args[0], sample.args[1] if len(sample.args) > 1 else sample.kwargs.get("bias")
    kw = {k: v for k, v in sample.kwargs.items() if k != "bias"}
    reason = dropin.kernel_fallback_reason(x, w, b, **kw)
    assert reason is None, f"handed to torch ({reason}), not run on the kernels"

    y = dropin.conv2d(x, w, b, **kw)
    leaves = [t.detach().double().requires_grad_() for t in (x, w) + ((b,) if b is not None else ())]
    ref = F.conv2d(leaves[0], leaves[1], leaves[2] if b is not None else None, **kw)
    Cg, Kh, Kw = w.shape[1:]
    M = w.shape[0]
    groups = kw.get("groups", 1)
    if dtype == torch.float16:     # the bound of the kernel the dispatcher runs (its sums, its bias)
        dispatch.check_fp16_forward(y, ref, x.shape, w.shape, b, **kw)
    else:
        _check(y, ref.detach(), dtype, Cg * Kh * Kw + 1, "y")

    dy = torch.randn(ref.shape, dtype=torch.float64).to(dtype).to(y.device)
    ours = torch.autograd.grad(y, [x, w] + ([b] if b is not None else []), dy)
    theirs = torch.autograd.grad(ref, leaves, dy.double())
    pixels = ref.numel() // M
    lengths = [M // groups * Kh * Kw, pixels, pixels]
    for name, o, r, n in zip(("dx", "dw", "dbias"), ours, theirs, lengths):
        assert o.shape == r.shape and o.dtype == dtype, f"{name}: {o.shape} {o.dtype}, want {r.shape} {dtype}"
        _check(o, r, dtype, n, name)
    return ["y", "dx", "dw", "dbias"][:len(ours) + 1]


def _run_gradgrad(sample) -> None:
    """float32: the second derivatives (gradients of dx, dw, dbias · random v with respect to x, w,
    bias and dy), against torch's in float64."""
    x = sample.input
    w, b = sample.args[0], sample.args[1] if len(sample.args) > 1 else sample.kwargs.get("bias")
    kw = {k: v for k, v in sample.kwargs.items() if k != "bias"}
    ts = [x, w] + ([b] if b is not None else [])
    dy = torch.randn(F.conv2d(x.detach(), w.detach(), None, **kw).shape, dtype=torch.float64, device=x.device)
    vs = [torch.randn(t.shape, dtype=torch.float64, device=x.device) for t in ts]

    def second(conv, dtype):
        leaves = [t.detach().to(dtype).requires_grad_() for t in ts] + [dy.to(dtype).requires_grad_()]
        y = conv(leaves[0], leaves[1], leaves[2] if b is not None else None, **kw)
        gs = torch.autograd.grad(y, leaves[:-1], leaves[-1], create_graph=True)
        loss = sum((g * v.to(dtype)).sum() for g, v in zip(gs, vs))
        return torch.autograd.grad(loss, leaves, allow_unused=True)

    names = ["d/dx", "d/dw"] + (["d/dbias"] if b is not None else []) + ["d/ddy"]
    for name, o, r in zip(names, second(dropin.conv2d, torch.float32), second(F.conv2d, torch.float64)):
        if r is None:
            assert o is None or not o.any(), name
        else:
            cl.check(o, r, name="second derivative " + name)


def test_opinfo_samples_forward_and_derivatives():
    op = _opinfo()
    failures, passed = [], {}
    for dtype in (torch.float32, torch.float16):
        samples = list(op.sample_inputs(cl.device().torch_device, dtype, requires_grad=True))
        assert samples, f"no OpInfo samples for {dtype}"
        for i, s in enumerate(samples):
            try:
                for name in _run(s, dtype):
                    passed[dtype, name] = passed.get((dtype, name), 0) + 1
                if dtype == torch.float32:
                    _run_gradgrad(s)
                    passed[dtype, "second derivatives"] = passed.get((dtype, "second derivatives"), 0) + 1
            except Exception as e:   # every sample is run; the failures are listed together
                shapes = (tuple(s.input.shape), tuple(s.args[0].shape), s.kwargs)
                failures.append(f"{dtype} sample {i} {shapes}: {type(e).__name__}: {e}")
        passed[dtype, "samples"] = len(samples)
    print("passed:", {f"{str(d).split('.')[-1]} {k}": v for (d, k), v in passed.items()})
    assert not failures, f"{len(failures)} OpInfo samples of {OP} fail:\n" + "\n".join(failures)
