"""Apache Iceberg tables through ``pyiceberg``: ``--target iceberg:PATH``.

By default a SQLite catalog at ``PATH/catalog.db`` with its warehouse at ``PATH``; ``--lake-opt KEY=VALUE``
gives any other pyiceberg catalog's properties (``type=rest``, ``uri=...``, ``warehouse=...``).

The mark of how far a table got (:class:`~replicator.events.positions.Mark`) is the snapshot property ``mcdc.mark``
(JSON: each stream's ``[t, i, n]``, ``""`` for a replica set), set on every commit mcdc makes: the stamps a
commit moves, over the table's current ones (carried on as they are by a commit that covers no event). A
table written before the index was kept has ``mcdc.version`` (``t << 32 | i``) instead, which covers every
event at its cluster time, in every stream without a stamp of its own.
"""

from __future__ import annotations

import contextlib
import json
import uuid
import warnings
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError
from pyiceberg.expressions import And, BooleanExpression, EqualTo, In, Reference
from pyiceberg.expressions.literals import literal
from pyiceberg.table import Table, Transaction

from replicator.errors import ConfigError, SinkUnavailable
from replicator.events import Namespace
from replicator.events.positions import WHOLE_TIME, Mark
from replicator.settings.uri import redact
from replicator.sinks.lake.backend import Format, Where, check_schema, conform, unreachable
from replicator.sinks.lake.tables import SCHEMAS, TableRef

PROPERTY = "mcdc.mark"
LEGACY_PROPERTY = "mcdc.version"


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """pyiceberg warns of a delete that matched nothing: for an upsert of new rows, that is the usual case."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Delete operation did not match any records")
        yield


def _doc(field: pa.Field) -> bytes:
    return bytes((field.metadata or {}).get(b"doc", b""))


def _evolve(tx: Transaction, table: Table, schema: pa.Schema, *, retype: bool) -> None:
    """Typed columns ``schema`` brings that the table lacks are added, in the same commit as the data;
    ``retype``: columns whose BSON type changed (``doc``) are made again with their new type (their old
    values are written again by the same commit)."""
    have = {f.name: f for f in table.schema().as_arrow()}
    added = [f for f in schema if f.name not in have]
    changed = [f for f in schema if retype and f.name in have and _doc(f) and _doc(f) != _doc(have[f.name])]
    if changed:
        with tx.update_schema() as update:
            for f in changed:
                update.delete_column(f.name)
    if added or changed:
        with tx.update_schema() as update:
            update.union_by_name(pa.schema(changed + added))


def _in(column: str, values: list[str]) -> BooleanExpression:
    return In(term=Reference(column), values={literal(v) for v in values})


class IcebergBackend(Format):
    def __init__(self, root: str, options: Mapping[str, str]) -> None:
        self.label = redact(f"iceberg:{root}")  # said in errors: never a credential
        self.local = "://" not in root
        self.root = Path(root).expanduser().absolute() if self.local else None
        self.properties: dict[str, Any] = {}
        if self.root is not None:
            catalog = f"sqlite:///{self.root}/catalog.db"
            self.properties = {"type": "sql", "uri": catalog, "warehouse": self.root.as_uri()}
        else:
            self.properties = {"warehouse": root}
        self.properties.update(options)
        self._catalog: Catalog | None = None
        self.stages = self.root is not None  # data files written apart from their commit: a local warehouse
        self._writing: dict[TableRef, tuple[str, pq.ParquetWriter]] = {}

    def write_files(self, ref: TableRef, rows: pa.Table) -> None:
        """Add ``rows`` to this process's open Parquet file under the table's data directory, not in the table
        yet (a file no snapshot names is never read)."""
        if ref not in self._writing:
            location = self._must(ref).location().removeprefix("file://")
            path = f"{location}/data/mcdc-{uuid.uuid4()}.parquet"
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._writing[ref] = (path, pq.ParquetWriter(path, SCHEMAS[ref.kind]))
        self._writing[ref][1].write_table(conform(ref, rows))

    def finish_files(self) -> list[tuple[TableRef, Any]]:
        done: list[tuple[TableRef, Any]] = []
        for ref, (path, writer) in self._writing.items():
            writer.close()
            done.append((ref, {"path": path}))
        self._writing.clear()
        return done

    def _file_path(self, ref: TableRef, file: Any) -> Path:
        return Path(file["path"])

    def commit_files(self, ref: TableRef, files: list[Any]) -> None:
        table = self._must(ref)
        table.add_files([f["path"] for f in files], snapshot_properties=self._properties(table, None))

    @property
    def catalog(self) -> Catalog:
        for attempt in range(3):
            if self._catalog is not None:
                break
            try:
                self._catalog = load_catalog("mcdc", **self.properties)
            except OSError as exc:  # a REST catalog that does not answer (requests' errors are OSErrors)
                reason = unreachable(exc)
                if reason is None:
                    raise ConfigError(f"--target {self.label}: cannot open its catalog: {redact(str(exc))}") from None
                raise SinkUnavailable(f"{self.label}: its catalog is unreachable: {redact(reason)}") from None
            except Exception as exc:  # any catalog's own error, said in one line
                # a new SQL catalog opened by another process at the same moment (a reader of the lake, a Spark
                # task): pyiceberg creates its tables when it finds none, and the later one fails: open it again
                if attempt < 2 and "already exists" in str(exc):
                    continue
                raise ConfigError(f"--target {self.label}: cannot open its catalog: {redact(str(exc))}") from None
        assert self._catalog is not None
        return self._catalog

    def retryable(self, exc: Exception) -> bool | None:
        if isinstance(exc, CommitFailedException):
            return True  # another writer committed first
        return False if type(exc).__module__.startswith("pyiceberg") else None

    def check_writable(self) -> None:
        if self.root is None:
            return
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            probe = self.root / f".mcdc-probe-{uuid.uuid4().hex}"  # its own: tasks check at once
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise ConfigError(f"--target {self.label}: cannot write there: {exc.strerror or exc}") from None
        _ = self.catalog

    def _table(self, ref: TableRef) -> Table | None:
        try:
            table = self.catalog.load_table(ref.identifier())
        except NoSuchTableError:
            return None
        check_schema(ref, table.schema().as_arrow(), f"{self.label} table {'.'.join(ref.identifier())}")
        return table

    def create(self, ref: TableRef) -> bool:
        if self._table(ref) is not None:
            return False
        namespace, _ = ref.identifier()
        self.catalog.create_namespace_if_not_exists(namespace)
        self.catalog.create_table_if_not_exists(ref.identifier(), schema=SCHEMAS[ref.kind])
        return True

    @staticmethod
    def _mark_of(table: Table) -> Mark:
        snapshot = table.current_snapshot()
        found = snapshot.summary.additional_properties if snapshot is not None and snapshot.summary else {}
        stamps = {str(k): (int(v[0]), int(v[1]), int(v[2])) for k, v in json.loads(found.get(PROPERTY) or "{}").items()}
        legacy = found.get(LEGACY_PROPERTY)
        fallback = (int(legacy) >> 32, int(legacy) & 0xFFFFFFFF, WHOLE_TIME) if legacy else None
        return Mark(stamps, fallback)

    def mark(self, ref: TableRef, streams: Iterable[str]) -> Mark:
        table = self._table(ref)
        return Mark() if table is None else self._mark_of(table)

    def _properties(self, table: Table, mark: Mark | None) -> dict[str, str]:
        """The snapshot properties of a commit: the table's mark, moved by ``mark``'s stamps."""
        current = self._mark_of(table)
        stamps = {**current.stamps, **(mark.stamps if mark is not None else {})}
        props = {PROPERTY: json.dumps({k: list(v) for k, v in sorted(stamps.items())})} if stamps else {}
        if current.fallback is not None:
            t, i, _ = current.fallback
            props[LEGACY_PROPERTY] = str(t << 32 | i)
        return props

    def read(self, ref: TableRef, columns: list[str], where: Where | None = None) -> pa.Table:
        table = self._table(ref)
        if table is None or (where is not None and not where[1]):
            return SCHEMAS[ref.kind].empty_table().select(columns)
        if where is None:
            return table.scan(selected_fields=tuple(columns)).to_arrow()
        return table.scan(row_filter=_in(where[0], where[1]), selected_fields=tuple(columns)).to_arrow()

    def append(self, ref: TableRef, rows: pa.Table, mark: Mark | None) -> None:
        table = self._must(ref)
        rows = conform(ref, rows)
        with table.transaction() as tx:
            _evolve(tx, table, rows.schema, retype=False)
            tx.append(rows, snapshot_properties=self._properties(table, mark))

    def merge_state(self, ref: TableRef, upserts: pa.Table, deletes: list[str], mark: Mark | None) -> None:
        table = self._must(ref)
        props = self._properties(table, mark)
        keys = upserts["_id"].to_pylist() + deletes
        upserts = conform(ref, upserts)
        with table.transaction() as tx, _quiet():
            _evolve(tx, table, upserts.schema, retype=False)
            if keys:
                tx.delete(_in("_id", keys), snapshot_properties=props)
            if upserts.num_rows:
                tx.append(upserts, snapshot_properties=props)

    def schema(self, ref: TableRef) -> pa.Schema | None:
        table = self._table(ref)
        return None if table is None else table.schema().as_arrow()

    def replace(self, ref: TableRef, rows: pa.Table, mark: Mark | None, *, new_schema: bool = False) -> None:
        table = self._must(ref)
        rows = conform(ref, rows)
        with table.transaction() as tx, _quiet():
            _evolve(tx, table, rows.schema, retype=new_schema)
            tx.overwrite(rows, snapshot_properties=self._properties(table, mark))

    def rewrite(self, ref: TableRef, column: str, values: list[str], rows: pa.Table, reads_only: bool) -> None:
        table = self._must(ref)
        where: BooleanExpression = _in(column, values)
        if reads_only:
            where = And(EqualTo(term=Reference("op"), value=literal("r")), where)
        props = self._properties(table, None)
        rows = conform(ref, rows)
        with table.transaction() as tx, _quiet():
            _evolve(tx, table, rows.schema, retype=False)
            tx.delete(where, snapshot_properties=props)
            tx.append(rows, snapshot_properties=props)

    def compact(self, ref: TableRef) -> int:
        """pyiceberg has no file rewrite of its own: the table's rows are written again as one overwrite."""
        table = self._table(ref)
        if table is None:
            return 0
        files = len(table.inspect.files())
        if files <= 1:
            return 0
        table.overwrite(table.scan().to_arrow(), snapshot_properties=self._properties(table, None))
        return files

    def tables(self) -> list[TableRef]:
        found: list[TableRef] = []
        for (namespace,) in self.catalog.list_namespaces():
            for _, name in self.catalog.list_tables(namespace):
                if namespace.endswith("_changes"):
                    found.append(TableRef("changes", Namespace(namespace.removesuffix("_changes"), name)))
                else:
                    found.append(TableRef("state", Namespace(namespace, name)))
        return found
