"""``df.write.format("mcdc")`` and ``df.writeStream.format("mcdc")``: rows applied to the target through
the asyncio engine's own sink (idempotent upserts, deletes and DDL for MongoDB), one event loop per task.

Each task turns its rows into ChangeEvents (:func:`~.rows.event_from_row`), drops those outside the
selection, applies the field rules and renames (the replay's own transform stage), and writes them in
the order of its partition, in batches of ``max-batch-size`` that never split a transaction.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage

from replicator.errors import ConfigError
from replicator.events import ChangeEvent
from replicator.events.rows import event_from_row
from replicator.settings.config import Settings
from replicator.settings.fields import FieldRules
from replicator.settings.selection import make_transform
from replicator.sinks.registry import open_sink
from replicator.spark_datasource.options import one_line, settings_for

log = logging.getLogger("mcdc.spark")


@dataclass(frozen=True)
class Written(WriterCommitMessage):
    """What one task applied."""

    events: int


def check_mode(overwrite: bool) -> None:
    if overwrite:
        raise ConfigError(
            'the mcdc data source writes change events idempotently: use mode("append") (overwrite would '
            "have to drop target data it has no event for)"
        )


class _Rows:
    """The part both writers share: option strings (pickled to the executors) and one task's write."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = dict(options)
        settings_for(self.options, "target")  # a bad option fails now, on the driver

    def write(self, iterator: Iterable[Any]) -> Written:
        with one_line():  # the target unreachable, refusing us or a write: the CLI's line
            return Written(asyncio.run(apply_rows(settings_for(self.options, "target"), iterator)))


class TargetWriter(_Rows, DataSourceWriter):
    """The batch writer."""

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        log.info("mcdc: %d events written", _count(messages))


class TargetStreamWriter(_Rows, DataSourceStreamWriter):
    """The streaming writer: each micro-batch's rows, applied before Spark records the batch as done."""

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.debug("mcdc: micro-batch %d: %d events written", batchId, _count(messages))


def _count(messages: list[WriterCommitMessage | None]) -> int:
    return sum(m.events for m in messages if isinstance(m, Written))


async def apply_rows(s: Settings, rows: Iterable[Any]) -> int:
    """Apply Spark rows (or any mappings) to ``s.target`` in order; the number of events written."""
    fields = FieldRules(s.field_exclude, s.field_rename)
    transform = make_transform(s.selection, s.renamer, fields=fields or None, filters=s.filters or None)
    sink = open_sink(s)
    written = 0
    await sink.start()
    try:
        batch: list[ChangeEvent] = []
        for row in rows:
            event = transform(event_from_row(row.asDict() if hasattr(row, "asDict") else row))
            if event is None:
                continue
            if len(batch) >= s.replay_batch and (batch[-1].txn is None or event.txn != batch[-1].txn):
                await sink.write(batch)
                written += len(batch)
                batch = []
            batch.append(event)
        if batch:
            await sink.write(batch)
            written += len(batch)
        await sink.flush()
    finally:
        await sink.close()
    return written
