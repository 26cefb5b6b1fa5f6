"""The committed GPU results and profile cards say what they are: every card names the precision it
ran in, no row of ours is faster than its roofline floor, and a torch row above its floor names the
cheaper algorithm cuDNN ran."""

import pandas as pd
import pytest

from convlab.display import book
from convlab.measuring import results
from convlab.measuring.profile import PROFILES_DIR, stored_precision

DATA = book.repo_root() / "book" / "data"
CARDS = sorted(p for p in (DATA / "profiles").glob("*.csv") if p.read_text().startswith("# ncu"))
FEWER_MACS = DATA / "notes" / "cudnn_fewer_macs.csv"


def _result_files():
    for path in sorted(DATA.glob("*.csv")):
        df = pd.read_csv(path, keep_default_na=False, na_values=[""])
        if {"floor_frac", "kind", "torch_kernels"} <= set(df.columns):
            yield path.stem, df


@pytest.mark.parametrize("card", CARDS, ids=[p.stem for p in CARDS])
def test_every_card_names_its_precision(card):
    text = card.read_text()
    precision = stored_precision(text)
    assert precision in ("fp32 strict (TF32 off)", "fp16", "integers only (no floating point)")
    if precision.startswith("fp32"):
        # a card that says strict fp32 but ran a TF32 kernel (as ch3_torch once did: sm80_..._tf32f32_...)
        assert "tf32" not in text.lower().replace("tf32 off", ""), f"{card.name} ran a TF32 kernel"


def test_no_row_of_ours_is_faster_than_its_floor():
    over = [(name, r["workload"], r["impl"], r["dtype"], r["floor_frac"])
            for name, df in _result_files() for _, r in df.iterrows()
            if r["kind"] == "ours" and r["floor_frac"] > 1]
    assert not over, f"rows of ours above 100% of the roofline floor (a wrong floor): {over}"


def test_torch_above_its_floor_only_with_a_cheaper_algorithm():
    notes = pd.read_csv(FEWER_MACS, comment="#")
    key = ["chapter", "workload", "pass", "dtype", "layout"]
    noted = {tuple(r[k] for k in key): r for _, r in notes.iterrows()}
    seen = set()
    for name, df in _result_files():
        for _, r in df[df["kind"].isin(["torch", "torch best"]) & (df["floor_frac"] > 1)].iterrows():
            k = (name, r["workload"], r["pass"], r["dtype"], r["layout"])
            assert k in noted, f"torch row above its floor with no algorithm noted in {FEWER_MACS.name}: {k}"
            note = noted[k]
            assert note["algorithm"] in ("FFT", "Winograd")
            assert note["kernel"] in r["torch_kernels"]
            assert note["algorithm"].lower() in note["kernel"].lower() or "fft" in note["kernel"].lower()
            seen.add(k)
    assert seen == set(noted), f"notes for rows that are not above their floor: {set(noted) - seen}"


def test_fp16_floors_are_recomputed():
    """No committed fp16 row still carries the fp32 floor (scripts/refloor_fp16.py)."""
    for name, df in _result_files():
        _, changed = results.refloor_fp16(df)
        assert changed == 0, f"book/data/{name}.csv: run scripts/refloor_fp16.py"


def test_refloor_gives_an_fp32_floored_fp16_row_the_tensor_core_floor():
    from convlab.measuring import roofline, workloads
    wl = workloads.get("resnet")
    flops, nbytes = results.cost(wl, "forward", "fp16")
    row = {"workload": "resnet", "shape": wl.shape_text, "pass": "forward", "dtype": "fp16", "ms": 0.05,
           "gflops": flops / 0.05e-3 / 1e9, "floor_ms": roofline.REFERENCE_H200.floor_ms(flops, nbytes)}
    row["floor_frac"] = row["floor_ms"] / row["ms"]
    new, changed = results.refloor_fp16(pd.DataFrame([row]))
    assert changed == 1
    assert new["floor_ms"].iloc[0] == pytest.approx(roofline.REFERENCE_H200_FP16.floor_ms(flops, nbytes))
    assert new["floor_frac"].iloc[0] == pytest.approx(new["floor_ms"].iloc[0] / 0.05)
    assert results.refloor_fp16(new)[1] == 0


def _reference_gpu_benchmarks():
    """The benchmarks' committed results measured on the reference GPU (the H200), as frames."""
    from convlab.measuring import roofline

    gpu = roofline.REFERENCE_H200_FP16.gpu.replace(" ", "_")
    for path in sorted((book.repo_root() / "benchmarks" / "results").glob(f"*_{gpu}.csv")):
        df = pd.read_csv(path, keep_default_na=False, na_values=[""])
        if {"dtype", "floor_ms", "gflops", "shape", "kind"} <= set(df.columns):
            yield path.name, df


@pytest.mark.parametrize("name,df", list(_reference_gpu_benchmarks()), ids=lambda v: v if isinstance(v, str) else "")
def test_benchmark_results_carry_the_fp16_floor_on_fp16_rows(name, df):
    """A benchmark's fp16 rows once carried the fp32 GEMM floor (tensor_core_layers: rows at 13 times
    their floor): scripts/refloor_fp16.py gives them the fp16 one, and no row of ours then beats it."""
    _, changed = results.refloor_fp16(df)
    assert changed == 0, f"benchmarks/results/{name}: {changed} fp16 rows with the fp32 floor: run scripts/refloor_fp16.py"
    ours = df[(df["kind"] == "ours") & (df["dtype"] == "fp16")]
    assert not (ours["floor_frac"] > 1).any(), f"benchmarks/results/{name}: fp16 rows of ours above their floor"
