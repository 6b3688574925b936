"""The checks a run makes before it writes anything, and its wait for servers that do not answer yet."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from pymongo.errors import PyMongoError

from replicator.checkpoint.store import Checkpoint, CheckpointStore
from replicator.errors import ConfigError, ServerUnavailable
from replicator.events import Namespace
from replicator.job.preflight import source_name, target_identity
from replicator.observe.progress import Reporter
from replicator.observe.summary import Summary
from replicator.observe.tally import duration
from replicator.replay.recorded import Recorded, refused_change
from replicator.settings.config import Settings
from replicator.settings.fields import FieldRules
from replicator.settings.guard import renamed_filter_fields
from replicator.settings.selection import check_collisions
from replicator.settings.uri import redact
from replicator.sinks.base import Sink
from replicator.source import catalog
from replicator.source.connection import Client, ServerInfo, deployment_identity, server_message
from replicator.source.retry import Retrier, is_retryable

T = TypeVar("T")


def check_recorded(settings: Settings, cp: Checkpoint | None, path: str) -> None:
    """Refuse, before anything is written, to go on from a checkpoint whose target copies were made
    under other renames or field rules (unless this run takes a new snapshot)."""
    if cp is None or cp.recorded is None or settings.snapshot == "always":
        return
    problem = refused_change(Recorded.from_json(cp.recorded), Recorded.of(settings), path)
    if problem is not None:
        raise ConfigError(problem)


async def check_selection(
    client: Client, settings: Settings, fields: FieldRules, reporter: Reporter, *, command: str, first_run: bool
) -> list[Namespace]:
    """A first run whose --include matches nothing on the source is a mistake: refused before anything
    is written. Otherwise a selection that matches nothing is worth a warning (sync and tail): the
    source may be empty yet, or its namespaces dropped since the last run. Two selected namespaces that
    --rename maps onto one target namespace, and a field rule that names an _id, are refused on every
    run. A selection holding a time-series collection is refused where the run would follow the stream
    (see :func:`~replicator.source.catalog.refuse_unfollowed`). Returns the source's namespaces."""
    kinds = await catalog.list_kinds(client, settings.selection)
    if not settings.snapshot_only:
        catalog.refuse_unfollowed(kinds, settings.selection, command)
    namespaces = list(kinds)
    check_collisions([ns for ns in namespaces if settings.selection(ns)], settings.renamer)
    fields.check([ns for ns in namespaces if settings.selection(ns)])
    conflict = renamed_filter_fields(settings.guard, settings.filters, fields, namespaces)
    if conflict is not None:
        raise ConfigError(conflict)
    problem = catalog.unmatched(settings.selection, namespaces)
    if problem is not None and settings.include and first_run:
        raise ConfigError(problem)
    if problem is not None and command != "catch-up":
        reporter.warn(problem)
    return namespaces


def claim(
    store: CheckpointStore, settings: Settings, info: ServerInfo, sink: Sink, cp: Checkpoint | None, *, started: bool
) -> bool:
    """Refuse a checkpoint written for another source or target; False when the target's identity
    needs the sink started first."""
    target = target_identity(sink, settings)
    if target is None and not started:
        return False
    store.claim(
        cp,
        source=deployment_identity(info, settings.source),
        target=target or redact(settings.target),  # a MongoDB sink that did not expose its server
        source_name=source_name(info, settings.source),
        pair=settings.pair_key(),
    )
    return True


async def reach(
    attempt: Callable[[], Awaitable[T]],
    what: str,
    *,
    settings: Settings,
    command: str,
    retrier: Retrier,
    reporter: Reporter,
    summary: Summary,
) -> tuple[T] | None:
    """``attempt()``'s result, once a server answers it. An outage at start (a Kafka broker not up yet,
    or any unreachable server when :meth:`Settings.waits_at_start`: tail, or --max-retries given) is
    said once, then waited for under --max-retries as an outage later in the run would be. None when
    stopped meanwhile."""
    retries, waiting_since = retrier.retries, 0.0
    try:
        while True:
            try:
                result = await attempt()
            except Exception as exc:
                unreachable = isinstance(exc, ServerUnavailable) and settings.waits_at_start(command)
                if not (unreachable or is_retryable(exc)):
                    raise
                if not waiting_since:
                    waiting_since = time.monotonic()
                    said = server_message(exc) if isinstance(exc, PyMongoError) else str(exc)  # one line
                    reporter.warn(f"{said}; waiting for the {what}, retrying {retrier.budget()}")
                if await retrier.wait(exc, "source" if what == "source" else "sink", quiet=True):
                    return None
                continue
            if waiting_since:
                reporter.info(f"the {what} answered after {duration(time.monotonic() - waiting_since)}")
            retrier.progress()
            return (result,)
    finally:
        summary.retries += retrier.retries - retries
