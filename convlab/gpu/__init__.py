"""The GPU, real or emulated: compile, load and launch kernels (PyCUDA on a GPU, the CPU emulator without one), check their arguments and outputs."""
