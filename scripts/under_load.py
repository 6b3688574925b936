"""Run a command next to processes that burn CPU, as on a busy laptop or a shared CI runner.

    python scripts/under_load.py --burners 2 -- bash scripts/test.sh
    python scripts/under_load.py --burners 2 --times 10 -- .venv/bin/python -m pytest -q tests/test_lake.py -k kill

Each burner is a process spinning in a loop (one core each at most); they are stopped when the command
ends. ``--times N`` runs the command N times in a row, stopping at the first failure. Prints each run's exit
code and wall time; the exit code is the first failing run's (0 when all passed).
"""

from __future__ import annotations

import argparse
import multiprocessing
import subprocess
import sys
import time


def _burn() -> None:
    n = 0
    while True:
        n = (n * 1103515245 + 12345) & 0xFFFFFFFF


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--burners", type=int, default=2, help="CPU-burning processes beside the command")
    parser.add_argument("--times", type=int, default=1, help="run the command this many times in a row")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    burners = [multiprocessing.Process(target=_burn, daemon=True) for _ in range(args.burners)]
    for burner in burners:
        burner.start()
    try:
        for n in range(1, args.times + 1):
            started = time.monotonic()
            code = subprocess.call(command)
            print(
                f"under_load: run {n}/{args.times} with {args.burners} burners: exit {code} in "
                f"{time.monotonic() - started:.0f} s",
                flush=True,
            )
            if code != 0:
                return code
        return 0
    finally:
        for burner in burners:
            burner.terminate()
        for burner in burners:
            burner.join()


if __name__ == "__main__":
    sys.exit(main())
