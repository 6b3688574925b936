"""Which DDL events can be replayed as they are, and which namespaces must be copied again. Pure: no I/O.

Replay runs events twice in normal operation: the checkpoint is saved at most about once a second, a
retried batch is applied again, a killed run replays from its last save, and an older copy of the
checkpoint replays a long suffix. For documents this converges (upserts and deletes by key, in order). For
DDL it does not: the target may already hold a later incarnation of the same name. Replaying
``rename a -> b`` again would move the new ``a`` over the archived ``b``; a ``drop x`` again would drop what
a later ``rename y -> x`` brought, whose events came before the checkpoint and are never read again.

So the replay knows a horizon: events at or before it may already be on the target. It is the source's
time when the stream was opened (whatever ran before this stream, a killed run included, cannot have
applied anything later), and, per namespace, the source's time when mcdc last copied it (a copy is
newer than the events read after it). A DDL event past every horizon of what it touches is applied as
it is: the target holds exactly the state before it. A DDL event inside a horizon is not applied;
instead, the namespaces it touches are marked, their document events are skipped from then on, and once
the stream passes the horizon they are copied again from the source as it is then (data DDL: drop,
rename, dropDatabase), or their indexes and options are made the source's (catalog DDL: create, collMod,
createIndexes, dropIndexes). Events after the copy converge on it as after a snapshot. A DDL event is
thereby a barrier: nothing after it in a batch is applied before the decision about it. A rename of a
filtered collection is copied again wherever it comes: an update read just before it was looked up under
the old name, found nothing, and became a delete.

The checkpoint may not move past a marked DDL event before the copy is done (a run killed in between
must meet the event again): :attr:`DdlWindow.pending` says so.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from bson.timestamp import Timestamp

from replicator.events import ChangeEvent, Namespace, Op
from replicator.settings.selection import Selection, renamed_into_selection

#: DDL that moves or destroys documents: replayed inside a horizon, it may carry another incarnation's.
DATA_DDL = frozenset({Op.DROP, Op.DROP_DATABASE, Op.RENAME})
#: DDL that changes only the catalog (options, indexes): settled by comparing with the source's catalog.
CATALOG_DDL = frozenset({Op.CREATE, Op.MODIFY, Op.CREATE_INDEXES, Op.DROP_INDEXES})


@dataclass
class Resync:
    """What to copy again from the source: source namespaces (``data``), whole source databases (all that
    the selection maps from them, on the source and on the target) and namespaces whose indexes and
    options only (``catalog``)."""

    data: set[Namespace] = field(default_factory=set)
    databases: set[str] = field(default_factory=set)
    catalog: set[Namespace] = field(default_factory=set)

    def __bool__(self) -> bool:
        return bool(self.data or self.databases or self.catalog)

    def names(self) -> list[str]:
        """What is resynced, for a log line."""
        return sorted({str(ns) for ns in self.data | self.catalog} | {f"{db}.*" for db in self.databases})


def _time(event: ChangeEvent) -> Timestamp | None:
    return event.position.cluster_time if event.position is not None else None


class DdlWindow:
    """The horizons of one replay, and the namespaces waiting to be copied again."""

    def __init__(self, selection: Selection, *, copy_renamed: Callable[[Namespace], bool] | None = None) -> None:
        """``copy_renamed``: the namespaces whose renames are copied again wherever they come (a filtered
        collection's: an update read just before its rename is looked up under the old name, finds nothing,
        and the filter takes that for a document that stopped matching)."""
        self._selection = selection
        self._copy_renamed = copy_renamed
        self.horizon: Timestamp | None = None
        self._ahead: dict[Namespace, Timestamp] = {}
        self._todo = Resync()
        self._due: Timestamp | None = None

    @property
    def pending(self) -> bool:
        """Namespaces are waiting to be copied again: the checkpoint must stay before their DDL."""
        return bool(self._todo)

    def opened(self, now: Timestamp) -> None:
        """The stream opens (again) with the source's time ``now``: what came before may be on the target."""
        self.horizon = now if self.horizon is None or now > self.horizon else self.horizon

    def split(self, events: Sequence[ChangeEvent]) -> tuple[list[ChangeEvent], list[ChangeEvent] | None]:
        """The events to apply now, and (not None) the rest of the batch when the copy is due before it.

        Marked DDL is left out (the copy stands for it), and so are document events of namespaces waiting
        to be copied."""
        out: list[ChangeEvent] = []
        waiting = bool(self._todo)  # nothing waits (nearly always): a document event is applied as it is
        for i, event in enumerate(events):
            if waiting:
                ts = _time(event)
                if self._due is None or (ts is not None and ts > self._due):
                    return out, list(events[i:])
            if event.op.is_ddl:
                if self._replayable(event, _time(event)):
                    out.append(event)
                waiting = bool(self._todo)
            elif not waiting or not self._waiting(event.ns):
                out.append(event)
        return out, None

    def take(self) -> Resync:
        """What to copy again now; :meth:`copied` once it is done."""
        todo, self._todo, self._due = self._todo, Resync(), None
        todo.catalog -= todo.data
        return todo

    def copied(self, namespaces: Iterable[Namespace], at: Timestamp) -> None:
        """These source namespaces were copied again; the source's time was ``at`` once the copy ended."""
        for ns in namespaces:
            self._ahead[ns] = at

    def _waiting(self, ns: Namespace) -> bool:
        return ns in self._todo.data or ns.db in self._todo.databases

    def _touched(self, event: ChangeEvent) -> list[Namespace]:
        touched = [event.ns]
        if event.to is not None:
            touched.append(event.to)
        return [ns for ns in touched if self._selection(ns)]

    def _bound(self, event: ChangeEvent, touched: Sequence[Namespace]) -> Timestamp | None:
        """The latest horizon covering this event's namespaces (None: nothing known)."""
        bounds = [self._ahead[ns] for ns in touched if ns in self._ahead]
        if event.op is Op.DROP_DATABASE:
            bounds += [ts for ns, ts in self._ahead.items() if ns.db == event.ns.db]
        if self.horizon is not None:
            bounds.append(self.horizon)
        return max(bounds) if bounds else None

    def _replayable(self, event: ChangeEvent, ts: Timestamp | None) -> bool:
        """Can this DDL event be applied as it is? If not, mark what it touches."""
        touched = self._touched(event)
        if event.op is Op.DROP_DATABASE:
            if not self._selection.database(event.ns.db):
                return True
        elif not touched:
            return True  # outside the selection: the transform stage drops it
        bound = self._bound(event, touched)
        inside = ts is None or bound is None or ts <= bound
        todo = self._todo
        waiting = event.ns.db in todo.databases or any(self._waiting(ns) or ns in todo.catalog for ns in touched)
        # renamed in from outside the selection: its documents were never replicated, copy it
        copied = renamed_into_selection(event, self._selection) or self._filtered_rename(event, touched)
        if not (inside or waiting or copied):
            return True
        if event.op is Op.DROP_DATABASE:
            self._todo.databases.add(event.ns.db)
        elif event.op in DATA_DDL:
            self._todo.data.update(touched)
        else:
            self._todo.catalog.update(ns for ns in touched if not self._waiting(ns))
        self._push_due(bound if bound is not None and (ts is None or bound > ts) else ts)
        return False

    def _filtered_rename(self, event: ChangeEvent, touched: Sequence[Namespace]) -> bool:
        return event.op is Op.RENAME and self._copy_renamed is not None and any(map(self._copy_renamed, touched))

    def _push_due(self, due: Timestamp | None) -> None:
        if due is not None and (self._due is None or due > self._due):
            self._due = due
