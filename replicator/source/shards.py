"""Sharded sources: one change stream per shard replica set, merged in cluster-time order.

A shard's stream is complete up to some time (its last event, or "now" when it had nothing more).
Events are released in cluster-time order only up to the earliest such time across shards, so a
document whose events moved from one shard to another (a chunk migration) still sees them in order,
and a transaction spanning shards (one cluster time) is released whole. Chunk migrations themselves
never appear: change streams leave out the migration's internal writes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from bson.timestamp import Timestamp

from replicator.events import ChangeEvent, Position
from replicator.settings.uri import redact
from replicator.source.changestream import Batch, ChangeStreamReader
from replicator.source.connection import DICT_CODEC, Client
from replicator.source.pump import DONE, Pump, stop_pumps


@dataclass(frozen=True)
class Shard:
    """One shard: its name (checkpoint key) and a URI reaching its replica set."""

    name: str
    uri: str
    host: str = ""  # listShards' host ("rs0/h1:27018,h2:27018"), kept in the checkpoint

    def __str__(self) -> str:
        return f"{self.name} ({redact(self.uri)})"


def shard_uri(host: str, mongos_uri: str) -> str:
    """listShards' ``host`` ("rs0/h1:27018,h2:27018" or "h1:27018") as a URI, with the mongos URI's
    credentials and options (authSource, tls, ...) carried over."""
    set_name, _, hosts = host.rpartition("/")
    scheme, _, rest = mongos_uri.partition("://")
    userinfo = rest.split("@", 1)[0] + "@" if "@" in rest.split("/", 1)[0] else ""
    query = rest.split("?", 1)[1] if "?" in rest else ""
    options = [o for o in query.split("&") if o and not o.lower().startswith(("replicaset=", "directconnection="))]
    if set_name:
        options.append(f"replicaSet={quote(set_name)}")
    scheme = "mongodb" if scheme == "mongodb+srv" else scheme  # shards are listed by host, not SRV
    return f"{scheme}://{userinfo}{hosts}/" + ("?" + "&".join(options) if options else "")


async def discover(client: Client, mongos_uri: str) -> list[Shard]:
    """The shards of a sharded cluster, from ``listShards`` on its mongos."""
    reply = await client.admin.command("listShards", codec_options=DICT_CODEC)
    return parse_shards(reply, mongos_uri)


def parse_shards(reply: Mapping[str, Any], mongos_uri: str) -> list[Shard]:
    shards = [
        Shard(str(s["_id"]), shard_uri(str(s["host"]), mongos_uri), str(s["host"])) for s in reply.get("shards", [])
    ]
    return sorted(shards, key=lambda s: s.name)


class MergedReader:
    """Reads several shard streams and yields batches in cluster-time order, each carrying the position
    of every shard it advanced (``Batch.shard_positions``)."""

    def __init__(self, readers: Mapping[str, ChangeStreamReader], *, batch_size: int, queue_batches: int = 2) -> None:
        self.readers = dict(readers)
        self._batch_size = batch_size
        self._queue_batches = queue_batches
        #: shards gone from the cluster, read up to this time (their events before it are not lost), then
        #: closed by :meth:`batches` once drained
        self.retiring: dict[str, Timestamp] = {}

    def retire(self, name: str, until: Timestamp) -> None:
        """Read shard ``name`` only up to ``until``, then stop following it."""
        self.retiring[name] = until

    @property
    def client(self) -> Client:
        return next(iter(self.readers.values())).client

    async def open(
        self, positions: Mapping[str, Position], default: Position, *, until: Timestamp | None = None
    ) -> None:
        """Open every shard's stream at its own position; a shard without one (new, or a checkpoint
        started with --start-at) opens at ``default``'s time (a resume token belongs to one stream).
        ``until``: where a bounded read will stop (see ChangeStreamReader.open)."""
        fallback = Position(cluster_time=default.cluster_time)
        for name, reader in self.readers.items():
            await reader.open(positions.get(name) or fallback, until=self._until(name, until))

    async def positions_now(self) -> dict[str, Position]:
        """Every shard's position now (captured before a snapshot reads anything)."""
        out = {}
        for name, reader in self.readers.items():
            out[name] = await reader.position_now()
            await reader.close()
        return out

    async def close(self) -> None:
        for reader in self.readers.values():
            await reader.close()

    async def close_clients(self) -> None:
        for name in list(self.readers):
            await self.remove(name)

    async def remove(self, name: str) -> None:
        """Stop following one shard: close its stream and its client."""
        reader = self.readers.pop(name)
        await reader.close()
        await reader.client.close()

    async def batches(self, *, until: Timestamp | None = None) -> AsyncIterator[Batch]:
        """Merged batches. An event is released once every other shard is known to hold nothing that
        must come first: that shard has a buffered event at or after it, or its stream has shown events
        up to its time, or a poll of it that started after the event was read came back empty (anything
        it writes later happened later)."""
        shards = {name: _ShardState() for name in self.readers}
        pumps = {n: Pump(self.readers[n].batches(until=self._until(n, until)), self._queue_batches) for n in shards}
        try:
            while True:
                for name in [n for n, st in shards.items() if n in self.retiring and st.finished and not st.buffer]:
                    del shards[name]  # a removed shard read to its end: no longer followed
                    self.retiring.pop(name)
                    await self.remove(name)
                    if not shards:
                        return
                for name, state in shards.items():
                    if state.finished:
                        continue
                    if not state.buffer:  # nothing buffered: wait for news from this shard
                        state.take(await pumps[name].get())
                    while not state.finished and len(pumps[name]) and len(state.buffer) < self._cap:
                        state.take(pumps[name].get_nowait())
                batch = self._release(shards)
                if batch is not None:
                    yield batch
                if all(st.finished and not st.buffer for st in shards.values()):
                    return
        finally:
            await stop_pumps(pumps.values())

    def _until(self, name: str, until: Timestamp | None) -> Timestamp | None:
        end = self.retiring.get(name)
        if end is None:
            return until
        return end if until is None else min(until, end)

    @property
    def _cap(self) -> int:
        return self._batch_size * 4

    def _release(self, shards: dict[str, _ShardState]) -> Batch | None:
        events: list[ChangeEvent] = []
        positions: dict[str, Position] = {}
        while len(events) < self._cap:
            heads = [(_time(st.buffer[0][0]), name) for name, st in shards.items() if st.buffer]
            if not heads:
                break
            when, name = min(heads)
            event, read_at = shards[name].buffer[0]
            if not all(st.allows(when, read_at) for other, st in shards.items() if other != name):
                break
            shards[name].buffer.popleft()
            events.append(event)
            if event.position is not None:
                positions[name] = event.position
        for name, st in shards.items():
            if st.idle_position is not None and not st.buffer and name not in positions:
                positions[name] = st.idle_position  # an idle shard's post-batch token keeps its checkpoint fresh
            st.idle_position = None
        if not events and not positions:
            return None
        last = events[-1].position if events else None
        followed = [st for st in shards.values() if not st.finished]
        idle = [st.idle_since for st in followed if st.idle_since is not None and not st.buffer]
        # every shard idle: every write a poll begun at the earliest of their empty polls could see is released
        idle_since = min(idle) if not events and idle and len(idle) == len(followed) else None
        return Batch(
            events=events, position=last or Position(), caught_up=not events, shard_positions=positions,
            idle_since=idle_since,
        )  # fmt: skip


class _ShardState:
    """What the merge knows of one shard's stream."""

    def __init__(self) -> None:
        self.buffer: deque[tuple[ChangeEvent, float]] = deque()  # (event, local time it was read)
        self.seen_to: Timestamp | None = None  # cluster time of the last event read
        self.idle_since: float | None = None  # start of the last poll that found nothing
        self.idle_position: Position | None = None
        self.finished = False

    def take(self, item: object) -> None:
        if item is DONE:
            self.finished = True
            return
        assert isinstance(item, Batch)
        for event in item.events:
            self.buffer.append((event, item.read_at))
        if item.events:
            self.seen_to = _time(item.events[-1])
            self.idle_since = None
        else:  # a post-batch token: past every event of this shard read so far (a filtered stream's too, in
            # the middle of a stretch the filter leaves out, when the poll is not idle)
            if item.idle_since is not None:
                self.idle_since = item.idle_since
            if item.position:
                self.idle_position = item.position

    def allows(self, when: Timestamp, read_at: float) -> bool:
        """Can an event of another shard at cluster time ``when``, read at ``read_at``, go first?

        Not on the strength of an event of this shard at ``when`` itself: a batch may end between two of
        this shard's events at one cluster time, and the rest comes first in the stream's order (by shard
        name, then place: replicator.events.positions)."""
        if self.finished or self.buffer:
            return True  # a buffered head is not earlier (the released event is the smallest head)
        if self.seen_to is not None and self.seen_to > when:
            return True
        return self.idle_since is not None and self.idle_since >= read_at


def _time(event: ChangeEvent) -> Timestamp:
    ts = event.position.cluster_time if event.position is not None else None
    return ts if ts is not None else Timestamp(0, 0)


async def explicit_shards(uris: Sequence[str], timeout_s: float) -> list[Shard]:
    """--shard replica set URIs as shards, each named by its replica set and hosts (the checkpoint's key)."""
    from replicator.settings.uri import host_set
    from replicator.source.connection import make_client, probe

    named = []
    for uri in uris:
        client = make_client(uri, timeout_s=timeout_s)
        try:
            info = await probe(client, uri, "shard")
        finally:
            await client.close()
        named.append(Shard(f"{info.set_name or 'shard'}@{','.join(sorted(host_set(uri)))}", uri))
    return named
