"""The checks a run makes before it writes anything, and its wait for servers that do not answer yet."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from pymongo.errors import PyMongoError

from replicator.checkpoint.store import Checkpoint, CheckpointStore
from replicator.errors import ConfigError, ServerUnavailable, SinkUnavailable
from replicator.events import Namespace
from replicator.job.preflight import source_name, target_identity, target_keys
from replicator.observe.progress import Reporter
from replicator.observe.summary import Summary
from replicator.observe.tally import duration
from replicator.replay.recorded import Recorded, refused_change
from replicator.settings.config import Settings
from replicator.settings.fields import FieldRules
from replicator.settings.guard import renamed_filter_fields
from replicator.settings.selection import check_collisions
from replicator.settings.unmatched import refusal, unmatched_rule
from replicator.settings.uri import redact
from replicator.sinks.base import Sink
from replicator.source import catalog
from replicator.source.connection import Client, ServerInfo, deployment_identity, server_message, uri_identity
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
    """A first run whose --include, or any other rule that names namespaces (--exclude, --filter,
    --rename, the field rules, --shard-target), matches nothing on the source is a mistake (a typo would copy
    what the rule was written to keep out): refused before anything is written, unless
    --allow-unmatched says the rule means a namespace created later. Otherwise a selection or a rule that
    matches nothing is worth a warning: the source may be empty yet, or its namespaces dropped since the
    last run (a selection that matches nothing is not said by catch-up, a cron job). Two selected
    namespaces that --rename maps onto one target namespace, a field rule that names an _id, and one that
    drops or renames a field a unique index is on (the index could not be built on the target), are
    refused on every run. A selection holding a time-series collection is refused where the run would follow
    the stream (see :func:`~replicator.source.catalog.refuse_unfollowed`). Returns the source's namespaces."""
    kinds = await catalog.list_kinds(client, settings.selection)
    if not settings.snapshot_only:
        catalog.refuse_unfollowed(kinds, settings.selection, command)
    namespaces = list(kinds)
    check_collisions([ns for ns in namespaces if settings.selection(ns)], settings.renamer)
    fields.check([ns for ns in namespaces if settings.selection(ns)])
    if fields:  # a unique index on a field the rules edit could not be built on the target
        for spec in await catalog.describe(client, settings.selection):
            unbuildable = fields.unique_refusal(spec.ns, spec.indexes)
            if unbuildable is not None:
                raise ConfigError(unbuildable)
    conflict = renamed_filter_fields(settings.guard, settings.filters, fields, namespaces)
    if conflict is not None:
        raise ConfigError(conflict)
    problem = catalog.unmatched(settings.selection, namespaces)
    rule = unmatched_rule(settings, namespaces)
    refused = first_run and not settings.allow_unmatched
    if problem is not None and settings.include and refused:
        raise ConfigError(refusal(problem))
    if rule is not None and refused:
        raise ConfigError(refusal(rule))
    if problem is not None and command != "catch-up":
        reporter.warn(problem)
    if rule is not None:
        reporter.warn(rule)
    return namespaces


def claim(
    store: CheckpointStore, settings: Settings, info: ServerInfo, sink: Sink, cp: Checkpoint | None, *, started: bool
) -> bool:
    """Refuse a checkpoint written for another source or target; False when the target's identity
    needs the sink started first."""
    target = target_identity(sink, settings)
    if target is None and not started:
        return False
    source = deployment_identity(info, settings.source)
    target = target or redact(settings.target)  # a MongoDB sink that did not expose its server
    if cp is not None:  # what an older mcdc recorded of these same servers (by the URI's hosts) is theirs too
        if cp.source_identity == uri_identity(info, settings.source):
            cp.source_identity = source
        if cp.target_identity is not None and cp.target_identity in target_keys(sink, settings):
            cp.target_identity = target
    store.claim(cp, source=source, target=target, source_name=source_name(info, settings.source),
                pair=settings.pair_key())  # fmt: skip
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
    """``attempt()``'s result, once a server answers it. A server or sink unreachable at start (a MongoDB
    server, a Kafka broker, an object store or a catalog) ends the run at once, exit 75, unless
    :meth:`Settings.waits_at_start` (tail, or --max-retries given): then it is said once, and waited for
    under --max-retries as an outage later in the run would be. A retryable error of another kind (an
    election) is waited for too. None when stopped meanwhile."""
    retries, waiting_since = retrier.retries, 0.0
    try:
        while True:
            try:
                result = await attempt()
            except Exception as exc:
                unreachable = isinstance(exc, ServerUnavailable | SinkUnavailable)
                if unreachable and not settings.waits_at_start(command):
                    raise
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
