"""Benchmark: mcdc's own CPU per document (sync) and per event (catch-up into MongoDB), against plain pymongo
clients doing the same work, on the same two servers, in one run.

    python scripts/bench_cpu.py [--docs 200000] [--events 50000] [--profile] [--json]

On a real mongod, mcdc's throughput per process is bound by its own CPU, not the server's: so this measures
CPU (user + system, of each contender's own process, from its start to its exit), not only wall time.

1. **Start**: the CPU of ``mcdc --version`` (Python, mcdc's imports) and of ``python -c 'import pymongo'``.
2. **Copy**: ``--docs`` small documents. The plain client: one RawBSON cursor feeding
   ``insert_many(ordered=False)`` batches of 1,000 (into ``bench_plain.docs``). mcdc: ``mcdc sync`` (into
   ``bench.docs``).
3. **Replay**: ``--events`` writes on the source afterwards (inserts, ``$set`` updates, deletes). The plain
   client: ``watch(full_document="updateLookup")`` from the position before them, ``bulk_write`` of
   ``ReplaceOne(upsert)``/``DeleteOne`` per 1,000 events (into ``bench_plain.docs``). mcdc: ``mcdc catch-up``
   (into ``bench.docs``). Both targets are checked equal to the source after.

Each contender runs as a process of its own; its CPU is its ``RUSAGE_CHILDREN`` delta. "Steady" is the
total less the start of step 1 (mcdc's start for mcdc, pymongo's for the plain client). With ``--profile``,
mcdc's copy and replay run once more under cProfile and their CPU is summed by stage (read and decode,
plan, write, checkpoint, progress, the DDL window and lookup checks, the event loop, the driver).

Figures on the local test server (SecantusDB) measure mcdc's CPU as they would on mongod; wall times there
are mostly the server's. Exits 0 whatever the ratios say: it is a measurement (1 when a run fails).
"""

from __future__ import annotations

import argparse
import pstats
import random
import resource
import subprocess
import sys
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pymongo
from _local import BenchError, add_server_options, bench_setup, code_version, heading, mcdc, print_verdicts, run_bench
from bson import Int64

from tests.support.corpus import load_bulk
from tests.support.servers import connect

DB, PLAIN, COLL = "bench", "bench_plain", "docs"
#: acceptance of issue 28: mcdc's steady CPU per document and per event against the plain clients'
DOC_RATIO, EVENT_RATIO, WALL_RATIO = 1.2, 1.3, 1.0

PLAIN_COPY = textwrap.dedent(
    """
    import sys, pymongo
    from bson.raw_bson import RawBSONDocument
    src = pymongo.MongoClient(sys.argv[1], document_class=RawBSONDocument)
    dst = pymongo.MongoClient(sys.argv[2], document_class=RawBSONDocument)
    out, batch = dst[sys.argv[3]][sys.argv[4]], []
    for doc in src[sys.argv[5]][sys.argv[4]].find({}, batch_size=1000):
        batch.append(doc)
        if len(batch) == 1000:
            out.insert_many(batch, ordered=False)
            batch = []
    if batch:
        out.insert_many(batch, ordered=False)
    """
)

PLAIN_REPLAY = textwrap.dedent(
    """
    import sys, pymongo
    from bson.raw_bson import RawBSONDocument
    from bson.timestamp import Timestamp
    from pymongo import DeleteOne, ReplaceOne
    src = pymongo.MongoClient(sys.argv[1], document_class=RawBSONDocument)
    dst = pymongo.MongoClient(sys.argv[2], document_class=RawBSONDocument)
    out, want, seen, ops = dst[sys.argv[3]][sys.argv[4]], int(sys.argv[6]), 0, []
    start = Timestamp(int(sys.argv[7]), int(sys.argv[8]))
    with src.watch(full_document="updateLookup", start_at_operation_time=start, batch_size=1000) as stream:
        for change in stream:
            if change["ns"]["db"] != sys.argv[5] or change["ns"]["coll"] != sys.argv[4]:
                continue
            seen += 1
            key = change["documentKey"]
            if change["operationType"] == "delete":
                ops.append(DeleteOne(key))
            elif change.get("fullDocument") is not None:
                ops.append(ReplaceOne(key, change["fullDocument"], upsert=True))
            if len(ops) == 1000 or seen == want:
                if ops:
                    out.bulk_write(ops, ordered=True)
                ops = []
            if seen == want:
                break
    """
)


def _cpu_of(argv: Sequence[str], *, cwd: Path | None = None) -> tuple[float, float, str]:
    """Run ``argv`` to its end: its CPU seconds (user + system), its wall seconds, its stderr's tail."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise BenchError(f"{' '.join(argv[:4])} ... exited {done.returncode}: {done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, done.stderr[-2000:]


def _start_costs(repeat: int = 3) -> dict[str, float]:
    """CPU seconds to start: mcdc (its imports and --version), and a Python importing pymongo."""
    mcdc_start = min(_cpu_of(mcdc("--version"))[0] for _ in range(repeat))
    plain_start = min(_cpu_of([sys.executable, "-c", "import pymongo, bson.raw_bson"])[0] for _ in range(repeat))
    return {"mcdc": mcdc_start, "plain": plain_start}


def _load(source: str, docs: int) -> None:
    with connect(source) as client:
        client.drop_database(DB)
        client[DB].create_collection(COLL)
        load_bulk(client, DB, COLL, docs, doc_size=120)


def _events(source: str, count: int, seed: int) -> None:
    """``count`` writes on the source's bench.docs: a third inserts, a third updates, a third deletes."""
    rng = random.Random(seed)
    with connect(source) as client:
        coll = client[DB][COLL]
        ids = [d["_id"] for d in coll.find({}, {"_id": 1}).limit(count)]
        ops: list[Any] = []
        for n in range(count):
            kind = n % 3
            if kind == 0 or not ids:
                ops.append(pymongo.InsertOne({"_id": Int64(10**12 + seed * count + n), "v": n, "s": "x" * 40}))
            elif kind == 1:
                ops.append(pymongo.UpdateOne({"_id": rng.choice(ids)}, {"$set": {"v": n}}))
            else:
                ops.append(pymongo.DeleteOne({"_id": ids.pop(rng.randrange(len(ids)))}))
            if len(ops) == 1000:
                coll.bulk_write(ops, ordered=True)
                ops = []
        if ops:
            coll.bulk_write(ops, ordered=True)


def _same(source: str, target: str, db: str) -> None:
    with connect(source) as src, connect(target) as dst:
        want = sorted(d["_id"] for d in src[DB][COLL].find({}, {"_id": 1}))
        got = sorted(d["_id"] for d in dst[db][COLL].find({}, {"_id": 1}))
    if want != got:
        raise BenchError(f"{db}.{COLL} on the target has {len(got):,} documents, the source {len(want):,}")


def _profile(argv: Sequence[str], out: Path) -> dict[str, float]:
    """CPU seconds by stage of one mcdc run under cProfile (each function's own time)."""
    _cpu_of([sys.executable, "-m", "cProfile", "-o", str(out), *argv[1:]])
    stats = pstats.Stats(str(out))
    stages: dict[str, float] = {}
    for (filename, _, _), (_, _, own, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        stage = stage_of(filename)
        stages[stage] = stages.get(stage, 0.0) + own
    return dict(sorted(stages.items(), key=lambda item: -item[1]))


#: which stage a file's own time belongs to, by the first of these that its path holds
STAGES = (
    ("replicator/source/", "read and decode (mcdc)"),
    ("replicator/normalize", "read and decode (mcdc)"),
    ("replicator/rawbson", "read and decode (mcdc)"),
    ("replicator/positions", "read and decode (mcdc)"),
    ("replicator/sinks/mongo", "plan and write (mcdc)"),
    ("replicator/update_ops", "plan and write (mcdc)"),
    ("replicator/checkpoint", "checkpoint"),
    ("replicator/watermark", "checkpoint"),
    ("replicator/progress", "progress"),
    ("replicator/tally", "progress"),
    ("replicator/metrics", "progress"),
    ("replicator/ddl_window", "DDL window and lookup checks"),
    ("replicator/replay_stage", "DDL window and lookup checks"),
    ("replicator/filters", "transform (selection, renames)"),
    ("replicator/fields", "transform (selection, renames)"),
    ("replicator/engines/", "the pipeline's loop"),
    ("replicator/aio", "the pipeline's loop"),
    ("replicator/", "other mcdc"),
    ("/pymongo/", "driver (pymongo)"),
    ("/bson/", "driver (bson)"),
    ("/asyncio/", "event loop (asyncio)"),
    ("<built-in", "built-ins (sockets, C calls)"),
    ("~", "built-ins (sockets, C calls)"),
)


def stage_of(filename: str) -> str:
    for part, stage in STAGES:
        if part in filename:
            return stage
    return "imports and other"


def bench(args: argparse.Namespace) -> dict[str, Any]:
    with bench_setup("bench_cpu.py", args, "mcdc-bench-cpu-") as (workdir, source, target, server):
        heading("Process start")
        start = _start_costs()
        print(f"mcdc --version: {start['mcdc']:.2f} s CPU; python -c 'import pymongo': {start['plain']:.2f} s")

        heading(f"Loading {args.docs:,} documents")
        _load(source, args.docs)
        with connect(target) as client:
            client.drop_database(DB)
            client.drop_database(PLAIN)

        heading("Copy: the plain client, then mcdc sync")
        plain_copy = _cpu_of([sys.executable, "-c", PLAIN_COPY, source, target, PLAIN, COLL, DB])
        cp = workdir / "cp.json"
        sync_argv = mcdc("sync", "-s", source, "-t", target, "-c", str(cp), "--include", r"bench\.docs",
                         "--no-progress", *args.mcdc_arg)  # fmt: skip
        mcdc_copy = _cpu_of(sync_argv)

        heading(f"Replay: {args.events:,} writes on the source, then the plain loop and mcdc catch-up")
        with connect(source) as client:
            before = client.admin.command("ping")["operationTime"]
        _events(source, args.events, seed=1)
        plain_argv = [sys.executable, "-c", PLAIN_REPLAY, source, target, PLAIN, COLL, DB, str(args.events)]
        plain_replay = _cpu_of([*plain_argv, str(before.time), str(before.inc)])
        catch_argv = mcdc("catch-up", "-s", source, "-t", target, "-c", str(cp), "--include", r"bench\.docs",
                          "--no-progress", *args.mcdc_arg)  # fmt: skip
        mcdc_replay = _cpu_of(catch_argv)
        _same(source, target, DB)
        _same(source, target, PLAIN)

        profile: dict[str, dict[str, float]] = {}
        if args.profile:
            heading("Profiles: mcdc sync and catch-up once more, under cProfile")
            with connect(target) as client:
                client.drop_database(DB)
            cp2 = workdir / "cp-profiled.json"
            profile["sync"] = _profile([a if a != str(cp) else str(cp2) for a in sync_argv], workdir / "sync.prof")
            _events(source, args.events, seed=2)
            catch2 = [a if a != str(cp) else str(cp2) for a in catch_argv]
            profile["catch-up"] = _profile(catch2, workdir / "catch-up.prof")

    docs, events = args.docs, args.events
    steady = {
        "mcdc_doc_us": (mcdc_copy[0] - start["mcdc"]) / docs * 1e6,
        "plain_doc_us": (plain_copy[0] - start["plain"]) / docs * 1e6,
        "mcdc_event_us": (mcdc_replay[0] - start["mcdc"]) / events * 1e6,
        "plain_event_us": (plain_replay[0] - start["plain"]) / events * 1e6,
    }
    return {
        "server": server,
        "code": code_version(),
        "docs": docs,
        "events": events,
        "start_cpu_s": start,
        "copy": _pair(mcdc_copy, plain_copy),
        "replay": _pair(mcdc_replay, plain_replay),
        "steady": steady,
        "ratios": {
            "cpu_per_doc": steady["mcdc_doc_us"] / steady["plain_doc_us"],
            "cpu_per_event": steady["mcdc_event_us"] / steady["plain_event_us"],
            "replay_rate": plain_replay[1] / mcdc_replay[1],
        },
        "profile": profile,
        "commands": {"sync": " ".join(sync_argv), "catch-up": " ".join(catch_argv)},
    }


def _pair(mcdc_run: tuple[float, float, str], plain_run: tuple[float, float, str]) -> dict[str, Any]:
    return {
        "mcdc": {"cpu_s": mcdc_run[0], "wall_s": mcdc_run[1]},
        "plain": {"cpu_s": plain_run[0], "wall_s": plain_run[1]},
    }


def report(data: dict[str, Any]) -> None:
    heading("Results")
    print(f"server: {data['server']}; code: {data['code']}")
    s, r = data["steady"], data["ratios"]
    print(f"start (CPU): mcdc {data['start_cpu_s']['mcdc']:.2f} s, a plain client {data['start_cpu_s']['plain']:.2f} s")
    for what, unit, n in (("copy", "doc", data["docs"]), ("replay", "event", data["events"])):
        m, p = data[what]["mcdc"], data[what]["plain"]
        print(
            f"{what:<6} {n:>9,} {unit}s: mcdc {m['cpu_s']:6.2f} s CPU in {m['wall_s']:6.1f} s, plain "
            f"{p['cpu_s']:6.2f} s CPU in {p['wall_s']:6.1f} s; steady CPU per {unit}: mcdc "
            f"{s[f'mcdc_{unit}_us']:.1f} us, plain "
            f"{s[f'plain_{unit}_us']:.1f} us"
        )
    print(
        f"ratios (mcdc / plain): CPU per document {r['cpu_per_doc']:.2f}x, CPU per event {r['cpu_per_event']:.2f}x; "
        f"replay rate {r['replay_rate']:.2f}x the plain loop's"
    )
    for run, stages in data["profile"].items():
        total = sum(stages.values()) or 1.0
        print(f"profile of {run} (own time under cProfile, by stage):")
        for stage, seconds in stages.items():
            print(f"  {stage:<34} {seconds:7.2f} s  {100 * seconds / total:5.1f}%")
    print_verdicts(
        {
            f"steady CPU per document <= {DOC_RATIO}x the plain copy's": r["cpu_per_doc"] <= DOC_RATIO,
            f"steady CPU per event <= {EVENT_RATIO}x the plain replay's": r["cpu_per_event"] <= EVENT_RATIO,
            f"catch-up rate >= {WALL_RATIO}x the plain replay's": r["replay_rate"] >= WALL_RATIO,
        },
        data["commands"],
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=200_000, help="documents copied")
    parser.add_argument("--events", type=int, default=50_000, help="writes replayed")
    parser.add_argument("--profile", action="store_true", help="also profile mcdc's copy and replay by stage")
    add_server_options(parser, "an extra argument for mcdc sync and catch-up (repeatable)")
    args = parser.parse_args()
    return run_bench("bench_cpu.py", lambda: bench(args), report, args.json)


if __name__ == "__main__":
    sys.exit(main())
