"""Time-series collections (issue 50, item 3) against a wire stand-in that answers as mongod does.

The test server stores a collection created with ``timeseries`` options as a plain one and streams its writes
(an INFRA quirk), so source and target here are the test servers behind :mod:`tests.support.timeseries`,
which lists ``metrics.cpu`` as a time-series collection and leaves its writes out of change streams, as
mongod does. mcdc cannot follow such a collection:

* ``sync``, ``catch-up`` and ``tail`` refuse a selection holding one, in one line that says what to do;
* doing what it says (leave it out, copy it once its writes stopped) ends with ``verify`` exit 0;
* ``verify`` compares its measurements by content: one changed in place on the target is found.
"""

from __future__ import annotations

import datetime
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pymongo
import pytest

from tests.support.timeseries import TimeseriesStandIn, timeseries_server

pytestmark = pytest.mark.integration

CPU = {"timeField": "ts", "metaField": "host", "granularity": "seconds"}
START = datetime.datetime(2024, 5, 1)


def _mcdc(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "replicator.cli", *args], capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


def _measure(client: pymongo.MongoClient[dict[str, object]], first: int, count: int) -> None:
    at = [START + datetime.timedelta(seconds=n) for n in range(first, first + count)]
    client.metrics.cpu.insert_many([{"ts": ts, "host": f"h{n % 3}", "v": n} for n, ts in enumerate(at, first)])


@pytest.fixture
def stand_ins(source_uri: str, target_uri: str) -> Iterator[tuple[TimeseriesStandIn, TimeseriesStandIn]]:
    """Source and target behind stand-ins that hold ``metrics.cpu`` as a time-series collection; the source
    has it (with 50 measurements) and ``shop.orders`` (a plain one)."""
    with pymongo.MongoClient(source_uri) as client:
        client.metrics.create_collection("cpu", timeseries=CPU)
        _measure(client, 0, 50)
        client.shop.create_collection("orders")
        client.shop.orders.insert_many([{"_id": n, "total": n} for n in range(20)])
    with (
        timeseries_server(source_uri, {"metrics.cpu": CPU}) as source,
        timeseries_server(target_uri, {"metrics.cpu": CPU}) as target,
    ):
        yield source, target


@pytest.mark.parametrize("command", ["sync", "catch-up", "tail"])
def test_a_selection_holding_a_time_series_collection_is_refused_in_one_line(
    stand_ins: tuple[TimeseriesStandIn, TimeseriesStandIn], tmp_path: Path, command: str
) -> None:
    source, target = stand_ins
    done = _mcdc(command, "-s", source.uri, "-t", target.uri, "-c", str(tmp_path / "cp.json"), "--no-progress",
                 timeout=60)  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("mcdc: error: source: metrics.cpu is a time-series collection"), lines[0]
    assert r"--exclude 'metrics\.cpu'" in lines[0] and "--snapshot-only" in lines[0]
    with pymongo.MongoClient(target.uri) as client:  # refused before anything was written
        assert "metrics" not in client.list_database_names() and "shop" not in client.list_database_names()


def test_what_the_refusal_says_to_do_ends_with_verify_exit_0(
    stand_ins: tuple[TimeseriesStandIn, TimeseriesStandIn], tmp_path: Path
) -> None:
    """Leave the time-series collection out and follow the rest while the writes go on; once they stopped,
    copy it as the refusal says; verify of everything then passes."""
    source, target = stand_ins
    common = ["-s", source.uri, "-t", target.uri, "--no-progress"]
    refused = _mcdc("sync", *common, "-c", str(tmp_path / "cp.json"))
    line = refused.stderr.strip()
    leave_out = re.findall(r"--exclude '[^']*'", line)
    copy = re.search(r"\(mcdc (sync --snapshot-only [^,]*),", line)
    assert refused.returncode == 2 and leave_out and copy is not None, line
    exclude = shlex.split(" ".join(leave_out))
    first = _mcdc("sync", *common, "-c", str(tmp_path / "cp.json"), *exclude)
    assert first.returncode == 0, first.stderr[-3000:]
    with pymongo.MongoClient(source.uri) as client:  # the writes go on
        _measure(client, 50, 30)
        client.shop.orders.update_one({"_id": 3}, {"$set": {"total": 300}})
        client.metrics.cpu.delete_many({"v": {"$lt": 5}})
    again = _mcdc("catch-up", *common, "-c", str(tmp_path / "cp.json"), *exclude)
    assert again.returncode == 0, again.stderr[-3000:]
    # the writes have stopped: the copy the refusal names, with a checkpoint of its own
    copied = _mcdc(*shlex.split(copy.group(1)), *common, "-c", str(tmp_path / "timeseries.json"))
    assert copied.returncode == 0, copied.stderr[-3000:]
    checked = _mcdc("verify", "-s", source.uri, "-t", target.uri)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    with pymongo.MongoClient(target.uri) as client:
        assert client.metrics.cpu.count_documents({}) == 75 and client.shop.orders.find_one({"_id": 3})["total"] == 300


def test_verify_compares_a_time_series_collection_by_content(
    stand_ins: tuple[TimeseriesStandIn, TimeseriesStandIn], target_uri: str, tmp_path: Path
) -> None:
    """As many measurements on each side, one of them changed in place on the target: found."""
    source, target = stand_ins
    common = ["-s", source.uri, "-t", target.uri]
    copied = _mcdc("sync", *common, "--snapshot-only", "--include", r"metrics\.cpu", "-c", str(tmp_path / "cp.json"))
    assert copied.returncode == 0, copied.stderr[-3000:]
    assert _mcdc("verify", *common, "--include", r"metrics\.cpu").returncode == 0
    with pymongo.MongoClient(target_uri) as client:
        client.metrics.cpu.update_one({"v": 7}, {"$set": {"v": 70}})
        assert client.metrics.cpu.count_documents({}) == 50
    checked = _mcdc("verify", *common, "--include", r"metrics\.cpu")
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert "metrics.cpu: the 50 measurements differ in content" in checked.stdout + checked.stderr
