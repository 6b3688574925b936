"""Numbers that never mislead (issue 41): the lag and canCommit of an idle checkpoint, the time a cutover
names, the migrations ``status`` lists, and the one vocabulary of states in ``status`` and ``/progress``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pymongo
import pytest

from tests.support.servers import free_port
from tests.test_cli import _mcdc


def _status(*args: str, env: dict[str, str]) -> dict[str, Any]:
    result = _mcdc("status", *args, "--json", env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def _run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    result = _mcdc(*args, "--no-progress", env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    return result


@pytest.mark.integration
def test_an_idle_reverse_checkpoint_has_no_lag_and_one_can_commit_whichever_way_status_finds_it(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    """A cutover's reverse checkpoint is at the new source's latest time: status finds it by --source and
    --target or by --checkpoint alone, and both say lag 0 (caught up) and the same canCommit."""
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    with pymongo.MongoClient(source_uri) as client:
        client.shop.orders.insert_many([{"_id": i} for i in range(20)])
    pair = ("-s", source_uri, "-t", target_uri)
    _run("sync", *pair, env=env)
    reverse = json.loads(_run("cutover", *pair, "--json", env=env).stdout)["reverse_checkpoint"]

    by_pair = _status("-s", target_uri, "-t", source_uri, env=env)
    by_path = _status("-c", reverse, env=env)
    assert by_pair["checkpoint"] == by_path["checkpoint"] == reverse
    for found in (by_pair, by_path):
        assert found["lag_s"] == 0 and found["progress"]["lagTimeSeconds"] == 0, found
    assert by_pair["lag_measured_against"] == by_path["lag_measured_against"]
    assert by_pair["progress"]["canCommit"] == by_path["progress"]["canCommit"]
    shown = _mcdc("status", "-c", reverse, env=env)
    assert "(caught up)" in shown.stdout, shown.stdout


def _write(source_uri: str) -> int:
    """Write 20 documents; the second of the write's operation time (the source's last write)."""
    with pymongo.MongoClient(source_uri) as client, client.start_session() as session:
        client.shop.orders.insert_many([{"_id": i} for i in range(20)], session=session)
        assert session.operation_time is not None
        return int(session.operation_time.time)


def _idle_past(cp: Path) -> None:
    """Until the clock is two seconds past the checkpoint's position: the source has been idle since."""
    from tests.test_cutover import _until

    position = json.loads(cp.read_text())["position"]["cluster_time"]["t"]
    _until("two seconds without writes", lambda: time.time() >= position + 2)


def _shown_cutover(text: str, last_write: int) -> None:
    """The proof's moment heads the cutover's lines; the source's last write, seconds earlier, is said apart
    (as late as the checkpoint's position shows it: on an idle source, the position the stream was read to)."""
    lines = text.splitlines()
    head = next(line for line in lines if line.startswith("cut over at "))
    proven = datetime.strptime(head.split()[3].rstrip(":"), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    assert proven >= last_write + 2, head
    said = [line for line in lines if line.startswith("the source's last write: at or before ")]
    assert len(said) == 1 and "before the proof" in said[0], text
    point = int(said[0].split()[7].split(",")[0])
    assert last_write <= point < proven, said[0]


@pytest.mark.integration
def test_a_cutover_of_an_idle_source_prints_when_it_was_proven_and_when_the_source_last_wrote(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    last_write = _write(source_uri)
    pair = ("-s", source_uri, "-t", target_uri, "-c", str(tmp_path / "cp.json"))
    _run("sync", *pair, env=env)
    _idle_past(tmp_path / "cp.json")
    cut = _run("cutover", *pair, env=env)
    _shown_cutover(cut.stdout, last_write)
    as_json = json.loads(_run("cutover", *pair, "--json", env=env).stdout)  # already: says the same
    assert as_json["already"] and last_write <= as_json["point"]["t"]
    assert datetime.fromisoformat(as_json["proven_at"]).timestamp() >= as_json["point"]["t"] + 2


@pytest.mark.integration
def test_post_commit_on_an_idle_source_prints_when_it_was_proven_and_when_the_source_last_wrote(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    from tests.test_cutover import _post, _progress, _until

    cp, port = tmp_path / "cp.json", free_port()
    last_write = _write(source_uri)
    args = ["tail", "-s", source_uri, "-t", target_uri, "-c", str(cp), "--no-progress"]
    args += ["--metrics-port", str(port), "--control"]
    tail = subprocess.Popen(
        [sys.executable, "-m", "replicator.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        _until("canCommit", lambda: _progress(port)["canCommit"])
        _idle_past(cp)
        status, accepted = _post(port, "/commit")
        assert status == 202, accepted
        out, err = tail.communicate(timeout=120)
    finally:
        if tail.poll() is None:
            tail.kill()
            tail.communicate()
    assert tail.returncode == 0, err[-3000:]
    _shown_cutover(out, last_write)


@pytest.mark.integration
def test_status_of_a_pair_lists_both_migrations_after_ones_selection_changed_through_its_checkpoint(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    """Two migrations between one pair of servers; the first one's selection widened by a run given its
    --checkpoint (its file keeps the name the old selection gave it): status with --source and --target
    alone still names both, and reads either one when told which."""
    from tests.test_cli import _assert_one_line_error

    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    with pymongo.MongoClient(source_uri) as client:
        for name in ("lake0", "lake1", "lake2"):
            client[name].a.insert_many([{"_id": i} for i in range(3)])
    pair = ("-s", source_uri, "-t", target_uri)
    first = json.loads(_run("sync", *pair, "--include", r"lake0\..*", "--json", env=env).stdout)["checkpoint"]
    _run("sync", *pair, "--include", r"lake1\..*", env=env)
    _run("sync", *pair, "-c", first, "--include", r"lake0\..*", "--include", r"lake2\..*", env=env)
    assert json.loads(Path(first).read_text())["recorded"]["include"] == [r"lake0\..*", r"lake2\..*"]

    both = _mcdc("status", *pair, env=env)
    _assert_one_line_error(both, 2, "2 migrations", first, r"--include lake1\..*", "--checkpoint")
    chosen = _status(*pair, "--include", r"lake0\..*", "--include", r"lake2\..*", env=env)
    assert chosen["checkpoint"] == first


def test_a_checkpoints_verifier_phase_is_the_one_a_running_verifier_shows_there() -> None:
    """``phase`` has one vocabulary (off, scanning, rechecking, idle, failed): between passes a running
    verifier says idle, and so does status of the checkpoint it left; in a pass, scanning or rechecking."""
    from replicator.checking.sweep_state import SweepState, verification_of

    between = SweepState(passes=1, clean_passes=1, last_pass_at=1.0)
    assert verification_of(between.to_json()).phase == "idle"
    scanning = SweepState(passes=1, pass_started_at=2.0, done=["db.a"], current="db.b")
    assert verification_of(scanning.to_json()).phase == "scanning"
    rechecking = SweepState(passes=1, pass_started_at=2.0, extra_checked=True, recheck=[{"kind": "doc"}])
    assert verification_of(rechecking.to_json()).phase == "rechecking"


@pytest.mark.integration
def test_status_of_a_stopped_verifying_tail_says_the_phase_progress_said(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    from tests.test_cutover import _progress, _until

    cp, port = tmp_path / "cp.json", free_port()
    with pymongo.MongoClient(source_uri) as client:
        client.shop.orders.insert_many([{"_id": i} for i in range(20)])
    args = ["tail", "-s", source_uri, "-t", target_uri, "-c", str(cp), "--no-progress", "--verify"]
    args += ["--verify-interval", "3600", "--metrics-port", str(port)]
    tail = subprocess.Popen(
        [sys.executable, "-m", "replicator.cli", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        shown = _until(
            "a clean pass, then idle", lambda: (p := _progress(port))["verification"]["phase"] == "idle" and p
        )
        tail.terminate()
        _, err = tail.communicate(timeout=60)
    finally:
        if tail.poll() is None:
            tail.kill()
            tail.communicate()
    assert tail.returncode == 0, err[-3000:]
    stopped = _status("-c", str(cp), env=dict(os.environ))["progress"]
    assert stopped["state"] == "STOPPED" and shown["state"] == "REPLAYING"
    assert stopped["verification"]["phase"] == shown["verification"]["phase"] == "idle"
    assert stopped["verification"]["cleanPasses"] == shown["verification"]["cleanPasses"] == 1


def test_status_of_a_pair_lists_both_when_one_migration_copies_everything(tmp_path: Path) -> None:
    """The pair's migration of everything has the default checkpoint of --source and --target alone: status
    given them still names both migrations, not that one alone; given --checkpoint, it reads it."""
    from replicator.checkpoint.store import Checkpoint, CheckpointStore
    from replicator.replay.recorded import Recorded
    from replicator.settings.resolve import resolve
    from tests.test_cli import _assert_one_line_error

    env = dict(os.environ)  # the test's own state directory (conftest): the default checkpoints go there
    pair = {"source": "mongodb://a.example/", "target": "mongodb://b.example/"}
    everything = resolve(pair, env=env)
    other = resolve({**pair, "include": ("lake1\\..*",), "rename": ("lake1=lake1_c",)}, env=env)
    for settings in (everything, other):
        cp = Checkpoint("rs0", recorded=Recorded.of(settings).to_json(), lag_s=0.0, pair=settings.pair_key())
        CheckpointStore(settings.checkpoint_path()).save(cp)
    both = _mcdc("status", "-s", pair["source"], "-t", pair["target"], env=env)
    _assert_one_line_error(both, 2, "2 migrations", "everything", "--rename lake1=lake1_c", "--checkpoint")
    chosen = _status("-c", str(everything.checkpoint_path()), env=env)
    assert chosen["checkpoint"] == str(everything.checkpoint_path())
