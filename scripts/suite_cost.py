"""What a command (the test suite) costs in CPU, by kind of process: run it, poll its process tree, add up.

    python scripts/suite_cost.py -- bash scripts/test.sh -q -p no:cacheprovider

Every second each live descendant's CPU time (user + system) is read with psutil; a process's last reading
before it ends is its cost, so one that lives less than a poll is missed (its parent's waited-for children
totals, from /usr/bin/time, catch those: the last line compares both). Kinds are told by the command line:
Spark's and Debezium's JVMs, the test servers (SecantusDB), mcdc processes, pytest's workers, Spark's Python
workers, Kafka's test broker, and the rest. Prints one table and the total; ``--json`` for a script.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import psutil

#: (kind, a test on the command line), the first that holds wins
KINDS: tuple[tuple[str, str], ...] = (
    ("JVM: Spark", "org.apache.spark"),
    ("JVM: Debezium and other Java", "java"),
    ("test servers (SecantusDB)", "secantus"),
    ("Kafka test broker", "noida"),
    ("mcdc processes", "replicator.cli"),
    ("mcdc processes", "bin/mcdc"),
    ("Spark's Python workers", "pyspark"),
    ("pytest and its workers", "pytest"),
    ("pytest and its workers", "exec(eval(sys.stdin.readline()))"),  # pytest-xdist's workers, started by execnet
)


def kind_of(cmdline: list[str]) -> str:
    text = " ".join(cmdline)
    for kind, mark in KINDS:
        if mark in text:
            return kind
    return "other (shells, scripts, tools)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between polls")
    parser.add_argument("--json", action="store_true", help="the figures as JSON on the last line")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --")
    started = time.monotonic()
    child = subprocess.Popen(command)
    root = psutil.Process(child.pid)
    last: dict[tuple[int, float], tuple[str, float]] = {}  # (pid, create time) -> (kind, cpu seconds so far)
    while child.poll() is None:
        try:
            tree = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            break
        for proc in tree:
            try:
                with proc.oneshot():
                    times = proc.cpu_times()
                    key = (proc.pid, proc.create_time())
                    kind = last[key][0] if key in last else kind_of(proc.cmdline())
                    last[key] = (kind, times.user + times.system)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        time.sleep(args.interval)
    code = child.wait()
    wall = time.monotonic() - started
    by_kind: dict[str, float] = {}
    counts: dict[str, int] = {}
    for kind, cpu in last.values():
        by_kind[kind] = by_kind.get(kind, 0.0) + cpu
        counts[kind] = counts.get(kind, 0) + 1
    polled = sum(by_kind.values())
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    waited = usage.ru_utime + usage.ru_stime
    print(f"\nCPU by kind of process (polled every {args.interval:g} s over {wall / 60:.1f} min, exit {code}):")
    for kind, cpu in sorted(by_kind.items(), key=lambda item: -item[1]):
        print(f"  {kind:32} {cpu:8.0f} CPU-s  {cpu / polled:6.1%}  ({counts[kind]} processes)")
    print(f"  {'total polled':32} {polled:8.0f} CPU-s")
    print(f"  {'waited-for children (rusage)':32} {waited:8.0f} CPU-s  (processes that ended between polls too)")
    if args.json:
        figures = {"wall_s": round(wall, 1), "exit": code, "polled_cpu_s": round(polled, 1),
                   "waited_cpu_s": round(waited, 1), "by_kind": {k: round(v, 1) for k, v in by_kind.items()},
                   "processes": counts}  # fmt: skip
        print(json.dumps(figures))
    return code


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
