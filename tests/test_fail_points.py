"""What mcdc does with each error a MongoDB server answers, against the test server's ``failCommand`` fail
point (tests/support/failpoint.py), as MongoDB's drivers are tested: issue 40's list of faults on the
target's writes (documents, a replayed transaction's commit, DDL) and on the source's reads (the change
stream's aggregate and getMore, the snapshot's listCollections, find and getMore).

The outcome of each kind is decided (docs/reference/exit-codes.md, "Errors the servers answer"):

* a retryable error is retried, one warning line per retry and no traceback, counted in
  ``mcdc_retries_total`` (``what="sink"`` for the target's, the phase for the source's), and the target
  converges (``mcdc verify`` exits 0);
* a write concern error never moves the checkpoint past the events whose writes got it;
* a non-retryable one ends the run in one line with its exit code (2: a refusal, naming the side; 75: the
  retries ran out), the checkpoint where it was.

The fail points are armed for mcdc's clients only (``appName``), so the test's own clients write and compare
freely. The URIs mcdc gets poll the server every 0.5 s: a fail point answers ``NotWritablePrimary`` without
the server changing state, so the driver's streamed ``hello`` only comes back at the next heartbeat (10 s by
default), where a real election answers at once.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pymongo
import pytest
from bson.timestamp import Timestamp

from tests.support import failpoint
from tests.support.failpoint import Fault
from tests.support.servers import free_port

pytestmark = pytest.mark.integration

#: the driver checks the server every 0.5 s (see the module's docstring)
FAST_MONITOR = "&heartbeatFrequencyMS=500"
RETRY = ("--retry-initial-delay", "0.05", "--retry-max-delay", "0.2")
DB = "fp"
#: what a target's document writes go through
DOCUMENT_WRITES = ("insert", "update", "delete")
#: what mcdc sends to replay the source's DDL here (create, createIndexes, renameCollection, drop)
DDL_WRITES = ("create", "drop", "renameCollection", "createIndexes")


@pytest.fixture
def uris(source_uri: str, target_uri: str) -> Iterator[tuple[str, str]]:
    """The source's and target's URIs for mcdc; any fail point is turned off at the end, whatever happened,
    and a transaction a failed test left open is aborted (the next test's cleanup would wait for it)."""
    yield source_uri + FAST_MONITOR, target_uri + FAST_MONITOR
    for uri in (source_uri, target_uri):
        failpoint.disarm(uri)
        with pymongo.MongoClient(uri) as client:
            client.admin.command("killAllSessions", [])


class Mcdc:
    """One ``mcdc COMMAND`` run in a process of its own, with its metrics served on a port of its own."""

    def __init__(self, command: str, source: str, target: str, cp: Path, *extra: str, env: dict[str, str]) -> None:
        self.port = free_port()
        args = [sys.executable, "-m", "replicator.cli", command, "-s", source, "-t", target, "-c", str(cp)]
        args += ["--no-progress", "--json", *RETRY, "--metrics-port", str(self.port), *extra]
        self.proc = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **env}
        )
        self.out = self.err = ""

    def retries(self) -> dict[str, float]:
        """``mcdc_retries_total`` by ``what``, as scraped now ({} while the port does not answer)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as response:
                body = response.read().decode()
        except OSError:
            return {}
        found = re.findall(r'^mcdc_retries_total\{what="(\w+)"\} (\S+)$', body, re.MULTILINE)
        return {what: float(n) for what, n in found}

    def wait_for(self, condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return
            if self.proc.poll() is not None:
                self.finish()
                raise AssertionError(f"mcdc ended (exit {self.proc.returncode}) before {what}:\n{self.err}")
            time.sleep(0.05)
        self.proc.kill()
        self.finish()
        raise AssertionError(f"timed out waiting for {what}:\n{self.err}")

    def finish(self, timeout: float = 90) -> int:
        """Wait for the run's end; its exit code (stdout and stderr in ``out``/``err``)."""
        try:
            self.out, self.err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.out, self.err = self.proc.communicate()
            raise AssertionError(f"mcdc did not end within {timeout} s:\n{self.err}") from None
        return self.proc.returncode

    def summary(self) -> dict[str, Any]:
        summary: dict[str, Any] = json.loads(self.out)
        return summary


@pytest.fixture
def mcdc() -> Iterator[Callable[..., Mcdc]]:
    """Starts ``mcdc COMMAND SOURCE TARGET CHECKPOINT ...``; a run the test left behind is killed."""
    started: list[Mcdc] = []

    def start(command: str, source: str, target: str, cp: Path, *extra: str, env: dict[str, str] | None = None) -> Mcdc:
        started.append(Mcdc(command, source, target, cp, *extra, env=env or {}))
        return started[-1]

    yield start
    for run in started:
        if run.proc.poll() is None:
            run.proc.kill()
            run.proc.communicate()


def _verify(source: str, target: str) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, "-m", "replicator.cli", "verify", "-s", source, "-t", target, "--include", rf"{DB}\..*"]
    return subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)


def _assert_converged(source: str, target: str) -> None:
    result = _verify(source, target)
    assert result.returncode == 0, result.stdout + result.stderr


def _retry_lines(run: Mcdc) -> list[str]:
    return [line for line in run.err.splitlines() if "retrying in" in line]


def _assert_retried(run: Mcdc, *, at_start: bool = False) -> None:
    """Retried: one warning line per retry, no traceback; each counted in the run's summary too. ``at_start``:
    a server waited for at the run's start is said once ("waiting for the source"), its retries at debug
    level."""
    assert "Traceback" not in run.err, run.err
    if at_start:
        assert "waiting for the source" in run.err and run.summary()["retries"] >= 1, run.err
        assert "full error" not in run.err, run.err  # the server's message, not its whole reply
        return
    lines = _retry_lines(run)
    assert lines and all(" WARNING " in line for line in lines), run.err
    assert run.summary()["retries"] == len(lines), run.err


def _counted(run: Mcdc) -> Callable[[], bool]:
    return lambda: sum(run.retries().values()) >= 1


def _load(source: str, n: int = 20) -> None:
    with pymongo.MongoClient(source) as client:
        for name in ("a", "b"):  # created first: the test server's implicit create can deadlock a listing
            client[DB].create_collection(name)
            client[DB][name].insert_many([{"_id": i, "v": 0} for i in range(n)])


def _changes(source: str) -> Timestamp:
    """Changes to both collections (documents only); the cluster time of the first."""
    with pymongo.MongoClient(source) as client, client.start_session() as session:
        db = client[DB]
        db.a.insert_many([{"_id": 100 + i, "v": 1} for i in range(5)], session=session)
        first = session.operation_time
        db.b.insert_many([{"_id": 100 + i, "v": 1} for i in range(5)], session=session)
        db.a.update_many({"_id": {"$lt": 5}}, {"$set": {"v": 2}}, session=session)
        db.b.delete_many({"_id": {"$gte": 15, "$lt": 20}}, session=session)
        assert first is not None
        return first


def _transaction(source: str) -> None:
    with pymongo.MongoClient(source) as client, client.start_session() as session, session.start_transaction():
        db = client[DB]
        db.a.insert_many([{"_id": 200 + i} for i in range(3)], session=session)
        db.b.update_many({"_id": {"$lt": 3}}, {"$set": {"t": 1}}, session=session)
        db.a.delete_one({"_id": 19}, session=session)


def _ddl(source: str) -> None:
    with pymongo.MongoClient(source) as client:
        db = client[DB]
        db.a.create_index("v")
        db.create_collection("c")
        db.c.insert_one({"_id": 1})
        db.c.rename("d")
        db.b.drop()


def _synced(source: str, target: str, cp: Path) -> None:
    """A first sync with no fault: the target holds the source, the checkpoint its position."""
    args = [sys.executable, "-m", "replicator.cli", "sync", "-s", source, "-t", target, "-c", str(cp)]
    result = subprocess.run([*args, "--no-progress"], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr


def _position(cp: Path) -> Timestamp:
    saved = json.loads(cp.read_text())["position"]["cluster_time"]
    return Timestamp(saved["t"], saved["i"])


def _fault_id(fault: Fault) -> str:
    return fault.name.replace(" ", "-")


# --- the target's writes ---


#: One of each way a fault strikes: an error answered, a connection closed, a write concern error, a wait. Error
#: codes, once answered, all take one path (replicator/source/retry.py classifies them; tests/test_retry.py
#: checks each fault's code): every fault strikes the documents' writes, one of each way the other writes.
WAYS = (failpoint.error(failpoint.PRIMARY_STEPPED_DOWN), failpoint.close_connection(),
        failpoint.write_concern_error(failpoint.WRITE_CONCERN_TIMEOUT), failpoint.block(1500))  # fmt: skip
WRITES = [*(("documents", fault) for fault in failpoint.WRITE_FAULTS),
          *((writes, fault) for writes in ("commitTransaction", "ddl") for fault in WAYS)]  # fmt: skip


@pytest.mark.parametrize(("writes", "fault"), WRITES, ids=[f"{w}-{_fault_id(f)}" for w, f in WRITES])
def test_a_retryable_error_of_the_targets_writes_is_retried_counted_and_converges(
    uris: tuple[str, str], mcdc: Callable[..., Mcdc], tmp_path: Path, fault: Fault, writes: str
) -> None:
    source, target = uris
    cp = tmp_path / "cp.json"
    _load(source)
    _synced(source, target, cp)
    commands: tuple[str, ...]
    if writes == "documents":
        _changes(source)
        commands = DOCUMENT_WRITES
    elif writes == "commitTransaction":
        _transaction(source)
        commands = ("commitTransaction",)
    else:
        _ddl(source)
        commands = DDL_WRITES
    waited = "block" in fault.name and writes == "ddl"  # DDL is not bounded by --io-timeout: it waits
    failpoint.arm(target, fault, commands, times=1 if waited else None)
    # a write blocked past --io-timeout counts as lost: retried
    run = mcdc("catch-up", source, target, cp, "--io-timeout", "1")
    if waited:
        assert run.finish() == 0, run.err
        failpoint.disarm(target)
        assert not _retry_lines(run) and "Traceback" not in run.err, run.err
    else:
        run.wait_for(_counted(run), "a retry of the target's writes, counted")
        assert set(run.retries()) == {"sink"}
        failpoint.disarm(target)
        assert run.finish() == 0, run.err
        _assert_retried(run)
    _assert_converged(source, target)


@pytest.mark.parametrize("code", [failpoint.NOT_WRITABLE_PRIMARY, failpoint.PRIMARY_STEPPED_DOWN])
def test_a_stepdown_in_the_middle_of_a_batch_writes_the_batch_again(
    uris: tuple[str, str], mcdc: Callable[..., Mcdc], tmp_path: Path, code: int
) -> None:
    """The batch spans two collections: the first insert command succeeds, a later one fails once; the whole
    batch is written again (idempotently) and converges."""
    source, target = uris
    cp = tmp_path / "cp.json"
    _load(source)
    _synced(source, target, cp)
    _changes(source)
    with pymongo.MongoClient(target) as client:  # skip: the first matching command goes through
        data = failpoint.error(code).on(DOCUMENT_WRITES) | {"appName": failpoint.MCDC_APP}
        client.admin.command("configureFailPoint", "failCommand", mode={"skip": 1, "times": 1}, data=data)
    run = mcdc("catch-up", source, target, cp)
    assert run.finish() == 0, run.err
    _assert_retried(run)
    assert len(_retry_lines(run)) == 1, run.err
    _assert_converged(source, target)


def test_a_write_concern_error_never_moves_the_checkpoint(
    uris: tuple[str, str], mcdc: Callable[..., Mcdc], tmp_path: Path
) -> None:
    source, target = uris
    cp = tmp_path / "cp.json"
    _load(source)
    _synced(source, target, cp)
    first = _changes(source)
    before = _position(cp)
    failpoint.arm(target, failpoint.write_concern_error(failpoint.WRITE_CONCERN_TIMEOUT), DOCUMENT_WRITES)
    run = mcdc("catch-up", source, target, cp, "--max-retries", "-1")
    positions: set[Timestamp] = set()

    def retried_a_few_times() -> bool:
        positions.add(_position(cp))
        return run.retries().get("sink", 0) >= 5

    run.wait_for(retried_a_few_times, "five retries of writes whose write concern failed")
    positions.add(_position(cp))
    assert all(p < first for p in positions), (positions, first)  # never past the writes that got the error
    assert _position(cp) == before
    failpoint.disarm(target)
    assert run.finish() == 0, run.err
    _assert_retried(run)
    assert _position(cp) >= first
    _assert_converged(source, target)


@pytest.mark.parametrize("code", [100, 79])  # UnsatisfiableWriteConcern, UnknownReplWriteConcern
def test_a_write_concern_error_no_wait_can_fix_ends_the_run_in_one_line(
    uris: tuple[str, str], mcdc: Callable[..., Mcdc], tmp_path: Path, code: int
) -> None:
    source, target = uris
    cp = tmp_path / "cp.json"
    _load(source)
    _synced(source, target, cp)
    _changes(source)
    before = _position(cp)
    failpoint.arm(target, failpoint.write_concern_error(code), DOCUMENT_WRITES)
    run = mcdc("catch-up", source, target, cp)
    assert run.finish() == 2, run.err
    _assert_one_line(run, "target", "write concern")
    assert not _retry_lines(run)
    assert _position(cp) == before


# --- errors that end the run ---


def _assert_one_line(run: Mcdc, *words: str) -> str:
    """The run ended with one ``mcdc: error:`` line holding ``words``, no traceback, no credentials."""
    assert "Traceback" not in run.err, run.err
    errors = [line for line in run.err.splitlines() if line.startswith("mcdc: error:")]
    assert len(errors) == 1, run.err
    for word in words:
        assert word in errors[0], errors[0]
    return errors[0]


@pytest.mark.parametrize("code", [13, 2])  # Unauthorized, BadValue
def test_a_write_the_target_refuses_ends_the_run_in_one_line_naming_the_target(
    uris: tuple[str, str], mcdc: Callable[..., Mcdc], tmp_path: Path, code: int
) -> None:
    source, target = uris
    cp = tmp_path / "cp.json"
    _load(source)
    _synced(source, target, cp)
    _changes(source)
    before = _position(cp)
    failpoint.arm(target, failpoint.error(code), DOCUMENT_WRITES)
    run = mcdc("catch-up", source, target, cp)
    assert run.finish() == 2, run.err
    line = _assert_one_line(run, "target: ")
    assert not _retry_lines(run), run.err
    assert re.search(r"(insert|update|delete) on fp", line), line  # what was refused
    assert "grant readWrite" in line if code == 13 else "run again" in line, line  # and the fix
    assert _position(cp) == before


@pytest.mark.parametrize("code", [13, 2])
@pytest.mark.parametrize("command", ["aggregate", "find"])
def test_a_read_the_source_refuses_ends_the_run_in_one_line_naming_the_source(
    uris: tuple[str, str], mcdc: Callable[..., Mcdc], tmp_path: Path, command: str, code: int
) -> None:
    source, target = uris
    cp = tmp_path / "cp.json"
    _load(source)
    if command == "aggregate":  # the change stream's open
        _synced(source, target, cp)
        _changes(source)
    failpoint.arm(source, failpoint.error(code), [command])
    run = mcdc("catch-up" if command == "aggregate" else "sync", source, target, cp)
    assert run.finish() == 2, run.err
    line = _assert_one_line(run, "source: ")
    assert f"{command} on" in line or (code == 13 and "change stream" in line), line
    assert not _retry_lines(run), run.err


def test_retries_that_run_out_end_the_run_in_one_line_with_exit_75(
    uris: tuple[str, str], mcdc: Callable[..., Mcdc], tmp_path: Path
) -> None:
    source, target = uris
    cp = tmp_path / "cp.json"
    _load(source)
    _synced(source, target, cp)
    _changes(source)
    before = _position(cp)
    failpoint.arm(target, failpoint.error(failpoint.NOT_WRITABLE_PRIMARY), DOCUMENT_WRITES)
    run = mcdc("catch-up", source, target, cp, "--max-retries", "1")
    assert run.finish() == 75, run.err
    _assert_one_line(run, "gave up after 1 retries")
    assert len(_retry_lines(run)) == 1, run.err
    assert _position(cp) == before


# --- the source's reads ---

#: where each read is struck: the change stream's open and getMore in catch-up (small batches: the stream
#: needs getMore), the snapshot's find and getMore in a first sync (small batches: the copy's cursor needs
#: getMore); ``skip``: the matching commands that go through first (a sync's first two finds are its
#: preflight's, which an error makes an outage at start: exit 75, unless --max-retries is given)
READS = [("aggregate", "catch-up", 0), ("getMore", "catch-up", 0), ("listCollections", "sync", 0), ("find", "sync", 2),
         ("getMore", "sync", 0)]  # fmt: skip


#: Every fault on the snapshot's find and the stream's aggregate; on the other reads one of each way a read fails
#: (:data:`WAYS` but the write concern error), CursorNotFound on a getMore, and the error CI once met
#: on the snapshot's getMore (two partitions failing at once).
ONE_OF_EACH_READ = [fault for fault in WAYS if "writeConcern" not in fault.name]
READ_CASES = [
    *((*read, fault) for read in READS if read[0] in ("find", "aggregate") for fault in failpoint.READ_FAULTS),
    *((*read, fault) for read in READS if read[0] not in ("find", "aggregate") for fault in ONE_OF_EACH_READ),
    *((*read, failpoint.error(failpoint.CURSOR_NOT_FOUND)) for read in READS if read[0] == "getMore"),
]


@pytest.mark.parametrize(("command", "phase", "skip", "fault"), READ_CASES,
                         ids=[f"{c}-{p}-{_fault_id(f)}" for c, p, _, f in READ_CASES])  # fmt: skip
def test_a_retryable_error_of_the_sources_reads_is_retried_counted_and_converges(
    uris: tuple[str, str], mcdc: Callable[..., Mcdc], tmp_path: Path, fault: Fault, command: str, phase: str,
    skip: int,
) -> None:  # fmt: skip
    source, target = uris
    cp = tmp_path / "cp.json"
    _load(source)
    if phase == "catch-up":
        _synced(source, target, cp)
        _changes(source)
    failpoint.arm(source, fault, [command], skip=skip)
    run = mcdc(phase, source, target, cp, "--io-timeout", "1", "--batch-docs", "4", "--max-batch-size", "4")
    if command == "getMore" and phase == "catch-up":
        # the driver resumes the change stream by itself (from its resume token) on an error it deems
        # resumable, a closed connection, CursorNotFound: mcdc retries (and counts) only what the driver did not
        deadline = time.monotonic() + 60
        while run.proc.poll() is None and not run.retries() and time.monotonic() < deadline:
            time.sleep(0.05)
        if run.proc.poll() is None:
            assert set(run.retries()) <= {"stream"}
        failpoint.disarm(source)
        assert run.finish() == 0, run.err
        assert "Traceback" not in run.err and " ERROR " not in run.err, run.err
        assert run.summary()["retries"] == len(_retry_lines(run)), run.err
    else:
        run.wait_for(_counted(run), "a retry of the source's reads, counted")
        expected = {"listCollections": "source", "aggregate": "stream"}.get(command, "snapshot")
        assert set(run.retries()) == {expected}  # the source's, by phase (never the sink's)
        failpoint.disarm(source)
        assert run.finish() == 0, run.err
        _assert_retried(run, at_start=command == "listCollections")
    _assert_converged(source, target)


@pytest.mark.parametrize("fault", [failpoint.error(failpoint.NOT_WRITABLE_PRIMARY), failpoint.close_connection()],
                         ids=_fault_id)  # fmt: skip
def test_an_error_of_the_sources_first_reads_is_an_outage_at_start(
    uris: tuple[str, str], mcdc: Callable[..., Mcdc], tmp_path: Path, fault: Fault
) -> None:
    """The first reads (the probe's find) fail as an unreachable source at start: sync and catch-up exit 75
    at once (a cron job's next run tries again); with --max-retries given, they wait for it, retrying."""
    source, target = uris
    cp = tmp_path / "cp.json"
    _load(source)
    failpoint.arm(source, fault, ["find"])
    run = mcdc("sync", source, target, cp)
    assert run.finish() == 75, run.err
    _assert_one_line(run, "source")
    run = mcdc("sync", source, target, cp, "--max-retries", "16")
    run.wait_for(_counted(run), "a retry of the source's reads, counted")
    assert set(run.retries()) == {"source"}
    failpoint.disarm(source)
    assert run.finish() == 0, run.err
    _assert_converged(source, target)
