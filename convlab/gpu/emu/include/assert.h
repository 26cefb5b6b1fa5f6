// assert.h for convlab's emulator: a failed assert() in a kernel stops the launch with a
// message instead of aborting the Python process (cuda_emu.h defines it).
#pragma once
