"""``MongoLakeflowConnect``: the interface of Databricks Labs' Lakeflow community connectors
(``LakeflowConnect``), over the ``mcdc`` Spark data source's readers. It does not import that framework.

One table is one collection. ``read_table`` pages through its snapshot (the data source's plan: one
or more ``_id`` ranges a page), then its change stream; ``read_table_deletes`` pages through the deletes.
Offsets are the data source's (offsets.py): per-shard resume tokens with ``n``, the snapshot's plan while
it is read. So a page is a function of its start offset: read again from the same offset after a crash,
it gives the same records in the same order (a stream page that had reached the end of the stream may
go on with changes made since, which the next page would have brought, at their own ``sequence``).

How the two flows stay consistent: the framework applies both to one table by key in ``sequence``
order (Auto CDC keeps a deleted key's sequence as a tombstone). Both number the same server-filtered
stream, so a delete orders against every upsert of its document. The upserts start with the snapshot,
at its read time; the deletes start earlier, at the oldest time the oplog holds, so no delete after the
snapshot's time is missed whichever flow begins first (deletes older than a document's row are ignored
by its sequence).

A flow's paging reads no event later than the source's time at its first page, so that it ends (the
framework stops when an offset comes back unchanged) while writes go on; the next paging goes on from there.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import Iterator, Mapping
from typing import Any

from bson.timestamp import Timestamp
from pymongo.errors import PyMongoError
from pyspark.sql.streaming.datasource import ReadMaxRows
from pyspark.sql.types import StructType

from replicator.errors import ConfigError, McdcError, quoted
from replicator.events import Namespace
from replicator.lakeflow.records import (
    DELETES,
    SCHEMA,
    UPSERTS,
    mcdc_options,
    metadata,
    namespace_of,
    record_of,
    shard_fields,
)
from replicator.settings.config import Settings
from replicator.settings.stream_match import change_match
from replicator.settings.unmatched import near
from replicator.source import catalog
from replicator.source.changestream import oplog_window
from replicator.source.connection import make_client, probe, server_message
from replicator.source.sharding import is_mongos, read_sharding
from replicator.spark_datasource import offsets
from replicator.spark_datasource.changes import sync_client
from replicator.spark_datasource.offsets import ShardOffset
from replicator.spark_datasource.options import settings_for
from replicator.spark_datasource.snapshot import check_selection
from replicator.spark_datasource.stream import ChangeStreamReader, position_now

log = logging.getLogger("mcdc.lakeflow")

#: How long a table's stream may stay without an event of its own before its offset moves on to the
#: stream's post-batch token anyway (so that a quiet collection's offset keeps inside the oplog), unless
#: ``heartbeat-interval`` says otherwise. Moving sooner would end no read: the framework stops paging
#: when an offset comes back unchanged, and the server's clock moves every second.
IDLE_MOVE_S = 60.0


class LakeflowError(McdcError):
    """An error of the connector, in one line (a mistake in the options, a source it cannot reach or
    that refused it): shown as ``mcdc: <message>``, as the ``mcdc`` data source's are."""

    __module__ = "builtins"
    __qualname__ = "mcdc"


@contextlib.contextmanager
def _one_line() -> Iterator[None]:
    """mcdc's and the driver's errors as one :class:`LakeflowError` line, without a traceback of their own
    (the URI's credentials are never in it: every message is redacted where it is made)."""
    try:
        yield
    except LakeflowError:
        raise
    except McdcError as exc:
        raise LakeflowError(str(exc)) from None
    except PyMongoError as exc:
        raise LakeflowError(f"MongoDB: {server_message(exc)}") from None


class MongoLakeflowConnect:
    """A Lakeflow Connect source of MongoDB: ``list_tables``, ``get_table_schema``, ``read_table_metadata``,
    ``read_table`` and ``read_table_deletes`` of the framework's ``LakeflowConnect``.

    ``options`` are mcdc's long option names (``source``, ``include``, ``exclude``, ``full-document``,
    ``max-batch-size``, ``partition-docs``, ``extended-json``, ...); the framework's own keys
    (``tableName``, ...) are left to it. A table's options (``table_options``) override them for that table.
    A mistake in them fails here, in one line, before any connection."""

    def __init__(self, options: dict[str, str]) -> None:
        self.options = dict(options)
        with _one_line():
            self._settings = _checked(settings_for(mcdc_options(self.options), "source"))
        self._tables: list[str] | None = None
        self._shard_keys: dict[Namespace, tuple[str, ...]] = {}
        # (table, flow) -> the source's time when its pages began: what they read up to, so that paging ends
        # under a steady stream of writes (the framework's "init-time cap"); forgotten once they ended
        self._until: dict[tuple[str, bool], Timestamp] = {}

    # --- the interface ------------------------------------------------------------------------------------

    def list_tables(self) -> list[str]:
        """The selected collections (``include``/``exclude``) as ``db.coll``, of the databases the user may
        read (listDatabases with authorizedDatabases, or those the include patterns name)."""
        with _one_line():
            self._tables = asyncio.run(_collections(self._settings))
            return list(self._tables)

    def get_table_schema(self, table_name: str, table_options: dict[str, str]) -> StructType:
        with _one_line():
            self._known(table_name)
            return SCHEMA

    def read_table_metadata(self, table_name: str, table_options: dict[str, str]) -> dict[str, Any]:
        with _one_line():
            return metadata(self._shard_key(self._known(table_name)))

    def read_table(
        self, table_name: str, start_offset: dict[str, Any] | None, table_options: dict[str, str]
    ) -> tuple[Iterator[dict[str, Any]], dict[str, Any]]:
        """The next page of the table's records after ``start_offset`` (None or ``{}``: the first call, which
        plans the snapshot at the source's time now and returns its offset, with no records yet)."""
        with _one_line():
            reader = self._reader(table_name, table_options, snapshot=True)
            if not start_offset:
                return iter(()), reader.initialOffset()
            return self._page(reader, start_offset, UPSERTS, (table_name, False))

    def read_table_deletes(
        self, table_name: str, start_offset: dict[str, Any] | None, table_options: dict[str, str]
    ) -> tuple[Iterator[dict[str, Any]], dict[str, Any]]:
        """The next page of the table's deletes (``_id``, ``key``, ``op`` ``d`` and ``sequence`` set). The
        first call returns where they start: the oldest time each shard's oplog holds."""
        with _one_line():
            reader = self._reader(table_name, table_options, snapshot=False)
            if not start_offset:
                return iter(()), _oldest(reader)
            return self._page(reader, start_offset, DELETES, (table_name, True))

    # --- paging ---------------------------------------------------------------------------------------------

    def _page(
        self, reader: ChangeStreamReader, start: dict[str, Any], ops: frozenset[str], flow: tuple[str, bool]
    ) -> tuple[Iterator[dict[str, Any]], dict[str, Any]]:
        """The page after ``start``, no event later than the time the flow's paging began (taken at its
        first page, forgotten at its last: a flow paged again later, or in continuous mode, goes on)."""
        s = reader.settings
        if flow not in self._until:
            reader.prepareForTriggerAvailableNow()
            assert reader.until is not None
            self._until[flow] = reader.until
        reader.until = self._until[flow]
        end = reader.latestOffset(start, ReadMaxRows(s.replay_batch))
        end = _hold_idle(start, end, s.heartbeat_interval_s or IDLE_MOVE_S)
        if end == start:
            del self._until[flow]
            return iter(()), start
        shard_key = self._shard_key(namespace_of(flow[0]))
        records = []
        for part in reader.partitions(start, end):
            for row in reader.read(part):
                record = record_of(row, shard_key)
                if record is not None and record["op"] in ops:
                    records.append(record)
        return iter(records), end

    def _reader(self, table: str, table_options: Mapping[str, str], *, snapshot: bool) -> ChangeStreamReader:
        """The data source's stream reader of one table: its collection selected alone, its stream filtered
        on the server."""
        ns = self._known(table)
        options = {**mcdc_options(self.options), **mcdc_options(table_options or {})}
        options["include"] = json.dumps([re.escape(str(ns))])
        options.pop("exclude", None)
        if snapshot:
            options.setdefault("snapshot", "initial")
        else:
            options["snapshot"] = "never"
        settings = _checked(settings_for(options, "source"))
        reader = ChangeStreamReader(options)
        reader.match = change_match(settings.selection)  # the command line's own, for this one collection
        reader.checked = True  # the connector's rules were checked against its whole selection (_known)
        return reader

    def _shard_key(self, ns: Namespace) -> tuple[str, ...]:
        """The fields besides ``_id`` the collection is sharded on, read once through the source's mongos
        (none on a replica set, or for a collection sharded on ``_id`` alone, hashed or not)."""
        if ns not in self._shard_keys:
            self._shard_keys[ns] = asyncio.run(_shard_fields(self._settings, ns))
        return self._shard_keys[ns]

    def _known(self, table: str) -> Namespace:
        """The collection of a table the connector lists, else a ConfigError naming the closest."""
        ns = namespace_of(table)
        if self._tables is None or table not in self._tables:
            self._tables = asyncio.run(_collections(self._settings))
        if table not in self._tables:
            hint = near(table, self._tables)
            raise ConfigError(f"table {quoted(table)} is not a selected collection of the source{hint}")
        return ns


def _checked(s: Settings) -> Settings:
    """Settings a Lakeflow table can be read with: an update's record carries the whole document, which
    the framework upserts, so the stream must look it up (or read its post-image)."""
    if s.full_document == "default":
        raise ConfigError(
            "option full-document default gives updates without their document, and Lakeflow upserts whole "
            "records: use updateLookup (the default), whenAvailable or required"
        )
    return s


async def _collections(s: Settings) -> list[str]:
    """The selected collections, once the selection's rules are checked against the source (a rule that
    matches none is refused unless ``allow-unmatched`` says it means a collection created later)."""
    client = make_client(s.source, timeout_s=s.connect_timeout_s, io_timeout_s=s.io_timeout_s)
    try:
        await probe(client, s.source, "source")
        await check_selection(client, s)
        specs = await catalog.describe(client, s.selection)
        return sorted(str(spec.ns) for spec in specs if spec.kind == "collection")
    finally:
        await client.close()


async def _shard_fields(s: Settings, ns: Namespace) -> tuple[str, ...]:
    client = make_client(s.source, timeout_s=s.connect_timeout_s, io_timeout_s=s.io_timeout_s)
    try:
        await probe(client, s.source, "source")
        if not is_mongos(client):
            return ()
        try:
            found = await read_sharding(client, [ns], bounds=False)
        except ConfigError:
            raise ConfigError(
                f"source: reading config.collections (how {ns} is sharded: its records' key) was refused; "
                "grant the source user clusterMonitor"
            ) from None
        return shard_fields(found[ns].key) if ns in found else ()
    finally:
        await client.close()


def _oldest(reader: ChangeStreamReader) -> dict[str, Any]:
    """Each stream's oldest operation time (where the deletes start), or its position now where the oplog
    cannot be read (no read access to ``local``): then deletes made before the snapshot flow's first call
    and after its snapshot's time would be missed, which is logged."""
    s = reader.settings
    start: dict[str, ShardOffset] = {}
    for name, uri in reader.shards().items():
        window = asyncio.run(_window(uri, s))
        if window is not None:
            oldest = window[0]
            start[name] = ShardOffset(None, oldest.time, oldest.inc)
            continue
        log.warning(
            "mcdc lakeflow: the oplog%s cannot be read: deletes start now, and a delete made between the "
            "snapshot's time and now would not reach the table (grant read on local, or start both flows together)",
            f" of shard {name}" if name else "",
        )
        with sync_client(uri, s.connect_timeout_s, s.io_timeout_s) as client:
            start[name] = position_now(client, s)
    return offsets.to_json(start, initial=True)


async def _window(uri: str, s: Settings) -> Any:
    client = make_client(uri, timeout_s=s.connect_timeout_s, io_timeout_s=s.io_timeout_s)
    try:
        return await oplog_window(client)
    finally:
        await client.close()


def _hold_idle(start: Mapping[str, Any], end: dict[str, Any], interval_s: float) -> dict[str, Any]:
    """``end`` with each shard that moved without an event (``idle``) kept at its start, unless it moved
    by ``interval_s`` or more: the server's clock moves every second, and an offset that always moved
    would never let the framework's paging end."""
    before = (start.get("shards") or {}) if isinstance(start, Mapping) else {}
    shards = dict(end.get("shards") or {})
    changed = False
    for name, entry in shards.items():
        if not entry.get("idle") or name not in before:
            continue
        then = ShardOffset.from_json(before[name]).cluster_time
        now = ShardOffset.from_json(entry).cluster_time
        if then is not None and now is not None and now.time - then.time < interval_s:
            shards[name] = before[name]
            changed = True
    if not changed:
        return end
    held = {**end, "shards": shards}
    return dict(start) if _same(held, start) else held


def _same(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
