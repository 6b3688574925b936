"""What a table format must do for the lake sink (:mod:`.sink`), and what both formats share. Each method
is one atomic commit, or a read; each is blocking (the sink runs them in threads).

A commit that covers events records how far they go in each stream (``mark``: the stamps it moves, kept
over the table's others); ``None`` keeps the table's.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from replicator.errors import ConfigError
from replicator.events.positions import Mark
from replicator.sinks.lake.tables import SCHEMAS, TableRef

#: what an object store's or a catalog's client says of a server it could not reach (delta-rs's object_store,
#: requests/urllib3 under pyiceberg's REST catalog)
_NO_ANSWER = re.compile(
    r"tcp connect error|error sending request|connection refused|failed to establish a new connection|"
    r"max retries exceeded|timed out|dns error|name or service not known|connection reset",
    re.IGNORECASE,
)
_COLOURS = re.compile(r"\x1b\[[0-9;]*m")
_REASON = re.compile(r"\[Errno -?\d+\] [^'\")\]\n]+|[A-Za-z][\w ]*\(os error \d+\)")


def unreachable(exc: BaseException) -> str | None:
    """Why the object store or catalog could not be reached, in a few words (``Connection refused (os error
    111)``), when ``exc`` says so; None for any other failure."""
    text = _COLOURS.sub("", str(exc))
    if not _NO_ANSWER.search(text):
        return None
    found = _REASON.search(text)
    if found is not None:
        return found.group(0).strip()
    lines = [line.strip(" \u21b3") for line in text.splitlines() if line.strip(" \u21b3")]
    return lines[-1][:200] if lines else "no answer"


#: a filter of rows: (column, the values it may hold)
Where = tuple[str, list[str]]
#: the app id of Delta's application transactions and the Iceberg snapshot property of the position
APP_ID = "mcdc"


class Backend(Protocol):
    label: str
    #: can data files be written apart from their commit (:meth:`write_files`, :meth:`commit_files`)?
    stages: bool

    def check_writable(self) -> None: ...

    def retryable(self, exc: Exception) -> bool | None:
        """Is this failure of the table library worth another try (True), or final (False)? None: not the
        library's (a bug: it is raised as it is)."""

    def exists(self, ref: TableRef) -> bool: ...

    def create(self, ref: TableRef) -> bool:
        """Create the table if it does not exist (True: it did not); refuse one whose columns are not mcdc's."""

    def mark(self, ref: TableRef, streams: Iterable[str]) -> Mark:
        """How far the table got in ``streams`` (at least those; empty when it does not exist)."""

    def schema(self, ref: TableRef) -> pa.Schema | None:
        """The table's columns (None when it does not exist)."""

    def read(self, ref: TableRef, columns: list[str], where: Where | None = None) -> pa.Table:
        """Rows of the table (only those whose column ``where[0]`` is one of ``where[1]`` when given)."""

    def append(self, ref: TableRef, rows: pa.Table, mark: Mark | None) -> None: ...

    def merge_state(self, ref: TableRef, upserts: pa.Table, deletes: list[str], mark: Mark | None) -> None:
        """Set the rows of ``upserts`` (by ``_id``) and delete the rows of ``deletes``, in one commit."""

    def replace(self, ref: TableRef, rows: pa.Table, mark: Mark | None, *, new_schema: bool = False) -> None:
        """The table's whole content becomes ``rows`` (``new_schema``: with their columns, typed columns that
        changed type included)."""

    def rewrite(self, ref: TableRef, column: str, values: list[str], rows: pa.Table, reads_only: bool) -> None:
        """Delete the rows whose ``column`` is in ``values`` (only ``op = 'r'`` rows when ``reads_only``) and add
        ``rows``, in one commit."""

    def write_files(self, ref: TableRef, rows: pa.Table) -> None:
        """Write ``rows`` into data files of the table without committing them."""

    def finish_files(self) -> list[tuple[TableRef, Any]]:
        """Close what :meth:`write_files` wrote: each file's table and what :meth:`commit_files` needs."""

    def commit_files(self, ref: TableRef, files: list[Any]) -> None:
        """Commit data files that :meth:`write_files` wrote (in this process or another), in one commit."""

    def read_files(self, ref: TableRef, files: list[Any]) -> pa.Table:
        """The rows of data files that :meth:`write_files` wrote, not committed."""

    def remove_files(self, ref: TableRef, files: list[Any]) -> None:
        """Delete data files that :meth:`write_files` wrote and no commit names."""

    def compact(self, ref: TableRef) -> int:
        """Rewrite small files into bigger ones; the number of files removed."""

    def tables(self) -> list[TableRef]:
        """Every mcdc table under this lake."""


class Format:
    """What both formats' backends share: a table opened or made on first use."""

    def _table(self, ref: TableRef) -> Any:
        """The open table, or None when it does not exist."""
        raise NotImplementedError

    def create(self, ref: TableRef) -> bool:
        raise NotImplementedError

    def _must(self, ref: TableRef) -> Any:
        table = self._table(ref)
        if table is None:
            self.create(ref)
            table = self._table(ref)
            assert table is not None
        return table

    def exists(self, ref: TableRef) -> bool:
        return self._table(ref) is not None

    def _file_path(self, ref: TableRef, file: Any) -> Path:
        """Where a data file that ``write_files`` wrote is (staging writes local files only)."""
        raise NotImplementedError

    def read_files(self, ref: TableRef, files: list[Any]) -> pa.Table:
        return pa.concat_tables([pq.read_table(self._file_path(ref, f)) for f in files])

    def remove_files(self, ref: TableRef, files: list[Any]) -> None:
        for file in files:
            self._file_path(ref, file).unlink(missing_ok=True)


def check_schema(ref: TableRef, found: pa.Schema, where: str) -> None:
    """Refuse a table whose columns are not this kind's (one written by something else)."""
    wanted = SCHEMAS[ref.kind]
    missing = [f.name for f in wanted if found.get_field_index(f.name) < 0]
    wrong = [
        f.name
        for f in wanted
        if found.get_field_index(f.name) >= 0 and not _same_type(found.field(f.name).type, f.type)
    ]
    if ref.kind == "changes" and "sequence" in missing and found.get_field_index("seq") >= 0:
        raise ConfigError(
            f"{where}: a change table written by an older mcdc (its rows are ordered by seq, now by sequence): "
            "move the lake's tables away, or choose another --target, and copy again with --snapshot always"
        )
    if missing or wrong:
        what = f"no column {', '.join(missing)}" if missing else f"other types for {', '.join(wrong)}"
        raise ConfigError(
            f"{where}: a table that mcdc did not write is there ({what}); choose another --target or move it away"
        )


def _same_type(a: pa.DataType, b: pa.DataType) -> bool:
    if pa.types.is_timestamp(a) and pa.types.is_timestamp(b):
        return True
    if pa.types.is_large_string(a) or pa.types.is_string_view(a):
        return bool(pa.types.is_string(b))
    if pa.types.is_large_binary(a) or pa.types.is_binary_view(a):
        return bool(pa.types.is_binary(b))
    if pa.types.is_struct(a) and pa.types.is_struct(b):
        return [f.name for f in a] == [f.name for f in b]
    return bool(a.equals(b))


def key_column(ref: TableRef) -> str:
    """The column a table's rows are told apart by when a copy wrote some twice."""
    return "_id" if ref.kind == "state" else "key"


def duplicates(ref: TableRef, table: pa.Table) -> tuple[str, list[str], pa.Table]:
    """Rows that a copy wrote twice (a snapshot partition copied again after a crash): the key column, the
    keys with more than one row, and the rows to keep for those keys. State tables: one row per ``_id``.
    Change tables: ``r`` rows, one per ``key`` and ``sequence`` (when the table has it): the rows of two
    copies made at different times (a namespace copied again) are both kept."""
    column = key_column(ref)
    if ref.kind == "changes":
        table = table.filter(pc.equal(table["op"], "r"))
    keys = table[column].to_pylist()
    copies = table["sequence"].to_pylist() if "sequence" in table.column_names else [None] * len(keys)
    seen: set[tuple[str, Any]] = set()
    twice: set[str] = set()
    for key, seq in zip(keys, copies, strict=True):
        pair = (key, None if seq is None else tuple(seq.values()))
        if pair in seen:
            twice.add(key)
        seen.add(pair)
    if not twice:
        return column, [], table.slice(0, 0)
    kept: set[tuple[str, Any]] = set()
    keep = []
    for i, (key, seq) in enumerate(zip(keys, copies, strict=True)):
        pair = (key, None if seq is None else tuple(seq.values()))
        if key in twice and pair not in kept:
            kept.add(pair)
            keep.append(i)
    return column, sorted(twice), table.take(keep)


def conform(ref: TableRef, rows: pa.Table) -> pa.Table:
    """``rows`` with the table's schema (its columns first, in order, types cast; typed columns after)."""
    schema = SCHEMAS[ref.kind]
    fixed = rows.select(schema.names).cast(schema)
    for name in rows.column_names:
        if name not in schema.names:
            fixed = fixed.append_column(rows.schema.field(name), rows[name])
    return fixed


def deleted(ids: list[str], schema: pa.Schema | None = None) -> pa.Table:
    """State rows that stand for deleted documents: their ``_id`` and nulls (in ``schema``'s columns, by
    default the state table's own)."""
    schema = schema or SCHEMAS["state"]
    columns = {f.name: pa.array([None] * len(ids), f.type) for f in schema}
    columns["_id"] = pa.array(ids, pa.string())
    return pa.table(columns, schema=schema)
