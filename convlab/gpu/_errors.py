"""Errors a student meets. Each message says what went wrong and what to change; the Python
process (a notebook's kernel) always survives them."""


class ConvlabError(Exception):
    """Base class of every error convlab raises on purpose."""


class CompileError(ConvlabError):
    """The compiler rejected a kernel file; the message gives the .cu file and line."""


class LaunchError(ConvlabError):
    """A launch configuration a GPU would refuse (block or grid over the limits, too much shared memory)."""


class ArgumentError(ConvlabError):
    """An argument that does not match the kernel's parameter (dtype, kind, device, count)."""


class KernelFault(ConvlabError):
    """A fault while the kernel ran (emulator)."""


class BarrierError(KernelFault):
    """__syncthreads() reached by only part of a block, or by threads at different places."""


class WarpMaskError(BarrierError):
    """A *_sync warp operation whose mask leaves out a lane that calls it, differs between the lanes
    of one call, or names a lane that never arrives; the message names the lanes, the masks and the line."""


class OutOfBoundsError(KernelFault):
    """A kernel read or wrote outside a buffer argument."""


class KernelTimeout(KernelFault):
    """A kernel that did not finish within the time limit."""


class CheckError(ConvlabError, AssertionError):
    """A kernel's output does not match the reference."""


class BackendUnavailable(ConvlabError):
    """The backend that was asked for cannot run here; the message says why."""


class RaceError(KernelFault):
    """Threads that touch the same element with nothing ordering them, at least one writing
    (the emulator's race detector); the message names both source lines and the fix."""


class KernelInterrupted(KeyboardInterrupt):
    """An emulator launch stopped by an interrupt (Jupyter's stop button, Ctrl-C); the message says
    where its threads were. A KeyboardInterrupt, so the cell stops as it would for Python code."""


class RaceDetectorOff(UserWarning):
    """The emulator could not build a kernel file with the race detector: its launches run, checked
    for bounds, but not for races. The warning says why and what to change."""


class ProfileUnavailable(ConvlabError):
    """No profile can be taken here and none was committed; the message says why and what to do."""
