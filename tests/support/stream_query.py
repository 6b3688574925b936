"""One ``readStream.format("mcdc")`` query in a process of its own, for tests that kill it: each micro-batch's
rows go to ``OUT/<batch id>.json`` (JSON lines, written whole then renamed: a batch run again after a kill
replaces its file, as an idempotent sink does). A rename's row also has ``to`` (``{"db", "coll"}``, read from
its ``change`` column); :func:`fold` is what a consumer keeping the latest state makes of the rows.

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

import bson

#: the columns kept (the binary ones are left out: they are the same bytes as the JSON ones)
COLUMNS = ("op", "db", "coll", "key", "document", "update", "cluster_time", "sequence", "resume_token", "txn")


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
        rows = [_with_to(r.asDict(recursive=True)) for r in df.select(*COLUMNS, "change").collect()]
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


def _with_to(row: dict[str, Any]) -> dict[str, Any]:
    change = row.pop("change")
    to = bson.decode(bytes(change)).get("to") if change is not None and row["op"] == "rename" else None
    return {**row, "to": {"db": to["db"], "coll": to["coll"]} if to is not None else None}


def read_batches(out: Path) -> list[dict[str, Any]]:
    """Every row the query's micro-batches delivered, in batch order."""
    rows = []
    for path in sorted(out.glob("[0-9]*.json")):
        rows += [json.loads(line) for line in path.read_text().splitlines() if line]
    return rows


def fold(rows: list[dict[str, Any]]) -> dict[tuple[str, str], Any]:
    """The rows applied in ``sequence`` order as a consumer keeping each document's latest state does:
    (namespace, key) -> the document (parsed JSON). A row with a document upserts it, an update without
    one applies its ``update`` (top-level fields: what the tests write), a delete removes it, a rename
    moves every document of its namespace to the new one (whatever the new name held is replaced, as
    MongoDB's rename with dropTarget does), a drop or dropDatabase removes its documents."""
    state: dict[tuple[str, str], Any] = {}
    for row in sorted(rows, key=lambda r: tuple(r["sequence"].values())):
        ns = f"{row['db']}.{row['coll']}"
        op = row["op"]
        if op == "d":
            state.pop((ns, row["key"]), None)
        elif op in ("drop", "dropDatabase", "rename"):
            gone = [k for k in state if (k[0] == ns if op != "dropDatabase" else k[0].startswith(row["db"] + "."))]
            moved = {k[1]: state.pop(k) for k in gone}
            if op == "rename":
                to = f"{row['to']['db']}.{row['to']['coll']}"
                for k in [k for k in state if k[0] == to]:
                    del state[k]
                state.update({(to, key): doc for key, doc in moved.items()})
        elif row["document"] is not None:
            state[(ns, row["key"])] = json.loads(row["document"])
        elif op == "u" and row["update"] is not None and (ns, row["key"]) in state:
            update = json.loads(row["update"])
            doc = {**state[(ns, row["key"])], **update["updatedFields"]}
            state[(ns, row["key"])] = {k: v for k, v in doc.items() if k not in update["removedFields"]}
    return state


if __name__ == "__main__":
    main(sys.argv[1:])
