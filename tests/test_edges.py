"""The edges between migrations: the way back after a cutover, a selection changed on a checkpoint (named or
not), and two migrations that would write one target namespace. Each piece of advice mcdc prints here is
followed, and the test ends with ``mcdc verify`` exit 0."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pymongo
import pytest

from tests.test_cli import _assert_one_line_error, _mcdc

pytestmark = pytest.mark.integration


def _ok(*args: str) -> subprocess.CompletedProcess[str]:
    done = _mcdc(*args, "--no-progress", timeout=180)
    assert done.returncode == 0, (args[0], done.stderr)
    return done


def _verify(source: str, target: str, *selection: str) -> None:
    done = _mcdc("verify", "-s", source, "-t", target, *selection, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def _until(what: str, condition: Callable[[], Any], timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _has(uri: str, db: str, coll: str, _id: Any) -> bool:
    with pymongo.MongoClient(uri) as client:
        return client[db][coll].find_one({"_id": _id}) is not None


def _default_checkpoints() -> list[Path]:
    return sorted((Path(os.environ["XDG_STATE_HOME"]) / "mcdc").glob("checkpoint-*.json"))


def _docs(uri: str, db: str, coll: str) -> list[dict[str, Any]]:
    with pymongo.MongoClient(uri) as client:
        return list(client[db][coll].find().sort("_id"))


# ------------------------------------------------------------------------------------------ the way back


def test_the_printed_way_back_follows_the_migrations_selection_and_leaves_other_namespaces_alone(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    """sync and cutover of ``a\\..*``; the way back, run exactly as printed, carries the new side's writes to
    ``a`` back and never touches ``other.keep``, which the migration did not select, on either side."""
    cp, back = tmp_path / "mig.json", tmp_path / "back.json"
    selection = ("--include", r"a\..*")
    with pymongo.MongoClient(source_uri) as old, pymongo.MongoClient(target_uri) as new:
        old.a.x.insert_many([{"_id": i, "v": i} for i in range(100)])
        old.other.keep.insert_many([{"_id": i, "old": True} for i in range(50)])
        new.other.keep.insert_many([{"_id": i, "new": True} for i in range(5)])  # another application's, there
        old.elsewhere.t.insert_one({"_id": "old"})
        new.elsewhere.t.insert_one({"_id": "new"})
    _ok("sync", "-s", source_uri, "-t", target_uri, "-c", str(cp), *selection)
    cut = _ok(
        "cutover", "-s", source_uri, "-t", target_uri, "-c", str(cp), "--reverse-checkpoint", str(back), *selection
    )
    command = cut.stdout.strip().splitlines()[-1].strip()
    assert command.startswith("mcdc tail ") and r"a\..*" in command, cut.stdout
    argv = [sys.executable, "-m", "replicator.cli", *shlex.split(command)[1:], "--no-progress"]
    tail = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        with pymongo.MongoClient(target_uri) as new:  # the application writes to the new side now
            new.a.x.update_one({"_id": 1}, {"$set": {"v": "new side"}})
            new.a.y.insert_one({"_id": "created on the new side"})
            new.other.keep.insert_one({"_id": "theirs"})
            new.other.keep.drop()
            new.other.gone.insert_one({"_id": 1})
            new.other.gone.rename("keep")
            new.drop_database("elsewhere")
            new.a.x.insert_one({"_id": "last"})  # selected: once it is on the old side, so is all before it
        _until("the way back past the new side's writes", lambda: _has(source_uri, "a", "x", "last"))
    finally:
        tail.send_signal(signal.SIGTERM)
        _, stderr = tail.communicate(timeout=60)
    assert tail.returncode == 0, stderr
    assert _docs(source_uri, "other", "keep") == [{"_id": i, "old": True} for i in range(50)]
    assert _docs(source_uri, "elsewhere", "t") == [{"_id": "old"}]
    assert _docs(source_uri, "a", "x")[1] == {"_id": 1, "v": "new side"}
    _verify(target_uri, source_uri, *selection)


def test_a_way_back_with_another_selection_is_refused(source_uri: str, target_uri: str, tmp_path: Path) -> None:
    cp, back = tmp_path / "mig.json", tmp_path / "back.json"
    with pymongo.MongoClient(source_uri) as old:
        old.a.x.insert_many([{"_id": i} for i in range(10)])
        old.other.keep.insert_many([{"_id": i} for i in range(10)])
    _ok("sync", "-s", source_uri, "-t", target_uri, "-c", str(cp), "--include", r"a\..*", "--rename", "a=a2")
    _ok("cutover", "-s", source_uri, "-t", target_uri, "-c", str(cp), "--include", r"a\..*", "--rename", "a=a2",
        "--reverse-checkpoint", str(back))  # fmt: skip
    before = back.read_bytes()
    for other in ((), ("--include", r"other\..*"), ("--include", r"a2\..*", "--rename", "a2=other")):
        refused = _mcdc("catch-up", "-s", target_uri, "-t", source_uri, "-c", str(back), *other, "--no-progress")
        if not other:  # no selection at all: the way back takes its own from the checkpoint
            assert refused.returncode == 0, refused.stderr
            continue
        _assert_one_line_error(refused, 2, str(back), "way back")
    assert json.loads(back.read_text())["recorded"] == json.loads(before)["recorded"]
    with pymongo.MongoClient(target_uri) as new:
        new.a2.x.insert_one({"_id": "new"})
        new.other.keep.insert_one({"_id": "not ours"})
    _ok("catch-up", "-s", target_uri, "-t", source_uri, "-c", str(back), "--rename", "a2=a")  # as printed
    with pymongo.MongoClient(source_uri) as old:
        assert old.a.x.find_one({"_id": "new"}) is not None
        assert old.other.keep.count_documents({}) == 10
        assert "a2" not in old.list_database_names()
    _verify(target_uri, source_uri, "--include", r"a2\..*", "--rename", "a2=a")


# ------------------------------------------------------------------------------------- changed selections


def test_a_widened_named_checkpoint_refuses_target_data_it_never_wrote_and_drop_target_replaces_it(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    cp = tmp_path / "cp.json"
    with pymongo.MongoClient(source_uri) as src:
        src.a.x.insert_many([{"_id": i} for i in range(20)])
        src.b.z.insert_many([{"_id": i, "from": "source"} for i in range(20)])
    _ok("sync", "-s", source_uri, "-t", target_uri, "-c", str(cp), "--include", r"a\..*")
    with pymongo.MongoClient(target_uri) as dst:
        dst.b.z.insert_one({"_id": "written by someone else"})
    wider = ("-s", source_uri, "-t", target_uri, "-c", str(cp), "--include", r"a\..*", "--include", r"b\..*")
    refused = _mcdc("catch-up", *wider, "--no-progress")
    _assert_one_line_error(refused, 2, "target", "b.z", "--drop-target")
    assert _docs(target_uri, "b", "z") == [{"_id": "written by someone else"}]
    _ok("catch-up", *wider, "--drop-target")  # the advice, followed
    _verify(source_uri, target_uri, "--include", r"a\..*", "--include", r"b\..*")


def test_a_widened_copy_killed_halfway_goes_on_without_a_refusal(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    """The namespaces a widened selection copies are this migration's from the moment their copy begins."""
    cp = tmp_path / "cp.json"
    with pymongo.MongoClient(source_uri) as src:
        src.a.x.insert_one({"_id": 1})
        src.b.z.insert_many([{"_id": i, "pad": "x" * 2000} for i in range(20_000)])
    _ok("sync", "-s", source_uri, "-t", target_uri, "-c", str(cp), "--include", r"a\..*")
    wider = ("-s", source_uri, "-t", target_uri, "-c", str(cp), "--include", r"a\..*", "--include", r"b\..*")
    argv = [sys.executable, "-m", "replicator.cli", "catch-up", *wider, "--no-progress", "--batch-docs", "100"]
    run = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with pymongo.MongoClient(target_uri) as dst:
        _until("a part of b.z copied", lambda: dst.b.z.estimated_document_count() >= 500 or run.poll() is not None)
    run.kill()
    run.wait(60)
    _ok("catch-up", *wider)
    _verify(source_uri, target_uri, "--include", r"a\..*", "--include", r"b\..*")


@pytest.mark.parametrize("changed", [(r"a\..*", r"b\..*"), (r"a\.x",)], ids=["widened", "narrowed"])
def test_a_changed_selection_without_its_checkpoint_names_the_migration_and_its_advice_converges(
    source_uri: str, target_uri: str, changed: tuple[str, ...]
) -> None:
    pair = ("-s", source_uri, "-t", target_uri)
    with pymongo.MongoClient(source_uri) as src:
        src.a.x.insert_many([{"_id": i, "v": 0} for i in range(10)])
        src.a.y.insert_many([{"_id": i} for i in range(10)])
        src.b.z.insert_many([{"_id": i} for i in range(10)])
    _ok("sync", *pair, "--include", r"a\..*")
    (existing,) = _default_checkpoints()
    with pymongo.MongoClient(source_uri) as src:
        src.a.x.update_one({"_id": 1}, {"$set": {"v": 1}})
    includes = [arg for pattern in changed for arg in ("--include", pattern)]
    refused = _mcdc("catch-up", *pair, *includes, "--no-progress")
    _assert_one_line_error(refused, 2, str(existing), "--checkpoint")
    assert _default_checkpoints() == [existing]  # nothing saved for the refused run
    _ok("catch-up", *pair, "-c", str(existing), *includes)  # the advice, followed
    _verify(source_uri, target_uri, *includes)


def test_cutover_with_source_and_target_alone_cuts_over_the_pairs_one_migration(
    source_uri: str, target_uri: str
) -> None:
    pair = ("-s", source_uri, "-t", target_uri)
    with pymongo.MongoClient(source_uri) as src:
        src.a.x.insert_many([{"_id": i} for i in range(10)])
        src.other.keep.insert_many([{"_id": i} for i in range(10)])  # not selected: never on the target
    _ok("sync", *pair, "--include", r"a\..*")
    done = _ok("cutover", *pair, "--json")
    assert json.loads(done.stdout)["documents"] == 10


# -------------------------------------------------------------------------- one writer per target namespace


@pytest.fixture
def runs() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for run in started:
        if run.poll() is None:
            run.kill()
        run.communicate(timeout=60)


def test_two_tails_started_together_onto_one_target_namespace_one_is_refused(
    source_uri: str, target_uri: str, tmp_path: Path, runs: list[subprocess.Popen[str]]
) -> None:
    with pymongo.MongoClient(source_uri) as src:
        src.a.x.insert_many([{"_id": i} for i in range(500)])
        src.a.y.insert_many([{"_id": i} for i in range(10)])
    argv = [sys.executable, "-m", "replicator.cli", "tail", "-s", source_uri, "-t", target_uri, "--no-progress"]
    for name, pattern in (("wide", r"a\..*"), ("narrow", r"a\.x")):
        cp = tmp_path / f"{name}.json"
        runs.append(subprocess.Popen([*argv, "-c", str(cp), "--include", pattern], stderr=subprocess.PIPE, text=True))
    refused = _until("one tail refused", lambda: [run for run in runs if run.poll() is not None], timeout=120)
    (loser,) = refused
    (winner,) = [run for run in runs if run is not loser]
    _, stderr = loser.communicate(timeout=60)
    assert loser.returncode == 2, stderr
    other = "wide.json" if "narrow.json" in " ".join(loser.args) else "narrow.json"
    errors = [line for line in stderr.splitlines() if line.startswith("mcdc: error:")]
    assert len(errors) == 1 and other in errors[0] and "a.x" in errors[0], stderr
    with pymongo.MongoClient(source_uri) as src:
        src.a.x.insert_one({"_id": "later"})
    _until("the running tail past the last write", lambda: _has(target_uri, "a", "x", "later"))
    winner.send_signal(signal.SIGTERM)
    _, stderr = winner.communicate(timeout=60)
    assert winner.returncode == 0, stderr
    _verify(source_uri, target_uri, "--include", r"a\.x")


def test_a_second_migration_onto_a_namespace_a_stopped_one_writes_is_refused_and_a_disjoint_one_runs(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    """Migration A of ``a\\..*`` is stopped (resumable); B of ``a\\.x`` with --snapshot never is refused; C of
    ``b\\..*`` runs beside A. A source rename of a.x then reaches the target through A alone."""
    a, b, c = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"
    pair = ("-s", source_uri, "-t", target_uri)
    with pymongo.MongoClient(source_uri) as src:
        src.a.x.insert_many([{"_id": i} for i in range(500)])
        src.b.z.insert_many([{"_id": i} for i in range(10)])
    _ok("sync", *pair, "-c", str(a), "--include", r"a\..*")
    refused = _mcdc("catch-up", *pair, "-c", str(b), "--include", r"a\.x", "--snapshot", "never", "--no-progress")
    _assert_one_line_error(refused, 2, "target", "a.x", str(a))
    assert not b.exists()
    _ok("sync", *pair, "-c", str(c), "--include", r"b\..*")
    with pymongo.MongoClient(source_uri) as src:
        src.a.x.rename("x_old0")
    _ok("catch-up", *pair, "-c", str(a), "--include", r"a\..*")
    _ok("catch-up", *pair, "-c", str(c), "--include", r"b\..*")
    _verify(source_uri, target_uri)


def test_the_advice_to_a_second_migration_onto_anothers_namespaces_converges(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    """A migration of everything beside one of ``a\\..*``: refused, naming it; narrowed as the line says
    (``--exclude``), it runs, and the two together make the target the source."""
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    pair = ("-s", source_uri, "-t", target_uri)
    with pymongo.MongoClient(source_uri) as src:
        src.a.x.insert_many([{"_id": i} for i in range(50)])
        src.b.z.insert_many([{"_id": i} for i in range(50)])
    _ok("sync", *pair, "-c", str(a), "--include", r"a\..*")
    refused = _mcdc("sync", *pair, "-c", str(b), "--no-progress")
    _assert_one_line_error(refused, 2, "a.x", str(a), "--exclude")
    _ok("sync", *pair, "-c", str(b), "--exclude", r"a\..*")
    with pymongo.MongoClient(source_uri) as src:
        src.a.x.delete_one({"_id": 1})
        src.b.z.delete_one({"_id": 1})
    _ok("catch-up", *pair, "-c", str(a), "--include", r"a\..*")
    _ok("catch-up", *pair, "-c", str(b), "--exclude", r"a\..*")
    _verify(source_uri, target_uri)


def test_an_older_checkpoint_restored_after_a_widening_replays_without_a_refusal(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    """The widened selection's copies are this migration's own even for a checkpoint saved before the
    widening (a lost save): a catch-up from it copies them again, and the target ends the source."""
    cp = tmp_path / "cp.json"
    pair = ("-s", source_uri, "-t", target_uri, "-c", str(cp))
    with pymongo.MongoClient(source_uri) as src:
        src.a.x.insert_many([{"_id": i} for i in range(20)])
        src.b.z.insert_many([{"_id": i} for i in range(20)])
    _ok("sync", *pair, "--include", r"a\..*")
    before = cp.read_bytes()
    wider = ("--include", r"a\..*", "--include", r"b\..*")
    _ok("catch-up", *pair, *wider)
    with pymongo.MongoClient(source_uri) as src:
        src.b.z.delete_one({"_id": 3})
    cp.write_bytes(before)
    _ok("catch-up", *pair, *wider)
    _verify(source_uri, target_uri, *wider)


def test_a_copy_of_a_checkpoint_is_the_same_migration_and_never_runs_beside_it(
    source_uri: str, target_uri: str, tmp_path: Path, runs: list[subprocess.Popen[str]]
) -> None:
    """A checkpoint copied aside (a backup) goes on as its migration would, but not while a run goes on from
    the original: two runs of one migration would apply its events out of order."""
    cp, copy = tmp_path / "cp.json", tmp_path / "copy.json"
    pair = ("-s", source_uri, "-t", target_uri)
    with pymongo.MongoClient(source_uri) as src:
        src.a.x.insert_many([{"_id": i} for i in range(20)])
    _ok("sync", *pair, "-c", str(cp))
    copy.write_bytes(cp.read_bytes())
    with pymongo.MongoClient(source_uri) as src:
        src.a.x.delete_one({"_id": 1})
    _ok("catch-up", *pair, "-c", str(copy))
    argv = [sys.executable, "-m", "replicator.cli", "tail", *pair, "-c", str(cp), "--no-progress"]
    runs.append(subprocess.Popen(argv, stderr=subprocess.PIPE, text=True))
    with pymongo.MongoClient(source_uri) as src:
        src.a.x.insert_one({"_id": "last"})
    _until("the tail past the last write", lambda: _has(target_uri, "a", "x", "last"))
    refused = _mcdc("catch-up", *pair, "-c", str(copy), "--no-progress")
    _assert_one_line_error(refused, 2, str(copy), str(cp), "stop that one first")
    runs[0].send_signal(signal.SIGTERM)
    assert runs[0].wait(60) == 0
    _ok("catch-up", *pair, "-c", str(copy))
    _verify(source_uri, target_uri)
