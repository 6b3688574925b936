"""A consumer's view: rebuild collections from Debezium-style change records, and compare with a server.

This is what a downstream user does with mcdc's Kafka/stdout output, so the tests hold it to the same
standard as the MongoDB sink: the rebuilt documents must equal the source's byte for byte (compared as
canonical extended JSON, which keeps types and field order).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pymongo
from bson import json_util
from bson.codec_options import CodecOptions, DatetimeConversion

from replicator.bsonkit.extjson import CANONICAL
from tests.support.kafka import Record, consume_all, list_topics

Docs = dict[str, str]  # canonical extended JSON of _id -> canonical extended JSON of the document
State = dict[str, Docs]  # "db.collection" -> documents

_LOSSLESS = CodecOptions(datetime_conversion=DatetimeConversion.DATETIME_AUTO)


def _load(text: str) -> Any:
    return json_util.loads(text, json_options=CANONICAL)


def _dump(value: Any) -> str:
    return json_util.dumps(value, json_options=CANONICAL)


def apply(state: State, value: dict[str, Any] | None, key: dict[str, Any] | None = None) -> None:
    """Apply one record value (a Debezium envelope; None = tombstone, which needs the key)."""
    if value is None:
        return  # a tombstone only lets Kafka compact; the delete before it did the work
    if "payload" in value and "schema" in value:
        value = value["payload"]
    op = value.get("op")
    if op in ("rename", "drop", "dropDatabase") and "db" in value:  # a record of the DDL topic
        _apply_ddl(state, value)
        return
    if op not in ("r", "c", "u", "d"):
        return
    source = value["source"]
    docs = state.setdefault(f"{source['db']}.{source['collection']}", {})
    if op in ("r", "c"):
        doc = _load(value["after"])
        docs[_dump(doc["_id"])] = _dump(doc)
        return
    if op == "d":
        doc_id = _key_id(value, key)
        docs.pop(doc_id, None)
        return
    if value.get("after") is not None:  # a replace, or an update read with updateLookup
        doc = _load(value["after"])
        docs[_dump(doc["_id"])] = _dump(doc)
        return
    doc_id = _key_id(value, key)
    if doc_id not in docs:
        return  # updated, then deleted before the lookup: a later delete record follows
    doc = _load(docs[doc_id])
    _apply_update(doc, value)
    docs[doc_id] = _dump(doc)


def _apply_ddl(state: State, value: dict[str, Any]) -> None:
    """A rename moves a collection's documents (over whatever its new name held), a drop removes them."""
    db = value["db"]
    if value["op"] == "dropDatabase":
        for ns in [ns for ns in state if ns.startswith(db + ".")]:
            del state[ns]
        return
    docs = state.pop(f"{db}.{value['collection']}", {})
    to = value.get("to")
    if value["op"] == "rename" and to is not None:
        state[f"{to['db']}.{to['collection']}"] = docs


def _key_id(value: dict[str, Any], key: dict[str, Any] | None) -> str:
    if key is not None:
        payload = key.get("payload", key)
        return _dump(_load(payload["id"]))
    if value.get("filter"):
        return _dump(_load(value["filter"])["_id"])
    raise AssertionError(f"no key for {value}")


def _apply_update(doc: dict[str, Any], value: dict[str, Any]) -> None:
    desc = value.get("updateDescription")
    if desc is None:
        patch = _load(value["patch"])  # legacy envelope
        desc = {
            "updatedFields": _dump(patch.get("$set", {})),
            "removedFields": list(patch.get("$unset", {})),
            "truncatedArrays": [{"field": f, "size": s["$slice"]} for f, s in patch.get("$push", {}).items()],
        }
    for item in desc.get("truncatedArrays") or ():
        parent, last = _walk(doc, item["field"])
        parent[_index(parent, last)] = parent[_index(parent, last)][: item["size"]]
    for path, new in _load(desc["updatedFields"] or "{}").items():
        parent, last = _walk(doc, path, create=True)
        if isinstance(parent, list):
            i = int(last)
            parent.extend([None] * (i + 1 - len(parent)))
            parent[i] = new
        else:
            parent[last] = new
    for path in desc.get("removedFields") or ():
        parent, last = _walk(doc, path)
        if isinstance(parent, dict):
            parent.pop(last, None)


def _index(parent: Any, part: str) -> Any:
    return int(part) if isinstance(parent, list) else part


def _walk(doc: Any, path: str, *, create: bool = False) -> tuple[Any, str]:
    parts = path.split(".")
    node = doc
    for part in parts[:-1]:
        if isinstance(node, list):
            node = node[int(part)]
        else:
            if part not in node and create:
                node[part] = {}
            node = node[part]
    return node, parts[-1]


def rebuild(records: Iterable[tuple[dict[str, Any] | None, dict[str, Any] | None]]) -> State:
    """Rebuild every collection from (key, value) pairs given in each partition's order."""
    state: State = {}
    for key, value in records:
        apply(state, value, key)
    return {ns: docs for ns, docs in state.items() if docs}


def rebuild_lines(lines: Iterable[bytes | str]) -> State:
    """Rebuild from JSON lines (stdout/jsonl sinks: {topic, key, value} records)."""
    records = [json.loads(line) for line in lines if line.strip()]
    return rebuild((r["key"], r["value"]) for r in records)


def decode(records: Iterable[Record]) -> list[tuple[dict[str, Any] | None, dict[str, Any] | None]]:
    """Kafka records as (key, value) JSON pairs (a tombstone's value is None)."""
    return [
        (json.loads(r.key) if r.key else None, json.loads(r.value) if r.value is not None else None) for r in records
    ]


async def data_records(bootstrap: str, prefix: str = "mcdc") -> list[Record]:
    """Every record of the data topics of ``prefix`` (not its transaction and DDL topics), each partition
    in order."""
    topics = sorted(
        t
        for t in await list_topics(bootstrap)
        if t.startswith(prefix + ".") and t not in (f"{prefix}.transaction", f"{prefix}.ddl")
    )
    return await consume_all(bootstrap, topics)


async def rebuilt_from_topics(bootstrap: str, prefix: str = "mcdc", *, ordered: bool = True) -> State:
    """The collections a consumer rebuilds from the data topics (``ordered=False``: fields sorted, for
    states rebuilt from update deltas alone)."""
    state = rebuild(decode(await data_records(bootstrap, prefix)))
    return state if ordered else unordered(state)


def server_docs(
    uri: str, databases: Iterable[str] | None = None, where: Callable[[str], Mapping[str, Any] | None] | None = None
) -> State:
    """Every document of every user collection, in the same form as :func:`rebuild`'s result (``where``: the
    find() filter of a ``db.coll``'s documents to take, or None for all)."""
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(uri, directConnection=True)
    try:
        names = databases or [d for d in client.list_database_names() if d not in ("admin", "local", "config")]
        state: State = {}
        for db in names:
            for info in client[db].list_collections(filter={"type": "collection"}):
                name = info["name"]
                if name.startswith("system."):
                    continue
                coll = client[db].get_collection(name, codec_options=_LOSSLESS)
                query = where(f"{db}.{name}") if where is not None else None
                docs = {_dump(d["_id"]): _dump(d) for d in coll.find(query or {})}
                if docs:
                    state[f"{db}.{name}"] = docs
        return state
    finally:
        client.close()


def unordered(state: State) -> State:
    """The same documents with fields sorted at every level: for comparing states rebuilt from update
    deltas alone, where the order the server gave newly added fields cannot be known."""

    def sort(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: sort(value[k]) for k in sorted(value)}
        if isinstance(value, list):
            return [sort(v) for v in value]
        return value

    return {ns: {k: _dump(sort(_load(v))) for k, v in docs.items()} for ns, docs in state.items()}


def assert_same(rebuilt: State, expected: State) -> None:
    """Equal collections and documents; on failure, name the first differences."""
    assert sorted(rebuilt) == sorted(expected), f"collections differ: {sorted(rebuilt)} vs {sorted(expected)}"
    for ns, docs in expected.items():
        got = rebuilt[ns]
        missing = [k for k in docs if k not in got][:3]
        extra = [k for k in got if k not in docs][:3]
        differ = [k for k in docs if k in got and got[k] != docs[k]][:3]
        assert not (missing or extra or differ), (
            f"{ns}: missing {missing}, extra {extra}, differing {[(k, got[k][:200], docs[k][:200]) for k in differ]}"
        )
