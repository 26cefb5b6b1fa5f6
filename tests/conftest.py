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
