"""A change stream read as raw documents with the synchronous driver, in Spark's Python processes.

The same stream as :class:`~replicator.source.changestream.ChangeStreamReader` (the whole deployment but
admin, local and config, expanded DDL events, large events split and assembled again), without
normalizing: a row keeps the change document's bytes, and offsets need only each event's ``_id``,
``clusterTime`` and transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator, Mapping
from typing import Any

import pymongo
from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp
from pymongo.change_stream import ChangeStream
from pymongo.errors import ConnectionFailure, OperationFailure, PyMongoError

from replicator.events import Position
from replicator.settings.config import Settings
from replicator.source.changestream import _OVERSIZE_FLAG, _assemble
from replicator.source.connection import DICT_CODEC, client_options, failure, read_timeout, refusals
from replicator.source.stream_errors import (
    _TOO_LARGE_CODES,
    OversizePlan,
    _history_error,
    after_refusal,
    check_in_oplog,
    reopen_options,
)

log = logging.getLogger("mcdc.spark")

SyncClient = pymongo.MongoClient[RawBSONDocument]


@contextlib.contextmanager
def sync_client(
    uri: str, timeout_s: float, io_timeout_s: float | None = None, *, role: str = "source"
) -> Iterator[SyncClient]:
    """A synchronous client returning raw BSON, with the codec options of the asyncio engine's clients
    (dates outside Python's range kept, UUIDs left as binary); ``io_timeout_s`` for a source (see
    connection.read_timeout). Closed on leaving. A server that cannot be reached, or refuses us, while it
    is in use is told as the CLI tells it (:func:`~replicator.source.connection.failure`), in one line
    naming ``role`` and the URI without credentials."""
    options = client_options(timeout_s, "mcdc-spark", uri)
    listeners = [refusals("source", uri)]  # a refused command is told with the role that grants it
    client: SyncClient = pymongo.MongoClient(
        uri, **options, **read_timeout(uri, io_timeout_s), event_listeners=listeners
    )
    try:
        yield client
    except (ConnectionFailure, OperationFailure) as exc:
        raise asyncio.run(failure(exc, client, uri, role)) from None
    finally:
        client.close()


def transaction_of(raw: Mapping[str, Any]) -> tuple[bytes, int] | None:
    """The (lsid bytes, txnNumber) of an event inside a multi-document transaction, else None."""
    lsid, number = raw.get("lsid"), raw.get("txnNumber")
    if lsid is None or number is None:
        return None
    lsid_id = lsid.get("id")
    return bytes(lsid_id) if lsid_id is not None else b"", int(number)


class RawChangeStream:
    """One deployment's (or shard's) change stream, opened at a position, read one whole event at a time."""

    def __init__(
        self, client: SyncClient, settings: Settings, *, max_await_ms: int = 200, match: Mapping[str, Any] | None = None
    ) -> None:
        self.client = client
        self._s = settings
        self._max_await_ms = max_await_ms
        self._match = [{"$match": match}] if match is not None else []  # filtered on the server, before any split
        self._plan = OversizePlan(settings.oversize)
        self._kwargs: dict[str, Any] = {}
        self._fragments: list[Any] = []
        self._stream: ChangeStream[RawBSONDocument] | None = None

    def open(self, start: Position) -> None:
        kwargs: dict[str, Any] = {"max_await_time_ms": self._max_await_ms, "show_expanded_events": True}
        if self._s.full_document != "default":
            kwargs["full_document"] = self._s.full_document
        if self._s.pre_images != "off":
            kwargs["full_document_before_change"] = self._s.pre_images
        if start.resume_token is not None:
            kwargs["resume_after"] = start.resume_token
        elif start.cluster_time is not None:
            check_in_oplog(start, self._oldest())
            kwargs["start_at_operation_time"] = start.cluster_time
        self._fragments = []
        self._kwargs = kwargs
        self._watch(kwargs, start)

    def _oldest(self) -> Timestamp | None:
        """The oplog's oldest entry's time (None where it cannot be read: see changestream.oplog_window)."""
        try:
            entry = self.client.local.get_collection("oplog.rs", codec_options=DICT_CODEC).find_one(
                {}, {"ts": 1}, sort=[("$natural", 1)]
            )
        except PyMongoError:
            return None
        return entry["ts"] if entry is not None and isinstance(entry.get("ts"), Timestamp) else None

    def _watch(self, kwargs: dict[str, Any], start: Position | None) -> None:
        while True:  # the same fallbacks as ChangeStreamReader.open
            try:
                self._stream = self.client.watch([*self._match, *self._plan.stages()], **kwargs)
                return
            except OperationFailure as exc:
                after_refusal(self._plan, exc, kwargs, start)

    def _reopen_after_oversize(self, stream: ChangeStream[RawBSONDocument]) -> ChangeStream[RawBSONDocument]:
        """Opened again right after the last event handed out, with the split stage (or the trimming one)."""
        self._plan.too_large()
        kwargs = reopen_options(self._kwargs, stream.resume_token)
        stream.close()
        self._watch(kwargs, None)
        assert self._stream is not None
        return self._stream

    @property
    def resume_token(self) -> Any:
        assert self._stream is not None, "open() first"
        return self._stream.resume_token

    def poll(self) -> Mapping[str, Any] | None:
        """The next whole event, or None when the server has nothing more right now. Fragments of a
        split event are assembled (the event's ``_id`` is its last fragment's). An event over 16 MB
        that ``oversize skip`` trimmed on the server is returned flagged (see :func:`skipped`)."""
        stream = self._stream
        assert stream is not None, "open() first"
        while True:
            try:
                raw = stream.try_next()
            except OperationFailure as exc:
                if exc.code not in _TOO_LARGE_CODES:
                    raise _history_error(exc, None) or exc from None
                stream = self._reopen_after_oversize(stream)  # an event over 16 MB: split from here on
                continue
            if raw is None:
                if self._fragments:  # the rest of a split event is on its way
                    continue
                return None
            if "splitEvent" in raw:
                self._fragments.append(raw)
                if raw["splitEvent"]["fragment"] < raw["splitEvent"]["of"]:
                    continue
                whole, self._fragments = _assemble(self._fragments), []
                return whole
            return raw

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None


def skipped(raw: Mapping[str, Any]) -> bool:
    """An event over 16 MB trimmed on the server (``oversize skip``): it moves the offset, makes no row."""
    return _OVERSIZE_FLAG in raw and bool(raw[_OVERSIZE_FLAG])


def log_skipped(raw: Mapping[str, Any]) -> None:
    ns = raw.get("ns") or {}
    log.warning(
        "skipped a change event over 16 MB (oversize skip): %s on %s.%s, %s",
        raw.get("operationType"), ns.get("db"), ns.get("coll"), raw.get("documentKey"),
    )  # fmt: skip
