"""The snapshot's last record without a server: which batch a sink that marks it (Debezium's ``snapshot:
last``) gets with ``last=True``, with concurrent workers, empty partitions, a failure and a resumed copy."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import pytest

from replicator.events import Namespace, Position
from replicator.observe.progress import LogReporter
from replicator.sinks.memory import MemorySink
from replicator.snapshot.copy import CopyLimits, copy_partitions
from replicator.source.partitions import ALL, Partition, Resume

SIZES = {"big": 95, "mid": 40, "empty": 0, "small": 3, "none": 0}  # documents per collection


class _Collections:
    """A fake read_partition: collection ``c`` holds ``_id``s 0..SIZES[c]-1, read in batches."""

    async def __call__(
        self, client: object, part: Partition, *, batch_docs: int, batch_bytes: int, after: Resume | None = None,
        reads: object = None,
    ) -> AsyncIterator[list[dict[str, Any]]]:  # fmt: skip
        n = SIZES[part.ns.coll or ""]
        for first in range(0, n, batch_docs):
            await asyncio.sleep(0)  # let the other workers run between batches
            yield [{"_id": i} for i in range(first, min(first + batch_docs, n))]


class _Marking(MemorySink):
    """Records each snapshot batch (namespace, first and last _id, ``last``); fails the batch ``fail_at``."""

    marks_snapshot_end = True

    def __init__(self, fail_at: tuple[str, int] | None = None) -> None:
        super().__init__()
        self.calls: list[tuple[str, int, int, bool]] = []
        self.fail_at = fail_at

    async def write_copy(
        self, ns: Namespace, documents: Sequence[Mapping[str, Any]], at: Position | None, *, last: bool = False
    ) -> None:
        await asyncio.sleep(0.001 * len(documents))  # bigger batches take longer: writes overlap
        if self.fail_at == (ns.coll, documents[0]["_id"]):
            raise ConnectionError("target went away")
        self.calls.append((ns.coll or "", documents[0]["_id"], documents[-1]["_id"], last))


async def _copy(
    monkeypatch: pytest.MonkeyPatch, sink: _Marking, names: Sequence[str], done: list[str], *, mark_last: bool = True,
    stop: asyncio.Event | None = None,
) -> None:  # fmt: skip
    import replicator.snapshot.copy as pipeline

    monkeypatch.setattr(pipeline, "read_partition", _Collections())

    async def on_done(part: Partition, docs: int) -> None:
        assert docs == SIZES[part.ns.coll or ""]  # the held batch counted too
        written = {i for coll, first, end, _ in sink.calls if coll == part.ns.coll for i in range(first, end + 1)}
        assert written == set(range(docs))  # done only once all of it is acknowledged
        done.append(part.ns.coll or "")
        if stop is not None:
            stop.set()  # a run told to stop: no partition starts after this one

    limits = CopyLimits(workers=3, batch_docs=10, batch_bytes=1 << 20, queue_batches=2)
    partitions = [Partition(Namespace("db", name), 0, ALL, estimated_docs=SIZES[name]) for name in names]
    await copy_partitions(
        None, sink, partitions, limits=limits, rename=lambda ns: ns, on_done=on_done,  # type: ignore[arg-type]
        reporter=LogReporter(), mark_last=mark_last, stop=stop,
    )  # fmt: skip


async def test_the_last_batch_written_is_the_only_one_marked_last_even_when_empty_partitions_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sink, done = _Marking(), []
    await _copy(monkeypatch, sink, list(SIZES), done)
    assert sorted(done) == sorted(SIZES)
    marked = [call for call in sink.calls if call[3]]
    assert marked == [sink.calls[-1]]  # one batch, written after every other
    coll, _, end, _ = marked[0]
    assert end == SIZES[coll] - 1  # a partition's final batch (the empty ones, read last, have none)
    assert sum(end - first + 1 for _, first, end, _ in sink.calls) == sum(SIZES.values())  # each document once


async def test_without_mark_last_or_a_marking_sink_no_batch_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    sink, done = _Marking(), []
    await _copy(monkeypatch, sink, list(SIZES), done, mark_last=False)  # a copy the stream's replay makes again
    assert sorted(done) == sorted(SIZES) and not any(call[3] for call in sink.calls)


async def test_a_failed_copy_marks_nothing_and_the_resumed_copy_marks_its_own_last(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    failing, done = _Marking(fail_at=("big", 60)), []
    with pytest.raises(ConnectionError):
        await _copy(monkeypatch, failing, list(SIZES), done)
    assert not any(call[3] for call in failing.calls) and "big" not in done
    # the next run copies what is not done (here whole partitions again): its last batch is marked
    resumed = _Marking()
    await _copy(monkeypatch, resumed, [name for name in SIZES if name not in done], done)
    assert sorted(done) == sorted(SIZES)
    assert [call for call in resumed.calls if call[3]] == [resumed.calls[-1]]


async def test_a_stopped_copy_writes_the_held_batch_unmarked(monkeypatch: pytest.MonkeyPatch) -> None:
    sink, done = _Marking(), []
    await _copy(monkeypatch, sink, list(SIZES), done, stop=asyncio.Event())
    left = set(SIZES) - set(done)
    assert left  # stopped before every partition was copied
    assert not any(call[3] for call in sink.calls)  # partitions left for the next run: this is not the end
    assert {call[0] for call in sink.calls} <= set(done)  # what was written is done (the held batch too)
