"""When the target's document writes are durable: one journaled-majority wait per batch, not per command.

mcdc's default write concern on the target is ``{w: "majority", j: true}`` (source/connection.make_client):
what the checkpoint records as acknowledged survives a target crash or failover. Sent with every command,
it makes each of a batch's commands (deletes, replacements, ordered deltas, per namespace) wait for the
journal and the replicas in turn. Instead, a batch's document writes go with ``w: 1`` (applied on the
primary) and the batch ends with one **barrier**: a delete that matches nothing, on a namespace the batch
wrote, with the durable write concern. MongoDB waits for the write concern of a write that changed nothing
at the latest operation in its oplog (the client's "last op" is moved there: jstests
``noop_writes_wait_for_write_concern``), so the barrier's answer means every write the batch applied before
it is journaled and majority-committed, on whichever connection it went.

That holds only while one server process, primary all along, took them all: after a failover the w:1
writes the old primary took may be rolled back while the barrier succeeds on the new one, and a server that
crashed and restarted may have lost w:1 writes it had not journaled. So the writable server (its address,
election id and process id, as the driver knows them) is noted before the batch's first write and compared
after the barrier; when it changed, the batch counts as not written (a retryable error: it is written
again, idempotently). A new primary gets a new election id, so a step-down and back is seen too, and a
restarted server a new process id (the driver learns both again after the connection error such a change
causes, before it can send the barrier).

Not used where it does not hold: a sharded target (a barrier reaches one shard, not every shard the batch
wrote), a server that does not report its process id (``topologyVersion``, MongoDB 4.4), or a URI that
sets its own write concern (the user's, with every command, as they asked).
Transactions commit with the durable write concern as before, and DDL keeps it.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import OperationFailure
from pymongo.server_type import SERVER_TYPE
from pymongo.write_concern import WriteConcern

from replicator.errors import SinkUnavailable
from replicator.events import Namespace
from replicator.source.connection import Client, uri_options
from replicator.source.retry import is_retryable

#: the write concern of a batch's document writes before its barrier: applied on the primary
APPLIED = WriteConcern(w=1)
#: matches no document of any collection: the barrier changes nothing
_NOTHING: dict[str, Any] = {"_id": {"$in": []}}
_WRITABLE = (SERVER_TYPE.RSPrimary, SERVER_TYPE.Standalone)

#: the writable server as the driver knows it: (address, election id, process id)
Writer = tuple[Any, Any, Any]


def barrier_applies(uri: str, kind: str) -> bool:
    """Does a barrier make this target's batches durable? Not when the URI sets its own write concern, nor on
    a sharded cluster (``kind`` as source/connection.probe says it)."""
    return kind != "sharded" and not uri_options(uri) & {"w", "journal", "wtimeoutms"}


def writer(servers: Iterable[Any]) -> Writer | None:
    """The writable server among the driver's server descriptions (a primary or a standalone): its address,
    election id and process id; None when the driver knows none right now, or not its process id."""
    for server in servers:
        if server.server_type in _WRITABLE:
            process = (server.topology_version or {}).get("processId")
            return None if process is None else (server.address, server.election_id, process)
    return None


@dataclass
class _Batch:
    """One batch's writes before its barrier: the writable server at the first, the last namespace written."""

    writer: Writer | None = None
    pending: Namespace | None = None


#: the batch being written by this task (its document writes go to tasks of their own, which share it): a
#: sink's snapshot copies write batches from several tasks at once, each with its own barrier
_BATCH: ContextVar[_Batch | None] = ContextVar("mcdc_durable_batch", default=None)


class Durability:
    """One MongoSink's barriers: the collections its batches write with ``w: 1`` and the barrier that ends a
    batch. ``enabled`` False, or a write outside :meth:`begin` .. :meth:`settle`: every write keeps the
    client's durable write concern, and :meth:`settle` does nothing."""

    def __init__(self, client: Client) -> None:
        self._client = client
        self.enabled = False
        self._applied: dict[Namespace, AsyncCollection[Any]] = {}
        self._durable: dict[Namespace, AsyncCollection[Any]] = {}
        self._refused: set[Namespace] = set()  # where a barrier cannot be sent (see settle)

    def enable(self, uri: str, kind: str) -> None:
        """Once connected (``kind`` as source/connection.probe says it): barriers where they apply and the
        driver can tell the writable server and its process (not behind a load balancer, MongoDB 4.4 or later)."""
        self.enabled = barrier_applies(uri, kind) and self._current() is not None

    def _current(self) -> Writer | None:
        return writer(self._client.topology_description.server_descriptions().values())

    def begin(self) -> None:
        """A batch begins in this task: its writes go with ``w: 1`` until :meth:`settle`."""
        _BATCH.set(_Batch())

    def collection(self, ns: Namespace) -> AsyncCollection[Any]:
        """The collection a batch's document writes to ``ns`` go to (``w: 1`` before a barrier, when enabled);
        the first of a batch notes the writable server."""
        batch = _BATCH.get()
        if batch is None or not self.enabled or ns in self._refused:
            coll = self._durable.get(ns)
            if coll is None:
                coll = self._durable[ns] = self._client[ns.db][ns.coll or ""]
            return coll
        if batch.pending is None:
            batch.writer = self._current()
        batch.pending = ns
        coll = self._applied.get(ns)
        if coll is None:
            coll = self._applied[ns] = self._client[ns.db].get_collection(ns.coll or "", write_concern=APPLIED)
        return coll

    async def settle(self) -> None:
        """The barrier after this task's batch's ``w: 1`` writes (none sent: nothing to do). Raises
        SinkUnavailable (the batch is written again) when the writable server changed since the first of
        them, or where the barrier was refused (that namespace's writes keep the durable write concern from
        then on)."""
        batch = _BATCH.get()
        if batch is None or batch.pending is None:
            return
        ns, batch.pending = batch.pending, None
        try:
            await self._client[ns.db][ns.coll or ""].delete_one(_NOTHING)
        except OperationFailure as exc:
            if is_retryable(exc):
                raise
            self._refused.add(ns)  # e.g. a time-series collection before 7.0: no delete by _id
            raise SinkUnavailable(f"{ns}: the target refused a write that waits for durability; writing the "
                                  "batch again with a durable write concern on each write") from None  # fmt: skip
        if batch.writer is None or self._current() != batch.writer:
            raise SinkUnavailable(
                "the target's primary changed (or restarted) while a batch was written: writing it again"
            )
