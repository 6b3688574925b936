"""``mcdc status --list`` lists the migrations this machine recorded in its state directory, and
``mcdc status --forget PATH`` forgets a finished one safely (issue 49, item 5): never one a run holds,
never a way back that may still carry the new side's writes back. Against the real servers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pymongo
import pytest

from tests.support.cli import mcdc, one_line_error

pytestmark = pytest.mark.integration


def _listed() -> dict[str, dict[str, object]]:
    result = mcdc("status", "--list", "--json")
    assert result.returncode == 0, result.stderr
    return {m["checkpoint"]: m for m in json.loads(result.stdout)["migrations"]}


def test_the_migrations_are_listed_and_a_finished_one_is_forgotten(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    with pymongo.MongoClient(source_uri) as client:
        client.shop.orders.insert_many([{"_id": i} for i in range(5)])
        client.crm.people.insert_one({"_id": 1})
    uris = ("-s", source_uri, "-t", target_uri, "--no-progress")
    shop, lines = tmp_path / "shop.json", tmp_path / "events.jsonl"
    assert mcdc("sync", *uris, "--include", "shop\\..*", "-c", str(shop)).returncode == 0
    assert mcdc("sync", *uris, "--include", "crm\\..*").returncode == 0  # a default checkpoint
    assert mcdc("sync", "-s", source_uri, "-t", f"jsonl:{lines}", "--no-progress").returncode == 0
    listed = _listed()
    assert len(listed) == 3, listed
    assert listed[str(shop)]["selection"] == "--include shop\\..*" and listed[str(shop)]["state"] == "stopped"
    crm = next(path for path, m in listed.items() if m["selection"] == "--include crm\\..*")
    assert Path(crm).parent == Path(os.environ["XDG_STATE_HOME"]) / "mcdc"
    text = mcdc("status", "--list")
    assert text.returncode == 0 and str(shop) in text.stdout and "mcdc status --forget" in text.stdout

    forgot = mcdc("status", "--forget", str(shop))
    assert forgot.returncode == 0, forgot.stderr
    assert not shop.exists() and not Path(f"{shop}.backup").exists() and not Path(f"{shop}.lock").exists()
    assert str(shop) not in _listed() and len(_listed()) == 2
    # its target namespaces are no migration's now: another may take them
    again = mcdc("sync", *uris, "--include", "shop\\.orders", "--drop-target")
    assert again.returncode == 0, again.stderr
    verified = mcdc("verify", *uris[:4], "--include", "shop\\.orders")
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_a_running_migration_and_a_live_way_back_are_not_forgotten(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    with pymongo.MongoClient(source_uri) as client:
        client.shop.orders.insert_many([{"_id": i} for i in range(5)])
    cp, back = tmp_path / "cp.json", tmp_path / "back.json"
    tail = subprocess.Popen(
        [sys.executable, "-m", "replicator.cli", "tail", "-s", source_uri, "-t", target_uri, "-c", str(cp),
         "--no-progress"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (cp.exists() and json.loads(cp.read_text())["snapshot"]["status"] == "done"):
            assert time.monotonic() < deadline and tail.poll() is None, "the tail did not save its snapshot"
            time.sleep(0.2)
        one_line_error(mcdc("status", "--forget", str(cp)), 2, str(cp), "a run holds it")
        assert cp.exists()
    finally:
        tail.terminate()
        assert tail.wait(timeout=60) == 0
    cut = mcdc("cutover", "-s", source_uri, "-t", target_uri, "-c", str(cp), "--reverse-checkpoint", str(back))
    assert cut.returncode == 0, cut.stderr
    assert _listed()[str(back)]["state"] == "way back"
    refused = one_line_error(mcdc("status", "--forget", str(back)), 2, str(back), "way back")
    assert "delete" not in refused and back.exists()
    forgot = mcdc("status", "--forget", str(cp))  # the forward one is finished: cut over
    assert forgot.returncode == 0, forgot.stderr
    assert not cp.exists() and back.exists() and str(back) in _listed()
