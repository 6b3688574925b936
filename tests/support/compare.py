"""An independent, byte-exact picture of a server's user data, for asserting two servers are identical.

Deliberately does not use replicator.checking.verify: the tests check mcdc with code that shares nothing with it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import bson
import pymongo
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.raw_bson import RawBSONDocument

RAW: CodecOptions[RawBSONDocument] = CodecOptions(
    document_class=RawBSONDocument, datetime_conversion=DatetimeConversion.DATETIME_AUTO
)
SYSTEM = {"admin", "local", "config"}


#: the find() filter of a ``db.coll``'s documents to take (mcdc's --filter: the source as a filtered target
#: holds it), or None for all of them
Where = Callable[[str], "Mapping[str, Any] | None"]


#: the dotted paths of a ``db.coll``'s fields to leave out of the comparison (mcdc's --field-exclude)
Strip = Callable[[str], "list[str]"]


def stripped(raw: bytes, paths: list[str]) -> bytes:
    """A document's BSON without the fields at ``paths`` (dotted, through sub-documents), every other byte
    as it was (decoded and encoded again only when one is there)."""
    doc = bson.decode(raw, codec_options=_ORDERED)
    changed = False
    for path in paths:
        *parents, last = path.split(".")
        node: Any = doc
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and last in node:
            del node[last]
            changed = True
    return bson.encode(doc, codec_options=_ORDERED) if changed else raw


_ORDERED: CodecOptions[dict[str, Any]] = CodecOptions(
    document_class=dict, datetime_conversion=DatetimeConversion.DATETIME_AUTO, tz_aware=False
)


def server_state(
    uri: str, only: Callable[[str], bool] | None = None, where: Where | None = None, strip: Strip | None = None
) -> dict[str, Any]:
    """{namespace: {"kind", "options", "indexes", "docs": {encoded _id: raw bytes}}} of every user namespace
    (``only``: of those ``db.coll`` names it keeps; ``where``: of each, the documents its query finds;
    ``strip``: the fields left out of each document)."""
    client: pymongo.MongoClient[RawBSONDocument] = pymongo.MongoClient(
        uri, document_class=RawBSONDocument, datetime_conversion=DatetimeConversion.DATETIME_AUTO
    )
    out: dict[str, Any] = {}
    try:
        for db_name in client.list_database_names():
            if db_name in SYSTEM:
                continue
            db = client.get_database(db_name, codec_options=RAW)
            for info in db.list_collections():
                name = info["name"]
                if name.startswith("system.") or (only is not None and not only(f"{db_name}.{name}")):
                    continue
                entry: dict[str, Any] = {"kind": info.get("type"), "options": bson.encode(info["options"])}
                if info.get("type") != "view":
                    indexes = {}
                    for ix in db[name].list_indexes():
                        spec = {k: v for k, v in ix.items() if k not in ("v", "ns")}
                        indexes[spec["name"]] = bson.encode(spec)
                    entry["indexes"] = indexes
                    query = where(f"{db_name}.{name}") if where is not None else None
                    found = db[name].find(query or {})
                    paths = strip(f"{db_name}.{name}") if strip is not None else []
                    entry["docs"] = {
                        bson.encode({"_id": d["_id"]}, codec_options=RAW): stripped(d.raw, paths) if paths else d.raw
                        for d in found
                    }
                out[f"{db_name}.{name}"] = entry
    finally:
        client.close()
    return out


def assert_identical(
    source_uri: str,
    target_uri: str,
    only: Callable[[str], bool] | None = None,
    where: Where | None = None,
    *,
    target_where: Where | None = None,
    strip: Strip | None = None,
    held: bool = True,
) -> dict[str, Any]:
    """Assert both servers hold the same namespaces, options, indexes and documents (byte for byte);
    ``only``: compare just the ``db.coll`` names it keeps; ``where``: the target holds only the source's
    documents this query of their namespace finds (a --filter's); ``target_where``: of the target's, only
    those its query finds are compared (a way back's old side keeps the rest); ``strip``: fields compared
    on neither side (a --field-exclude's); ``held``: a target's TTL at MongoDB's largest expireAfterSeconds
    counts as the source's (a migration holds it there until cutover)."""
    src, dst = server_state(source_uri, only, where, strip), server_state(target_uri, only, target_where, strip)
    assert sorted(src) == sorted(dst), f"namespaces differ: {sorted(set(src) ^ set(dst))}"
    for ns, want in src.items():
        got = dst[ns]
        assert got["kind"] == want["kind"], ns
        options = _held_value(got["options"], want["options"]) if held else got["options"]
        assert bson.decode(options) == bson.decode(want["options"]) and options == want["options"], (
            f"{ns} options: {bson.decode(want['options'])} != {bson.decode(got['options'])}"
        )
        if want["kind"] == "view":
            continue
        indexes = _as_held(got["indexes"], want["indexes"]) if held else got["indexes"]
        assert indexes == want["indexes"], f"{ns} indexes: {sorted(want['indexes'])} vs {sorted(got['indexes'])}"
        missing = want["docs"].keys() - got["docs"].keys()
        extra = got["docs"].keys() - want["docs"].keys()
        changed = [k for k in want["docs"].keys() & got["docs"].keys() if want["docs"][k] != got["docs"][k]]
        first = ""
        if changed:
            src_doc, dst_doc = bson.decode(want["docs"][changed[0]]), bson.decode(got["docs"][changed[0]])
            first = f"; first changed: source {str(src_doc)[:300]} target {str(dst_doc)[:300]}"
        assert not (missing or extra or changed), (
            f"{ns}: {len(missing)} missing, {len(extra)} extra, {len(changed)} changed, e.g. "
            f"{[bson.decode(k) for k in [*missing, *extra, *changed][:3]]}{first}"
        )
    return src


#: MongoDB's largest expireAfterSeconds, at which a migration holds the target's TTLs until cutover
HELD_TTL = 2_147_483_647


def _held_value(got: bytes, want: bytes) -> bytes:
    """An index spec's or options' BSON with a held TTL taken for the source's (``want``'s) value."""
    mine, theirs = bson.decode(got, codec_options=_ORDERED), bson.decode(want, codec_options=_ORDERED)
    if mine.get("expireAfterSeconds") == HELD_TTL and "expireAfterSeconds" in theirs:
        mine["expireAfterSeconds"] = theirs["expireAfterSeconds"]
        return bson.encode(mine, codec_options=_ORDERED)
    return got


def _as_held(got: dict[str, bytes], want: dict[str, bytes]) -> dict[str, bytes]:
    return {name: _held_value(spec, want[name]) if name in want else spec for name, spec in got.items()}
