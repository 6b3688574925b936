"""``mcdc tail --verify`` against real servers: no false mismatch while the source takes writes, a
difference made on the target alone found and holding canCommit back, and a pass that goes on after
kill -9 instead of starting over."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pymongo
import pytest

from tests.support.servers import free_port
from tests.test_cli import _assert_one_line_error, _mcdc
from tests.test_cutover import _progress, _until, verifying_tail


def _stop(tail: subprocess.Popen[str]) -> str:
    tail.terminate()
    _, err = tail.communicate(timeout=60)
    assert tail.returncode == 0, err[-3000:]
    return err


def _verification(port: int) -> dict[str, Any]:
    v: dict[str, Any] = _progress(port)["verification"]
    return v


def _workload(source_uri: str, stop: threading.Event, seed: int) -> int:
    """Inserts, updates, replaces and deletes on both collections until ``stop``; returns the writes made."""
    rng = random.Random(seed)
    writes = 0
    with pymongo.MongoClient(source_uri) as client:
        db = client.shop
        while not stop.is_set():
            coll = db.orders if rng.random() < 0.7 else db.users
            _id = rng.randrange(2500)
            op = rng.random()
            if op < 0.5:
                coll.update_one({"_id": _id}, {"$inc": {"n": 1}, "$set": {"at": writes}})
            elif op < 0.7:
                coll.replace_one({"_id": _id}, {"n": -writes, "w": "x" * rng.randrange(50)}, upsert=True)
            elif op < 0.85:
                coll.delete_one({"_id": _id})
            else:
                coll.insert_one({"n": writes})  # an ObjectId _id: another bracket
            writes += 1
    return writes


@pytest.mark.integration
def test_no_false_mismatch_under_writes_and_a_target_only_difference_is_found(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    with pymongo.MongoClient(source_uri) as client:
        client.shop.orders.insert_many([{"_id": i, "n": i} for i in range(2000)])
        client.shop.users.insert_many([{"_id": i, "name": f"u{i}"} for i in range(300)])
        client.shop.orders.create_index("n")
    port, cp = free_port(), tmp_path / "cp.json"
    tail = verifying_tail(source_uri, target_uri, cp, port, "--partition-docs", "250", "--split", "always")
    try:
        _until("a first pass", lambda: _verification(port)["passes"] >= 1, timeout=90)
        stop = threading.Event()
        worker = threading.Thread(target=lambda: written.append(_workload(source_uri, stop, 7)))
        written: list[int] = []
        worker.start()
        seen = []
        try:
            deadline = time.monotonic() + 8
            while time.monotonic() < deadline:  # passes run under the writes: none may report a mismatch
                seen.append(_verification(port))
                time.sleep(0.2)
        finally:
            stop.set()
            worker.join()
        assert written[0] > 100
        assert max(v["mismatches"] for v in seen) == 0, [v for v in seen if v["mismatches"]][:1]
        assert max(v["rechecking"] for v in seen) > 0  # the writes did make the sweeps re-check
        passes = seen[-1]["passes"]
        quiet = _until(
            "two passes after the writes",
            lambda: (v := _verification(port))["passes"] >= passes + 2 and v["rechecking"] == 0 and v,
        )
        assert quiet["mismatches"] == 0 and quiet["scannedDocuments"] > 2300
        assert _until("canCommit", lambda: _progress(port)["canCommit"])

        with pymongo.MongoClient(target_uri) as client:  # made on the target alone: the replay never fixes it
            client.shop.orders.update_one({"_id": 5}, {"$set": {"n": "tampered"}})
            client.shop.users.insert_one({"_id": "intruder"})
            client.shop.orders.drop_index("n_1")
        found = _until(
            "the mismatches",
            lambda: (p := _progress(port))["verification"]["mismatches"] >= 3 and p,
        )
        assert not found["canCommit"]
        listed = found["verification"]["firstMismatches"]
        assert {"namespace": "shop.orders", "_id": {"$numberInt": "5"}, "detail": "differs"} in listed
        assert {"namespace": "shop.users", "_id": "intruder", "detail": "only on the target"} in listed
        assert any(m["namespace"] == "shop.orders" and "index n_1 missing" in m.get("detail", "") for m in listed)
        later = _until("another pass", lambda: (p := _progress(port))["verification"]["passes"] > found["verification"][
            "passes"] + 1 and p)  # fmt: skip
        assert later["verification"]["mismatches"] == 3 and not later["canCommit"]  # still there, counted once
        metrics = _metrics(port)
        assert "mcdc_verify_mismatches 3.0" in metrics and "mcdc_verify_passes_total" in metrics
    finally:
        err = _stop(tail)
    assert 'verify: shop.orders _id {"$numberInt": "5"} differs (confirmed by a re-check)' in err
    status = json.loads(_mcdc("status", "-c", str(cp), "--json").stdout)["progress"]
    # saved as the stopped pass left them: all 3 once a pass has found them (a CI run under load once showed
    # 2 here: which one a pass cut short by SIGTERM had not confirmed again is not pinned yet)
    saved = status["verification"]["mismatches"]
    assert status["state"] == "STOPPED" and 1 <= saved <= 3  # the phase: where the verifier stopped, as
    assert status["verification"]["phase"] in ("scanning", "rechecking", "idle")  # /progress said it
    assert f", {saved} mismatches, " in _mcdc("status", "-c", str(cp)).stdout


def _metrics(port: int) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        return str(reply.read().decode())


@pytest.mark.integration
def test_a_pass_goes_on_after_kill_9_instead_of_starting_over(source_uri: str, target_uri: str, tmp_path: Path) -> None:
    documents = 6_000
    with pymongo.MongoClient(source_uri) as client:
        client.shop.orders.insert_many([{"_id": i, "pad": "x" * 100} for i in range(documents)])
    port, cp = free_port(), tmp_path / "cp.json"
    ranges = ["--partition-docs", "300", "--split", "always", "--verify-interval", "3600"]
    tail = verifying_tail(source_uri, target_uri, cp, port, *ranges)
    try:
        saved = _until("a pass saved half-way", lambda: _saved_place(cp), timeout=120)
    finally:
        tail.send_signal(signal.SIGKILL)
        tail.communicate(timeout=60)
    assert saved["passes"] == 0 and 0 < saved["parts_done"] < 20 and saved["scanned"] == saved["parts_done"] * 300
    tail = verifying_tail(source_uri, target_uri, cp, port, *ranges)
    try:
        # (before the verifier starts, /progress shows the "off" default, all zero)
        first = _until(
            "the restarted verifier", lambda: (v := _verification(port))["phase"] != "off" and v["currentPass"]
        )
        assert first["rangesDone"] >= saved["parts_done"]  # from where it was, not from 0
        done = _until("the pass", lambda: (v := _verification(port))["passes"] >= 1 and v, timeout=120)
        # every document compared once over both runs: a pass begun again would have counted the first
        # run's documents a second time
        assert done["scannedDocuments"] == documents and done["mismatches"] == 0
    finally:
        _stop(tail)


def _saved_place(cp: Path) -> dict[str, Any] | None:
    try:
        state = json.loads(cp.read_text()).get("verifier")
    except (OSError, ValueError):
        return None
    return state if state and state["parts_done"] >= 3 and state["current"] else None


@pytest.mark.integration
def test_verify_needs_a_mongodb_target(source_uri: str, tmp_path: Path) -> None:
    result = _mcdc("tail", "-s", source_uri, "-t", "stdout", "-c", str(tmp_path / "cp.json"), "--verify")
    _assert_one_line_error(result, 2, "--verify compares two MongoDB deployments")
