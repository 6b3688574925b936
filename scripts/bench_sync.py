"""Benchmark: ``mcdc sync`` of one collection against a plain pymongo copy loop, on the same two servers.

    python scripts/bench_sync.py [--docs 500000] [--doc-size 200] [--workers 4] [--repeat 1] [--json]
    python scripts/bench_sync.py --source mongodb://... --target mongodb://...

Loads ``bench.docs`` (``--docs`` documents of about ``--doc-size`` bytes) into the source, then for each repeat:

1. baseline: one pymongo cursor (default dict documents) over the source collection feeding
   ``insert_many`` batches of 1,000 into the target, timed from connecting to the last acknowledgement;
2. ``mcdc sync --include 'bench\\.docs'`` as a subprocess with a fresh checkpoint, timed from process start to
   exit, its peak RSS (children included) sampled every 50 ms.

The target's ``bench`` database is dropped before each copy and its count checked after. The source is
scanned once before the first copy so neither copy reads it cold. Prints a table and PASS/FAIL for the
targets (mcdc/baseline >= 1.0, peak RSS < 300 MB); exits 0 whatever they say: it is a measurement. Exits 1
only when a copy fails or leaves the wrong count.

Without ``--source/--target`` it starts two local SecantusDB servers (a Python MongoDB-compatible server,
several times slower than mongod) in a temporary directory: figures are for that server, not for MongoDB.
With them, only the ``bench`` database is touched (dropped on the target, reloaded on the source if its
``bench.meta`` marker does not match the requested data).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import harness
import orjson

from tests.support.servers import connect

DB, COLL, INCLUDE = harness.DB, harness.COLL, harness.INCLUDE  # the shared bench collection
BATCH = 1_000
RATIO_TARGET = 1.0
RSS_TARGET_MB = 300.0
_MB = 1024 * 1024


@dataclass
class Run:
    """One timed copy."""

    kind: str  # "baseline" | "mcdc"
    repeat: int
    docs: int
    wall_s: float
    docs_per_s: float
    summary_elapsed_s: float | None = None  # mcdc's own figure: process start-up excluded
    summary_docs_per_s: float | None = None
    peak_rss_mb: float | None = None


def _per_s(docs: int, seconds: float) -> float:
    return docs / seconds if seconds > 0 else 0.0


# -- the two copies ---------------------------------------------------------------------------------------


def baseline(source: str, target: str, docs: int, repeat: int) -> Run:
    """The plain copy loop a person would write first: find() into insert_many(1,000)."""
    started = time.perf_counter()
    copied = 0
    with connect(source) as src, connect(target) as dst:
        out = dst[DB][COLL]
        batch: list[dict[str, Any]] = []
        for doc in src[DB][COLL].find({}):
            batch.append(doc)
            if len(batch) == BATCH:
                out.insert_many(batch)
                copied += len(batch)
                batch = []
        if batch:
            out.insert_many(batch)
            copied += len(batch)
    wall = time.perf_counter() - started
    return Run("baseline", repeat, copied, round(wall, 3), round(_per_s(copied, wall)))


def mcdc_argv(source: str, target: str, checkpoint: Path, workers: int, extra: Sequence[str] = ()) -> list[str]:
    """The mcdc command the benchmark times (``extra``: more options, as --mcdc-arg gave them)."""
    return harness.mcdc(
        "sync",
        "--source", source,
        "--target", target,
        "--include", INCLUDE,
        "--checkpoint", str(checkpoint),
        "--workers", str(workers),
        "--no-progress",
        "--json",
        *extra,
    )  # fmt: skip


def run_mcdc(argv: list[str], docs: int, repeat: int, logdir: Path) -> Run:
    """Run mcdc sync, sampling its peak RSS; its JSON summary is parsed for documents and elapsed_s."""
    done = harness.run_measured(argv, f"mcdc-{repeat}", logdir, what="mcdc")
    summary = orjson.loads(done.stdout)
    copied = int(summary["documents"])
    if copied != docs:
        raise harness.BenchError(f"mcdc reported {copied:,} documents copied, not {docs:,}")
    elapsed = float(summary["elapsed_s"])
    for line in done.err_path.read_text(errors="replace").splitlines():
        if " mcdc" in line and "pymongo" not in line:  # mcdc's own log: its phases, with timestamps
            print(f"  | {line}")
    return Run(
        "mcdc",
        repeat,
        copied,
        round(done.wall_s, 3),
        round(_per_s(copied, done.wall_s)),
        summary_elapsed_s=elapsed,
        summary_docs_per_s=round(_per_s(copied, elapsed)),
        peak_rss_mb=round(done.peak_rss / _MB, 1),
    )


# -- report -----------------------------------------------------------------------------------------------


def _best(runs: list[Run], kind: str) -> Run:
    return max((r for r in runs if r.kind == kind), key=lambda r: r.docs_per_s)


def figures(runs: list[Run], args: argparse.Namespace, commands: dict[str, str], server: str) -> dict[str, Any]:
    """Everything printed, as one JSON-able dict (the best run of each kind is the figure)."""
    base, tool = _best(runs, "baseline"), _best(runs, "mcdc")
    ratio = tool.docs_per_s / base.docs_per_s if base.docs_per_s else 0.0
    summary_ratio = (tool.summary_docs_per_s or 0) / base.docs_per_s if base.docs_per_s else 0.0
    peak = max(r.peak_rss_mb or 0.0 for r in runs)
    return {
        "server": server,
        "docs": args.docs,
        "doc_size": args.doc_size,
        "workers": args.workers,
        "repeat": args.repeat,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "mcdc_code": harness.code_version(),
        "baseline_docs_per_s": base.docs_per_s,
        "mcdc_docs_per_s": tool.docs_per_s,
        "mcdc_summary_docs_per_s": tool.summary_docs_per_s,
        "ratio": round(ratio, 3),
        "ratio_summary": round(summary_ratio, 3),
        "mcdc_peak_rss_mb": peak,
        "targets": {
            f"ratio >= {RATIO_TARGET}": ratio >= RATIO_TARGET,
            f"peak RSS < {RSS_TARGET_MB:.0f} MB": peak < RSS_TARGET_MB,
        },
        "median_docs_per_s": {
            kind: round(statistics.median(r.docs_per_s for r in runs if r.kind == kind))
            for kind in ("baseline", "mcdc")
        },
        "runs": [asdict(r) for r in runs],
        "commands": commands,
    }


def print_report(data: dict[str, Any]) -> None:
    harness.heading(f"Results: {data['docs']:,} documents of ~{data['doc_size']} bytes, measured on {data['server']}")
    print(f"{data['cpus']} CPUs, Python {data['python']}, mcdc --workers {data['workers']}; best of {data['repeat']}")
    print(f"mcdc code: {data['mcdc_code']}")
    print(f"{'run':<4}{'copy':<10}{'wall s':>9}{'docs/s':>10}{'mcdc elapsed_s':>16}{'docs/s':>10}{'peak RSS MB':>13}")
    for r in data["runs"]:
        elapsed = f"{r['summary_elapsed_s']:.3f}" if r["summary_elapsed_s"] is not None else "-"
        rate = f"{r['summary_docs_per_s']:,}" if r["summary_docs_per_s"] is not None else "-"
        rss = f"{r['peak_rss_mb']:.1f}" if r["peak_rss_mb"] is not None else "-"
        print(
            f"{r['repeat']:<4}{r['kind']:<10}{r['wall_s']:>9.2f}{r['docs_per_s']:>10,}{elapsed:>16}{rate:>10}{rss:>13}"
        )
    print()
    print(f"baseline           {data['baseline_docs_per_s']:>10,} docs/s")
    print(f"mcdc (wall)        {data['mcdc_docs_per_s']:>10,} docs/s   (process start-up included)")
    print(f"mcdc (elapsed_s)   {data['mcdc_summary_docs_per_s']:>10,} docs/s   (mcdc's own summary)")
    print(f"ratio mcdc/baseline {data['ratio']:>9.2f}   ({data['ratio_summary']:.2f} by elapsed_s)")
    print(f"mcdc peak RSS      {data['mcdc_peak_rss_mb']:>10.1f} MB")
    harness.print_verdicts(data["targets"], data["commands"])


# -- main -------------------------------------------------------------------------------------------------


def bench(args: argparse.Namespace) -> dict[str, Any]:
    with harness.bench_setup("bench_sync", args, "mcdc-bench-run-", load=True) as (workdir, source, target, server):
        runs: list[Run] = []
        argv: list[str] = []
        for repeat in range(1, args.repeat + 1):
            harness.heading(f"Run {repeat}/{args.repeat}: baseline (pymongo find -> insert_many({BATCH}))")
            harness.reset_target(target)
            run = baseline(source, target, args.docs, repeat)
            harness.check_target(target, args.docs, "baseline")
            print(f"{run.wall_s:.2f} s, {run.docs_per_s:,} docs/s")
            runs.append(run)

            harness.heading(f"Run {repeat}/{args.repeat}: mcdc sync")
            harness.reset_target(target)
            checkpoint = harness.fresh_checkpoint(workdir, f"checkpoint-{repeat}.json")
            argv = mcdc_argv(source, target, checkpoint, args.workers, args.mcdc_arg)
            run = run_mcdc(argv, args.docs, repeat, workdir)
            harness.check_target(target, args.docs, "mcdc")
            print(f"{run.wall_s:.2f} s wall ({run.summary_elapsed_s} s by its summary), {run.docs_per_s:,} docs/s,")
            print(f"peak RSS {run.peak_rss_mb} MB")
            runs.append(run)
        commands = {
            "bench": harness.show([sys.executable, *sys.argv]),
            "baseline": f"in-process: pymongo find({{}}) on {DB}.{COLL} -> insert_many({BATCH}) (ordered, dicts)",
            "mcdc": harness.show(argv),
        }
        return figures(runs, args, commands, server)


def main(argv: list[str] | None = None) -> int:
    parser = harness.parser(__doc__)
    harness.size_options(parser, docs=(500_000, "documents to copy"), doc_size=200)
    parser.add_argument("--workers", type=int, default=4, help="mcdc sync --workers (default 4)")
    parser.add_argument("--repeat", type=int, default=1, help="alternate baseline and mcdc this many times")
    harness.add_server_options(
        parser, "one more argument for mcdc sync (repeatable), e.g. --mcdc-arg=--partition-docs=1000000"
    )
    parser.error_if(
        lambda a: a.docs < 1 or a.repeat < 1 or a.workers < 1, "--docs, --repeat and --workers must be at least 1"
    )
    return harness.main("bench_sync", parser, argv, bench, print_report)


if __name__ == "__main__":
    sys.exit(main())
