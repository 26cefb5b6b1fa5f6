"""The chapters' mapping diagrams (convlab.chapters, drawn with convlab.display.diagrams): every figure draws, and the data each draws is the code's own: the grid maps
read back from the naive kernels match the launchers' grids and the kernel's index formulas, the
mma.sync fragments match the PTX ISA's documented layout, the im2col numbers come from the
launcher, the grouped-weight pattern matches torch's grouped convolution."""
import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from convlab.chapters import ch02_naive as ch2
from convlab.chapters import ch04_im2col as ch4
from convlab.chapters import ch05_fused as ch5
from convlab.chapters import ch06_fp16 as ch6
from convlab.chapters import ch07_conv3d as ch7
from convlab.chapters import ch08_backprop as ch8
from convlab.chapters import ch09_general as ch9
from convlab.chapters import ch09b_tensor_cores as ch9b
from convlab.chapters import ch10_network as ch10
from convlab.display import diagrams
from convlab.gpu._limits import GRID_YZ_MAX
from convlab.measuring import workloads
from convlab.ops import backprop, conv3d, fused, im2col

FIGURES = [ch2.grid_maps, ch4.im2col_matrix, ch4.im2col_gemm_tiles, ch5.implicit_gemm_tiles, ch5.direct_regtile_outputs,
           ch6.wmma_tiles, ch9b.mma_fragments, ch9b.ldmatrix_lanes, ch7.conv3d_window, ch8.dx_gather_scatter,
           ch8.dw_reduction, ch9.groups_dilation, ch10.fused_epilogue, ch10.network_timeline]


@pytest.mark.parametrize("draw", FIGURES, ids=lambda f: f.__name__)
def test_each_diagram_is_a_figure_with_its_data(draw):
    fig = draw()
    try:
        assert isinstance(fig, matplotlib.figure.Figure)
        assert fig.convlab_data
        assert fig.get_size_inches()[0] == pytest.approx(diagrams.WIDTH)
    finally:
        plt.close(fig)


def test_grid_maps_are_what_the_naive_kernels_write():
    B, M, Ho, Wo, (bw, bh), fb = 2, 3, 5, 7, (4, 2), 16
    data = ch2.grid_map_data(B, M, Ho, Wo, (bw, bh), fb)
    b, m, h, w = np.meshgrid(range(B), range(M), range(Ho), range(Wo), indexing="ij")
    gz = data["z"]["grid"]
    assert gz == (2, 3, B * M)
    np.testing.assert_array_equal(data["z"]["block_id"], w // bw + gz[0] * (h // bh + gz[1] * (b * M + m)))
    np.testing.assert_array_equal(data["z"]["thread"], w % bw + bw * (h % bh))
    i = ((b * M + m) * Ho + h) * Wo + w
    np.testing.assert_array_equal(data["flat"]["block_id"], i // fb)
    np.testing.assert_array_equal(data["flat"]["thread"], i % fb)
    tiles_x = -(-Wo // bw)
    tile = (h // bh) * tiles_x + w // bw
    np.testing.assert_array_equal(data["textbook"]["block_id"], b + B * (m + M * tile))
    assert data["textbook"]["grid"] == (B, M, tiles_x * -(-Ho // bh))


def test_grid_maps_note_the_z_limit_on_fa17():
    fig = ch2.grid_maps(limit_workload="fa17")
    plt.close(fig)
    limit = fig.convlab_data["limit"]
    assert limit["z_blocks"] == 10_000 * 50 > limit["max"] == GRID_YZ_MAX


def test_im2col_matrix_is_the_unfold_of_the_input():
    fig = ch4.im2col_matrix(H=5, W=6, K=3, column=5)
    plt.close(fig)
    d = fig.convlab_data
    x = torch.tensor(d["x"], dtype=torch.float64).reshape(1, 1, 5, 6)
    np.testing.assert_array_equal(d["U"], F.unfold(x, 3)[0].numpy())
    assert d["window"] == (1, 1, 3)          # column 5 of a 4-wide output: row 1, column 1


def test_im2col_gemm_waste_on_lenet_c1():
    g = ch4.im2col_gemm_geometry("lenet_c1")
    assert g["tile"] == im2col.IM2COL_GEMM.config(workloads.get("lenet_c1"))["TILE"] == 16
    assert (g["M"], g["KD"], g["padded"], g["steps"]) == (4, 49, (16, 64), 4)
    assert g["useful_fraction"] == pytest.approx(4 * 49 / (16 * 64))
    assert round(g["waste"], 1) == 5.2


def test_implicit_gemm_owner_follows_the_config_and_float4_groups():
    fig = ch5.implicit_gemm_tiles("resnet")
    plt.close(fig)
    d = fig.convlab_data
    cfg = fused.gemm_config(64)
    assert d["config"] == cfg
    owner = d["owner"]
    assert owner.shape == (cfg["BM"], cfg["BN"]) and owner.min() == 0
    counts = np.bincount(owner.ravel())
    assert len(counts) == d["threads"] == fused.reg_threads(cfg["BM"], cfg["BN"], cfg["TM"], cfg["TN"])
    assert (counts == cfg["TM"] * cfg["TN"]).all()
    # a quarter-warp (threads 0..7) reads 8 consecutive float4: columns 0..31 of row 0
    np.testing.assert_array_equal(owner[0, :32], np.repeat(np.arange(8), 4))


def test_direct_regtile_threads_cover_image_0_once():
    s = workloads.get("lenet_c1")
    d = ch5.direct_regtile_thread("lenet_c1")
    cfg = fused.regtile_config(s.M, s.C, s.K)
    assert d["config"] == cfg and d["accumulators"] == cfg["MT"] * cfg["ROWS"]
    t = d["thread"]
    assert t.min() == 0
    assert (np.bincount(t.ravel()) <= cfg["ROWS"]).all()
    cols = np.broadcast_to(np.arange(s.Wo), t.shape)
    assert (t % s.Wo == cols).all()


# The PTX ISA's m16n8k16 fragments (groupID = lane >> 2, threadID_in_group = lane % 4), element i:
def _ptx(lane, i, which):
    g, t = lane >> 2, lane % 4
    if which == "A":
        return g + 8 * (i in (2, 3, 6, 7)), 2 * t + (i & 1) + 8 * (i >= 4)
    if which == "B":
        return 2 * t + (i & 1) + 8 * (i >= 2), g
    return g + 8 * (i >= 2), 2 * t + (i & 1)


def test_mma_fragments_match_the_ptx_isa():
    maps = ch9b.mma_fragment_maps()
    for which, n in (("A", 8), ("B", 4), ("D", 4)):
        got = maps[which]
        assert got.shape == (32, n, 2)
        for lane in range(32):
            for i in range(n):
                assert tuple(got[lane, i]) == _ptx(lane, i, which), (which, lane, i)


def test_conv3d_window_from_coarse_config():
    s = workloads.get("conv3d")
    fig = ch7.conv3d_window("conv3d")
    plt.close(fig)
    d = fig.convlab_data
    ZC = conv3d.coarse_config(s.D, s.H, s.W, s.K, s.K, s.K)["ZC"]
    assert d["planes_read"] == ZC + s.K - 1
    assert d["window"] == s.K                    # K outputs accumulate at once
    assert d["accumulators"] == s.K * d["config"]["TX"] * d["config"]["TY"]
    assert (d["held"].sum(axis=1) == s.K).all()  # every output sums K input planes


@pytest.mark.parametrize("stride,padding", [(1, 0), (2, 1)])
def test_dx_gather_and_scatter_are_inverse(stride, padding):
    g = ch8.dx_geometry(H=7, W=7, K=3, stride=stride, padding=padding)
    pairs_g = {(iy, ix, oy, ox, ky, kx) for (iy, ix), l in g["gather"].items() for oy, ox, ky, kx in l}
    pairs_s = {(iy, ix, oy, ox, ky, kx) for (oy, ox), l in g["scatter"].items() for iy, ix, ky, kx in l}
    assert pairs_g == pairs_s
    for (iy, ix, oy, ox, ky, kx) in pairs_g:
        assert (iy, ix) == (oy * stride + ky - padding, ox * stride + kx - padding)
    assert g["writers"].sum() == len(pairs_g)
    # the input gradient of a one-hot dy is the mask placed where the scatter says
    dy = torch.zeros(1, 1, g["Ho"], g["Wo"], dtype=torch.float64)
    dy[0, 0, 1, 1] = 1
    w = torch.arange(1, 10, dtype=torch.float64).reshape(1, 1, 3, 3)
    dx = torch.nn.grad.conv2d_input((1, 1, 7, 7), w, dy, stride=stride, padding=padding)[0, 0]
    want = torch.zeros(7, 7, dtype=torch.float64)
    for iy, ix, ky, kx in g["scatter"][(1, 1)]:
        want[iy, ix] = w[0, 0, ky, kx]
    assert torch.equal(dx, want)


def test_dw_levels_use_the_launchers_chunks():
    s = workloads.get("lenet_c1")
    d = ch8.dw_levels("lenet_c1", sms=132)
    cfg = backprop.direct_dw_config(s.C, s.M, s.K, s.stride, s.Ho)
    tasks = s.B * -(-s.Ho // cfg["ROWS"]) * s.Wo
    pairs = -(-s.M // cfg["MT"]) * s.C
    assert d["chunks"] == backprop.direct_dw_chunks(tasks, pairs, cfg["BLOCK"], cfg["MIN_BLOCKS"], 132)
    values = [v for _, v in d["levels"]]
    assert values[0] == s.B * s.Ho * s.Wo and values[-1] == 1 and values[-2] == d["chunks"]
    assert values == sorted(values, reverse=True)
    assert (values[0], d["chunks"]) == (64_000_000, 792)      # the numbers dw_reduction's docstring quotes


def test_groups_match_torch_and_dilated_taps():
    fig = ch9.groups_dilation("resnext_g32_56", "deeplab_d2_28")
    plt.close(fig)
    d = fig.convlab_data
    s = workloads.get("resnext_g32_56")
    # input c = one-hot channel c (a batch of C 1×1 images): y[c, m] != 0 iff map m reads channel c
    x = torch.eye(s.C, dtype=torch.float64).reshape(s.C, s.C, 1, 1)
    y = F.conv2d(x, torch.ones(s.M, s.C // s.groups, 1, 1, dtype=torch.float64), groups=s.groups)[:, :, 0, 0]
    np.testing.assert_array_equal(d["reads"], (y != 0).numpy().T)
    t = workloads.get("deeplab_d2_28")
    assert d["taps"].sum() == t.K * t.K and d["span"] == t.dilation * (t.K - 1) + 1


def test_epilogue_bytes_of_lenet_c1():
    d = ch10.epilogue_bytes("lenet_c1")
    x, y, p = 4 * 10_000 * 86 * 86, 4 * 10_000 * 4 * 80 * 80, 4 * 10_000 * 4 * 40 * 40
    assert d["fused_total"] == x + p
    assert d["unfused_total"] == (x + y) + 2 * y + (y + p)


def test_igemm_f32_warp_tiles():
    s = workloads.get("resnet")
    fig = ch5.implicit_gemm_tiles("resnet", kernel="f32")
    plt.close(fig)
    d = fig.convlab_data
    from convlab.ops import igemm
    cfg = igemm.igemm_config(s, 132)
    assert all(d["config"][k] == cfg[k] for k in ("BM", "BN", "BK", "WM", "WN"))
    owner = d["owner"]
    assert (np.bincount(owner.ravel()) == igemm.TM * igemm.TN).all()
    assert d["threads"] == igemm.threads(cfg["BM"], cfg["BN"], cfg["WM"], cfg["WN"])
    # every warp's outputs fill exactly one WM×WN rectangle
    warp = owner // 32
    for k in range(warp.max() + 1):
        r, c = np.nonzero(warp == k)
        assert (r.max() - r.min() + 1, c.max() - c.min() + 1) == (cfg["WM"], cfg["WN"]) and len(r) == cfg["WM"] * cfg["WN"]


def test_wmma_tiles_count_the_fragments_waste():
    c1 = ch6.wmma_geometry("lenet_c1")
    # smallc on lenet_c1: C=1 so CP=1, 7 of 16 columns; 4 of 16 maps; 7 bands of 12 rows at a
    # 96-position pitch, whole tiles of 128 positions: 8,064 positions for 6,400 outputs
    assert c1["kernel"] == "WMMA, few channels (no im2col)"
    assert c1["A"].sum() == 16 * 7 and c1["B"].sum() == 7 * 4 and c1["C"].sum() == 16 * 4
    assert c1["positions_per_image"] == 8064
    assert c1["useful_fraction"] == pytest.approx(6400 * 4 * 49 / (8064 * 16 * 7 * 16))
    resnet = ch6.wmma_geometry("resnet")
    assert resnet["kernel"] == "WMMA implicit GEMM" and resnet["useful_fraction"] == 1.0
    assert resnet["A"].all() and resnet["B"].all() and resnet["C"].all()


def test_network_timeline_puts_each_lanes_ops_back_to_back():
    lanes = {"ours": [("copy in", "copy", 5.0), ("conv1", "conv stage", 1.0), ("fc1", "fully-connected", 0.25)],
             "torch": [("conv1", "conv stage", 9.0)]}
    fig = ch10.network_timeline(lanes, title="test")
    plt.close(fig)
    spans = fig.convlab_data["spans"]
    assert [(s["op"], s["start"], s["end"]) for s in spans if s["lane"] == "ours"] == [
        ("copy in", 0.0, 5.0), ("conv1", 5.0, 6.0), ("fc1", 6.0, 6.25)]
    assert fig.convlab_data["end_ms"] == 9.0
    with pytest.raises(ValueError, match="fc1 has no time"):
        ch10.timeline_spans({"ours": [("fc1", "fully-connected", float("nan"))]})
