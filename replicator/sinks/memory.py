"""An in-memory sink for tests and dry runs: keeps every event it was given, in order."""

from __future__ import annotations

from collections.abc import Sequence

from replicator.events import ChangeEvent, CollectionSpec
from replicator.sinks.base import Sink


class MemorySink(Sink):
    """Records batches; can be told to fail a number of writes to exercise retry and checkpoint paths."""

    schemes = ("memory",)

    def __init__(self, fail_writes: int = 0) -> None:
        self.events: list[ChangeEvent] = []
        self.batches = 0
        self.prepared: list[CollectionSpec] = []
        self.finished: list[CollectionSpec] = []
        self.fail_writes = fail_writes
        self.closed = False

    async def write(self, batch: Sequence[ChangeEvent]) -> None:
        if self.fail_writes > 0:
            self.fail_writes -= 1
            raise ConnectionError("memory sink: injected failure")
        self.events.extend(batch)
        self.batches += 1

    async def prepare(self, specs: Sequence[CollectionSpec], *, drop_existing: bool) -> None:
        self.prepared.extend(specs)

    async def finish_snapshot(self, specs: Sequence[CollectionSpec]) -> None:
        self.finished.extend(specs)

    async def close(self) -> None:
        self.closed = True
