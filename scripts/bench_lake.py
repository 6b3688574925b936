"""Benchmark: mcdc into Delta Lake tables, against delta-rs' own write of the same rows; in one run.

    python scripts/bench_lake.py [--docs 100000] [--doc-size 200] [--events 20000] [--json]

1. Loads ``bench.docs`` on the source (``--docs`` documents of about ``--doc-size`` bytes; as
   scripts/bench_sync.py does) and scans it once (raw BSON, pymongo): the source's own read rate, the bound
   of any copy from it.
2. ``write_deltalake``: the documents read from the source (untimed), made into the very rows mcdc writes
   (its state table's and its change table's, by mcdc's own row functions, untimed), then written to a
   fresh state table and change table by two ``write_deltalake`` calls: timed. docs/s. Also a plain copy's
   rate: the read of step 1, making the rows and the write, one after another (what a hand-written
   pymongo-to-Delta copy does), timed by parts.
3. ``mcdc sync --target delta:DIR --include 'bench\\.docs'``: docs/s by its own summary (``elapsed_s``,
   from connecting to the last commit; process start excluded) and by wall time.
4. Replay: ``--events`` updates (``$inc`` of ``v`` on random documents, 1,000 per bulk_write) made on the
   source after the sync; a bare pymongo change stream (updateLookup, raw BSON) reads them from the sync's
   position (the source's own rate, the bound of any replay); then ``mcdc catch-up`` from the sync's
   checkpoint into the same tables. events/s by its summary (``replay_s``). The state table's sum of ``v``
   must then equal the source's, and its row count the documents'.

Prints the ratio mcdc sync / write_deltalake (goal >= 0.7), against the plain copy and the source's scan too,
and the replay's events/s (goal >= 5,000) and its ratio to the bare stream, with PASS/FAIL; exits 0
whatever they say. Exits 1 when a step fails (a command exits non-zero, a table does not match the
source). Without --source it starts a local SecantusDB server (a Python server, several times slower than
mongod): its read rates, printed in steps 1 and 4, bound mcdc's copy and replay, not delta-rs' in-memory
write.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import bson
import harness
import pymongo
from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp

from replicator.bsonkit.rawbson import RAW_CODEC
from replicator.events import Namespace
from replicator.events.normalize import snapshot_read
from replicator.sinks.lake.fold import fold
from replicator.sinks.lake.tables import change_table, state_table

DB, COLL, INCLUDE = harness.DB, harness.COLL, harness.INCLUDE  # the shared bench collection
SNAPSHOT_TARGET = 0.7
EVENTS_TARGET = 5_000


def _per_s(count: float, seconds: float) -> float:
    return count / seconds if seconds > 0 else 0.0


def source_scan(uri: str) -> tuple[list[RawBSONDocument], float]:
    """Every document of bench.docs as raw BSON, and the time the read took."""
    started = time.perf_counter()
    with pymongo.MongoClient(uri, document_class=RawBSONDocument) as client:
        docs = list(client[DB].get_collection(COLL, codec_options=RAW_CODEC).find({}))
    return docs, time.perf_counter() - started


def deltalake_write(docs: list[RawBSONDocument], root: Path) -> tuple[float, float]:
    """The rows mcdc would write for these documents (by its general row functions), written by
    write_deltalake: the time making the rows took, and the write's."""
    from deltalake import write_deltalake

    started = time.perf_counter()
    ns = Namespace(DB, COLL)
    events = [snapshot_read(ns, d) for d in docs]
    state, changes = state_table(fold(events, {}).upserts()), change_table(events)
    made = time.perf_counter()
    write_deltalake(str(root / "state"), state, mode="error")
    write_deltalake(str(root / "changes"), changes, mode="error")
    return made - started, time.perf_counter() - made


def stream_read(uri: str, after: dict[str, int], events: int) -> float:
    """The time a bare pymongo change stream (updateLookup, raw BSON) takes to read ``events`` events from
    the cluster time ``after``: the source's own rate, which bounds any replay from it."""
    started = time.perf_counter()
    with pymongo.MongoClient(uri, document_class=RawBSONDocument) as client:
        at = Timestamp(after["t"], after["i"])
        with client.watch(start_at_operation_time=at, full_document="updateLookup", batch_size=1000) as stream:
            seen = 0
            while seen < events:
                if stream.try_next() is not None:
                    seen += 1
                elif time.perf_counter() - started > 600:
                    raise harness.BenchError(f"the bare change stream read {seen:,} events in 600 s, not {events:,}")
    return time.perf_counter() - started


def run(argv: list[str], logdir: Path, name: str) -> tuple[dict[str, Any], float]:
    """Run an mcdc command with --json; its summary and wall time."""
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, timeout=3600)
    wall = time.perf_counter() - started
    (logdir / f"{name}.err").write_bytes(done.stderr)
    if done.returncode != 0:
        raise harness.BenchError(f"{name} exited {done.returncode}:\n{done.stderr.decode(errors='replace')[-3000:]}")
    return json.loads(done.stdout), wall


def make_events(uri: str, docs: int, events: int) -> float:
    """``events`` $inc updates of ``v`` on random documents; the time it took."""
    rng = random.Random(1)
    started = time.perf_counter()
    with pymongo.MongoClient(uri) as client:
        coll = client[DB][COLL]
        for start in range(0, events, 1000):
            ops = [
                pymongo.UpdateOne({"_id": rng.randrange(docs)}, {"$inc": {"v": 1}})
                for _ in range(min(1000, events - start))
            ]
            coll.bulk_write(ops, ordered=False)
    return time.perf_counter() - started


def check_state(uri: str, root: Path, docs: int) -> None:
    from deltalake import DeltaTable

    table = DeltaTable(str(root / "state" / DB / COLL)).to_pyarrow_table(columns=["bson"])
    total = sum(bson.decode(b).get("v", 0) for b in table["bson"].to_pylist())
    with pymongo.MongoClient(uri) as client:
        expected = next(client[DB][COLL].aggregate([{"$group": {"_id": None, "v": {"$sum": "$v"}}}]), {"v": 0})["v"]
    if table.num_rows != docs or total != expected:
        raise harness.BenchError(
            f"the state table holds {table.num_rows:,} rows, sum of v {total}; the source {docs:,}, {expected}"
        )


def bench(args: argparse.Namespace) -> dict[str, Any]:
    with harness.bench_setup("bench_lake", args, "mcdc-bench-lake-", load=True) as (workdir, source, _target, server):
        commands = {"bench": harness.show([sys.executable, *sys.argv])}

        harness.heading("Step 1: the source's read rate (pymongo, raw BSON, one cursor)")
        docs, scan_s = source_scan(source)
        if len(docs) != args.docs:
            raise harness.BenchError(f"read {len(docs):,} documents, not {args.docs:,}")
        print(f"{scan_s:.2f} s, {_per_s(len(docs), scan_s):,.0f} docs/s")

        harness.heading("Step 2: write_deltalake of the same rows, prepared in memory")
        plain = workdir / "plain"
        build_s, write_s = deltalake_write(docs, plain)
        del docs
        print(f"{write_s:.2f} s, {_per_s(args.docs, write_s):,.0f} docs/s (state and change table)")
        plain_s = scan_s + build_s + write_s
        print(
            f"a plain copy (the read, the rows, the write, one after another): {_per_s(args.docs, plain_s):,.0f} docs/s"
        )

        harness.heading("Step 3: mcdc sync into Delta tables")
        lake, cp = workdir / "lake", workdir / "cp.json"
        argv = harness.mcdc("sync", "-s", source, "-t", f"delta:{lake}", "-c", str(cp), "--include", INCLUDE,
                            "--no-progress", "--json", *args.mcdc_arg)  # fmt: skip
        print(f"$ {harness.show(argv)}")
        commands["sync"] = harness.show(argv)
        synced, sync_wall = run(argv, workdir, "sync")
        if int(synced["documents"]) != args.docs:
            raise harness.BenchError(f"mcdc copied {synced['documents']:,} documents, not {args.docs:,}")
        sync_s = float(synced["elapsed_s"])
        check_state(source, lake, args.docs)
        print(f"{sync_s:.2f} s by its summary ({sync_wall:.2f} s wall), {_per_s(args.docs, sync_s):,.0f} docs/s")

        harness.heading(f"Step 4: {args.events:,} updates on the source, then mcdc catch-up into the same tables")
        made_s = make_events(source, args.docs, args.events)
        print(f"made in {made_s:.1f} s")
        stream_s = stream_read(source, synced["position"], args.events)
        stream_rate = _per_s(args.events, stream_s)
        print(f"a bare pymongo change stream reads them in {stream_s:.2f} s, {stream_rate:,.0f} events/s")
        shutil.copyfile(cp, workdir / "cp-after-sync.json")
        argv = harness.mcdc("catch-up", "-s", source, "-t", f"delta:{lake}", "-c", str(cp), "--include", INCLUDE,
                            "--no-progress", "--json", *args.mcdc_arg)  # fmt: skip
        print(f"$ {harness.show(argv)}")
        commands["catch-up"] = harness.show(argv)
        caught, catch_wall = run(argv, workdir, "catch-up")
        if int(caught["events"]) < args.events:
            raise harness.BenchError(f"catch-up replayed {caught['events']:,} events, not {args.events:,}")
        check_state(source, lake, args.docs)
        replay_s = float(caught["replay_s"])
        events_per_s = _per_s(int(caught["events"]), replay_s)
        print(f"{replay_s:.2f} s replaying ({catch_wall:.2f} s wall), {events_per_s:,.0f} events/s")

        ratio = _per_s(args.docs, sync_s) / _per_s(args.docs, write_s)
        return {
            "code": harness.code_version(),
            "server": server,
            "docs": args.docs,
            "doc_size": args.doc_size,
            "events": args.events,
            "source_scan_docs_per_s": round(_per_s(args.docs, scan_s)),
            "write_deltalake_docs_per_s": round(_per_s(args.docs, write_s)),
            "mcdc_sync_docs_per_s": round(_per_s(args.docs, sync_s)),
            "ratio_sync_vs_write_deltalake": round(ratio, 3),
            "ratio_sync_vs_source_scan": round(scan_s / sync_s, 3),
            "plain_copy_docs_per_s": round(_per_s(args.docs, plain_s)),
            "ratio_sync_vs_plain_copy": round(plain_s / sync_s, 3),
            "bare_stream_events_per_s": round(_per_s(args.events, stream_s)),
            "replay_events_per_s": round(events_per_s),
            "ratio_replay_vs_bare_stream": round(events_per_s / _per_s(args.events, stream_s), 3),
            "targets": {
                f"sync >= {SNAPSHOT_TARGET}x write_deltalake": ratio >= SNAPSHOT_TARGET,
                f"replay >= {EVENTS_TARGET:,} events/s": events_per_s >= EVENTS_TARGET,
            },
            "commands": commands,
        }


def print_report(data: dict[str, Any]) -> None:
    harness.heading("Results")
    print(f"{data['docs']:,} documents of ~{data['doc_size']} bytes, {data['events']:,} events; {data['server']}")
    print(f"code: {data['code']}")
    print(f"source scan (one cursor)      {data['source_scan_docs_per_s']:>10,} docs/s")
    print(f"write_deltalake (in memory)   {data['write_deltalake_docs_per_s']:>10,} docs/s")
    print(f"mcdc sync -> delta            {data['mcdc_sync_docs_per_s']:>10,} docs/s")
    print(f"  ratio sync / write_deltalake    {data['ratio_sync_vs_write_deltalake']:>6.2f}")
    print(f"  ratio sync / source scan        {data['ratio_sync_vs_source_scan']:>6.2f}")
    print(f"plain copy (read, rows, write) {data['plain_copy_docs_per_s']:>9,} docs/s")
    print(f"  ratio sync / plain copy         {data['ratio_sync_vs_plain_copy']:>6.2f}")
    print(f"bare change stream (pymongo)  {data['bare_stream_events_per_s']:>10,} events/s")
    print(f"mcdc catch-up -> delta        {data['replay_events_per_s']:>10,} events/s")
    print(f"  ratio catch-up / bare stream    {data['ratio_replay_vs_bare_stream']:>6.2f}")
    harness.print_verdicts(data["targets"], data["commands"])


def main(argv: list[str] | None = None) -> int:
    parser = harness.parser(__doc__)
    harness.size_options(
        parser, docs=(100_000, "documents to copy"), doc_size=200, events=(20_000, "update events to replay")
    )
    harness.add_server_options(parser, "one more argument for every mcdc command (repeatable)")
    parser.error_if(lambda a: a.docs < 1 or a.events < 1, "--docs and --events must be at least 1")
    return harness.main("bench_lake", parser, argv, bench, print_report)


if __name__ == "__main__":
    sys.exit(main())
