"""Shared fixtures: the same tests run on the emulator (always) and on a GPU (when one is there).
Tests of emulator-only behaviour (faults a GPU does not report) are marked emu_only."""
import os
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
os.environ.setdefault("CONVLAB_CACHE", str(TESTS.parent / ".convlab-cache"))


def pytest_configure(config):
    config.addinivalue_line("markers", "emu_only: behaviour only the CPU emulator has (skipped on a GPU)")
    config.addinivalue_line("markers", "gpu_only: needs a real GPU (skipped on the emulator)")


def pytest_collection_modifyitems(config, items):
    import convlab as cl
    backend = cl.backend()
    for item in items:
        if backend != "emu" and item.get_closest_marker("emu_only"):
            item.add_marker(pytest.mark.skip(reason="emulator-only behaviour; the GPU backend is active"))
        if backend != "cuda" and item.get_closest_marker("gpu_only"):
            item.add_marker(pytest.mark.skip(reason="needs a GPU (CONVLAB_BACKEND=cuda)"))


@pytest.fixture
def faults():
    return TESTS / "faults"


@pytest.fixture
def features():
    return TESTS / "features"


class _LaunchRecorder:
    """Stands in for a compiled module: records every launch instead of running it, so launchers can
    be replayed at the course's full sizes on meta tensors (no data, nothing runs)."""

    def __init__(self, launches, defines):
        self.launches, self.defines = launches, defines

    def kernel(self, name):
        return _RecordedKernel(self, name)

    def set_constant(self, name, value):
        assert value.numel() * value.element_size() <= 64 * 1024, f"__constant__ {name} over 64 KB"


class _RecordedKernel:
    """A kernel of _LaunchRecorder: called like a cl.Kernel, or bound like one (a launcher's Launch)."""

    def __init__(self, module, name):
        self.module, self.name = module, name

    def __call__(self, *args, grid, block, shared=0, max_shared=None):
        self.module.launches.append((self.name, tuple(grid), tuple(block), shared, self.module.defines))

    def bind(self, scalars, grid, block, shared=0, max_shared=None):
        return lambda tensors: self(*tensors, *scalars, grid=grid, block=block, shared=shared, max_shared=max_shared)


@pytest.fixture
def record_launches(monkeypatch):
    """record_launches() -> the list every launcher's launch is appended to from then on, as
    (kernel, grid, block, shared, defines): the launchers find their modules through
    convlab.ops._kernels._ModuleRef.get, which this replaces."""
    from convlab.ops import _kernels

    def record():
        launches = []
        monkeypatch.setattr(_kernels._ModuleRef, "get", lambda ref: _LaunchRecorder(launches, ref.defines))
        return launches
    return record
