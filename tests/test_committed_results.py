"""The committed measurements (benchmarks/results, book/data) name no path of the machine that
made them: a warning a library printed into a report would carry its install path onto the site."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TEXT = (".csv", ".txt", ".json", ".md")
MACHINE_PATH = re.compile(r"(^|[\s\"'(=])/(opt|home|root|usr|tmp|work|Users|var|mnt|scratch)/|site-packages|"
                          r"\b[A-Z]:\\")
FILES = sorted(p for d in ("benchmarks/results", "book/data") for p in (ROOT / d).rglob("*") if p.suffix in TEXT)


def test_there_are_results_to_read():
    assert len(FILES) > 20


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(ROOT)) for p in FILES])
def test_no_path_of_the_machine(path):
    bad = [f"line {i}: {line.strip()[:120]}" for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
           if MACHINE_PATH.search(line)]
    assert not bad, f"{path.relative_to(ROOT)} names a path of the machine that wrote it:\n" + "\n".join(bad[:5])


def test_the_launch_comparisons_read_back():
    from convlab.measuring import results

    for path in sorted((ROOT / "benchmarks" / "results").glob("launch_overhead_*.txt")):
        df = results.launch_comparisons(path)
        assert {"ch9 dropin.conv2d forward", "ch9 dropin.conv2d forward+backward"} <= set(df["what"])
        assert ((df["ours_us"] / df["torch_us"]).round(2) - df["ratio"]).abs().max() <= 0.011
