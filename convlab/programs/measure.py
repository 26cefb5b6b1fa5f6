"""The one measuring harness: check implementations on layers against the fp64 reference, time
them, and return result rows in one schema (convlab.measuring.results), torch at its best beside them.

    df = measure.run(fused.IMPLEMENTATIONS, workloads.WORKLOADS_2D)      # a chapter's figure
    df = measure.sweep(fused.REGTILE, workloads.get("fa17"), configs)   # a parameter sweep
    results.save(df, "05_fused")

Every implementation is an `convlab.ops.Impl` (name, launcher, the pass it computes, which shapes
it takes, its default tunables). For each layer the harness makes fresh random inputs, runs each
implementation once, checks its output against an fp64 reference computed on the device on a
few sampled images (the first, the last and two at random; dW, a reduction over the batch, is
checked whole), then times it three ways (convlab.measuring.results says which). torch's rows come from
convlab.measuring.baselines: each layout timed in a fresh process, "torch best" the faster.

On the emulator the same code checks every implementation on each layer's small twin and times
nothing that could pass for a GPU time: its rows carry "CPU emulator" as their device, and
results.save refuses them.
"""
from __future__ import annotations

import math

import torch

import convlab as cl

from ..display.book import progress
from ..gpu.check import DW_INDEX
from ..measuring import baselines, results, roofline
from ..measuring.bench import bench, time_caller, time_gpu, wall_per_call
from ..ops.fp16 import fp16_tolerance

SAMPLED_IMAGES = 4


def named(impls, name: str):
    """The implementation called `name` among impls (a chapter's IMPLEMENTATIONS)."""
    for impl in impls:
        if impl.name == name:
            return impl
    raise KeyError(f"no implementation {name!r}; there are: {', '.join(i.name for i in impls)}")


def _is_gpu() -> bool:
    return cl.backend() == "cuda"


def _dtype(dtype: str):
    return {"fp32": torch.float32, "fp16": torch.float16}[dtype]


def _conv(wl):
    return torch.nn.functional.conv2d if wl.D is None else torch.nn.functional.conv3d


LAYOUTS = ("nchw", "channels_last")


def inputs(wl, pass_: str, dtype: str = "fp32", layout: str = "nchw") -> dict:
    """Fresh random tensors for one pass over a layer, on the backend's device; layout
    "channels_last": every 4D tensor in that memory format (what a kernel reading NHWC takes without
    a conversion, as torch's channels_last rows get it)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r}: one of {', '.join(LAYOUTS)}")
    dt = _dtype(dtype)
    out = {"x": cl.randn(*wl.x_shape, dtype=dt), "w": cl.randn(*wl.w_shape, dtype=dt)}
    if pass_ != "forward":
        out["dy"] = cl.randn(*wl.y_shape, dtype=dt)
    if layout == "channels_last":
        out = {k: v.contiguous(memory_format=torch.channels_last) if v.dim() == 4 else v for k, v in out.items()}
    return out


def call(impl, wl, t: dict, tunables: dict):
    """A zero-argument callable running impl on the tensors t, by the launcher contract of its pass
    (stride and padding, and dilation and groups where the layer has them: Workload.conv_kwargs)."""
    kw = dict(wl.conv_kwargs(), **tunables)
    f = impl.launcher
    if impl.op in ("conv2d", "conv3d", "conv2d_fp16"):
        return lambda: f(t["x"], t["w"], **kw)
    if impl.op in ("conv2d_dx", "conv2d_dx_fp16"):
        return lambda: f(t["dy"], t["w"], input_size=(wl.H, wl.W), **kw)
    if impl.op in ("conv2d_dw", "conv2d_dw_fp16"):
        return lambda: f(t["x"], t["dy"], kernel_size=wl.kernel_size, **kw)
    if impl.op == "conv2d_train":
        return lambda: f(t["x"], t["w"], t["dy"], **kw)
    raise ValueError(f"{impl.name}: unknown op {impl.op!r}")


PASS_OF_OP = {"conv2d": "forward", "conv3d": "forward", "conv2d_fp16": "forward", "conv2d_dx": "dX",
              "conv2d_dw": "dW", "conv2d_train": "forward+dX+dW", "conv2d_dx_fp16": "dX", "conv2d_dw_fp16": "dW"}


def sample_images(B: int) -> list:
    """The images a check compares for a batch of B: the first, the last and two at random (seeded by B)."""
    g = torch.Generator().manual_seed(B)
    picks = [0, B - 1] + torch.randint(0, B, (SAMPLED_IMAGES - 2,), generator=g).tolist()
    return sorted(set(picks))


def check_output(impl, wl, t: dict, out, dtype: str = "fp32") -> None:
    """Raise cl.CheckError unless out (what impl returned) matches the fp64 reference: on sampled
    images for the forward pass and dX, whole for dW (every image contributes to each element)."""
    kw = wl.conv_kwargs()
    d = lambda v: v.double()  # noqa: E731
    idx = sample_images(wl.B)
    what = f"{impl.name} on {wl.name}"
    p = PASS_OF_OP[impl.op]
    if p == "forward":
        ref = _conv(wl)(d(t["x"][idx]), d(t["w"]), **kw)
        _check(impl, wl, out[idx], ref, what, dtype, wl.reduction, derived=True)
    elif p == "dX":
        ref = torch.nn.grad.conv2d_input((len(idx), *wl.x_shape[1:]), d(t["w"]), d(t["dy"][idx]), **kw)
        _check(impl, wl, out[idx], ref, what, dtype, wl.M // wl.groups * wl.K * wl.Kw, derived=True)
    elif p == "dW":
        ref = torch.nn.grad.conv2d_weight(d(t["x"]), wl.w_shape, d(t["dy"]), **kw)
        _check(impl, wl, out, ref, what, dtype, wl.B * wl.Ho * wl.Wo, derived=False, index=DW_INDEX)
    else:
        y, dx, dw = out
        fake = lambda op: type(impl)(impl.name, impl.launcher, op=op)  # noqa: E731
        check_output(fake("conv2d"), wl, t, y, dtype)
        check_output(fake("conv2d_dx"), wl, t, dx, dtype)
        check_output(fake("conv2d_dw"), wl, t, dw, dtype)


ROUNDING = {"fp32": (2.0 ** -24, 1e-4), "fp16": (2.0 ** -11, 1e-2)}   # unit roundoff, cl.check's share


def _check(impl, wl, out, ref, what: str, dtype: str, length: int, derived: bool, index=None) -> None:
    """cl.check against ref (fp64 of the inputs as the kernel got them). fp16 forward and dX: chapter
    6's derived bound (fp16.fp16_tolerance: half inputs, sums of `length` terms in half or float as
    the kernel keeps them (Impl.accumulation_on), the result rounded to half), far tighter than the
    generic one for float sums. fp32, and dW: _atol's generic bound (dW sums over the whole batch,
    where the derived bound's term for a tensor core's truncating adds, length·2^-24, grows past it).
    index: the names of out's axes in messages (dW: DW_INDEX)."""
    if dtype == "fp16" and derived:

        rtol, atol_rms = fp16_tolerance(max(length, 1), 1, impl.accumulation_on(wl), rounded_inputs=True)
        rms = float(ref.pow(2).mean().sqrt()) if ref.numel() else 1.0
        cl.check(out, ref, name=what, rtol=rtol, atol=atol_rms * max(rms, 1e-30), index=index)
    else:
        cl.check(out, ref, name=what, atol=_atol(ref, dtype, length), index=index)


def _atol(ref, dtype: str, length: int) -> float:
    """The absolute tolerance: cl.check's default share of the reference's RMS, widened for long
    reductions to what rounding alone reaches. An output that sums n = `length` products of zero
    mean rounds its running sum n times; the k-th rounding is off by up to u (the unit roundoff)
    times a sum of about sqrt(k/n) of the output's RMS. Independent, these errors add up to a
    standard deviation of about u*sqrt(n/6) RMS; 8*u*sqrt(n) RMS is some 20 of them, enough for the
    largest of millions of outputs and for any order of the sum (blocked or split sums only shrink
    the running sums). It passes the fixed share for dW, whose elements sum B*Ho*Wo products
    (days100: 65,536, resnet: 200,704); in fp32, never for the forward pass's C*K*K (at most 576)."""
    u, share = ROUNDING[dtype]
    rms = float(ref.pow(2).mean().sqrt()) if ref.numel() else 1.0
    return max(share, 8 * u * math.sqrt(length)) * max(rms, 1e-30)


def time_impl(fn, reps: int = 20) -> results.Measured:
    """GPU time, the time a caller sees, and the time per call in a loop (see convlab.measuring.results)."""
    if not _is_gpu():
        t = bench(fn, reps=1, warmup=0)
        return results.Measured(t.ms, t.p25, t.p75)
    gpu = time_gpu(fn, reps=reps)
    caller = time_caller(fn, reps=reps)
    return results.Measured(gpu.ms, gpu.p25, gpu.p75, caller.ms, wall_per_call(fn))


def _free():
    if _is_gpu():
        torch.cuda.empty_cache()


def run(impls, workloads, *, dtype: str = "fp32", layout: str = "nchw", torch_baseline: bool = True, reps: int = 20,
        roof=None, desc: str = "measuring") -> "pandas.DataFrame":  # noqa: F821
    """Check and time each implementation on each layer it applies to; torch's rows after ours.
    layout: the memory format of the inputs ours get (inputs()); torch's rows time both.
    On the emulator, each layer's small twin is checked and nothing is timed for a figure."""
    gpu = _is_gpu()
    if gpu and roof is None:
        roof = roofline.current(dtype)
    impls = list(impls)
    rows = []
    for wl_full in progress(list(workloads), desc=desc):
        wl = wl_full if gpu else wl_full.small()
        passes = list(dict.fromkeys(PASS_OF_OP[i.op] for i in impls))
        for p in passes:
            t = inputs(wl, p, dtype, layout)
            for impl in impls:
                if PASS_OF_OP[impl.op] != p or not impl.takes(wl):
                    continue
                fn = call(impl, wl, t, impl.config(wl))
                check_output(impl, wl, t, fn(), dtype)
                rows.append(results.row(wl, impl.name, time_impl(fn, reps), key=impl.key or None, pass_=p, dtype=dtype, layout=layout,
                                        roof=roof))
            del t
            _free()
            if gpu and torch_baseline:
                rows += baselines.torch_rows(wl, p, dtype, roof=roof)
    return results.frame(rows)


def sweep(impl, wl, configs, *, dtype: str = "fp32", layout: str = "nchw", reps: int = 10, roof=None,
          desc: str = "sweep") -> "pandas.DataFrame":  # noqa: F821
    """Check and time impl on one layer for each dict of tunables: rows with the tunables as extra
    columns (a tunable a dict leaves out: empty, the launcher's default). layout: as run's.
    A setting that cannot launch is reported in a line and gets no row."""
    import pandas as pd

    gpu = _is_gpu()
    if gpu and roof is None:
        roof = roofline.current(dtype)
    wl = wl if gpu else wl.small()
    p = PASS_OF_OP[impl.op]
    t = inputs(wl, p, dtype, layout)
    rows, tunables = [], []
    for cfg in progress(list(configs), desc=desc):
        fn = call(impl, wl, t, cfg)
        try:
            out = fn()
            cl.sync()
        except (cl.ConvlabError, ValueError) as e:
            print(f"{cfg}: cannot run ({str(e).splitlines()[0]})")
            continue
        check_output(impl, wl, t, out, dtype)
        rows.append(results.row(wl, impl.name, time_impl(fn, reps), key=impl.key or None, pass_=p, dtype=dtype, layout=layout, roof=roof))
        tunables.append(cfg)
    del t
    _free()
    return pd.concat([results.frame(rows), pd.DataFrame(tunables)], axis=1)
