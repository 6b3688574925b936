"""--target delta:PATH / iceberg:PATH against the real servers, read back with deltalake and pyiceberg."""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pymongo
import pytest
from bson import decode

from replicator.bsonkit.rawbson import RAW_CODEC
from replicator.sinks.lake.tables import id_json
from tests.support.corpus import load_corpus
from tests.support.lake import collections, duplicate_changes, read_table, source_bytes, state_bytes
from tests.support.workload import random_workload

pytestmark = pytest.mark.integration

KINDS = ("delta", "iceberg")


def _mcdc(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "replicator.cli", *args, "--no-progress"], capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip


def _tail(source: str, target: str, cp: Path) -> subprocess.Popen[str]:
    args = [sys.executable, "-m", "replicator.cli", "tail", "-s", source, "-t", target, "-c", str(cp), "--no-progress"]
    args += ["--retry-initial-delay", "0.2", "--retry-max-delay", "1"]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _assert_state_equals_source(kind: str, root: Path, source: str, dbs: list[str]) -> None:
    for db in dbs:
        for coll in collections(source, db):
            expected = source_bytes(source, db, coll)
            got = state_bytes(kind, root, db, coll)
            assert got == expected, f"{db}.{coll}: {len(got)} rows in the state table, {len(expected)} on the source"
            table = read_table(kind, root, "state", db, coll)
            if table is not None:  # the merge key is the _id of the row's own document
                for key, raw in zip(table["_id"].to_pylist(), table["bson"].to_pylist(), strict=True):
                    assert key == id_json(decode(raw, RAW_CODEC)["_id"])


@pytest.mark.parametrize(
    ("kind", "columns"), [("delta", "lossless"), ("iceberg", "lossless"), ("delta", "typed"), ("iceberg", "typed")]
)
def test_sync_of_the_mixed_corpus_leaves_each_state_table_byte_identical(
    kind: str, columns: str, source_uri: str, tmp_path: Path
) -> None:
    with pymongo.MongoClient(source_uri) as client:
        load_corpus(client, mixed_count=500)
    root = tmp_path / "lake"
    done = _mcdc("sync", "-s", source_uri, "-t", f"{kind}:{root}", "-c", str(tmp_path / "cp.json"),
                 "--partition-docs", "200", "--split", "always", "--lake-columns", columns)  # fmt: skip
    assert done.returncode == 0, done.stderr
    _assert_state_equals_source(kind, root, source_uri, ["corpus", "corpus_other"])
    if columns == "typed":  # every BSON type of the corpus in a column of its own, or as Extended JSON
        types = read_table(kind, root, "state", "corpus", "types")
        assert types is not None and len(types.column_names) > 6
    changes = read_table(kind, root, "changes", "corpus", "mixed_ids")
    assert changes is not None and changes.num_rows == 500 and set(changes["op"].to_pylist()) == {"r"}
    assert read_table(kind, root, "state", "corpus", "validated_view") is None  # a view holds no documents
    if kind == "delta":
        _read_as_the_docs_show(root / "state" / "corpus" / "mixed_ids", 500)
    # a second sync under the same checkpoint adds nothing; catch-up after writes merges them in
    with pymongo.MongoClient(source_uri) as client:
        client.corpus.mixed_ids.delete_many({"_id": {"$type": "int"}})
        client.corpus.capped.update_one({"_id": 3}, {"$set": {"seq": -3}})
        client.corpus_other.things.insert_one({"_id": "new", "v": "x"})
    again = _mcdc("catch-up", "-s", source_uri, "-t", f"{kind}:{root}", "-c", str(tmp_path / "cp.json"),
                  "--lake-columns", columns)  # fmt: skip
    assert again.returncode == 0, again.stderr
    _assert_state_equals_source(kind, root, source_uri, ["corpus", "corpus_other"])


def _read_as_the_docs_show(path: Path, rows: int) -> None:
    """docs/how-to/lake.md's Python block, as written, on a state table mcdc wrote (its path put in)."""
    page = (Path(__file__).resolve().parent.parent / "docs" / "how-to" / "lake.md").read_text()
    (block,) = re.findall(r"```python\n(.*?)```", page, re.S)
    names: dict[str, Any] = {}
    exec(block.replace("/data/lake/state/shop/orders", str(path)), names)  # the docs' own code
    assert len(names["frame"]) == rows and names["table"].height == rows and len(names["rows"]) == rows


@pytest.mark.parametrize("kind", KINDS)
def test_kill_9_of_a_tail_three_times_then_catch_up_leaves_no_duplicate_and_equal_state(
    kind: str, source_uri: str, tmp_path: Path
) -> None:
    root, cp = tmp_path / "lake", tmp_path / "cp.json"
    target = f"{kind}:{root}"
    with pymongo.MongoClient(source_uri) as client:
        client.work.a.insert_many([{"_id": i, "v": 0} for i in range(100)])
    proc = _tail(source_uri, target, cp)
    # the stream's position is captured (and saved) before the first writes, so that the change tables must
    # hold their events, however long a loaded machine takes to start mcdc
    deadline = time.monotonic() + 120
    while not cp.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the tail saved no checkpoint"
        time.sleep(0.1)
    for seed in range(3):
        random_workload(source_uri, 120, seed)  # CRUD, transactions, renames, drops, a capped collection
        time.sleep(random.Random(seed).uniform(0.5, 2.0))
        proc.kill()
        proc.wait()
        proc = _tail(source_uri, target, cp)
    random_workload(source_uri, 60, 99)
    time.sleep(1.0)
    proc.kill()
    proc.wait()
    done = _mcdc("catch-up", "-s", source_uri, "-t", target, "-c", str(cp))
    assert done.returncode == 0, done.stderr
    _assert_state_equals_source(kind, root, source_uri, ["work"])
    for coll in collections(source_uri, "work"):
        changes = read_table(kind, root, "changes", "work", coll)
        assert changes is not None and changes.num_rows > 0
        assert duplicate_changes(changes) == [], coll
    a = read_table(kind, root, "changes", "work", "a")
    assert a is not None and {"c", "u", "d"} <= set(a["op"].to_pylist())
    renamed = read_table(kind, root, "state", "work", "tmp0_renamed")
    assert renamed is None or renamed.num_rows == 0  # renamed, then dropped: its rows went, the history stays


def test_lake_errors_are_one_line(source_uri: str, tmp_path: Path) -> None:
    cp = str(tmp_path / "cp.json")
    with pymongo.MongoClient(source_uri) as client:
        client.app.users.insert_one({"_id": 1})
    empty = _mcdc("sync", "-s", source_uri, "-t", "delta:", "-c", cp)
    assert empty.returncode == 2 and "needs a path" in empty.stderr and "Traceback" not in empty.stderr
    blocker = tmp_path / "file"
    blocker.write_text("x")
    unwritable = _mcdc("sync", "-s", source_uri, "-t", f"delta:{blocker}/lake", "-c", cp)
    assert unwritable.returncode == 2 and "cannot write there" in unwritable.stderr, unwritable.stderr
    assert len(unwritable.stderr.strip().splitlines()) == 1
    # a table mcdc did not write, where mcdc's state table would go
    import pyarrow as pa
    from deltalake import write_deltalake

    foreign = tmp_path / "foreign"
    write_deltalake(str(foreign / "state" / "app" / "users"), pa.table({"_id": [1], "x": ["y"]}))
    refused = _mcdc("sync", "-s", source_uri, "-t", f"delta:{foreign}", "-c", str(tmp_path / "cp2.json"))
    assert refused.returncode == 2 and "mcdc did not write" in refused.stderr, refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    assert not (foreign / "changes").exists() or not list((foreign / "changes").rglob("*.parquet"))
    # without the lake extra: deltalake made unimportable in the child
    code = (
        "import sys; sys.modules['deltalake'] = None; from replicator.cli import main; "
        f"sys.argv = ['mcdc', 'sync', '-s', {source_uri!r}, '-t', 'delta:{tmp_path}/x', '-c', {cp!r}]; main()"
    )
    missing = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                             env={**os.environ})  # fmt: skip
    assert missing.returncode == 2 and "pip install 'mcdc[lake]'" in missing.stderr, missing.stderr


@pytest.mark.parametrize("kind", KINDS)
def test_the_id_key_sorts_and_joins_in_the_ids_own_order(kind: str, source_uri: str, tmp_path: Path) -> None:
    """`_id` (canonical Extended JSON, the lossless key) sorts 0, 1, 10; `_id_key` is the `_id` in its own
    type where a collection's `_id`s share one: integers sort as numbers, ObjectIds and strings as MongoDB
    sorts them."""
    import datetime

    import duckdb
    from bson import Int64, ObjectId

    oids = sorted(ObjectId() for _ in range(5))
    with pymongo.MongoClient(source_uri) as client:
        client.keys.ints.insert_many([{"_id": i} for i in (10, 1, 0, 2)] + [{"_id": Int64(11)}])
        client.keys.oids.insert_many([{"_id": o} for o in reversed(oids)])
        client.keys.strs.insert_many([{"_id": s} for s in ("b", "a", "ab")])
        client.keys.dates.insert_many([{"_id": datetime.datetime(2026, 1, d, tzinfo=datetime.UTC)} for d in (3, 1, 2)])
        client.keys.mixed.insert_many([{"_id": 1}, {"_id": "one"}])
    root = tmp_path / "lake"
    done = _mcdc("sync", "-s", source_uri, "-t", f"{kind}:{root}", "-c", str(tmp_path / "cp.json"))
    assert done.returncode == 0, done.stderr
    with pymongo.MongoClient(source_uri) as client:  # a catch-up's merges keep it too
        client.keys.ints.insert_one({"_id": 3})
    again = _mcdc("catch-up", "-s", source_uri, "-t", f"{kind}:{root}", "-c", str(tmp_path / "cp.json"))
    assert again.returncode == 0, again.stderr

    def ordered(coll: str) -> list[Any]:
        state = read_table(kind, root, "state", "keys", coll)  # DuckDB finds it by its name
        assert state is not None
        return [r[0] for r in duckdb.sql("SELECT _id_key FROM state ORDER BY _id_key").fetchall()]

    assert ordered("ints") == [0, 1, 2, 3, 10, 11]
    assert ordered("oids") == [str(o) for o in oids]
    assert ordered("strs") == ["a", "ab", "b"]
    assert [d.day for d in ordered("dates")] == [1, 2, 3]
    assert sorted(ordered("mixed")) == sorted([id_json(1), id_json("one")])  # several types: Extended JSON
