"""Delta Lake tables through delta-rs (``deltalake``): ``--target delta:PATH``.

The mark of how far a table got (:class:`~replicator.events.positions.Mark`) is kept as Delta application
transactions (``txn`` actions), committed atomically with the data, two per stream: app id ``mcdc`` holds the
cluster time (``t << 32 | i``) and ``mcdc.index`` the event's index at it (``mcdc@SHARD``, ``mcdc.index@SHARD``
for a shard's stream). A table written before the index was kept has only ``mcdc``: it covers every event at
its cluster time. :meth:`DeltaBackend.mark` reads them back.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import DeltaError, DeltaProtocolError, SchemaMismatchError, TableNotFoundError
from deltalake.transaction import AddAction, RemoveAction

from replicator.errors import ConfigError, SinkUnavailable
from replicator.events import Namespace
from replicator.events.positions import WHOLE_TIME, Mark, Stamp
from replicator.settings.uri import redact
from replicator.sinks.lake.backend import APP_ID, Format, Where, check_schema, conform, deleted, unreachable
from replicator.sinks.lake.tables import SCHEMAS, TableRef


def _merge_if_typed(ref: TableRef, rows: pa.Table) -> Literal["merge"] | None:
    """Let a write add columns only when it brings typed ones (checking the schema costs every write)."""
    return "merge" if rows.num_columns > len(SCHEMAS[ref.kind]) else None


def _app_ids(stream: str) -> tuple[str, str]:
    """The app ids of a stream's mark: its cluster time's and its index's."""
    suffix = f"@{stream}" if stream else ""
    return f"{APP_ID}{suffix}", f"{APP_ID}.index{suffix}"


def _sql(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


class DeltaBackend(Format):
    def __init__(self, root: str, storage_options: Mapping[str, str]) -> None:
        self.local = "://" not in root
        self.root = str(Path(root).expanduser().absolute()) if self.local else root.rstrip("/")
        self.label = redact(f"delta:{root}")  # said in errors: never a credential
        self.options = dict(storage_options) or None
        self.stages = self.local  # data files written apart from their commit: on a local (or mounted) path
        self._tables: dict[TableRef, DeltaTable] = {}
        self._writing: dict[TableRef, tuple[str, pq.ParquetWriter, list[int]]] = {}

    def _uri(self, ref: TableRef) -> str:
        return f"{self.root}/{ref.path()}"

    def retryable(self, exc: Exception) -> bool | None:
        if isinstance(exc, SchemaMismatchError | DeltaProtocolError):
            return False
        return True if isinstance(exc, DeltaError) else None  # a lost commit race, the object store

    def check_writable(self) -> None:
        if not self.local:  # an object store: does it answer? (nothing is written to it yet)
            try:
                DeltaTable.is_deltatable(self.root, self.options)
            except (OSError, DeltaError) as exc:
                reason = unreachable(exc)
                if reason is not None:
                    raise SinkUnavailable(f"{self.label} is unreachable: {reason}") from None
                raise
            return
        try:
            os.makedirs(self.root, exist_ok=True)
            probe = Path(self.root) / f".mcdc-probe-{uuid.uuid4().hex}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise ConfigError(f"--target {self.label}: cannot write there: {exc.strerror or exc}") from None

    def _table(self, ref: TableRef) -> DeltaTable | None:
        table = self._tables.get(ref)
        if table is not None:
            table.update_incremental()
            return table
        try:
            table = DeltaTable(self._uri(ref), storage_options=self.options)
        except TableNotFoundError:
            return None
        check_schema(ref, pa.schema(table.schema().to_arrow()), f"{self.label}/{ref.path()}")
        self._tables[ref] = table
        return table

    def create(self, ref: TableRef) -> bool:
        if self._table(ref) is not None:
            return False
        try:
            DeltaTable.create(self._uri(ref), schema=SCHEMAS[ref.kind], mode="ignore", storage_options=self.options)
        except (OSError, DeltaError) as exc:
            reason = unreachable(exc)
            if reason is not None:
                raise SinkUnavailable(f"{self.label} is unreachable: {reason}") from None
            raise ConfigError(f"--target {self.label}: cannot create {ref.path()}: {exc}") from None
        return True

    def schema(self, ref: TableRef) -> pa.Schema | None:
        table = self._table(ref)
        return None if table is None else pa.schema(table.schema().to_arrow())

    def mark(self, ref: TableRef, streams: Iterable[str]) -> Mark:
        table = self._table(ref)
        if table is None:
            return Mark()
        stamps: dict[str, Stamp] = {}
        for stream in set(streams):
            time_id, index_id = _app_ids(stream)
            at, index = table.transaction_version(time_id), table.transaction_version(index_id)
            if at is not None:
                stamps[stream] = (at >> 32, at & 0xFFFFFFFF, WHOLE_TIME if index is None else index)
        fallback = None  # a table written before marks had an index: one cluster time for every stream
        legacy = table.transaction_version(APP_ID)
        if legacy is not None and table.transaction_version(_app_ids("")[1]) is None:
            fallback = (legacy >> 32, legacy & 0xFFFFFFFF, WHOLE_TIME)
        return Mark(stamps, fallback)

    def read(self, ref: TableRef, columns: list[str], where: Where | None = None) -> pa.Table:
        table = self._table(ref)
        if table is None:
            return SCHEMAS[ref.kind].empty_table().select(columns)
        dataset = table.to_pyarrow_dataset()
        rows = dataset.to_table(columns=columns)
        if where is None:
            return rows
        # filtered here, not in the scan: delta-rs' files give string_view where the statistics say string
        column = rows[where[0]].cast(pa.string())
        return rows.filter(pc.is_in(column, pa.array(where[1], pa.string())))

    def _commit(self, mark: Mark | None) -> CommitProperties:
        if mark is None:
            return CommitProperties()
        transactions = []
        for stream, (t, i, n) in sorted(mark.stamps.items()):
            time_id, index_id = _app_ids(stream)
            transactions += [Transaction(time_id, t << 32 | i), Transaction(index_id, n)]
        return CommitProperties(app_transactions=transactions)

    def append(self, ref: TableRef, rows: pa.Table, mark: Mark | None) -> None:
        write_deltalake(
            self._must(ref), conform(ref, rows), mode="append", schema_mode=_merge_if_typed(ref, rows),
            commit_properties=self._commit(mark),
        )  # fmt: skip

    def merge_state(self, ref: TableRef, upserts: pa.Table, deletes: list[str], mark: Mark | None) -> None:
        ups = conform(ref, upserts)
        source = pa.concat_tables(
            [
                ups.append_column("_op", pa.array(["u"] * ups.num_rows, pa.string())),
                deleted(deletes, ups.schema).append_column("_op", pa.array(["d"] * len(deletes), pa.string())),
            ]
        )
        columns = {name: f"s.{name}" for name in source.column_names if name != "_op"}
        (
            self._must(ref)
            .merge(
                source,
                "t._id = s._id",
                source_alias="s",
                target_alias="t",
                merge_schema=True,
                commit_properties=self._commit(mark),
            )
            .when_matched_delete("s._op = 'd'")
            .when_matched_update(columns, "s._op = 'u'")
            .when_not_matched_insert(columns, "s._op = 'u'")
            .execute()
        )

    def replace(self, ref: TableRef, rows: pa.Table, mark: Mark | None, *, new_schema: bool = False) -> None:
        write_deltalake(
            self._must(ref), conform(ref, rows), mode="overwrite", schema_mode="overwrite" if new_schema else "merge",
            commit_properties=self._commit(mark),
        )  # fmt: skip

    def rewrite(self, ref: TableRef, column: str, values: list[str], rows: pa.Table, reads_only: bool) -> None:
        where = f"{column} IN ({', '.join(_sql(v) for v in values)})"
        if reads_only:
            where = f"op = 'r' AND {where}"
        table = self._must(ref)
        data = conform(ref, rows)
        # a replacing write takes every column: typed ones a Spark task leaves to the driver go as nulls
        for field in pa.schema(table.schema().to_arrow()):
            if data.schema.get_field_index(field.name) < 0:
                data = data.append_column(field, pa.nulls(data.num_rows, field.type))
        write_deltalake(table, data, mode="overwrite", predicate=where, schema_mode=_merge_if_typed(ref, rows))

    def write_files(self, ref: TableRef, rows: pa.Table) -> None:
        """Add ``rows`` to this process's open Parquet file in the table's directory, not in its log yet (a
        file no commit names is never read, and VACUUM removes it)."""
        if ref not in self._writing:
            name = f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
            writer = pq.ParquetWriter(Path(self._uri(ref)) / name, SCHEMAS[ref.kind], compression="snappy")
            self._writing[ref] = (name, writer, [0])
        _, writer, count = self._writing[ref]
        writer.write_table(conform(ref, rows))
        count[0] += rows.num_rows

    def finish_files(self) -> list[tuple[TableRef, Any]]:
        """Close the files :meth:`write_files` wrote: for each, its table and what :meth:`commit_files` needs."""
        done = []
        for ref, (name, writer, count) in self._writing.items():
            writer.close()
            stat = (Path(self._uri(ref)) / name).stat()
            done.append(
                (ref, {"path": name, "size": stat.st_size, "rows": count[0], "mtime": int(stat.st_mtime * 1000)})
            )
        self._writing.clear()
        return done

    def _file_path(self, ref: TableRef, file: Any) -> Path:
        return Path(self._uri(ref), str(file["path"]))

    def commit_files(self, ref: TableRef, files: list[Any]) -> None:
        actions: list[AddAction | RemoveAction] = [
            AddAction(f["path"], f["size"], {}, f["mtime"], True, json.dumps({"numRecords": f["rows"]})) for f in files
        ]
        table = self._must(ref)  # committed with the table's own columns (typed ones too: null in these files)
        table.create_write_transaction(actions, mode="append", schema=pa.schema(table.schema().to_arrow()))

    def compact(self, ref: TableRef) -> int:
        table = self._table(ref)
        if table is None:
            return 0
        metrics: dict[str, Any] = table.optimize.compact()
        return int(metrics.get("numFilesRemoved", 0))

    def tables(self) -> list[TableRef]:
        found: list[TableRef] = []
        if not self.local:
            return found
        for kind in ("state", "changes"):
            base = Path(self.root) / kind
            for log_dir in sorted(base.glob("*/*/_delta_log")):
                coll, db = log_dir.parent.name, log_dir.parent.parent.name
                found.append(TableRef(kind, Namespace(db, coll)))
        return found
