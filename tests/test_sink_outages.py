"""Every sink that cannot be reached ends as an unreachable MongoDB target does (issue 49, item 4): sync
exits 75 at once, in one line saying it is unreachable; tail (and sync given --max-retries) waits under
--max-retries, then exits 75 saying it gave up. Whether it is a MongoDB server, a Kafka broker, a Delta
object store or an Iceberg REST catalog. A port that answers another protocol (a MongoDB port named as a
Kafka broker) is a mistake in the URI: exit 2. Each subprocess's timeout (well under the issue's 3
minutes) bounds how long an outage may take to be told."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pymongo
import pytest

from tests.support.cli import mcdc, one_line_error
from tests.support.servers import free_port

pytestmark = pytest.mark.integration

_FAST = ("--retry-initial-delay", "0.05", "--retry-max-delay", "0.1")
#: storage options of an S3 endpoint that is not there
_S3 = ("AWS_ALLOW_HTTP=true", "AWS_ACCESS_KEY_ID=a", "AWS_SECRET_ACCESS_KEY=b", "AWS_REGION=us-east-1")


def _no_noise(result: subprocess.CompletedProcess[str]) -> None:
    """No HTTP client's or object store's raw text in what the user reads."""
    for noise in ("HTTPConnectionPool", "urllib3", "NewConnectionError", "\x1b["):
        assert noise not in result.stderr, result.stderr[-3000:]


def _targets(tmp_path: Path) -> dict[str, tuple[str, ...]]:
    """Each kind of target, at a port nobody listens on, with the options it needs."""
    port = free_port()
    lake = ("--lake-opt", f"AWS_ENDPOINT_URL=http://127.0.0.1:{port}", *(a for o in _S3 for a in ("--lake-opt", o)))
    return {
        "mongodb": (f"mongodb://127.0.0.1:{port}/?directConnection=true",),
        "kafka": (f"kafka://127.0.0.1:{port}",),
        "delta": ("delta:s3://bucket/lake", *lake),
        "iceberg-rest": (
            f"iceberg:{tmp_path / 'warehouse'}", "--lake-opt", "type=rest", "--lake-opt", f"uri=http://127.0.0.1:{port}"
        ),
    }  # fmt: skip


@pytest.mark.parametrize("kind", ["mongodb", "kafka", "delta", "iceberg-rest"])
def test_an_unreachable_target_exits_75_at_once_from_sync_and_after_max_retries_from_tail(
    source_uri: str, tmp_path: Path, kind: str
) -> None:
    with pymongo.MongoClient(source_uri) as client:
        client.shop.orders.insert_many([{"_id": i} for i in range(3)])
    target, *options = _targets(tmp_path)[kind]
    args = ("-s", source_uri, "-t", target, *options, "--connect-timeout", "3", "--no-progress")
    synced = mcdc("sync", *args, "-c", str(tmp_path / "sync.json"))  # the default retries: none at start
    assert "gave up" not in one_line_error(synced, 75, "is unreachable")
    _no_noise(synced)
    tailed = mcdc("tail", *args, *_FAST, "-c", str(tmp_path / "tail.json"), "--max-retries", "1")
    one_line_error(tailed, 75, "gave up after 1 retries (--max-retries 1)", "is unreachable")
    _no_noise(tailed)
    assert not (tmp_path / "sync.json").exists() and not (tmp_path / "tail.json").exists()


def test_a_mongodb_port_named_as_a_kafka_broker_is_a_mistake_exit_2(source_uri: str, tmp_path: Path) -> None:
    port = source_uri.split("//", 1)[1].split("/", 1)[0]
    result = mcdc("sync", "-s", source_uri, "-t", f"kafka://{port}", "-c", str(tmp_path / "cp.json"), *_FAST)
    one_line_error(result, 2, f"kafka://{port}", "not as a Kafka broker")
