"""A LeNet-5 style network trained end to end with the course's kernels (chapter 8).

    from convlab.programs import lenet
    data = lenet.load_digits()                         # scikit-learn's bundled 8x8 digits: no network
    data = lenet.load_fashion_mnist("~/data/fashion")  # the IDX files, gzipped or raw, if you have them
    ours, theirs = lenet.twins(data.image_size, seed=0)   # same architecture, same initial weights
    r1 = lenet.train(ours, data, epochs=3)             # r1.losses (per step), r1.test_accuracy, ...
    r2 = lenet.train(theirs, data, epochs=3)

The network: conv -> activation -> pool -> conv -> activation -> pool -> linear -> activation ->
linear -> activation -> linear. Its two convolutions are the drop-in convlab.ops.dropin.Conv2d (the
kernels the dispatcher routes each pass to: convlab.ops.dispatch.forward_impl, dx_impl and dw_impl
say which) or torch's nn.Conv2d;
everything else (activations, pooling, linear layers, loss, optimiser) is torch in both, so any
difference between the twins is the convolutions'. The tensors live where the active convlab
backend puts them: on the GPU with the cuda backend, on the CPU with the emulator.
"""
from __future__ import annotations

import gzip
import os
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import convlab as cl

from ..ops import dropin

# (kernel size, padding) of the two convolutions, and the hidden widths, by input size
ARCHITECTURES = {
    8: {"convs": ((3, 1), (3, 1)), "hidden": (120, 84)},     # 8 -> 8 -> 4 -> 4 -> 2: 16*2*2 = 64 features
    28: {"convs": ((5, 2), (5, 0)), "hidden": (120, 84)},    # LeNet-5: 28 -> 28 -> 14 -> 10 -> 5: 400 features
}


def _device():
    return torch.device(cl.device().torch_device)


# ---- the network -----------------------------------------------------------------------------------

class LeNet5(nn.Module):
    """LeNet-5 style: two (conv, activation, 2x2 pool) stages, then three linear layers.

    conv="course" uses the drop-in Conv2d (the course's kernels), conv="torch" uses nn.Conv2d.
    image_size 8 (the digits) or 28 (Fashion-MNIST) picks the masks and padding (ARCHITECTURES).
    activation "tanh" (LeNet-5's) or "relu"; pool "max" or "avg" (LeNet-5 averaged). With torch's
    default initialisation, tanh trains the digits faster and more steadily (20 epochs of SGD at lr
    0.05: 98% test accuracy; relu 93%, and relu at lr 0.1 diverged).
    """

    def __init__(self, conv: str = "course", image_size: int = 28, in_channels: int = 1, num_classes: int = 10,
                 channels=(6, 16), activation: str = "tanh", pool: str = "max"):
        super().__init__()
        if conv not in ("course", "torch"):
            raise ValueError(f"conv must be 'course' or 'torch', got {conv!r}")
        if image_size not in ARCHITECTURES:
            raise ValueError(f"image_size {image_size}: known sizes are {sorted(ARCHITECTURES)}")
        if activation not in ("relu", "tanh") or pool not in ("max", "avg"):
            raise ValueError("activation must be 'relu' or 'tanh', pool 'max' or 'avg'")
        arch = ARCHITECTURES[image_size]
        (k1, p1), (k2, p2) = arch["convs"]
        make = dropin.Conv2d if conv == "course" else nn.Conv2d
        self.conv_kind, self.image_size, self.activation, self.pool = conv, image_size, activation, pool
        self.conv1 = make(in_channels, channels[0], k1, stride=1, padding=p1)
        self.conv2 = make(channels[0], channels[1], k2, stride=1, padding=p2)
        side = ((image_size + 2 * p1 - k1 + 1) // 2 + 2 * p2 - k2 + 1) // 2
        h1, h2 = arch["hidden"]
        self.fc1 = nn.Linear(channels[1] * side * side, h1)
        self.fc2 = nn.Linear(h1, h2)
        self.fc3 = nn.Linear(h2, num_classes)

    def _act(self, t):
        return torch.relu(t) if self.activation == "relu" else torch.tanh(t)

    def _pool(self, t):
        return F.max_pool2d(t, 2) if self.pool == "max" else F.avg_pool2d(t, 2)

    def features(self, x):
        """The two convolution stages, flattened."""
        x = self._pool(self._act(self.conv1(x)))
        x = self._pool(self._act(self.conv2(x)))
        return x.flatten(1)

    def forward(self, x):
        x = self.features(x)
        x = self._act(self.fc1(x))
        x = self._act(self.fc2(x))
        return self.fc3(x)


def twins(image_size: int = 28, seed: int = 0, device=None, **kwargs):
    """(course network, torch network): the same architecture and the same initial weights (the torch
    network is initialised from `seed`, and its state dict copied into the course network)."""
    device = torch.device(device) if device is not None else _device()
    torch.manual_seed(seed)
    theirs = LeNet5("torch", image_size, **kwargs)
    ours = LeNet5("course", image_size, **kwargs)
    ours.load_state_dict(theirs.state_dict())
    return ours.to(device), theirs.to(device)


# ---- data ------------------------------------------------------------------------------------------

@dataclass
class Dataset:
    """Images (N, 1, S, S) float32 scaled to [0, 1] and normalised, labels (N,) int64, on the CPU."""
    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    classes: tuple = ()

    @property
    def image_size(self) -> int:
        return int(self.x_train.shape[-1])

    def subset(self, n_train: int | None = None, n_test: int | None = None) -> "Dataset":
        """The first n_train training and n_test test images (for short runs)."""
        return Dataset(self.name, self.x_train[:n_train], self.y_train[:n_train], self.x_test[:n_test],
                       self.y_test[:n_test], self.classes)

    def __str__(self):
        return (f"{self.name}: {len(self.x_train):,} training and {len(self.x_test):,} test images of "
                f"{self.image_size}x{self.image_size}, {len(set(self.y_train.tolist()))} classes")


def _normalise(train: torch.Tensor, test: torch.Tensor):
    mean, std = float(train.mean()), float(train.std())
    return (train - mean) / std, (test - mean) / std


def load_digits(test_fraction: float = 0.25, seed: int = 0) -> Dataset:
    """scikit-learn's bundled handwritten digits (1,797 images of 8x8, 10 classes; shipped inside the
    scikit-learn package, so nothing is downloaded), split at random into training and test images."""
    try:
        from sklearn.datasets import load_digits as _load
    except ImportError as e:
        raise ImportError("load_digits needs scikit-learn (pip install scikit-learn): its 8x8 digits come "
                          "inside the package, no download") from e
    bunch = _load()
    x = torch.as_tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / 16.0      # pixel values 0..16
    y = torch.as_tensor(bunch.target, dtype=torch.int64)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    n_test = int(round(test_fraction * len(y)))
    test, train = perm[:n_test], perm[n_test:]
    x_train, x_test = _normalise(x[train], x[test])
    return Dataset("digits (scikit-learn, 8x8)", x_train.contiguous(), y[train], x_test.contiguous(), y[test],
                   tuple(str(i) for i in range(10)))


FASHION_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                   "Ankle boot")
FASHION_FILES = {
    "x_train": "train-images-idx3-ubyte", "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte", "y_test": "t10k-labels-idx1-ubyte",
}
_IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}   # big-endian


def read_idx(path) -> torch.Tensor:
    """One IDX file (the MNIST format: a magic number 0, 0, type, rank; big-endian int32 sizes; the
    data), gzipped or not: told apart by the gzip magic bytes, not by the name."""
    import numpy as np

    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_TYPES:
        raise ValueError(f"{path}: not an IDX file (magic bytes {raw[:4].hex()})")
    dtype = np.dtype(_IDX_TYPES[raw[2]])
    rank = raw[3]
    if len(raw) < 4 + 4 * rank:
        raise ValueError(f"{path}: truncated IDX header")
    dims = struct.unpack(f">{rank}i", raw[4:4 + 4 * rank])
    start = 4 + 4 * rank
    n = 1
    for d in dims:
        n *= d
    if len(raw) - start != n * dtype.itemsize:
        raise ValueError(f"{path}: header says {dims} ({n * dtype.itemsize:,} bytes of data), "
                         f"the file has {len(raw) - start:,}")
    arr = np.frombuffer(raw, dtype=dtype, offset=start).astype(dtype.newbyteorder("="))
    return torch.from_numpy(arr).reshape(dims)


def _find(folder: Path, stem: str) -> Path:
    for name in (stem, stem + ".gz", stem.replace("-idx", ".idx"), stem.replace("-idx", ".idx") + ".gz"):
        if (folder / name).is_file():
            return folder / name
    raise FileNotFoundError(f"{folder}: no {stem} or {stem}.gz (Fashion-MNIST's files are "
                            f"{', '.join(v + '.gz' for v in FASHION_FILES.values())})")


def load_fashion_mnist(path, n_train: int | None = None, n_test: int | None = None) -> Dataset:
    """Fashion-MNIST from its four IDX files in the folder `path` (as distributed: gzipped, or
    unpacked). Nothing is downloaded. 60,000 training and 10,000 test images of 28x28, 10 classes."""
    folder = Path(os.path.expanduser(str(path)))
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such folder (put Fashion-MNIST's IDX files there)")
    t = {k: read_idx(_find(folder, v)) for k, v in FASHION_FILES.items()}
    for k in ("x_train", "x_test"):
        if t[k].dim() != 3:
            raise ValueError(f"{k}: expected images (N, 28, 28), got {tuple(t[k].shape)}")
    x_train = t["x_train"][:n_train].float().unsqueeze(1) / 255.0
    x_test = t["x_test"][:n_test].float().unsqueeze(1) / 255.0
    x_train, x_test = _normalise(x_train, x_test)
    return Dataset("Fashion-MNIST (28x28)", x_train.contiguous(), t["y_train"][:n_train].long(), x_test.contiguous(),
                   t["y_test"][:n_test].long(), FASHION_CLASSES)


# ---- training --------------------------------------------------------------------------------------

@dataclass
class TrainResult:
    losses: list = field(default_factory=list)          # training loss, one per step
    epoch_losses: list = field(default_factory=list)    # mean training loss of each epoch
    test_accuracy: float = float("nan")
    train_accuracy: float = float("nan")
    epoch_seconds: list = field(default_factory=list)   # wall time of each epoch (synchronised)
    steps: int = 0
    device: str = ""

    def __str__(self):
        ms = 1e3 * sum(self.epoch_seconds) / max(1, len(self.epoch_seconds))
        return (f"{len(self.epoch_losses)} epochs, {self.steps} steps: loss {self.epoch_losses[0]:.3f} -> "
                f"{self.epoch_losses[-1]:.3f}, test accuracy {self.test_accuracy:.3f}, {ms:.0f} ms per epoch on {self.device}")


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 500) -> float:
    """Accuracy of the model on (x, y), in batches."""
    device = next(model.parameters()).device
    was = model.training
    model.eval()
    correct = 0
    for i in range(0, len(y), batch_size):
        out = model(x[i:i + batch_size].to(device))
        correct += int((out.argmax(1).cpu() == y[i:i + batch_size]).sum())
    model.train(was)
    return correct / max(1, len(y))


def train(model: nn.Module, data: Dataset, epochs: int = 5, batch_size: int = 64, lr: float = 0.05,
          momentum: float = 0.9, seed: int = 0, max_steps: int | None = None, progress=None) -> TrainResult:
    """Plain SGD (with momentum) on cross-entropy. The batches are shuffled from `seed`, so two
    networks trained with the same seed see the same batches in the same order. max_steps stops
    early (a short run on the emulator). progress: a callable(epoch, step, loss) or None."""
    device = next(model.parameters()).device
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    gen = torch.Generator().manual_seed(seed)
    x_train, y_train = data.x_train.to(device), data.y_train.to(device)
    result = TrainResult(device=str(device) if device.type == "cpu" else torch.cuda.get_device_name(device))
    model.train()
    for epoch in range(epochs):
        perm = torch.randperm(len(y_train), generator=gen).to(device)
        _sync(device)
        t0 = time.perf_counter()
        step_losses = []
        for i in range(0, len(perm), batch_size):
            idx = perm[i:i + batch_size]
            loss = F.cross_entropy(model(x_train[idx]), y_train[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step_losses.append(loss.detach())
            result.steps += 1
            if progress is not None:
                progress(epoch, result.steps, float(loss))
            if max_steps is not None and result.steps >= max_steps:
                break
        _sync(device)
        result.epoch_seconds.append(time.perf_counter() - t0)
        losses = [float(v) for v in step_losses]          # one transfer per epoch, outside the timing
        result.losses += losses
        result.epoch_losses.append(sum(losses) / max(1, len(losses)))
        if max_steps is not None and result.steps >= max_steps:
            break
    result.test_accuracy = evaluate(model, data.x_test, data.y_test)
    return result


def compare(data: Dataset, epochs: int = 5, seed: int = 0, **train_kwargs) -> dict:
    """Train the course network and its torch twin from the same weights on the same batches:
    {"course": TrainResult, "torch": TrainResult}."""
    ours, theirs = twins(data.image_size, seed=seed)
    return {"course": train(ours, data, epochs=epochs, seed=seed, **train_kwargs),
            "torch": train(theirs, data, epochs=epochs, seed=seed, **train_kwargs)}
