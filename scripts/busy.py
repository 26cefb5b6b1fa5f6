"""Run a command with N CPU-bound processes beside it: `python scripts/busy.py 2 -- pytest ...`.

CI runs the notebook stage this way, so an output that depends on how fast the machine is (a
progress line, a timeout) fails there rather than on a student's slower laptop."""
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
