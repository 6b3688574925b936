"""The sink contract. Plug-ins import this module, events, errors and config; never the pipeline.

A sink receives batches of :class:`~replicator.events.ChangeEvent` in source order:

* ``await sink.start()`` before the first write (or ``async with sink:``).
* ``await sink.write_copy(ns, documents, at)``: a snapshot batch (by default, ``write`` of its READ events);
  ``last=True`` on the batch that ends the snapshot, for a sink that says it ``marks_snapshot_end``.
* ``await sink.write(batch)`` returns once every event of the batch is durably acknowledged by the
  destination; the pipeline checkpoints only after that. It raises on failure, and must then have
  acknowledged nothing it was not sure of (re-delivery after a restart is expected: at-least-once).
  Events of one document keep their order. A transaction's events (same ``txn``) arrive in one batch.
* ``await sink.flush()`` forces out anything buffered; ``await sink.close()`` flushes and releases.
* ``prepare(specs)`` (before a snapshot) and ``finish_snapshot(specs)`` (after it) let a sink that keeps
  schema recreate collections, views and indexes; sinks without a schema leave the defaults.
* ``discard(ns, where)`` deletes what an interrupted copy of a snapshot partition wrote, before that
  partition is copied again, where writing its documents twice would keep both (time-series measurements).

Concurrency: the snapshot calls ``write`` from several workers at once, each with batches of one
namespace; the stream replay calls it from one task.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Mapping, Sequence
from types import TracebackType
from typing import Any, Protocol

from bson.timestamp import Timestamp

from replicator.events import ChangeEvent, CollectionSpec, Namespace, Op, Position


class SourceLookup(Protocol):
    """Reads documents by ``_id`` from the source as they are now, named and shaped as on the target:
    ``await lookup(target_namespace, ids, after=event_time)`` -> the documents that still exist, in a
    state no older than ``after`` (the cluster time of the event they are read for; None: any)."""

    def __call__(
        self, target: Namespace, ids: Sequence[Any], *, after: Timestamp | None = None
    ) -> Awaitable[list[Mapping[str, Any]]]: ...


class Sink(ABC):
    """Base class of every sink."""

    #: URI scheme(s) this sink answers to, e.g. ("mongodb", "mongodb+srv").
    schemes: tuple[str, ...] = ()
    #: The destination keeps each collection's current state (a database), not a log of events: DDL
    #: replayed inside the window where the destination may be ahead of it is settled by copying the
    #: namespaces again (prepare with drop_existing, the documents, finish_snapshot) instead.
    holds_state: bool = False
    #: The destination has indexes that ``finish_snapshot`` builds (a database), said in the run's log.
    builds_indexes: bool = False
    #: The source's replica set name (empty for a mongos or a standalone), set before ``start()``; events
    #: read from a change stream also carry their own in ``ChangeEvent.rs``.
    source_name: str = ""
    #: How Spark tasks may share a replayed batch, each writing its part at once from its executor:
    #: ``"document"`` (each document's events in one task; the sink applies any subset of a batch in order
    #: and a transaction whole), ``"namespace"`` (each collection's events in one task), or None (the
    #: driver writes every batch: a local file or stdout).
    spreads: str | None = None
    #: The destination shards collections (a MongoDB sharded cluster, known after ``start()``): the job gives
    #: ``prepare`` specs that say how (``CollectionSpec.shard``), read from a sharded source and --shard-target.
    shards: bool = False
    #: The sink marks the snapshot's last record (Debezium's ``source.snapshot: last``): the asyncio engine
    #: then holds back the final batch of each partition until it knows which one ends the snapshot, and
    #: writes that one with ``write_copy(..., last=True)``.
    marks_snapshot_end: bool = False

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Connect; raise ConnectionFailed with a one-line reason when the destination is unreachable."""

    @abstractmethod
    async def write(self, batch: Sequence[ChangeEvent]) -> None:
        """Deliver a batch; return only when all of it is acknowledged."""

    async def write_copy(
        self, ns: Namespace, documents: Sequence[Mapping[str, Any]], at: Position | None, *, last: bool = False
    ) -> None:
        """A snapshot batch: ``documents`` read from one collection, written to destination ``ns`` (at the
        snapshot's read time ``at``); returns once acknowledged. By default, as :meth:`write` of their
        ``READ`` events; a sink may write the documents as they are (no event per document). ``last``: the
        batch ends the snapshot (see ``marks_snapshot_end``)."""
        await self.write(read_events(ns, documents, at))

    async def history(self, events: Sequence[ChangeEvent]) -> None:  # noqa: B027 - optional hook
        """Events the replay holds back from a sink that holds state, because their namespace waits to be
        copied again (see ddl_window): the copy stands for them in the state. A sink that also keeps every
        event as it happened (a lake's change tables) records them here, in order."""

    def attach_source(self, lookup: SourceLookup) -> None:  # noqa: B027 - optional hook
        """Called before ``start()`` with a way to re-read documents from the source, for a sink that
        must settle a write as the source has it now (a unique-key conflict in MongoDB)."""

    def carry_transaction(self, tx_id: str, counts: Sequence[tuple[str, int]]) -> None:  # noqa: B027
        """Optional hook: the run starts inside a transaction whose first records another writer (a Debezium
        connector) wrote, ``counts`` of its events per collection so far: a sink that writes transaction
        metadata continues it (no second BEGIN) until its first write is acknowledged."""

    async def heartbeat(self) -> None:  # noqa: B027 - optional hook
        """The stream moved without events for this sink (idle, or only filtered-out changes): a sink
        that publishes heartbeats does so here, at its own pace."""

    async def flush(self) -> None:  # noqa: B027 - optional hook
        """Deliver anything buffered."""

    async def close(self) -> None:
        """Flush and release resources."""
        await self.flush()

    async def existing(self, namespaces: Sequence[Namespace]) -> list[Namespace]:
        """Which of these destination namespaces already hold data (so a fresh snapshot would mix)."""
        return []

    async def unfit(self, specs: Sequence[CollectionSpec], *, replacing: bool) -> str | None:
        """Why the destination cannot take these specs, in one line (a sharded source's collection into an
        existing unsharded one, a --shard-target it cannot honour); None when it can. Asked before a new
        snapshot; ``replacing``: it drops the existing collections first."""
        return None

    async def prepare(self, specs: Sequence[CollectionSpec], *, drop_existing: bool) -> None:  # noqa: B027
        """Create destination collections (with options) and views before a snapshot copies data."""

    async def finish_snapshot(self, specs: Sequence[CollectionSpec]) -> None:  # noqa: B027
        """Build what is cheaper to build after the data, such as secondary indexes."""

    async def discard(self, ns: Namespace, where: Mapping[str, Any]) -> None:  # noqa: B027 - optional hook
        """Delete the documents of destination namespace ``ns`` that ``where`` selects (a snapshot partition's
        own range, ``{}`` for a whole collection): an earlier attempt to copy that partition may have written
        some, and copying it again would keep both copies (a time-series collection's measurements, whose
        inserts never replace). A log of events keeps what it was sent: consumers see those events again, as
        after any re-delivery."""

    @property
    def deletes_time_ranges(self) -> bool:
        """Can :meth:`discard` delete a time range of a time-series collection? Where it cannot, such a
        collection is copied as one partition (deleted whole before it is copied again)."""
        return True

    def copies_append(self, ns: Namespace) -> bool:
        """May a snapshot copy into destination ``ns`` just add its documents, none of them being there yet
        (this run made or emptied it)? The driver tells its Spark tasks (:meth:`stage`); a sink whose
        copies replace documents by key need not tell."""
        return True

    def stage(self, *, appends: bool = True) -> bool:
        """Called on a Spark executor before it copies a snapshot partition (``appends``: what the driver's
        :meth:`copies_append` said of its destination): True when this sink then writes its documents
        without committing them (data files only), for the driver to commit what :meth:`staged` lists with
        :meth:`commit_staged` (write on the workers, commit once). False (the default): its writes are
        committed as they are made."""
        return False

    def staged(self) -> list[Any]:
        """What this sink wrote since :meth:`stage` and has not committed (picklable, sent to the driver)."""
        return []

    async def commit_staged(self, staged: Sequence[Any]) -> None:  # noqa: B027 - optional hook
        """On the driver: commit what executors' :meth:`staged` returned for one partition."""

    async def reconcile(self, spec: CollectionSpec) -> bool:
        """Make the destination's collection match ``spec``'s options and indexes without copying its
        documents again; False when that takes a new copy (then mcdc copies it again)."""
        return False

    async def hold_ttls(self, namespaces: Sequence[Namespace], record: Mapping[str, Any] | None) -> None:  # noqa: B027
        """A destination whose TTLs would delete documents on their own clock (MongoDB) holds them still while
        the migration writes it (sinks/mongo/ttl.py): ``record``, the checkpoint's, says what it held so far;
        None, that nothing was held yet, so the TTLs these (destination) namespaces have now are held."""

    def held_ttls(self) -> dict[str, dict[str, Any]] | None:
        """What the destination holds now, for the checkpoint (None: nothing to record)."""
        return None

    async def __aenter__(self) -> Sink:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


def read_events(ns: Namespace, documents: Sequence[Mapping[str, Any]], at: Position | None) -> list[ChangeEvent]:
    """A snapshot batch's documents as the READ events of destination ``ns``."""
    return [ChangeEvent(Op.READ, ns, document=document, position=at) for document in documents]
