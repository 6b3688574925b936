"""A target that took a batch's writes but could not satisfy their write concern (a ``writeConcernError``
beside no write error): the batch is not acknowledged. Before, the MongoDB sink read only the write errors
of a BulkWriteError: an insert or replacement batch counted as written, and an ordered one failed with
an IndexError's traceback. The test server answers ``w: 5`` on one node as mongod does
(UnsatisfiableWriteConcern, code 100, in ``writeConcernError``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import bson
import pymongo
import pytest
from bson.raw_bson import RawBSONDocument

from replicator.errors import SinkError, SinkUnavailable
from replicator.events import ChangeEvent, Namespace, Op, UpdateDescription
from replicator.sinks.mongo.sink import MongoSink

pytestmark = pytest.mark.integration
NS = Namespace("wcdb", "c")
#: a write concern no single-node target can satisfy, and a short wait for it
UNSATISFIABLE = "&w=5&wtimeoutMS=300"


def _raw(doc: dict[str, object]) -> RawBSONDocument:
    return RawBSONDocument(bson.encode(doc))


@pytest.mark.parametrize("kind", ["copy", "replacements", "deletes", "deltas", "index", "rename", "drop"])
async def test_a_batch_whose_write_concern_failed_is_not_written(target_uri: str, kind: str) -> None:
    with pymongo.MongoClient(target_uri) as client:
        client.wcdb.c.insert_many([{"_id": 1, "v": 0}, {"_id": 2, "v": 0}])
    async with MongoSink(target_uri + UNSATISFIABLE) as sink:
        with pytest.raises(SinkError, match="write concern") as raised:
            if kind == "copy":
                await sink.write_copy(NS, [_raw({"_id": 3})], None)
            elif kind == "replacements":
                await sink.write([ChangeEvent(Op.INSERT, NS, key=_raw({"_id": 3}), document=_raw({"_id": 3}))])
            elif kind == "deletes":
                await sink.write([ChangeEvent(Op.DELETE, NS, key=_raw({"_id": 1}))])
            elif kind == "deltas":
                await sink.write([ChangeEvent(Op.UPDATE, NS, key=_raw({"_id": 1}), update=UpdateDescription({"v": 1}))])
            elif kind == "index":  # DDL too: the checkpoint moves past it only once it is acknowledged
                await sink.write(
                    [ChangeEvent(Op.CREATE_INDEXES, NS, ddl={"indexes": [{"key": {"v": 1}, "name": "v_1"}]})]
                )
            elif kind == "rename":
                await sink.write([ChangeEvent(Op.RENAME, NS, to=Namespace("wcdb", "renamed"))])
            else:
                await sink.write([ChangeEvent(Op.DROP, NS)])
    assert "UnsatisfiableWriteConcern" in str(raised.value) or "100" in str(raised.value)
    assert not isinstance(raised.value, SinkUnavailable)  # no number of retries satisfies it


def test_a_write_concern_timeout_is_written_again_and_any_other_failure_stops() -> None:
    from replicator.sinks.mongo.concern import concern_failed

    timeout = {"code": 64, "codeName": "WriteConcernFailed", "errmsg": "waiting for replication timed out",
               "errInfo": {"wtimeout": True}}  # fmt: skip
    assert isinstance(concern_failed(NS, timeout), SinkUnavailable)
    stepped_down = {"code": 189, "codeName": "PrimarySteppedDown", "errmsg": "stepped down"}
    assert isinstance(concern_failed(NS, stepped_down), SinkUnavailable)
    unknown_mode = {"code": 79, "codeName": "UnknownReplWriteConcern", "errmsg": "unrecognized write concern mode"}
    assert not isinstance(concern_failed(NS, unknown_mode), SinkUnavailable)


def test_a_sync_into_a_target_that_cannot_satisfy_its_write_concern_fails_in_one_line(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    with pymongo.MongoClient(source_uri) as client:
        client.wcdb.c.insert_many([{"_id": i} for i in range(10)])
    result = subprocess.run(
        [sys.executable, "-m", "replicator.cli", "sync", "-s", source_uri, "-t", target_uri + UNSATISFIABLE,
         "-c", str(tmp_path / "cp.json"), "--include", r"wcdb\.c", "--no-progress", "--max-retries", "0"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode != 0, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("mcdc: error:")]
    assert len(errors) == 1 and "write concern" in errors[0], result.stderr
    assert "Traceback" not in result.stderr
