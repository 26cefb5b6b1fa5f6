"""convlab.native: the C extension that calls cuLaunchKernel in one C call. No GPU needed: it is
handed the address of a C-callable stand-in with cuLaunchKernel's signature, which records what
arrives."""
import ctypes

import pytest

from convlab import native

LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p,
                          ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p))


def test_the_extension_passes_every_argument_and_returns_the_drivers_code():
    launch = native.fast_launch()
    if launch is None:
        pytest.skip(f"convlab.native cannot be built here: {native.why_not()}")
    seen = []

    def stand_in(func, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        seen.append((func, gx, gy, gz, bx, by, bz, shared, stream, ctypes.cast(params, ctypes.c_void_p).value,
                     bool(extra)))
        return 719                      # an error code, handed back as it is

    cb = LAUNCH(stand_in)
    address = ctypes.cast(cb, ctypes.c_void_p).value
    params = (ctypes.c_void_p * 2)(0x10, 0x20)
    big = 2**40 + 5                     # a function handle and a stream are 64-bit pointers
    err = launch(address, big, 70000, 2, 3, 256, 1, 1, 232448, big + 1, ctypes.addressof(params))
    assert err == 719
    assert seen == [(big, 70000, 2, 3, 256, 1, 1, 232448, big + 1, ctypes.addressof(params), False)]


def test_the_extension_refuses_what_is_not_eleven_ints():
    launch = native.fast_launch()
    if launch is None:
        pytest.skip(f"convlab.native cannot be built here: {native.why_not()}")
    with pytest.raises(TypeError, match="11 integer arguments"):
        launch(1, 2, 3)
    with pytest.raises(TypeError):
        launch(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, "eleven")
    with pytest.raises(OverflowError):
        launch(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, -1)


def test_the_ctypes_fallback_passes_the_same_arguments():
    """Where convlab.native cannot be built the driver launches through ctypes: the same eleven
    values must reach cuLaunchKernel (a stand-in with its C signature records them)."""
    from convlab.backend_cuda import Driver

    seen = []

    def stand_in(func, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        seen.append((func, gx, gy, gz, bx, by, bz, shared, stream, ctypes.cast(params, ctypes.c_void_p).value,
                     bool(extra)))
        return 0

    cb = LAUNCH(stand_in)
    # called as libcuda's is: a C function without argtypes, each argument as its ctypes object says
    c_function = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.cast(cb, ctypes.c_void_p).value)
    c_function.argtypes = None
    driver = object.__new__(Driver)                  # no libcuda: only the launch is used
    driver.lib = type("Lib", (), {"cuLaunchKernel": c_function})()
    params = (ctypes.c_void_p * 1)(0x10)
    big = 2**40 + 5
    args = (big, 70000, 2, 3, 256, 1, 1, 232448, big + 1, ctypes.addressof(params))
    assert driver._ctypes_launch(*args) == 0
    assert seen == [(*args, False)]
