"""What ``mcdc cutover`` compares when ``tail --verify`` left a clean pass in the checkpoint: only what
that pass has not proven.

The pass compared every document at some time after it began (``SweepState.proven_since``). A
document no change event has touched since then is still proven; the others are compared again by
``_id``: the keys of every change to the selection between that time and the cutover, read from the
change stream, plus the re-check list the verifier left. A namespace with DDL in between (or more
changes than :data:`KEY_CAP` keys), and a time-series collection, are compared whole; kinds, options
and indexes of every namespace always are. A position no longer in the oplog, or no clean pass, means a
full verify.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from bson.timestamp import Timestamp

from replicator.checking.recheck import DOC, Entry, key_of
from replicator.checking.sweep_state import SweepState
from replicator.errors import HistoryLost
from replicator.events import ChangeEvent, Namespace, Position
from replicator.observe.progress import Reporter
from replicator.settings.config import Settings
from replicator.source.connection import Client, ServerInfo
from replicator.source.shards import MergedReader
from replicator.source.topology import StreamTopology

#: document keys kept per cutover at most (about 50 bytes each); past it, namespaces are compared whole
KEY_CAP = 1_000_000


@dataclass
class Changes:
    """The documents and namespaces changed in a stretch of the stream (pure: fed events)."""

    keys: dict[Namespace, set[bytes]] = field(default_factory=dict)
    whole: set[Namespace] = field(default_factory=set)
    databases: set[str] = field(default_factory=set)
    count: int = 0

    def note(self, events: Iterable[ChangeEvent]) -> None:
        for event in events:
            if event.ns.coll is None:  # dropDatabase
                self.databases.add(event.ns.db)
                continue
            if event.op.is_ddl:
                self.whole.update(ns for ns in (event.ns, event.to) if ns is not None)
                continue
            if event.ns in self.whole:
                continue
            try:
                key = key_of(event.document_key["_id"])
            except (ValueError, KeyError):
                self.whole.add(event.ns)
                continue
            keys = self.keys.setdefault(event.ns, set())
            if key not in keys:
                keys.add(key)
                self.count += 1
            if self.count > KEY_CAP:  # the namespace with the most changes is compared whole instead
                biggest = max(self.keys, key=lambda ns: len(self.keys[ns]))
                self.count -= len(self.keys.pop(biggest))
                self.whole.add(biggest)

    def add_rechecks(self, entries: Iterable[Entry]) -> None:
        """What the verifier still had to re-check: documents by key, anything else whole."""
        for entry in entries:
            if entry.kind == DOC and entry.key is not None:
                self.keys.setdefault(entry.src, set()).add(entry.key)
            else:
                self.whole.add(entry.src)

    def scope(self, ns: Namespace) -> set[bytes] | None:
        """The keys of ``ns`` to compare; None: all its documents."""
        if ns in self.whole or ns.db in self.databases:
            return None
        return self.keys.get(ns, set())

    @property
    def documents(self) -> int:
        return sum(len(k) for ns, k in self.keys.items() if self.scope(ns) is not None)


def proven_since(state: SweepState) -> Timestamp | None:
    """Where a clean pass's proof begins, when the checkpoint's verifier state has one that still holds
    (no mismatch found since, nothing left unchecked); else None."""
    if state.proven_since is None or state.found.count or state.last.count or state.unchecked:
        return None
    return state.proven_since


async def changes_between(
    settings: Settings,
    reporter: Reporter,
    client: Client,
    info: ServerInfo,
    since: Timestamp,
    until: Timestamp,
    *,
    database: str | None = None,
) -> Changes | None:
    """The changes to the selection from ``since`` up to ``until``, read from the source's change stream
    (one per shard; with ``database``, that database's, as the checkpoint follows); None when ``since`` is
    no longer in the oplog."""
    changes = Changes()
    # keys only: no document looked up, no pre-image
    settings = replace(settings, full_document="default", pre_images="off")
    topology = StreamTopology(settings, reporter, client, database=database)
    reader = await topology.reader(info, max_await_ms=200)
    start = Position(cluster_time=since)
    try:
        if isinstance(reader, MergedReader):
            await reader.open({name: start for name in reader.readers}, start, until=until)
        else:
            await reader.open(start, until=until)
        async for batch in reader.batches(until=until):
            changes.note(_selected(batch.events, settings))
    except HistoryLost:
        return None
    finally:
        if isinstance(reader, MergedReader):
            await reader.close_clients()
        else:
            await reader.close()
    return changes


def _selected(events: Sequence[ChangeEvent], settings: Settings) -> list[ChangeEvent]:
    return [e for e in events if settings.selection(e.ns) or (e.to is not None and settings.selection(e.to))]
