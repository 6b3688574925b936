"""One ``readStream.format("mcdc")`` query in a process of its own, for tests that kill it: each micro-batch's
rows go to ``OUT/<batch id>.json`` (JSON lines, written whole then renamed: a batch run again after a kill
replaces its file, as an idempotent sink does).

    python -m tests.support.stream_query SOURCE CHECKPOINT OUT TRIGGER [KEY=VALUE ...]

TRIGGER: ``live`` (a micro-batch every 200 ms, until killed) or ``available-now`` (up to the source's time
when the query began, then exit 0). KEY=VALUE: the mcdc data source's options.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

#: the columns kept (the binary ones are left out: they are the same bytes as the JSON ones)
COLUMNS = ("op", "db", "coll", "key", "document", "cluster_time", "sequence", "resume_token", "txn")


def main(argv: list[str]) -> None:
    source, checkpoint, out, trigger, *pairs = argv
    from replicator.spark import register
    from tests.support.spark import start_session

    spark = start_session("local[2]")
    register(spark)
    reader = spark.readStream.format("mcdc").option("source", source)
    for pair in pairs:
        key, _, value = pair.partition("=")
        reader = reader.option(key, value)
    target = Path(out)
    target.mkdir(parents=True, exist_ok=True)

    def write(df: Any, batch_id: int) -> None:
        rows = [r.asDict(recursive=True) for r in df.select(*COLUMNS).collect()]
        tmp = target / f".{batch_id}.tmp"
        tmp.write_text("".join(json.dumps(row) + "\n" for row in rows))
        os.replace(tmp, target / f"{batch_id:06d}.json")

    writer = reader.load().writeStream.foreachBatch(write).option("checkpointLocation", checkpoint)
    if trigger == "live":
        writer = writer.trigger(processingTime="200 milliseconds")
    else:
        writer = writer.trigger(availableNow=True)
    query = writer.start()
    query.awaitTermination()
    if query.exception() is not None:
        raise SystemExit(f"query failed: {query.exception()}")


def read_batches(out: Path) -> list[dict[str, Any]]:
    """Every row the query's micro-batches delivered, in batch order."""
    rows = []
    for path in sorted(out.glob("[0-9]*.json")):
        rows += [json.loads(line) for line in path.read_text().splitlines() if line]
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
