"""Chapter 9b's computations behind its figures (convlab/chapters/ch09b_tensor_cores.py): the
cp.async pipeline's buffers, step by step."""
import matplotlib.pyplot as plt
import pytest

from convlab.chapters import ch09b_tensor_cores as ch9b


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_the_pipeline_multiplies_one_buffer_while_the_others_hold_the_next_tiles(stages):
    fig = ch9b.pipeline_figure(stages, 6)
    plt.close(fig)
    cells = fig.convlab_data["cells"]
    # the prologue copies tiles 0 .. stages - 2 into buffers 0 .. stages - 2
    assert {b: c for (b, col), c in cells.items() if col == "prologue"} == {b: (b, "copy") for b in range(stages - 1)}
    for t in range(6):
        col = {b: c for (b, c_), c in cells.items() if c_ == f"step {t}"}
        assert col[t % stages] == (t, "mma")                                    # tile t is multiplied
        assert col[(t + stages - 1) % stages] == (t + stages - 1, "copy")        # the newest copy issued
        held = sorted(tile for tile, _ in col.values())
        assert held == list(range(t, t + stages))                               # stages tiles in flight
