"""Benchmark: one big source transaction replayed into MongoDB: atomic on the target, and mcdc's peak memory.

    python scripts/bench_big_txn.py [--docs 50000] [--doc-size 700] [--json]

A source transaction inserts ``--docs`` documents of about ``--doc-size`` bytes into ``big.txn``, then
``mcdc catch-up`` replays it. The default is 50,000 documents of 700 bytes (about 35 MB): the dev server
(SecantusDB 0.7.0b3) commits such a transaction in a few seconds, and one of 40,000 documents of 1 KB, but
one of 50,000 of 1 KB (about 49 MB) it never committed (over 15 minutes at full CPU, measured). On mongod,
``--doc-size 1000`` (about 50 MB, which MongoDB 4.2+ writes as several oplog entries past 16 MB). Measured:

* **atomic**: while the catch-up runs, another client counts the target's documents every 50 ms; the
  transaction is one unit there when every count it saw is 0 or ``--docs``;
* **memory**: mcdc's peak RSS (sampled every 50 ms, its process tree), against its RSS for a catch-up of the
  same documents written one by one (no transaction: its batches and read-ahead bound what it holds) and
  against the transaction's own bytes. A transaction is applied as one batch, so it is held whole: the
  bar is that it costs at most ``MEMORY_FACTOR`` times its bytes above the one-by-one run's peak;
* the source's commit time and the catch-up's wall time, on the dev server.

Exits 0 whatever the figures say: it is a measurement (1 when a run fails).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from typing import Any

import harness
from bson import Int64

from tests.support.servers import connect

DB, COLL, PLAIN = "big", "txn", "plain"
#: the bar: a transaction held whole costs at most this many times its bytes above a plain run's peak
MEMORY_FACTOR = 4.0


def _documents(first: int, count: int, size: int) -> list[dict[str, Any]]:
    pad = "x" * max(0, size - 40)
    return [{"_id": Int64(n), "n": n, "pad": pad} for n in range(first, first + count)]


def _write(source: str, coll: str, docs: int, size: int, *, transaction: bool) -> float:
    """``docs`` inserts into ``big.<coll>``, in one transaction or not; the seconds it took."""
    started = time.perf_counter()
    with connect(source) as client:
        target = client[DB][coll]
        if not transaction:
            for first in range(0, docs, 1000):
                target.insert_many(_documents(first, min(1000, docs - first), size))
            return time.perf_counter() - started
        with client.start_session() as session, session.start_transaction():
            for first in range(0, docs, 1000):
                target.insert_many(_documents(first, min(1000, docs - first), size), session=session)
    return time.perf_counter() - started


class Watcher(threading.Thread):
    """Counts the target's documents of ``big.txn`` every 50 ms until stopped: the distinct counts seen."""

    def __init__(self, target: str) -> None:
        super().__init__(daemon=True)
        self.target = target
        self.seen: set[int] = set()
        self.stop = threading.Event()

    def run(self) -> None:
        with connect(self.target) as client:
            coll = client[DB][COLL]
            while not self.stop.is_set():
                self.seen.add(coll.count_documents({}))
                time.sleep(0.05)


def bench(args: argparse.Namespace) -> dict[str, Any]:
    with harness.bench_setup("bench_big_txn.py", args, "mcdc-bench-txn-") as (workdir, source, target, server):
        with connect(source) as client, connect(target) as dst:
            client.drop_database(DB)
            dst.drop_database(DB)
            client[DB].create_collection(COLL)
            client[DB].create_collection(PLAIN)
        runs: dict[str, Any] = {}
        for coll, transaction in ((PLAIN, False), (COLL, True)):
            cp = harness.fresh_checkpoint(workdir, f"cp-{coll}.json")
            common = ["-s", source, "-t", target, "-c", str(cp), "--include", rf"{DB}\.{coll}", "--no-progress"]
            harness.run_measured(harness.mcdc("sync", *common), f"sync-{coll}", workdir)
            how = "in one transaction" if transaction else "one by one"
            harness.heading(f"{args.docs:,} documents into {DB}.{coll}, {how}")
            wrote = _write(source, coll, args.docs, args.doc_size, transaction=transaction)
            print(f"the source took them in {wrote:.1f} s")
            watcher = Watcher(target)
            if transaction:
                watcher.start()
            try:
                run = harness.run_measured(harness.mcdc("catch-up", *common), f"catch-up-{coll}", workdir)
            finally:
                watcher.stop.set()
                if transaction:
                    watcher.join()
            with connect(target) as dst:
                count = dst[DB][coll].count_documents({})
            if count != args.docs:
                raise harness.BenchError(f"{DB}.{coll} on the target holds {count:,} documents, not {args.docs:,}")
            runs[coll] = {
                "source_s": round(wrote, 2),
                "catch_up_s": round(run.wall_s, 2),
                "peak_rss_mb": round(run.peak_rss / 2**20, 1),
                "counts_seen": sorted(watcher.seen),
            }
            print(f"catch-up: {run.wall_s:.1f} s, peak RSS {run.peak_rss / 2**20:.0f} MB")
    size_mb = args.docs * args.doc_size / 2**20
    above = runs[COLL]["peak_rss_mb"] - runs[PLAIN]["peak_rss_mb"]
    seen = runs[COLL]["counts_seen"]
    return {
        "server": server,
        "code": harness.code_version(),
        "docs": args.docs,
        "transaction_mb": round(size_mb, 1),
        "runs": runs,
        "above_plain_mb": round(above, 1),
        "factor": round(above / size_mb, 2) if size_mb else 0.0,
        "atomic": all(n in (0, args.docs) for n in seen),
    }


def report(data: dict[str, Any]) -> None:
    harness.heading("Results")
    print(f"server: {data['server']}; code: {data['code']}")
    txn, plain = data["runs"][COLL], data["runs"][PLAIN]
    print(
        f"one transaction of {data['docs']:,} documents ({data['transaction_mb']:.0f} MB): the source committed "
        f"it in {txn['source_s']:.1f} s; mcdc catch-up replayed it in {txn['catch_up_s']:.1f} s, peak RSS "
        f"{txn['peak_rss_mb']:.0f} MB"
    )
    print(
        f"the same documents one by one: catch-up {plain['catch_up_s']:.1f} s, peak RSS "
        f"{plain['peak_rss_mb']:.0f} MB; the transaction held whole: {data['above_plain_mb']:.0f} MB above it, "
        f"{data['factor']:.2f}x its bytes"
    )
    print(f"the target's counts seen while it replayed: {txn['counts_seen']}")
    harness.print_verdicts(
        {
            "the transaction is one unit on the target (every count seen 0 or all)": data["atomic"],
            f"its memory above a plain run <= {MEMORY_FACTOR}x its bytes": data["factor"] <= MEMORY_FACTOR,
        },
        None,
    )


def main() -> int:
    parser = harness.parser(__doc__)
    harness.size_options(parser, docs=(50_000, "documents in the transaction"), doc_size=700)
    harness.add_server_options(parser)
    return harness.main("bench_big_txn.py", parser, None, bench, report)


if __name__ == "__main__":
    sys.exit(main())
