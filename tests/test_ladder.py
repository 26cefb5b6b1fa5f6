"""convlab.display.ladder: every rung is in the committed results, its numbers are the CSV's, a chapter's
ladder holds its own and earlier chapters' rungs only, fp16 rungs say so."""
import math

import matplotlib
import pandas as pd
import pytest

from convlab.display import ladder
from convlab.measuring import results
from convlab.ops import backprop, dispatch

matplotlib.use("Agg")
ALL_PASSES = [p for p in ladder.PASSES if ladder.rungs("10_network", p)]


@pytest.mark.parametrize("rung", ladder.RUNGS, ids=[f"{r.chapter}:{r.impl}:{r.dtype}:{r.pass_}" for r in ladder.RUNGS])
def test_every_rung_is_in_the_committed_data(rung):
    ours, torch = ladder._rows(rung)
    assert set(ours.index) & set(ladder.COURSE), f"{rung.impl} ran on no course workload"
    assert set(ours.index) <= set(torch.index), "a workload without torch's row to compare with"


def test_a_missing_rung_is_a_clear_error():
    with pytest.raises(ladder.LadderError, match=r"'wgmma \+ TMA, any layer \(NHWC\)'.*book/data/05_fused.csv"):
        ladder._rows(ladder.Rung("05_fused", "hopper"))          # a kernel chapter 5 did not measure
    with pytest.raises(KeyError, match="no kernel with key 'no such kernel'"):
        ladder._rows(ladder.Rung("05_fused", "no such kernel"))


def test_rungs_name_their_kernels_by_key():
    """A rung names its kernel by Impl.key; the display name is only how the results files label it."""
    keys = {i.key for i in dispatch.registered()} | {dispatch.BEST_KEY, backprop.AUTOGRAD_KEY}
    assert {r.kernel for r in ladder.RUNGS} <= keys
    assert ladder.label("igemm_f32") == dispatch.by_key("igemm_f32").name


@pytest.mark.parametrize("pass_", ALL_PASSES)
def test_times_and_ratio_are_the_csvs(pass_):
    t = ladder.table("10_network", pass_=pass_)
    assert len(t)
    for _, r in t.iterrows():
        rung = next(g for g in ladder.RUNGS if g.chapter == r["chapter"] and g.dtype == r["dtype"]
                    and g.pass_ == pass_ and g.impl == r["impl"])
        csv = pd.read_csv(results.data_path(rung.file), keep_default_na=False, na_values=[""])
        name = {v: k for k, v in rung.aliases}.get(r["workload"], r["workload"])
        sel = (csv["workload"] == name) & (csv["dtype"] == rung.dtype) & (csv["pass"] == pass_)
        ours = csv[sel & (csv["impl"] == rung.impl) & (csv["kind"] == "ours")]
        torch = csv[sel & (csv["impl"] == rung.torch_impl)]
        assert len(ours) == 1 and len(torch) == 1
        assert r["GPU ms"] == ours["ms"].iloc[0] and r["caller ms"] == ours["caller_ms"].iloc[0]
        assert r["torch best ms"] == torch["ms"].iloc[0]
        assert r["× torch best"] == pytest.approx(torch["ms"].iloc[0] / ours["ms"].iloc[0], rel=1e-12)
        floor = ours["floor_frac"].iloc[0]
        assert (math.isnan(r["% of floor"]) and math.isnan(floor)) or r["% of floor"] == pytest.approx(100 * floor)


def test_the_ladder_up_to_chapter_5_has_chapters_2_to_5_only():
    t = ladder.table("05_fused")
    assert set(t["chapter"]) == {"02_naive", "03_tiled", "04_im2col", "05_fused"}
    assert set(t.loc[t["new"], "chapter"]) == {"05_fused"}
    assert list(dict.fromkeys(t["chapter"])) == ["02_naive", "03_tiled", "04_im2col", "05_fused"]
    assert set(t["workload"]) == set(ladder.WORKLOADS_2D)


def test_lenet_c1_steps_from_register_tiled_gemm_to_direct():
    t = ladder.table("05_fused", "lenet_c1").set_index("step")
    gemm, direct = t.loc["implicit GEMM, register-tiled", "GPU ms"], t.loc["direct, register-tiled (mask in shared)", "GPU ms"]
    assert direct < gemm / 10      # the chapter's largest step on lenet_c1
    assert ladder.best("05_fused", "lenet_c1")["GPU ms"] == t["GPU ms"].min()


def test_fp16_rungs_are_marked():
    t = ladder.table("06_fp16")
    fp16 = t[t["chapter"] == "06_fp16"]
    assert len(fp16) and (fp16["dtype"] == "fp16").all() and (t[t["chapter"] != "06_fp16"]["dtype"] == "fp32").all()
    html = ladder.html("06_fp16")
    assert "half2 (direct, register-tiled) [fp16]" in html and "naive flat (1D grid) [fp16]" not in html
    fig = ladder.figure("06_fp16")
    ticks = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert "half2 (fp16)" in ticks and "naive flat" in ticks
    # best() keeps precisions apart unless told otherwise
    assert ladder.best("06_fp16", "lenet_c1")["dtype"] == "fp32"
    assert ladder.best("06_fp16", "lenet_c1", dtype="fp16")["dtype"] == "fp16"


def test_conv3d_and_backward_ladders():
    assert set(ladder.table("07_conv3d", "conv3d")["chapter"]) == {"07_conv3d"}
    assert set(ladder.table("08_backprop", pass_="dX")["step"]) == {"dX scatter (atomics)", "dX gather (transposed conv)"}
    assert ladder.table("07_conv3d", pass_="dW").empty
    with pytest.raises(ValueError, match="course's workloads"):
        ladder.table("09_general", "resnet_3x3_56")


def test_figure_is_legible_at_the_column_width():
    fig = ladder.figure("05_fused")
    ax = fig.axes[0]
    assert tuple(fig.get_size_inches()) == (7.5, 4.8) and fig.dpi == 110
    assert ax.get_yscale() == "log" and any(t.get_text() == "torch best" for t in ax.texts)
    sizes = [t.get_fontsize() for t in [*ax.get_xticklabels(), *ax.texts, *fig.legends[0].get_texts()]]
    assert min(sizes) >= 9
    assert any("NVIDIA H200" in t.get_text() and t.get_fontsize() >= 8 for t in fig.texts)
    assert not ax.get_legend()          # the legend sits under the axes, off the data


def test_a_results_file_saved_mid_notebook_is_read_again(tmp_path, monkeypatch):
    """A chapter draws its ladder, re-measures and saves its results, then draws the ladder again:
    the second drawing shows the new rows (a ladder that kept the first read once put last run's
    8.69 ms beside this run's 8.68 ms on one page)."""
    src = results.data_path("02_naive")
    (tmp_path / "book" / "data").mkdir(parents=True)
    copy = tmp_path / "book" / "data" / "02_naive.csv"
    copy.write_text(src.read_text())
    monkeypatch.setattr(results, "data_path", lambda chapter: tmp_path / "book" / "data" / f"{chapter}.csv")
    monkeypatch.setattr(ladder, "_loaded", {})
    before = ladder.table("02_naive", "lenet_c1")["GPU ms"].iloc[0]
    df = pd.read_csv(copy, keep_default_na=False, na_values=[""])
    ours = (df["workload"] == "lenet_c1") & (df["impl"] == "naive flat (1D grid)")
    df.loc[ours, "ms"] = 2 * before
    df.to_csv(copy, index=False)
    assert ladder.table("02_naive", "lenet_c1")["GPU ms"].iloc[0] == 2 * before


def test_chapter_9b_comes_after_9a_and_before_10():
    assert ladder._number("09b_tensor_cores") == 9.5 and ladder._ch("09b_tensor_cores") == "ch9b"
    steps = list(dict.fromkeys(ladder.table("10_network")["chapter"]))
    assert steps.index("09b_tensor_cores") == steps.index("09_general") + 1
    assert "09b_tensor_cores" not in set(ladder.table("09_general")["chapter"])
    t = ladder.table("09b_tensor_cores")
    assert set(t.loc[t["new"], "chapter"]) == {"09b_tensor_cores"} and (t.loc[t["new"], "dtype"] == "fp16").all()
    with pytest.raises(ValueError, match="09b_tensor_cores"):
        ladder._number("9b_tensor_cores")
