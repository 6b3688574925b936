"""What a user of the ``mcdc`` Spark data source reads when the source cannot be used: a port nobody listens
on, a replicaSet the server is not a member of, bad credentials on an ``--auth`` server, a certificate of
another CA, and Spark's Python workers running a Python without mcdc. Each is the CLI's own one line
(:func:`replicator.source.connection.probe`'s), after Spark's prefix, with no traceback and no password;
against real servers and the session's SparkSession."""

from __future__ import annotations

import asyncio
import os
import re
import sys
import venv
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from replicator.errors import McdcError
from replicator.events.rows import SCHEMA
from replicator.source.connection import make_client, probe
from replicator.spark import register
from replicator.spark_datasource import workers
from replicator.spark_datasource.options import DataSourceError, OptionError
from replicator.spark_datasource.snapshot import Range, SnapshotReader
from replicator.spark_datasource.stream import ChangeStreamReader, ShardRange
from tests.support.secure import PASSWORD, SecureServer, admin_client, start_with_users
from tests.support.servers import free_port
from tests.support.spark import QUERY_LIMIT_S, ended
from tests.support.tls import Certificates, make_ca, make_server_cert

pytestmark = pytest.mark.integration

#: Seconds a server may take to answer (the data source's connect-timeout option): what an unreachable one
#: costs each test.
TIMEOUT = "2"
#: Spark's prefix of a data source's error on the driver: its error class and a few words, then mcdc's line.
_BATCH = "[PYTHON_DATA_SOURCE_ERROR] Failed to generate Python data source read partitions: "
_STREAM = re.compile(
    r"^\[STREAM_FAILED\] Query \[[^]]*\] terminated with exception: \[PYTHON_STREAMING_DATA_SOURCE_RUNTIME_ERROR\] "
    r"Failed when Python streaming data source perform \w+: "
)


@pytest.fixture
def mcdc(spark: Any) -> Any:
    register(spark)
    return spark


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureServer]:
    # clusterMonitor: this server's readAnyDatabase lacks listDatabases (tests/INFRA)
    roles = {"reader": ["readAnyDatabase", "clusterMonitor"]}
    server = start_with_users(tmp_path_factory.mktemp("auth") / "source", roles)
    with admin_client(server) as client:
        client.shop.orders.insert_many([{"_id": i} for i in range(3)])
    yield server
    server.stop()


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SecureServer, Path]]:
    """A TLS server, and a CA that did not sign its certificate."""
    directory = tmp_path_factory.mktemp("tls")
    certs = make_server_cert(directory, make_ca(directory), "IP:127.0.0.1,DNS:localhost")
    other, _ = make_ca(directory, "other")
    server = SecureServer(directory / "source", tls=Certificates(certs.ca, certs.cert, certs.key))
    server.extra = server.tls_args()
    server.start()
    yield server, other
    server.stop()


def cli_line(uri: str) -> str:
    """What the CLI says of ``uri`` as a source (its probe), as the data source shows it."""
    client = make_client(uri, timeout_s=float(TIMEOUT))

    async def probed() -> None:
        try:
            await probe(client, uri, "source")
        finally:
            await client.close()

    with pytest.raises(McdcError) as caught:
        asyncio.run(probed())
    return f"mcdc: {caught.value}"


def batch_read(spark: Any, uri: str) -> list[Any]:
    return spark.read.format("mcdc").option("source", uri).option("connect-timeout", TIMEOUT).load().collect()


def stream_read(spark: Any, uri: str, checkpoint: Path) -> None:
    query = (
        spark.readStream.format("mcdc")
        .option("source", uri)
        .option("connect-timeout", TIMEOUT)
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(QUERY_LIMIT_S)


def failure_of(action: Callable[[], None]) -> str:
    with pytest.raises(Exception) as caught:  # Spark's AnalysisException / StreamingQueryException
        action()
    text = str(caught.value)
    assert "Traceback" not in text and "pymongo" not in text, text
    return text


def test_a_port_nobody_listens_on_is_the_cli_s_line_for_a_read_and_a_stream(mcdc: Any, tmp_path: Path) -> None:
    uri = f"mongodb://127.0.0.1:{free_port()}/?directConnection=true"
    expected = cli_line(uri)
    assert "is unreachable" in expected, expected
    batch = failure_of(lambda: batch_read(mcdc, uri)).splitlines()
    assert batch[0] == _BATCH + expected, batch
    first = failure_of(lambda: stream_read(mcdc, uri, tmp_path / "cp")).splitlines()[0]
    # a stream opens its client with the synchronous driver, whose reason words the refusal its own way
    assert _STREAM.match(first) and f"mcdc: source {uri} is unreachable: 127.0.0.1:" in first, first


def test_a_replica_set_name_the_server_does_not_have_is_the_cli_s_line(mcdc: Any, source_uri: str) -> None:
    uri = source_uri.replace("directConnection=true", "replicaSet=not-this-one")
    expected = cli_line(uri)
    assert "names replica set 'not-this-one'" in expected and "fix replicaSet=" in expected, expected
    assert failure_of(lambda: batch_read(mcdc, uri)).splitlines()[0] == _BATCH + expected


def test_bad_credentials_are_the_cli_s_line_without_the_password(
    mcdc: Any, auth_server: SecureServer, tmp_path: Path
) -> None:
    wrong = "not-" + PASSWORD
    uri = auth_server.user_uri("reader", wrong)
    expected = cli_line(uri)
    assert "refused us: authentication failed" in expected.lower(), expected
    for text in (failure_of(lambda: batch_read(mcdc, uri)), failure_of(lambda: stream_read(mcdc, uri, tmp_path))):
        assert text.splitlines()[0].endswith(": " + expected), text
        assert wrong not in text and PASSWORD not in text
    assert len(batch_read(mcdc, auth_server.user_uri("reader"))) == 3  # the right password reads


def test_a_source_with_nothing_to_read_reads_no_rows(mcdc: Any, source_uri: str) -> None:
    """An empty plan: Spark then reads one stand-in partition of its own, which holds nothing."""
    assert batch_read(mcdc, source_uri) == []


def test_a_certificate_of_another_ca_is_the_cli_s_line(mcdc: Any, tls_server: tuple[SecureServer, Path]) -> None:
    server, other_ca = tls_server
    uri = server.uri.replace(str(server.tls.ca if server.tls else ""), str(other_ca))
    expected = cli_line(uri)
    assert "failed verification" in expected and "fix tlsCAFile" in expected, expected
    assert failure_of(lambda: batch_read(mcdc, uri)).splitlines()[0] == _BATCH + expected


def test_an_executor_s_read_of_an_unreachable_source_is_the_cli_s_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """A task's read (in an executor's Python worker): Spark shows a task's error after its own line
    ("An exception was thrown from the Python worker:"); in the worker, the traceback is hidden."""
    uri = f"mongodb://127.0.0.1:{free_port()}/?directConnection=true"
    options = {"source": uri, "connect-timeout": TIMEOUT}
    worker_env = {k: v for k, v in os.environ.items() if k != "SPARK_HIDE_TRACEBACK"}
    monkeypatch.setattr(os, "environ", {**worker_env, "SPARK_PYTHON_RUNTIME": "PYTHON_WORKER"})
    snapshot = Range({"db": "shop", "coll": "orders", "index": 0, "bracket": "*"})
    stream = ShardRange("", uri, {"t": 1, "i": 1}, {"t": 2, "i": 1})
    reads = (
        lambda: list(SnapshotReader(options).read(snapshot)),
        lambda: list(ChangeStreamReader(options).read(stream)),
    )
    for read in reads:
        with pytest.raises(DataSourceError) as caught:
            read()
        assert str(caught.value).startswith(f"source {uri} is unreachable: 127.0.0.1:"), caught.value
        assert type(caught.value).__qualname__ == "mcdc" and caught.value.__cause__ is None
    assert os.environ["SPARK_HIDE_TRACEBACK"] == "1"


def test_a_task_s_write_to_an_unreachable_target_is_the_cli_s_line_after_spark_s(mcdc: Any) -> None:
    """The writer's tasks run on the executors: Spark shows a task's error on the line after its own."""
    uri = f"mongodb://127.0.0.1:{free_port()}/?directConnection=true"
    rows = mcdc.createDataFrame([], SCHEMA)  # one (empty) task: the sink starts, and finds no target
    writing = rows.write.format("mcdc").option("target", uri).option("connect-timeout", TIMEOUT).mode("append")
    lines = failure_of(writing.save).splitlines()
    assert lines[0] == "An exception was thrown from the Python worker:", lines
    assert lines[1].startswith(f"mcdc: target {uri} is unreachable: 127.0.0.1:") and len(lines) == 2, lines


@pytest.fixture(scope="module")
def python_without_mcdc(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A Python with neither mcdc nor its dependencies (a fresh virtual environment)."""
    directory = tmp_path_factory.mktemp("bare-venv")
    venv.create(directory, with_pip=False)
    return str(directory / "bin" / "python")


def test_workers_running_a_python_without_mcdc_are_told_at_register_naming_pyspark_python(
    spark: Any, python_without_mcdc: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # what a SparkContext started with PYSPARK_PYTHON=<that Python> runs its workers with
    monkeypatch.setenv("PYSPARK_PYTHON", python_without_mcdc)
    monkeypatch.setattr(spark.sparkContext, "pythonExec", python_without_mcdc)
    with pytest.raises(OptionError) as caught:
        register(spark)
    message = str(caught.value)
    assert message.startswith(f"Spark's Python workers run {python_without_mcdc} (PYSPARK_PYTHON), which cannot "
                              "import mcdc (ModuleNotFoundError: No module named "), message  # fmt: skip
    assert "set PYSPARK_PYTHON" in message and "spark.pyspark.python" in message and sys.executable in message
    assert len(message.splitlines()) == 1


def test_a_worker_python_without_mcdc_that_register_could_not_check_says_so_at_load(
    spark: Any, python_without_mcdc: str, source_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As on Spark Connect, whose server's Python register() cannot run: the worker itself says it, in one
    line, where Spark makes the data source."""
    monkeypatch.setattr(workers, "check", lambda _: None)
    monkeypatch.setattr(spark.sparkContext, "pythonExec", python_without_mcdc)
    register(spark)  # the class goes to that Python's workers
    try:
        text = failure_of(lambda: spark.read.format("mcdc").option("source", source_uri).load())
    finally:
        monkeypatch.undo()
        register(spark)  # the session's own Python again, for the tests after this one
    assert text.startswith(
        "[PYTHON_DATA_SOURCE_ERROR] Failed to create Python data source instance: mcdc: Spark's Python workers "
        f"run {python_without_mcdc}, which cannot import mcdc (ModuleNotFoundError: No module named "
    ), text
    assert "set PYSPARK_PYTHON" in text and "spark.pyspark.python" in text, text


def test_a_stream_s_start_at_later_than_the_source_s_time_is_one_line_and_its_time_is_taken(
    mcdc: Any, source_uri: str, tmp_path: Path
) -> None:
    """As the CLI refuses ``--start-at`` in the future: a stream from there would pass over every event
    written before the source reaches it. A start-at at the source's time is taken, and reads from there."""
    import pymongo
    from bson.timestamp import Timestamp

    with pymongo.MongoClient(source_uri) as client:
        now: Timestamp = client.admin.command("ping")["operationTime"]
        client.shop.orders.insert_many([{"_id": i} for i in range(3)])

    def stream_from(start_at: str, checkpoint: Path) -> None:
        query = (
            mcdc.readStream.format("mcdc").option("source", source_uri).option("start-at", start_at).load()
            .writeStream.format("memory").queryName(checkpoint.name)
            .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
        )  # fmt: skip
        ended(query)

    later = f"{now.time + 3600},1"
    first = failure_of(lambda: stream_from(later, tmp_path / "later")).splitlines()[0]
    prefix = _STREAM.match(first)
    assert prefix is not None, first
    said = first[prefix.end() :]
    assert said.startswith(f"mcdc: option start-at {later} is later than the source's current time "), said
    assert "give a time at or before it, or leave start-at out" in said, said

    stream_from(f"{now.time},{now.inc}", tmp_path / "at_now")
    rows = mcdc.sql("SELECT op, key FROM at_now WHERE coll = 'orders'").collect()
    assert sorted((row.op, row.key) for row in rows) == [("c", f'{{"_id":{{"$numberInt":"{i}"}}}}') for i in range(3)]
