"""convlab.display.book.on_emulator: a chapter's fault demonstration runs on the CPU emulator in its own
process, whatever backend the notebook has, and its output lands in the notebook."""
import pytest

from convlab.display import book


def test_a_demonstration_runs_on_the_emulator_even_when_the_notebook_has_a_gpu(monkeypatch, capsys):
    monkeypatch.setenv("CONVLAB_BACKEND", "cuda")

    def missing_bounds_check():
        import convlab as cl
        print("backend:", cl.device().backend)
        mod = cl.load_source("""
        __global__ void fill(float* y, int n) {
            int i = blockIdx.x * blockDim.x + threadIdx.x;
            y[i] = 1.0f;   // no `if (i < n)`: the last block writes past the end
        }""", name="fill_without_bounds_check")
        y = cl.empty(37)
        try:
            mod.kernel("fill")(y, 37, grid=2, block=32)
        except cl.ConvlabError as e:
            print(type(e).__name__, e)

    book.on_emulator(missing_bounds_check)
    out = capsys.readouterr().out
    assert out.startswith("backend: emu\nOutOfBoundsError") and "fill" in out, out


def test_source_text_runs_too(capsys):
    book.on_emulator("""
        import sys
        print("from a string,", "on", sys.argv[0])
    """)
    assert capsys.readouterr().out == "from a string, on -c\n"


def test_a_failing_demonstration_raises_with_its_output():
    with pytest.raises(RuntimeError, match=r"(?s)exit status 1.*ZeroDivisionError"):
        book.on_emulator("print('before'); 1 / 0")


def test_a_figure_made_on_the_emulator_comes_back_with_its_data(monkeypatch):
    monkeypatch.setenv("CONVLAB_BACKEND", "cuda")
    monkeypatch.setattr("convlab.gpu.runtime.device", lambda: type("D", (), {"backend": "cuda"})())

    def make():
        import convlab as cl
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots()
        fig.convlab_data = {"backend": cl.device().backend}
        return fig

    fig = book.figure_on_emulator(make)
    assert fig.convlab_data == {"backend": "emu"}
