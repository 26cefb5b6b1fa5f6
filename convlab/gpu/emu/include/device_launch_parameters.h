// device_launch_parameters.h for convlab's emulator: everything lives in cuda_emu.h (force-included).
#pragma once
