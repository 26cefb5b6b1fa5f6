"""The chapters' shared figures and how they read book/data: a CSV of an older harness counts as no
results (with a line saying so), the heatmap outlines the fastest setting, the speedup bars divide
by "torch best", and show_committed never draws without committed GPU results."""
import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

import convlab as cl  # noqa: E402
from convlab.display import plots  # noqa: E402
from convlab.measuring import results, roofline, workloads


def _row(wl, impl, ms, kind="ours", **extra):
    m = results.Measured(ms, 0.9 * ms, 1.1 * ms, 1.2 * ms, 1.1 * ms)
    return {**results.row(wl, impl, m, kind=kind, roof=roofline.REFERENCE_H200, device="NVIDIA H200"), **extra}


def _chapter_rows():
    rows = []
    for wl, ours, nchw, cl_ in ((workloads.get("lenet_c1"), 2.0, 8.0, 4.0), (workloads.get("fa17"), 3.0, 1.5, 1.0)):
        rows += [_row(wl, "ours", ours), _row(wl, "torch (NCHW)", nchw, "torch"),
                 _row(wl, "torch (channels_last)", cl_, "torch"), _row(wl, "torch best", min(nchw, cl_), "torch best")]
    return results.frame(rows)


@pytest.fixture
def data(tmp_path, monkeypatch):
    monkeypatch.setenv("CONVLAB_ROOT", str(tmp_path))
    folder = tmp_path / "book" / "data"
    folder.mkdir(parents=True)
    return folder


def test_an_old_schema_csv_counts_as_no_results(data, capsys):
    pd.DataFrame({"workload": ["lenet_c1"], "impl": ["naive"], "ms": [6.4], "floor_frac": [0.08]}).to_csv(
        data / "02_naive.csv", index=False)
    assert results.load("02_naive") is None
    out = capsys.readouterr().out.strip()
    assert out.count("\n") == 0 and "older harness" in out and "kind" in out and "make gpu-run" in out
    assert results.load("02_naive", quiet=True) is None and capsys.readouterr().out == ""


def test_load_keeps_a_sweeps_extra_columns(data):
    df = _chapter_rows().assign(TILE=16)
    results.save(df, "sweep", force=True)
    back = results.load("sweep")
    assert list(back.columns) == results.COLUMNS + ["TILE"] and len(back) == len(df)


def test_show_committed_draws_nothing_without_current_results(data, capsys):
    pd.DataFrame({"workload": ["lenet_c1"], "impl": ["naive"], "ms": [6.4]}).to_csv(data / "02_naive.csv", index=False)
    drawn = []
    assert plots.show_committed("02_naive", lambda df, **kw: drawn.append(df)) is None
    out = capsys.readouterr().out
    assert not drawn and out.count("\n") == 1 and "No results of the current harness" in out


def test_show_committed_draws_the_committed_file_labelled(data):
    if cl.device().backend != "emu":
        pytest.skip("the note is for figures drawn on the emulator")
    results.save(_chapter_rows(), "02_naive", force=True)
    notes = []
    df = plots.show_committed("02_naive", lambda df, title, note: notes.append(note))
    assert set(df["kind"]) == {"ours", "torch best"} and len(df) == 4     # torch's single layouts: table only
    assert "book/data/02_naive.csv" in notes[0] and "nothing on this figure was timed" in notes[0]


def test_show_committed_draws_this_runs_rows_unlabelled(data):
    notes = []
    plots.show_committed("02_naive", lambda df, title, note: notes.append(note), data=_chapter_rows())
    assert notes == [None]


def test_speedup_bars_divide_torch_best_by_each_time():
    fig = plots.speedup_bars(_chapter_rows())
    ax = fig.axes[0]
    heights = [p.get_height() for p in ax.patches]
    assert heights == pytest.approx([4.0 / 2.0, 1.0 / 3.0])     # torch best over ours, per workload
    assert [t.get_text() for t in ax.get_legend().get_texts()][0].startswith("torch best")
    assert "GPU time" in ax.get_ylabel()


def test_speedup_bars_refuse_a_missing_baseline():
    with pytest.raises(ValueError, match="no rows of 'naive'"):
        plots.speedup_bars(_chapter_rows(), over="naive")


def test_plot_times_draws_torch_best_not_its_layouts():
    fig = plots.plot_times(_chapter_rows())
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "torch best" in labels and "torch (NCHW)" not in labels
    assert fig.axes[0].get_ylabel().startswith("GPU time")


def test_heatmap_outlines_the_fastest_setting():
    wl = workloads.get("fa17")
    times = {(64, 1): 3.0, (64, 2): 2.5, (128, 1): 1.25, (128, 2): 4.0}
    df = pd.DataFrame([_row(wl, "regtile", ms, BLOCK=b, ROWS=r) for (b, r), ms in times.items()])
    ax = plots.heatmap(df, "BLOCK", "ROWS", "t", unit="µs").axes[0]
    outline = [p for p in ax.patches if isinstance(p, matplotlib.patches.Rectangle) and p.get_edgecolor()[0] == 1.0]
    assert [(o.get_x(), o.get_y()) for o in outline] == [(0, 1)]     # column ROWS=1, row BLOCK=128
    assert "BLOCK=128, ROWS=1: 1250 µs" in ax.get_title()
    assert np.isclose(ax.collections[0].get_array().min(), 1250)


def test_report_names_the_time_it_holds():
    assert "GPU ms" in results.report(_chapter_rows()).columns
    wl = workloads.get("lenet_c1")
    cpu = results.frame([results.row(wl, "C++ loop nest", results.Measured(50.0, 49.0, 51.0), kind="cpu",
                                     device="CPU: test", cudnn="n/a (CPU)")])
    assert list(results.report(cpu).columns[:1]) == ["CPU ms (wall)"]
