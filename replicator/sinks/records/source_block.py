"""The ``source`` block of Debezium's envelopes: where and when a change happened.

What is the same for every event of a namespace, replica set and kind (snapshot read or change) is built
once and copied per event (keys in Debezium's order), then the event's own values are set.

As Debezium 3.6's MongoDB connector writes it (``MongoDbSourceInfoStructMaker`` over the common
``AbstractSourceInfoStructMaker``): ``ts_ms``, ``ts_us`` and ``ts_ns`` are one instant, the change's
``wallTime`` (its cluster time's seconds where the server gives no wall time); a snapshot read's is the time it
was read. A snapshot read's ``ord`` is -1: Debezium's position then is the resume token of the change stream
opened before the copy, which holds no cluster time (``Position.getInc()`` of none). ``rs`` (the replica set,
gone from Debezium 2.x's block) and ``version``/``connector`` (mcdc's) are mcdc's own.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Mapping
from typing import Any

import orjson
from bson.binary import Binary
from bson.timestamp import Timestamp

from replicator import __version__
from replicator.bsonkit.extjson import to_json_value
from replicator.events import ChangeEvent, Namespace, Op, Transaction
from replicator.sinks.records.plain import transaction_id


class SourceBlocks:
    """Source blocks for one topic prefix (the connector's ``name``)."""

    def __init__(self, name: str, *, rs: bool = True) -> None:
        """``rs``: with mcdc's own ``rs`` field (Debezium 3.6's block has none)."""
        self._name = name
        self._rs = rs
        self._bases: dict[tuple[Namespace, str, bool, bool], dict[str, Any]] = {}

    def block(
        self, event: ChangeEvent, rs: str, now_ms: int, *, legacy: bool, lsid: str | None, now_us: int | None = None
    ) -> dict[str, Any]:
        """The block of ``event`` read from replica set ``rs``; ``legacy``: Debezium 1.x's fields; ``lsid``:
        the transaction's session id as an extended JSON string (Debezium 2.x). ``now_us``: the time in
        microseconds (``now_ms``'s, to the microsecond), for a snapshot read's ``ts_us``/``ts_ns``."""
        ct = event.change_time
        snapshot = event.op is Op.READ
        base = self._bases.get((event.ns, rs, snapshot, legacy))
        if base is None:
            base = self._base(event.ns, rs, snapshot, legacy)
        source = base.copy()
        source["ts_ms"] = ts = source_ts(event, ct, now_ms)
        if not legacy:
            source["ts_us"] = ts_us = source_ts_us(event, ct, ts, now_us)
            source["ts_ns"] = ts_us * 1000
        if ct is not None:
            source["ord"] = ct.inc
        txn = event.txn
        if legacy:
            if txn is not None:
                source["stxnid"] = transaction_id(txn)
        else:
            if txn is not None:
                source["lsid"] = lsid
                source["txnNumber"] = txn.txn_number
            source["wallTime"] = event.wall_time_ms
        return source

    def _base(self, ns: Namespace, rs: str, snapshot: bool, legacy: bool) -> dict[str, Any]:
        if len(self._bases) >= 10_000:
            self._bases.clear()
        base: dict[str, Any] = {
            "version": __version__,
            "connector": "mongodb",
            "name": self._name,
            "ts_ms": None,
            "snapshot": snapshot if legacy else ("true" if snapshot else "false"),
            "db": ns.db,
            "sequence": None,
        }
        if not legacy:  # Debezium 2.6+: the same instant as ts_ms, to the microsecond and nanosecond
            base.update(ts_us=None, ts_ns=None)
        if self._rs or legacy:
            base["rs"] = rs
        base.update(collection=ns.coll, ord=SNAPSHOT_ORD if snapshot and not legacy else 0)
        if legacy:
            base.update(h=None, tord=None, stxnid=None)
        else:
            base.update(lsid=None, txnNumber=None, wallTime=None)
        self._bases[(ns, rs, snapshot, legacy)] = base
        return base


#: A snapshot read's ``ord`` (Debezium 3.x: -1, see the module's docstring; 1.x wrote 0).
SNAPSHOT_ORD = -1


def source_ts(event: ChangeEvent, ct: Timestamp | None, now_ms: int) -> int:
    """The block's ts_ms: when the change happened; a snapshot read happens now."""
    return event.wall_time_ms if event.wall_time_ms is not None else (ct.time * 1000 if ct else now_ms)


def source_ts_us(event: ChangeEvent, ct: Timestamp | None, ts_ms: int, now_us: int | None) -> int:
    """The block's ts_us, given its ts_ms: a change's time (milliseconds at best) in microseconds; a snapshot
    read's is now, to the microsecond (``now_us``, which agrees with ``ts_ms``)."""
    if event.wall_time_ms is None and ct is None and now_us is not None:
        return now_us
    return ts_ms * 1000


def session_json(lsid: Mapping[str, Any]) -> str:
    """A transaction's session id as Debezium writes it in ``source.lsid`` and in transaction ids, whatever
    ``--extended-json`` says: the Java driver's legacy "strict" JSON, compact (Debezium's
    ``JsonSerialization.COMPACT_JSON_SETTINGS``): ``{"id": {"$binary": "<base64>","$type": "04"}}``."""
    members = ",".join(f"{orjson.dumps(name).decode()}: {_strict(value)}" for name, value in lsid.items())
    return "{" + members + "}"


def _strict(value: Any) -> str:
    if isinstance(value, uuid.UUID):
        value = Binary(value.bytes, 4)
    elif type(value) is bytes:  # binary subtype 0, as pymongo decodes it (the user's uid)
        value = Binary(value, 0)
    if isinstance(value, Binary):
        return f'{{"$binary": "{base64.b64encode(value).decode()}","$type": "{value.subtype:02x}"}}'
    return orjson.dumps(to_json_value(value, relaxed=False)).decode()  # never seen in a session id


def debezium_transaction_id(txn: Transaction) -> str:
    """``<session id as session_json>:<txnNumber>``: Debezium's transaction id (``MongoDbEventMetadataProvider``)."""
    return f"{session_json(txn.lsid)}:{txn.txn_number}"
