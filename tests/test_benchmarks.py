"""The tile-sweep benchmarks (benchmarks/f32_layers.py, tensor_core_layers.py, depthwise_layers.py)
run end to end on the emulator: each layer's small twin, every output checked by convlab.programs.measure,
nothing timed for a figure. Their GPU reports are computed from result rows alone: here from the
emulator's rows and a stand-in "torch best" row, so a report that breaks shows before a GPU run."""
import pandas as pd
import pytest

from convlab.measuring import baselines, results, workloads
from convlab.ops import igemm
from convlab.ops import tensor_core as tc

pytestmark = pytest.mark.emu_only      # on a GPU the scripts time and write results: the lead runs them


def torch_best(wl, ms: float, dtype: str = "fp32", passes=("forward",)):
    """A stand-in "torch best" row of ms on each pass."""
    return results.frame([results.row(wl, baselines.TORCH_BEST, results.Measured(ms, ms, ms), kind="torch best",
                                      pass_=p, dtype=dtype) for p in passes])


def test_the_layers_are_workloads_with_emulator_twins():
    for wl in workloads.GEMM_LAYERS + workloads.DEPTHWISE_LAYERS:
        assert workloads.get(wl.name) is wl
        s = wl.small()
        # the twin keeps what picks a kernel's path: 8-channel chunks (mma.sync's 16-byte copies),
        # igemm's loader, the mask, stride and padding, one map per channel
        assert (s.C % 8 == 0) == (wl.C % 8 == 0) and s.family == wl.family
        if wl in workloads.GEMM_LAYERS:
            assert all(igemm.igemm_mode(s, bk) == igemm.igemm_mode(wl, bk) for bk in (8, 16))
        assert (s.K, s.Kw, s.stride, s.padding) == (wl.K, wl.Kw, wl.stride, wl.padding)


def test_tensor_core_layers_on_the_emulator(capsys):
    from benchmarks import tensor_core_layers as T

    assert T.main(["--layers", "resnet_stem_7x7_s2", "--configs", "default", "--splits", "", "--no-sass"]) == 0
    assert "resnet_stem_7x7_s2_small" in capsys.readouterr().out

    wl = workloads.get("resnet_3x3_7")
    s = wl.small()
    df = T.measure_layer(wl, [T.DEFAULT, "128x64x64 s3 (2x2 warps)"], [2], reps=1)
    mine = df[df["kind"] == "ours"]
    assert set(mine["layout"]) == {"channels_last", "NCHW"} and (mine["gpu"] == "CPU emulator").all()
    chosen = tc.mma_config(s)
    assert [T.st.tunables(r, tc.TUNABLES) for _, r in mine[mine["layout"] == "NCHW"].iterrows()] == [chosen]
    (ms,) = [r["ms"] for _, r in mine.iterrows()
             if r["layout"] == "channels_last" and T.st.tunables(r, tc.TUNABLES) == chosen]
    text = "\n".join(T.report(pd.concat([df, torch_best(s, 2 * ms, "fp16")], ignore_index=True), {s.name: s}))
    assert f"{ms:.4f} (2.00x)" in text and "geometric mean" in text

    # --backward: the dX and dW passes of a grouped layer, in their own table
    g = workloads.get("resnext_g32_28")
    gs = g.small()
    df = T.measure_layer(g, [T.DEFAULT], [], reps=1, backward=True)
    back = df[df["pass"] != "forward"]
    assert set(zip(back["impl"], back["pass"])) == {(tc.MMA_DX.name, "dX"), (tc.MMA_DW.name, "dW")}
    stand_in = torch_best(gs, 1.0, "fp16", passes=("forward", "dX", "dW"))
    text = "\n".join(T.report(pd.concat([df, stand_in], ignore_index=True), {gs.name: gs}))
    assert "# gradients" in text and f"1.0000 / {float(back[back['pass'] == 'dX']['ms'].iloc[0]):.4f}" in text


def test_f32_layers_on_the_emulator(capsys):
    from benchmarks import f32_layers as F

    assert F.main(["--layers", "resnet_1x1_56", "--no-backward"]) == 0
    out = capsys.readouterr().out
    assert "resnet_1x1_56_small" in out and F.CH5 in out and F.MASK in out

    wl = workloads.get("resnet_3x3_7")
    s = wl.small()
    df = F.measure_layer(wl, reps=1, quick=False, backward=True, sms=igemm.SMS, roof=None)
    assert set(df["pass"]) == {"forward", "dX", "dW", "forward+dX+dW"}
    swept = df[df["impl"] == igemm.IGEMM_F32.name]
    assert len(swept) == len(F.candidates(s, igemm.SMS, False)) > 1
    config = [r["ms"] for _, r in swept.iterrows() if F.st.tunables(r, igemm.TUNABLES) == igemm.igemm_config(s)]
    passes = ("forward", "dX", "dW", "forward+dX+dW")
    text = "\n".join(F.report(pd.concat([df, torch_best(s, 3 * config[0], passes=passes)], ignore_index=True),
                              {s.name: s}))
    assert f"{config[0]:.4f} (3.00x)" in text and "TUNED = {" in text and "forward+dX+dW" in text


def test_depthwise_layers_on_the_emulator(capsys):
    from benchmarks import depthwise_layers as D

    assert D.main(["--layers", "mbv2_dw3_56_s2", "--dtypes", "fp16", "--quick"]) == 0
    out = capsys.readouterr().out
    assert "ours NCHW default" in out and "ours NHWC default" in out

    wl = workloads.get("convnext_dw7_14")
    s = wl.small()
    df = D.measure_layer(wl, "fp32", reps=1, roof=None)
    mine = df[df["kind"] == "ours"]
    assert len(mine) == 2 + len(D.CONFIGS["nchw"]) + len(D.CONFIGS["nhwc"])
    nhwc = float(mine[(mine["layout"] == "channels_last") & mine["PB"].isna() & mine["OX"].isna()
                      & mine["OY"].isna() & mine["vec"].isna()]["ms"].iloc[0])
    text = "\n".join(D.report(pd.concat([df, torch_best(s, nhwc / 2)], ignore_index=True)))
    assert f"{nhwc:.4f} (0.50x)" in text and "ours best" in text


def test_a_benchmark_csv_is_written_on_a_gpu_run_only(tmp_path, monkeypatch):
    df = torch_best(workloads.GEMM_LAYERS[0], 1.0)
    monkeypatch.delenv("CONVLAB_SAVE_RESULTS", raising=False)
    assert results.save_benchmark(df, "x", tmp_path) is None and not list(tmp_path.iterdir())
    monkeypatch.setenv("CONVLAB_SAVE_RESULTS", "1")
    path = results.save_benchmark(df, "x", tmp_path)
    assert path == tmp_path / "x_CPU_emulator.csv"
    assert list(pd.read_csv(path).columns) == results.COLUMNS


def test_network_batches_on_the_emulator(capsys):
    from benchmarks import network_batches as N

    assert N.main([]) == 0
    out = capsys.readouterr().out
    assert "ours: fused stages" in out and "LeNet-5 training step" in out
    assert "conv2 UNROLL=4,MG=1,BLOCK=32" in out        # one image: the small-batch config, in the printout


def test_gpu_numbers_on_the_emulator(capsys):
    from benchmarks import gpu_numbers as G

    csv = G.book.repo_root() / "book" / "data" / f"{G.CSV}.csv"
    before = csv.read_bytes() if csv.is_file() else None
    assert G.main([]) == 0
    out = capsys.readouterr().out
    checked = [line for line in out.splitlines() if line.startswith("checked ")]
    assert len(checked) == 11 and "nothing timed, nothing written" in out
    assert "chase_shared shared-memory: ends at the predicted node" in out and "hfma2_chains" in out
    assert (csv.read_bytes() if csv.is_file() else None) == before


def test_backward_launches_on_the_emulator(capsys):
    """Every route it times, dX and dW, one launch or several, checked against fp64 on small batches."""
    from benchmarks import backward_launches as B

    assert B.main([]) == 0
    out = capsys.readouterr().out
    assert f"{2 * len(B.CHANNELS) * 4} routes checked against fp64" in out


# ---- the GPU measurements the pages wait for: each script's --emu-smoke run, end to end ----------
# (script, the columns the page that reads its CSV uses)
SMOKE = {
    "fft_5x5": {"pass", "choice", "ms", "algorithm", "gpu"},                      # book/08_backprop
    "conv3d_blocks": {"block", "ms", "sectors per load request", "gpu"},           # book/07_conv3d
    "torch_cards": {"card", "same", "timed kernels", "profiled kernels", "gpu"},
    "network_trace": {"phase", "who", "kind", "name", "stream", "start_us", "dur_us", "gpu"},  # book/10_network
    "igemm_ablation": {"variant", "workload", "ms", "gpu"},                        # book/09_general
    "mma_ablation": {"variant", "workload", "ms", "shared load bank conflicts", "gpu"},  # book/09b_tensor_cores
    "wgmma_ablation": {"variant", "workload", "ms", "gpu"},                        # book/11_hopper
    "network_fusion": {"network", "workload", "impl", "ms", "gpu"},               # book/10_network
}


@pytest.mark.parametrize("name", SMOKE)
def test_gpu_scripts_run_in_their_small_form_on_the_emulator(name, tmp_path, capsys):
    """Each script's --emu-smoke: the same code path on the emulator's small twins (every output
    checked against fp64 where the script checks one), writing the CSV the page reads, with the
    columns the page uses."""
    import importlib

    script = importlib.import_module(f"benchmarks.{name}")
    assert script.main(["--emu-smoke", "--out", str(tmp_path)]) == 0
    (csv,) = tmp_path.glob(f"{name}_*.csv")
    df = pd.read_csv(csv)
    assert len(df) and SMOKE[name] <= set(df.columns), f"{name}: columns {sorted(df.columns)}"
    assert (df["gpu"] == "CPU emulator").all()
    # without --emu-smoke the emulator refuses: these measure a GPU
    assert script.main(["--out", str(tmp_path)]) == 1
