"""An mcdc sink plug-in: the latest state of each MongoDB document, in a SQLite file.

    pip install ./examples/sink-plugin
    mcdc sync --source "$SRC" --target sqlite:/var/lib/mcdc/shop.db

One table, ``documents(ns TEXT, id TEXT, doc TEXT, PRIMARY KEY(ns, id))``: ``ns`` is ``db.collection``,
``id`` the document's ``_id`` and ``doc`` the whole document, both as canonical extended JSON (lossless:
Int64, Decimal128, dates, ObjectIds and field order survive).

* Snapshot reads, inserts and replaces upsert the document; updates upsert the full document the change
  stream looked up (``--full-document updateLookup``, mcdc's default). An update without one is skipped,
  with one warning per run: this example does not apply ``$set``/``$unset`` deltas.
* Deletes delete; dropping a collection or a database deletes its rows; a rename moves them. Other DDL
  (indexes, collMod, create) has nothing to keep here.
* Each ``write(batch)`` is one SQLite transaction, committed (``synchronous=FULL``) before it returns:
  that commit is the acknowledgement mcdc checkpoints after. Every statement is idempotent (upsert by
  key, delete by key, move only what is still there), so the events mcdc delivers again after a crash
  leave the same rows.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from replicator.bsonkit.extjson import dumps_str
from replicator.errors import ConfigError, SinkError, SinkUnavailable
from replicator.events import ChangeEvent, CollectionSpec, Namespace, Op
from replicator.settings.config import Settings
from replicator.sinks.base import Sink

__all__ = ["SqliteSink"]

log = logging.getLogger("mcdc_sqlite_sink")

T = TypeVar("T")

SCHEMA = "CREATE TABLE IF NOT EXISTS documents(ns TEXT, id TEXT, doc TEXT, PRIMARY KEY(ns, id))"
UPSERT = "INSERT OR REPLACE INTO documents(ns, id, doc) VALUES (?, ?, ?)"
DELETE_ONE = "DELETE FROM documents WHERE ns = ? AND id = ?"
DELETE_NS = "DELETE FROM documents WHERE ns = ?"
# a database's namespaces are "db." up to (not including) "db/": '/' is the character after '.'
DELETE_DB = "DELETE FROM documents WHERE ns > ? AND ns < ?"
HAS_ROWS = "SELECT 1 FROM documents WHERE ns = ? LIMIT 1"
MOVE_NS = "UPDATE documents SET ns = ? WHERE ns = ?"

#: SQLite result codes worth retrying: another process holds the lock, the disk is full or failing.
RETRYABLE = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR})


class SqliteSink(Sink):
    """``--target sqlite:PATH``: keeps each document's latest state in ``PATH``."""

    schemes = ("sqlite",)

    def __init__(self, uri: str, settings: Settings | None = None) -> None:
        scheme, _, path = uri.partition(":")
        if scheme.lower() != "sqlite" or not path:
            raise ConfigError(f"target {uri!r}: expected sqlite:PATH, e.g. sqlite:/var/lib/mcdc/shop.db")
        self.path = Path(path).expanduser()
        self._db: sqlite3.Connection | None = None
        # Snapshot workers call write() concurrently; SQLite has one writer anyway. The asyncio lock queues
        # them on the event loop (not in pool threads); the thread lock keeps a write that was cancelled on
        # the loop, but is still running in its thread, from overlapping the next one.
        self._lock = asyncio.Lock()
        self._thread_lock = threading.Lock()
        self._warned_update = False

    # --- the Sink contract -------------------------------------------------------------------------------

    async def start(self) -> None:
        try:
            self._db = await asyncio.to_thread(self._open)
        except (OSError, sqlite3.Error) as exc:
            raise ConfigError(f"target sqlite:{self.path}: cannot open the database: {exc}") from None

    async def write(self, batch: Sequence[ChangeEvent]) -> None:
        if batch:
            await self._run(self._transaction, lambda db: self._apply(db, batch))

    async def existing(self, namespaces: Sequence[Namespace]) -> list[Namespace]:
        return await self._run(self._existing, namespaces)

    async def prepare(self, specs: Sequence[CollectionSpec], *, drop_existing: bool) -> None:
        if drop_existing:  # a new snapshot replaces these namespaces' rows
            await self._run(self._transaction, lambda db: db.executemany(DELETE_NS, [(str(s.ns),) for s in specs]))

    async def close(self) -> None:
        async with self._lock:
            db, self._db = self._db, None
            if db is not None:
                await asyncio.to_thread(self._close, db)

    async def _run(self, fn: Callable[..., T], *args: object) -> T:
        async with self._lock:
            try:
                return await asyncio.to_thread(fn, *args)
            except sqlite3.Error as exc:
                code = (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF  # the primary code of an extended one
                if code in RETRYABLE:  # a ConnectionError: mcdc retries the batch with backoff
                    raise SinkUnavailable(f"sqlite:{self.path}: {exc}") from None
                raise SinkError(f"sqlite:{self.path}: {exc}") from None

    # --- SQLite, in a worker thread ----------------------------------------------------------------------

    def _open(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # autocommit mode: transactions are the explicit BEGIN/COMMIT below
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")  # a commit is on disk when COMMIT returns
            db.execute(SCHEMA)
        except BaseException:
            db.close()
            raise
        return db

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise SinkError(f"sqlite:{self.path}: the sink is not started (or already closed)")
        return self._db

    def _transaction(self, body: Callable[[sqlite3.Connection], object]) -> None:
        """Run ``body`` in one transaction: committed when it returns, rolled back when it raises."""
        db = self._conn()
        with self._thread_lock:
            db.execute("BEGIN IMMEDIATE")
            try:
                body(db)
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise

    def _apply(self, db: sqlite3.Connection, batch: Sequence[ChangeEvent]) -> None:
        """The batch's events in order, so each document's events keep theirs."""
        for event in batch:
            self._apply_one(db, event)

    def _apply_one(self, db: sqlite3.Connection, event: ChangeEvent) -> None:
        op, ns = event.op, str(event.ns)
        if op in (Op.READ, Op.INSERT, Op.REPLACE, Op.UPDATE):
            if event.document is not None:
                db.execute(UPSERT, (ns, dumps_str(event.document_key["_id"]), dumps_str(event.document)))
            elif not self._warned_update:
                # no full document: the lookup found the document deleted (a delete event follows), or the
                # stream was opened without updateLookup
                self._warned_update = True
                log.warning(
                    "%s events without a full document are skipped (first on %s); keep --full-document updateLookup",
                    op.name.lower(),
                    ns,
                )
        elif op is Op.DELETE:
            db.execute(DELETE_ONE, (ns, dumps_str(event.document_key["_id"])))
        elif op is Op.DROP:
            db.execute(DELETE_NS, (ns,))
        elif op is Op.DROP_DATABASE:
            db.execute(DELETE_DB, (event.ns.db + ".", event.ns.db + "/"))
        elif op is Op.RENAME and event.to is not None and db.execute(HAS_ROWS, (ns,)).fetchone() is not None:
            # as renameCollection with dropTarget, idempotently: applied again after a crash, the source
            # namespace has no rows left and the moved rows stay where they are
            db.execute(DELETE_NS, (str(event.to),))
            db.execute(MOVE_NS, (str(event.to), ns))
        # create, createIndexes, dropIndexes, modify, invalidate: nothing to keep in this table

    def _existing(self, namespaces: Sequence[Namespace]) -> list[Namespace]:
        db = self._conn()
        with self._thread_lock:
            return [ns for ns in namespaces if db.execute(HAS_ROWS, (str(ns),)).fetchone() is not None]

    def _close(self, db: sqlite3.Connection) -> None:
        with self._thread_lock:
            db.close()
