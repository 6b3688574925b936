"""What each engine does with a batch of change events read from the stream, between reading it and
acknowledging it: one path for the asyncio loop and the Spark micro-batch.

    looked-up documents checked (source/incarnations) -> DDL window (ddl_window) -> transform (filters)
    -> sink.write -> namespaces copied again when the window says so (resync) -> may the batch be acked?

The engines own only their loops: reading, retrying, and moving the checkpoint when :meth:`ReplayStage.write`
says the batch may be acknowledged.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from bson.timestamp import Timestamp

from replicator.events import ChangeEvent, Namespace
from replicator.replay.ddl_window import DdlWindow, Resync
from replicator.sinks.base import Sink
from replicator.source.changestream import current_time
from replicator.source.connection import Client
from replicator.source.incarnations import own_lookups

Transform = Callable[[ChangeEvent], ChangeEvent | None]
#: Copies namespaces again from the source; returns the source namespaces copied and the source's time after.
Resyncer = Callable[[Resync], Awaitable[tuple[set[Namespace], Timestamp]]]
#: Runs after the sink acknowledged a batch, with the events as read (before the transform).
AfterWrite = Callable[[Sequence[ChangeEvent]], Awaitable[None]]
#: Writes transformed events and returns once they are acknowledged: the sink's write, or the engine's
#: (Spark's spreads a batch over tasks that write from the executors).
Apply = Callable[[Sequence[ChangeEvent]], Awaitable[None]]


class Observer(Protocol):
    """Follows what the replay does (the embedded verifier): events about to be applied, namespaces copied
    again, and how far the acknowledged replay has come."""

    def seen(self, events: Sequence[ChangeEvent]) -> None: ...

    def recopied(self, namespaces: Iterable[Namespace]) -> None: ...

    def acked(self, applied: Timestamp | None, *, idle_since: float | None = None) -> None: ...


@dataclass
class Written:
    """What one batch became: the events the sink applied (transformed), and whether the checkpoint may
    move past the batch (not while namespaces wait to be copied again: see DdlWindow.pending)."""

    events: list[ChangeEvent] = field(default_factory=list)
    ackable: bool = True


class ReplayStage:
    """The stages a replayed batch goes through, for both engines.

    ``window`` and ``resync`` are given for a sink that holds state (a database): DDL inside the window
    is settled by copying again. ``after_write`` is the other sinks' hook (copy a collection renamed into
    the selection). ``client``: the source, where looked-up documents are checked (None: not checked,
    for tests that feed events of their own). ``apply``: how the transformed events are written (the
    sink's ``write`` unless the engine writes them its own way)."""

    def __init__(
        self,
        sink: Sink,
        transform: Transform,
        *,
        client: Client | None = None,
        window: DdlWindow | None = None,
        resync: Resyncer | None = None,
        after_write: AfterWrite | None = None,
        observer: Observer | None = None,
        apply: Apply | None = None,
    ) -> None:
        self.sink = sink
        self._apply = apply or sink.write
        self.observer = observer
        self.transform = transform
        self.window = window
        self._client = client
        self._resync = resync
        self._after_write = after_write

    async def opened(self) -> None:
        """The stream was opened (again): whatever came before the source's time now may be applied."""
        if self.window is not None:
            assert self._client is not None, "a DDL window needs the source's time"
            self.window.opened(await current_time(self._client))

    async def write(self, events: Sequence[ChangeEvent]) -> Written:
        """Apply one batch as read from the stream; returns once the sink acknowledged it."""
        if self.observer is not None:
            self.observer.seen(events)
        if self._client is not None:
            events = await own_lookups(self._client, events)
        written = Written()
        rest: list[ChangeEvent] | None = list(events)
        while rest is not None:
            chunk = rest
            now, rest = self.window.split(rest) if self.window is not None else (rest, None)
            kept = [e for e in map(self.transform, now) if e is not None]
            if kept:
                await self._apply(kept)
                written.events.extend(kept)
            if len(now) + len(rest or ()) < len(chunk):  # held back: after what was applied before them
                await self._history(held_back(chunk, now, rest))
            if rest is not None:
                await self.settle()
        if not written.events:
            await self.sink.heartbeat()
        if self._after_write is not None:
            await self._after_write(events)
        written.ackable = self.window is None or not self.window.pending
        return written

    async def _history(self, held: Sequence[ChangeEvent]) -> None:
        """Events the window held back still reach a sink that keeps every event (Sink.history)."""
        recorded = [e for e in map(self.transform, held) if e is not None]
        if recorded:
            await self.sink.history(recorded)

    def acked(self, applied: Timestamp | None, *, idle_since: float | None = None) -> None:
        """The engine acknowledged the replay up to the event at ``applied``; ``idle_since``: a poll begun
        then found nothing more (see recheck.ReplayClock)."""
        if self.observer is not None:
            self.observer.acked(applied, idle_since=idle_since)

    async def settle(self) -> bool:
        """Copy again what the window marked (the stream is caught up, or ends, or passed its horizon).
        True when nothing is left waiting: the checkpoint may move."""
        if self.window is None or not self.window.pending:
            return True
        assert self._resync is not None
        resync = self.window.take()
        if self.observer is not None:
            self.observer.recopied([*resync.data, *resync.catalog, *(Namespace(db) for db in resync.databases)])
        copied, at = await self._resync(resync)
        self.window.copied(copied, at)
        return not self.window.pending


def held_back(
    chunk: Sequence[ChangeEvent], applied: Sequence[ChangeEvent], rest: Sequence[ChangeEvent] | None
) -> list[ChangeEvent]:
    """The events of ``chunk`` that the window neither applied nor left for after the copy, in order."""
    done = len(chunk) - len(rest or ())
    kept = {id(e) for e in applied}
    return [e for e in chunk[:done] if id(e) not in kept]
