"""pytest's settings for every test of the repository, the notebooks (nbval) included."""
import os

# No progress line from long emulator launches: it appears only on a slow machine, so an output
# that nbval compares would depend on the machine's speed (the notebooks' kernels inherit this).
os.environ["CONVLAB_PROGRESS"] = "0"
