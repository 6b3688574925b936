"""A Debezium MongoDB connector's offset, as Kafka Connect stores it, made a position mcdc starts after. Pure.

Kafka Connect keeps a source connector's offsets in its offsets topic (``offset.storage.topic``, by default
``connect-offsets``; an embedded engine's in ``offset.storage.file.filename`` or the same topic), one record
per source partition: the key ``["<connector name>", {"server_id": "<topic.prefix>"}]`` (a sharded connector of
Debezium 2.x in ``replica_set`` mode had one per replica set: ``{"server_id": ..., "rs": "<set>"}``), the value
the offset (Debezium 3.6's ``MongoDbOffsetContext.getOffset``)::

    {"sec": 1796686220, "ord": 2, "resume_token": "<base64 of the resume token's BSON>",
     "transaction_id": "<lsid>:<txnNumber>", "transaction_data_collection_order_shop.orders": 3}

``sec``/``ord`` are the last event's cluster time (-1 when Debezium has a token only); ``resume_token``
the change stream's resume token (older versions: its ``_data`` string as is); ``initsync`` marks an offset
taken while the initial snapshot ran; ``lsid``/``txnNumber`` and ``transaction_*`` are there while an event
of a multi-document transaction was the last one written (``TransactionContext.store``: its id and how many
of its events each collection had so far).

Debezium resumes the stream right after the token (``resumeAfter``), or at the cluster time when it has none
(``startAtOperationTime``); mcdc does the same, and continues a transaction Debezium had begun writing with its
id and counts (no second BEGIN; END with the whole transaction's counts).

:func:`parse` takes the value alone, Kafka Connect's ``GET /connectors/NAME/offsets`` answer (3.6+:
``{"offsets": [{"partition": {...}, "offset": {...}}]}``), or lines ``KEY<TAB>VALUE`` as Kafka's console
consumer prints the offsets topic with ``print.key=true`` (or ``kcat -K '\\t'``): the last value of each key
counts, a null value removes it (a tombstone), as Kafka Connect reads the topic.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any

import bson
from bson.timestamp import Timestamp

from replicator.errors import ConfigError
from replicator.events import Position

OPTION = "--start-after-debezium-offset"
_TX_ORDER = "transaction_data_collection_order_"


@dataclass(frozen=True)
class OpenTransaction:
    """A transaction Debezium had written part of: its id and its events so far per collection (db.coll)."""

    id: str
    counts: tuple[tuple[str, int], ...]

    @property
    def total(self) -> int:
        return sum(count for _, count in self.counts)


@dataclass(frozen=True)
class DebeziumOffset:
    """Where a Debezium MongoDB connector stopped: the position to resume after, the transaction it was in,
    and whose offset it is (``server_id``: its ``topic.prefix``; ``replica_set``: set for a per-replica-set
    offset; both None when only the value was given)."""

    position: Position
    transaction: OpenTransaction | None = None
    server_id: str | None = None
    replica_set: str | None = None

    def to_json(self) -> dict[str, Any]:
        """What a checkpoint records of the hand-over (the token as its ``_data``)."""
        token = self.position.resume_token
        return {
            "resume_token": dict(token) if token is not None else None,
            "cluster_time": list(ts_pair(self.position.cluster_time)) if self.position.cluster_time else None,
            "transaction": {"id": self.transaction.id, "counts": [list(c) for c in self.transaction.counts]}
            if self.transaction is not None
            else None,
            "server_id": self.server_id,
            "replica_set": self.replica_set,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DebeziumOffset:
        tx = data.get("transaction")
        ct = data.get("cluster_time")
        return cls(
            Position(resume_token=data.get("resume_token"), cluster_time=Timestamp(*ct) if ct else None),
            OpenTransaction(str(tx["id"]), tuple((str(n), int(c)) for n, c in tx["counts"])) if tx else None,
            data.get("server_id"),
            data.get("replica_set"),
        )


def ts_pair(ts: Timestamp | None) -> tuple[int, int]:
    return (ts.time, ts.inc) if ts is not None else (0, 0)


def read_option(value: str) -> str:
    """The option's text: the offset itself, or ``@FILE``'s content."""
    if not value.startswith("@"):
        return value
    path = value[1:]
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as exc:
        raise ConfigError(f"{OPTION} @{path}: cannot read the file: {exc.strerror or exc}") from None


def parse(text: str, *, prefix: str) -> DebeziumOffset:
    """The offset in ``text`` (see the module's docstring) for the connector whose ``topic.prefix`` is
    ``prefix`` (mcdc's ``--topic-prefix``: the same topics). A one-line ConfigError when it cannot be used."""
    entries = _entries(text)
    if not entries:
        raise ConfigError(f"{OPTION}: no offset in the text given: pass the offset's JSON value, e.g. {_EXAMPLE}")
    keyed = [(key, value) for key, value in entries if key is not None]
    if keyed:
        mine = [(k, v) for k, v in keyed if k.get("server_id") == prefix]
        if not mine:
            theirs = sorted({str(k.get("server_id")) for k, _ in keyed})
            raise ConfigError(
                f"{OPTION}: the offsets are those of topic.prefix {', '.join(theirs)}, another connector's "
                f"topics than mcdc's --topic-prefix {prefix}: pass --topic-prefix {theirs[0]} to continue on them"
            )
        sets = sorted({str(k["rs"]) for k, _ in mine if k.get("rs")})
        if len(mine) > 1:
            raise ConfigError(
                f"{OPTION}: the offsets are per replica set ({', '.join(sets) or 'several'}), as a sharded "
                "connector in replica_set mode keeps them: their tokens resume each shard's own stream, not a "
                "cluster-wide one; take a new snapshot instead (leave the option out)"
            )
        key, value = mine[0]
        return _offset(value, server_id=prefix, replica_set=str(key["rs"]) if key.get("rs") else None)
    return _offset(entries[-1][1])


_EXAMPLE = '\'{"sec": 1796686220, "ord": 2, "resume_token": "hwAAAAJfZGF0YQ..."}\''


def _entries(text: str) -> list[tuple[dict[str, Any] | None, dict[str, Any]]]:
    """(key, value) of each line ``KEY<TAB>VALUE``, the last value per key, tombstones applied; or (None,
    value) for a bare value (the whole text, or each line)."""
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            whole = _object(json.loads(stripped))
        except json.JSONDecodeError:
            pass  # several lines of values: read line by line
        else:
            if isinstance(whole.get("offsets"), list):  # Kafka Connect's REST API: GET /connectors/NAME/offsets
                return [(_object(o.get("partition")), _object(o.get("offset"))) for o in whole["offsets"]]
            return [(None, whole)]
    by_key: dict[str, tuple[dict[str, Any] | None, dict[str, Any] | None]] = {}
    for number, line in enumerate(stripped.splitlines(), 1):
        if not line.strip():
            continue
        key_text, tab, value_text = line.partition("\t")
        if not tab:
            key_text, value_text = "", line
        try:
            key = json.loads(key_text) if key_text.strip() else None
            value = json.loads(value_text) if value_text.strip() not in ("", "null") else None
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"{OPTION}: line {number} is not JSON ({exc.msg}): expected the offset's value "
                "or KEY<TAB>VALUE as the offsets topic holds it"
            ) from None
        partition = key[1] if isinstance(key, list) and len(key) == 2 and isinstance(key[1], dict) else None
        if key is not None and partition is None:
            raise ConfigError(f'{OPTION}: line {number}\'s key is not a Kafka Connect offset key (["name", {{...}}])')
        by_key[json.dumps(key, sort_keys=True)] = (partition, _object(value) if value is not None else None)
    return [(k, v) for k, v in by_key.values() if v is not None]


def _object(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"{OPTION}: the offset must be a JSON object, e.g. {_EXAMPLE}")
    return value


def _offset(value: dict[str, Any], *, server_id: str | None = None, replica_set: str | None = None) -> DebeziumOffset:
    if value.get("initsync"):
        raise ConfigError(
            f"{OPTION}: the offset was taken during Debezium's initial snapshot (initsync): it holds no stream "
            "position to go on from; let the connector finish its snapshot and stop it then, or leave the option out"
        )
    sec, order = _int(value, "sec"), _int(value, "ord")
    cluster_time = Timestamp(sec, order) if sec > 0 else None
    token = _token(value.get("resume_token"))
    if token is None and cluster_time is None:
        hint = " (Debezium 1.x's oplog offset)" if "h" in value else ""
        raise ConfigError(f"{OPTION}: the offset holds no resume token and no time to start from{hint}")
    transaction = None
    tx_id = value.get("transaction_id")
    if tx_id is not None:
        counts = tuple((name[len(_TX_ORDER) :], _int(value, name)) for name in value if name.startswith(_TX_ORDER))
        transaction = OpenTransaction(str(tx_id), counts)
    return DebeziumOffset(Position(resume_token=token, cluster_time=cluster_time), transaction, server_id, replica_set)


def _int(value: dict[str, Any], name: str) -> int:
    field = value.get(name, 0)
    if field is None:
        return 0
    if isinstance(field, bool) or not isinstance(field, int | str):
        raise ConfigError(f"{OPTION}: the offset's {name} is not a whole number: {json.dumps(field)}")
    try:
        return int(field)
    except ValueError:
        raise ConfigError(f"{OPTION}: the offset's {name} is not a whole number: {json.dumps(field)}") from None


def _token(text: Any) -> dict[str, Any] | None:
    """A resume token as ``ResumeTokens.fromBase64`` reads it (the BSON of ``{"_data": ...}``), or an
    older offset's ``_data`` string itself (``ResumeTokens.fromData``)."""
    if text is None:
        return None
    if not isinstance(text, str) or not text:
        raise ConfigError(f"{OPTION}: the offset's resume_token is not a string: {json.dumps(text)}")
    try:
        document = bson.decode(base64.b64decode(text, validate=True))
    except (binascii.Error, ValueError, bson.errors.InvalidBSON):
        document = None
    if document is not None:
        if "_data" not in document:
            raise ConfigError(f"{OPTION}: the offset's resume_token holds no _data: {text}")
        return dict(document)
    if all(c in "0123456789abcdefABCDEF" for c in text):
        return {"_data": text}
    raise ConfigError(f"{OPTION}: the offset's resume_token is neither a token's BSON in base64 nor its hex _data")
