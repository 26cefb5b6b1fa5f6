// convlab's kernel launch in one C call. The GPU backend launches through the CUDA driver's
// cuLaunchKernel; called through ctypes, converting its eleven arguments costs more than the
// driver's own work. This Python extension takes them as Python ints (METH_FASTCALL, no tuple)
// and calls cuLaunchKernel at the address the backend passes, so nothing here links to CUDA.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

typedef int (*launch_fn)(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                         unsigned shared, void* stream, void** params, void** extra);

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

static PyMethodDef methods[] = {
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL, "cuLaunchKernel from Python ints"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "convlab_launch", NULL, -1, methods};

PyMODINIT_FUNC PyInit_convlab_launch(void) { return PyModule_Create(&module); }
