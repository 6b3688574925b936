"""The lake sink on real tables (deltalake and pyiceberg on a local directory), fed events directly: batches
applied twice, DDL, compaction."""

from __future__ import annotations

from pathlib import Path

import bson
import pytest
from bson.timestamp import Timestamp

from replicator.events import ChangeEvent, CollectionSpec, Namespace, Op, Position
from replicator.events.normalize import snapshot_read
from replicator.settings.resolve import resolve
from replicator.sinks.lake.sink import LakeSink
from tests.support.lake import duplicate_changes, read_table

KINDS = ("delta", "iceberg")
A, B = Namespace("d", "a"), Namespace("d", "b")


def _sink(kind: str, root: Path, *extra: tuple[str, object]) -> LakeSink:
    settings = resolve({"source": "mongodb://a:1", "target": f"{kind}:{root}", **dict(extra)}, env={})
    return LakeSink(settings.target, settings)


def _at(t: int, i: int = 1) -> Position:
    return Position({"_data": f"{t:08x}{i:08x}"}, Timestamp(t, i))


def _insert(ns: Namespace, _id: int, t: int, v: int = 0) -> ChangeEvent:
    doc = bson.decode(bson.encode({"_id": _id, "v": v}))
    return ChangeEvent(op=Op.INSERT, ns=ns, key={"_id": _id}, document=doc, position=_at(t))


def _ids(kind: str, root: Path, ns: Namespace) -> list[int]:
    table = read_table(kind, root, "state", ns.db, str(ns.coll))
    return sorted(bson.decode(b)["_id"] for b in table["bson"].to_pylist()) if table is not None else []


@pytest.mark.parametrize("kind", KINDS)
async def test_a_batch_applied_twice_adds_nothing_and_ddl_moves_and_empties_rows(kind: str, tmp_path: Path) -> None:
    root = tmp_path / "lake"
    sink = _sink(kind, root)
    async with sink:
        await sink.prepare([CollectionSpec(A, "collection", {})], drop_existing=False)
        await sink.write([snapshot_read(A, {"_id": 0, "v": 0}), snapshot_read(A, {"_id": 1, "v": 0})])
        await sink.write([snapshot_read(A, {"_id": 1, "v": 0})])  # a partition copied again after a kill
        await sink.finish_snapshot([CollectionSpec(A, "collection", {})])
        batch = [_insert(A, 2, 10), ChangeEvent(op=Op.DELETE, ns=A, key={"_id": 0}, position=_at(11))]
        await sink.write(batch)
        await sink.write(batch)  # a retried batch
        changes = read_table(kind, root, "changes", "d", "a")
        assert changes is not None and duplicate_changes(changes) == [] and changes.num_rows == 4
        assert _ids(kind, root, A) == [1, 2]
        rename = ChangeEvent(op=Op.RENAME, ns=A, to=B, position=_at(12))
        await sink.write([rename])
        await sink.write([rename])  # again: b already covers it, a is already empty
        assert _ids(kind, root, B) == [1, 2] and _ids(kind, root, A) == []
        await sink.write([_insert(B, 9, 13), ChangeEvent(op=Op.DROP, ns=B, position=_at(14))])
        assert _ids(kind, root, B) == []
        history = read_table(kind, root, "changes", "d", "b")
        assert history is not None  # the history stays
        rows = sorted(history.to_pylist(), key=lambda r: tuple(r["sequence"].values()))
        assert [r["op"] for r in rows] == ["c", "drop"]


@pytest.mark.parametrize("kind", KINDS)
async def test_small_files_are_compacted_every_n_commits(kind: str, tmp_path: Path) -> None:
    root = tmp_path / "lake"
    sink = _sink(kind, root, ("lake_compact_every", 4))
    async with sink:
        for t in range(8):
            await sink.write([_insert(A, t, 100 + t)])
    assert _ids(kind, root, A) == list(range(8))
    if kind == "delta":
        from deltalake import DeltaTable

        files = len(DeltaTable(str(root / "changes" / "d" / "a")).file_uris())
    else:
        from pyiceberg.catalog.sql import SqlCatalog

        catalog = SqlCatalog("mcdc", uri=f"sqlite:///{root}/catalog.db", warehouse=root.as_uri())
        files = len(catalog.load_table(("d_changes", "a")).inspect.files())
    assert files < 8, f"{files} files after 8 commits with compaction every 4"


@pytest.mark.parametrize("kind", KINDS)
async def test_a_spark_task_writes_files_that_only_the_drivers_commit_makes_visible(kind: str, tmp_path: Path) -> None:
    root = tmp_path / "lake"
    driver = _sink(kind, root)
    async with driver:
        await driver.prepare([CollectionSpec(A, "collection", {})], drop_existing=False)
        task = _sink(kind, root)  # as on an executor
        async with task:
            assert task.stage()
            await task.write([snapshot_read(A, {"_id": i}) for i in range(5)])
            await task.write([snapshot_read(A, {"_id": i}) for i in range(5, 8)])
        staged = task.staged()
        assert sorted(ref.kind for ref, _ in staged) == ["changes", "state"]  # one file per table
        assert _ids(kind, root, A) == []  # written, not committed: no reader sees them
        await driver.commit_staged(staged)
    assert _ids(kind, root, A) == list(range(8))
    changes = read_table(kind, root, "changes", "d", "a")
    assert changes is not None and changes.num_rows == 8


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("engine", ["asyncio", "spark", "spark-direct"])
@pytest.mark.parametrize("columns", ["lossless", "typed"])
async def test_a_copy_resumed_onto_rows_already_there_writes_none_twice(
    kind: str, engine: str, columns: str, tmp_path: Path
) -> None:
    """A restored checkpoint of an unfinished snapshot, on a lake whose snapshot was finished since: the
    resumed run copies the collection again. Killed before its finish_snapshot, then followed by a
    checkpoint whose snapshot is done (no finish_snapshot ever again), it must have added no row twice."""
    root = tmp_path / "lake"
    spec = CollectionSpec(A, "collection", {})
    docs = [snapshot_read(A, {"_id": i, "v": 0, "name": f"n{i}"}) for i in range(6)]
    option = ("lake_columns", columns)
    async with _sink(kind, root, option) as first:
        await first.prepare([spec], drop_existing=True)
        await first.write(docs)
        await first.finish_snapshot([spec])
        await first.write([_insert(A, 6, 10)])
    async with _sink(kind, root, option) as resumed:  # prepares nothing: the checkpoint says A was prepared
        if engine == "asyncio":
            await resumed.write(docs[:4])
        else:
            async with _sink(kind, root, option, ("engine", "spark")) as task:  # as on an executor
                if engine == "spark-direct":  # a lake whose tasks commit their own writes (an object store)
                    task.backend.stages = False
                task.stage(appends=resumed.copies_append(A))
                await task.write(docs[:4])
            await resumed.commit_staged(task.staged())
    assert _ids(kind, root, A) == list(range(7))
    changes = read_table(kind, root, "changes", "d", "a")
    assert changes is not None and duplicate_changes(changes) == []
    assert sum(row["op"] == "r" for row in changes.to_pylist()) == 6


@pytest.mark.parametrize("mode", ["updateLookup", "default"])
async def test_an_update_without_its_document_applies_its_delta_to_the_row(mode: str, tmp_path: Path) -> None:
    from replicator.events import UpdateDescription

    root = tmp_path / "lake"
    sink = _sink("delta", root, ("full_document", mode))
    delta = UpdateDescription(updated_fields={"v": 7}, removed_fields=(), truncated_arrays=())  # type: ignore[arg-type]
    async with sink:
        await sink.write([_insert(A, 1, 10)])
        await sink.write([ChangeEvent(op=Op.UPDATE, ns=A, key={"_id": 1}, update=delta, position=_at(11))])
    table = read_table("delta", root, "state", "d", "a")
    assert table is not None and [bson.decode(b) for b in table["bson"].to_pylist()] == [
        {"_id": 1, "v": 7}  # also under updateLookup: the lookup may have met another collection of that name
    ]


@pytest.mark.parametrize("kind", KINDS)
async def test_typed_columns_follow_the_fields_types_and_turn_mixed_fields_into_extended_json(
    kind: str, tmp_path: Path
) -> None:
    import datetime

    from bson.int64 import Int64

    root = tmp_path / "lake"
    when = datetime.datetime(2024, 5, 1, 12, 0, tzinfo=datetime.UTC)

    def doc(**fields: object) -> ChangeEvent:
        raw = bson.decode(bson.encode(fields))
        return ChangeEvent(
            op=Op.INSERT, ns=A, key={"_id": fields["_id"]}, document=raw, position=_at(20 + fields["_id"])
        )  # type: ignore[operator]

    def columns() -> dict[str, list[object]]:
        table = read_table(kind, root, "state", "d", "a")
        assert table is not None
        rows = sorted(table.to_pylist(), key=lambda r: r["_id"])
        return {name: [r[name] for r in rows] for name in table.column_names}

    async with _sink(kind, root, ("lake_columns", "typed")) as sink:
        await sink.write([doc(_id=1, n=1, s="x", d=when, sub={"a": 1}, **{"a b": True, "bson": "clash"})])
        first = columns()
        assert first["n"] == [1] and first["s"] == ["x"] and first["a_b"] == [True] and first["bson_"] == ["clash"]
        assert first["d"][0] == when and first["sub"] == ['{"a":{"$numberInt":"1"}}']
        await sink.write([doc(_id=2, n="two")])  # n is now of two types: Extended JSON for every row
        assert columns()["n"] == ['{"$numberInt":"1"}', '"two"']
    async with _sink(kind, root, ("lake_columns", "typed")) as again:  # a later run knows n is JSON
        await again.write([doc(_id=3, n=3, z=Int64(5))])
    last = columns()
    assert last["n"][2] == '{"$numberInt":"3"}' and last["z"] == [None, None, 5]
    assert [bson.decode(b)["_id"] for b in last["bson"]] == [1, 2, 3]  # the lossless columns stay


@pytest.mark.parametrize("kind", KINDS)
async def test_on_spark_the_driver_writes_the_typed_columns_once_the_tasks_copied_the_documents(
    kind: str, tmp_path: Path
) -> None:
    root = tmp_path / "lake"
    spec = CollectionSpec(A, "collection", {})
    typed = (("lake_columns", "typed"), ("engine", "spark"))
    async with _sink(kind, root, *typed) as driver:
        await driver.prepare([spec], drop_existing=False)
        staged = []
        for part, values in enumerate(([1, 2], ["three"])):  # two tasks, each sees one type of n
            async with _sink(kind, root, *typed) as task:
                task.stage()
                await task.write([snapshot_read(A, {"_id": f"{part}-{i}", "n": v}) for i, v in enumerate(values)])
            staged += task.staged()
        await driver.commit_staged(staged)
        await driver.finish_snapshot([spec])
    table = read_table(kind, root, "state", "d", "a")
    assert table is not None
    rows = sorted(table.to_pylist(), key=lambda r: r["_id"])
    assert [r["n"] for r in rows] == ['{"$numberInt":"1"}', '{"$numberInt":"2"}', '"three"']  # mixed: JSON


async def test_a_view_gets_no_tables(tmp_path: Path) -> None:
    root = tmp_path / "lake"
    view = Namespace("d", "v")
    async with _sink("delta", root) as sink:
        create = ChangeEvent(op=Op.CREATE, ns=view, ddl={"viewOn": "a", "pipeline": []}, position=_at(30))
        await sink.write([create, ChangeEvent(op=Op.DROP, ns=view, position=_at(31))])
    assert (
        read_table("delta", root, "state", "d", "v") is None and read_table("delta", root, "changes", "d", "v") is None
    )


async def test_a_lost_commit_race_is_retried_and_a_schema_mismatch_stops_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deltalake.exceptions import CommitFailedError, SchemaMismatchError

    from replicator.errors import SinkError, SinkUnavailable

    sink = _sink("delta", tmp_path / "lake")
    async with sink:
        for raised, expected in ((CommitFailedError("version 3 already exists"), SinkUnavailable),
                                 (SchemaMismatchError("cannot cast\nat column x"), SinkError)):  # fmt: skip

            def fail(*args: object, error: Exception = raised) -> None:
                raise error

            monkeypatch.setattr(sink.backend, "append", fail)
            with pytest.raises(expected) as caught:
                await sink.write([_insert(A, 1, 40)])
            assert type(caught.value) is expected and "\n" not in str(caught.value)
            assert str(caught.value).startswith(f"delta:{tmp_path / 'lake'}: ")


@pytest.mark.parametrize("kind", KINDS)
async def test_two_shards_events_at_one_cluster_time_cut_between_batches_are_all_written(
    kind: str, tmp_path: Path
) -> None:
    """Two shards can stamp the same cluster time: a batch that ends after one shard's event must not make
    the other shard's event at that time look written already (the merged reader's size cap can cut there)."""
    root = tmp_path / "lake"

    def on(shard: str, _id: int, n: int = 0) -> ChangeEvent:
        doc = bson.decode(bson.encode({"_id": _id}))
        position = Position({"_data": f"{shard}{n}"}, Timestamp(50, 1), n, shard)
        return ChangeEvent(op=Op.INSERT, ns=A, key={"_id": _id}, document=doc, position=position)

    async with _sink(kind, root) as sink:
        await sink.write([on("shard-a", 1), on("shard-a", 2, 1)])
        await sink.write([on("shard-b", 3)])  # the same cluster time, another shard, the next batch
        await sink.write([on("shard-a", 2, 1), on("shard-b", 3), on("shard-b", 4, 1)])  # applied again, and one more
    assert _ids(kind, root, A) == [1, 2, 3, 4]
    changes = read_table(kind, root, "changes", "d", "a")
    assert changes is not None and duplicate_changes(changes) == [] and changes.num_rows == 4


@pytest.mark.parametrize("kind", KINDS)
def test_targets_checked_at_once_by_several_processes_are_all_writable(kind: str, tmp_path: Path) -> None:
    """Spark tasks start a sink each, and each checks that the lake is writable at the same moment: one's
    probe file is not the other's (soak seed 2601: 'cannot write there: No such file or directory')."""
    import threading

    backends = [_sink(kind, tmp_path / "lake").backend for _ in range(4)]
    backends[0].check_writable()  # the driver's, first (it makes an Iceberg lake's catalog)
    errors: list[BaseException] = []

    def check(backend: object) -> None:
        try:
            for _ in range(300):
                backend.check_writable()  # type: ignore[attr-defined]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=check, args=(b,)) for b in backends]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
