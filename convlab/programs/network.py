"""Whole networks with every op a course kernel (chapter 10): forward, backward, training, and the
same network in torch at the same weights, to check layer by layer and to compare with.

    from convlab.programs import network
    arch = network.CLASS_PROJECT                       # or network.LENET5
    params = network.init(arch, seed=0)                # torch's initialisation, on the backend's device
    logits, tape = network.forward(arch, params, x, keep=True)
    loss, grads = network.backward(arch, params, tape, labels)
    data = network.digits(arch.image_size)             # scikit-learn's digits, resized
    result = network.train(arch, data, epochs=5)       # ours; network.train_torch: torch's twin

The networks:
- CLASS_PROJECT: the class projects' network: conv 1->4, 7x7 on 86x86 (80x80 out), ReLU, 2x2 max
  pool (40x40), conv 4->16, 7x7 (34x34), ReLU, pool (17x17), then fully-connected layers
  4,624 -> 128 -> 10 (the widths of the fully-connected layers are ours).
- LENET5: LeNet-5 at 28x28: conv 1->6, 5x5, padding 2, tanh, 2x2 average pool, conv 6->16, 5x5,
  tanh, pool (5x5), then 400 -> 120 -> 84 -> 10 with tanh.

Each conv stage runs as one kernel (conv + bias + activation + pooling, ops.layers' fused kernel)
where that measured faster (fuses()), else as chapter 5's pick() convolution then the epilogue
kernels; fused=True or False runs every stage one way. The backward
pass uses chapter 8's dX and dW kernels for the convolutions and this chapter's kernels for the
rest; the optimiser's update is a kernel too.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F

import convlab as cl

from ..gpu import runtime
from ..measuring import results
from ..measuring.bench import strict_fp32
from ..measuring.workloads import Workload
from ..ops import backprop
from ..ops import layers as ops
from ..ops import new_output
from . import measure
from .lenet import Dataset, load_digits


@dataclass(frozen=True)
class ConvStage:
    C: int
    M: int
    K: int
    padding: int = 0
    act: str = "relu"
    pool: str = "max"


@dataclass(frozen=True)
class Architecture:
    name: str
    image_size: int
    convs: tuple
    hidden: tuple          # widths of the hidden fully-connected layers
    act: str = "relu"      # the activation of the hidden fully-connected layers
    classes: int = 10

    def sizes(self) -> list:
        """(conv output side, pooled side) per conv stage."""
        out, n = [], self.image_size
        for s in self.convs:
            conv = n + 2 * s.padding - s.K + 1
            n = ops.pooled_size(conv, s.pool)
            out.append((conv, n))
        return out

    @property
    def features(self) -> int:
        return self.convs[-1].M * self.sizes()[-1][1] ** 2

    @property
    def widths(self) -> tuple:
        """(in, out) of each fully-connected layer."""
        w = (self.features, *self.hidden, self.classes)
        return tuple(zip(w[:-1], w[1:]))

    def conv_workloads(self, B: int) -> list:
        """Each conv stage as a convlab.measuring.workloads.Workload for a batch of B images."""

        side, out = self.image_size, []
        for i, (s, (conv, pooled)) in enumerate(zip(self.convs, self.sizes())):
            out.append(Workload(f"{self.key}_conv{i + 1}", B, s.C, s.M, side, side, s.K, padding=s.padding,
                                note=f"{self.name}, conv stage {i + 1}"))
            side = pooled
        return out

    @property
    def key(self) -> str:
        return {"class project": "project", "LeNet-5": "lenet5"}.get(self.name, self.name.replace(" ", "_"))

    def at_size(self, image_size: int) -> "Architecture":
        """The same layers on smaller images (the emulator's twin): only the first FC layer's width
        in changes."""
        return replace(self, image_size=image_size)

    def __str__(self):
        parts = []
        for s, (conv, pooled) in zip(self.convs, self.sizes()):
            pool = "" if s.pool == "none" else f", {s.pool} pool -> {pooled}x{pooled}"
            pad = f" pad {s.padding}" if s.padding else ""
            parts.append(f"conv {s.C}->{s.M} {s.K}x{s.K}{pad} -> {conv}x{conv}, {s.act}{pool}")
        fc = " -> ".join(str(w) for w in (self.features, *self.hidden, self.classes))
        return f"{self.name} on {self.image_size}x{self.image_size}: " + "; ".join(parts) + f"; FC {fc}"


CLASS_PROJECT = Architecture("class project", 86, (ConvStage(1, 4, 7), ConvStage(4, 16, 7)), hidden=(128,))
LENET5 = Architecture("LeNet-5", 28, (ConvStage(1, 6, 5, 2, "tanh", "avg"), ConvStage(6, 16, 5, 0, "tanh", "avg")),
                      hidden=(120, 84), act="tanh")


# ---- parameters -----------------------------------------------------------------------------------

def torch_model(arch: Architecture) -> torch.nn.Module:
    """The same network in torch (nn.Conv2d, nn.Linear, torch's activations and pooling)."""
    return _TorchNet(arch)


class _TorchNet(torch.nn.Module):
    def __init__(self, arch):
        super().__init__()
        self.arch = arch
        self.convs = torch.nn.ModuleList(torch.nn.Conv2d(s.C, s.M, s.K, padding=s.padding) for s in arch.convs)
        self.fcs = torch.nn.ModuleList(torch.nn.Linear(i, o) for i, o in arch.widths)

    def forward(self, x, tape: dict | None = None):
        for i, (conv, s) in enumerate(zip(self.convs, self.arch.convs)):
            x = _torch_act(conv(x), s.act)
            if tape is not None:
                tape[f"conv{i + 1}.act"] = x
            x = {"max": F.max_pool2d, "avg": F.avg_pool2d}[s.pool](x, 2) if s.pool != "none" else x
            if tape is not None:
                tape[f"conv{i + 1}.out"] = x
        x = x.flatten(1)
        for j, fc in enumerate(self.fcs):
            x = fc(x)
            if j < len(self.fcs) - 1:
                x = _torch_act(x, self.arch.act)
            if tape is not None:
                tape[f"fc{j + 1}.out"] = x
        return x


def _torch_act(t, act):
    return {"relu": torch.relu, "tanh": torch.tanh, "none": lambda v: v}[act](t)


def _device():
    return torch.device(cl.device().torch_device)


def init(arch: Architecture, seed: int = 0, device=None) -> dict:
    """Parameters by name (conv1.weight, conv1.bias, ..., fc1.weight, ...), torch's default
    initialisation from `seed`: the weights torch_model(arch) gets with the same seed."""
    torch.manual_seed(seed)
    model = torch_model(arch)
    device = torch.device(device) if device is not None else _device()
    return {param_name(k): v.detach().to(device).contiguous() for k, v in model.state_dict().items()}


def param_name(torch_key: str) -> str:
    """convs.0.weight -> conv1.weight, fcs.1.bias -> fc2.bias"""
    kind, i, what = torch_key.split(".")
    return f"{'conv' if kind == 'convs' else 'fc'}{int(i) + 1}.{what}"


def load_into(model: torch.nn.Module, params: dict) -> torch.nn.Module:
    """Copy our parameters into torch_model(arch) (same names, same layouts)."""
    state = {}
    for k in model.state_dict():
        state[k] = params[param_name(k)].detach().to(next(model.parameters()).device)
    model.load_state_dict(state)
    return model


# ---- forward and backward with the course's kernels ----------------------------------------------------

#: The fused kernel reads the mask from __constant__ memory, as chapter 5's coarsened direct kernel
#: does; the constant cache that serves a warp's broadcasts holds 8 KB per SM (chapter 3).
CONSTANT_CACHE_BYTES = 8 * 1024


def fuses(stage: ConvStage) -> bool:
    """Whether forward() runs a conv stage as the one fused kernel: where its mask fits the constant
    cache. That is where fusing measured faster than pick()'s convolution and a separate epilogue
    (book/data/details/10_network_stages.csv: the 1-channel stages of 4 and 6 maps, masks of 0.8
    and 0.6 KiB); the fused stage lost on both 16-map stages (masks of 12.3 and 9.4 KiB), as
    chapter 5's constant-mask kernel lost to its shared-mask one on lenet_c3."""
    return 4 * stage.M * stage.C * stage.K * stage.K <= CONSTANT_CACHE_BYTES


def forward(arch: Architecture, params: dict, x, *, keep: bool = False, fused: bool | None = None,
            logits=None):
    """The logits (N, classes) of images x (N, 1, S, S), every op a course kernel. keep=True also
    returns the tape the backward pass needs (each layer's input and activations). logits: an
    output tensor to write into (the stream pipeline's slice of its result). fused: None fuses a
    stage's epilogue into its convolution where fuses() says it pays; True or False, every stage."""
    tape = {"x": x} if keep else None
    h = x
    for i, (s, (conv, _)) in enumerate(zip(arch.convs, arch.sizes())):
        one_kernel = fuses(s) if fused is None else fused
        stage = ops.conv2d_bias_act_pool if one_kernel else ops.conv2d_separate_epilogue
        a = new_output((h.shape[0], s.M, conv, conv), h) if keep else None
        h = stage(h, params[f"conv{i + 1}.weight"], padding=s.padding, bias=params[f"conv{i + 1}.bias"],
                  act=s.act, pool=s.pool, act_out=a)
        if keep:
            tape[f"conv{i + 1}.act"], tape[f"conv{i + 1}.out"] = a, h
    h = h.view(h.shape[0], -1)
    n = len(arch.widths)
    for j in range(n):
        last = j == n - 1
        h = ops.linear(h, params[f"fc{j + 1}.weight"], logits if last else None, bias=params[f"fc{j + 1}.bias"],
                       act="none" if last else arch.act)
        if keep:
            tape[f"fc{j + 1}.out"] = h
    return (h, tape) if keep else h


def backward(arch: Architecture, params: dict, tape: dict, labels):
    """(per-image losses (N,), gradients by parameter name) from forward(..., keep=True)'s tape."""
    n = len(arch.widths)
    loss, dz = ops.softmax_xent(tape[f"fc{n}.out"], labels)
    grads = {}
    for j in reversed(range(n)):
        if j < n - 1:      # through the hidden layer's activation (no pooling: a 1x1 "map" per feature)
            a = tape[f"fc{j + 1}.out"]
            dz = ops.pool_act_backward(a.view(*a.shape, 1, 1), dz.view(*dz.shape, 1, 1), act=arch.act,
                                       pool="none").view(a.shape)
        h = tape[f"fc{j}.out"] if j > 0 else tape[f"conv{len(arch.convs)}.out"].view(dz.shape[0], -1)
        grads[f"fc{j + 1}.weight"] = ops.linear_dw(dz, h)
        grads[f"fc{j + 1}.bias"] = ops.channel_sum(dz)
        dz = ops.linear_dx(dz, params[f"fc{j + 1}.weight"])
    dp = dz.view(tape[f"conv{len(arch.convs)}.out"].shape)
    for i in reversed(range(len(arch.convs))):
        s = arch.convs[i]
        x_in = tape[f"conv{i}.out"] if i > 0 else tape["x"]
        dz = ops.pool_act_backward(tape[f"conv{i + 1}.act"], dp, act=s.act, pool=s.pool)
        w = params[f"conv{i + 1}.weight"]
        grads[f"conv{i + 1}.weight"] = backprop.conv2d_weight_grad_best(x_in, dz, padding=s.padding, kernel_size=s.K)
        grads[f"conv{i + 1}.bias"] = ops.channel_sum(dz)
        if i > 0:
            dp = backprop.conv2d_input_grad_best(dz, w, padding=s.padding, input_size=tuple(x_in.shape[2:]))
    return loss, grads


def mean_loss(loss) -> float:
    """The batch's mean loss, summed by a kernel (channel_sum over a (1, 1, N) view); one number read back."""
    return float(ops.channel_sum(loss.view(1, 1, -1))[0]) / loss.numel()


# ---- data -----------------------------------------------------------------------------------------------

def digits(image_size: int, test_fraction: float = 0.25, seed: int = 0):
    """scikit-learn's 8x8 digits (convlab.programs.lenet.load_digits: shipped inside the package, normalised),
    resized to image_size x image_size with bilinear interpolation (torch's F.interpolate)."""
    d = load_digits(test_fraction, seed)

    def up(t):
        return F.interpolate(t, size=(image_size, image_size), mode="bilinear", align_corners=False).contiguous()

    return Dataset(f"digits (scikit-learn, 8x8 resized to {image_size}x{image_size})", up(d.x_train), d.y_train,
                   up(d.x_test), d.y_test, d.classes)


# ---- training -------------------------------------------------------------------------------------------

@dataclass
class TrainResult:
    losses: list = field(default_factory=list)          # mean training loss of each step
    test_accuracy: float = float("nan")
    seconds: float = float("nan")                       # wall time of the training steps (synchronised)
    steps: int = 0
    epoch_seconds: list = field(default_factory=list)   # the same, epoch by epoch
    epoch_steps: list = field(default_factory=list)

    @property
    def step_ms(self) -> float:
        """ms per step once every batch shape has been seen: over the epochs after the first when
        there are several. The first epoch compiles the kernels of each batch shape (ours: the last
        batch of an epoch is a smaller one, with tunables of its own) and lets cudnn.benchmark try
        its algorithms on each (torch's): one-time costs, seconds for a compile."""
        if len(self.epoch_seconds) > 1:
            return 1e3 * sum(self.epoch_seconds[1:]) / sum(self.epoch_steps[1:])
        return 1e3 * self.seconds / max(1, self.steps)


class _EpochClock:
    """Wall time of each epoch of a training loop, synchronised at its ends, into a TrainResult."""
    def __init__(self, result: TrainResult):
        self.result, self.epoch = result, None
        _sync()
        self.t0 = self.start = time.perf_counter()

    def step(self, epoch: int):
        if epoch != self.epoch:
            self._close()
            self.epoch = epoch
        self.result.steps += 1
        self.result.epoch_steps[-1] += 1

    def _close(self):
        if self.epoch is not None:
            _sync()
            now = time.perf_counter()
            self.result.epoch_seconds.append(now - self.start)
            self.start = now
        self.result.epoch_steps.append(0)

    def stop(self):
        _sync()
        now = time.perf_counter()
        self.result.epoch_seconds.append(now - self.start)
        self.result.seconds = now - self.t0


def _batches(n: int, batch_size: int, epochs: int, seed: int, max_steps: int | None):
    """(epoch, indices of the batch) for each step."""
    gen = torch.Generator().manual_seed(seed)
    steps = 0
    for epoch in range(epochs):
        perm = torch.randperm(n, generator=gen)
        for i in range(0, n, batch_size):
            yield epoch, perm[i:i + batch_size]
            steps += 1
            if max_steps is not None and steps >= max_steps:
                return


def _sync():
    cl.sync()


def train(arch: Architecture, data, *, epochs: int = 5, batch_size: int = 64, lr: float = 0.05,
          momentum: float = 0.9, seed: int = 0, max_steps: int | None = None, params: dict | None = None,
          fused: bool = True) -> tuple:
    """SGD with momentum on cross-entropy, every op ours: (params, TrainResult). The batches come
    from `seed`, the same as train_torch's with the same seed."""
    params = init(arch, seed) if params is None else params
    velocity = {k: torch.zeros_like(v) for k, v in params.items()}
    dev = next(iter(params.values())).device
    x_train, y_train = data.x_train.to(dev), data.y_train.to(dev)
    result = TrainResult()
    clock = _EpochClock(result)
    step_losses = []
    for epoch, idx in _batches(len(y_train), batch_size, epochs, seed, max_steps):
        clock.step(epoch)
        idx = idx.to(dev)
        logits, tape = forward(arch, params, x_train[idx], keep=True, fused=fused)
        loss, grads = backward(arch, params, tape, y_train[idx])
        for k, p in params.items():
            ops.sgd_momentum(p, grads[k], velocity[k], lr=lr, momentum=momentum)
        step_losses.append((ops.channel_sum(loss.view(1, 1, -1)), len(idx)))   # read back after the timing
    clock.stop()
    result.losses = [float(total[0]) / n for total, n in step_losses]
    result.test_accuracy = accuracy(arch, params, data.x_test, data.y_test)
    return params, result


def train_torch(arch: Architecture, data, *, epochs: int = 5, batch_size: int = 64, lr: float = 0.05,
                momentum: float = 0.9, seed: int = 0, max_steps: int | None = None) -> tuple:
    """The same training in torch (same initial weights, same batches, torch.optim.SGD): (model, TrainResult).
    Strict fp32 (TF32 off, as our kernels compute) with cudnn.benchmark on."""
    with TorchAtItsBest():
        return _train_torch(arch, data, epochs, batch_size, lr, momentum, seed, max_steps)


def _train_torch(arch, data, epochs, batch_size, lr, momentum, seed, max_steps):
    torch.manual_seed(seed)
    dev = _device()
    model = torch_model(arch).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    x_train, y_train = data.x_train.to(dev), data.y_train.to(dev)
    result = TrainResult()
    clock = _EpochClock(result)
    step_losses = []
    for epoch, idx in _batches(len(y_train), batch_size, epochs, seed, max_steps):
        clock.step(epoch)
        idx = idx.to(dev)
        loss = F.cross_entropy(model(x_train[idx]), y_train[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step_losses.append(loss.detach())
    clock.stop()
    result.losses = [float(v) for v in step_losses]
    with torch.no_grad():
        model.eval()
        result.test_accuracy = _accuracy_of(lambda xb: model(xb), data.x_test, data.y_test, dev)
    return model, result


def accuracy(arch: Architecture, params: dict, x, y, batch_size: int = 500) -> float:
    """The share of images whose largest logit (our forward) is the label's."""
    dev = next(iter(params.values())).device
    return _accuracy_of(lambda xb: forward(arch, params, xb), x, y, dev, batch_size)


def _accuracy_of(f, x, y, dev, batch_size: int = 500) -> float:
    correct = 0
    for i in range(0, len(y), batch_size):
        correct += int((f(x[i:i + batch_size].to(dev)).argmax(1).cpu() == y[i:i + batch_size]).sum())
    return correct / max(1, len(y))


# ---- end to end: copy in, layers, copy out -----------------------------------------------------------

def _chunk_sizes(chunks, n: int) -> list:
    """Images per chunk: `chunks` equal chunks (an int), or the sizes themselves (a list)."""
    if isinstance(chunks, int):
        if not 1 <= chunks <= n:
            raise ValueError(f"chunks={chunks}: between 1 and the batch size {n}")
        step = -(-n // chunks)
        return [min(step, n - b0) for b0 in range(0, n, step)]
    sizes = [int(c) for c in chunks]
    if not sizes or min(sizes) < 1 or sum(sizes) != n:
        raise ValueError(f"chunks={chunks}: positive chunk sizes that add up to the batch size {n}")
    return sizes


def graded_chunks(n: int, first: int, ratio: float) -> list:
    """Chunk sizes for a pipeline whose ends cost least: the first chunk small (its copy is time
    nothing overlaps), then each chunk `ratio` times the one before, ratio being compute time over
    copy time per image (clipped to 1/2..2). So while chunk i computes, the copy of chunk i+1 (ratio
    times as many images, each copied ratio times faster than it is computed) just finishes: the
    compute stream never waits, and no more chunks are made than that takes. With ratio < 1 (copy
    the longer) the same sizes come in reverse, shrinking: then the end nothing overlaps is the
    last chunk's compute, and `first` is that last chunk's size."""
    if not 1 <= first <= n:
        raise ValueError(f"first={first}: between 1 and the batch size {n}")
    ratio = min(2.0, max(0.5, float(ratio)))
    if ratio < 1:
        return graded_chunks(n, first, 1 / ratio)[::-1]
    sizes, size = [], float(first)
    while sum(sizes) + max(1, round(size)) < n:
        sizes.append(max(1, round(size)))
        size *= ratio
    rest = n - sum(sizes)
    if sizes and rest < sizes[-1] / 2:    # a last chunk much smaller than its neighbour: merge it
        sizes[-1] += rest
    else:
        sizes.append(rest)
    return sizes


def tapered_chunks(n: int, k: int) -> list:
    """Chunk sizes in proportion 1, 2, ..., k, ..., 2, 1 (2k-1 chunks, n/k² images per step): small
    at both ends, where nothing overlaps (the first chunk's copy in, the last chunk's compute and
    copy out), large in the middle, where each kernel gets a big batch to run efficiently."""
    if k < 1 or n < k * k:
        raise ValueError(f"k={k}: need k >= 1 and at least k² = {k * k} images, got {n}")
    weights = list(range(1, k + 1)) + list(range(k - 1, 0, -1))
    sizes = [int(n * w / (k * k)) for w in weights]
    sizes[k - 1] += n - sum(sizes)          # what rounding left over: to the middle chunk
    return sizes


class Pipeline:
    """Inference end to end, as the class projects timed it: the batch copied from host memory to
    the GPU, the network, the logits copied back. Device buffers are allocated once, here.

        p = Pipeline(lambda xb, out: forward(arch, params, xb, logits=out), x_host, classes=10, chunks=8)
        logits = p.run()          # p.spans: (stream, chunk, start_ms, end_ms); p.wall_ms

    chunks=1 runs everything in order on the caller's current stream. More chunks (a number of
    equal ones, or a list of sizes such as graded_chunks') split the batch and overlap: the copies
    in run on a stream of their own, the copies out on another, the compute
    on the caller's current stream (where the course's kernels launch, as torch's ops do), each
    chunk's compute waiting for its copy in (an event) and its copy out for its compute, so chunk
    i+1 travels while chunk i computes. The copies are asynchronous only from pinned memory
    (x_host.pin_memory()): from pageable memory the driver stages them through a pinned buffer of
    its own, and they do not overlap. The logits come back to pinned memory when x_host is pinned.

    forward(xb, out) must write the logits of the images xb into out. Spans come from CUDA events
    per stream (ms from the first copy's start); on the emulator (no streams) from the wall clock,
    run in the same order.
    """

    def __init__(self, forward, x_host, *, classes: int = 10, chunks=1):
        if x_host.device.type != "cpu":
            raise ValueError("x_host must be in host memory (a CPU tensor): the pipeline times its copy to the device")
        self.forward, self.x_host, self.gpu = forward, x_host, cl.backend() == "cuda"
        n = int(x_host.shape[0])
        sizes = _chunk_sizes(chunks, n)
        ends = [sum(sizes[:i + 1]) for i in range(len(sizes))]
        self.bounds = [(e - s, e) for s, e in zip(sizes, ends)]
        dev = _device()
        self.x_dev = torch.empty(x_host.shape, dtype=x_host.dtype, device=dev)
        self.out_dev = torch.empty((n, classes), device=dev)
        self.out_host = torch.empty((n, classes), pin_memory=self.gpu and x_host.is_pinned())
        self.spans, self.wall_ms = [], float("nan")
        if self.gpu and len(self.bounds) > 1:
            self.streams = {"copy in": torch.cuda.Stream(), "copy out": torch.cuda.Stream()}

    def run(self):
        if self.gpu:
            self._run_gpu()
        else:
            self._run_host()
        return self.out_host

    def _run_host(self):
        self.spans = []
        t00 = time.perf_counter()

        def span(name, i, f):
            t0 = time.perf_counter()
            f()
            self.spans.append((name, i, 1e3 * (t0 - t00), 1e3 * (time.perf_counter() - t00)))

        for i, (b0, b1) in enumerate(self.bounds):
            span("copy in", i, lambda: self.x_dev[b0:b1].copy_(self.x_host[b0:b1]))
            span("compute", i, lambda: self.forward(self.x_dev[b0:b1], self.out_dev[b0:b1]))
            span("copy out", i, lambda: self.out_host[b0:b1].copy_(self.out_dev[b0:b1]))
        self.wall_ms = 1e3 * (time.perf_counter() - t00)

    def _run_gpu(self):
        ev = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731
        compute = torch.cuda.current_stream()
        overlap = len(self.bounds) > 1
        s_in = self.streams["copy in"] if overlap else compute
        s_out = self.streams["copy out"] if overlap else compute
        nb = self.x_host.is_pinned()         # asynchronous copies only from pinned memory
        marks = []
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        start = ev()
        start.record(compute)
        for i, (b0, b1) in enumerate(self.bounds):
            e = [ev() for _ in range(6)]
            s_in.wait_event(start)
            with torch.cuda.stream(s_in):
                e[0].record(s_in)
                self.x_dev[b0:b1].copy_(self.x_host[b0:b1], non_blocking=nb)
                e[1].record(s_in)
            compute.wait_event(e[1])
            e[2].record(compute)
            self.forward(self.x_dev[b0:b1], self.out_dev[b0:b1])
            e[3].record(compute)
            s_out.wait_event(e[3])
            with torch.cuda.stream(s_out):
                e[4].record(s_out)
                self.out_host[b0:b1].copy_(self.out_dev[b0:b1], non_blocking=nb)
                e[5].record(s_out)
            marks.append(e)
        torch.cuda.synchronize()
        self.wall_ms = 1e3 * (time.perf_counter() - t0)
        self.spans = [(name, i, start.elapsed_time(e[a]), start.elapsed_time(e[b]))
                      for i, e in enumerate(marks)
                      for name, a, b in (("copy in", 0, 1), ("compute", 2, 3), ("copy out", 4, 5))]

    def totals(self) -> dict:
        """Busy ms per stream (the sum of its spans) and the span of the whole run (first start to
        last end, from the events), beside the wall time."""
        out = {}
        for name, _, a, b in self.spans:
            out[name] = out.get(name, 0.0) + (b - a)
        out["timeline"] = max(b for *_, b in self.spans) - min(a for _, _, a, _ in self.spans)
        out["wall"] = self.wall_ms
        return out


# ---- measuring: conv stages and whole networks, checked before they are timed ------------------------

STAGE_TORCH = "torch: conv + bias + act + pool (cuDNN, NCHW)"
NETWORK_TORCH = "torch (cuDNN, NCHW)"


def torch_stage(x, w, b, padding: int, act: str, pool: str):
    """conv + bias + activation + pooling in torch: the reference and torch's contender."""
    a = _torch_act(F.conv2d(x, w, b, padding=padding), act)
    return {"max": lambda t: F.max_pool2d(t, 2), "avg": lambda t: F.avg_pool2d(t, 2), "none": lambda t: t}[pool](a)


class TorchAtItsBest:
    """torch at its best in this process: cudnn.benchmark on and TF32 off inside the block."""
    def __enter__(self):
        self._strict = strict_fp32(benchmark=True)
        self._strict.__enter__()

    def __exit__(self, *exc):
        return self._strict.__exit__(*exc)


def measure_stages(impls, workloads, *, act: str = "relu", pool: str = "max", reps: int = 20,
                   torch_too: bool = True):
    """Check each conv-stage implementation (ops.layers' Impl records) on each layer against the
    fp64 stage on sampled images, then time it (measure.time_impl); torch's stage beside them,
    timed in this process with cudnn.benchmark on. Rows of convlab.measuring.results' schema (no roofline
    floor: a stage writes a pooled output, not the conv's). On the emulator: the small twins,
    checked, nothing timed for a figure."""
    gpu = cl.backend() == "cuda"
    rows = []
    for full in workloads:
        wl = full if gpu else full.small()
        x, w, b = cl.randn(*wl.x_shape), cl.randn(*wl.w_shape), cl.randn(wl.M)
        idx = measure.sample_images(wl.B)
        ref = torch_stage(x[idx].double(), w.double(), b.double(), wl.padding, act, pool)
        for impl in impls:
            if not impl.applies(wl):
                continue
            fn = (lambda impl=impl: impl(x, w, padding=wl.padding, bias=b, act=act, pool=pool, **impl.config(wl)))
            cl.check(fn()[idx], ref, name=f"{impl.name} on {wl.name}")
            rows.append(results.row(wl, impl.name, measure.time_impl(fn, reps)))
        if gpu and torch_too:
            with TorchAtItsBest():
                fn = lambda: torch_stage(x, w, b, wl.padding, act, pool)  # noqa: E731
                cl.check(fn()[idx], ref, name=f"torch's stage on {wl.name}")
                rows.append(results.row(wl, STAGE_TORCH, measure.time_impl(fn, reps), kind="torch"))
        del x, w, b
    return results.frame(rows)


def measure_networks(arch: Architecture, batches, *, reps: int = 10, torch_too: bool = True, seed: int = 0):
    """The whole forward pass (images already on the device, logits left there) for each batch
    size: ours with fused stages, ours with the separate epilogue, and torch (in this process,
    cudnn.benchmark on, TF32 off); each checked against the fp64 torch network on sampled images
    first. Rows of convlab.measuring.results' schema, workload "<arch.key>", shape "B=..., whole network"."""
    params = init(arch, seed)
    model = load_into(torch_model(arch), params).to(_device())
    model64 = load_into(torch_model(arch), params).to(_device()).double()
    rows = []
    for B in batches:
        x = cl.randn(B, 1, arch.image_size, arch.image_size)
        idx = measure.sample_images(B)
        with torch.no_grad():
            ref = model64(x[idx].double())
        wl = arch.conv_workloads(B)[0]
        label = {"workload": arch.key, "shape": f"B={B}, whole network forward"}
        contenders = [("ours: fused stages", lambda: forward(arch, params, x, fused=True)),
                      ("ours: separate epilogue", lambda: forward(arch, params, x, fused=False))]
        for name, fn in contenders:
            cl.check(fn()[idx], ref, name=f"{name}, {arch.name}, B={B}")
            rows.append({**results.row(wl, name, measure.time_impl(fn, reps)), **label})
        if torch_too and cl.backend() == "cuda":
            with torch.no_grad(), TorchAtItsBest():
                fn = lambda: model(x)  # noqa: E731
                cl.check(fn()[idx], ref, name=f"torch, {arch.name}, B={B}")
                rows.append({**results.row(wl, NETWORK_TORCH, measure.time_impl(fn, reps), kind="torch"), **label})
        del x
    return results.frame(rows)


def occupancy(registers: int | None, block: int, shared: int = 0) -> float:
    """The share of an SM's thread slots a kernel can fill, from its registers per thread, block
    size and shared memory per block, with this GPU's limits (registers allocated per warp in
    steps of 256). NaN on the emulator, which has no registers to count."""
    if registers is None or cl.backend() != "cuda":
        return float("nan")
    b = runtime.backend_impl()
    a = b.drv.device_attribute
    regs_sm = b.dev.get_attribute(a.MAX_REGISTERS_PER_MULTIPROCESSOR)
    threads_sm = b.dev.get_attribute(a.MAX_THREADS_PER_MULTIPROCESSOR)
    shared_sm = b.dev.get_attribute(a.MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)
    # CUDA 11's attribute; an older PyCUDA lacks it: 32, the limit of every GPU since Volta
    has_blocks = hasattr(a, "MAX_BLOCKS_PER_MULTIPROCESSOR")
    blocks_sm = b.dev.get_attribute(a.MAX_BLOCKS_PER_MULTIPROCESSOR) if has_blocks else 32
    warps = -(-block // 32)
    regs_per_warp = -(-registers * 32 // 256) * 256
    blocks = min(regs_sm // (regs_per_warp * warps), threads_sm // block, blocks_sm,
                 shared_sm // shared if shared else blocks_sm)
    return blocks * block / threads_sm
