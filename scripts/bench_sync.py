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
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson
import psutil
import pymongo
from _local import (
    BenchError,
    add_server_options,
    bench_setup,
    code_version,
    heading,
    mcdc,
    print_verdicts,
    run_bench,
    show,
    tree_rss,
)
from bson.raw_bson import RawBSONDocument
from pymongo import monitoring

from tests.support.corpus import load_bulk
from tests.support.servers import connect

DB = "bench"
COLL = "docs"
INCLUDE = r"bench\.docs"
BATCH = 1_000
RATIO_TARGET = 1.0
RSS_TARGET_MB = 300.0
SAMPLE_S = 0.05
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


# -- data -------------------------------------------------------------------------------------------------


class _InsertCounter(monitoring.CommandListener):
    """Counts the documents the server acknowledged inserting: progress without querying the server."""

    def __init__(self) -> None:
        self.docs = 0

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        pass

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        if event.command_name == "insert":
            self.docs += int(event.reply.get("n", 0))

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


def _load_source(uri: str, docs: int, doc_size: int) -> None:
    """Make ``bench.docs`` hold exactly the requested documents, reusing a matching earlier load."""
    wanted = {"_id": COLL, "docs": docs, "doc_size": doc_size, "seed": 0}
    counter = _InsertCounter()
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(uri, event_listeners=[counter])
    with client:
        db = client[DB]
        if db.meta.find_one({"_id": COLL}) == wanted and db[COLL].count_documents({}) == docs:
            print(f"reusing the {docs:,} documents already in {DB}.{COLL}")
            return
        client.drop_database(DB)
        started = time.monotonic()
        failure: list[BaseException] = []

        def load() -> None:
            try:
                load_bulk(client, DB, COLL, docs, doc_size=doc_size)
            except BaseException as exc:  # re-raised in the main thread
                failure.append(exc)

        loader = threading.Thread(target=load, name="load_bulk", daemon=True)
        loader.start()
        while loader.is_alive():
            loader.join(5.0)
            elapsed = time.monotonic() - started
            print(f"  loaded {counter.docs:>10,} / {docs:,}  ({_per_s(counter.docs, elapsed):,.0f} docs/s)", flush=True)
        if failure:
            raise failure[0]
        db.meta.replace_one({"_id": COLL}, wanted, upsert=True)
        size = db.command("collStats", COLL).get("avgObjSize")
        print(f"loaded {docs:,} documents (avgObjSize {size}) in {time.monotonic() - started:.1f} s")


def load_and_warm(source: str, docs: int, doc_size: int) -> None:
    """The benchmark's source collection, loaded, then read once so both contenders find it in cache."""
    heading(f"Loading {docs:,} documents of ~{doc_size} bytes into {DB}.{COLL} on the source")
    _load_source(source, docs, doc_size)
    heading("Warming up: one raw scan of the source collection")
    print(f"scanned in {_warm_source(source):.1f} s")


def _warm_source(uri: str) -> float:
    """Read the whole collection once (raw, no decoding) so that the first copy does not read it cold."""
    started = time.perf_counter()
    with connect(uri) as client:
        raw = client.codec_options.with_options(document_class=RawBSONDocument)
        coll = client[DB].get_collection(COLL, codec_options=raw)
        for _ in coll.find({}):
            pass
    return time.perf_counter() - started


def _reset_target(uri: str) -> None:
    with connect(uri) as client:
        client.drop_database(DB)


def _check_target(uri: str, docs: int, kind: str) -> None:
    with connect(uri) as client:
        count = client[DB][COLL].count_documents({})
    if count != docs:
        raise BenchError(f"{kind}: the target holds {count:,} documents in {DB}.{COLL}, not {docs:,}")


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
    return mcdc(
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
    out_path, err_path = logdir / f"mcdc-{repeat}.out", logdir / f"mcdc-{repeat}.err"
    peak = 0
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        started = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        try:
            watched = psutil.Process(proc.pid)
            while True:
                peak = max(peak, tree_rss(watched))
                try:
                    proc.wait(SAMPLE_S)
                    break
                except subprocess.TimeoutExpired:
                    pass
        finally:
            if proc.poll() is None:  # Ctrl-C or an error here: do not leave mcdc running
                proc.terminate()
                proc.wait()
        wall = time.perf_counter() - started
    if proc.returncode != 0:
        tail = err_path.read_text(errors="replace")[-3000:]
        raise BenchError(f"mcdc exited {proc.returncode}:\n{tail}")
    summary = orjson.loads(out_path.read_bytes())
    copied = int(summary["documents"])
    if copied != docs:
        raise BenchError(f"mcdc reported {copied:,} documents copied, not {docs:,}")
    elapsed = float(summary["elapsed_s"])
    for line in err_path.read_text(errors="replace").splitlines():
        if " mcdc" in line and "pymongo" not in line:  # mcdc's own log: its phases, with timestamps
            print(f"  | {line}")
    return Run(
        "mcdc",
        repeat,
        copied,
        round(wall, 3),
        round(_per_s(copied, wall)),
        summary_elapsed_s=elapsed,
        summary_docs_per_s=round(_per_s(copied, elapsed)),
        peak_rss_mb=round(peak / _MB, 1),
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
        "mcdc_code": code_version(),
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
    heading(f"Results: {data['docs']:,} documents of ~{data['doc_size']} bytes, measured on {data['server']}")
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
    print_verdicts(data["targets"], data["commands"])


# -- main -------------------------------------------------------------------------------------------------


def bench(args: argparse.Namespace) -> dict[str, Any]:
    with bench_setup("bench_sync", args, "mcdc-bench-run-") as (workdir, source, target, server):
        load_and_warm(source, args.docs, args.doc_size)
        runs: list[Run] = []
        argv: list[str] = []
        for repeat in range(1, args.repeat + 1):
            heading(f"Run {repeat}/{args.repeat}: baseline (pymongo find -> insert_many({BATCH}))")
            _reset_target(target)
            run = baseline(source, target, args.docs, repeat)
            _check_target(target, args.docs, "baseline")
            print(f"{run.wall_s:.2f} s, {run.docs_per_s:,} docs/s")
            runs.append(run)

            heading(f"Run {repeat}/{args.repeat}: mcdc sync")
            _reset_target(target)
            checkpoint = workdir / f"checkpoint-{repeat}.json"
            for stale in workdir.glob(f"{checkpoint.name}*"):  # mcdc falls back to <name>.backup
                stale.unlink()
            argv = mcdc_argv(source, target, checkpoint, args.workers, args.mcdc_arg)
            print(f"$ {show(argv)}", flush=True)
            run = run_mcdc(argv, args.docs, repeat, workdir)
            _check_target(target, args.docs, "mcdc")
            print(f"{run.wall_s:.2f} s wall ({run.summary_elapsed_s} s by its summary), {run.docs_per_s:,} docs/s,")
            print(f"peak RSS {run.peak_rss_mb} MB")
            runs.append(run)
        commands = {
            "bench": show([sys.executable, *sys.argv]),
            "baseline": f"in-process: pymongo find({{}}) on {DB}.{COLL} -> insert_many({BATCH}) (ordered, dicts)",
            "mcdc": show(argv),
        }
        return figures(runs, args, commands, server)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=500_000, help="documents to copy (default 500000)")
    parser.add_argument("--doc-size", type=int, default=200, help="approximate BSON bytes per document (default 200)")
    parser.add_argument("--workers", type=int, default=4, help="mcdc sync --workers (default 4)")
    parser.add_argument("--repeat", type=int, default=1, help="alternate baseline and mcdc this many times")
    add_server_options(parser, "one more argument for mcdc sync (repeatable), e.g. --mcdc-arg=--partition-docs=1000000")
    args = parser.parse_args(argv)
    if args.docs < 1 or args.repeat < 1 or args.workers < 1:
        parser.error("--docs, --repeat and --workers must be at least 1")
    return run_bench("bench_sync", lambda: bench(args), print_report, args.json)


if __name__ == "__main__":
    sys.exit(main())
