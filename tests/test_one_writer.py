"""One writer per target, however it is named (issue 49, item 6): a MongoDB target is known by what its
server says it is, not by how a URI spells its host; a JSON-lines file by its real path (a symlink, another
--topic-prefix: the same file); and an overlap two migrations' selections make later, by a collection
created or renamed on a source, stops the run that would write the other's namespace, in one line, rather
than dropping or mixing the other's copy. Against the real servers (two sources, one target)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pymongo
import pytest

from tests.support.cli import mcdc, one_line_error

pytestmark = pytest.mark.integration


def _fill(uri: str, ns: str, count: int, **fields: object) -> None:
    db, _, coll = ns.partition(".")
    with pymongo.MongoClient(uri) as client:
        client[db][coll].insert_many([{"_id": i, **fields} for i in range(count)])


def _ids(uri: str, ns: str) -> list[object]:
    db, _, coll = ns.partition(".")
    with pymongo.MongoClient(uri) as client:
        return sorted(d["_id"] for d in client[db][coll].find())


def test_a_target_named_by_another_host_name_is_the_same_target(
    source_uri: str, own_source: str, target_uri: str
) -> None:
    _fill(source_uri, "shop.orders", 100, side="one")
    _fill(own_source, "shop.orders", 50, side="two")
    assert mcdc("sync", "-s", source_uri, "-t", target_uri, "--no-progress").returncode == 0  # resumable
    host = socket.gethostname()  # this machine's name: another spelling of the target's 127.0.0.1
    if "127.0.0.1" not in target_uri or socket.gethostbyname(host) != "127.0.0.1":
        pytest.skip(f"the target is not on 127.0.0.1, or this machine's name {host} is not another name of it")
    aliased = target_uri.replace("127.0.0.1", host)
    second = mcdc("sync", "-s", own_source, "-t", aliased, "--drop-target", "--no-progress")
    one_line_error(second, 2, "shop.orders", "written by another migration")
    assert _ids(target_uri, "shop.orders") == list(range(100))
    verified = mcdc("verify", "-s", source_uri, "-t", target_uri)
    assert verified.returncode == 0, verified.stdout + verified.stderr


@pytest.mark.parametrize("spelling", ["symlink", "topic-prefix"])
def test_one_json_lines_file_named_twice_is_one_target(
    source_uri: str, own_source: str, tmp_path: Path, spelling: str
) -> None:
    _fill(source_uri, "shop.orders", 100)
    _fill(own_source, "crm.people", 10)  # another selection: no namespace shared, yet one file
    path = tmp_path / "events.jsonl"
    assert mcdc("sync", "-s", source_uri, "-t", f"jsonl:{path}", "--no-progress").returncode == 0
    before = path.read_bytes()
    assert len(before.splitlines()) == 100
    other = f"jsonl:{path}"
    extra: tuple[str, ...] = ("--topic-prefix", "other")
    if spelling == "symlink":
        (tmp_path / "link.jsonl").symlink_to(path)
        other, extra = f"jsonl:{tmp_path / 'link.jsonl'}", ()
    second = mcdc("sync", "-s", own_source, "-t", other, *extra, "--drop-target", "--no-progress")
    one_line_error(second, 2, str(path), "another migration", "give this one a file of its own")
    assert path.read_bytes() == before
    own = mcdc("sync", "-s", own_source, "-t", f"jsonl:{tmp_path / 'own.jsonl'}", *extra, "--no-progress")
    assert own.returncode == 0, own.stderr  # the advice: a file of its own
    assert len((tmp_path / "own.jsonl").read_bytes().splitlines()) == 10 and path.read_bytes() == before


def _tail(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "replicator.cli", "tail", *args, "--no-progress"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _replaying(cp: Path, tail: subprocess.Popen[str]) -> None:
    """Wait until ``tail`` has saved its checkpoint past its snapshot (it follows the stream then)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert tail.poll() is None, tail.communicate()[1][-3000:]
        try:
            if json.loads(cp.read_text())["snapshot"]["status"] == "done":
                return
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"{cp}: the tail never finished its snapshot")


def _ended(tail: subprocess.Popen[str]) -> subprocess.CompletedProcess[str]:
    try:
        _, err = tail.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        tail.send_signal(signal.SIGTERM)
        _, err = tail.communicate(timeout=30)
    return subprocess.CompletedProcess(tail.args, tail.returncode, "", err)


@pytest.mark.parametrize("first", ["create", "rename"])
def test_an_overlap_made_later_stops_the_tail_that_would_write_the_other_s_namespace(
    source_uri: str, own_source: str, target_uri: str, tmp_path: Path, first: str
) -> None:
    """Tail A follows shop\\.a.* of S1 (shop.a1), tail B shop\\..*2 of S2 (shop.b2): no namespace shared when
    they start. Then S2 creates shop.a2 and S1 renames shop.a1 to shop.a2, in either order: each tail that
    meets such DDL stops in one line, and neither's copy is dropped or mixed with the other's."""
    _fill(source_uri, "shop.a1", 100, side="A")
    _fill(own_source, "shop.b2", 10, side="B")
    cp_a, cp_b = tmp_path / "a.json", tmp_path / "b.json"
    tail_a = _tail("-s", source_uri, "-t", target_uri, "--include", "shop\\.a.*", "-c", str(cp_a))
    tail_b = _tail("-s", own_source, "-t", target_uri, "--include", "shop\\..*2", "-c", str(cp_b))
    try:
        _replaying(cp_a, tail_a)
        _replaying(cp_b, tail_b)
        steps = {
            "create": (tail_b, lambda: _fill(own_source, "shop.a2", 5, side="B")),
            "rename": (tail_a, lambda: _rename(source_uri)),
        }
        for step in ["create", "rename"] if first == "create" else ["rename", "create"]:
            tail, ddl = steps[step]
            ddl()
            one_line_error(_ended(tail), 2, "shop.a2", "another migration")
    finally:
        for tail in (tail_a, tail_b):
            if tail.poll() is None:
                tail.kill()
                tail.communicate()
    assert _ids(target_uri, "shop.a1") == list(range(100))  # A's copy as it was
    assert _ids(target_uri, "shop.b2") == list(range(10))  # B's copy as it was
    with pymongo.MongoClient(target_uri) as client:
        assert "a2" not in client.shop.list_collection_names()  # neither wrote the namespace both select
    # the advice: narrow one selection (B's, on its checkpoint), so that only A writes shop.a2; both go on
    narrowed = mcdc("catch-up", "-s", own_source, "-t", target_uri, "-c", str(cp_b), "--include", "shop\\.b2")
    assert narrowed.returncode == 0, narrowed.stderr
    a = ("-s", source_uri, "-t", target_uri, "--include", "shop\\.a.*")
    assert mcdc("catch-up", *a, "-c", str(cp_a), "--no-progress").returncode == 0
    assert _ids(target_uri, "shop.a2") == list(range(100))
    for verify in (a, ("-s", own_source, "-t", target_uri, "--include", "shop\\.b2")):
        verified = mcdc("verify", *verify)
        assert verified.returncode == 0, verified.stdout + verified.stderr


def _rename(uri: str) -> None:
    with pymongo.MongoClient(uri) as client:
        client.shop.a1.rename("a2")
