"""Which change streams a run reads: the deployment's one stream, or one per shard, kept in step with
the cluster while tailing a mongos.

* ``--shard URI`` (repeatable) names the shards' replica sets; a mongos is asked with ``listShards``.
* While following a mongos, the shard list is read every ``shard_refresh_s``: a shard added starts at
  the time of the last listing that did not have it (the listing that built the streams, before a
  snapshot, for a shard added during it), so nothing written on it since is missed; a shard removed is
  read up to the time of the listing that no longer had it (what it took before is not lost when mcdc
  was behind), then closed, and its checkpoint entry stays.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from bson.timestamp import Timestamp
from pymongo.errors import PyMongoError

from replicator.checkpoint.store import Checkpoint
from replicator.errors import McdcError
from replicator.events import Position
from replicator.observe.progress import Reporter
from replicator.settings.config import Settings
from replicator.settings.stream_match import StreamFilter, change_match
from replicator.source.changestream import ChangeStreamReader, current_time
from replicator.source.connection import Client, ServerInfo, make_client, probe, server_message
from replicator.source.retry import sleep_or_stop
from replicator.source.shards import MergedReader, Shard, discover, explicit_shards, shard_uri

Reader = ChangeStreamReader | MergedReader


@dataclass
class ShardChange:
    """Shards that appeared or went away, and the time of the last listing without the new ones."""

    added: list[Shard] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    since: Timestamp | None = None
    seen: Timestamp | None = None  # the time of the listing that showed the change


class StreamTopology:
    """Builds the run's reader and, for a discovered sharded cluster, follows its shard set."""

    def __init__(self, settings: Settings, reporter: Reporter, client: Client, *, database: str | None = None) -> None:
        """``database``: follow that database's change stream (on each shard), not the deployment's."""
        self.s = settings
        self.reporter = reporter
        self.client = client
        self.database = database
        self.discovered = False  # shards found through listShards (so they can change), not --shard
        self.listed_at: Timestamp | None = None  # the source's time just before the last shard listing
        self.hosts: dict[str, str] = {}  # the discovered shards' listShards hosts
        #: the $match of each stretch of the streams (settings/stream_match.py): the selection's, until a
        #: checkpoint says which read its positions (:meth:`use`)
        self.stream_filter = StreamFilter(change_match(settings.selection))

    async def reader(self, info: ServerInfo, *, max_await_ms: int, cp: Checkpoint | None = None) -> Reader:
        """One stream per shard when there are shards, else the deployment's own stream. A shard the
        checkpoint follows that the cluster no longer lists (removed while mcdc was down) is read up to
        now, then closed."""
        s = self.s
        self.listed_at = await current_time(self.client)
        shards = await self._shards(info)
        self.discovered = bool(shards) and not s.shards
        self.hosts = {sh.name: sh.host for sh in shards if sh.host}
        if not shards:
            return ChangeStreamReader(
                self.client, full_document=s.full_document, batch_size=s.replay_batch, max_await_ms=max_await_ms,
                track_time=True, oversize=s.oversize, pre_images=s.pre_images, rs=info.set_name,
                database=self.database, stream_filter=self.stream_filter,
            )  # fmt: skip
        self.reporter.info("one change stream per shard: " + ", ".join(str(sh) for sh in shards))
        merged = MergedReader({sh.name: await self._shard_reader(sh) for sh in shards}, batch_size=s.replay_batch)
        if self.discovered and cp is not None:
            await self._retire_gone(merged, cp)
        return merged

    def use(self, reader: Reader, stream_filter: StreamFilter) -> None:
        """Read ``reader``'s streams (and those of shards added later) with these matches."""
        self.stream_filter = stream_filter
        for one in reader.readers.values() if isinstance(reader, MergedReader) else [reader]:
            one.stream_filter = stream_filter

    async def _retire_gone(self, merged: MergedReader, cp: Checkpoint) -> None:
        """Shards the checkpoint follows and the cluster no longer lists: read what they took up to now."""
        assert self.listed_at is not None
        for name in sorted(set(cp.shards) - set(merged.readers)):
            host = cp.shard_hosts.get(name)
            if not host:
                continue
            shard = Shard(name, shard_uri(host, self.s.source), host)
            try:
                merged.readers[name] = await self._shard_reader(shard)
            except McdcError as exc:
                self.reporter.warn(
                    f"shard {name} was removed from the cluster and cannot be read ({exc}): what it took after "
                    f"{cp.shards[name].cluster_time} is not replicated"
                )
                continue
            self.reporter.info(
                f"shard {name} was removed from the cluster: reading what it took up to {self.listed_at}"
            )
            merged.retire(name, self.listed_at)

    async def _shards(self, info: ServerInfo) -> list[Shard]:
        """Explicit --shard URIs (named by replica set and hosts), else a mongos's listShards."""
        s = self.s
        if s.shards:
            return await explicit_shards(s.shards, s.connect_timeout_s)
        if info.kind == "sharded" and not s.snapshot_only:
            return await discover(self.client, s.source)
        return []

    async def _shard_reader(self, shard: Shard) -> ChangeStreamReader:
        client = make_client(shard.uri, timeout_s=self.s.connect_timeout_s, io_timeout_s=self.s.io_timeout_s)
        info = await probe(client, shard.uri, f"shard {shard.name}")
        # short awaits: the merge waits for an idle shard's empty poll before releasing the others' events
        return ChangeStreamReader(
            client, full_document=self.s.full_document, batch_size=self.s.replay_batch, max_await_ms=100,
            track_time=True, oversize=self.s.oversize, pre_images=self.s.pre_images, rs=info.set_name,
            shard=shard.name, database=self.database, stream_filter=self.stream_filter,
        )  # fmt: skip

    async def watch(self, reader: MergedReader, stop: asyncio.Event, user_stop: asyncio.Event | None) -> ShardChange:
        """Relay ``user_stop`` to ``stop``, and every ``shard_refresh_s`` list the shards. Returns once
        they change (or the user stops, with no change), after setting ``stop`` so the merged stream
        closes before the set is changed."""
        if self.listed_at is None:
            self.listed_at = await current_time(self.client)
        while True:
            if await sleep_or_stop(self.s.shard_refresh_s, user_stop):
                stop.set()
                return ShardChange()
            try:
                now = await current_time(self.client)
                shards = {sh.name: sh for sh in await discover(self.client, self.s.source)}
            except PyMongoError as exc:
                self.reporter.warn(f"cannot list the shards: {server_message(exc)}")
                continue
            added = [sh for name, sh in shards.items() if name not in reader.readers]
            removed = [name for name in reader.readers if name not in shards and name not in reader.retiring]
            since, self.listed_at = self.listed_at, now
            if added or removed:
                stop.set()
                return ShardChange(added, removed, since, now)

    async def apply(self, reader: MergedReader, cp: Checkpoint, change: ShardChange) -> None:
        """Start streams for added shards (from ``change.since``); read removed ones up to ``change.seen``
        (the merge closes them once they are drained)."""
        for sh in change.added:
            self.reporter.info(f"shard added: {sh}; following it from {change.since}")
            cp.add_shard(sh.name, Position(cluster_time=change.since))
            if sh.host:
                cp.shard_hosts[sh.name] = sh.host
            reader.readers[sh.name] = await self._shard_reader(sh)
        for name in change.removed:
            assert change.seen is not None
            self.reporter.info(f"shard removed: {name}; reading what it took up to {change.seen}, then closing it")
            reader.retire(name, change.seen)


async def capture(reader: Reader) -> tuple[Position, dict[str, Position]]:
    """The stream position(s) now; with shards, the checkpoint's time is the earliest shard's."""
    if isinstance(reader, MergedReader):
        shards = await reader.positions_now()
        times = [p.cluster_time for p in shards.values() if p.cluster_time is not None]
        return Position(cluster_time=min(times) if times else None), shards
    position = await reader.position_now()
    await reader.close()
    return position, {}


async def latest_time(reader: Reader, client: Client) -> Timestamp:
    """The source's time now; of several shards (which share no clock), the latest: no stream holds an event
    later than it yet."""
    sides = [r.client for r in reader.readers.values()] if isinstance(reader, MergedReader) else [client]
    return max([await current_time(side) for side in sides])


def adopt_filter(topology: StreamTopology, reader: Reader, cp: Checkpoint | None) -> StreamFilter:
    """The selection's match (settings/stream_match.py) this run wants, after reading ``reader``'s streams
    with the matches ``cp`` records (set on ``cp.stream_filter``, without the stretches every position
    has passed): a checkpoint's match changes only with the selection it records (see
    job.replay.Replay.follow_selection), which is what its target holds. A checkpoint that records none, or
    holds no position yet, takes this run's as it is."""
    wanted = StreamFilter(topology.stream_filter.match)
    if cp is None:
        topology.use(reader, wanted)
        return wanted
    recorded = cp.stream_filter
    if recorded is None or not (cp.position or cp.shards):
        recorded = wanted
    times = [p.cluster_time for p in cp.shards.values()] if cp.shards else [cp.position.cluster_time]
    cp.stream_filter = recorded.passed(times)
    topology.use(reader, cp.stream_filter)
    return wanted


async def open_at(reader: Reader, cp: Checkpoint) -> None:
    """Open ``reader`` at the checkpoint's position (each shard's, for a cluster)."""
    if isinstance(reader, MergedReader):
        await reader.open(cp.shards, cp.position)
    else:
        await reader.open(cp.position)
