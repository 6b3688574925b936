"""--engine spark end to end: snapshot partitions as Spark tasks, the replay as a streaming query, and
verify's ranges as tasks, against the real test servers and the session's local SparkSession."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pymongo
import pytest

from replicator.config import resolve
from replicator.progress import LogReporter
from replicator.sync import SyncJob
from tests.support.compare import assert_identical
from tests.support.corpus import load_corpus

pytestmark = pytest.mark.integration


async def run_job(source: str, target: str, checkpoint: Path, command: str = "sync", **flags: Any) -> dict[str, Any]:
    settings = resolve(
        {"source": source, "target": target, "checkpoint": checkpoint, "engine": "spark", **flags}, env={}
    )
    summary = await SyncJob(settings, LogReporter(), command=command).run()
    return summary.to_json()


async def test_sync_on_spark_copies_every_bson_type_byte_exact(
    spark: Any, source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    with pymongo.MongoClient(source_uri) as client:
        info = load_corpus(client)
    jobs_before = len(spark.sparkContext.statusTracker().getJobIdsForGroup())
    summary = await run_job(source_uri, target_uri, tmp_path / "cp.json", partition_docs=500, split="always")
    assert summary["snapshot"] == "completed"
    state = assert_identical(source_uri, target_uri)
    assert len(state["corpus.mixed_ids"]["docs"]) == info["namespaces"]["corpus.mixed_ids"]
    checkpoint = json.loads((tmp_path / "cp.json").read_text())
    assert checkpoint["snapshot"]["status"] == "done"
    mixed = [p for p in checkpoint["snapshot"]["plan"] if p["coll"] == "mixed_ids"]
    assert len({p["bracket"] for p in mixed}) >= 8
    assert len(checkpoint["snapshot"]["done"]) == len(checkpoint["snapshot"]["plan"])
    # one Spark job per partition: the copy ran as Spark tasks
    assert len(spark.sparkContext.statusTracker().getJobIdsForGroup()) - jobs_before >= len(
        checkpoint["snapshot"]["plan"]
    )
