"""Which engine a run uses: the one ``--engine`` names. Here, above both engine packages, so that neither
imports the other and the asyncio engine's runs never import Spark's modules."""

from __future__ import annotations

import asyncio

from replicator.checkpoint.store import CheckpointStore
from replicator.engines.base import Engine
from replicator.observe.metrics import Metrics
from replicator.observe.progress import Reporter
from replicator.settings.config import Settings


def open_engine(
    settings: Settings,
    store: CheckpointStore,
    reporter: Reporter,
    *,
    stop: asyncio.Event | None = None,
    metrics: Metrics | None = None,
) -> Engine:
    """The engine ``--engine`` names (Spark's modules are imported only when it is asked for)."""
    if settings.engine == "spark":
        from replicator.engines.spark.engine import SparkEngine

        return SparkEngine(settings, store, reporter, stop=stop, metrics=metrics)
    from replicator.engines.asyncio.engine import AsyncioEngine

    return AsyncioEngine(settings, store, reporter, stop=stop, metrics=metrics)
