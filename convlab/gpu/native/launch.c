// convlab's kernel launch in one C call. The GPU backend launches through the CUDA driver's
// cuLaunchKernel; called through ctypes, converting its eleven arguments costs more than the
// driver's own work. This Python extension takes them as Python ints (METH_FASTCALL, no tuple)
// and calls cuLaunchKernel at the address the backend passes, so nothing here links to CUDA.
//
// Route: a call of a route (the drop-in's, for one call signature) kept as what it did on the
// GPU: its outputs allocated, its kernels launched, its constant-memory copies queued, with the
// call's tensors' addresses written into the argument buffers recorded from a call made through
// Python (convlab.backend_cuda.record). A repeated call is then this one C call. It answers
// NotImplemented (the caller runs the route through Python) where a tensor is not as recorded
// (its strides, or its address's alignment), and once its time is up (the caller then looks
// whether a kernel file was edited, and renews it or leaves it off).
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int (*launch_fn)(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                         unsigned shared, void* stream, void** params, void** extra);
typedef int (*copy_fn)(unsigned long long dst, unsigned long long src, size_t n, void* stream);
typedef int (*encode_fn)(void* map, int dtype, unsigned rank, void* address, const unsigned long long* dims,
                         const unsigned long long* strides, const unsigned* box, const unsigned* element_strides,
                         int interleave, int swizzle, int l2, int fill);

// launch(cuLaunchKernel's address, function, gx, gy, gz, bx, by, bz, shared bytes, stream, params
// (the address of the void* array of argument addresses)) -> the driver's error code
static PyObject* launch(PyObject* self, PyObject* const* args, Py_ssize_t n) {
    unsigned long long v[11];
    if (n != 11) {
        PyErr_Format(PyExc_TypeError, "launch takes 11 integer arguments, got %zd", n);
        return NULL;
    }
    for (int i = 0; i < 11; i++) {
        v[i] = PyLong_AsUnsignedLongLong(args[i]);
        if (v[i] == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    }
    int err = ((launch_fn)(uintptr_t)v[0])((void*)(uintptr_t)v[1], (unsigned)v[2], (unsigned)v[3], (unsigned)v[4],
                                           (unsigned)v[5], (unsigned)v[6], (unsigned)v[7], (unsigned)v[8],
                                           (void*)(uintptr_t)v[9], (void**)(uintptr_t)v[10], NULL);
    return PyLong_FromLong(err);
}

// ---- Route ----------------------------------------------------------------------------------------

#define MAX_RANK 5

typedef struct {                  // a tensor's address written into an argument buffer
    Py_ssize_t at, source;
    long long offset;             // bytes past the source's address
} PtrSlot;

typedef struct {                  // a tensor map encoded into an argument buffer (when its address changed)
    Py_ssize_t at, source;
    long long offset;
    int dtype, swizzle;
    unsigned rank, box[MAX_RANK], steps[MAX_RANK];   // steps: the copy's element strides
    unsigned long long dims[MAX_RANK], strides[MAX_RANK];
    unsigned long long last;      // the address last encoded
} MapSlot;

typedef struct {
    int copy;                     // 0: a launch; 1: a device-to-device copy into __constant__ memory
    void* func;
    unsigned dims[7];             // grid, block, shared bytes
    char* buf;                    // the argument buffer (64-byte aligned: tensor maps), scalars packed
    void** params;                // the address of each argument in buf
    Py_ssize_t nptr, nmap;
    PtrSlot* ptrs;
    MapSlot* maps;
    unsigned long long dst, nbytes;   // a copy: to dst, nbytes, from ptrs[0]
} Step;

typedef struct {
    PyObject_HEAD
    PyObject* dict;
    launch_fn launch;
    copy_fn copy;
    encode_fn encode;
    PyObject *stream, *context;   // callables: torch's current stream (an int); the context made current
    Py_ssize_t nargs, nalloc, result;
    Py_ssize_t* source;           // per argument: its source, or -1 (it must be None)
    long long* residue;           // per argument: its address mod 16, as recorded
    PyObject** strides;           // per argument: its strides, as recorded (a tuple)
    PyObject** allocs;            // callables that allocate an output or workspace
    Py_ssize_t nsteps;
    Step* steps;
    long long expires;            // monotonic ns after which a call answers NotImplemented
} Route;

static unsigned long long routes_launched = 0;   // kernels launched by Routes, all together (launched())

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void route_dealloc(Route* r) {
    Py_XDECREF(r->dict);
    Py_XDECREF(r->stream);
    Py_XDECREF(r->context);
    for (Py_ssize_t i = 0; r->strides && i < r->nargs; i++) Py_XDECREF(r->strides[i]);
    for (Py_ssize_t i = 0; r->allocs && i < r->nalloc; i++) Py_XDECREF(r->allocs[i]);
    for (Py_ssize_t i = 0; r->steps && i < r->nsteps; i++) {
        free(r->steps[i].buf);
        free(r->steps[i].params);
        free(r->steps[i].ptrs);
        free(r->steps[i].maps);
    }
    free(r->source);
    free(r->residue);
    free(r->strides);
    free(r->allocs);
    free(r->steps);
    Py_TYPE(r)->tp_free((PyObject*)r);
}

static unsigned long long as_u64(PyObject* o) {       // -1 with an error set where o is no int in range
    return PyLong_AsUnsignedLongLong(o);
}

static int fill_u64s(PyObject* seq, unsigned long long* out, unsigned n) {
    for (unsigned i = 0; i < n; i++) {
        out[i] = as_u64(PyTuple_GET_ITEM(seq, i));
        if (PyErr_Occurred()) return -1;
    }
    return 0;
}

// Step tuples, as convlab.ops._kernels._route_of builds them from a Recording:
//   (0, function, (gx, gy, gz, bx, by, bz, shared), buf bytes, offsets of each argument in buf,
//    ((at, source, offset), ...),
//    ((at, source, offset, dtype, swizzle, dims, strides, box, element strides), ...): a tensor map's
//    fields as cuTensorMapEncodeTiled takes them, innermost first)
//   (1, dst, nbytes, source, offset)
static int parse_step(PyObject* t, Step* s) {
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) < 1) goto bad;
    long kind = PyLong_AsLong(PyTuple_GET_ITEM(t, 0));
    if (kind == 1) {
        if (PyTuple_GET_SIZE(t) != 5) goto bad;
        s->copy = 1;
        s->dst = as_u64(PyTuple_GET_ITEM(t, 1));
        s->nbytes = as_u64(PyTuple_GET_ITEM(t, 2));
        s->nptr = 1;
        s->ptrs = calloc(1, sizeof(PtrSlot));
        if (!s->ptrs) { PyErr_NoMemory(); return -1; }
        s->ptrs[0].source = PyLong_AsSsize_t(PyTuple_GET_ITEM(t, 3));
        s->ptrs[0].offset = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 4));
        return PyErr_Occurred() ? -1 : 0;
    }
    if (kind != 0 || PyTuple_GET_SIZE(t) != 7) goto bad;
    s->func = (void*)(uintptr_t)as_u64(PyTuple_GET_ITEM(t, 1));
    PyObject* dims = PyTuple_GET_ITEM(t, 2);
    PyObject* buf = PyTuple_GET_ITEM(t, 3);
    PyObject* offsets = PyTuple_GET_ITEM(t, 4);
    PyObject* ptrs = PyTuple_GET_ITEM(t, 5);
    PyObject* maps = PyTuple_GET_ITEM(t, 6);
    if (!PyTuple_Check(dims) || PyTuple_GET_SIZE(dims) != 7 || !PyBytes_Check(buf) || !PyTuple_Check(offsets)
        || !PyTuple_Check(ptrs) || !PyTuple_Check(maps)) goto bad;
    for (int i = 0; i < 7; i++) {
        s->dims[i] = (unsigned)PyLong_AsUnsignedLong(PyTuple_GET_ITEM(dims, i));
        if (PyErr_Occurred()) return -1;
    }
    Py_ssize_t size = PyBytes_GET_SIZE(buf), nargs = PyTuple_GET_SIZE(offsets);
    s->buf = aligned_alloc(64, (size_t)((size + 64) / 64 * 64));
    s->params = calloc(nargs > 0 ? nargs : 1, sizeof(void*));
    s->nptr = PyTuple_GET_SIZE(ptrs);
    s->nmap = PyTuple_GET_SIZE(maps);
    s->ptrs = calloc(s->nptr > 0 ? s->nptr : 1, sizeof(PtrSlot));
    s->maps = calloc(s->nmap > 0 ? s->nmap : 1, sizeof(MapSlot));
    if (!s->buf || !s->params || !s->ptrs || !s->maps) { PyErr_NoMemory(); return -1; }
    memcpy(s->buf, PyBytes_AS_STRING(buf), size);
    for (Py_ssize_t i = 0; i < nargs; i++) {
        Py_ssize_t at = PyLong_AsSsize_t(PyTuple_GET_ITEM(offsets, i));
        if (at < 0 || at >= size) goto bad;
        s->params[i] = s->buf + at;
    }
    for (Py_ssize_t i = 0; i < s->nptr; i++) {
        PyObject* p = PyTuple_GET_ITEM(ptrs, i);
        if (!PyTuple_Check(p) || PyTuple_GET_SIZE(p) != 3) goto bad;
        s->ptrs[i].at = PyLong_AsSsize_t(PyTuple_GET_ITEM(p, 0));
        s->ptrs[i].source = PyLong_AsSsize_t(PyTuple_GET_ITEM(p, 1));
        s->ptrs[i].offset = PyLong_AsLongLong(PyTuple_GET_ITEM(p, 2));
        if (PyErr_Occurred()) return -1;
        if (s->ptrs[i].at < 0 || s->ptrs[i].at + 8 > size) goto bad;
    }
    for (Py_ssize_t i = 0; i < s->nmap; i++) {
        PyObject* m = PyTuple_GET_ITEM(maps, i);
        if (!PyTuple_Check(m) || PyTuple_GET_SIZE(m) != 9) goto bad;
        MapSlot* ms = &s->maps[i];
        ms->at = PyLong_AsSsize_t(PyTuple_GET_ITEM(m, 0));
        ms->source = PyLong_AsSsize_t(PyTuple_GET_ITEM(m, 1));
        ms->offset = PyLong_AsLongLong(PyTuple_GET_ITEM(m, 2));
        ms->dtype = (int)PyLong_AsLong(PyTuple_GET_ITEM(m, 3));
        ms->swizzle = (int)PyLong_AsLong(PyTuple_GET_ITEM(m, 4));
        PyObject *d = PyTuple_GET_ITEM(m, 5), *st = PyTuple_GET_ITEM(m, 6), *bx = PyTuple_GET_ITEM(m, 7);
        PyObject* es = PyTuple_GET_ITEM(m, 8);
        if (PyErr_Occurred() || !PyTuple_Check(d) || !PyTuple_Check(st) || !PyTuple_Check(bx) || !PyTuple_Check(es))
            goto bad;
        ms->rank = (unsigned)PyTuple_GET_SIZE(d);
        if (ms->rank < 1 || ms->rank > MAX_RANK || PyTuple_GET_SIZE(bx) != ms->rank || PyTuple_GET_SIZE(es) != ms->rank
            || PyTuple_GET_SIZE(st) != ms->rank - 1 || ms->at % 64 || ms->at + 128 > size) goto bad;
        if (fill_u64s(d, ms->dims, ms->rank) || fill_u64s(st, ms->strides, ms->rank - 1)) return -1;
        for (unsigned k = 0; k < ms->rank; k++) {
            ms->box[k] = (unsigned)PyLong_AsUnsignedLong(PyTuple_GET_ITEM(bx, k));
            ms->steps[k] = (unsigned)PyLong_AsUnsignedLong(PyTuple_GET_ITEM(es, k));
            if (PyErr_Occurred()) return -1;
            if (ms->steps[k] < 1 || ms->steps[k] > 8) goto bad;     // the copy engine steps 1 to 8 elements
        }
        ms->last = 0;
    }
    return 0;
bad:
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "Route: a malformed step");
    return -1;
}

// Route(launch, copy, encode, stream, context, checks, allocs, steps, result, expires)
//   checks: per argument, None (the argument must be None) or (residue, strides)
//   allocs: callables, each returning a new tensor; sources are the arguments, then the allocations
static int route_init(Route* r, PyObject* args, PyObject* kw) {
    unsigned long long launch_addr, copy_addr, encode_addr;
    PyObject *stream, *context, *checks, *allocs, *steps;
    Py_ssize_t result;
    long long expires;
    if (!PyArg_ParseTuple(args, "KKKOOO!O!O!nL", &launch_addr, &copy_addr, &encode_addr, &stream, &context,
                          &PyTuple_Type, &checks, &PyTuple_Type, &allocs, &PyTuple_Type, &steps, &result, &expires))
        return -1;
    if (r->steps) {
        PyErr_SetString(PyExc_TypeError, "a Route is made once");
        return -1;
    }
    r->launch = (launch_fn)(uintptr_t)launch_addr;
    r->copy = (copy_fn)(uintptr_t)copy_addr;
    r->encode = (encode_fn)(uintptr_t)encode_addr;
    Py_INCREF(stream);
    r->stream = stream;
    Py_INCREF(context);
    r->context = context;
    r->nargs = PyTuple_GET_SIZE(checks);
    r->nalloc = PyTuple_GET_SIZE(allocs);
    r->nsteps = PyTuple_GET_SIZE(steps);
    r->result = result;
    r->expires = expires;
    r->source = calloc(r->nargs + 1, sizeof(Py_ssize_t));
    r->residue = calloc(r->nargs + 1, sizeof(long long));
    r->strides = calloc(r->nargs + 1, sizeof(PyObject*));
    r->allocs = calloc(r->nalloc + 1, sizeof(PyObject*));
    r->steps = calloc(r->nsteps + 1, sizeof(Step));
    if (!r->source || !r->residue || !r->strides || !r->allocs || !r->steps) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < r->nargs; i++) {
        PyObject* c = PyTuple_GET_ITEM(checks, i);
        if (c == Py_None) {
            r->source[i] = -1;
            continue;
        }
        if (!PyTuple_Check(c) || PyTuple_GET_SIZE(c) != 2 || !PyTuple_Check(PyTuple_GET_ITEM(c, 1))) {
            PyErr_SetString(PyExc_ValueError, "Route: a check is None or (residue, strides)");
            return -1;
        }
        r->source[i] = i;
        r->residue[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(c, 0));
        r->strides[i] = PyTuple_GET_ITEM(c, 1);
        Py_INCREF(r->strides[i]);
    }
    for (Py_ssize_t i = 0; i < r->nalloc; i++) {
        r->allocs[i] = PyTuple_GET_ITEM(allocs, i);
        Py_INCREF(r->allocs[i]);
    }
    Py_ssize_t nsources = r->nargs + r->nalloc;
    if (result < r->nargs || result >= nsources) {
        PyErr_SetString(PyExc_ValueError, "Route: the result is one of the allocations");
        return -1;
    }
    for (Py_ssize_t i = 0; i < r->nsteps; i++) {
        if (parse_step(PyTuple_GET_ITEM(steps, i), &r->steps[i])) return -1;
        Step* s = &r->steps[i];
        for (Py_ssize_t k = 0; k < s->nptr; k++)
            if (s->ptrs[k].source < 0 || s->ptrs[k].source >= nsources || (s->ptrs[k].source < r->nargs
                && r->source[s->ptrs[k].source] < 0)) goto bad_source;
        for (Py_ssize_t k = 0; k < s->nmap; k++)
            if (s->maps[k].source < 0 || s->maps[k].source >= nsources || (s->maps[k].source < r->nargs
                && r->source[s->maps[k].source] < 0)) goto bad_source;
    }
    return PyErr_Occurred() ? -1 : 0;
bad_source:
    PyErr_SetString(PyExc_ValueError, "Route: a step reads a source that is not a tensor");
    return -1;
}

static unsigned long long data_ptr(PyObject* t) {     // 0 with an error set on failure
    PyObject* p = PyObject_CallMethod(t, "data_ptr", NULL);
    if (!p) return 0;
    unsigned long long v = PyLong_AsUnsignedLongLong(p);
    Py_DECREF(p);
    return PyErr_Occurred() ? 0 : v;
}

#define MAX_SOURCES 64

static PyObject* route_call(Route* r, PyObject* args, PyObject* kw) {
    if (kw && PyDict_GET_SIZE(kw)) {
        PyErr_SetString(PyExc_TypeError, "a Route takes no keyword arguments");
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(args);
    if (n != r->nargs || n + r->nalloc > MAX_SOURCES) Py_RETURN_NOTIMPLEMENTED;
    if (now_ns() > r->expires) Py_RETURN_NOTIMPLEMENTED;
    unsigned long long ptr[MAX_SOURCES];
    PyObject* made[MAX_SOURCES];
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject* a = PyTuple_GET_ITEM(args, i);
        if (r->source[i] < 0) {
            if (a != Py_None) Py_RETURN_NOTIMPLEMENTED;
            ptr[i] = 0;
            continue;
        }
        if (a == Py_None) Py_RETURN_NOTIMPLEMENTED;
        PyObject* st = PyObject_CallMethod(a, "stride", NULL);
        if (!st) return NULL;
        int same = PyObject_RichCompareBool(st, r->strides[i], Py_EQ);
        Py_DECREF(st);
        if (same < 0) return NULL;
        if (!same) Py_RETURN_NOTIMPLEMENTED;
        ptr[i] = data_ptr(a);
        if (PyErr_Occurred()) return NULL;
        if ((long long)(ptr[i] % 16) != r->residue[i]) Py_RETURN_NOTIMPLEMENTED;
    }
    Py_ssize_t made_n = 0;
    PyObject* out = NULL;
    for (Py_ssize_t k = 0; k < r->nalloc; k++) {
        PyObject* t = PyObject_CallNoArgs(r->allocs[k]);
        if (!t) goto fail;
        made[made_n++] = t;
        ptr[n + k] = data_ptr(t);
        if (PyErr_Occurred()) goto fail;
    }
    PyObject* c = PyObject_CallNoArgs(r->context);
    if (!c) goto fail;
    Py_DECREF(c);
    PyObject* sp = PyObject_CallNoArgs(r->stream);
    if (!sp) goto fail;
    void* stream = (void*)(uintptr_t)PyLong_AsUnsignedLongLong(sp);
    Py_DECREF(sp);
    if (PyErr_Occurred()) goto fail;
    for (Py_ssize_t i = 0; i < r->nsteps; i++) {
        Step* s = &r->steps[i];
        if (s->copy) {
            int err = r->copy(s->dst, ptr[s->ptrs[0].source] + s->ptrs[0].offset, (size_t)s->nbytes, stream);
            if (err) {
                PyErr_Format(PyExc_RuntimeError, "a kept route's copy to __constant__ memory failed: CUDA error %d",
                             err);
                goto fail;
            }
            continue;
        }
        for (Py_ssize_t k = 0; k < s->nptr; k++) {
            unsigned long long v = ptr[s->ptrs[k].source] + (unsigned long long)s->ptrs[k].offset;
            memcpy(s->buf + s->ptrs[k].at, &v, 8);
        }
        for (Py_ssize_t k = 0; k < s->nmap; k++) {
            MapSlot* m = &s->maps[k];
            unsigned long long v = ptr[m->source] + (unsigned long long)m->offset;
            if (v != m->last) {
                int err = r->encode(s->buf + m->at, m->dtype, m->rank, (void*)(uintptr_t)v, m->dims, m->strides,
                                    m->box, m->steps, 0, m->swizzle, 3, 0);
                if (err) {
                    PyErr_Format(PyExc_RuntimeError, "a kept route's tensor map did not encode: CUDA error %d", err);
                    goto fail;
                }
                m->last = v;
            }
        }
        int err = r->launch(s->func, s->dims[0], s->dims[1], s->dims[2], s->dims[3], s->dims[4], s->dims[5],
                            s->dims[6], stream, s->params, NULL);
        routes_launched++;
        if (err) {
            PyErr_Format(PyExc_RuntimeError, "a kept route's kernel did not launch: CUDA error %d (an error of an "
                         "earlier kernel shows at the next launch)", err);
            goto fail;
        }
    }
    out = made[r->result - n];
    Py_INCREF(out);
fail:
    for (Py_ssize_t k = 0; k < made_n; k++) Py_DECREF(made[k]);
    return out;
}

static PyObject* route_get_expires(Route* r, void* closure) { return PyLong_FromLongLong(r->expires); }

static int route_set_expires(Route* r, PyObject* v, void* closure) {
    long long e = v ? PyLong_AsLongLong(v) : 0;
    if (PyErr_Occurred()) return -1;
    r->expires = e;
    return 0;
}

static PyObject* py_now(PyObject* self, PyObject* unused) { return PyLong_FromLongLong(now_ns()); }

static PyObject* py_launched(PyObject* self, PyObject* unused) {
    return PyLong_FromUnsignedLongLong(routes_launched);
}

static PyGetSetDef route_getset[] = {
    {"expires", (getter)route_get_expires, (setter)route_set_expires,
     "monotonic ns (convlab_launch.now()) after which a call answers NotImplemented", NULL},
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL}};

static PyTypeObject RouteType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "convlab_launch.Route",
    .tp_basicsize = sizeof(Route),
    .tp_dealloc = (destructor)route_dealloc,
    .tp_call = (ternaryfunc)route_call,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A route's GPU work for one call signature, launched by one C call",
    .tp_getset = route_getset,
    .tp_dictoffset = offsetof(Route, dict),
    .tp_init = (initproc)route_init,
    .tp_new = PyType_GenericNew,
};

static PyMethodDef methods[] = {
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL, "cuLaunchKernel from Python ints"},
    {"now", py_now, METH_NOARGS, "the monotonic clock a Route's expiry reads, in ns"},
    {"launched", py_launched, METH_NOARGS, "how many kernels Routes have launched, all together"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "convlab_launch", NULL, -1, methods};

PyMODINIT_FUNC PyInit_convlab_launch(void) {
    if (PyType_Ready(&RouteType) < 0) return NULL;
    PyObject* m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&RouteType);
    if (PyModule_AddObject(m, "Route", (PyObject*)&RouteType) < 0) {
        Py_DECREF(&RouteType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
