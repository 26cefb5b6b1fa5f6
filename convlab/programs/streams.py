"""Streams, events and pinned copies, recorded (chapter 10's step 6, exercise 10.2).

The emulator has no streams: it runs every operation the moment it is called. So a schedule is
written against a Recorder, whose calls mirror torch.cuda's, and the Recorder keeps what was
issued: each copy (which way, how many images and bytes, from pinned or pageable memory), each
network compute, on which stream, after which events and synchronizations.

    g = streams.Recorder(forward, classes=10)    # forward(xb, out): the logits of images xb into out
    x_host = g.pinned(images)                     # page-locked (on a GPU: images.pin_memory())
    x_dev, out_dev = g.empty(images.shape), g.empty((n, 10))     # device memory
    out_host = g.host_empty((n, 10), pinned=True)
    s = g.stream()                                # torch.cuda.Stream()
    with g.on(s):                                 # torch.cuda.stream(s)
        g.copy(x_dev[a:b], x_host[a:b])           # x_dev[a:b].copy_(x_host[a:b], non_blocking=True)
        g.forward(x_dev[a:b], out_dev[a:b])
        g.copy(out_host[a:b], out_dev[a:b])
    e = g.event(); e.record(s); s2.wait_event(e)  # as torch.cuda.Event
    g.synchronize()                               # torch.cuda.synchronize(); s.synchronize() too

On the emulator each call runs at once, in the order issued (the right result whenever the
schedule orders what it must). On a GPU the calls are the real ones, on real streams. Either way
the record gives:

- races (Recorder.problems): an operation that reads device memory another stream writes, with
  no stream order, event or synchronization between them, or that reads memory nothing has
  written yet; and logits the host reads before their copy back is known to be done;
- a model time (Model.time): what the schedule would take on the GPU of chapter 10's committed
  run, from that run's measured copy and compute times.

The model (Model.from_chapter): each operation takes a fixed cost per call plus a cost per image,
fitted to chapter 10's runs of the class project's network on 10,000 images (pinned, then 2, 4, 8
and 16 equal chunks on streams: each stream's busy time against its number of chunks). A copy
from pageable memory takes the pageable run's time per image and blocks the host until it is
done (the driver copies through a pinned buffer of its own), so nothing the host issues after it
can start earlier. One copy engine each way and one compute at a time (a chunk's kernels fill
the GPU); an operation starts when the host has issued it, its stream's previous operation and
every event it waits for are done, and its engine is free. Issuing costs the host nothing. A
schedule of B images is scaled to the chapter's batch: each operation's images times 10,000 / B.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from ..gpu import runtime
from ..gpu._paths import path
from .network import CLASS_PROJECT     # the network of the chapter's runs, float32

#: chapter 10's end-to-end runs (H200): the model's data
E2E_FILE = "book/data/details/10_network_end_to_end.csv"
#: the batch of chapter 10's runs: a recorded schedule of B images is scaled to it
CHAPTER_IMAGES = 10_000
KINDS = ("copy in", "compute", "copy out")


@dataclass
class Stream:
    """A stream of the record: operations on it run one after the other, in the order issued."""
    name: str
    cuda: object = None                 # torch.cuda.Stream on a GPU
    frontier: int = 0                   # ops (bits) that come before the stream's next op
    recorder: object = field(default=None, repr=False)

    def wait_event(self, event: "Event") -> None:
        """Everything issued to this stream from now on waits for what `event` recorded."""
        self.frontier |= event.ops
        if self.cuda is not None:
            self.cuda.wait_event(event.cuda)

    def synchronize(self) -> None:
        """The host waits until everything issued to this stream is done."""
        self.recorder._host_sync(self.frontier, f"{self.name}.synchronize()")
        if self.cuda is not None:
            self.cuda.synchronize()

    def __repr__(self) -> str:
        return f"<stream {self.name}>"


@dataclass
class Event:
    """A marker in a stream: record(s) captures what s has been given so far."""
    recorder: "Recorder"
    name: str
    cuda: object = None
    ops: int = 0

    def record(self, stream: Stream | None = None) -> None:
        s = stream if stream is not None else self.recorder.current
        self.ops = s.frontier
        if self.cuda is not None:
            self.cuda.record(s.cuda)

    def synchronize(self) -> None:
        self.recorder._host_sync(self.ops, f"{self.name}.synchronize()")
        if self.cuda is not None:
            self.cuda.synchronize()


@dataclass
class Op:
    """One issued operation: a copy, a compute or a host synchronization."""
    index: int
    kind: str                 # "copy in", "compute", "copy out" or "synchronize"
    stream: Stream | None
    images: int = 0
    nbytes: int = 0
    pinned: bool = True       # a copy's host memory is page-locked
    before: int = 0           # ops (bits) ordered before this one
    what: str = ""
    cuda_events: tuple = ()

    @property
    def pageable(self) -> bool:
        return self.kind in ("copy in", "copy out") and not self.pinned


def _bits(mask: int):
    i = 0
    while mask:
        if mask & 1:
            yield i
        mask >>= 1
        i += 1


class Recorder:
    """Issues and records a schedule of copies and computes on streams (module docstring).
    classes: the logits per image; forward(xb, out) computes the images xb into out."""

    def __init__(self, forward, *, classes: int = 10):
        self._forward, self.classes = forward, classes
        self.gpu = runtime.backend() == "cuda"
        self.ops: list[Op] = []
        self.problems: list[str] = []
        self._memory: dict[int, str] = {}           # storage address -> "device", "pinned"
        self._writes: list[tuple] = []              # (op index, region)
        self._reads: list[tuple] = []
        self._host_known = 0                        # ops the host knows are done
        self._streams: list[Stream] = []
        self._events = 0
        self.default = self._new_stream("the default stream",
                                        torch.cuda.current_stream() if self.gpu else None)
        self.current = self.default

    # ---- memory ------------------------------------------------------------------------------
    def _register(self, t: torch.Tensor, where: str) -> torch.Tensor:
        self._memory[t.untyped_storage().data_ptr()] = where
        return t

    def empty(self, shape, dtype=torch.float32) -> torch.Tensor:
        """Device memory (NaN until something is written: on the emulator, a CPU tensor)."""
        dev = "cuda" if self.gpu else "cpu"
        t = torch.full(tuple(shape), float("nan"), dtype=dtype, device=dev)
        if self.gpu:        # the fill runs on the current stream: done before any other stream writes t
            torch.cuda.synchronize()
        return self._register(t, "device")

    def pinned(self, t: torch.Tensor) -> torch.Tensor:
        """A page-locked copy of the host tensor t (t.pin_memory())."""
        return self._register(t.pin_memory() if self.gpu else t.clone(), "pinned")

    def host_empty(self, shape, *, pinned: bool = False, dtype=torch.float32) -> torch.Tensor:
        """Host memory, page-locked or pageable, NaN until something is written."""
        t = torch.empty(tuple(shape), dtype=dtype, pin_memory=pinned and self.gpu).fill_(float("nan"))
        return self._register(t, "pinned") if pinned else t

    def where(self, t: torch.Tensor) -> str:
        """"device", "pinned" or "pageable": where t's memory is."""
        if self.gpu:        # a GPU knows: pinned however it was made (g.pinned or t.pin_memory())
            return "device" if t.is_cuda else "pinned" if t.is_pinned() else "pageable"
        return self._memory.get(t.untyped_storage().data_ptr(), "pageable")

    @staticmethod
    def _region(t: torch.Tensor) -> tuple:
        size = t.element_size()
        first = t.storage_offset()
        last = first + sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if n > 0)
        return t.untyped_storage().data_ptr(), first * size, (last + 1) * size if t.numel() else first * size

    # ---- streams and events ------------------------------------------------------------------
    def _new_stream(self, name: str, cuda=None) -> Stream:
        s = Stream(name, cuda, recorder=self)
        self._streams.append(s)
        return s

    def stream(self) -> Stream:
        """A new stream (torch.cuda.Stream())."""
        return self._new_stream(f"stream {len(self._streams)}", torch.cuda.Stream() if self.gpu else None)

    def event(self) -> Event:
        """A new event (torch.cuda.Event())."""
        self._events += 1
        return Event(self, f"event {self._events}", torch.cuda.Event() if self.gpu else None)

    @contextlib.contextmanager
    def on(self, stream: Stream):
        """Issue to `stream` inside the block (torch.cuda.stream(stream))."""
        if not isinstance(stream, Stream):
            raise TypeError(f"g.on takes a stream from g.stream(), not {type(stream).__name__}")
        before, self.current = self.current, stream
        try:
            if stream.cuda is not None:
                with torch.cuda.stream(stream.cuda):
                    yield stream
            else:
                yield stream
        finally:
            self.current = before

    def synchronize(self) -> None:
        """The host waits until everything issued so far is done (torch.cuda.synchronize())."""
        self._host_sync((1 << len(self.ops)) - 1, "g.synchronize()")
        if self.gpu:
            torch.cuda.synchronize()

    def _host_sync(self, ops: int, what: str) -> None:
        self.ops.append(Op(len(self.ops), "synchronize", None, before=ops, what=what))
        self._host_known |= ops | (1 << (len(self.ops) - 1))

    # ---- operations --------------------------------------------------------------------------
    def _issue(self, kind: str, images: int, nbytes: int, pinned: bool, what: str, reads, writes, run):
        s = self.current
        op = Op(len(self.ops), kind, s, images, nbytes, pinned, s.frontier | self._host_known, what)
        self._check(op, reads, writes)
        if self.gpu:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            op.cuda_events = (start, end)
        else:
            run()
        self.ops.append(op)
        bit = 1 << op.index
        s.frontier = op.before | bit
        if op.pageable:     # the host waits for a copy from or to pageable memory
            self._host_known |= op.before | bit
        self._reads += [(op.index, r) for r in reads]
        self._writes += [(op.index, r) for r in writes]
        return op

    def _check(self, op: Op, reads, writes) -> None:
        """Races: what op reads must be written before it, in order; what it writes must not be
        read or written by anything unordered with it."""
        def unordered(i):
            return not (op.before >> i) & 1

        for r in reads:
            writers = [i for i, w in self._writes if _overlap(r, w)]
            if not writers and self._memory.get(r[0]) == "device":
                self.problems.append(f"{op.what} reads device memory that nothing has been written into "
                                     f"yet: issue it after the operation that fills it")
            for i in writers:
                if unordered(i):
                    self.problems.append(f"{op.what} ({op.stream.name}) reads what {self.ops[i].what} "
                                         f"({self.ops[i].stream.name}) writes, with nothing ordering the two: "
                                         f"it may run first. Issue both on one stream, or record an event "
                                         f"after the first and make the second's stream wait for it")
        for r in writes:
            for i, _ in [(i, w) for i, w in self._writes + self._reads if _overlap(r, w)]:
                if unordered(i):
                    self.problems.append(f"{op.what} ({op.stream.name}) overwrites memory that "
                                         f"{self.ops[i].what} ({self.ops[i].stream.name}) uses, with nothing "
                                         f"ordering the two")

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> Op:
        """dst.copy_(src, non_blocking=True) between host and device memory, on the current stream.
        From or to pageable host memory the host waits until the copy is done."""
        s_where, d_where = self.where(src), self.where(dst)
        if (s_where == "device") == (d_where == "device"):
            raise ValueError(f"g.copy copies between host and device memory: here from {s_where} to {d_where} "
                             f"memory (device memory comes from g.empty)")
        if tuple(dst.shape) != tuple(src.shape):
            raise ValueError(f"g.copy: dst has shape {tuple(dst.shape)}, src {tuple(src.shape)}")
        kind = "copy in" if d_where == "device" else "copy out"
        host = src if kind == "copy in" else dst
        pinned = self.where(host) == "pinned"
        n = int(dst.shape[0]) if dst.dim() else 1
        what = f"the {kind} of {_rows(dst)}"
        nb = pinned and self.gpu
        return self._issue(kind, n, dst.numel() * dst.element_size(), pinned, what,
                           [self._region(src)], [self._region(dst)], lambda: dst.copy_(src, non_blocking=nb))

    def forward(self, xb: torch.Tensor, out: torch.Tensor) -> Op:
        """The network on the images xb (device memory), its logits into out (device memory)."""
        for name, t in (("xb", xb), ("out", out)):
            if self.where(t) != "device":
                raise ValueError(f"g.forward computes on the device: {name} is in host memory (copy it into "
                                 f"device memory from g.empty first)")
        return self._issue("compute", int(xb.shape[0]), 0, True, f"the compute of {_rows(xb)}",
                           [self._region(xb)], [self._region(out)], lambda: self._forward(xb, out))

    def unfinished(self, t: torch.Tensor) -> list:
        """The operations writing t that the host does not know are done (it may read t too early)."""
        r = self._region(t)
        return [self.ops[i] for i, w in self._writes if _overlap(r, w) and not (self._host_known >> i) & 1]

    # ---- what the record says ----------------------------------------------------------------
    def streams_used(self) -> set:
        return {op.stream.name for op in self.ops if op.kind in KINDS}

    def syncs_inside(self) -> list:
        """Host synchronizations issued before the last copy or compute (inside the loop)."""
        last = max((op.index for op in self.ops if op.kind in KINDS), default=-1)
        return [op for op in self.ops if op.kind == "synchronize" and op.index < last]

    def measured(self) -> dict:
        """On a GPU, after a synchronize: (kind, start ms, end ms) of each op from its CUDA events,
        from the first op's start."""
        timed = [op for op in self.ops if op.cuda_events]
        if not timed:
            return {}
        t0 = timed[0].cuda_events[0]
        return {op.index: (op.kind, t0.elapsed_time(op.cuda_events[0]), t0.elapsed_time(op.cuda_events[1]))
                for op in timed}


def _overlap(a: tuple, b: tuple) -> bool:
    return a[0] == b[0] and a[1] < b[2] and b[1] < a[2]


def _rows(t: torch.Tensor) -> str:
    """Which images a slice along the batch holds, as a student wrote it (x[a:b])."""
    n = int(t.shape[0]) if t.dim() else 1
    row = t.storage_offset() // max(1, t.stride(0)) if t.dim() else 0
    return f"images {row}..{row + n - 1}" if n > 1 else f"image {row}"


@dataclass
class Model:
    """Each operation's time on the chapter's GPU: per_call + per_image * images (ms), per kind;
    pageable copies at their own rate per image. From chapter 10's committed run (from_chapter)."""
    per_call: dict
    per_image: dict
    pageable_per_image: dict
    longer_ms: float          # max(copy in + copy out, compute) of the pinned run: the bound
    gpu: str
    rows: object = field(default=None, repr=False)
    bytes_per_image: dict = field(default_factory=dict)    # what each copy moves per image

    def gb_per_s(self, kind: str) -> float:
        """A copy's bandwidth in the model (GB/s): its bytes per image over its time per image."""
        return self.bytes_per_image[kind] / (self.per_image[kind] * 1e-3) / 1e9

    @classmethod
    def from_chapter(cls, who: str = "ours") -> "Model":
        import numpy as np
        import pandas as pd

        df = pd.read_csv(path(E2E_FILE))
        df = df[df["who"] == who]
        equal = df[df["mode"].eq("pinned") | df["mode"].str.fullmatch(r"streams, \d+ chunks")]
        per_call, per_image, pageable = {}, {}, {}
        for kind in KINDS:
            col = f"{kind} ms"
            # busy ms of the stream = chunks * per_call + images * per_image
            a = np.column_stack([equal["chunks"], equal["images"]]).astype(float)
            (c, i), *_ = np.linalg.lstsq(a, equal[col].to_numpy(float), rcond=None)
            per_call[kind], per_image[kind] = max(float(c), 0.0), float(i)
            page = df[df["mode"] == "pageable"].iloc[0]
            pageable[kind] = (float(page[col]) - per_call[kind]) / float(page["images"])
        pinned = df[df["mode"] == "pinned"].iloc[0]
        longer = max(pinned["copy in ms"] + pinned["copy out ms"], pinned["compute ms"])
        moved = {"copy in": 4 * CLASS_PROJECT.image_size ** 2, "copy out": 4 * CLASS_PROJECT.classes}
        return cls(per_call, per_image, pageable, float(longer), str(pinned["gpu"]), equal, moved)

    def duration(self, op: Op, scale: float) -> float:
        rate = self.pageable_per_image if op.pageable else self.per_image
        return self.per_call[op.kind] + rate[op.kind] * op.images * scale

    def timeline(self, ops, images: int) -> list:
        """(op, start ms, end ms) of each copy and compute of a record of `images` images, scaled to
        the chapter's batch (module docstring: what the model assumes)."""
        scale = CHAPTER_IMAGES / images
        end, engine, host, out = {}, dict.fromkeys(KINDS, 0.0), 0.0, []
        for op in ops:
            after = max((end[i] for i in _bits(op.before) if i in end), default=0.0)
            if op.kind == "synchronize":
                host = max(host, after)
                end[op.index] = host
                continue
            start = max(host, after, engine[op.kind])
            end[op.index] = engine[op.kind] = start + self.duration(op, scale)
            if op.pageable:
                host = end[op.index]
            out.append((op, start, end[op.index]))
        return out

    def time(self, ops, images: int) -> float:
        """The model's time (ms) of a record of `images` images, at the chapter's batch."""
        spans = self.timeline(ops, images)
        return max((e for _, _, e in spans), default=0.0) - min((s for _, s, _ in spans), default=0.0)

    def against_chapter(self):
        """The model beside chapter 10's measured wall times, for its pinned and equal-chunk runs, and
        each measured time over the longer of copy and compute (longer_ms)."""
        import pandas as pd

        rows = []
        for _, r in self.rows.iterrows():
            n, k = int(r["images"]), int(r["chunks"])
            ops = _plan_ops(n, k)
            rows.append({"plan": r["mode"], "measured ms": float(r["wall ms"]),
                         "model ms": self.time(ops, n)})
        df = pd.DataFrame(rows)
        df["model / measured"] = df["model ms"] / df["measured ms"]
        df["measured / longer"] = df["measured ms"] / self.longer_ms
        return df


def _plan_ops(n: int, chunks: int) -> list:
    """The ops of chapter 10's Pipeline for n images in `chunks` equal chunks (copies in on one
    stream, computes on another, copies out on a third, events between), for Model.against_chapter."""
    s_in, s_c, s_out = Stream("copy in"), Stream("compute"), Stream("copy out")
    ops, step = [], -(-n // chunks)
    for b0 in range(0, n, step):
        b = min(step, n - b0)
        for kind, s, waits in (("copy in", s_in, None), ("compute", s_c, s_in), ("copy out", s_out, s_c)):
            if waits is not None:
                s.frontier |= waits.frontier
            op = Op(len(ops), kind, s, b, before=s.frontier)
            ops.append(op)
            s.frontier = op.before | (1 << op.index)
    return ops
