"""Chapter 10's computations behind its glued numbers and figures (convlab/chapters/ch10_network.py):
the end-to-end runs' timeline drawn from their spans, the class project's two layers read from
result rows."""
import math

import matplotlib.pyplot as plt
import pandas as pd

from convlab.chapters import ch10_network as ch10


def test_the_stream_timeline_draws_each_modes_spans_on_their_streams():
    rows = [("ours", "pinned", "copy in", 0, 0.0, 2.0), ("ours", "pinned", "compute", 0, 2.0, 5.0),
            ("ours", "pinned", "copy out", 0, 5.0, 5.5),
            ("ours", "streams, 2 chunks", "copy in", 0, 0.0, 1.0), ("ours", "streams, 2 chunks", "compute", 0, 1.0, 2.5),
            ("ours", "streams, 2 chunks", "copy in", 1, 1.0, 2.0), ("ours", "streams, 2 chunks", "compute", 1, 2.5, 4.0),
            ("torch", "pinned", "copy in", 0, 0.0, 9.0)]
    timeline = pd.DataFrame(rows, columns=["who", "mode", "stream", "chunk", "start ms", "end ms"])
    fig = ch10.stream_timeline(timeline, "ours", ["pinned", "streams, 2 chunks"])
    try:
        pinned, streamed = fig.axes
        assert [t.get_text() for t in pinned.get_yticklabels()] == ["copy in", "compute", "copy out"]
        assert (pinned.get_title(loc="left"), streamed.get_title(loc="left")) == ("pinned", "streams, 2 chunks")
        # a row of bars per stream, one bar per span of that mode (torch's left out), as long as the span
        assert [len(c.get_paths()) for c in streamed.collections] == [2, 2, 0]
        assert [len(c.get_paths()) for c in pinned.collections] == [1, 1, 1]
        assert max(p.vertices[:, 0].max() for c in pinned.collections for p in c.get_paths()) == 5.5
    finally:
        plt.close(fig)


def test_both_layers_reads_the_forward_rows_of_one_implementation():
    df = pd.DataFrame([("k", "fp32", "forward", "lenet_c1", 1.5), ("k", "fp32", "forward", "lenet_c3", 4.0),
                       ("k", "fp16", "forward", "lenet_c1", 0.5), ("k", "fp32", "dX", "lenet_c1", 9.0),
                       ("other", "fp32", "forward", "lenet_c3", 7.0)],
                      columns=["impl", "dtype", "pass", "workload", "ms"])
    assert ch10.both_layers(df, "k") == (1.5, 4.0)
    c1, c3 = ch10.both_layers(df, "k", "fp16")
    assert c1 == 0.5 and math.isnan(c3)
    assert all(math.isnan(v) for v in ch10.both_layers(df, "missing"))
