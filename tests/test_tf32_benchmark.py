"""benchmarks/fp32_tensor_cores.py end to end on the emulator (small twins, every result checked
against float64 within its kernel's bound, nothing timed), and its GPU report computed from rows
alone (stand-in times), so a report that breaks shows before a GPU run."""
import pandas as pd
import pytest

from benchmarks import fp32_tensor_cores as B

pytestmark = pytest.mark.emu_only      # on a GPU the script times and writes results: the lead runs it


def test_the_board_shapes_are_conv2d_v2s():
    shapes = B.board()
    assert [w.name for w, _ in shapes] == ["board_k8_128", "board_k16_128", "board_k16_256", "board_k16_256_b",
                                           "board_k32_256"]
    ranked, seed = shapes[-1]
    assert (ranked.B, ranked.C, ranked.H, ranked.W, ranked.M, ranked.K, ranked.stride, ranked.padding) == \
        (1, 128, 256, 256, 128, 32, 1, 0) and seed == 6252 and ranked.name == B.RANKED
    assert round(ranked.flops / 1e12, 2) == 1.70
    assert all(w.plain and w.C >= 64 and w.M >= 64 for w in B.course()) and len(B.course()) >= 8


def test_on_the_emulator(capsys):
    assert B.main(["--shapes", "board_k16_128,resnet_1x1_56"]) == 0
    out = capsys.readouterr().out
    assert out.count("within its bound") == 6 and "OVER" not in out


def test_the_gpu_report_from_rows():
    rows = []
    for shape, flops in (("board_k32_256", 1.7e12), ("resnet_3x3_28", 1.9e11)):
        for name, ms, err in (("fp32", 40.0, 1e-3), ("tf32", 7.0, 0.2), ("3xtf32", 14.0, 5e-4),
                              ("cudnn fp32", 48.0, 1e-3), ("cudnn tf32", 6.9, 0.3)):
            rows.append(dict(workload=shape, contender=name, ms=ms, caller_ms=ms + 0.01, tflops=flops / ms / 1e9,
                             max_err=err, max_err_rel=err / 400, within_bound=True, kernel="k"))
    text = "\n".join(B.report(pd.DataFrame(rows)))
    assert "# board_k32_256: cuDNN fp32 / 3xTF32 3.43x, max error 0.0005 against cuDNN fp32's 0.001 (no larger)" in text
    assert "geometric mean 3.43x over 1 layers" in text
    assert "# ranked conv2d_v2 shape: 3xTF32 14.00 ms (121.4 TFLOP/s)" in text
