"""Reading lake tables back with the libraries themselves (deltalake, pyiceberg), for the lake tests."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pymongo
from bson.raw_bson import RawBSONDocument


def read_table(kind: str, root: Path, table: str, db: str, coll: str) -> pa.Table | None:
    """``table``: "state" or "changes"; None when the table does not exist."""
    if kind == "delta":
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            return DeltaTable(str(root / table / db / coll)).to_pyarrow_table()
        except TableNotFoundError:
            return None
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.exceptions import NoSuchTableError

    catalog = SqlCatalog("mcdc", uri=f"sqlite:///{root}/catalog.db", warehouse=root.as_uri())
    try:
        return catalog.load_table((db if table == "state" else f"{db}_changes", coll)).scan().to_arrow()
    except NoSuchTableError:
        return None


def state_bytes(kind: str, root: Path, db: str, coll: str) -> list[bytes]:
    """The state table's ``bson`` column, sorted."""
    table = read_table(kind, root, "state", db, coll)
    return sorted(table["bson"].to_pylist()) if table is not None else []


def source_bytes(uri: str, db: str, coll: str, where: Mapping[str, Any] | None = None) -> list[bytes]:
    """The source collection's documents as raw BSON, sorted (``where``: those this query finds)."""
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(uri, directConnection=True, document_class=RawBSONDocument)
    try:
        return sorted(bytes(d.raw) for d in client[db][coll].find(where or {}))
    finally:
        client.close()


def collections(uri: str, db: str) -> list[str]:
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(uri, directConnection=True)
    try:
        return sorted(
            c["name"] for c in client[db].list_collections(filter={"type": "collection"})
            if not c["name"].startswith("system.")
        )  # fmt: skip
    finally:
        client.close()


def duplicate_changes(table: pa.Table) -> list[tuple[Any, ...]]:
    """``(key, sequence, op)`` that occur more than once in a change table (an event's sequence is its own;
    a snapshot's rows share their copy's)."""
    rows = zip(table["key"].to_pylist(), table["sequence"].to_pylist(), table["op"].to_pylist(), strict=True)
    counts = Counter((k, None if s is None else tuple(s.values()), op) for k, s, op in rows)
    return [row for row, n in counts.items() if n > 1]


def tables(kind: str, root: Path, table: str) -> list[tuple[str, str]]:
    """Every ``(db, coll)`` that has a ``table`` ("state" or "changes") table under ``root``, sorted."""
    if kind == "delta":
        return sorted((log.parent.parent.name, log.parent.name) for log in (root / table).glob("*/*/_delta_log"))
    if not (root / "catalog.db").exists():
        return []
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("mcdc", uri=f"sqlite:///{root}/catalog.db", warehouse=root.as_uri())
    found = []
    for namespace, *_ in catalog.list_namespaces():
        changes = namespace.endswith("_changes")
        if changes == (table == "changes"):
            db = namespace.removesuffix("_changes") if changes else namespace
            found += [(db, ident[-1]) for ident in catalog.list_tables(namespace)]
    return sorted(found)
