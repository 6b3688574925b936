"""ChangeEvent -> keyed messages: Debezium's MongoDB envelopes (or mcdc's own event) as JSON bytes.

One :class:`Encoder` serves every event sink (Kafka, stdout, jsonl). Per event it yields:

* a data message on the collection's topic: key ``{"id": "<_id as extended JSON>"}``, value the envelope;
* a tombstone (same key, null value) after each delete, unless ``--tombstones off``;
* with ``--tx-metadata``, BEGIN and END messages on ``<prefix>.transaction`` around each transaction, and a
  ``transaction`` block (id, total_order, data_collection_order) in its events;
* DDL (drop, rename, dropDatabase, createIndexes, ...) on ``<prefix>.ddl``, keyed by database.

Envelopes (``--envelope``):

``debezium``
    Debezium 2.x's change-stream envelope: ``op`` (r/c/u/d), ``after`` (the full document as an extended
    JSON string, when known), ``before`` (the pre-image, with --pre-images), ``updateDescription``
    (``updatedFields`` as an extended JSON string, ``removedFields``, ``truncatedArrays``), ``source``
    (with Debezium 3.x's ``ts_us``/``ts_ns``, see ``source_block.py``), ``ts_ms`` and ``transaction``. A
    replace is ``u`` with ``after``. As Debezium 3.6's MongoDB connector, the envelope itself has no
    ``ts_us``/``ts_ns`` (its ``MongoDbSchema`` defines ``op``, ``ts_ms`` and ``transaction`` only).
``debezium-legacy``
    Debezium 1.x: ``after`` for reads, inserts and replaces, ``patch`` (an idempotent MongoDB update as a
    string; a list of them, to apply in order, where one cannot hold the change) for updates, ``filter``
    (the document key) for updates and deletes.
``plain``
    mcdc's normalized event with documents as extended JSON objects (not strings): for jq and scripts.

Documents, keys and updatedFields are in canonical Extended JSON (lossless), relaxed, or Debezium 3.6's own
bytes (``json``, :mod:`.dialect`). ``schemas`` wraps key and value as JsonConverter does: ``{schema, payload}``.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson

from replicator.bsonkit.extjson import to_json_value
from replicator.events import ChangeEvent, Namespace, Op, Transaction, UpdateDescription
from replicator.settings.config import Settings
from replicator.sinks.records import connect_schema
from replicator.sinks.records.dialect import dialect
from replicator.sinks.records.plain import plain_event, transaction_id, update_operators
from replicator.sinks.records.source_block import (
    SNAPSHOT_ORD,
    SourceBlocks,
    debezium_transaction_id,
    session_json,
    source_ts,
    source_ts_us,
)
from replicator.sinks.records.templates import (
    MARKERS,
    NULL,
    Parts,
    cut,
    debezium_template,
    debezium_value,
    json_string,
    number,
)
from replicator.sinks.records.topics import TopicNamer

_DATA_OPS = frozenset({Op.READ, Op.INSERT, Op.UPDATE, Op.REPLACE, Op.DELETE})
#: Debezium's op letter for each data op (a replace is an update whose after is the whole document).
_OP_LETTER = {Op.READ: "r", Op.INSERT: "c", Op.UPDATE: "u", Op.REPLACE: "u", Op.DELETE: "d"}
_SNAPSHOT_ORD = b"%d" % SNAPSHOT_ORD


#: A transaction another writer began: its id, and its events so far per collection
_Carried = tuple[str, tuple[tuple[str, int], ...]]
#: Per namespace, replica set and op: the topic, and the key's and Debezium value's templates (None: dicts)
_Route = tuple[str, "Parts | None", "Parts | None"]


class Message(NamedTuple):
    """One record for a topic. ``value`` None is a tombstone. (A tuple: the cheapest immutable record.)"""

    topic: str
    key: bytes | None
    value: bytes | None


@dataclass(frozen=True)
class EnvelopeOptions:
    style: str = "debezium"  # debezium | debezium-legacy | plain
    schemas: bool = False
    relaxed: bool = False
    tombstones: bool = True
    tx_metadata: bool = False
    json: str = ""  # --extended-json: canonical | relaxed | debezium ("": canonical, or relaxed by ``relaxed``)

    @classmethod
    def from_settings(cls, s: Settings) -> EnvelopeOptions:
        return cls(
            style=s.envelope,
            schemas=s.schemas,
            relaxed=s.extended_json == "relaxed",
            tombstones=s.tombstones == "on",
            tx_metadata=s.tx_metadata,
            json=s.extended_json,
        )


class Encoder:
    """Turns batches of events into messages; pure apart from the clock (``ts_ms``)."""

    def __init__(
        self,
        options: EnvelopeOptions,
        topics: TopicNamer,
        *,
        source_name: str = "",
        heartbeat_s: float = 0.0,
        clock: Callable[[], float] = time.time,
        direct: bool = True,
    ) -> None:
        """``direct``: keys and Debezium values from byte templates (``templates.py``); False: every record as a
        dict for orjson, the reference the templates are tested against."""
        self.options = options
        self.topics = topics
        self.source_name = source_name
        self._clock = clock
        self._heartbeat_s = heartbeat_s
        self._last_heartbeat = -float("inf")
        self._relaxed = options.relaxed
        self._dialect = dialect(options.json or ("relaxed" if options.relaxed else "canonical"))
        self._convert, self._text = self._dialect.convert, self._dialect.text
        self._key_schemas: dict[Namespace, dict[str, Any]] = {}
        self._value_schemas: dict[Namespace, dict[str, Any]] = {}
        self._sources = SourceBlocks(topics.prefix, rs=not self._dialect.debezium_source)
        self._direct = direct
        self._routes: dict[tuple[Namespace, str, Op], _Route] = {}
        #: a transaction Debezium began: continued (or ended) until the sink's first acknowledged write
        self.carried: _Carried | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> Encoder:
        """The encoder a run's Settings describe (envelope, topics, JSON mode, tombstones, metadata)."""
        topics = TopicNamer(settings.topic_prefix, settings.topic_routes, sanitize=settings.sanitize_names)
        return cls(EnvelopeOptions.from_settings(settings), topics, heartbeat_s=settings.heartbeat_interval_s)

    # -- batches ------------------------------------------------------------------------------------

    def encode(self, batch: Sequence[ChangeEvent]) -> list[Message]:
        """Every message for a batch, in order (a transaction's events arrive in one batch)."""
        return list(self.iter_encode(batch))

    def iter_encode(self, batch: Sequence[ChangeEvent]) -> Iterator[Message]:
        now = self._clock()
        now_ms = int(now * 1000)
        # to the microsecond (a snapshot read's source.ts_us), never another millisecond than now_ms (rounding);
        # passed along, not kept: the snapshot's workers encode their batches at once, interleaved
        now_us = min(max(int(now * 1_000_000), now_ms * 1000), now_ms * 1000 + 999)
        tx_meta = self.options.tx_metadata
        i, n = 0, len(batch)
        carried = self.carried if tx_meta and n else None
        if carried is not None and (batch[0].txn is None or self._tx_id(batch[0].txn) != carried[0]):
            # Debezium writes a transaction's END when the next event comes: this one
            yield self._tx_message(carried[0], "END", _end(Counter(dict(carried[1]))), batch[0], now_ms)
            carried = None
        while i < n:
            event = batch[i]
            if tx_meta and event.txn is not None:
                j = i + 1
                while j < n and batch[j].txn == event.txn:
                    j += 1
                yield from self._transaction(batch[i:j], event.txn, now_ms, now_us, carried if i == 0 else None)
                i = j
                continue
            yield from self._event(event, now_ms, now_us, None)
            i += 1

    def iter_copy(self, batch: Sequence[ChangeEvent], *, last: bool) -> Iterator[Message]:
        """A snapshot batch's records. ``last``: the batch ends the whole snapshot, and its final read is
        marked as Debezium 3.x marks the last record of a snapshot: ``source.snapshot`` ``"last"`` (its
        buffering snapshot receiver re-marks the one record it holds back when the snapshot completes)."""
        if not last or self.options.style != "debezium" or not batch:
            return self.iter_encode(batch)
        messages = self.encode(batch)  # reads only: one data record each, the last one last
        value = orjson.loads(messages[-1].value or b"null")
        payload = value["payload"] if self.options.schemas else value
        payload["source"]["snapshot"] = "last"
        messages[-1] = messages[-1]._replace(value=orjson.dumps(value))
        return iter(messages)

    def _tx_id(self, txn: Transaction) -> str:
        # Debezium 3.x: the transaction's session id in strict JSON (1.x: mcdc's own)
        return debezium_transaction_id(txn) if self.options.style == "debezium" else transaction_id(txn)

    def _transaction(
        self,
        events: Sequence[ChangeEvent],
        txn: Transaction,
        now_ms: int,
        now_us: int,
        carried: _Carried | None = None,
    ) -> Iterator[Message]:
        """BEGIN, the events, END; ``carried``: another writer wrote its first events: no BEGIN, orders go on."""
        debezium = self.options.style == "debezium"
        tx_id = self._tx_id(txn)
        per_collection: Counter[str] = Counter(dict(carried[1])) if carried is not None else Counter()
        if carried is None:
            yield self._tx_message(tx_id, "BEGIN", None, events[0], now_ms)
        for total, event in enumerate(events, per_collection.total() + 1):
            block = None
            if event.op in _DATA_OPS:
                name = str(event.ns) if debezium else f"{event.rs or self.source_name}.{event.ns}"
                per_collection[name] += 1
                block = {"id": tx_id, "total_order": total, "data_collection_order": per_collection[name]}
            yield from self._event(event, now_ms, now_us, block)
        yield self._tx_message(tx_id, "END", _end(per_collection), events[-1], now_ms)

    def _tx_message(
        self, tx_id: str, status: str, end: tuple[int, list[dict[str, Any]]] | None, event: ChangeEvent, now_ms: int
    ) -> Message:
        value = {
            "status": status,
            "id": tx_id,
            "event_count": end[0] if end else None,
            "data_collections": end[1] if end else None,
            "ts_ms": event.wall_time_ms if event.wall_time_ms is not None else now_ms,
        }
        key = {"id": tx_id}
        if self.options.schemas:
            key = connect_schema.wrap(connect_schema.TX_KEY, key)
            value = connect_schema.wrap(connect_schema.TX_VALUE, value)
        return Message(self.topics.transaction, orjson.dumps(key), orjson.dumps(value))

    # -- one event ----------------------------------------------------------------------------------

    def _event(
        self, event: ChangeEvent, now_ms: int, now_us: int, tx_block: dict[str, Any] | None
    ) -> tuple[Message, ...]:
        """The records of one event (a tuple, not a generator: this runs once per event)."""
        op = event.op
        if op in _DATA_OPS:
            route = self._routes.get((event.ns, event.rs or self.source_name, op))
            if route is None:
                route = self._route(event, now_ms, now_us)
            topic, key_parts, value_parts = route
            # the document is converted once; its _id gives the key without decoding the documentKey
            after = self._convert(event.document) if event.document is not None else None
            key = self._key(event, after, key_parts)
            if value_parts is not None:
                value = self._debezium_bytes(value_parts, event, now_ms, now_us, tx_block, after)
            else:
                value = self._value(event, now_ms, now_us, tx_block, after)
            record = Message(topic, key, value)
            if op is Op.DELETE and self.options.tombstones:
                return record, Message(topic, key, None)
            return (record,)
        if op.is_ddl:
            return (self._ddl(event, now_ms, now_us),)
        return ()  # INVALIDATE: the stream's end, nothing for consumers

    def _route(self, event: ChangeEvent, now_ms: int, now_us: int) -> _Route:
        """What is the same for the records of events like ``event`` (namespace, replica set, op): the topic,
        and the key's and (Debezium) value's templates when records are written from them."""
        key_parts = value_parts = None
        if self._direct:
            key_parts = cut(self._key_data(event.ns, MARKERS[0]), 1)
            if self.options.style == "debezium":
                schema = self._value_schema(event.ns) if self.options.schemas else None
                value_parts = debezium_template(self._debezium(event, now_ms, now_us, None), schema)
        routes = self._routes
        if len(routes) >= 10_000:  # a run over very many namespaces: start over rather than grow
            routes.clear()
        route = routes[(event.ns, event.rs or self.source_name, event.op)] = (
            self.topics.data(event.ns),
            key_parts,
            value_parts,
        )
        return route

    def _key(self, event: ChangeEvent, after: Any, parts: Parts | None) -> bytes:
        doc_id = self._dialect.key_id(event, after)
        if parts is not None:
            return parts[0] + json_string(doc_id) + parts[1]
        return orjson.dumps(self._key_data(event.ns, doc_id.decode()))

    def _key_data(self, ns: Namespace, doc_id: str) -> dict[str, Any]:
        key: dict[str, Any] = {"id": doc_id}
        return connect_schema.wrap(self._key_schema(ns), key) if self.options.schemas else key

    def _value(
        self, event: ChangeEvent, now_ms: int, now_us: int, tx_block: dict[str, Any] | None, after: Any
    ) -> bytes:
        if self.options.style == "plain":
            return orjson.dumps(self.plain(event))
        after_text = self._text(after).decode() if after is not None else None
        return orjson.dumps(self._envelope(event, now_ms, now_us, tx_block, after_text))

    def _envelope(
        self, event: ChangeEvent, now_ms: int, now_us: int, tx_block: dict[str, Any] | None, after: str | None
    ) -> dict[str, Any]:
        if self.options.style == "debezium-legacy":
            payload = self._legacy(event, now_ms, after)
        else:
            payload = self._debezium(event, now_ms, now_us, after)
        payload["transaction"] = tx_block
        if self.options.schemas:
            return connect_schema.wrap(self._value_schema(event.ns), payload)
        return payload

    def _debezium(self, event: ChangeEvent, now_ms: int, now_us: int, after: str | None) -> dict[str, Any]:
        update = None
        if event.op is Op.UPDATE and event.update is not None:
            update = self._update_description(event.update)
        before = event.before
        return {
            "before": self._text(self._convert(before)).decode() if before is not None else None,
            "after": after,
            "updateDescription": update,
            "source": self._source(event, now_ms, now_us, legacy=False),
            "op": _OP_LETTER[event.op],
            "ts_ms": now_ms,
        }

    def _update_description(self, u: UpdateDescription) -> dict[str, Any]:
        return {
            "removedFields": list(u.removed_fields) or None,
            "updatedFields": self._dialect.fields(u.updated_fields),
            "truncatedArrays": [{"field": f, "size": size} for f, size in u.truncated_arrays] or None,
        }

    def _debezium_bytes(
        self, parts: Parts, event: ChangeEvent, now_ms: int, now_us: int, tx_block: dict[str, Any] | None, after: Any
    ) -> bytes:
        """What ``orjson.dumps`` of :meth:`_envelope` gives, its varying values written into ``parts``."""
        ct = event.change_time
        txn, update, before, text = event.txn, event.update, event.before, self._text
        ts, wall = source_ts(event, ct, now_ms), event.wall_time_ms
        ts_us = source_ts_us(event, ct, ts, now_us)
        # integers written inline where they are ints (they always are from normalize): a call less for each
        return debezium_value(
            parts,
            NULL if before is None else json_string(text(self._convert(before))),
            NULL if after is None else json_string(text(after)),
            orjson.dumps(self._update_description(update)) if event.op is Op.UPDATE and update is not None else NULL,
            b"%d" % ts if type(ts) is int else number(ts),
            b"%d" % ts_us,
            b"%d" % (ts_us * 1000),
            b"%d" % ct.inc if ct is not None else _SNAPSHOT_ORD if event.op is Op.READ else b"0",
            NULL if txn is None else orjson.dumps(session_json(txn.lsid)),
            NULL if txn is None else number(txn.txn_number),
            b"%d" % wall if type(wall) is int else number(wall),
            b"%d" % now_ms,
            NULL if tx_block is None else orjson.dumps(tx_block),
        )

    def _legacy(self, event: ChangeEvent, now_ms: int, after: str | None) -> dict[str, Any]:
        patch = filt = None
        if event.op in (Op.UPDATE, Op.REPLACE, Op.DELETE):
            filt = self._json(event.document_key)
        if event.op is Op.UPDATE and event.update is not None:
            patch = self._json(update_operators(event))
        elif event.op is Op.REPLACE:
            patch = after  # as the oplog's replacement "o"
        return {
            "after": after,
            "patch": patch,
            "filter": filt,
            "source": self._source(event, now_ms, None, legacy=True),
            "op": _OP_LETTER[event.op],
            "ts_ms": now_ms,
        }

    def _source(self, event: ChangeEvent, now_ms: int, now_us: int | None, *, legacy: bool) -> dict[str, Any]:
        lsid = session_json(event.txn.lsid) if event.txn is not None and not legacy else None
        rs = event.rs or self.source_name
        return self._sources.block(event, rs, now_ms, legacy=legacy, lsid=lsid, now_us=now_us)

    def _ddl(self, event: ChangeEvent, now_ms: int, now_us: int) -> Message:
        if self.options.style == "plain":
            return Message(self.topics.ddl, orjson.dumps({"db": event.ns.db}), orjson.dumps(self.plain(event)))
        value: dict[str, Any] = {
            "op": event.op.value,
            "db": event.ns.db,
            "collection": event.ns.coll,
            "to": {"db": event.to.db, "collection": event.to.coll} if event.to is not None else None,
            "operationDescription": self._json(event.ddl) if event.ddl is not None else None,
            "source": self._source(event, now_ms, now_us, legacy=False),
            "ts_ms": now_ms,
        }
        key: dict[str, Any] = {"db": event.ns.db}
        if self.options.schemas:
            key = connect_schema.wrap(connect_schema.DDL_KEY, key)
            schema = connect_schema.DDL_VALUE_WITHOUT_RS if self._dialect.debezium_source else connect_schema.DDL_VALUE
            value = connect_schema.wrap(schema, value)
        return Message(self.topics.ddl, orjson.dumps(key), orjson.dumps(value))

    def plain(self, event: ChangeEvent) -> dict[str, Any]:
        """mcdc's own event as JSON data; documents as extended JSON objects."""
        return plain_event(event, relaxed=self._relaxed, source_name=self.source_name)

    def due_heartbeat(self) -> Message | None:
        """A heartbeat record once ``heartbeat_s`` passed since the last one; None when off or not yet."""
        if self._heartbeat_s <= 0:
            return None
        now = time.monotonic()
        if now - self._last_heartbeat < self._heartbeat_s:
            return None
        self._last_heartbeat = now
        return self.heartbeat()

    def heartbeat(self, now_ms: int | None = None) -> Message:
        """Debezium's heartbeat record: key {serverName}, value {ts_ms}."""
        ts = int(self._clock() * 1000) if now_ms is None else now_ms
        key: dict[str, Any] = {"serverName": self.topics.prefix}
        value: dict[str, Any] = {"ts_ms": ts}
        if self.options.schemas:
            key = connect_schema.wrap(connect_schema.HEARTBEAT_KEY, key)
            value = connect_schema.wrap(connect_schema.HEARTBEAT_VALUE, value)
        return Message(self.topics.heartbeat, orjson.dumps(key), orjson.dumps(value))

    # -- helpers ------------------------------------------------------------------------------------

    def _json(self, value: Any) -> str:
        """A value as an extended JSON string (how Debezium carries documents)."""
        return orjson.dumps(to_json_value(value, relaxed=self._relaxed)).decode()

    def _key_schema(self, ns: Namespace) -> dict[str, Any]:
        schema = self._key_schemas.get(ns)
        if schema is None:
            schema = self._key_schemas[ns] = connect_schema.key_schema(self._schema_name(ns) + ".Key")
        return schema

    def _value_schema(self, ns: Namespace) -> dict[str, Any]:
        schema = self._value_schemas.get(ns)
        if schema is None:
            legacy = self.options.style == "debezium-legacy"
            schema = connect_schema.value_schema(
                self._schema_name(ns) + ".Envelope", legacy=legacy, rs=not self._dialect.debezium_source
            )
            self._value_schemas[ns] = schema
        return schema

    def _schema_name(self, ns: Namespace) -> str:
        db, coll = self.topics.name_parts(ns)
        return f"{self.topics.prefix}.{db}.{coll}"


def _end(per_collection: Counter[str]) -> tuple[int, list[dict[str, Any]]]:
    """An END record's event_count and data_collections."""
    counts = [{"data_collection": name, "event_count": count} for name, count in per_collection.items()]
    return per_collection.total(), counts
