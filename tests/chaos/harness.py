"""A seeded, replayable fault schedule against mcdc, judged by one property:

    every checkpoint mcdc ever saved, restored and replayed with catch-up, converges to a target
    byte-identical to the source (documents, indexes and options; namespaces outside the selection
    left out).

A :class:`Plan` is drawn from a seed: the command that runs (a ``tail`` throughout, or ``catch-up``
rounds), the engine (asyncio or Spark), the target (MongoDB, Kafka whose topics a consumer rebuilds, or
Delta Lake / Iceberg tables under the plan's work directory), and a list of steps: writes
(tests/chaos/workload.py), kill -9 of mcdc, SIGTERM, a lag (mcdc held with SIGSTOP while writes go on, so
it reads events long after they happened), SIGSTOP/SIGCONT or a restart of the source or the target (not
a lake, which has no server), a kill -9 of a MongoDB target as soon as the checkpoint file moves after a
burst of inserts, a broker restart, and restoring an older copy of the checkpoint (what a lost save
amounts to); and fail points (tests/chaos/failpoints.py): MongoDB's ``failCommand`` on mcdc's reads of the
source and, for a MongoDB target, its writes, a few times or for a while, drawn apart from the rest (a
seed's other steps are what they were before fail points), in a tail, into a catch-up, into the first
snapshot and on the way back. They are all off before any check; a run an outage under one ended (exit 75)
is run again, and any other exit fails the plan. Every plan begins with a sync (or the tail's own snapshot)
under concurrent writes. A catch-up's fault strikes a random moment into it; on Spark, half of the time, one
in the seconds its session comes up while the driver writes the batches.

For a lake target, "identical" means: each selected source collection's state table holds its documents
as raw BSON, byte for byte; no state table of a collection the source does not have (dropped, renamed
away) holds a row; and each change table holds every document event of its collection since the first
checkpoint exactly once, in the source stream's order when sorted by ``sequence``, which is what mcdc's
exactly-once commits promise through kills, older checkpoints, batches cut inside transactions (lake plans
replay in small batches, and write transactions of many events and with a collection created inside)
and namespaces copied again.

:func:`run_plan` runs it on real servers, keeps every version of the checkpoint file it sees, and at the
end checks the target, then restores several of those versions in turn and checks again after a
catch-up from each. A failure raises :class:`ChaosFailure`, which prints the seed and the whole plan:
``python scripts/soak.py --seed S --once`` (with the plan's --mode/--engine/--sink) runs it again.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from bson import json_util
from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp

from replicator.errors import EXIT_UNAVAILABLE
from tests.chaos import failpoints
from tests.chaos.failpoints import FailPoints, FailStep
from tests.chaos.workload import SELECTION, ChaosWorkload, SideWorkload, prepare, selected
from tests.support.compare import assert_identical
from tests.support.kafka import KafkaBroker
from tests.support.servers import LocalServer, drop_user_databases
from tests.support.spark import quick_jvm_conf

MODES = ("tail", "catch-up")
ENGINES = ("asyncio", "spark")
#: lakehouse targets: tables under the plan's work directory, no server of their own
LAKE_SINKS = ("delta", "iceberg")
SINKS = ("mongo", "kafka", *LAKE_SINKS)
#: the sinks that keep state and apply DDL (drop, rename, dropDatabase), so the workload churns DDL for
#: them; an event sink's consumer rebuilds collections from the data topics alone
STATEFUL_SINKS = ("mongo", *LAKE_SINKS)
#: the engines each sink's plans run on (every sink on both, today; a sink not yet proven on one is left out)
SINK_ENGINES = {"mongo": ENGINES, "kafka": ENGINES, "delta": ENGINES, "iceberg": ENGINES}
#: the average pause between two writes: checkpoints get saved between them (a tail saves about once
#: a second), so restored versions fall between DDL events
PACE_S = 0.06
#: how long a converging run may take before the plan fails (Spark starts a JVM per run)
CONVERGE_S = {"asyncio": 120.0, "spark": 240.0}
#: a lake plan's replay batches: small, so that they cut transactions (at their DDL) and runs of one time
LAKE_BATCH = 5
#: how long mcdc may take to start (its first log line) on a loaded machine
START_S = 120.0
#: the selections a plan's runs switch between (``reselect`` steps): the harness's own, one without ``chaos2``
#: (narrowed), one with ``chaos3`` too (widened); each on the same checkpoint
SELECTIONS = {
    "base": SELECTION,
    "narrow": ("--include", r"chaos\..*", "--exclude", r"chaos\.ext_.*"),
    "wide": ("--include", r"chaos[23]?\..*", "--exclude", r"chaos\.ext_.*"),
}
#: the selection changes a plan may make, in order
RESELECTIONS = (("narrow",), ("wide",), ("narrow", "base"), ("wide", "narrow"), ("narrow", "wide"))
#: the targets whose comparison follows a changed selection (a lake's state tables of a collection no longer
#: selected are not emptied, which its comparison would count as stale rows)
RESELECT_SINKS = ("mongo", "kafka")
#: the faults of a way back's steps (its target is the old side)
WAY_BACK_FAULTS = ("kill", "restore", "restart source", "restart target", "crash target", "stop")
#: another migration's selection, onto namespaces every selection above maps: it must be refused
OVERLAPPING = ("--include", r"chaos\.(a|b)")
#: the read preferences and read caps (documents/s; 0: none) plans draw from: a cap low enough that a
#: snapshot of the workload's collections is paced, not so low that a plan's time goes to waiting
READ_PREFERENCES = ("", "", "primaryPreferred", "secondaryPreferred", "nearest")
READ_RATES = (0, 0, 1500, 4000)
#: the share of plans drawn with a --filter, and the filters they draw from: on collections no DDL renames
#: (a filter follows the source's name), on fields the workload's "flip" writes move across (a region that
#: may be an array, missing or null) and on the "v" its updates raise
FILTERED_SHARE = 0.3
FILTERS = (
    'chaos\\.u={"_id": {"$lt": 6}}',  # a unique index: the way back meets keys of documents it never copied
    'chaos\\.a={"region": "EU"}',
    'chaos\\.(a|b)={"region": {"$in": ["EU", "UK"]}}',
    'chaos\\.(a|b)={"$or": [{"region": "EU"}, {"v": {"$gte": 40}}]}',
    'chaos\\.b={"region": {"$ne": "US"}}',
)


#: --field-exclude rules a MongoDB plan may draw (fields no filter reads): top-level and nested
EXCLUDED_SHARE = 0.3
EXCLUDES = ("chaos.a.t", "chaos.b.c", "chaos.a.sub.x")
#: where a way back's refusals are followed as they advise: the old side's documents it would not replace,
#: moved out of the selection (tests/test_way_back_partial.py follows each advice by hand)
MOVED = "mcdc_moved"


def _in_order(steps: list[str], wanted: list[str]) -> list[str]:
    """``steps`` with the ``wanted`` ones (inserted at random places) put back in their order."""
    places = [i for i, step in enumerate(steps) if step in wanted]
    out = list(steps)
    for place, step in zip(places, wanted, strict=True):
        out[place] = step
    return out


def selects(flags: tuple[str, ...] | list[str]) -> Callable[[str], bool]:
    """What ``--include``/``--exclude`` flags select, as a test of ``db.coll`` (mcdc's own rules)."""
    from replicator.events import Namespace
    from replicator.settings.selection import Selection

    include = [flags[i + 1] for i, flag in enumerate(flags) if flag == "--include"]
    exclude = [flags[i + 1] for i, flag in enumerate(flags) if flag == "--exclude"]
    selection = Selection.from_patterns(include, exclude)
    return lambda ns: selection(Namespace.parse(ns))


class ChaosFailure(AssertionError):
    """The property did not hold: the message names the seed, the plan and what differed."""


@dataclass(frozen=True)
class Plan:
    """One schedule, entirely decided by its seed and its shape."""

    seed: int
    mode: str
    engine: str
    sink: str
    steps: tuple[str, ...]
    replays: int
    #: after the plan: a cutover, then the way back under writes (selected and not) and faults on the new side
    back: bool = False
    #: the runs' --filter (REGEX=QUERY), or "": the target holds the source's matching documents only
    filter: str = ""
    #: the runs' --read-preference and --max-read-rate flags (the source's load options), or ()
    reads: tuple[str, ...] = ()
    #: a fail point step (tests/chaos/failpoints.py) armed as the first run begins its snapshot, or ""
    opening: str = ""
    #: the way back's fail point steps (its target, MongoDB, is the old side), among its other steps
    back_fails: tuple[str, ...] = ()
    #: the runs' --field-exclude (db.coll.path), or "": the target holds the source's documents without it
    exclude: str = ""

    @classmethod
    def draw(
        cls,
        seed: int,
        *,
        mode: str | None = None,
        engine: str = "asyncio",
        sink: str = "mongo",
        length: int = 8,
        replays: int = 3,
        filtered: bool | None = None,
        excluded: bool | None = None,
    ) -> Plan:
        """``filtered``: whether the plan's runs take a --filter (None: drawn from the seed, apart from the
        rest so that a seed's other draws stay what they were); ``excluded``: a --field-exclude, the same
        way (MongoDB targets only)."""
        rng = random.Random(seed)
        mode = mode or rng.choice(MODES)
        faults = ["kill", "restore", "pause source", "restart source", "stop", "lag"]
        if sink == "kafka":
            faults += ["restart broker"]
        elif sink == "mongo":  # "crash target": kill -9 right after the checkpoint moved past a batch
            faults += ["pause target", "restart target", "crash target"]
        steps = []
        for _ in range(length):
            steps.append(f"write {rng.randrange(5, 40)}")
            if rng.random() < 0.7:
                steps.append(rng.choice(faults))
        # the edges between migrations, drawn apart so that the plans above stay what their seeds made them
        edges = random.Random(seed * 104729 + 3)
        inserts = []
        if sink in RESELECT_SINKS and edges.random() < 0.5:
            inserts += [f"reselect {name}" for name in edges.choice(RESELECTIONS)]
        if edges.random() < 0.5:
            inserts.append("overlap")
        for step in inserts:  # at random places, in order
            steps.insert(edges.randrange(len(steps) + 1), step)
        steps = _in_order(steps, [step for step in inserts if step.startswith("reselect")])
        back = sink == "mongo" and edges.random() < 0.5
        filters = random.Random(seed * 15485863 + 7)
        drawn, pick = filters.random() < FILTERED_SHARE, filters.choice(FILTERS)
        chosen = pick if (drawn if filtered is None else filtered) else ""
        # a filtered (or field-excluding) migration's way back carries the new side's part onto an old side that
        # keeps the rest, which it never touches (docs/how-to/migrate-a-cluster.md): compared as such
        cuts = random.Random(seed * 2654435761 + 13)
        drawn_cut, cut = cuts.random() < EXCLUDED_SHARE, cuts.choice(EXCLUDES)
        exclude = cut if sink == "mongo" and (drawn_cut if excluded is None else excluded) else ""
        # the source's load options, drawn apart too: reads through a causally consistent session at a
        # preference the single-node source serves from its primary, and a cap the copy must live with
        loads = random.Random(seed * 7919 + 11)
        preference, rate = loads.choice(READ_PREFERENCES), loads.choice(READ_RATES)
        reads = (("--read-preference", preference) if preference else ()) + (
            ("--max-read-rate", str(rate)) if rate else ()
        )
        # fail points, drawn apart too: one on each side the plan's target has (mcdc's reads of the source;
        # its writes when the target is MongoDB), maybe another, at random places; maybe one into the first
        # snapshot; and on the way back, one or two
        fails = random.Random(seed * 49999 + 17)
        sides = failpoints.sides_of(sink)
        drawn_fails = [failpoints.draw(fails, (side,)) for side in fails.sample(sides, len(sides))]
        drawn_fails += [failpoints.draw(fails, sides) for _ in range(fails.randrange(2))]
        for step in drawn_fails:
            steps.insert(fails.randrange(len(steps) + 1), step)
        opening = failpoints.draw(fails, sides) if fails.random() < 0.5 else ""
        back_fails = tuple(failpoints.draw(fails, failpoints.sides_of("mongo")) for _ in range(fails.randint(1, 2)))
        return cls(
            seed, mode, engine, sink, tuple(steps), replays, back, chosen, reads, opening, back_fails if back else (),
            exclude,
        )  # fmt: skip

    def __str__(self) -> str:
        return (
            f"seed={self.seed} mode={self.mode} engine={self.engine} sink={self.sink} replays={self.replays}"
            f"{' then cutover and back' if self.back else ''}{f' filter={self.filter}' if self.filter else ''}"
            f"{f' field-exclude={self.exclude}' if self.exclude else ''}"
            f"{' ' + ' '.join(self.reads) if self.reads else ''}\n"
            f"  steps: {', '.join(self.steps)}"
            + (f"\n  into the first snapshot: {self.opening}" if self.opening else "")
            + (f"\n  the way back's fail points: {', '.join(self.back_fails)}" if self.back_fails else "")
        )

    def command(self) -> str:
        """How to run this plan again."""
        return (
            f"python scripts/soak.py --once --seed {self.seed} --mode {self.mode} --engine {self.engine} "
            f"--sink {self.sink} --length {sum(s.startswith('write') for s in self.steps)} --replays {self.replays}"
            + f" --filter {'yes' if self.filter else 'no'} --field-exclude {'yes' if self.exclude else 'no'}"
        )

    def where(self, ns: str) -> dict[str, Any] | None:
        """The find() filter of the source documents the target holds of ``db.coll`` (None: all of them),
        read from the plan's --filter by the test's own means."""
        if not self.filter:
            return None
        regex, _, query = self.filter.partition("=")
        return json_util.loads(query) if re.fullmatch(regex, ns) else None

    def excluded(self, ns: str) -> list[str]:
        """The paths of ``db.coll``'s fields the plan's --field-exclude leaves out."""
        db, coll, path = self.exclude.split(".", 2) if self.exclude else ("", "", "")
        return [path] if path and ns == f"{db}.{coll}" else []


@dataclass
class Servers:
    """What a plan runs against: a source and a target server (restartable), a broker for Kafka plans."""

    source: LocalServer
    target: LocalServer
    broker: KafkaBroker | None = None


@dataclass
class Tally:
    """What plans did, for the soak's report."""

    plans: int = 0
    faults: int = 0
    writes: int = 0
    events: int = 0
    runs: int = 0
    #: fail points armed, and runs an outage under one ended (exit 75), run again
    failpoints: int = 0
    outages: int = 0
    kinds: dict[str, int] = field(default_factory=dict)

    def add(self, other: Tally) -> None:
        self.plans += other.plans
        self.faults += other.faults
        self.failpoints += other.failpoints
        self.outages += other.outages
        self.writes += other.writes
        self.events += other.events
        self.runs += other.runs
        for kind, n in other.kinds.items():
            self.kinds[kind] = self.kinds.get(kind, 0) + n


class CheckpointCopies:
    """Every distinct version of the checkpoint file, as a background thread sees it change."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.versions: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> CheckpointCopies:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._stop.wait(0.03):
            self.take()

    def take(self) -> None:
        try:
            data = self.path.read_bytes()
        except OSError:
            return
        if data and (not self.versions or self.versions[-1] != data):
            with contextlib.suppress(ValueError):
                json.loads(data)  # only whole versions (the file is replaced atomically, but be sure)
                self.versions.append(data)

    def restore(self, data: bytes) -> None:
        """Put an older version back, as a lost save would leave it."""
        tmp = self.path.with_name(self.path.name + ".chaos")
        tmp.write_bytes(data)
        os.replace(tmp, self.path)


class Runner:
    """Runs one plan (see the module's docstring)."""

    def __init__(
        self, plan: Plan, servers: Servers, workdir: Path, *, way_back: tuple[Path, tuple[str, ...]] | None = None
    ) -> None:
        """``way_back``: this runner carries a cut-over migration's new side back (``servers`` swapped), from
        the checkpoint its cutover wrote, with the selection options it printed."""
        self.plan = plan
        self.servers = servers
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.way_back = way_back
        self.cp = workdir / "cp.json" if way_back is None else way_back[0]
        self.rng = random.Random(plan.seed * 7919 + 1 + (way_back is not None))
        # the fail points' moments, apart: the draws above stay what each seed made them
        self.fail_rng = random.Random(plan.seed * 31337 + 5 + (way_back is not None))
        self.failpoints = FailPoints(
            {"source": lambda: self.servers.source.uri, "target": lambda: self.servers.target.uri}
        )
        self.tally = Tally(plans=1)
        self._logs: list[Path] = []
        self._proc: subprocess.Popen[bytes] | None = None
        #: each run's command, and the fail points' mark when it began (did one meet it?)
        self._runs: dict[int, tuple[str, tuple[int, bool]]] = {}
        self._log_of: dict[int, Path] = {}  # each run's log
        #: the way back's refusals followed as they advise: documents moved out of the selection, and the
        #: (namespace, _id, path) of excluded fields removed from the old side's documents
        self.moved: set[tuple[str, bytes]] = set()
        self.unset: set[tuple[str, bytes]] = set()
        self.prefix = f"chaos{plan.seed}"
        self.selection = "base"  # of SELECTIONS: what the runs select now
        # the plan's own state directory: the migrations it records are its own, not an earlier plan's
        self.env = {**os.environ, "XDG_STATE_HOME": str((workdir if way_back is None else workdir.parent) / "state")}
        self.side: SideWorkload | None = None  # another application's writes next to mcdc's target

    @property
    def flags(self) -> tuple[str, ...]:
        """The selection options of the runs now."""
        return self.way_back[1] if self.way_back is not None else SELECTIONS[self.selection]

    def selected(self, ns: str) -> bool:
        """Is ``db.coll`` in what the runs select now (what the comparison looks at)?"""
        return selects(self.flags)(ns)

    def where(self, ns: str) -> dict[str, Any] | None:
        """Which of ``db.coll``'s source documents the target holds (the plan's --filter; the way back's too,
        whose target keeps the rest of its own)."""
        return self.plan.where(ns)

    # -- mcdc processes ----------------------------------------------------------------------------
    @property
    def lake(self) -> Path:
        """A lake plan's tables (delta: or iceberg:PATH)."""
        return self.workdir / "lake"

    def _target(self) -> str:
        if self.plan.sink in LAKE_SINKS:
            return f"{self.plan.sink}:{self.lake}"
        if self.plan.sink == "kafka":
            assert self.servers.broker is not None
            return f"kafka://{self.servers.broker.bootstrap}"
        return self.servers.target.uri

    def _argv(self, command: str, *, checkpoint: Path | None = None, flags: tuple[str, ...] | None = None) -> list[str]:
        argv = [sys.executable, "-m", "replicator.cli", command, "-s", self.servers.source.uri]
        argv += ["-t", self._target(), "-c", str(checkpoint or self.cp), "--no-progress", "--json"]
        argv += self.flags if flags is None else flags
        if self.plan.filter and self.way_back is None:
            argv += ["--filter", self.plan.filter]
        if self.plan.exclude and self.way_back is None:  # the way back's checkpoint keeps the fields instead
            argv += ["--field-exclude", self.plan.exclude]
        if self.way_back is None:
            argv += self.plan.reads
        argv += ["--retry-initial-delay", "0.2", "--retry-max-delay", "1", "--max-retries", "-1"]
        if self.plan.sink == "kafka":
            argv += ["--topic-prefix", self.prefix]
        if self.plan.engine == "spark":
            # three replay tasks on two cores: a batch's shares are written at once, in any order
            argv += ["--engine", "spark", "--spark-master", "local[2]", "--replay-partitions", "3", *quick_jvm_conf()]
            if command == "catch-up":  # Spark at once, even for a short backlog: its tasks write under the faults
                argv += ["--spark-start-after", "0"]
        if self.plan.sink in LAKE_SINKS:
            argv += ["--max-batch-size", str(LAKE_BATCH)]
        if command == "tail" and self.plan.sink == "mongo":  # the embedded verifier sweeps all along
            argv += ["--verify", "--verify-interval", "0" if self.plan.engine == "asyncio" else "1"]
        return argv

    def _spawn(self, command: str) -> subprocess.Popen[bytes]:
        log = self.workdir / f"mcdc-{len(self._logs):03d}-{command}.log"
        self._logs.append(log)
        with open(log, "wb") as out:
            proc = subprocess.Popen(self._argv(command), stdout=out, stderr=subprocess.STDOUT, env=self.env)
        self.tally.runs += 1
        self._runs[proc.pid] = (command, self.failpoints.mark())
        self._log_of[proc.pid] = log
        return proc

    def _outage(self, proc: subprocess.Popen[bytes]) -> subprocess.Popen[bytes] | None:
        """When ``proc`` ended with exit 75 (an outage outlived its retries) while a fail point could strike
        it, the same command run again, as an operator (or cron) would; None otherwise (any other exit is
        the caller's to judge, as before fail points)."""
        command, mark = self._runs[proc.pid]
        if proc.returncode == 2 and self.way_back is not None and self._follow_advice(self._log_of[proc.pid]):
            return self._spawn(command)
        if proc.returncode != EXIT_UNAVAILABLE or not self.failpoints.since(mark):
            return None
        self.tally.outages += 1
        return self._spawn(command)

    def _follow_advice(self, log: Path) -> bool:
        """A way back that stopped rather than replace what its migration did not copy: done as its one-line
        refusal advises (the old side's document moved out of the selection, or its excluded fields removed),
        so that the same command goes on. False for any other error."""
        errors = [line for line in log.read_text(errors="replace").splitlines() if line.startswith("mcdc: error:")]
        line = errors[-1] if errors else ""
        if "the way back stops" not in line:
            return False
        found = re.search(r"target: (\S+) _id (.+?) on the old side is a document the migration did not copy", line)
        found = found or re.search(r"the old side's (\S+) _id (.+?), which the migration did not copy", line)
        fields = re.search(r"target: (\S+) _id (.+?): the new side's document has no place for", line)
        if found is None and fields is None:
            self.fail(f"a way back's refusal the harness cannot follow: {line}")
        import bson
        import pymongo

        ns, text = (found or fields).groups()  # type: ignore[union-attr]
        key = json_util.loads(text)
        db, coll = ns.split(".", 1)
        with pymongo.MongoClient(self.servers.target.uri, document_class=RawBSONDocument) as client:
            doc = client[db][coll].find_one({"_id": key})
            if doc is None:
                self.fail(f"the refusal names a document the old side does not have: {line}")
            if found is not None:
                client[MOVED][ns].insert_one(doc)
                client[db][coll].delete_one({"_id": key})
                self.moved.add((ns, bson.encode({"_id": key})))
            else:
                client[db][coll].update_one({"_id": key}, {"$unset": dict.fromkeys(self.plan.excluded(ns), "")})
                self.unset.add((ns, bson.encode({"_id": key})))
        self.tally.kinds["advice"] = self.tally.kinds.get("advice", 0) + 1
        return True

    def _finish(self, proc: subprocess.Popen[bytes], timeout: float) -> None:
        """Wait for a bounded run to exit 0, and count the events its summary reports."""
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            self.fail(f"mcdc did not finish within {timeout:.0f} s")
        if (again := self._outage(proc)) is not None:
            if proc is self._proc:
                self._proc = again
            self._finish(again, timeout)
            return
        if code != 0:
            self.fail(f"mcdc exited with {code}")
        self._count_events()

    def _count_events(self) -> None:
        text = self._logs[-1].read_text(errors="replace")
        start = text.rfind('\n{\n  "command"')
        with contextlib.suppress(ValueError):
            self.tally.events += int(json.loads(text[start + 1 :]).get("events", 0))

    def _run(self, command: str) -> None:
        self._finish(self._spawn(command), CONVERGE_S[self.plan.engine])

    def _kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGKILL)
            self._proc.wait()
        self._unlock_target()

    def _unlock_target(self) -> None:
        """A kill -9 mid-transaction leaves it open on the target, holding its documents, until the server
        reaps it (mongod at 60 s; the test server never): what the server does, at once."""
        if self.plan.sink == "mongo" and self.servers.target.running:
            import pymongo

            with contextlib.suppress(pymongo.errors.PyMongoError), pymongo.MongoClient(self._target()) as client:
                client.admin.command("killAllSessions", [])

    # -- the plan ----------------------------------------------------------------------------------
    def fail(self, reason: str) -> NoReturn:
        tail = self._logs[-1].read_text(errors="replace")[-3000:] if self._logs else ""
        raise ChaosFailure(
            f"chaos plan failed: {reason}\n{self.plan}\n  again: {self.plan.command()}\n"
            f"  work directory: {self.workdir}\n--- last mcdc log ---\n{tail}"
        )

    def run(self, steps: tuple[str, ...] | None = None, side: SideWorkload | None = None) -> Tally:
        """The plan's steps (``steps``: the way back's), then the checks; ``side``: the way back's other
        application, which goes on writing the new side."""
        if self.way_back is None:
            prepare(self.servers.source.uri)
            drop_user_databases(self.servers.target.uri)  # what an earlier plan left
        seed = self.plan.seed if self.way_back is None else self.plan.seed + 1
        workload = ChaosWorkload(
            self.servers.source.uri, random.Random(seed), ddl=self.plan.sink in STATEFUL_SINKS,
            lake=self.plan.sink in LAKE_SINKS, flips=bool(self.plan.filter),
        )  # fmt: skip
        if self.plan.sink == "mongo":
            self.side = side or SideWorkload(self.servers.target.uri, random.Random(seed * 13 + 5))
        try:
            with CheckpointCopies(self.cp) as copies:
                self.copies = copies
                self._begin(workload)
                for step in self.plan.steps if steps is None else steps:
                    self._step(step, workload)
                self._end()
            self._replay_copies()
            self._check_side()
            if self.plan.back and self.way_back is None:
                self._cut_over_and_back()
        finally:
            self.failpoints.disarm_all(strict=False)  # the servers outlive the plan (a session's, a soak's)
            self.tally.failpoints += self.failpoints.count
            self._kill()
            workload.close()
            if self.side is not None and side is None:
                self.side.close()
            self._drop_topics()
            self.tally.writes += sum(workload.counts.values())
            for kind, n in workload.counts.items():
                self.tally.kinds[kind] = self.tally.kinds.get(kind, 0) + n
        return self.tally

    def _check_side(self) -> None:
        """Namespaces outside the selection on mcdc's target: what the other application wrote, and only that."""
        if self.side is not None and self.way_back is None:
            try:
                self.side.check()
            except AssertionError as exc:
                self.fail(str(exc))

    def _cut_over_and_back(self) -> None:
        """mongosync's commit and reverse: cut over at the quiet source, then the way back (run as cutover
        printed it) under writes and faults on the new side, selected and not, DDL among them before its first
        run and during it. The way back's every saved checkpoint replays, the old side's namespaces outside the
        selection stay as they were, and so does what a partial migration did not copy (documents outside
        its filter, fields it excluded), but for the refusals the way back made and the harness followed."""
        old, new = self.servers.source, self.servers.target
        untouched = _unselected(old.uri, self.selected)
        back = self.workdir / "back" / "back.json"
        argv = [*self._argv("cutover"), "--reverse-checkpoint", str(back)]
        done = subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=600)
        if done.returncode != 0:
            self.fail(f"cutover exited with {done.returncode}: {done.stderr.strip()[-2000:]}")
        if held := _held_ttls(new.uri):
            self.fail(f"cutover left TTLs held on the target: {held}")
        printed = shlex.split(json.loads(done.stdout)["reverse_command"])
        at = printed.index("--checkpoint")
        if Path(printed[at + 1]) != back:
            self.fail(f"cutover printed another way back: {printed}")
        options = tuple(printed[at + 2 :])
        steps = []
        for _ in range(3):
            steps.append(f"write {self.rng.randrange(5, 25)}")
            steps.append(self.rng.choice(WAY_BACK_FAULTS))
        places = random.Random(self.plan.seed * 49999 + 19)  # the plan's way-back fail points, at drawn places
        for step in self.plan.back_fails:
            steps.insert(places.randrange(len(steps) + 1), step)
        kept = _old_part(old.uri, self.plan)
        since = _cluster_time(back)
        first = ChaosWorkload(new.uri, random.Random(self.plan.seed * 613 + 3), flips=bool(self.plan.filter))
        try:  # on the new side before the way back's first run: inside its DDL window
            first.steps(self.rng.randrange(3, 12))
            for kind in ("coll_mod", "index"):
                getattr(first, f"_{kind}")()
                first.counts[kind] = first.counts.get(kind, 0) + 1
        finally:
            first.close()
        for kind, n in first.counts.items():
            self.tally.kinds[f"before the way back: {kind}"] = n
        runner = Runner(self.plan, Servers(new, old, None), self.workdir / "back", way_back=(back, options))
        assert self.side is not None
        self.tally.add(runner.run(tuple(steps), side=self.side))
        self.tally.plans -= 1  # the same plan
        if (now := _unselected(old.uri, self.selected)) != untouched:
            changed = sorted(ns for ns in set(now) | set(untouched) if now.get(ns) != untouched.get(ns))
            self.fail(f"the way back wrote the old side's namespaces outside the selection: {changed}")
        problem = _check_old_part(old.uri, new.uri, self.plan, kept, since, runner.moved, runner.unset)
        if problem is not None:
            self.fail(problem)

    def _begin(self, workload: ChaosWorkload) -> None:
        """The first snapshot, under writes, maybe killed once (the way back: its first run)."""
        command = "tail" if self.plan.mode == "tail" else "sync" if self.way_back is None else "catch-up"
        self._proc = self._spawn(command)
        opening = FailStep.parse(self.plan.opening) if self.plan.opening and self.way_back is None else None
        if opening is not None and self.fail_rng.random() < 0.5:  # from its first command on
            self._arm(opening)
            opening = None
        if self.way_back is None and self.plan.sink in STATEFUL_SINKS:
            self._rename_while_copying(workload)
        elif opening is not None:
            self._snapshot_begun()
        if opening is not None:  # once the copy is under way
            self._arm(opening)
        workload.steps(self.rng.randrange(5, 30))
        if self.rng.random() < 0.5:
            time.sleep(self.rng.uniform(0.0, 1.5))
            self._kill()
            self.tally.faults += 1
            self._proc = self._spawn(command)
        if command != "tail":
            self._finish(self._proc, CONVERGE_S[self.plan.engine])

    def _rename_while_copying(self, workload: ChaosWorkload) -> None:
        """A collection of the selection renamed (and a new one made under its name) as soon as the first
        snapshot is under way, before its copy may have read it."""
        self._snapshot_begun()
        workload.rotate()

    def _snapshot_begun(self) -> None:
        """Return once the running mcdc's checkpoint says its first snapshot began (or it exited, or a
        loaded machine's start time passed)."""
        deadline = time.monotonic() + START_S
        while self._proc is not None and self._proc.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError, KeyError):
                if json.loads(self.cp.read_bytes())["snapshot"]["status"] != "none":
                    break
            time.sleep(0.01)

    def _step(self, step: str, workload: ChaosWorkload) -> None:
        verb, _, arg = step.partition(" ")
        if self.plan.mode == "tail":
            self._revive()
        if failpoints.is_fail(step):
            self._fail_point(FailStep.parse(step))
            return
        if verb == "write":
            workload.steps(int(arg), PACE_S)
            if self.side is not None:
                self.side.steps(self.rng.randrange(1, 4))
            if self.plan.mode == "catch-up" and self.rng.random() < 0.5:
                self._run("catch-up")
            return
        tail = self.plan.mode == "tail"
        if verb == "overlap":
            self._overlap()
            return
        if verb == "reselect":  # the migration's runs select otherwise from now on, on its checkpoint
            self.selection = arg
            if tail:
                self._sigterm(must_exit_0=True)
                self._proc = self._spawn("tail")
            else:
                self._run("catch-up")
            return
        self.tally.faults += 1
        if verb == "crash":
            self._crash_target(workload, tail=tail)
            return
        if not tail:  # the fault strikes a catch-up while it runs
            self._proc = self._spawn("catch-up")
            self._into_the_run(self._proc)
        if verb in ("kill", "restore"):
            self._kill()
            if verb == "restore" and self.copies.versions:
                self.copies.restore(self.rng.choice(self.copies.versions))
            self._proc = self._spawn("tail" if tail else "catch-up")
        elif verb == "lag":  # mcdc falls behind while writes go on (SIGSTOP), as a busy run does
            assert self._proc is not None
            self._proc.send_signal(signal.SIGSTOP)
            workload.steps(self.rng.randrange(5, 25), PACE_S)
            self._proc.send_signal(signal.SIGCONT)
        elif verb == "stop":  # a tail stops cleanly (exit 0); a catch-up is just ended
            self._sigterm(must_exit_0=tail)
            self._unlock_target()
            self._proc = self._spawn("tail" if tail else "catch-up")
        else:
            self._server_fault(verb, arg)
        if not tail:
            assert self._proc is not None
            self._finish(self._proc, CONVERGE_S[self.plan.engine] * 2)

    def _arm(self, step: FailStep) -> None:
        self.failpoints.arm(step)
        self.tally.kinds[f"fail {step.side}"] = self.tally.kinds.get(f"fail {step.side}", 0) + 1

    def _fail_point(self, step: FailStep) -> None:
        """A tail meets the fail point from now on, in the writes that follow (a while's ends on its own, a
        few times' when used up, replaced by the next, or before the checks). Catch-up rounds: a catch-up
        meets it from a random moment into it, and must finish all the same; it is turned off after."""
        if self.plan.mode == "tail":
            self._arm(step)
            return
        self._proc = self._spawn("catch-up")
        self._into_the_run(self._proc, self.fail_rng)
        self._arm(step)
        self._finish(self._proc, CONVERGE_S[self.plan.engine] * 2)
        self.failpoints.disarm(step.side)

    def _revive(self) -> None:
        """The tail must still run between steps: one an outage under a fail point ended (exit 75) is run
        again; any other exit fails the plan."""
        proc = self._proc
        if proc is None or proc.poll() is None:
            return
        if (again := self._outage(proc)) is None:
            self.fail(f"the tail exited with {proc.returncode} in the middle of the plan")
        self._proc = again

    def _overlap(self) -> None:
        """Another migration onto namespaces this one writes (its checkpoint saved by now): refused, in one
        line naming this migration's checkpoint, before it saves anything."""
        deadline = time.monotonic() + START_S
        while not self.cp.exists():
            if time.monotonic() > deadline:
                self.fail("no checkpoint saved to overlap with")
            time.sleep(0.05)
        other = self.workdir / "other.json"
        never = ("--snapshot", "never") if self.rng.random() < 0.5 else ()
        # the plan's own rules (a --filter on a collection the other selection leaves out) may match nothing of it
        argv = [*self._argv("catch-up", checkpoint=other, flags=(*OVERLAPPING, *never)), "--allow-unmatched"]
        done = subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=START_S * 2)
        errors = [line for line in done.stderr.splitlines() if line.startswith("mcdc: error:")]
        if done.returncode != 2 or len(errors) != 1 or os.path.realpath(self.cp) not in errors[0] or other.exists():
            self.fail(f"another migration onto this one's namespaces was not refused: exit {done.returncode}, "
                      f"{done.stderr.strip()[-1500:]}")  # fmt: skip

    def _sigterm(self, *, must_exit_0: bool) -> None:
        """SIGTERM to the running mcdc, once it has logged its first line: it handles signals from before
        that (a signal before mcdc installed its handlers ends it as a kill would, and a loaded machine
        takes seconds to start one)."""
        assert self._proc is not None
        self._wait_started(self._proc)
        self._proc.send_signal(signal.SIGTERM)
        code = self._proc.wait(120)
        if code == 2 and self.way_back is not None and self._follow_advice(self._log_of[self._proc.pid]):
            return  # it had stopped on a refusal before the signal: done as advised, the next run goes on
        if code == EXIT_UNAVAILABLE and self.failpoints.since(self._runs[self._proc.pid][1]):
            # an outage under a fail point ended it, or the signal came while it waited for a server one struck
            self.tally.outages += 1
        elif code != 0 and must_exit_0:
            self.fail(f"mcdc exited with {code} on SIGTERM")

    def _wait_started(self, proc: subprocess.Popen[bytes], line: bytes = b" mcdc") -> None:
        deadline = time.monotonic() + START_S
        while proc.poll() is None and line not in self._logs[-1].read_bytes():
            if time.monotonic() > deadline:
                self.fail(f"mcdc logged no {line.decode().strip()!r} within {START_S:.0f} s of its start")
            time.sleep(0.05)

    def _into_the_run(self, proc: subprocess.Popen[bytes], rng: random.Random | None = None) -> None:
        """A random moment into a run (drawn from ``rng``, the plan's own by default). On Spark, half of the
        time, one in the seconds after its "starting Spark" line, while its session comes up and the driver
        writes the batches meanwhile."""
        rng = rng or self.rng
        if self.plan.engine == "spark" and rng.random() < 0.5:
            self._wait_started(proc, b"starting Spark")
            time.sleep(rng.uniform(0.0, 3.0))
        else:
            time.sleep(rng.uniform(0.0, 1.0))

    def _crash_target(self, workload: ChaosWorkload, *, tail: bool) -> None:
        """kill -9 of the target as soon as the checkpoint file moves after a burst of fresh inserts began. A
        save comes right after the ack of a batch, so that batch's writes are milliseconds old: the worst
        moment for a write the target acknowledged but had not made durable, which no run writes again (the
        checkpoint, and the running mcdc, are past it). A tail saves at most once a second, so its burst
        lasts longer (small inserts, 50 ms apart): a save falls on the ack of one of its batches rather than
        on an idle poll's a second after the last. A catch-up, started after its burst, saves at its first
        ack. The target comes back on the same data, mcdc retries its way on, and the end of the plan finds
        any document lost."""
        before = _cluster_time(self.cp)
        chunks, size = self.rng.randrange(20, 40), self.rng.randrange(10, 25)
        writer = threading.Thread(target=workload.burst, args=(chunks, size, 0.05))
        writer.start()
        if not tail:
            writer.join()
            self._proc = self._spawn("catch-up")
        proc = self._proc
        assert proc is not None
        deadline = time.monotonic() + CONVERGE_S[self.plan.engine]
        while _cluster_time(self.cp) <= before:
            if proc.poll() is not None and _cluster_time(self.cp) <= before:  # read again: its last save
                if (again := self._outage(proc)) is None:
                    self.fail(f"mcdc exited with {proc.returncode} before its checkpoint moved")
                self._proc = proc = again
            if time.monotonic() > deadline:
                self.fail(f"the checkpoint did not move within {CONVERGE_S[self.plan.engine]:.0f} s of a burst")
            time.sleep(0.002)
        self.servers.target.kill()
        self.servers.target.start()
        self.failpoints.reset("target")
        writer.join()
        if not tail:
            self._finish(proc, CONVERGE_S[self.plan.engine] * 2)

    def _server_fault(self, verb: str, which: str) -> None:
        server = {"source": self.servers.source, "target": self.servers.target, "broker": self.servers.broker}[which]
        assert server is not None
        if verb == "pause":
            server.pause()
            time.sleep(self.rng.uniform(0.5, 3.0))
            server.resume()
        elif which == "broker":
            # noida-db loses records it acknowledged while a SIGTERM shuts it down (tests/support/kafka.py), which
            # a Kafka broker does not: mcdc is frozen while the broker stops, and meets the outage once thawed
            assert self._proc is not None
            self._proc.send_signal(signal.SIGSTOP)
            time.sleep(0.3)
            server.stop()
            self._proc.send_signal(signal.SIGCONT)
            time.sleep(self.rng.uniform(0.2, 2.0))
            server.start()
        else:
            server.stop()
            time.sleep(self.rng.uniform(0.2, 2.0))
            server.start()
            self.failpoints.reset(which)  # a fail point lives in the server's memory

    def _end(self) -> None:
        """Writes stop and every fail point is turned off; the running tail (or a last catch-up) must bring
        the target to the source."""
        self.failpoints.disarm_all()
        if self.plan.mode == "tail":
            self._converge(self._alive)
            self._sigterm(must_exit_0=True)
            self._count_events()
            self._check_verifier()
            if self.plan.sink in LAKE_SINKS:  # at rest now: the change tables too
                self._check()
        else:
            self._run("catch-up")
            self._check()
        self.copies.take()

    def _check_verifier(self) -> None:
        """The embedded verifier's property: whatever the faults, it never confirms a difference that the
        replay then removes (the target converged), nor stops."""
        for log in self._logs:
            for line in log.read_text(errors="replace").splitlines():
                if "verify stopped:" in line or ("(confirmed by a re-check)" in line and not _quirk(line)):
                    self.fail(f"the embedded verifier in {log.name}: {line}")

    def _replay_copies(self) -> None:
        """The property: catch-up from saved checkpoints, each restored in turn, converges."""
        versions = self.copies.versions
        chosen = sorted(self.rng.sample(range(len(versions)), min(self.plan.replays, len(versions))))
        for n in reversed(chosen):
            self.copies.restore(versions[n])
            self._run("catch-up")
            try:
                self._check()
            except ChaosFailure as exc:
                raise ChaosFailure(f"after restoring checkpoint version {n + 1} of {len(versions)}: {exc}") from None

    def _drop_topics(self) -> None:
        """A Kafka plan's topics, deleted (the broker keeps everything in memory)."""
        if self.servers.broker is None or self.plan.sink != "kafka":
            return
        import asyncio

        from tests.support.kafka import delete_topics, list_topics

        async def drop() -> None:
            assert self.servers.broker is not None
            bootstrap = self.servers.broker.bootstrap
            mine = [t for t in await list_topics(bootstrap) if t.startswith(self.prefix + ".")]
            await delete_topics(bootstrap, mine)

        with contextlib.suppress(Exception):
            asyncio.run(drop())

    def _check(self) -> None:
        try:
            self._compare(changes=True)
        except AssertionError as exc:
            self.fail(f"target differs from the source: {exc}")

    def _compare(self, *, changes: bool = False) -> None:
        """The target against the source; ``changes``: a lake's change tables too (at rest only, they are
        read whole)."""
        if self.plan.sink in LAKE_SINKS:
            since = _first_position(self.copies.versions) if changes else None
            _compare_lake(
                self.plan.sink, self.lake, self.servers.source.uri, changes=changes, since=since, where=self.where
            )
            return
        if self.plan.sink == "mongo":
            assert_identical(
                self.servers.source.uri, self.servers.target.uri, only=self.selected, where=self.where,
                target_where=self.where if self.way_back is not None else None, strip=self.plan.excluded,
            )  # fmt: skip
            return
        import asyncio

        from tests.support.rebuild import assert_same, rebuilt_from_topics, server_docs

        assert self.servers.broker is not None
        got = asyncio.run(rebuilt_from_topics(self.servers.broker.bootstrap, self.prefix))
        source = server_docs(self.servers.source.uri, where=self.where)
        assert_same(
            {ns: docs for ns, docs in got.items() if self.selected(ns)},
            {ns: docs for ns, docs in source.items() if self.selected(ns)},
        )

    def _alive(self) -> bool:
        """Is the tail running (one an outage under a fail point ended is run again)?"""
        proc = self._proc
        if proc is not None and proc.poll() is not None and (again := self._outage(proc)) is not None:
            self._proc = again
        return self._proc is not None and self._proc.poll() is None

    def _converge(self, alive: Callable[[], bool]) -> None:
        deadline = time.monotonic() + CONVERGE_S[self.plan.engine]
        while True:
            if not alive():
                self.fail("mcdc exited before converging")
            try:
                self._compare()
                return
            except AssertionError as exc:
                if time.monotonic() > deadline:
                    self.fail(f"no convergence within {CONVERGE_S[self.plan.engine]:.0f} s: {exc}")
            time.sleep(0.5)


#: what the test server's createIndexes change events leave out (INFRA.md: a SecantusDB quirk; mongod's
#: events carry them): until a catalog reconcile, the replayed index lacks them, a real difference
_QUIRK_OPTIONS = ("unique", "sparse", "partialFilterExpression")
_INDEX_DIFFERS = re.compile(r"index \S+ differs: source (\{.*\}), target (\{.*\}) \(confirmed by a re-check\)")


def _quirk(line: str) -> bool:
    """A confirmed index difference that is only the options the test server's events leave out."""
    match = _INDEX_DIFFERS.search(line)
    if match is None:
        return False
    source, target = (json.loads(text) for text in match.groups())
    return {k: v for k, v in source.items() if k not in _QUIRK_OPTIONS} == target


def _unselected(uri: str, selected: Callable[[str], bool]) -> dict[str, list[Any]]:
    """Every user namespace of a server that the selection does not take, with its documents (but those the
    harness moved there, following a way back's refusal)."""
    import pymongo

    out: dict[str, list[Any]] = {}
    with pymongo.MongoClient(uri) as client:
        for db in client.list_database_names():
            if db in ("admin", "local", "config", MOVED):
                continue
            for coll in client[db].list_collection_names():
                if not selected(f"{db}.{coll}") and not coll.startswith("system."):
                    out[f"{db}.{coll}"] = sorted(client[db][coll].find(), key=repr)
    return out


def _held_ttls(uri: str) -> list[str]:
    """The TTLs a server holds at MongoDB's largest expireAfterSeconds (a migration's, before its cutover)."""
    import pymongo

    from tests.support.compare import HELD_TTL

    held = []
    with pymongo.MongoClient(uri) as client:
        for db in ("chaos", "chaos2"):
            for info in client[db].list_collections():
                if (info.get("options") or {}).get("expireAfterSeconds") == HELD_TTL:
                    held.append(f"{db}.{info['name']}")
                if info.get("type", "collection") == "collection":
                    held += [f"{db}.{info['name']} {ix['name']}" for ix in client[db][info["name"]].list_indexes()
                             if ix.get("expireAfterSeconds") == HELD_TTL]  # fmt: skip
    return held


@dataclass
class _OldPart:
    """What a partial migration left on the old side, as its cutover left it: the documents outside its
    filter, and the excluded fields' values of each document (as ``{path: value}`` BSON)."""

    unmigrated: dict[tuple[str, bytes], bytes]
    fields: dict[tuple[str, bytes], bytes]


def _kept_values(raw: bytes, paths: list[str]) -> bytes | None:
    import bson

    doc = bson.decode(raw)
    values = {}
    for path in paths:
        node: Any = doc
        for part in path.split("."):
            node = node.get(part, _MISSING) if isinstance(node, dict) else _MISSING
        if node is not _MISSING:
            values[path] = node
    return bson.encode(values) if values else None


_MISSING = object()


def _old_part(uri: str, plan: Plan) -> _OldPart:
    import bson
    import pymongo

    part = _OldPart({}, {})
    with pymongo.MongoClient(uri, document_class=RawBSONDocument) as client:
        for db in ("chaos", "chaos2"):
            for coll in client[db].list_collection_names():
                ns = f"{db}.{coll}"
                where, paths = plan.where(ns), plan.excluded(ns)
                if where is not None:
                    for doc in client[db][coll].find({"$nor": [where]}):
                        part.unmigrated[(ns, bson.encode({"_id": doc["_id"]}))] = bytes(doc.raw)
                for doc in client[db][coll].find() if paths else ():
                    values = _kept_values(bytes(doc.raw), paths)
                    if values is not None:
                        part.fields[(ns, bson.encode({"_id": doc["_id"]}))] = values
    return part


def _check_old_part(
    old: str,
    new: str,
    plan: Plan,
    before: _OldPart,
    since: Timestamp,
    moved: set[tuple[str, bytes]],
    unset: set[tuple[str, bytes]],
) -> str | None:
    """Why the old side's part that the migration did not copy is not as the cutover left it (but for what the
    harness did as a refusal advised), or None. A document's kept fields go with it when the way back deletes
    it: one the new side deleted, or (filtered) moved out of the filter since the cutover, may lack them."""
    import bson
    import pymongo

    gone: set[tuple[str, bytes]] = set()
    with pymongo.MongoClient(new) as client, client.watch(start_at_operation_time=since) as stream:
        while (change := stream.try_next()) is not None:
            ns = f"{(change.get('ns') or {}).get('db')}.{(change.get('ns') or {}).get('coll')}"
            key = (change.get("documentKey") or {}).get("_id", _MISSING)
            op = change["operationType"]
            if key is not _MISSING and (op == "delete" or (plan.where(ns) is not None and op != "insert")):
                gone.add((ns, bson.encode({"_id": key})))
    with pymongo.MongoClient(old, document_class=RawBSONDocument) as client:
        for (ns, key), raw in before.unmigrated.items():
            db, coll = ns.split(".", 1)
            where = client[MOVED][ns] if (ns, key) in moved else client[db][coll]
            now = where.find_one(bson.decode(key))
            if now is None or bytes(now.raw) != raw:
                after = str(bson.decode(now.raw))[:300] if now is not None else None
                return (f"the way back changed {ns} {bson.decode(key)}, which the migration did not copy: "
                        f"{str(bson.decode(raw))[:300]} -> {after}")  # fmt: skip
        for (ns, key), values in before.fields.items():
            if (ns, key) in unset or (ns, key) in moved:
                continue
            db, coll = ns.split(".", 1)
            now = client[db][coll].find_one(bson.decode(key))
            kept = _kept_values(bytes(now.raw), plan.excluded(ns)) if now is not None else None
            if kept != values and not (kept is None and (ns, key) in gone):
                after = bson.decode(kept) if kept is not None else None
                return f"the way back lost {ns} {bson.decode(key)}'s excluded fields: {bson.decode(values)} -> {after}"
    return None


def _cluster_time(cp: Path) -> Timestamp:
    """The cluster time of the checkpoint file's position; zero while it has none."""
    try:
        at = json.loads(cp.read_bytes())["position"]["cluster_time"]
    except (OSError, ValueError, KeyError, TypeError):
        at = None
    return Timestamp(0, 0) if at is None else Timestamp(at["t"], at["i"])


def _first_position(versions: list[bytes]) -> dict[str, Any] | None:
    """Where the first saved checkpoint has the stream begin: ``watch()``'s options to read from there."""
    from replicator.bsonkit.extjson import from_jsonable

    if not versions:
        return None
    position = json.loads(versions[0])["position"]
    if position.get("resume_token") is not None:
        return {"resume_after": from_jsonable(position["resume_token"])}
    ct = position.get("cluster_time")
    return {"start_at_operation_time": Timestamp(ct["t"], ct["i"])} if ct else None


def _document_events(source: str, since: dict[str, Any]) -> dict[tuple[str, str], list[str]]:
    """The selected collections' document events on the source from ``since`` on, by collection, as
    resume tokens (canonical Extended JSON, as change rows keep them) in stream order."""
    import pymongo

    from replicator.bsonkit.extjson import dumps_str

    out: dict[tuple[str, str], list[str]] = {}
    with pymongo.MongoClient(source) as client, client.watch(**since) as stream:
        while (change := stream.try_next()) is not None:
            ns = change.get("ns") or {}
            if change["operationType"] in _DOCUMENT_OPS and selected(f"{ns.get('db')}.{ns.get('coll')}"):
                out.setdefault((ns["db"], ns["coll"]), []).append(dumps_str(change["_id"]))
    return out


_DOCUMENT_OPS = ("insert", "update", "replace", "delete")


def _compare_lake(
    kind: str,
    root: Path,
    source: str,
    *,
    changes: bool,
    since: dict[str, Any] | None = None,
    where: Callable[[str], dict[str, Any] | None] | None = None,
) -> None:
    """Each selected source collection's documents are its state table's ``bson`` column, byte for byte; a
    state table of any other collection is empty; with ``changes``, no change table holds an event twice,
    and (``since``: where the stream began) each holds its collection's document events exactly once, in
    the stream's order by ``sequence``. ``where``: a collection's query under a --filter, whose state table
    holds the matching documents only, and whose change table the stream's events that reached it (those of
    documents that never matched are not there), still once each and in order."""
    from tests.support.lake import collections, duplicate_changes, read_table, source_bytes, state_bytes, tables

    live = set()
    for db in ("chaos", "chaos2"):
        for coll in collections(source, db):  # views are no tables
            if selected(f"{db}.{coll}"):
                live.add((db, coll))
                query = where(f"{db}.{coll}") if where is not None else None
                expected, got = source_bytes(source, db, coll, query), state_bytes(kind, root, db, coll)
                if got != expected:
                    raise AssertionError(f"{db}.{coll}: {_lake_difference(expected, got)}")
    for db, coll in tables(kind, root, "state"):
        if (db, coll) not in live and (rows := state_bytes(kind, root, db, coll)):
            raise AssertionError(
                f"{db}.{coll}: not a selected collection on the source, but its state table holds {len(rows)} "
                f"rows (_ids {_ids(rows)[:10]})"
            )
    if not changes:
        return
    stream = _document_events(source, since) if since is not None else {}
    for db, coll in sorted(set(tables(kind, root, "changes")) | set(stream)):
        table = read_table(kind, root, "changes", db, coll)
        if table is not None and (dups := duplicate_changes(table)):
            raise AssertionError(
                f"{db}.{coll}: {len(dups)} events twice in the change table of {table.num_rows} rows, e.g. "
                f"(key, sequence, op) = {dups[:5]}"
            )
        if since is None:
            continue
        rows = table.to_pylist() if table is not None else []
        rows.sort(key=lambda r: tuple(r["sequence"].values()) if r["sequence"] is not None else ())
        got = [r["resume_token"] for r in rows if r["op"] in ("c", "u", "replace", "d")]
        want = stream.get((db, coll), [])
        if where is not None and where(f"{db}.{coll}") is not None:
            want = [token for token in want if token in set(got)]  # the filter's: in order, each once (above)
        if got != want:
            missing, extra = [t for t in want if t not in set(got)], [t for t in got if t not in set(want)]
            raise AssertionError(
                f"{db}.{coll}: the change table's {len(got)} document events are not the stream's {len(want)} in "
                f"order: missing {missing[:3]}, not in the stream {extra[:3]}"
                + ("" if missing or extra else ", out of order")
            )


def _ids(raws: list[bytes]) -> list[Any]:
    import bson

    return [bson.decode(raw).get("_id") for raw in raws]


def _lake_difference(expected: list[bytes], got: list[bytes]) -> str:
    """What a state table has that the source has not, by ``_id``."""
    import bson

    want = {repr(bson.decode(raw).get("_id")): raw for raw in expected}
    have: dict[str, list[bytes]] = {}
    for raw in got:
        have.setdefault(repr(bson.decode(raw).get("_id")), []).append(raw)
    missing = sorted(set(want) - set(have))
    extra = sorted(set(have) - set(want))
    twice = sorted(k for k, rows in have.items() if len(rows) > 1)
    differ = sorted(k for k in set(want) & set(have) if have[k] != [want[k]] and k not in twice)
    return (
        f"{len(got)} rows in the state table, {len(expected)} documents on the source; "
        f"missing _ids {missing[:10]}, extra {extra[:10]}, twice {twice[:10]}, other bytes {differ[:10]}"
    )


def run_plan(plan: Plan, servers: Servers, workdir: Path) -> Tally:
    """Run one plan; raises ChaosFailure (with its seed and steps) when the property does not hold."""
    return Runner(plan, servers, workdir).run()


@contextlib.contextmanager
def local_servers(base: Path, *, kafka: bool = False) -> Iterator[Servers]:
    """A source and a target server (and a broker) of the harness's own, stopped at the end."""
    source, target = LocalServer(base / "source"), LocalServer(base / "target")
    broker = KafkaBroker(base / "kafka") if kafka else None
    started: list[Any] = []
    try:
        for process in (source, target, broker):
            if process is not None:
                process.start()
                started.append(process)
        yield Servers(source, target, broker)
    finally:
        for process in started:
            with contextlib.suppress(Exception):
                process.stop()
