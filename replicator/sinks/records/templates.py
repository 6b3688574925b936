"""Envelopes written as bytes: the JSON of what is the same for many records, cut where records differ.

The envelope of a data event is mostly constant: in Debezium's value, the ``source`` block's version,
connector, name, database, collection, replica set and the ``op`` letter (and, with ``schemas``, the whole
schema) are the same for every event of a namespace and op. Building that dict per event, copying the
source block, and having orjson write it all again (the ``after`` document's JSON text escaped a second
time as a string) cost more than converting the document itself.

A template is made from the dict the encoder's own code builds for one event, with a marker put in each
place that varies; orjson writes it once, and it is cut at the markers (:func:`cut`). Per event, only the
varying values are written (by orjson, or as the exact bytes orjson writes for them) and joined with the
constant parts. Because the constant parts are orjson's own output of the encoder's own dict, and the
varying ones are orjson's output of the same values, the record is byte for byte what writing the whole
dict gives; ``tests/test_envelope_bytes.py`` holds the two paths to that over a randomized corpus.

Event sinks still receive ChangeEvents, not raw change documents encoded in one fused pass: between the
stream and the sink, the batch is cut at transactions and positions, and the filter stage drops, renames
and edits events (field rules), all on ChangeEvents; the fused pass would have to do all that again or
give it up. It would also gain less than it seems. A prototype of it (raw change document to Debezium
record, inserts, updates and deletes, no filter, no transaction, no pre-image) measured 13.6 µs per event
on bench_kafka's small events, against 20.2 for normalize + encode: most of an event's time is pymongo's
C decoder turning the document into extended JSON values (4.9 µs, its type converters included), the
search for deprecated BSON types (1.5 µs) and the change document's top level (1.8 µs), which any
Python path spends.
"""

from __future__ import annotations

from typing import Any

import orjson

from replicator.sinks.records import connect_schema

_dumps = orjson.dumps
NULL = b"null"
Parts = tuple[bytes, ...]  # a template: the constant JSON between its slots


#: Placeholders for the varying places of a template: private-use code points around a number, never a name
#: anyone gives (a name that holds one anyway makes :func:`cut` refuse, see there).
MARKERS = tuple(f"\ue000mcdc-slot-{slot}\ue000" for slot in range(16))
_QUOTED = tuple(_dumps(m) for m in MARKERS)  # how orjson writes each marker: "\ue000...\ue000"


def cut(data: Any, slots: int) -> Parts | None:
    """``data`` (holding ``MARKERS[0]`` to ``MARKERS[slots - 1]``, each once, in that order) written by
    orjson and cut at the markers: ``slots + 1`` constant parts. None when the JSON does not hold each
    marker exactly once where expected (a name holding a marker's text): the caller writes such records
    the slow way."""
    text = _dumps(data)
    parts: list[bytes] = []
    at = 0
    for slot in range(slots):
        quoted = _QUOTED[slot]
        if text.count(quoted) != 1:
            return None
        found = text.find(quoted, at)
        if found < 0:
            return None
        parts.append(text[at:found])
        at = found + len(quoted)
    parts.append(text[at:])
    return tuple(parts)


def json_string(text: bytes) -> bytes:
    """JSON text (orjson's output) as a JSON string: ``orjson.dumps(text.decode())``, one C pass each (half
    the time of escaping the backslashes and quotes with two ``bytes.replace``)."""
    return _dumps(text.decode())


def number(value: int | None) -> bytes:
    """An integer (or None) as orjson writes it."""
    if type(value) is int:
        return b"%d" % value
    return NULL if value is None else _dumps(value)


def debezium_template(payload: dict[str, Any], schema: Any | None) -> Parts | None:
    """A Debezium value payload as the encoder builds it (``schema``: the Connect schema to wrap it in)
    made a template of twelve slots, in the order :func:`debezium_value` fills them. Changes ``payload``."""
    source = payload["source"]
    payload["before"], payload["after"], payload["updateDescription"] = MARKERS[0:3]
    source["ts_ms"], source["ts_us"], source["ts_ns"], source["ord"] = MARKERS[3:7]
    source["lsid"], source["txnNumber"], source["wallTime"] = MARKERS[7:10]
    payload["ts_ms"], payload["transaction"] = MARKERS[10:12]
    return cut(payload if schema is None else connect_schema.wrap(schema, payload), 12)


def debezium_value(
    parts: Parts,
    before: bytes,
    after: bytes,
    update: bytes,
    source_ts: bytes,
    source_ts_us: bytes,
    source_ts_ns: bytes,
    order: bytes,
    lsid: bytes,
    txn_number: bytes,
    wall_time: bytes,
    ts_ms: bytes,
    transaction: bytes,
) -> bytes:
    """A Debezium value: a :func:`debezium_template` with each slot's value (as JSON) in its place."""
    return b"".join((
        parts[0], before, parts[1], after, parts[2], update, parts[3], source_ts, parts[4], source_ts_us, parts[5],
        source_ts_ns, parts[6], order, parts[7], lsid, parts[8], txn_number, parts[9], wall_time, parts[10], ts_ms,
        parts[11], transaction, parts[12],
    ))  # fmt: skip
