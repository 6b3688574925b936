"""Where and how fast the source's documents are read: --read-preference and --max-read-rate.

The snapshot's reads, mcdc's own lookups by ``_id`` and verify's source reads go where ``--read-preference``
says; the change stream and the catalog commands stay where the URI puts them (the primary by default).
A read that may reach another member than the primary is sent in a causally consistent session whose
operation time is the state it must not be older than (the snapshot's start, the event looked up, the
verify pass's start): the driver adds ``readConcern: {afterClusterTime}``, and the member waits until it
has applied the oplog that far before it answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

from bson.timestamp import Timestamp
from pymongo import MongoClient
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.client_session import ClientSession
from pymongo.collection import Collection
from pymongo.errors import ConfigurationError, PyMongoError
from pymongo.read_concern import ReadConcern
from pymongo.read_preferences import Nearest, Primary, PrimaryPreferred, Secondary, SecondaryPreferred, _ServerMode

from replicator.errors import ConfigError, ServerUnavailable
from replicator.events import Namespace
from replicator.settings.config import Settings
from replicator.source.changestream import current_time
from replicator.source.connection import DICT_CODEC, Client, ServerInfo
from replicator.source.pace import TokenBucket, chunk_for

_MODES: dict[str, type[PrimaryPreferred | Secondary | SecondaryPreferred | Nearest]] = {
    "primaryPreferred": PrimaryPreferred,
    "secondary": Secondary,
    "secondaryPreferred": SecondaryPreferred,
    "nearest": Nearest,
}


def max_staleness(uri: str) -> int:
    """The URI's ``maxStalenessSeconds`` (-1: none), as the driver reads it: pymongo takes it only with a
    readPreference other than primary in the same URI."""
    query = uri.split("?", 1)[1] if "?" in uri else ""
    for key, values in parse_qs(query).items():
        if key.lower() == "maxstalenessseconds" and values:
            try:
                return int(values[-1])
            except ValueError:
                return -1  # the client refuses the URI itself, in its own words
    return -1


@dataclass(frozen=True)
class ReadPolicy:
    """The read preference's mode, the URI's maxStalenessSeconds and the documents/s cap (0: none): plain
    data, pickled into Spark tasks."""

    mode: str = "primary"
    max_staleness_s: int = -1
    rate: float = 0.0

    @classmethod
    def of(cls, s: Settings) -> ReadPolicy:
        return cls(s.read_preference, max_staleness(s.source), float(s.max_read_rate))

    @property
    def preference(self) -> _ServerMode:
        """pymongo's read preference: a primary read never carries maxStalenessSeconds."""
        mode = _MODES.get(self.mode)
        return Primary() if mode is None else mode(max_staleness=self.max_staleness_s)

    @property
    def causal(self) -> bool:
        """May a read reach a member that is behind the primary? Then it waits for the state it needs."""
        return self.mode != "primary"

    def shared(self, readers: int) -> ReadPolicy:
        """This policy for one of ``readers`` tasks that share no bucket: each gets an equal part of the rate."""
        return ReadPolicy(self.mode, self.max_staleness_s, self.rate / max(1, readers) if self.rate > 0 else 0.0)


@dataclass
class SourceReads:
    """One run's (or one task's) reads of source documents: the policy, the source time no read may be
    older than (None: no such bound), and the bucket its readers share."""

    policy: ReadPolicy = field(default_factory=ReadPolicy)
    since: Timestamp | None = None
    bucket: TokenBucket | None = None

    @classmethod
    def start(cls, policy: ReadPolicy, since: Timestamp | None = None) -> SourceReads:
        return cls(policy, since, TokenBucket(policy.rate) if policy.rate > 0 else None)

    def chunk(self, batch_docs: int) -> int:
        """Documents per read (the cursor's batch size): a paced reader reads small parts."""
        return chunk_for(self.policy.rate, batch_docs) if self.bucket is not None else batch_docs

    def collection(self, client: Client, ns: Namespace) -> AsyncCollection[Any]:
        return client[ns.db].get_collection(ns.coll or "", read_preference=self.policy.preference, **self._concern())

    def sync_collection(self, client: MongoClient[Any], ns: Namespace) -> Collection[Any]:
        return client[ns.db].get_collection(ns.coll or "", read_preference=self.policy.preference, **self._concern())

    def _concern(self) -> dict[str, Any]:
        """A read that may reach a secondary says readConcern "local": on a sharded cluster its shard then
        filters out orphaned documents (MongoDB 3.6 to 4.2 read secondaries as "available" unless told,
        which does not: MongoShake#392). A primary read keeps the client's."""
        return {"read_concern": ReadConcern("local")} if self.policy.causal else {}

    @contextlib.asynccontextmanager
    async def session(self, client: Client, since: Timestamp | None = None) -> AsyncIterator[AsyncClientSession | None]:
        """A causally consistent session at ``since`` (default: the reads' own), for reads that may go to
        a secondary; None for the primary's (read as before, without a session of mcdc's)."""
        at = since or self.since
        if not self.policy.causal or at is None:
            yield None
            return
        async with client.start_session(causal_consistency=True) as session:
            session.advance_operation_time(at)
            yield session

    @contextlib.contextmanager
    def sync_session(self, client: MongoClient[Any]) -> Iterator[ClientSession | None]:
        if not self.policy.causal or self.since is None:
            yield None
            return
        with client.start_session(causal_consistency=True) as session:
            session.advance_operation_time(self.since)
            yield session

    async def pace(self, docs: int) -> None:
        """Wait until ``docs`` more documents may be read."""
        if self.bucket is not None:
            wait = self.bucket.reserve(docs)
            if wait > 0:
                await asyncio.sleep(wait)

    def sync_pace(self, docs: int) -> None:
        if self.bucket is not None:
            wait = self.bucket.reserve(docs)
            if wait > 0:
                time.sleep(wait)

    def unused(self, docs: int) -> None:
        """Documents paced for that the read did not return."""
        if self.bucket is not None:
            self.bucket.give_back(docs)


async def check_members(client: Client, policy: ReadPolicy, role: str = "source") -> None:
    """Fail at once, in one line, when ``secondary`` cannot be served: a URI connected directly to one
    server reads that server whatever the preference, and a replica set of one member has no secondary.
    Else the reads would wait the server selection timeout, again at each retry. A mongos routes the
    preference itself; the other modes fall back to the primary."""
    if policy.mode != "secondary":
        return
    try:
        hello = await client.admin.command("hello", codec_options=DICT_CODEC)
    except PyMongoError:
        return  # the reads themselves report an outage
    if hello.get("msg") == "isdbgrid" or not hello.get("setName"):
        return
    direct = client.topology_description.topology_type_name == "Single"
    if direct and hello.get("isWritablePrimary"):
        raise ConfigError(
            f"--read-preference secondary: the {role} URI connects directly to the primary (directConnection): "
            f"name the replica set instead (replicaSet={hello['setName']}) so that its secondaries are found"
        )
    members = [*hello.get("hosts", ()), *hello.get("passives", ())]
    if len(members) < 2:
        raise ConfigError(
            f"--read-preference secondary: the {role}'s replica set {hello['setName']} has no secondary "
            "(one data-bearing member): use secondaryPreferred, which falls back to the primary"
        )
    try:
        await client.admin.command("ping", read_preference=policy.preference)
    except ConfigurationError as exc:
        raise ConfigError(f"--read-preference secondary: {exc}") from None
    except PyMongoError:
        raise ServerUnavailable(
            f"--read-preference secondary: no secondary of the {role}'s replica set {hello['setName']} is "
            "available now (secondaryPreferred falls back to the primary)"
        ) from None


async def start_reads(client: Client, info: ServerInfo, policy: ReadPolicy) -> SourceReads:
    """A verify's reads of the source: checked to be servable (:func:`check_members`), and no older than the
    source's time now, where they may reach a secondary (a standalone server has no other member)."""
    await check_members(client, policy)
    since = await current_time(client) if policy.causal and info.has_change_streams else None
    return SourceReads.start(policy, since)
