"""Which GPUs a kernel runs on (convlab/gpu/arch.py): the header line `// Requires sm_XY or newer: why`,
what make kernels-check skips because of it, and cl.load's error on an older GPU."""
import importlib.util
import types
from pathlib import Path

import pytest

from convlab.gpu import arch
from convlab.gpu.backend_cuda import CudaBackend
from convlab.gpu._errors import CompileError
from convlab.gpu._source import parse

ROOT = Path(__file__).resolve().parent.parent
NEEDS_86 = """// A kernel for a test.
//
// Requires sm_86 or newer: a made-up reason
#include <cuda_fp16.h>
__global__ void k(float* x) { x[threadIdx.x] = 1.0f; }
"""


def test_a_header_without_the_line_means_the_oldest_course_gpu():
    assert arch.required("// a kernel\n__global__ void k(float* x) {}\n") == ((7, 5), "")


def test_the_line_is_read_from_the_header_only():
    assert arch.required(NEEDS_86) == ((8, 6), "a made-up reason")
    late = "__global__ void k(float* x) {}\n// Requires sm_90 or newer: too late to count\n"
    assert arch.required(late) == ((7, 5), "")


@pytest.mark.parametrize("kernel", sorted((ROOT / "kernels").rglob("*.cu")), ids=lambda p: p.name)
def test_every_kernel_runs_on_one_of_the_course_gpus(kernel):
    need, _ = arch.required(kernel.read_text())
    assert arch.sm(need) in arch.ARCHS, f"{kernel}: its header requires {arch.sm(need)}, not one of {arch.ARCHS}"


def test_too_old_says_which_gpu_is_needed_and_what_to_do():
    msg = arch.too_old(NEEDS_86, "kernels/x.cu", (7, 5), "Tesla T4")
    assert "kernels/x.cu" in msg and "8.6 (sm_86)" in msg and "a made-up reason" in msg
    assert "Tesla T4 is 7.5" in msg and "CONVLAB_BACKEND=emu" in msg
    assert arch.too_old(NEEDS_86, "kernels/x.cu", (8, 6), "RTX A6000") is None
    assert arch.too_old(NEEDS_86, "kernels/x.cu", (9, 0), "H100") is None


def test_cl_load_on_an_older_gpu_stops_before_nvcc(tmp_path):
    path = tmp_path / "needs86.cu"
    path.write_text(NEEDS_86)
    t4 = types.SimpleNamespace(cc=(7, 5), gpu_name="Tesla T4")  # what compile reads of the backend
    with pytest.raises(CompileError, match=r"needs a GPU of compute capability 8\.6"):
        CudaBackend.compile(t4, parse(NEEDS_86, path, [tmp_path]), {}, [])


def test_kernels_check_skips_the_older_architectures(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("kernels_check", ROOT / "scripts" / "kernels_check.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    path = tmp_path / "needs86.cu"
    path.write_text(NEEDS_86)
    compiled = []
    monkeypatch.setattr(script, "compile_one", lambda nvcc, p, target: compiled.append(target))
    monkeypatch.setattr("sys.argv", ["kernels_check.py", str(path)])
    assert script.main() == 0
    assert compiled == ["sm_86", "sm_89", "sm_90"]
