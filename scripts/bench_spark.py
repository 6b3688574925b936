"""Benchmark: ``--engine spark`` against ``--engine asyncio`` on the same two servers, in one run.

    python scripts/bench_spark.py [--docs 500000] [--doc-size 300] [--events 50000] [--spark-master local[2]] [--json]
    python scripts/bench_spark.py --source mongodb://... --target mongodb://...

1. Snapshot. Loads ``bench.docs`` (``--docs`` documents of about ``--doc-size`` bytes; an earlier matching
   load is reused, as scripts/bench_sync.py does) and scans it once. Then for each engine, into a wiped target
   with a fresh checkpoint: ``mcdc sync --include 'bench\\.docs' --engine E --json`` as a subprocess. docs/s
   "with start" divides by the process's wall time (Python, and for Spark the JVM and the session, starting
   included); "without start" by the summary's ``snapshot_s``. The start overhead is wall - ``snapshot_s`` -
   ``replay_s`` (sync's replay of the snapshot window): interpreter, JVM and session start, planning, index
   builds. Memory is sampled every 50 ms: the Python driver (the mcdc process alone), the JVM it starts, and
   the Python workers under the JVM (where Spark's tasks run on a local master), each's peak.
2. Tail. ``bench`` is dropped on the source and an empty ``bench.events`` created; one ``mcdc sync
   --include 'bench\\.events' --snapshot never`` writes a checkpoint at the source's current time; then
   ``--events`` change events are made on ``bench.events`` (scripts/bench_tail.py's backlog: inserts,
   updates, replaces, deletes, after a drop of ``bench``). For each engine, from a copy of that checkpoint
   into a wiped target: ``mcdc catch-up --engine E --json``, then the target is compared with the source
   document by document. events/s by wall time and by the summary's ``replay_s``.
   Skipped for Spark (and said so) when this checkout has no Spark replay (replicator/engines/spark/).

Prints a table, the spark/asyncio ratios with and without the start, and PASS/FAIL for the targets
(spark/asyncio docs/s with start >= 0.8, spark/asyncio catch-up events/s with start >= 1.0, Spark driver
peak RSS < 300 MB); exits 0 whatever they say: it is a measurement. Exits 1 when a run fails or leaves the wrong data.

Without ``--source/--target`` it starts two local SecantusDB servers (a Python MongoDB-compatible server,
several times slower than mongod): figures are for that server; the ratios within one run are what count.
With them, only the ``bench`` database is touched (dropped on both by the tail part).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import harness
import orjson
import psutil
from bench_tail import EVENTS, compare, make_backlog

DB = harness.DB  # the shared bench database
ENGINES = ("asyncio", "spark")
RATIO_TARGET = 0.8  # the snapshot's, process start included
TAIL_RATIO_TARGET = 1.0  # the catch-up's, process start included
RSS_TARGET_MB = 300.0
RUN_TIMEOUT_S = 3600.0
_MB = 1024 * 1024


def spark_replay_exists() -> bool:
    """Whether this checkout replays change streams on Spark (else catch-up --engine spark replays on asyncio)."""
    for module in ("replicator.engines.spark.apply", "replicator.engines.spark.replay"):  # now, before
        if importlib.util.find_spec(module) is not None:
            return True
    return False


@dataclass
class Memory:
    """Peak RSS in MB of the mcdc process, the JVM(s) it started, and the Python processes under the JVM."""

    driver_mb: float = 0.0
    jvm_mb: float = 0.0
    python_workers_mb: float = 0.0
    total_mb: float = 0.0


def _sample(proc: psutil.Process, peak: Memory) -> int:
    """Take one sample into ``peak``; the total RSS in bytes."""
    driver = jvm = workers = 0
    with suppress(psutil.Error):
        driver = proc.memory_info().rss
        for child in proc.children(recursive=True):
            with suppress(psutil.Error):
                rss = child.memory_info().rss
                if child.name().startswith("java"):
                    jvm += rss
                else:
                    workers += rss  # pyspark.daemon and its forked workers (children of the JVM)
    peak.driver_mb = max(peak.driver_mb, round(driver / _MB, 1))
    peak.jvm_mb = max(peak.jvm_mb, round(jvm / _MB, 1))
    peak.python_workers_mb = max(peak.python_workers_mb, round(workers / _MB, 1))
    peak.total_mb = max(peak.total_mb, round((driver + jvm + workers) / _MB, 1))
    return driver + jvm + workers


@dataclass
class Run:
    """One timed mcdc command."""

    part: str  # "snapshot" | "tail"
    engine: str
    count: int  # documents copied / events replayed, from the summary
    wall_s: float
    elapsed_s: float  # the summary's: process and interpreter start excluded, Spark's session start included
    work_s: float  # the summary's snapshot_s (snapshot) / replay_s (tail)
    replay_s: float  # the summary's replay_s: for sync, the replay of the snapshot's window after the copy
    memory: Memory

    @property
    def start_s(self) -> float:
        """Neither copying nor replaying: wall - snapshot_s - replay_s (interpreter, Spark session and its
        JVM, planning, index builds, stopping)."""
        other = self.replay_s if self.part == "snapshot" else 0.0
        return round(self.wall_s - self.work_s - other, 2)

    @property
    def per_s_with_start(self) -> float:
        return round(self.count / self.wall_s) if self.wall_s else 0.0

    @property
    def per_s(self) -> float:
        return round(self.count / self.work_s) if self.work_s else 0.0

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(start_s=self.start_s, per_s_with_start=self.per_s_with_start, per_s=self.per_s)
        return data


def engine_options(engine: str, master: str) -> list[str]:
    if engine == "asyncio":
        return ["--engine", "asyncio"]
    return [
        "--engine", "spark", "--spark-master", master,
        "--spark-conf", "spark.ui.enabled=false", "--spark-conf", "spark.driver.host=127.0.0.1",
    ]  # fmt: skip


def timed(argv: list[str], part: str, engine: str, logdir: Path) -> Run:
    """Run one mcdc command with --json, sampling memory; the summary gives the counts and phase times."""
    peak = Memory()
    done = harness.run_measured(
        argv,
        f"{part}-{engine}",
        logdir,
        what=f"{part} on {engine}: mcdc",
        timeout=RUN_TIMEOUT_S,
        sample=lambda proc: _sample(proc, peak),
    )
    summary = orjson.loads(done.stdout)
    count = int(summary["documents" if part == "snapshot" else "events"])
    work = float(summary["snapshot_s" if part == "snapshot" else "replay_s"])
    replay = float(summary["replay_s"])
    return Run(part, engine, count, round(done.wall_s, 3), float(summary["elapsed_s"]), work, replay, peak)


# -- the two parts ------------------------------------------------------------------------------------------


def snapshot_runs(
    source: str, target: str, args: argparse.Namespace, workdir: Path, commands: dict[str, str]
) -> list[Run]:
    runs = []
    for engine in ENGINES:
        harness.heading(f"Snapshot: mcdc sync --engine {engine}")
        harness.reset_target(target)
        checkpoint = harness.fresh_checkpoint(workdir, f"snapshot-{engine}.json", ending="snapshot-*")
        argv = harness.mcdc(
            "sync", "--source", source, "--target", target, "--include", harness.INCLUDE,
            "--checkpoint", str(checkpoint), "--no-progress", "--json",
            *engine_options(engine, args.spark_master), *args.mcdc_arg,
        )  # fmt: skip
        commands[f"snapshot {engine}"] = harness.show(argv)
        run = timed(argv, "snapshot", engine, workdir)
        harness.check_target(target, args.docs, f"sync --engine {engine}")
        if run.count != args.docs:
            raise harness.BenchError(
                f"sync --engine {engine} reported {run.count:,} documents copied, not {args.docs:,}"
            )
        print(f"{run.wall_s:.2f} s wall, snapshot_s {run.work_s:.2f}, driver peak RSS {run.memory.driver_mb} MB")
        runs.append(run)
    return runs


def tail_runs(
    source: str, target: str, args: argparse.Namespace, workdir: Path, commands: dict[str, str]
) -> tuple[list[Run], dict[str, str]]:
    """The backlog replayed by each engine from copies of one checkpoint; engines skipped, with why."""
    harness.heading(f"Tail: a checkpoint, then a backlog of {args.events:,} change events on {DB}.{EVENTS}")
    from tests.support.servers import connect

    for uri in (source, target):
        with connect(uri) as client:
            client.drop_database(DB)
    with connect(source) as client:  # --include must match a namespace: an empty one, kept by the backlog
        client[DB].create_collection(EVENTS)
    base = harness.fresh_checkpoint(workdir, "tail-base.json")
    include = ["--include", rf"{DB}\.{EVENTS}", "--no-progress", "--json", *args.mcdc_arg]
    first = harness.mcdc("sync", "--source", source, "--target", target, "--checkpoint", str(base),
                         "--snapshot", "never", *include)  # fmt: skip
    done = subprocess.run(first, capture_output=True, check=False)
    if done.returncode != 0:
        raise harness.BenchError(
            f"the base checkpoint's catch-up exited {done.returncode}:\n{done.stderr.decode()[-3000:]}"
        )
    commands["tail checkpoint"] = harness.show(first)
    # no drop in the backlog: DDL after the checkpoint would be settled by copying bench.events again
    # (the DDL window), and this measures the replay of document events
    backlog = make_backlog(source, args.events, drop=False)
    print(f"{backlog.events:,} events in {backlog.build_s:.1f} s: {backlog.mix}")
    runs: list[Run] = []
    skipped: dict[str, str] = {}
    for engine in ENGINES:
        if engine == "spark" and not spark_replay_exists():
            skipped[engine] = "no Spark replay in this checkout (replicator/engines/spark/)"
            print(f"catch-up --engine spark: skipped, {skipped[engine]}")
            continue
        harness.heading(f"Tail: mcdc catch-up --engine {engine} from a copy of the checkpoint")
        harness.reset_target(target)
        checkpoint = harness.fresh_checkpoint(workdir, f"tail-{engine}.json")
        shutil.copyfile(base, checkpoint)
        argv = harness.mcdc("catch-up", "--source", source, "--target", target, "--checkpoint", str(checkpoint),
                            *engine_options(engine, args.spark_master), *include)  # fmt: skip
        commands[f"tail {engine}"] = harness.show(argv)
        run = timed(argv, "tail", engine, workdir)
        diff = compare(source, target, EVENTS)
        if not diff.identical:
            raise harness.BenchError(f"catch-up --engine {engine} left the target {diff.text()}")
        print(f"{run.wall_s:.2f} s wall, replay_s {run.work_s:.2f}, {run.count:,} events; target {diff.text()}")
        runs.append(run)
    return runs, skipped


# -- report -------------------------------------------------------------------------------------------------


def _ratio(runs: dict[str, Run], rate: str) -> float | None:
    """spark's ``rate`` over asyncio's, None when either did not run."""
    if len(runs) < 2 or not getattr(runs["asyncio"], rate):
        return None
    return float(getattr(runs["spark"], rate)) / float(getattr(runs["asyncio"], rate))


def figures(
    snapshot: list[Run], tail: list[Run], skipped: dict[str, str], args: argparse.Namespace, server: str,
    commands: dict[str, str],
) -> dict[str, Any]:  # fmt: skip
    by = {r.engine: r for r in snapshot}
    ratio = _ratio(by, "per_s") or 0.0
    started_ratio = _ratio(by, "per_s_with_start") or 0.0
    driver = by["spark"].memory.driver_mb
    tails = {r.engine: r for r in tail}
    tail_ratio, tail_started_ratio = _ratio(tails, "per_s"), _ratio(tails, "per_s_with_start")
    targets = {
        f"spark/asyncio docs/s with start >= {RATIO_TARGET}": started_ratio >= RATIO_TARGET,
        f"spark driver peak RSS < {RSS_TARGET_MB:.0f} MB": driver < RSS_TARGET_MB,
    }
    if tail_started_ratio is not None:
        targets[f"spark/asyncio catch-up events/s with start >= {TAIL_RATIO_TARGET}"] = (
            tail_started_ratio >= TAIL_RATIO_TARGET
        )
    return {
        "server": server,
        "docs": args.docs,
        "doc_size": args.doc_size,
        "events": args.events,
        "spark_master": args.spark_master,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "mcdc_code": harness.code_version(),
        "snapshot": [r.to_json() for r in snapshot],
        "tail": [r.to_json() for r in tail],
        "tail_skipped": skipped,
        "ratio_docs_per_s": round(ratio, 3),
        "ratio_docs_per_s_with_start": round(started_ratio, 3),
        "ratio_events_per_s": round(tail_ratio, 3) if tail_ratio is not None else None,
        "ratio_events_per_s_with_start": round(tail_started_ratio, 3) if tail_started_ratio is not None else None,
        "spark_start_overhead_s": round(by["spark"].start_s - by["asyncio"].start_s, 2),
        "targets": targets,
        "commands": commands,
    }


def print_report(data: dict[str, Any]) -> None:
    harness.heading(
        f"Results: {data['docs']:,} documents of ~{data['doc_size']} bytes and {data['events']:,} change events, "
        f"measured on {data['server']}"
    )
    print(f"{data['cpus']} CPUs, Python {data['python']}, --spark-master {data['spark_master']}")
    print(f"mcdc code: {data['mcdc_code']}")
    head = f"{'part':<9}{'engine':<8}{'count':>9}{'wall s':>8}{'work s':>8}{'replay s':>9}{'start s':>8}"
    print(head + f"{'/s w/ start':>12}{'/s':>9}{'driver MB':>10}{'JVM MB':>8}{'py wkrs MB':>11}")
    for r in data["snapshot"] + data["tail"]:
        m = r["memory"]
        print(
            f"{r['part']:<9}{r['engine']:<8}{r['count']:>9,}{r['wall_s']:>8.2f}{r['work_s']:>8.2f}{r['replay_s']:>9.2f}"
            f"{r['start_s']:>8.2f}"
            f"{r['per_s_with_start']:>12,}{r['per_s']:>9,}{m['driver_mb']:>10.1f}{m['jvm_mb']:>8.1f}"
            f"{m['python_workers_mb']:>11.1f}"
        )
    for engine, why in data["tail_skipped"].items():
        print(f"tail      {engine:<8}skipped: {why}")
    print()
    print(f"ratio spark/asyncio docs/s   {data['ratio_docs_per_s_with_start']:.2f} with start, "
          f"{data['ratio_docs_per_s']:.2f} without (snapshot_s)")  # fmt: skip
    if data["ratio_events_per_s"] is not None:
        print(f"ratio spark/asyncio events/s {data['ratio_events_per_s_with_start']:.2f} with start, "
              f"{data['ratio_events_per_s']:.2f} without (replay_s)")  # fmt: skip
    print(f"spark start overhead         {data['spark_start_overhead_s']:.2f} s   (start s, spark - asyncio)")
    harness.print_verdicts(data["targets"], data["commands"])


# -- main ---------------------------------------------------------------------------------------------------


def bench(args: argparse.Namespace) -> dict[str, Any]:
    with harness.bench_setup("bench_spark", args, "mcdc-bench-run-", load=True) as (workdir, source, target, server):
        commands = {"bench": harness.show([sys.executable, *sys.argv])}
        snapshot = snapshot_runs(source, target, args, workdir, commands)
        tail, skipped = tail_runs(source, target, args, workdir, commands)
        return figures(snapshot, tail, skipped, args, server, commands)


def main(argv: Sequence[str] | None = None) -> int:
    parser = harness.parser(__doc__)
    harness.size_options(
        parser, docs=(500_000, "documents to copy"), doc_size=300, events=(50_000, "change events in the tail backlog")
    )
    parser.add_argument(
        "--spark-master", default="local[2]", help="--spark-master of the Spark runs (default local[2])"
    )
    harness.add_server_options(parser)
    parser.error_if(lambda a: a.docs < 1 or a.events < 2, "--docs must be at least 1 and --events at least 2")
    return harness.main("bench_spark", parser, argv, bench, print_report)


if __name__ == "__main__":
    sys.exit(main())
