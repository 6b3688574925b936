"""mcdc tail against real servers: convergence under a workload, kill -9, SIGTERM, source restart,
target outage, metrics and status."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pymongo
import pytest

from tests.support.compare import assert_identical
from tests.support.servers import ServerPair, free_port
from tests.support.workload import random_workload

pytestmark = pytest.mark.integration


def _tail(source: str, target: str, cp: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    args = [sys.executable, "-m", "replicator.cli", "tail", "-s", source, "-t", target, "-c", str(cp)]
    args += ["--no-progress", "--retry-initial-delay", "0.2", "--retry-max-delay", "1", *extra]
    # the log goes to a file, not a pipe: nobody reads a pipe while the test runs, and a tail that logged a
    # long outage's retries filled it (64 KiB), then stalled on its next log line (beside two burners)
    log = cp.with_name(f"tail-{next(_NUMBERS)}.log")
    with open(log, "w") as err:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=err, text=True, env={**os.environ, **(env or {})})
    _STARTED.append(proc)
    _LOGS[proc] = log
    return proc


_STARTED: list[subprocess.Popen[str]] = []
_LOGS: dict[subprocess.Popen[str], Path] = {}
_NUMBERS = itertools.count()


def _log(proc: subprocess.Popen[str]) -> str:
    """What ``proc`` logged so far, when a :func:`_tail` (others log where their test says)."""
    return _LOGS[proc].read_text() if proc in _LOGS else ""


def _wait(condition: Callable[[], bool], timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except (AssertionError, pymongo.errors.PyMongoError) as exc:
            last = exc
        time.sleep(0.2)
    running = [proc for proc in _STARTED if proc in _LOGS and proc.poll() is None]
    for proc in running:  # each prints what its tasks wait on (a run that seems stuck)
        proc.send_signal(signal.SIGUSR1)
    dumped = time.monotonic() + 10
    while time.monotonic() < dumped and not all(" tasks\n" in _log(proc) for proc in running):
        time.sleep(0.2)
    logs = "".join(f"\n--- the log of {proc.args[3]} (pid {proc.pid}):\n{_log(proc)[-20000:]}" for proc in running)
    raise AssertionError(f"timed out waiting for {what}: {last}{logs}")


def _converged(source: str, target: str) -> Callable[[], bool]:
    def check() -> bool:
        assert_identical(source, target)
        return True

    return check


def _stop(proc: subprocess.Popen[str], sig: int = signal.SIGTERM, timeout: float = 30) -> tuple[int, str, str]:
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out, _log(proc)


def test_sigterm_exits_0_and_resumes_without_gaps(source_uri: str, target_uri: str, tmp_path: Path) -> None:
    cp = tmp_path / "cp.json"
    proc = _tail(source_uri, target_uri, cp, "--snapshot", "never")
    _wait(cp.exists, what="the first checkpoint")
    with pymongo.MongoClient(source_uri) as client:
        client.db.c.insert_many([{"_id": i} for i in range(100)])
    _wait(_converged(source_uri, target_uri), what="the first inserts")
    proc.send_signal(signal.SIGUSR1)  # what a run that seems stuck waits on: its tasks' stacks, and it goes on
    _wait(lambda: " tasks\n" in _log(proc), what="the tasks dumped on SIGUSR1")
    _wait(lambda: "replicator/source/changestream.py" in _log(proc), what="the reader's stack")
    assert proc.poll() is None
    code, out, err = _stop(proc)
    assert code == 0, err
    assert "tail finished" in out
    saved = json.loads(cp.read_text())
    assert saved["position"]["resume_token"] is not None
    with pymongo.MongoClient(source_uri) as client:  # written while no tail runs
        client.db.c.delete_many({"_id": {"$lt": 50}})
        client.db.c.insert_one({"_id": "gap"})
    proc = _tail(source_uri, target_uri, cp)
    _wait(_converged(source_uri, target_uri), what="the writes made while stopped")
    assert _stop(proc)[0] == 0


def test_converges_under_a_workload_with_kill_9(source_uri: str, target_uri: str, tmp_path: Path) -> None:
    cp = tmp_path / "cp.json"
    with pymongo.MongoClient(source_uri) as client:
        client.work.a.insert_many([{"_id": i, "v": 0} for i in range(100)])
    proc = _tail(source_uri, target_uri, cp)  # --snapshot initial: copies work.a first
    for seed in range(4):
        random_workload(source_uri, 150, seed)
        time.sleep(random.Random(seed).uniform(0.1, 0.8))
        proc.kill()  # kill -9 mid-stream
        proc.wait()
        _abort_abandoned_transactions(target_uri)
        proc = _tail(source_uri, target_uri, cp)
    random_workload(source_uri, 100, 99)
    _wait(_converged(source_uri, target_uri), timeout=120, what="convergence after kill -9")
    assert _stop(proc)[0] == 0


def _abort_abandoned_transactions(uri: str) -> None:
    """What the server does to a killed client's open transaction once it is idle past
    transactionLifetimeLimitSeconds (60 s), at once: a kill -9 while mcdc applies a source transaction
    leaves it open on the target, holding its documents, and the next mcdc's writes to them wait for
    it (on SecantusDB, with no background reaper, until some transaction statement comes after 60 s),
    longer than the convergence wait. Only the killed mcdc has sessions on the target here."""
    with pymongo.MongoClient(uri) as client:
        client.admin.command("killAllSessions", [])


def test_source_restart_and_target_outage(
    servers: ServerPair, source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    if servers.source is None or servers.target is None:
        pytest.skip("external servers cannot be restarted by the tests")
    cp = tmp_path / "cp.json"
    port = free_port()
    fast_fail = {"MCDC_CONNECT_TIMEOUT": "1"}  # an outage longer than this surfaces as an error to retry
    args = ("--snapshot", "never", "--metrics-port", str(port), "--max-retries", "-1")
    proc = _tail(source_uri, target_uri, cp, *args, env=fast_fail)
    _wait(cp.exists, what="the first checkpoint")
    random_workload(source_uri, 50, 1)
    _wait(_converged(source_uri, target_uri), what="first convergence")

    servers.source.restart()  # the source goes away and comes back
    random_workload(source_uri, 50, 2)
    _wait(_converged(source_uri, target_uri), timeout=90, what="convergence after a source restart")

    servers.target.stop()  # the target goes away for a while; the source keeps taking writes
    random_workload(source_uri, 50, 3)
    _wait(lambda: _retries(port).get("sink", 0) >= 1, timeout=30, what="a retry of the sink")
    assert _http(port, "/health")[0] in (200, 503)
    servers.target.start()
    _wait(_converged(source_uri, target_uri), timeout=90, what="convergence after a target outage")

    status, body = _http(port, "/metrics")
    assert status == 200
    assert "mcdc_lag_seconds" in body  # labels come in any order (prometheus_client sorts them by name)
    assert any(line.startswith("mcdc_events_total{") and 'op="u"' in line for line in body.splitlines())
    _wait(lambda: _http(port, "/health")[0] == 200, timeout=30, what="healthy again")
    code, _, err = _stop(proc)
    assert code == 0, err
    assert "retrying in" in err  # the outage was logged, once per attempt


def test_an_idle_tail_stays_quiet_and_its_lag_grows_while_the_source_is_down(
    servers: ServerPair, source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    """Lag is how far the target is behind the source's writes: while the source cannot be read, it grows
    with the outage (it read 0.0 s through a 25 s outage). And an idle tail logs no line every 5 s."""
    if servers.source is None:
        pytest.skip("external servers cannot be stopped by the tests")
    cp = tmp_path / "cp.json"
    port = free_port()
    args = ("--snapshot", "never", "--metrics-port", str(port), "--max-retries", "-1")
    proc = _tail(source_uri, target_uri, cp, *args, env={"MCDC_CONNECT_TIMEOUT": "1"})
    _wait(cp.exists, what="the first checkpoint")
    time.sleep(11)  # idle
    assert _lag(port) < 5  # caught up, and confirmed so by each empty poll
    servers.source.stop()
    try:
        time.sleep(12)
        assert _lag(port) > 10
        status, body = _http(port, "/health")
        detail = json.loads(body)
        assert detail["state"] == "retrying" and detail["lag_seconds"] > 10, detail
        assert status == 200  # under the 60 s of retries that make it unhealthy
    finally:
        servers.source.start()
    with pymongo.MongoClient(source_uri) as client:
        client.db.c.insert_one({"_id": 1})
    _wait(_converged(source_uri, target_uri), timeout=90, what="convergence after the outage")
    _wait(lambda: _lag(port) < 5, timeout=30, what="the lag back down")
    code, _, err = _stop(proc)
    assert code == 0, err
    assert "replay: 0 events applied" not in err  # idle lines come every 5 minutes, not every 5 s
    assert "waits up to 1s for an answer" in err  # the retry line says when the attempt really ends


def _lag(port: int) -> float:
    line = next(x for x in _http(port, "/metrics")[1].splitlines() if x.startswith("mcdc_lag_seconds "))
    return float(line.split()[1])


def _retries(port: int) -> dict[str, float]:
    out = {}
    for line in _http(port, "/metrics")[1].splitlines():
        if line.startswith("mcdc_retries_total{"):
            what = line.split('what="', 1)[1].split('"', 1)[0]
            out[what] = float(line.rsplit(" ", 1)[1])
    return out


def _http(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_status_reports_position_and_lag(source_uri: str, target_uri: str, tmp_path: Path) -> None:
    cp = tmp_path / "cp.json"
    proc = _tail(source_uri, target_uri, cp, "--snapshot", "never")
    _wait(cp.exists, what="the first checkpoint")
    with pymongo.MongoClient(source_uri) as client:
        client.db.c.insert_one({"_id": 1})
    _wait(_converged(source_uri, target_uri))
    assert _stop(proc)[0] == 0
    out = subprocess.run(
        [sys.executable, "-m", "replicator.cli", "status", "-c", str(cp), "-s", source_uri, "--json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["lag_s"] is not None and data["lag_s"] < 60 and data["lag_measured_against"] == "last save"
    assert data["position"]["has_resume_token"] and data["snapshot"]["status"] == "none"
    ts = data["position"]["cluster_time"]  # as the sync summary writes it: no Python repr
    assert set(ts) == {"t", "i"} and all(isinstance(v, int) for v in ts.values()) and "Timestamp(" not in out.stdout
    human = subprocess.run(
        [sys.executable, "-m", "replicator.cli", "status", "-c", str(cp)], capture_output=True, text=True, timeout=60
    )
    assert human.returncode == 0 and "lag" in human.stdout
    assert f"({ts['t']},{ts['i']})" in human.stdout and "Timestamp(" not in human.stdout


def test_a_tail_stopped_before_its_source_ever_answered_is_not_a_finished_run(target_uri: str, tmp_path: Path) -> None:
    from tests.support.servers import free_port

    log = tmp_path / "tail.log"
    argv = [
        sys.executable,
        "-m",
        "replicator.cli",
        "tail",
        "-s",
        f"mongodb://127.0.0.1:{free_port()}/?directConnection=true",
    ]
    with open(log, "w") as err:
        proc = subprocess.Popen(
            [*argv, "-t", target_uri, "-c", str(tmp_path / "cp.json"), "--no-progress", "--connect-timeout", "1"],
            stdout=subprocess.PIPE, stderr=err, text=True,
        )  # fmt: skip
    _STARTED.append(proc)
    _wait(lambda: "waiting for the source" in log.read_text(), what="the tail to wait for its source")
    code, out, _ = _stop(proc)
    assert code == 75, (code, out, log.read_text())
    assert "tail finished" not in out and "waiting for the source, which never answered: nothing was replicated" in out
    assert not (tmp_path / "cp.json").exists()


def _status(cp: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "replicator.cli", "status", "-c", str(cp), *extra],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_status_of_a_tail_that_stopped_caught_up_keeps_its_lag_and_says_its_state(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    """A stopped run is not falling behind by the clock: status reports the lag at its last save (0, caught
    up) and when that was, the state (running or not) in text as in JSON, and canCommit as /progress does."""
    cp = tmp_path / "cp.json"
    with pymongo.MongoClient(source_uri) as client:
        client.db.c.insert_one({"_id": 0})
    proc = _tail(source_uri, target_uri, cp)
    _wait(lambda: cp.exists() and json.loads(cp.read_text())["snapshot"]["status"] == "done", what="the snapshot")
    with pymongo.MongoClient(source_uri) as client:
        client.db.c.insert_one({"_id": 1})
    _wait(_converged(source_uri, target_uri))
    live = json.loads(_status(cp, "--json", "-s", source_uri).stdout)
    assert live["running"] and live["progress"]["state"] == "REPLAYING"
    _wait(lambda: json.loads(cp.read_text()).get("lag_s") == 0, what="a save once caught up")
    assert _stop(proc)[0] == 0
    first = json.loads(_status(cp, "--json", "-s", source_uri).stdout)
    _wait(lambda: json.loads(_status(cp, "--json").stdout)["age_s"] > first["age_s"] + 2, what="the clock to move")
    later = json.loads(_status(cp, "--json", "-s", source_uri).stdout)
    for data in (first, later):
        assert data["lag_s"] == 0 and data["lag_measured_against"] == "last save" and not data["running"]
        progress = data["progress"]
        assert progress["state"] == "STOPPED" and progress["lagTimeSeconds"] == 0 and progress["canCommit"]
    text = _status(cp).stdout
    assert "STOPPED: no mcdc is running on this checkpoint (canCommit: yes)" in text, text
    assert "0.0 s (caught up) at its last save" in text, text


@pytest.fixture(autouse=True)
def _no_stray_processes() -> Iterator[None]:
    yield
    while _STARTED:  # a failed test must not leave a tail running
        proc = _STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_events_over_16mb_arrive_whole(source_uri: str, target_uri: str) -> None:
    """A ~22 MB update event (15.5 MB document + 7 MB update description) comes in fragments
    ($changeStreamSplitLargeEvent) and is applied as one event; with --oversize skip and no splitting it
    is skipped and logged, and the stream goes on."""
    from replicator.events import Op, Position
    from replicator.source.changestream import ChangeStreamReader
    from replicator.source.connection import make_client

    with pymongo.MongoClient(source_uri) as client:
        client.big.c.insert_one({"_id": 1, "a": "x" * int(8.5 * 1024 * 1024)})
    source = make_client(source_uri)
    try:
        split = ChangeStreamReader(source, full_document="updateLookup", batch_size=10, max_await_ms=100)
        trimmed = ChangeStreamReader(
            source, full_document="updateLookup", batch_size=10, max_await_ms=100, oversize="skip"
        )
        trimmed._plan.mode = "trim"  # as after a server without $changeStreamSplitLargeEvent refused the stage
        start = await split.position_now()
        await split.close()
        with pymongo.MongoClient(source_uri) as client:
            client.big.c.update_one({"_id": 1}, {"$set": {"b": "y" * (7 * 1024 * 1024)}})
            client.big.c.insert_one({"_id": 2})
        got = {}
        for name, reader in (("split", split), ("trimmed", trimmed)):
            await reader.open(start)
            events = []
            async for batch in reader.batches():
                events.extend(batch.events)
                if len(events) >= (2 if name == "split" else 1):
                    break
            await reader.close()
            got[name] = events
        update = got["split"][0]
        assert update.op is Op.UPDATE and update.document is not None and len(update.document["b"]) == 7 * 1024 * 1024
        assert update.update is not None and "b" in update.update.updated_fields
        assert isinstance(update.position, Position) and update.position.resume_token is not None
        assert [e.document_key["_id"] for e in got["trimmed"]] == [2]  # the oversize update was skipped
    finally:
        await source.close()


async def test_warns_when_the_checkpoint_nears_the_end_of_the_oplog(
    own_source: str, target_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The oplog's ends are faked; the stream itself reads from 10 and 110 minutes ago, which on the
    session's source is every earlier test's writes: on a source of its own (0.5 s, not 30 s in the suite)."""
    from bson.timestamp import Timestamp

    import replicator.replay.streaming as streaming
    from replicator.checkpoint.store import Checkpoint, CheckpointStore
    from replicator.events import Position
    from replicator.observe.progress import LogReporter
    from replicator.replay.stage import ReplayStage
    from replicator.settings.resolve import resolve
    from replicator.settings.selection import Renamer, Selection, make_transform
    from replicator.sinks.memory import MemorySink
    from replicator.source.changestream import ChangeStreamReader, oplog_window
    from replicator.source.connection import make_client

    class Warnings(LogReporter):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[str] = []

        def warn(self, message: str) -> None:
            self.seen.append(message)

    source = make_client(own_source)
    try:
        with pymongo.MongoClient(own_source) as client:
            client.db.c.insert_one({"_id": 1})
        real = await oplog_window(source)  # the source's oplog is readable
        assert real is not None and real[0] <= real[1]
        now = int(time.time())

        calls: dict[int, int] = {}

        async def two_hour_oplog(client: object) -> tuple[Timestamp, Timestamp]:
            calls[age_s] = calls.get(age_s, 0) + 1
            return Timestamp(now - 7200, 1), Timestamp(now, 1)

        monkeypatch.setattr(streaming, "oplog_window", two_hour_oplog)

        # the stream's own check of a start from a time (history lost before the oplog's oldest entry) sees the
        # same two hours: this server's oplog began when the test did
        async def the_same_two_hours(client: object) -> tuple[Timestamp, Timestamp]:
            return Timestamp(now - 7200, 1), Timestamp(now, 1)

        monkeypatch.setattr("replicator.source.changestream.oplog_window", the_same_two_hours)
        settings = resolve({"source": own_source, "target": target_uri}, env={})
        seen = {}
        for age_s in (20, 600, 6600):  # 8% and 92% of the window; 20 s is too recent to read the oplog for
            reporter = Warnings()
            cp = Checkpoint("rs:test", position=Position(cluster_time=Timestamp(now - age_s, 1)))
            reader = ChangeStreamReader(source, full_document="updateLookup", batch_size=100, max_await_ms=100)
            applier = streaming.StreamApplier(reader, CheckpointStore(tmp_path / "cp.json"), cp,
                                              settings=settings, reporter=reporter)  # fmt: skip
            await applier.run(ReplayStage(MemorySink(), make_transform(Selection(), Renamer())), to_now=True)
            seen[age_s] = [w for w in reporter.seen if "falls off" in w]
        assert not seen[20] and 20 not in calls and calls[600] >= 1
        assert not seen[600]
        assert seen[6600] and "1h50m behind" in seen[6600][0] and "holds 2h00m" in seen[6600][0]
    finally:
        await source.close()


async def test_the_reader_fetches_the_next_reply_while_a_batch_is_applied(source_uri: str) -> None:
    """Read-ahead: while the consumer holds a batch, the next server reply is already fetched. No batch
    acknowledges a position past its own events, so a run that ends at ``until`` with events read past
    it, opened again at its last position, goes on with nothing lost and nothing twice."""
    from replicator.source.changestream import ChangeStreamReader, current_time
    from replicator.source.connection import make_client

    source = make_client(source_uri)
    reader = ChangeStreamReader(source, full_document="updateLookup", batch_size=10, max_await_ms=100)
    try:
        start = await reader.position_now()
        await reader.close()
        with pymongo.MongoClient(source_uri) as client:
            client.db.c.insert_many([{"_id": i} for i in range(40)])
            await asyncio.sleep(0)
        middle = await current_time(source)
        with pymongo.MongoClient(source_uri) as client:
            client.db.c.insert_many([{"_id": i} for i in range(40, 60)])
        await reader.open(start)
        first: list[int] = []
        read_ahead, last = 0, start
        async for batch in reader.batches(until=middle):
            if not first:
                await asyncio.sleep(0.5)  # "applying" the first batch: the reader goes on meanwhile
                read_ahead = len(reader._reader or ())
            first.extend(e.key["_id"] for e in batch.events)
            if batch.events:
                assert batch.position == batch.events[-1].position  # never past its own events
                last = batch.position
        assert first == list(range(40)) and read_ahead >= 1
        await reader.close()
        await reader.open(last)
        rest: list[int] = []
        async for batch in reader.batches():
            rest.extend(e.key["_id"] for e in batch.events)
            if len(rest) >= 20:
                break
        assert rest == list(range(40, 60))
    finally:
        await reader.close()
        await source.close()


def test_a_live_tail_follows_log_rotation(source_uri: str, target_uri: str, tmp_path: Path) -> None:
    """rename log -> log_N, a new log with the same _ids, again and again, under a live tail: an update of
    the old log read after the rename carries the new log's document (updateLookup reads by name), which
    must not travel into the archive. The tail lags behind the rotations (held with SIGSTOP while they
    happen, as a busy tail lags), so it reads the updates after the renames."""
    cp = tmp_path / "cp.json"
    with pymongo.MongoClient(source_uri) as client:
        client.churn.log.insert_many([{"_id": i, "v": 0} for i in range(3)])
        proc = _tail(source_uri, target_uri, cp)
        _wait(_converged(source_uri, target_uri), what="the first copy")
        _wait(lambda: json.loads(cp.read_text())["snapshot"]["status"] == "done", what="the snapshot's end")
        # a write acknowledged by the live replay: the stream opened before it, so the DDL from here on is
        # past the replay's window and replayed as it comes (however long a loaded machine took to get here)
        client.churn.marker.insert_one({"_id": "live"})
        _wait(_converged(source_uri, target_uri), what="the live replay")
        proc.send_signal(signal.SIGSTOP)
        for gen in range(1, 13):
            client.churn.log.update_one({"_id": 0}, {"$inc": {"touch": 1}})
            client.churn.log.rename(f"log_{gen}")
            client.churn.log.insert_many([{"_id": i, "gen": gen} for i in range(3)])
            client.churn.log.update_one({"_id": 1}, {"$set": {"v": gen}})
            if gen == 6:
                proc.send_signal(signal.SIGCONT)
                time.sleep(1)
                proc.send_signal(signal.SIGSTOP)
        proc.send_signal(signal.SIGCONT)
    _wait(_converged(source_uri, target_uri), what="convergence after the rotations")
    assert _stop(proc)[0] == 0


def test_a_resumed_tail_with_nothing_to_replay_says_so_at_once(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    """A tail resumed from its checkpoint on a quiet source logs where it goes on from before any change
    comes (it said nothing until the first event: a user, or a supervisor waiting for a first line, saw a
    silent process). The chaos harness's soak seed 4400 (tail, kafka) waited on such a tail for 120 s."""
    cp = tmp_path / "cp.json"
    with pymongo.MongoClient(source_uri) as client:
        client.quiet.c.insert_one({"_id": 1})
    first = subprocess.run(
        [sys.executable, "-m", "replicator.cli", "catch-up", "-s", source_uri, "-t", target_uri, "-c", str(cp),
         "--include", r"quiet\..*", "--no-progress"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert first.returncode == 0, first.stderr
    log = tmp_path / "tail.log"
    with log.open("w") as err:
        args = [sys.executable, "-m", "replicator.cli", "tail", "-s", source_uri, "-t", target_uri, "-c", str(cp)]
        proc = subprocess.Popen([*args, "--include", r"quiet\..*", "--no-progress"], stderr=err, text=True)
        _STARTED.append(proc)
        try:
            _wait(lambda: "replaying changes from the checkpoint" in log.read_text(), what="the resume line")
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0, log.read_text()
    said = log.read_text()
    assert str(cp) in said and "events applied" in said, said
