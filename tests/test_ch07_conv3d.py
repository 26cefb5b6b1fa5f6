"""Chapter 7's computations behind its figures (convlab/chapters/ch07_conv3d.py): the lanes of
conv3d_tiled's load loop, read from the emulator's trace."""
import matplotlib.pyplot as plt
import numpy as np
import pytest

from convlab.chapters import ch07_conv3d as ch7


@pytest.mark.emu_only
def test_the_tiled_loads_use_every_lane_inside_the_volume_and_fewer_at_its_edge():
    fig = ch7.tiled_load_lanes()
    plt.close(fig)
    inside, edge = fig.convlab_data["lanes"][0], fig.convlab_data["lanes"][3]
    assert inside.shape == edge.shape == (16, 6)
    loads = inside[:, :5]
    assert (loads[loads > 0] == 32).all() and (inside[:, 5] > 0).any()   # whole warps inside the volume
    assert ((edge > 0) & (edge < 32)).any() and edge.sum() < inside.sum()   # lanes off at the edge
    assert np.array_equal(np.flatnonzero(inside[:, 5]), np.flatnonzero(edge[:, 5]))   # the same warps store
