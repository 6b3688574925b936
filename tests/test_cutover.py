"""Ending a migration: ``GET /progress`` while it runs, ``mcdc cutover`` proving the target identical at a
quiet source (and refusing under writes), and the reverse checkpoint that carries the new side's writes back."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pymongo
import pytest
from pymongo.errors import OperationFailure

from replicator.errors import ConfigError
from replicator.job.cutover import block_writes
from replicator.observe.migration import COMMIT_LAG_S, Facts, Verification, can_commit, progress_document
from tests.support.compare import assert_identical
from tests.support.proxy import wire_proxy
from tests.support.servers import free_port
from tests.test_cli import _assert_one_line_error, _mcdc


def _sync(source_uri: str, target_uri: str, cp: Path) -> None:
    result = _mcdc("sync", "-s", source_uri, "-t", target_uri, "-c", str(cp), "--no-progress")
    assert result.returncode == 0, result.stderr


def _cutover(source_uri: str, target_uri: str, cp: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return _mcdc("cutover", "-s", source_uri, "-t", target_uri, "-c", str(cp), "--json", "--no-progress", *extra)


@pytest.mark.integration
def test_a_quiet_cutover_proves_the_target_and_the_reverse_carries_only_the_new_sides_writes(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    cp, reverse = tmp_path / "cp.json", tmp_path / "back.json"
    with pymongo.MongoClient(source_uri) as client:
        client.shop.orders.insert_many([{"_id": i, "n": i} for i in range(200)])
        client.shop.orders.create_index("n")
    _sync(source_uri, target_uri, cp)
    with pymongo.MongoClient(source_uri) as client:  # changed after the sync: the cutover's catch-up brings it
        client.shop.orders.update_one({"_id": 1}, {"$set": {"n": -1}})
    done = _cutover(source_uri, target_uri, cp, "--reverse-checkpoint", str(reverse))
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["documents"] == 200 and result["point"]["t"] > 0 and not result["already"]
    assert f'--source "{target_uri}" --target "{source_uri}"' in result["reverse_command"]
    assert_identical(source_uri, target_uri)
    back = json.loads(reverse.read_text())
    assert back["snapshot"]["status"] == "done" and back["position"]["cluster_time"]["t"] > 0
    assert json.loads(cp.read_text())["cutover"]["point"] == result["point"]

    again = _cutover(source_uri, target_uri, cp, "--reverse-checkpoint", str(reverse))
    assert again.returncode == 0 and json.loads(again.stdout)["already"]  # harmless, and says so
    forward = _mcdc("catch-up", "-s", source_uri, "-t", target_uri, "-c", str(cp))
    _assert_one_line_error(forward, 2, "was cut over")  # the old side no longer writes the new one

    with pymongo.MongoClient(target_uri) as client:  # the application now writes to the target
        client.shop.orders.insert_one({"_id": 1000, "n": 1000})
        client.shop.orders.update_one({"_id": 2}, {"$set": {"n": -2}})
        client.shop.orders.delete_one({"_id": 3})
    way_back = _mcdc("catch-up", "-s", target_uri, "-t", source_uri, "-c", str(reverse), "--json", "--no-progress")
    assert way_back.returncode == 0, way_back.stderr
    summary = json.loads(way_back.stdout)
    assert summary["events"] == 3 and summary["documents"] == 0  # those three writes, and nothing from before
    assert_identical(target_uri, source_uri)


@pytest.mark.integration
def test_a_cutover_while_the_source_takes_writes_is_refused(source_uri: str, target_uri: str, tmp_path: Path) -> None:
    cp, reverse = tmp_path / "cp.json", tmp_path / "back.json"
    with pymongo.MongoClient(source_uri) as client:
        client.shop.orders.insert_many([{"_id": i} for i in range(500)])
    _sync(source_uri, target_uri, cp)
    stop = threading.Event()

    def application() -> None:  # still writing: nobody stopped it
        with pymongo.MongoClient(source_uri) as client:
            n = 10_000
            while not stop.is_set():
                client.shop.orders.insert_one({"_id": n})
                n += 1
                time.sleep(0.01)

    writer = threading.Thread(target=application)
    writer.start()
    try:
        refused = _cutover(source_uri, target_uri, cp, "--reverse-checkpoint", str(reverse))
    finally:
        stop.set()
        writer.join()
    _assert_one_line_error(refused, 5, "the source took", "while the target was verified", "not cut over")
    assert not reverse.exists() and json.loads(cp.read_text())["cutover"] is None


@pytest.mark.integration
def test_block_writes_on_a_server_without_it_is_one_line(source_uri: str, target_uri: str, tmp_path: Path) -> None:
    cp = tmp_path / "cp.json"
    with pymongo.MongoClient(source_uri) as client:
        client.shop.orders.insert_one({"_id": 1})
        try:
            client.admin.command({"setUserWriteBlockMode": 1, "global": True})
            client.admin.command({"setUserWriteBlockMode": 0, "global": False})
            pytest.skip("this source can block writes")
        except OperationFailure:
            pass
    _sync(source_uri, target_uri, cp)
    refused = _cutover(source_uri, target_uri, cp, "--block-writes")
    _assert_one_line_error(refused, 2, "cannot block writes", "stop the application's writes")


class _Admin:
    """A MongoDB-shaped admin database: records commands, and answers as a server without the command
    (code 59) or as MongoDB 6.0+."""

    def __init__(self, fail_code: int | None) -> None:
        self.calls: list[dict[str, Any]] = []
        self.fail_code = fail_code

    async def command(self, command: dict[str, Any], **_: Any) -> dict[str, Any]:
        self.calls.append(command)
        if self.fail_code is not None:
            raise OperationFailure("no such command: 'setUserWriteBlockMode'", code=self.fail_code)
        return {"ok": 1}


class _Client:
    def __init__(self, fail_code: int | None = None) -> None:
        self.admin = _Admin(fail_code)


def test_block_writes_sends_set_user_write_block_mode_and_explains_a_refusal() -> None:
    client = _Client()
    asyncio.run(block_writes(client))  # type: ignore[arg-type]
    assert client.admin.calls == [{"setUserWriteBlockMode": 1, "global": True}]
    with pytest.raises(ConfigError, match=r"setUserWriteBlockMode needs MongoDB 6\.0\+"):
        asyncio.run(block_writes(_Client(fail_code=59)))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="refused to block writes"):
        asyncio.run(block_writes(_Client(fail_code=13)))  # type: ignore[arg-type]


def test_can_commit_needs_the_snapshot_a_small_lag_and_a_clean_verifier_pass() -> None:
    base = Facts("REPLAYING", snapshot_done=True, lag_s=1.0, events_applied=5, estimated_documents=9,
                 copied_documents=9)  # fmt: skip
    assert can_commit(base)
    assert not can_commit(Facts(**{**base.__dict__, "snapshot_done": False}))
    assert not can_commit(Facts(**{**base.__dict__, "lag_s": COMMIT_LAG_S + 1}))
    assert not can_commit(Facts(**{**base.__dict__, "verification": Verification(phase="scanning")}))
    clean = Verification(phase="scanning", passes=1, clean_passes=1)
    assert can_commit(Facts(**{**base.__dict__, "verification": clean}))
    found = Verification(phase="scanning", passes=1, clean_passes=1, mismatches=1)
    assert not can_commit(Facts(**{**base.__dict__, "verification": found}))
    failed = Verification(phase="failed", passes=1, clean_passes=1)  # a verifier that stopped proves nothing more
    assert not can_commit(Facts(**{**base.__dict__, "verification": failed}))
    doc = progress_document(base)["progress"]
    assert doc["state"] == "REPLAYING" and doc["canCommit"] and not doc["canWrite"]
    assert doc["collectionCopy"] == {"estimatedTotalDocuments": 9, "copiedDocuments": 9}
    assert doc["totalEventsApplied"] == 5 and doc["verification"]["phase"] == "off"


def verifying_tail(
    source_uri: str, target_uri: str, cp: Path, port: int, *extra: str, stdout: int | None = None
) -> subprocess.Popen[str]:
    """``mcdc tail --verify`` (passes back to back unless ``extra`` says otherwise) serving /progress."""
    args = ["tail", "-s", source_uri, "-t", target_uri, "-c", str(cp), "--no-progress", "--verify"]
    args += ["--metrics-port", str(port), "--verify-interval", "0", *extra]
    return subprocess.Popen(
        [sys.executable, "-m", "replicator.cli", *args], stdout=stdout, stderr=subprocess.PIPE, text=True
    )


def _progress(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/progress", timeout=10) as reply:
        document: dict[str, Any] = json.loads(reply.read())["progress"]
        return document


def _until(what: str, condition: Any, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = condition()
            if last:
                return last
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}: {last}")


@pytest.mark.integration
def test_progress_during_the_snapshot_the_replay_and_after_a_workload(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    with pymongo.MongoClient(source_uri) as client:
        client.shop.orders.insert_many([{"_id": i} for i in range(3000)])
    port = free_port()
    with wire_proxy(target_uri) as proxy:
        proxy.swallow_reply(b"insert\x00")  # the snapshot's first write waits --io-timeout: a snapshot to watch
        args = ["tail", "-s", source_uri, "-t", proxy.uri, "-c", str(tmp_path / "cp.json"), "--no-progress"]
        args += ["--metrics-port", str(port), "--io-timeout", "5", "--retry-initial-delay", "0.2"]
        tail = subprocess.Popen([sys.executable, "-m", "replicator.cli", *args], stderr=subprocess.PIPE, text=True)
        try:
            during = _until("the snapshot", lambda: (p := _progress(port))["state"] == "SNAPSHOT" and p)
            assert not during["canCommit"] and not during["snapshotDone"] and during["info"] == "copying collections"
            counted = _until(  # a collection copied whole is counted beside the copy, not before it
                "the estimate", lambda: (p := _progress(port))["collectionCopy"].get("estimatedTotalDocuments") and p
            )
            assert counted["state"] == "SNAPSHOT" and counted["collectionCopy"]["estimatedTotalDocuments"] == 3000
            # the copy's own window is replayed before the snapshot counts as done
            replaying = _until("the snapshot done", lambda: (p := _progress(port))["snapshotDone"] and p)
            assert replaying["state"] == "REPLAYING" and replaying["collectionCopy"]["copiedDocuments"] >= 3000
            with pymongo.MongoClient(source_uri) as client:
                for i in range(20):
                    client.shop.orders.update_one({"_id": i}, {"$set": {"x": 1}})
            after = _until("the workload applied", lambda: (p := _progress(port))["totalEventsApplied"] >= 20 and p)
            assert after["lagTimeSeconds"] is not None and after["lagTimeSeconds"] < COMMIT_LAG_S
            assert after["canCommit"] and not after["canWrite"] and after["info"] == "applying change events"
        finally:
            tail.terminate()
            _, err = tail.communicate(timeout=60)
    assert tail.returncode == 0, err[-3000:]
    status = _mcdc("status", "-c", str(tmp_path / "cp.json"), "--json")
    assert status.returncode == 0, status.stderr
    stopped = json.loads(status.stdout)["progress"]
    assert stopped["state"] == "STOPPED" and stopped["snapshotDone"] and "totalEventsApplied" not in stopped


@pytest.mark.integration
def test_after_a_clean_verifier_pass_cutover_compares_only_what_changed_since(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    cp, port = tmp_path / "cp.json", free_port()
    with pymongo.MongoClient(source_uri) as client:
        client.shop.orders.insert_many([{"_id": i, "n": i} for i in range(3000)])
        client.shop.users.insert_many([{"_id": i} for i in range(50)])
    tail = verifying_tail(source_uri, target_uri, cp, port, "--verify-interval", "3600")
    try:
        _until("a clean pass", lambda: (p := _progress(port))["verification"]["cleanPasses"] >= 1 and p)
        with pymongo.MongoClient(source_uri) as client:  # after the pass began: not proven by it
            client.shop.orders.update_many({"_id": {"$lt": 7}}, {"$set": {"n": -1}})
            client.shop.orders.delete_one({"_id": 10})
            client.shop.users.drop()  # DDL: compared whole
        _until("the changes applied", lambda: _progress(port)["totalEventsApplied"] >= 9)
    finally:
        tail.terminate()
        _, err = tail.communicate(timeout=60)
    assert tail.returncode == 0, err[-3000:]
    with pymongo.MongoClient(target_uri) as client:  # a wrong copy of a changed document: must be found
        client.shop.orders.update_one({"_id": 3}, {"$set": {"n": "wrong"}})
    refused = _cutover(source_uri, target_uri, cp)
    assert refused.returncode == 1, refused.stderr
    assert "8 _ids changed, 1 namespace whole" in refused.stderr, refused.stderr
    full = _cutover(source_uri, target_uri, cp, "--full-verify")
    assert full.returncode == 1 and "verifying the target against the source" in full.stderr
    with pymongo.MongoClient(target_uri) as client:
        client.shop.orders.update_one({"_id": 3}, {"$set": {"n": -1}})
    done = _cutover(source_uri, target_uri, cp)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    # the 7 updated documents (the deleted one is on neither side): not the 3,000 of a full verify
    assert result["verified"] == "changes since the verifier's last clean pass" and result["documents"] == 7
    assert_identical(source_uri, target_uri)


def _post(port: int, path: str) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.mark.integration
def test_post_commit_on_a_controlled_tail_waits_for_can_commit_then_cuts_over(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    cp, port = tmp_path / "cp.json", free_port()
    with pymongo.MongoClient(source_uri) as client:
        client.shop.orders.insert_many([{"_id": i} for i in range(100)])
    tail = verifying_tail(source_uri, target_uri, cp, port, "--json", "--control", stdout=subprocess.PIPE)
    try:
        _until("a clean pass", lambda: _progress(port)["canCommit"])
        with pymongo.MongoClient(target_uri) as client:
            client.shop.orders.insert_one({"_id": "stray"})
        _until("the mismatch", lambda: _progress(port)["verification"]["mismatches"] == 1)
        status, refused = _post(port, "/commit")
        assert status == 409 and "canCommit is false" in refused["error"]
        with pymongo.MongoClient(target_uri) as client:
            client.shop.orders.delete_one({"_id": "stray"})
        _until("canCommit again", lambda: _progress(port)["canCommit"])
        status, accepted = _post(port, "/commit")
        assert status == 202 and accepted["progress"]["state"] == "COMMITTING"
        out, err = tail.communicate(timeout=120)
    finally:
        if tail.poll() is None:
            tail.kill()
            tail.communicate()
    assert tail.returncode == 0, err[-3000:]
    result = json.loads(out[out.rindex('{\n  "point"') :])
    assert result["point"]["t"] > 0 and result["verified"] == "changes since the verifier's last clean pass"
    assert json.loads(cp.read_text())["cutover"]["point"] == result["point"]
    assert_identical(source_uri, target_uri)


def test_control_needs_a_loopback_metrics_port(tmp_path: Path) -> None:
    base = ["tail", "-s", "mongodb://127.0.0.1:1", "-t", "mongodb://127.0.0.1:2", "-c", str(tmp_path / "cp.json")]
    base += ["--control", "--connect-timeout", "1"]
    _assert_one_line_error(_mcdc(*base), 2, "give --metrics-port too")
    _assert_one_line_error(_mcdc(*base, "--metrics-port", "0", "--metrics-host", "0.0.0.0"), 2, "loopback only")


@pytest.mark.integration
def test_two_migrations_of_other_selections_between_one_pair_both_cut_over_and_keep_their_way_back(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    """Default checkpoints (no --checkpoint): a second migration between the same servers, of another
    selection, neither takes over the first one's checkpoint nor replaces its reverse checkpoint, which a
    reverse tail has moved on since."""
    import os

    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    with pymongo.MongoClient(source_uri) as client:
        client.lake0.a.insert_many([{"_id": i} for i in range(5)])
        client.lake1.a.insert_many([{"_id": i} for i in range(7)])
    first = ("-s", source_uri, "-t", target_uri, "--include", r"lake0\..*", "--no-progress")
    second = (
        "-s",
        source_uri,
        "-t",
        target_uri,
        "--include",
        r"lake1\..*",
        "--rename",
        "lake1=lake1_c",
        "--no-progress",
    )

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return _mcdc(*args, env=env, timeout=120)

    assert (done := run("sync", *first)).returncode == 0, done.stderr
    cut = run("cutover", *first, "--json")
    assert cut.returncode == 0, cut.stderr
    reverse_one = Path(json.loads(cut.stdout)["reverse_checkpoint"])
    # the way back is used: writes on the new side, carried back by a catch-up on the reverse checkpoint
    with pymongo.MongoClient(target_uri) as client:
        client.lake0.a.insert_one({"_id": "new-side"})
    back = ("-s", target_uri, "-t", source_uri, "--include", r"lake0\..*", "-c", str(reverse_one), "--no-progress")
    assert (done := run("catch-up", *back)).returncode == 0, done.stderr
    moved = reverse_one.read_bytes()
    with pymongo.MongoClient(source_uri) as client:
        assert client.lake0.a.find_one({"_id": "new-side"}) is not None

    assert (done := run("sync", *second)).returncode == 0, done.stderr  # a snapshot of its own
    with pymongo.MongoClient(target_uri) as client:
        assert client.lake1_c.a.count_documents({}) == 7
    cut = run("cutover", *second, "--json")
    assert cut.returncode == 0, cut.stderr
    reverse_two = Path(json.loads(cut.stdout)["reverse_checkpoint"])
    assert reverse_two != reverse_one and reverse_one.read_bytes() == moved  # the first way back, as it was
    assert json.loads(reverse_two.read_text())["snapshot"]["status"] == "done"
    # a third migration told to write its way back where the first one's is: refused before anything
    with pymongo.MongoClient(source_uri) as client:
        client.lake2.a.insert_one({"_id": 1})
    third = ("-s", source_uri, "-t", target_uri, "--include", r"lake2\..*", "--no-progress")
    assert (done := run("sync", *third)).returncode == 0, done.stderr
    refused = run("cutover", *third, "--reverse-checkpoint", str(reverse_one))
    _assert_one_line_error(refused, 2, str(reverse_one), "--reverse-checkpoint")
    assert reverse_one.read_bytes() == moved and json.loads(_default_of(env, *third).read_text())["cutover"] is None


def _default_of(env: dict[str, str], *args: str) -> Path:
    """The default checkpoint under ``env``'s state directory that a run of these flags (--include) made."""
    include = args[args.index("--include") + 1]
    for path in (Path(env["XDG_STATE_HOME"]) / "mcdc").glob("checkpoint-*.json"):
        recorded = json.loads(path.read_text())["recorded"]  # None in a reverse checkpoint not run yet
        if recorded is not None and recorded["include"] == [include]:
            return path
    raise AssertionError(f"no checkpoint of --include {include}")


@pytest.mark.integration
def test_cutover_on_a_checkpoint_a_tail_runs_on_says_how_to_go_on_before_doing_anything(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    cp = tmp_path / "mig.json"
    with pymongo.MongoClient(source_uri) as client:
        client.shop.orders.insert_one({"_id": 1})
    argv = [sys.executable, "-m", "replicator.cli", "tail", "-s", source_uri, "-t", target_uri, "-c", str(cp)]
    tail = subprocess.Popen([*argv, "--no-progress"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _until(
            "the tail's checkpoint", lambda: cp.exists() and json.loads(cp.read_text())["snapshot"]["status"] == "done"
        )
        refused = _cutover(source_uri, target_uri, cp)
        _assert_one_line_error(refused, 3, str(cp), "stop it", "POST /commit")
        assert "catching up" not in refused.stderr
    finally:
        tail.terminate()
        tail.wait(60)


def test_status_with_source_and_target_alone_finds_the_one_migration_of_that_pair(tmp_path: Path) -> None:
    """A migration of --include ...: status with --source and --target finds its default checkpoint; with
    two of them, it names both and asks which."""
    import os

    from replicator.checkpoint.store import Checkpoint, CheckpointStore
    from replicator.replay.recorded import Recorded
    from replicator.settings.resolve import resolve

    env = dict(os.environ)  # the test's own state directory (conftest): the default checkpoints go there
    pair = {"source": "mongodb://a.example/", "target": "mongodb://b.example/"}
    one = resolve({**pair, "include": ("lake0\\..*",)}, env=env)
    CheckpointStore(one.checkpoint_path()).save(Checkpoint("rs0", recorded=Recorded.of(one).to_json(), lag_s=0.0))
    found = _mcdc("status", "-s", pair["source"], "-t", pair["target"], "--json", env=env)
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout)["checkpoint"] == str(one.checkpoint_path())
    two = resolve({**pair, "include": ("lake1\\..*",), "rename": ("lake1=lake1_c",)}, env=env)
    CheckpointStore(two.checkpoint_path()).save(Checkpoint("rs0", recorded=Recorded.of(two).to_json(), lag_s=0.0))
    both = _mcdc("status", "-s", pair["source"], "-t", pair["target"], env=env)
    _assert_one_line_error(both, 2, "2 migrations", "--include lake0", "--rename lake1=lake1_c", "--checkpoint")
    chosen = _mcdc("status", "-s", pair["source"], "-t", pair["target"], "--include", "lake1\\..*",
                   "--rename", "lake1=lake1_c", "--json", env=env)  # fmt: skip
    assert json.loads(chosen.stdout)["checkpoint"] == str(two.checkpoint_path())
