"""A new local Iceberg catalog opened by several processes at once (mcdc and a reader of the lake, or a Spark
run's tasks): pyiceberg's SQL catalog creates its tables when it finds none, and all but the first then fail
with "table iceberg_tables already exists" (seen: a live tail into Iceberg exited 2 at its start while the test
read the lake). The catalog is opened again once it exists."""

from __future__ import annotations

import threading
from pathlib import Path

from replicator.sinks.lake.iceberg import IcebergBackend


def test_a_new_catalog_opened_from_six_threads_at_once_opens_in_each(tmp_path: Path) -> None:
    for trial in range(5):
        root = tmp_path / f"lake{trial}"
        root.mkdir()
        barrier = threading.Barrier(6)
        failed: list[str] = []

        def opens(root: Path = root, barrier: threading.Barrier = barrier, failed: list[str] = failed) -> None:
            barrier.wait()
            try:
                assert IcebergBackend(str(root), {}).catalog is not None
            except Exception as exc:
                failed.append(str(exc)[:200])

        threads = [threading.Thread(target=opens) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert failed == [], failed
