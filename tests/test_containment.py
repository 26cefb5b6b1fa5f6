"""The emulator contains a kernel: every load and store is checked whatever pointer it goes
through, device code cannot call the host, no signal ends the process, and every fault names the
kernel's line (and the lines that called the __device__ function it is in).

The out-of-range suite is generated: each pointer kind x each way past a buffer x load and store,
one kernel apiece in one file, every case expected to stop at its own line with its buffer named,
in both builds of the file (with the race detector's hooks, and without). After all of them the
tensors around the launches are intact and the process goes on."""
import os
import re
import subprocess
import sys
import time

import pytest
import torch

import convlab as cl
from convlab.gpu import _source

pytestmark = pytest.mark.emu_only

N = 96          # elements of x and y
SHARED = 64     # the kernels' __shared__ s[SHARED]
DYN = 48        # floats of extern __shared__ memory each launch gets

# How each pointer kind reaches element i of y (stores) or x (loads); `{i}` is the index, v the value.
# (kind, store template, load template)
KINDS = [
    ("parameter", "y[{i}] = v;", "v = x[{i}];"),
    ("local pointer", "float* q = y; q[{i}] = v;", "const float* q = x; v = q[{i}];"),
    ("pointer plus offset", "float* q = y + ({i}); *q = v;", "const float* q = x + ({i}); v = *q;"),
    ("address of an element", "float* q = &y[0]; q[{i}] = v;", "const float* q = &x[0]; v = q[{i}];"),
    ("incremented pointer", "float* q = y; q += {i}; *q = v;", "const float* q = x; q += {i}; v = *q;"),
    ("__device__ function's parameter", "put(y, {i}, v);", "v = get(x, {i});"),
    ("pointer a __device__ function returns", "*at(y, {i}) = v;", "v = *at((float*)x, {i});"),
    ("struct member", "Pair p{{y, x}}; p.out[{i}] = v;", "Pair p{{y, x}}; v = p.in[{i}];"),
    ("array of pointers", "float* ps[2] = {{y, y}}; ps[1][{i}] = v;",
     "const float* ps[2] = {{x, x}}; v = ps[1][{i}];"),
    ("pointer to a pointer", "float* ps[1] = {{y}}; float** pp = ps; (*pp)[{i}] = v;",
     "const float* ps[1] = {{x}}; const float* const* pp = ps; v = (*pp)[{i}];"),
    ("cast to another element type", "int* q = (int*)y; q[{i}] = 7;", "const int* q = (const int*)x; v = q[{i}];"),
    ("reinterpret_cast to bytes", "char* c = reinterpret_cast<char*>(y); c[4 * ({i})] = 1;",
     "const char* c = reinterpret_cast<const char*>(x); v = c[4 * ({i})];"),
    ("address as an integer", "float* q = (float*)((unsigned long long)y + 4ull * ({i})); *q = v;",
     "const float* q = (const float*)((unsigned long long)x + 4ull * ({i})); v = *q;"),
    ("pointer kept in shared memory", "__shared__ float* sp; sp = y; sp[{i}] = v;",
     "__shared__ const float* sp; sp = x; v = sp[{i}];"),
    ("atomic through a pointer", "float* q = y; atomicAdd(q + ({i}), v);", None),
    ("memcpy", "memcpy(y + ({i}), &v, 4);", "memcpy(&v, x + ({i}), 4);"),
]
# where past the buffer: (name, index expression, the element the message names)
PLACES = [
    ("one past the end", "n", N),
    ("well past the end", "n + 37", N + 37),
    ("one before the start", "-1", -1),
    ("far before the start", "-1000", -1000),
]
SHARED_KINDS = [
    ("shared array through a pointer", "float* q = s; q[{i}] = v;", "const float* q = s; v = q[{i}];"),
    ("dynamic shared memory through a pointer", "float* q = dyn; q[{i}] = v;", "const float* q = dyn; v = q[{i}];"),
]
SHARED_PLACES = [("past the end", "{n}", "past its end"), ("before the start", "-3", "before")]

HEADER = """\
struct Pair { float* out; const float* in; };
__device__ void put(float* p, int i, float v) { p[i] = v; }
__device__ float get(const float* p, int i) { return p[i]; }
__device__ float* at(float* p, int i) { return p + i; }
"""


def _cases():
    """(id, kernel source, expected words): every kind x place x direction."""
    out = []
    for kind, store, load in KINDS:
        for place, index, elem in PLACES:
            for op, body, buf in (("store", store, "y"), ("load", load, "x")):
                if body is None:
                    continue
                out.append((f"{op} {place} via {kind}", body.format(i=index),
                            [f"{buf}[{elem}]", f"{buf} has {N} elements"]))
    for kind, store, load in SHARED_KINDS:
        arr, size = ("s", SHARED) if "array" in kind else ("dyn", DYN)
        for place, index, word in SHARED_PLACES:
            for op, body in (("store", store), ("load", load)):
                words = [f"__shared__ {arr}", word] if arr == "s" else ["extern __shared__", f"shared={4 * DYN}"]
                out.append((f"{op} {place} via {kind}", body.format(i=index.format(n=size)), words))
    return out


CASES = _cases()


def _source_text():
    lines = HEADER.splitlines()
    where = {}
    for k, (case, body, _) in enumerate(CASES):
        lines.append(f"__global__ void case{k}(const float* x, float* y, int n) {{")
        lines.append(f"    __shared__ float s[{SHARED}]; extern __shared__ float dyn[]; float v = 1.0f;")
        lines.append(f"    s[threadIdx.x] = 0.0f; dyn[threadIdx.x] = 0.0f;")
        lines.append(f"    {body}")
        where[k] = len(lines)
        lines.append("    y[0] = v + s[0] + dyn[0];")
        lines.append("}")
    return "\n".join(lines) + "\n", where


@pytest.fixture(scope="module")
def suite():
    text, where = _source_text()
    return cl.load_source(text, name="pointer_suite"), where


def test_the_suite_is_large():
    assert len(CASES) >= 100


@pytest.mark.parametrize("hooks", [True, False], ids=["hooked build", "plain build"])
def test_every_out_of_range_access_stops_at_its_line(suite, hooks):
    mod, where = suite
    x, y = cl.randn(N), cl.empty(N)
    # tensors beside the launch's: none may change, whatever the kernels do
    guards = [torch.full((N,), float(i)) for i in range(4)]
    if not hooks:
        mod._impl._lib(False)          # the build without hooks exists: small launches now take it
    missed = []
    with cl.detect_races(hooks):
        for k, (case, _, words) in enumerate(CASES):
            x_before = x.clone()
            try:
                mod.kernel(f"case{k}")(x, y, N, grid=1, block=1, shared=4 * DYN)
            except cl.KernelFault as e:
                msg = str(e)
                line = f"pointer_suite.cu:{where[k]}"
                if line not in msg or not all(w in msg for w in words) or "/" in msg.split(" at ")[1].split()[0]:
                    missed.append(f"{case}: expected {line} and {words} in: {msg}")
            else:
                missed.append(f"{case}: no fault (a false pass)")
            assert torch.equal(x, x_before), f"{case}: the input changed"
    assert not missed, "\n".join(missed[:10]) + f"\n({len(missed)} of {len(CASES)})"
    for i, g in enumerate(guards):
        assert torch.equal(g, torch.full((N,), float(i))), "a tensor outside the launch changed"


def test_a_correct_kernel_through_every_pointer_kind_passes():
    text = HEADER + """
__global__ void copy(const float* x, float* y, int n) {
    __shared__ float* sp; __shared__ float s[96];
    extern __shared__ float dyn[];
    int i = threadIdx.x;
    if (i >= n) return;
    float* q = y + i; const float* r = &x[i];
    Pair p{y, x};
    float* ps[2] = {y, y};
    if (i == 0) sp = y;
    s[i] = r[0]; dyn[i] = s[i];
    char* c = reinterpret_cast<char*>(q);
    float v = get(x, i) + p.in[i] - *r + dyn[i] - x[i];
    memcpy(c, &v, 4);
    *at(ps[1], i) += x[i];
}
"""
    mod = cl.load_source(text, name="pointer_ok")
    x, y = cl.randn(N), cl.empty(N)
    mod.kernel("copy")(x, y, N, grid=1, block=N, shared=4 * N)
    assert torch.equal(y, x + x)


# ---- the heap --------------------------------------------------------------------------------

HEAP = """\
__global__ void ok(float* y, int n) {
    float* h = (float*)malloc(n * sizeof(float));
    float* g = new float[n];
    for (int i = 0; i < n; i++) { h[i] = i; g[i] = 2 * h[i]; }
    for (int i = 0; i < n; i++) y[i] = g[i] - h[i];
    free(h);
    delete[] g;
}
__global__ void past_block(float* y, int n) {
    float* h = (float*)malloc(4 * sizeof(float));
    h[4] = 1.0f;
}
__global__ void after_free(float* y, int n) {
    float* h = (float*)malloc(16);
    free(h);
    y[0] = h[0];
}
__global__ void double_free(float* y, int n) {
    float* h = (float*)malloc(16);
    free(h);
    free(h);
}
__global__ void too_much(float* y, int n) {
    float* h = (float*)malloc(64 << 20);
    h[0] = 1.0f;
}
"""


def test_the_device_heap():
    mod = cl.load_source(HEAP, name="heap")
    y = cl.empty(8)
    mod.kernel("ok")(y, 8, grid=1, block=1)
    assert torch.equal(y, torch.arange(8.0))
    with pytest.raises(cl.OutOfBoundsError, match=r"past the end of a block of 16 bytes.* at heap.cu:11"):
        mod.kernel("past_block")(y, 8, grid=1, block=1)
    with pytest.raises(cl.OutOfBoundsError, match=r"use after free.* at heap.cu:16"):
        mod.kernel("after_free")(y, 8, grid=1, block=1)
    with pytest.raises(cl.KernelFault, match=r"free\(.*\) at heap.cu:21.*double free"):
        mod.kernel("double_free")(y, 8, grid=1, block=1)
    # 64 MB is over the GPU's default 8 MB heap: NULL, as on a GPU, and the message says why
    with pytest.raises(cl.OutOfBoundsError, match=r"null pointer.*found the device heap full.*set_heap_size.* at heap.cu:25"):
        mod.kernel("too_much")(y, 8, grid=1, block=1)


def test_the_heap_size_can_be_raised():
    """In a fresh process (the heap keeps what other tests' kernels leaked, as a GPU's would)."""
    code = f"""
import convlab as cl
mod = cl.load_source({HEAP!r}, name="heap")
y = cl.empty(8)
cl.set_heap_size(128 << 20)
mod.kernel("too_much")(y, 8, grid=1, block=1)   # its 64 MB block is never freed, as on a GPU
try:
    cl.set_heap_size(8 << 20)
except cl.LaunchError as e:
    print("refused:", e)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "CONVLAB_BACKEND": "emu"})
    assert done.returncode == 0, done.stderr
    assert "refused: the device heap cannot change" in done.stdout and "still allocated" in done.stdout


# ---- device code calls no host function --------------------------------------------------------

HOST_CALLS = [
    ("system", '#include <cstdlib>\n__global__ void k(float* y) { system("ls"); y[0] = 1; }', "`system`", 2),
    ("fopen", '#include <cstdio>\n__global__ void k(float* y) { FILE* f = fopen("a", "w"); y[0] = f != 0; }',
     "`fopen`", 2),
    ("fprintf", '#include <cstdio>\n__global__ void k(float* y) { fprintf(stderr, "%f", y[0]); }', "`fprintf`", 2),
    ("getenv", '#include <cstdlib>\n__global__ void k(float* y) { y[0] = getenv("HOME") != 0; }', "`getenv`", 2),
    ("exit", '#include <cstdlib>\n__global__ void k(float* y) {\n    if (y[0] > 0) exit(0);\n}', "`exit`", 3),
    ("abort", '#include <cstdlib>\n__global__ void k(float* y) { if (y[0] > 0) abort(); }', "`abort`", 2),
    ("std::vector", '#include <vector>\n__global__ void k(float* y) {\n    std::vector<float> v(4);\n'
                    '    y[0] = v[1];\n}', "`std::vector` is host code", 3),
    ("std::string", '#include <string>\n__global__ void k(float* y) {\n    std::string s("abcdefghijklmnopqrstuvwxyz");\n'
                    '    y[0] = s.size();\n}', "`std::string` is host code", 3),
    ("std::sort", '#include <algorithm>\n__global__ void k(float* y) {\n    std::sort(y, y + 4);\n}',
     "`std::sort` is host code", 3),
    ("throw", '__global__ void k(float* y) {\n    if (y[0] < 0) throw 1;\n}', "__cxa_throw", 2),
    ("calloc", '#include <cstdlib>\n__global__ void k(float* y) { y[0] = calloc(4, 4) != 0; }', "`calloc`", 2),
    ("rand", '#include <cstdlib>\n__global__ void k(float* y) { y[0] = rand(); }', "`rand`", 2),
    ("time", '#include <ctime>\n__global__ void k(float* y) { y[0] = time(0); }', "`time`", 2),
    ("usleep", '#include <unistd.h>\n__global__ void k(float* y) { usleep(10); }', "`usleep`", 2),
    ("raise", '#include <csignal>\n__global__ void k(float* y) { raise(SIGINT); }', "`raise`", 2),
    ("puts", '#include <cstdio>\n__global__ void k(float* y) { puts("hi"); }', "`puts`", 2),
]


@pytest.mark.parametrize("case", HOST_CALLS, ids=[c[0] for c in HOST_CALLS])
def test_host_calls_are_compile_errors_at_their_line(case):
    name, text, word, line = case
    with pytest.raises(cl.CompileError) as e:
        cl.load_source(text, name="host_" + re.sub(r"\W", "_", name))
    msg = str(e.value)
    assert word in msg and ("host function" in msg or "host code" in msg), msg
    assert f":{line}" in msg, msg


def test_a_host_function_of_the_kernels_own_is_refused_with_both_lines():
    text = "float twice(float v) { return 2 * v; }\n__global__ void k(float* y) {\n    y[0] = twice(y[0]);\n}\n"
    with pytest.raises(cl.CompileError, match=r"host_own.cu:3: `k` calls `twice`, a host function \(defined at "
                                              r"host_own.cu:1 without __device__\)"):
        cl.load_source(text, name="host_own")
    ok = text.replace("float twice", "__host__ __device__ float twice")
    cl.load_source(ok, name="host_own_ok")


@pytest.mark.parametrize("asm", ['asm("nop");', '__asm__ volatile("" ::: "memory");'])
def test_inline_assembly_is_refused(asm):
    with pytest.raises(cl.CompileError, match=r"inline_asm.cu:2: inline assembly"):
        cl.load_source(f"__global__ void k(float* y) {{\n    {asm}\n}}\n", name="inline_asm")


def test_math_printf_and_memset_are_device_code():
    text = """\
#include <cmath>
__global__ void k(float* y) {
    float v = sinf(y[0]) + expf(y[1]) + powf(2.0f, 3.0f) + sqrt(2.0) + fmaf(1.0f, 2.0f, 3.0f) + erff(0.5f);
    float t[4]; memset(t, 0, sizeof t);
    if (threadIdx.x == 0) printf("%d\\n", (int)t[0]);
    y[2] = v + t[3];
}
"""
    y = cl.randn(4)
    cl.load_source(text, name="math_ok").kernel("k")(y, grid=1, block=1)
    assert torch.isfinite(y).all()


# ---- no signal ends the process --------------------------------------------------------------

SIGNALS = """\
__device__ int nothing(int a) { if (a > 100) return 1; }
__global__ void divide(int* y, int d) {
    y[0] = 100 / d;
}
__global__ void divide_const(int* y) {
    int z = 0;
    y[0] = y[1] / z;
}
__global__ void overflow(int* y, int d) {
    y[0] = y[1] / d;
}
__global__ void trap(int* y) {
    if (y[0] == 0) __builtin_trap();
}
__global__ void no_return(int* y) {
    y[0] = nothing(y[0]);
}
__global__ void local_array(int* y, int i) {
    int a[4] = {1, 2, 3, 4};
    y[0] = a[i];
}
__device__ int deep(int d) {   // not a loop the compiler could make of it: a frame per call
    volatile char pad[4096]; pad[d & 4095] = (char)d; int r = d ? deep(d - 1) : 0; return r ^ (r << 1) ^ pad[d & 4095];
}
__global__ void recurse(int* y, int d) {
    y[threadIdx.x] = deep(d);
}
"""
# a file with a barrier runs its threads as fibers, each on a stack of its own
FIBERS = SIGNALS.replace("    y[threadIdx.x] = deep(d);", "    __syncthreads();\n    y[threadIdx.x] = deep(d);")


@pytest.fixture(scope="module")
def signals():
    return cl.load_source(SIGNALS, name="signals")


def test_integer_division_by_zero_is_reported_at_its_line(signals):
    y = torch.zeros(4, dtype=torch.int32)
    with pytest.raises(cl.KernelFault, match=r"division or remainder by zero at signals.cu:3 \(100 / 0\)"):
        signals.kernel("divide")(y, 0, grid=1, block=1)
    with pytest.raises(cl.KernelFault, match=r"division or remainder by zero at signals.cu:7"):
        signals.kernel("divide_const")(y, grid=1, block=1)
    y[1] = -2 ** 31
    with pytest.raises(cl.KernelFault, match=r"integer division fault at signals.cu:10.*INT_MIN / -1"):
        signals.kernel("overflow")(y, -1, grid=1, block=1)
    signals.kernel("divide")(y, 7, grid=1, block=1)
    assert y[0] == 14


def test_traps_are_faults(signals):
    y = torch.zeros(4, dtype=torch.int32)
    with pytest.raises(cl.KernelFault, match=r"trap instruction at signals.cu:13"):
        signals.kernel("trap")(y, grid=1, block=1)
    with pytest.raises(cl.KernelFault, match=r"reached its end without returning its value at signals.cu:1, called at "
                                             r"signals.cu:16"):
        signals.kernel("no_return")(y, grid=1, block=1)


def test_a_local_array_out_of_range(signals):
    y = torch.zeros(4, dtype=torch.int32)
    with pytest.raises(cl.OutOfBoundsError, match=r"at signals.cu:20: index 4 into an array of type 'int \[4\]'"):
        signals.kernel("local_array")(y, 4, grid=1, block=1)
    signals.kernel("local_array")(y, 3, grid=1, block=1)
    assert y[0] == 4


@pytest.mark.parametrize("fibers", [False, True], ids=["one stack", "a stack per thread"])
def test_stack_overflow_is_named(signals, fibers):
    mod = cl.load_source(FIBERS, name="signals_fibers") if fibers else signals
    y = torch.zeros(32, dtype=torch.int32)
    with pytest.raises(cl.KernelFault, match="stack overflow"):
        mod.kernel("recurse")(y, 1 << 20, grid=1, block=32)
    mod.kernel("recurse")(y, 3, grid=1, block=32)
    assert (y == 0).all()


# ---- where: the line, and the lines that called it -----------------------------------------------

def test_a_fault_in_a_device_function_names_the_call_too():
    text = """\
__device__ void store(float* p, int i, float v) {
    p[i] = v;
}
__device__ __noinline__ void store_far(float* p, int i, float v) {
    store(p, i + 1, v);
}
__global__ void k(float* y, int n) {
    store_far(y, n - 1, 1.0f);
}
"""
    mod = cl.load_source(text, name="chain")
    with pytest.raises(cl.OutOfBoundsError) as e:
        mod.kernel("k")(cl.empty(8), 8, grid=1, block=1)
    assert "at chain.cu:2, called at chain.cu:5, called at chain.cu:8 by thread" in str(e.value)


def test_messages_name_no_path_of_the_machine(tmp_path):
    mod = cl.load_source("__global__ void k(float* y, int n) {\n    y[n] = 1.0f;\n}\n", name="nopath",
                         directory=tmp_path)
    with pytest.raises(cl.OutOfBoundsError) as e:
        mod.kernel("k")(cl.empty(4), 4, grid=1, block=1)
    assert "nopath.cu:2" in str(e.value) and str(tmp_path) not in str(e.value)
    assert _source.display_name(tmp_path / "other.cu") == "other.cu"


# ---- timeouts that tell the truth ------------------------------------------------------------------

LONG = """\
__global__ void busy(float* y, int n, int work) {
    float v = 0;
    for (int k = 0; k < work; k++) v = v * 0.5f + 1.0f;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = v;
}
__global__ void stuck(float* y, int n) {
    while (y[0] == y[0]) { }
}
"""


@pytest.fixture(scope="module")
def long_kernels():
    return cl.load_source(LONG, name="long")


def test_a_stuck_kernel_is_stopped_and_told_so(long_kernels):
    old = cl.DEFAULT_TIMEOUT
    cl.set_timeout(1)
    try:
        with pytest.raises(cl.KernelTimeout) as e:
            long_kernels.kernel("stuck")(cl.zeros(4), 4, grid=1, block=1)
    finally:
        cl.set_timeout(old)
    msg = str(e.value)
    assert "no CUDA thread finished in the last" in msg and "long.cu:8" in msg and "cl.set_timeout(60)" in msg


def test_a_long_launch_that_progresses_runs_to_its_end(long_kernels):
    """A grid sized to take several times the time a launch may go without progress: it finishes."""
    busy, y = long_kernels.kernel("busy"), cl.empty(64)
    t0 = time.perf_counter()
    busy(y, 64, 2000, grid=64, block=64)
    per_block = (time.perf_counter() - t0) / 64
    old = cl.DEFAULT_TIMEOUT
    cl.set_timeout(1)
    try:
        busy(y, 64, 2000, grid=max(256, int(4.0 / per_block)), block=64)   # about 4 s
    finally:
        cl.set_timeout(old)
    assert torch.isfinite(y).all()


def test_a_total_limit_says_the_launch_was_not_stuck(long_kernels):
    with cl.time_limit(0.5), pytest.raises(cl.KernelTimeout) as e:
        long_kernels.kernel("busy")(cl.empty(64), 64, 20000, grid=1 << 16, block=64)
    msg = str(e.value)
    assert "not stuck" in msg and "blocks of 64 threads" in msg and "would need about" in msg, msg


# ---- the exercises, as a student would get them wrong ----------------------------------------------

def test_exercise_2_1_off_by_one_through_a_pointer_is_out_of_bounds_at_its_line(capsys):
    """`i <= total` with the store through a local pointer: a false pass, then a dead process,
    before the guard; now the check names the store's line."""
    import convlab.teach.checks as ex
    from test_exercise_mutants import _exercise
    ns = _exercise("02_naive_kernel", "my_conv", [("i < total; i +=", "i <= total; i +="),
                                                  ("        y[i] = acc;", "        float* yp = y + i; *yp = acc;")])
    assert not ex.check_kernel(ns["launch"])
    out = capsys.readouterr().out
    # the extra thread's first access past a buffer: its read of x (b = B), at that line
    assert "OutOfBoundsError" in out and "x[25]" in out and re.search(r"my_conv_m\d+\.cu:21", out), out
    # and with the reads guarded, the store through the pointer
    ns = _exercise("02_naive_kernel", "my_conv", [("i < total; i +=", "i <= total; i +="),
                                                  ("if (ih >= 0", "if (i < total && ih >= 0"),
                                                  ("        y[i] = acc;", "        float* yp = y + i; *yp = acc;")])
    assert not ex.check_kernel(ns["launch"])
    out = capsys.readouterr().out
    assert "through a pointer into argument `y`" in out and re.search(r"my_conv_m\d+\.cu:24", out), out


@pytest.mark.parametrize("delete", [
    ("        fence_mbar_init();\n", "no fence_mbar_init() followed that init"),
    ("    __syncthreads();\n\n    if (wg == 0) {", "no __syncthreads() between"),
], ids=["fence", "barrier"])
def test_exercise_11_1_without_publishing_the_inits_is_a_race(delete, capsys):
    from convlab.chapters import ch11_hopper as ch11
    from test_exercise_mutants import _exercise
    old, words = delete
    new = "" if "fence" in old else "\n    if (wg == 0) {"
    ns = _exercise("11_mbarrier_ring", "my_ring", [(old, new)])
    assert not ch11.check_ring(ns["my_ring"])
    assert words in capsys.readouterr().out


def test_the_drop_in_runs_a_long_layer_to_its_end():
    """The drop-in on a course-sized layer takes many times the time a launch may go without a
    thread finishing: it runs to the end (no exercise check's total limit outside the checks)."""
    from convlab.ops import dropin
    x, w = torch.randn(4, 64, 28, 28), torch.randn(64, 64, 3, 3)
    old = cl.DEFAULT_TIMEOUT
    cl.set_timeout(0.5)
    try:
        y = dropin.conv2d(x, w, padding=1)
    finally:
        cl.set_timeout(old)
    ref = torch.nn.functional.conv2d(x.double(), w.double(), padding=1)
    assert (y.double() - ref).abs().max() < 1e-3


def test_a_vector_access_off_its_alignment_faults():
    """`*(const float4*)&s[1]`: a GPU stops at the misaligned address; so does the emulator (in the
    launches it checks: the build with hooks)."""
    text = """\
__global__ void k(const float* x, float* y) {
    __shared__ __align__(16) float s[8];
    s[threadIdx.x] = x[threadIdx.x];
    __syncthreads();
    float4 v = *(const float4*)&s[1];
    y[threadIdx.x] = v.x;
}
"""
    mod = cl.load_source(text, name="misaligned")
    with cl.detect_races(True), pytest.raises(cl.KernelFault, match=r"misaligned access at misaligned.cu:5: 16 bytes at "
                                                                     r"__shared__ s\[1\], which is 4 bytes past a multiple of 16"):
        mod.kernel("k")(cl.randn(8), cl.empty(8), grid=1, block=8)
    ok = cl.load_source(text.replace("&s[1]", "&s[4]"), name="aligned")
    with cl.detect_races(True):
        ok.kernel("k")(cl.randn(8), cl.empty(8), grid=1, block=8)


def test_a_missing_compiler_is_one_line_that_says_what_to_install(monkeypatch):
    from convlab.gpu import emu
    monkeypatch.setattr(emu, "CXX", "g++-that-is-not-installed")
    with pytest.raises(cl.CompileError) as e:
        cl.load_source(f"__global__ void k(float* y) {{ y[0] = {time.time_ns()}; }}\n", name="no_compiler")
    msg = str(e.value)
    assert "`g++-that-is-not-installed` is not installed" in msg and "apt-get install g++" in msg and "\n" not in msg
