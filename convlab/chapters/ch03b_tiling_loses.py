"""Chapter 3b, when tiling loses (book/03b_tiling_loses.ipynb): the profiling exercise's targets.

    from convlab.chapters import ch03b_tiling_loses as ch3b
    ch2.check_counters(run, ch3b.check_targets("03b.scale"), result=..., macs=...)
"""
from __future__ import annotations

from .ch02_naive import Targets, kept_targets

#: Exercise 3b.1: a warp's 32 consecutive floats (4 sectors); a tile's column with no conflict.
TARGETS = {
    "03b.scale": {"sectors per load request": 4},
    "03b.colsum": {"shared bank conflicts": 0},
}


def check_targets(key: str) -> Targets:
    """The counter targets of exercise 3b.1's two kernels ("03b.scale", "03b.colsum")."""
    return kept_targets(key, TARGETS[key])
