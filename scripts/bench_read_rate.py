"""Benchmark: ``mcdc sync --max-read-rate`` holds its cap over every 5-second window; on the same two servers,
capped and uncapped, in one run.

    python scripts/bench_read_rate.py [--docs 40000] [--doc-size 200] [--rate 2000] [--json]
    python scripts/bench_read_rate.py --source mongodb://... --target mongodb://...

1. Loads ``bench.docs`` (``--docs`` documents of about ``--doc-size`` bytes; an earlier matching load is
   reused, as scripts/bench_sync.py does) and scans it once.
2. Capped: ``mcdc sync --include 'bench\\.docs' --max-read-rate RATE`` into the wiped target with a fresh
   checkpoint, its source reached through a wire proxy in this process. The proxy passes every message on
   untouched and counts the documents of each reply to a ``find`` or ``getMore`` on ``bench.docs``, timed
   when the reply passes: the documents the source served, as they left it.
3. Uncapped: the same without ``--max-read-rate``, into the wiped target again.

For each run: the documents served per second in every 5-second window (a window ending at each reply, for
the maximum, which no other window exceeds; windows ending every 0.5 s from 5 s after the first reply to the
last, for the median), and the overall rate (all documents over the time from the first reply to the last).
PASS/FAIL: the capped run's largest window is at most 5 % over ``--rate`` (the bucket allows a tenth of a
second's burst: 2 % over 5 s), and the uncapped run is faster than the cap (else the cap was not what held
the rate). Exits 0 whatever they say: it is a measurement. Exits 1 only when a step fails (mcdc exits
non-zero, the target is not complete).

Without ``--source/--target`` it starts two local SecantusDB servers (a Python MongoDB-compatible server,
several times slower than mongod) in a temporary directory: figures are for that server, not for MongoDB;
the ratio within one run is what counts. With them, only the ``bench`` database is touched (dropped on the
target, reloaded on the source if its ``bench.meta`` marker does not match the requested data); the proxy
forwards to the first host of ``--source`` without TLS.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import os
import platform
import statistics
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import bson
import harness
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument

from tests.support.servers import free_port

WINDOW_S = 5.0
MEDIAN_STEP_S = 0.5
OVER_CAP = 0.05  # the largest 5-second window may be this much over the cap
_OP_MSG = 2013
_RAW = CodecOptions(document_class=RawBSONDocument)


def _body(message: bytes) -> RawBSONDocument | None:
    """An OP_MSG's body (its kind-0 section), undecoded; None for anything else."""
    if len(message) < 21 or int.from_bytes(message[12:16], "little") != _OP_MSG or message[20] != 0:
        return None
    size = int.from_bytes(message[21:25], "little")
    return bson.decode(message[21 : 21 + size], codec_options=_RAW)


class ReadCounter:
    """A wire proxy in its own thread that counts the documents the server sends in replies to ``find`` and
    ``getMore`` on one collection: ``replies`` holds (time.perf_counter(), documents) per reply."""

    def __init__(self, host: str, port: int, coll: str) -> None:
        self.upstream = (host, port)
        self.coll = coll
        self.port = free_port()
        self.replies: list[tuple[float, int]] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    @property
    def uri(self) -> str:
        return f"mongodb://127.0.0.1:{self.port}/?directConnection=true"

    def _reads(self, body: RawBSONDocument) -> bool:
        first = next(iter(body), "")
        return (first == "find" and body["find"] == self.coll) or (
            first == "getMore" and body.get("collection") == self.coll
        )

    async def _pipe(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(*self.upstream)
        counted: set[int] = set()  # request ids whose replies carry our documents

        async def up() -> None:
            while True:
                message = await _message(client_r)
                body = _body(message)
                if body is not None and self._reads(body):
                    counted.add(int.from_bytes(message[4:8], "little"))
                server_w.write(message)
                await server_w.drain()

        async def down() -> None:
            while True:
                message = await _message(server_r)
                answered = int.from_bytes(message[8:12], "little")
                if answered in counted:
                    counted.discard(answered)
                    cursor = (_body(message) or {}).get("cursor") or {}
                    docs = cursor.get("firstBatch", cursor.get("nextBatch")) or []
                    self.replies.append((time.perf_counter(), len(docs)))
                client_w.write(message)
                await client_w.drain()

        with contextlib.suppress(Exception):
            await asyncio.gather(up(), down())
        for writer in (client_w, server_w):
            writer.close()

    @contextlib.contextmanager
    def running(self) -> Iterator[ReadCounter]:
        self._thread.start()
        server: list[asyncio.Server] = []

        async def serve() -> None:
            server.append(await asyncio.start_server(self._pipe, "127.0.0.1", self.port))

        asyncio.run_coroutine_threadsafe(serve(), self._loop).result(10)
        try:
            yield self
        finally:

            async def close() -> None:
                server[0].close()

            asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)


async def _message(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readexactly(4)
    return head + await reader.readexactly(int.from_bytes(head, "little") - 4)


@dataclass
class Run:
    """One copy: its replies' figures."""

    kind: str  # "capped" | "uncapped"
    docs: int  # documents the source served (all replies)
    wall_s: float  # the mcdc process, start to exit
    read_s: float  # first reply to last
    replies: int
    max_window: float  # documents/s
    median_window: float
    overall: float


def max_window(replies: Sequence[tuple[float, int]], span: float = WINDOW_S) -> float:
    """The most documents/s in any window of ``span`` seconds: the windows ending at each reply (a window
    holds the replies at times in (end - span, end])."""
    best, total, j = 0, 0, 0
    for t, n in replies:
        total += n
        while replies[j][0] <= t - span:
            total -= replies[j][1]
            j += 1
        best = max(best, total)
    return best / span


def windows(replies: Sequence[tuple[float, int]], span: float = WINDOW_S, step: float = MEDIAN_STEP_S) -> list[float]:
    """Documents/s in the windows ending every ``step`` seconds from ``span`` after the first reply to the
    last reply (none when the replies cover less than ``span``)."""
    if not replies:
        return []
    times = [t for t, _ in replies]
    sums = [0]
    for _, n in replies:
        sums.append(sums[-1] + n)
    rates = []
    end = times[0] + span
    while end <= times[-1]:
        inside = sums[bisect.bisect_right(times, end)] - sums[bisect.bisect_right(times, end - span)]
        rates.append(inside / span)
        end += step
    return rates


def measure(kind: str, replies: Sequence[tuple[float, int]], wall_s: float) -> Run:
    replies = [r for r in replies if r[1] > 0]
    docs = sum(n for _, n in replies)
    read_s = replies[-1][0] - replies[0][0] if len(replies) > 1 else 0.0
    rates = windows(replies)
    return Run(
        kind, docs, round(wall_s, 3), round(read_s, 3), len(replies), round(max_window(replies), 1),
        round(statistics.median(rates), 1) if rates else 0.0, round(docs / read_s, 1) if read_s else 0.0,
    )  # fmt: skip


def run_sync(
    kind: str, source: str, target: str, workdir: Path, docs: int, extra: Sequence[str]
) -> tuple[Run, list[str]]:
    """One mcdc sync of bench.docs into the wiped target, its source reads counted by the proxy."""
    harness.reset_target(target)
    checkpoint = harness.fresh_checkpoint(workdir, f"checkpoint-{kind}.json", ending="checkpoint-*.json")
    hostport = source.split("://", 1)[1].split("/", 1)[0].split(",")[0].split("@")[-1]
    host, _, port = hostport.rpartition(":")
    counter = ReadCounter(host, int(port), harness.COLL)
    with counter.running():
        argv = harness.mcdc(
            "sync", "--source", counter.uri, "--target", target, "--include", harness.INCLUDE,
            "--checkpoint", str(checkpoint), "--no-progress", *extra,
        )  # fmt: skip
        done = harness.run_measured(argv, kind, workdir, what=f"mcdc sync ({kind})")
    harness.check_target(target, docs, f"mcdc sync ({kind})")
    run = measure(kind, counter.replies, done.wall_s)
    if run.docs < docs:
        raise harness.BenchError(f"the proxy counted {run.docs:,} documents read, not {docs:,}")
    print(f"{done.wall_s:.1f} s; {run.replies} replies, {run.docs:,} documents in {run.read_s:.1f} s: "
          f"max 5-s window {run.max_window:,.0f} docs/s, overall {run.overall:,.0f} docs/s")  # fmt: skip
    return run, argv


def bench(args: argparse.Namespace) -> dict[str, Any]:
    with harness.bench_setup("bench_read_rate", args, "mcdc-bench-rate-", load=True) as setup:
        workdir, source, target, server = setup
        harness.heading(f"Capped: mcdc sync --max-read-rate {args.rate}")
        capped, capped_argv = run_sync(
            "capped", source, target, workdir, args.docs, ["--max-read-rate", str(args.rate), *args.mcdc_arg]
        )
        harness.heading("Uncapped: mcdc sync")
        uncapped, uncapped_argv = run_sync("uncapped", source, target, workdir, args.docs, args.mcdc_arg)
    ratio = uncapped.overall / capped.overall if capped.overall else 0.0
    limit = args.rate * (1 + OVER_CAP)
    return {
        "server": server,
        "docs": args.docs,
        "doc_size": args.doc_size,
        "rate": args.rate,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "mcdc_code": harness.code_version(),
        "ratio_uncapped_capped": round(ratio, 2),
        "targets": {
            f"capped: every 5-s window <= {limit:,.0f} docs/s": capped.read_s >= WINDOW_S
            and capped.max_window <= limit,
            f"uncapped: faster than {args.rate:,} docs/s overall": uncapped.overall > args.rate,
        },
        "runs": [asdict(capped), asdict(uncapped)],
        "commands": {
            "bench": harness.show([sys.executable, *sys.argv]),
            "capped": harness.show(capped_argv),
            "uncapped": harness.show(uncapped_argv),
        },
    }


def print_report(data: dict[str, Any]) -> None:
    harness.heading(
        f"Results: {data['docs']:,} documents of ~{data['doc_size']} bytes, cap {data['rate']:,} docs/s, "
        f"measured on {data['server']}"
    )
    print(f"{data['cpus']} CPUs, Python {data['python']}; mcdc code: {data['mcdc_code']}")
    print(f"{'run':<10}{'wall s':>8}{'read s':>8}{'replies':>9}{'max 5-s docs/s':>16}{'median 5-s':>12}"
          f"{'overall docs/s':>16}")  # fmt: skip
    for r in data["runs"]:
        print(f"{r['kind']:<10}{r['wall_s']:>8.1f}{r['read_s']:>8.1f}{r['replies']:>9}{r['max_window']:>16,.0f}"
              f"{r['median_window']:>12,.0f}{r['overall']:>16,.0f}")  # fmt: skip
    print(f"uncapped/capped overall: {data['ratio_uncapped_capped']:.2f}")
    harness.print_verdicts(data["targets"], data["commands"])


def main(argv: list[str] | None = None) -> int:
    parser = harness.parser(__doc__)
    harness.size_options(parser, docs=(40_000, "documents to copy"), doc_size=200)
    parser.add_argument("--rate", type=int, default=2000, help="mcdc sync --max-read-rate (default 2000)")
    harness.add_server_options(parser, "one more argument for both mcdc syncs (repeatable), e.g. --mcdc-arg=-w2")
    parser.error_if(lambda a: a.docs < 1 or a.rate < 1, "--docs and --rate must be at least 1")
    return harness.main("bench_read_rate", parser, argv, bench, print_report)


if __name__ == "__main__":
    sys.exit(main())
