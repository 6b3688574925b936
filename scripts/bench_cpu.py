"""Benchmark: mcdc's own CPU per document (sync) and per event (catch-up into MongoDB), against plain pymongo
clients doing the same work, on the same two servers, in one run.

    python scripts/bench_cpu.py [--docs 200000] [--events 50000] [--repeat 3] [--profile] [--json]
    python scripts/bench_cpu.py --only narrow [--narrow-events 4000] [--repeat 3]

On a real mongod, mcdc's throughput per process is bound by its own CPU, not the server's: so this measures
CPU (user + system, of each contender's own process, from its start to its exit), not only wall time.

1. **Start**: the CPU of ``mcdc --version`` and ``mcdc --help`` (Python, mcdc's imports, the option table)
   against ``python -c 'import pymongo'`` (a plain client's start), each the least of 5 runs; and after the
   replays, of a ``mcdc catch-up`` with nothing to replay (a cron run on an idle source: its start, its
   connections and its checkpoint), the least of 3. Issue 41's bars: 1.5x a plain client's start, and 0.5 s.
   Then that idle catch-up once on each engine, its wall and CPU: asyncio, Spark (started only if the replay
   lasts, ``--spark-start-after``) and Spark started at once (``--spark-start-after 0``, as every Spark
   catch-up did before issue 41), when PySpark is installed.
2. **Copy** of ``bench.small`` (a tenth of ``--docs``) and of ``bench.docs`` (``--docs`` small documents). The
   plain client: one RawBSON cursor feeding ``insert_many(ordered=False)`` batches of 1,000 (into
   ``bench_plain``). mcdc: ``mcdc sync`` (into ``bench``).
3. **Replay** of a tenth of ``--events`` writes, then of ``--events`` writes, on ``bench.docs`` (inserts, ``$set``
   updates and deletes, in runs of a kind). The plain client: ``watch(full_document="updateLookup")`` from the
   position before them, ``bulk_write(ordered=True)`` of ``ReplaceOne(upsert)``/``DeleteOne`` per 1,000
   events. mcdc: ``mcdc catch-up``, run first (see ``Contenders.replay``). Both targets are checked against
   the source after each.

Each contender runs as a process of its own; its CPU is its ``RUSAGE_CHILDREN`` delta (user + system, from
start to exit). The **steady** CPU per document (per event) is the difference between the big run and the
small one, divided by the documents (events) between them: what each more document costs, the start and
every fixed cost of a run (connecting, planning, index builds, the last checkpoint) left out, for both
contenders alike. The start is printed apart. Each size is copied and replayed ``--repeat`` times (the copies
first, each into emptied targets; then the replays, each of new writes): every repeat's ratios are printed,
and the verdicts take their median, since one difference of two runs on a busy machine can move by a third.
With ``--profile``, mcdc's copy and replay of the big sizes run once more under cProfile (timing CPU, not
waits) and their CPU is summed by stage (read and decode, plan and write, checkpoint, progress, the DDL
window and lookup checks, the event loop, the driver).

4. **A narrow selection** (issue 50): a catch-up of one collection among ten busy ones, against the same
   selected work alone (``selection_cost.py``): ``--narrow-events`` writes each, ``--repeat`` pairs, the
   median ratio. ``--only narrow`` runs this case alone.

Figures on the local test server (SecantusDB) measure mcdc's CPU as they would on mongod; wall times there
are mostly the server's. Exits 0 whatever the ratios say: it is a measurement (1 when a run fails).
"""

from __future__ import annotations

import argparse
import importlib.util
import pstats
import random
import resource
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import harness
import pymongo
import selection_cost
from bson import Int64

from tests.support.corpus import load_bulk
from tests.support.servers import connect

DB, PLAIN, COLL, SMALL = "bench", "bench_plain", "docs", "small"
#: acceptance of issue 28: mcdc's steady CPU per document and per event against the plain clients'
DOC_RATIO, EVENT_RATIO, WALL_RATIO = 1.2, 1.3, 1.0
#: acceptance of issue 41: mcdc's start against a plain client's, and an idle catch-up's CPU (seconds)
START_RATIO, IDLE_CATCH_UP_S = 1.5, 0.5

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
    from bson.timestamp import Timestamp
    from pymongo import DeleteOne, ReplaceOne
    src, dst = pymongo.MongoClient(sys.argv[1]), pymongo.MongoClient(sys.argv[2])
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
        raise harness.BenchError(f"{' '.join(argv[:4])} ... exited {done.returncode}: {done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, done.stderr[-2000:]


def _least_cpu(argv: Sequence[str], repeat: int) -> float:
    """The least CPU of ``repeat`` runs of ``argv``: on a busy machine, the closest to its own cost."""
    return min(_cpu_of(argv)[0] for _ in range(repeat))


def _start_costs(repeat: int = 5) -> dict[str, float]:
    """CPU seconds to start: mcdc's --version and --help (its imports), and a Python importing pymongo."""
    return {
        "mcdc": _least_cpu(harness.mcdc("--version"), repeat),
        "help": _least_cpu(harness.mcdc("--help"), repeat),
        "plain": _least_cpu([sys.executable, "-c", "import pymongo"], repeat),
    }


def _load(source: str, sizes: dict[str, int]) -> None:
    with connect(source) as client:
        client.drop_database(DB)
        for coll, docs in sizes.items():
            client[DB].create_collection(coll)
            load_bulk(client, DB, coll, docs, doc_size=120)


def _events(source: str, coll_name: str, count: int, seed: int) -> None:
    """``count`` writes on the source's bench.docs: a third inserts, a third updates, a third deletes, in
    runs of a kind (so that a plain client's ordered bulk_write of 1,000 replayed events is a few commands,
    not one per change of kind: the plain replay at its best)."""
    rng = random.Random(seed)
    with connect(source) as client:
        coll = client[DB][coll_name]
        ids = [d["_id"] for d in coll.find({}, {"_id": 1}).limit(count)]
        ops: list[Any] = []
        for n in range(count):
            kind = (n % 999) // 333
            if kind == 0 or not ids:
                ops.append(pymongo.InsertOne({"_id": Int64(10**12 + seed * 10**9 + n), "v": n, "s": "x" * 40}))
            elif kind == 1:  # a value no earlier run set: never a no-op, which would send no event
                ops.append(pymongo.UpdateOne({"_id": rng.choice(ids)}, {"$set": {"v": seed * 10**9 + n}}))
            else:
                ops.append(pymongo.DeleteOne({"_id": ids.pop(rng.randrange(len(ids)))}))
            if len(ops) == 1000:
                coll.bulk_write(ops, ordered=True)
                ops = []
        if ops:
            coll.bulk_write(ops, ordered=True)


def _same(source: str, target: str, db: str, coll: str) -> None:
    with connect(source) as src, connect(target) as dst:
        want = sorted(d["_id"] for d in src[DB][coll].find({}, {"_id": 1}))
        got = sorted(d["_id"] for d in dst[db][coll].find({}, {"_id": 1}))
    if want != got:
        raise harness.BenchError(f"{db}.{coll} on the target has {len(got):,} documents, the source {len(want):,}")


#: mcdc's command line run under cProfile timing CPU, not wall time (time.process_time): a wait for the
#: server costs no CPU, and is not counted
PROFILED = textwrap.dedent(
    """
    import cProfile, runpy, sys, time
    out, sys.argv = sys.argv[1], ["mcdc", *sys.argv[2:]]
    profile = cProfile.Profile(time.process_time)
    try:
        profile.runcall(runpy.run_module, "replicator.cli", run_name="__main__")
    except SystemExit as exc:
        if exc.code:
            raise
    finally:
        profile.dump_stats(out)
    """
)


def _profile(argv: Sequence[str], out: Path) -> dict[str, float]:
    """CPU seconds by stage of one mcdc run under cProfile (each function's own CPU time)."""
    _cpu_of([sys.executable, "-c", PROFILED, str(out), *argv[3:]])
    stats = pstats.Stats(str(out))
    stages: dict[str, float] = {}
    for (filename, _, _), (_, _, own, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        stage = stage_of(filename)
        stages[stage] = stages.get(stage, 0.0) + own
    return dict(sorted(stages.items(), key=lambda item: -item[1]))


#: which stage a file's own time belongs to, by the first of these that its path holds
STAGES = (
    ("replicator/source/pump", "the pipeline's loop"),
    ("replicator/source/", "read and decode (mcdc)"),
    ("replicator/events/update_ops", "plan and write (mcdc)"),
    ("replicator/events/", "read and decode (mcdc)"),
    ("replicator/bsonkit/", "read and decode (mcdc)"),
    ("replicator/sinks/mongo/", "plan and write (mcdc)"),
    ("replicator/checkpoint/", "checkpoint"),
    ("replicator/snapshot/watermark", "checkpoint"),
    ("replicator/observe/", "progress"),
    ("replicator/replay/ddl_window", "DDL window and lookup checks"),
    ("replicator/replay/stage", "DDL window and lookup checks"),
    ("replicator/settings/selection", "transform (selection, renames)"),
    ("replicator/settings/fields", "transform (selection, renames)"),
    ("replicator/engines/", "the pipeline's loop"),
    ("replicator/replay/loop", "the pipeline's loop"),
    ("replicator/replay/streaming", "the pipeline's loop"),
    ("replicator/snapshot/copy", "the pipeline's loop"),
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


class Contenders:
    """The two contenders' commands on one pair of servers: each copy or replay of ``coll`` is one process."""

    def __init__(self, source: str, target: str, workdir: Path, extra: Sequence[str]) -> None:
        self.source, self.target, self.workdir, self.extra = source, target, workdir, list(extra)

    def _mcdc(self, command: str, coll: str) -> list[str]:
        cp = self.workdir / f"cp-{coll}.json"
        return harness.mcdc(command, "-s", self.source, "-t", self.target, "-c", str(cp), "--include",
                            rf"bench\.{coll}", "--no-progress", *self.extra)  # fmt: skip

    def clear_copies(self) -> None:
        """Before a copy again: both targets dropped, mcdc's checkpoints removed."""
        with connect(self.target) as client:
            client.drop_database(DB)
            client.drop_database(PLAIN)
        for checkpoint in self.workdir.glob("cp-*"):
            checkpoint.unlink()

    def copy(self, coll: str) -> dict[str, tuple[float, float, str]]:
        plain = _cpu_of([sys.executable, "-c", PLAIN_COPY, self.source, self.target, PLAIN, coll, DB])
        return {"plain": plain, "mcdc": _cpu_of(self._mcdc("sync", coll))}

    def replay(self, coll: str, events: int, seed: int) -> dict[str, tuple[float, float, str]]:
        with connect(self.source) as client:
            before = client.admin.command("ping")["operationTime"]
        _events(self.source, coll, events, seed)
        # mcdc first, while its checkpoint is under a minute old, as a frequent cron catch-up's is: an older
        # one makes it read the oplog's two ends (the window warning), which this test server finds by
        # scanning the whole oplog (an INFRA quirk: seconds of the server's time, against a mongod's two
        # index reads). The plain loop starts from the position before the writes all the same.
        mcdc_run = _cpu_of(self._mcdc("catch-up", coll))
        argv = [sys.executable, "-c", PLAIN_REPLAY, self.source, self.target, PLAIN, coll, DB, str(events)]
        plain = _cpu_of([*argv, str(before.time), str(before.inc)])
        for db in (DB, PLAIN):
            _same(self.source, self.target, db, coll)
        return {"plain": plain, "mcdc": mcdc_run}


def _marginal(
    big: dict[str, tuple[float, float, str]], small: dict[str, tuple[float, float, str]], n: int
) -> dict[str, float]:
    """Microseconds of CPU per unit between a small run and a big one: what each more unit costs, the
    start and every fixed cost of a run left out (they are in both)."""
    return {who: (big[who][0] - small[who][0]) / n * 1e6 for who in ("mcdc", "plain")}


def _narrow(args: argparse.Namespace, workdir: Path, source: str, target: str) -> dict[str, Any]:
    harness.heading(
        f"A narrow selection: catch-up of one collection among ten busy ones, {args.narrow_events:,} writes each"
    )
    return selection_cost.measure(
        source, target, workdir, events=args.narrow_events, repeat=args.repeat, extra=args.mcdc_arg, cpu_of=_cpu_of
    )


def bench(args: argparse.Namespace) -> dict[str, Any]:
    small_docs, small_events = args.docs // 10, args.events // 10
    if args.only == "narrow":
        with harness.bench_setup("bench_cpu.py", args, "mcdc-bench-cpu-") as (workdir, source, target, server):
            narrow = _narrow(args, workdir, source, target)
        return {"server": server, "code": harness.code_version(), "narrow": narrow}
    with harness.bench_setup("bench_cpu.py", args, "mcdc-bench-cpu-") as (workdir, source, target, server):
        harness.heading("Process start")
        start = _start_costs()
        print(
            f"mcdc --version: {start['mcdc']:.3f} s CPU; mcdc --help: {start['help']:.3f} s; "
            f"python -c 'import pymongo': {start['plain']:.3f} s"
        )

        harness.heading(f"Loading {args.docs:,} and {small_docs:,} documents")
        _load(source, {COLL: args.docs, SMALL: small_docs})
        with connect(target) as client:
            client.drop_database(DB)
            client.drop_database(PLAIN)
        runs = Contenders(source, target, workdir, args.mcdc_arg)

        repeats: list[dict[str, Any]] = [{} for _ in range(args.repeat)]
        for number, repeat in enumerate(repeats, 1):
            harness.heading(f"Copy {number}/{args.repeat}: the plain client, then mcdc sync, small then big")
            if number > 1:
                runs.clear_copies()
            repeat["copy"] = {"small": runs.copy(SMALL), "big": runs.copy(COLL)}
        for number, repeat in enumerate(repeats, 1):
            harness.heading(
                f"Replay {number}/{args.repeat}: {small_events:,}, then {args.events:,} writes, each replayed by "
                "the plain loop and mcdc"
            )
            small = runs.replay(COLL, small_events, seed=2 * number - 1)
            repeat["replay"] = {"small": small, "big": runs.replay(COLL, args.events, seed=2 * number)}
        harness.heading("A catch-up with nothing to replay (the big collection's checkpoint, just caught up)")
        start["idle_catch_up"] = _least_cpu(runs._mcdc("catch-up", COLL), 3)
        print(f"catch-up with nothing to replay: {start['idle_catch_up']:.3f} s CPU")
        idle = _idle_on_each_engine(runs._mcdc("catch-up", COLL))

        profile: dict[str, dict[str, float]] = {}
        if args.profile:
            harness.heading("Profiles: mcdc sync and catch-up of the big collection once more, under cProfile")
            with connect(target) as client:
                client.drop_database(DB)
            profiled = Contenders(source, target, workdir / "profiled", args.mcdc_arg)
            (workdir / "profiled").mkdir(exist_ok=True)
            profile["sync"] = _profile(profiled._mcdc("sync", COLL), workdir / "sync.prof")
            _events(source, COLL, args.events, seed=2 * args.repeat + 1)
            profile["catch-up"] = _profile(profiled._mcdc("catch-up", COLL), workdir / "catch-up.prof")
        narrow = _narrow(args, workdir, source, target)

    runs_data = [_steady(repeat, args.docs - small_docs, args.events - small_events) for repeat in repeats]
    return {
        "server": server,
        "code": harness.code_version(),
        "docs": [small_docs, args.docs],
        "events": [small_events, args.events],
        "start_cpu_s": start,
        "start_ratios": {
            "version": start["mcdc"] / start["plain"],
            "help": start["help"] / start["plain"],
            "idle_catch_up": start["idle_catch_up"] / start["plain"],
        },
        "repeats": runs_data,
        # the median of the repeats, each figure on its own (the one of the median ratio may differ)
        "steady_us": {
            per: {who: statistics.median(run["steady_us"][per][who] for run in runs_data) for who in ("mcdc", "plain")}
            for per in ("per_doc", "per_event")
        },
        "ratios": {
            ratio: statistics.median(run["ratios"][ratio] for run in runs_data) for ratio in runs_data[0]["ratios"]
        },
        "profile": profile,
        "idle_catch_up_engines": idle,
        "narrow": narrow,
        "commands": {"sync": " ".join(runs._mcdc("sync", COLL)), "catch-up": " ".join(runs._mcdc("catch-up", COLL))},
    }


def _idle_on_each_engine(catch_up: list[str]) -> dict[str, dict[str, float]]:
    """An idle catch-up run once on each engine: its CPU and wall seconds. The CPU is mcdc's process's and its
    waited children's: a JVM Spark started is not waited for, so its CPU is not in it (compare the walls)."""
    if importlib.util.find_spec("pyspark") is None:
        return {}
    spark = [*catch_up, "--engine", "spark", "--spark-master", "local[2]"]
    engines = {"asyncio": catch_up, "spark": spark, "spark at once": [*spark, "--spark-start-after", "0"]}
    idle = {}
    for name, argv in engines.items():
        cpu, wall, _ = _cpu_of(argv)
        idle[name] = {"cpu_s": round(cpu, 3), "wall_s": round(wall, 3)}
        print(f"idle catch-up --engine {name}: {wall:.2f} s wall, {cpu:.3f} s CPU")
    return idle


def _steady(repeat: dict[str, Any], docs: int, events: int) -> dict[str, Any]:
    """One repeat's runs, steady figures and ratios."""
    copy, replay = repeat["copy"], repeat["replay"]
    per_doc = _marginal(copy["big"], copy["small"], docs)
    per_event = _marginal(replay["big"], replay["small"], events)
    return {
        "copy": {size: _pair(runs) for size, runs in copy.items()},
        "replay": {size: _pair(runs) for size, runs in replay.items()},
        "steady_us": {"per_doc": per_doc, "per_event": per_event},
        "ratios": {
            "cpu_per_doc": per_doc["mcdc"] / per_doc["plain"],
            "cpu_per_event": per_event["mcdc"] / per_event["plain"],
            "replay_rate": replay["big"]["plain"][1] / replay["big"]["mcdc"][1],
        },
    }


def _pair(runs: dict[str, tuple[float, float, str]]) -> dict[str, Any]:
    return {who: {"cpu_s": round(run[0], 3), "wall_s": round(run[1], 3)} for who, run in runs.items()}


def report(data: dict[str, Any]) -> None:
    harness.heading("Results")
    print(f"server: {data['server']}; code: {data['code']}")
    narrow_verdict, narrow_ok = selection_cost.report(data["narrow"])
    if "repeats" not in data:  # --only narrow
        harness.print_verdicts({narrow_verdict: narrow_ok}, {"catch-up": data["narrow"]["command"]})
        return
    start, steady, r = data["start_cpu_s"], data["steady_us"], data["ratios"]
    sr = data["start_ratios"]
    print(
        f"start (CPU, against python -c 'import pymongo', {start['plain']:.3f} s): mcdc --version "
        f"{start['mcdc']:.3f} s ({sr['version']:.2f}x), mcdc --help {start['help']:.3f} s ({sr['help']:.2f}x); "
        f"a catch-up with nothing to replay {start['idle_catch_up']:.3f} s ({sr['idle_catch_up']:.2f}x)"
    )
    if data.get("idle_catch_up_engines"):
        print(
            "an idle catch-up, once on each engine (wall, CPU): "
            + "; ".join(
                f"{name} {run['wall_s']:.2f} s, {run['cpu_s']:.3f} s"
                for name, run in data["idle_catch_up_engines"].items()
            )
        )
    for number, run in enumerate(data["repeats"], 1):
        print(f"repeat {number}:")
        for what, unit, sizes in (("copy", "doc", data["docs"]), ("replay", "event", data["events"])):
            for size, n in zip(("small", "big"), sizes, strict=True):
                m, p = run[what][size]["mcdc"], run[what][size]["plain"]
                print(
                    f"  {what:<6} {n:>9,} {unit}s: mcdc {m['cpu_s']:6.2f} s CPU in {m['wall_s']:6.1f} s, "
                    f"plain {p['cpu_s']:6.2f} s CPU in {p['wall_s']:6.1f} s"
                )
            per = run["steady_us"][f"per_{unit}"]
            print(
                f"    steady CPU per {unit} (between the two sizes): mcdc {per['mcdc']:.1f} us, "
                f"plain {per['plain']:.1f} us"
            )
        rr = run["ratios"]
        print(f"  ratios: per document {rr['cpu_per_doc']:.2f}x, per event {rr['cpu_per_event']:.2f}x, "
              f"replay rate {rr['replay_rate']:.2f}x")  # fmt: skip
    repeats = len(data["repeats"])
    for unit in ("doc", "event"):
        per = steady[f"per_{unit}"]
        print(f"median of {repeats}: steady CPU per {unit}: mcdc {per['mcdc']:.1f} us, plain {per['plain']:.1f} us")
    print(
        f"ratios (mcdc / plain, the median of {repeats}): CPU per document {r['cpu_per_doc']:.2f}x, CPU per event "
        f"{r['cpu_per_event']:.2f}x; replay rate {r['replay_rate']:.2f}x the plain loop's"
    )
    for run, stages in data["profile"].items():
        total = sum(stages.values()) or 1.0
        print(f"profile of {run} (own time under cProfile, by stage):")
        for stage, seconds in stages.items():
            print(f"  {stage:<34} {seconds:7.2f} s  {100 * seconds / total:5.1f}%")
    harness.print_verdicts(
        {
            f"steady CPU per document <= {DOC_RATIO}x the plain copy's": r["cpu_per_doc"] <= DOC_RATIO,
            f"steady CPU per event <= {EVENT_RATIO}x the plain replay's": r["cpu_per_event"] <= EVENT_RATIO,
            f"catch-up rate >= {WALL_RATIO}x the plain replay's": r["replay_rate"] >= WALL_RATIO,
            f"mcdc --version's CPU <= {START_RATIO}x a plain client's start": sr["version"] <= START_RATIO,
            f"mcdc --help's CPU <= {START_RATIO}x a plain client's start": sr["help"] <= START_RATIO,
            f"a catch-up with nothing to replay < {IDLE_CATCH_UP_S} s of CPU": start["idle_catch_up"] < IDLE_CATCH_UP_S,
            narrow_verdict: narrow_ok,
        },
        data["commands"],
    )


def main() -> int:
    parser = harness.parser(__doc__)
    harness.size_options(parser, docs=(200_000, "documents copied"), events=(50_000, "writes replayed"))
    parser.add_argument("--profile", action="store_true", help="also profile mcdc's copy and replay by stage")
    parser.add_argument(
        "--repeat", type=int, default=3, help="copies and replays of each size, each pair's ratio, then their median"
    )
    parser.add_argument(
        "--narrow-events", type=int, default=4000, help="writes on each collection in the narrow case (default 4000)"
    )
    parser.add_argument("--only", choices=["narrow"], help="run this case alone (narrow: the narrow selection)")
    harness.add_server_options(parser, "an extra argument for mcdc sync and catch-up (repeatable)")
    return harness.main("bench_cpu.py", parser, None, bench, report)


if __name__ == "__main__":
    sys.exit(main())
