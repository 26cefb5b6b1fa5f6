"""Run a command with N CPU-bound processes beside it: `python scripts/busy.py 2 -- pytest ...`.

`make test NOTEBOOK_LOAD=2` runs the notebook stage this way, so an output that depends on how fast
the machine is (a progress line, a timeout) fails on a loaded machine rather than on a student's
slower laptop. (CI runs the stage unloaded, within its time; the emulator's own tests hold that no
progress line reaches a compared output and that a long launch that progresses runs to its end.)"""
import multiprocessing
import subprocess
import sys


def spin():
    while True:
        pass


def main() -> int:
    n, sep, cmd = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    if sep != "--" or not cmd:
        sys.exit("usage: busy.py N -- command ...")
    hogs = [multiprocessing.Process(target=spin, daemon=True) for _ in range(n)]
    for h in hogs:
        h.start()
    try:
        return subprocess.call(cmd)
    finally:
        for h in hogs:
            h.terminate()


if __name__ == "__main__":
    sys.exit(main())
