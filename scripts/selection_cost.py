"""bench_cpu.py's "one collection among ten busy ones" case (issue 50): what a narrow selection costs mcdc when
the rest of its database is busy, against the same selected work alone.

Ten collections ``busy.c0`` .. ``busy.c9``; mcdc follows ``busy.c3`` alone (``--include busy\\.c3``).

* **alone**: ``--narrow-events`` writes on ``busy.c3`` (inserts, ``$set`` updates and deletes, as the replay
  case writes them), then ``mcdc catch-up``;
* **busy**: the same number of writes on ``busy.c3``, and as many on each of the nine others, interleaved
  in batches of 100, then ``mcdc catch-up``.

Each catch-up is one process: its CPU (user + system) from its start to its exit, the start included, as
the issue measured it. The ratio is busy / alone: what the nine unselected collections' events cost mcdc
(1.0: nothing). Not a timed test: a measurement, printed with the others.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import harness
import pymongo
from bson import Int64

from tests.support.servers import connect

DB = "busy"
COLLS = [f"c{n}" for n in range(10)]
SELECTED = "c3"
#: the issue's bar: a catch-up of one collection among ten busy ones, against the same selected work alone
NARROW_RATIO = 1.15
_BATCH = 100


def _load(source: str, target: str, docs: int) -> None:
    """Ten collections made explicitly (an implicit create under load is a test-server quirk), ``docs``
    documents in each, and the target's copy dropped."""
    with connect(source) as client, connect(target) as dst:
        client.drop_database(DB)
        dst.drop_database(DB)
        for name in COLLS:
            client[DB].create_collection(name)
            client[DB][name].insert_many([{"_id": Int64(n), "v": 0, "s": "x" * 40} for n in range(docs)])


def _writes(source: str, colls: Sequence[str], count: int, seed: int) -> None:
    """``count`` writes on each of ``colls``: a third inserts, a third updates, a third deletes, the
    collections taking turns, one batch of 100 each at a time."""
    rng = random.Random(seed)
    with connect(source) as client:
        ids = {c: [d["_id"] for d in client[DB][c].find({}, {"_id": 1})] for c in colls}
        ops: dict[str, list[Any]] = {c: [] for c in colls}
        for n in range(count):
            kind = (n % 999) // 333
            for c in colls:
                if kind == 0 or not ids[c]:
                    ops[c].append(pymongo.InsertOne({"_id": Int64(10**12 + seed * 10**9 + n), "v": n, "s": "y" * 40}))
                elif kind == 1:
                    ops[c].append(pymongo.UpdateOne({"_id": rng.choice(ids[c])}, {"$set": {"v": seed * 10**9 + n}}))
                else:
                    ops[c].append(pymongo.DeleteOne({"_id": ids[c].pop(rng.randrange(len(ids[c])))}))
            if len(ops[colls[0]]) == _BATCH or n == count - 1:
                for c in colls:
                    if ops[c]:
                        client[DB][c].bulk_write(ops[c], ordered=True)
                    ops[c] = []


def _same(source: str, target: str) -> None:
    with connect(source) as src, connect(target) as dst:
        want = sorted(d["_id"] for d in src[DB][SELECTED].find({}, {"_id": 1}))
        got = sorted(d["_id"] for d in dst[DB][SELECTED].find({}, {"_id": 1}))
        others = [c for c in dst[DB].list_collection_names() if c != SELECTED]
    if want != got:
        raise harness.BenchError(f"{DB}.{SELECTED} on the target has {len(got):,} documents, the source {len(want):,}")
    if others:
        raise harness.BenchError(f"the target holds unselected collections: {others}")


def measure(
    source: str,
    target: str,
    workdir: Path,
    *,
    events: int,
    repeat: int,
    extra: Sequence[str],
    cpu_of: Callable[[Sequence[str]], tuple[float, float, str]],
) -> dict[str, Any]:
    """``repeat`` pairs of catch-ups (alone, then busy), each of ``events`` selected writes; their CPU and the
    median ratio."""
    _load(source, target, docs=max(events, 1000))
    cp = workdir / "cp-narrow.json"
    cp.unlink(missing_ok=True)
    argv = harness.mcdc("sync", "-s", source, "-t", target, "-c", str(cp), "--include", rf"{DB}\.{SELECTED}",
                        "--no-progress", *extra)  # fmt: skip
    cpu_of(argv)  # the copy, and the checkpoint the catch-ups go on from
    catch_up = ["catch-up" if a == "sync" else a for a in argv]
    runs = []
    for number in range(1, repeat + 1):
        _writes(source, [SELECTED], events, seed=2 * number - 1)
        alone = cpu_of(catch_up)
        _same(source, target)
        _writes(source, COLLS, events, seed=2 * number)
        busy = cpu_of(catch_up)
        _same(source, target)
        run = {"alone_cpu_s": round(alone[0], 3), "busy_cpu_s": round(busy[0], 3), "ratio": busy[0] / alone[0]}
        print(
            f"  {number}/{repeat}: {events:,} writes on {DB}.{SELECTED} alone: {alone[0]:.2f} s CPU in "
            f"{alone[1]:.1f} s; with {9 * events:,} more on nine other collections: {busy[0]:.2f} s CPU in "
            f"{busy[1]:.1f} s ({run['ratio']:.2f}x)"
        )
        runs.append(run)
    return {
        "events": events,
        "runs": runs,
        "ratio": statistics.median(r["ratio"] for r in runs),
        "command": " ".join(catch_up),
    }


def report(data: dict[str, Any]) -> tuple[str, bool]:
    """The case's line in the results, and its verdict's name and outcome."""
    ratio = data["ratio"]
    print(
        f"one collection among ten busy ones (median of {len(data['runs'])}): catch-up CPU "
        f"{ratio:.2f}x the same selected work alone"
    )
    return f"a catch-up of one collection among ten busy ones <= {NARROW_RATIO}x its CPU alone", ratio <= NARROW_RATIO
