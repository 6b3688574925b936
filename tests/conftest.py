"""Shared fixtures: a source and a target server per test session, wiped clean before each test.

Set MCDC_TEST_SOURCE_URI and MCDC_TEST_TARGET_URI to run against real servers instead of SecantusDB;
note that every database except admin, local and config on them is dropped before each test.

``kafka_broker``/``kafka``: one Kafka-protocol broker (noida-db) per session; set MCDC_TEST_KAFKA_BOOTSTRAP to
use a real broker instead, whose topics and consumer groups are then all deleted before each test too.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.kafka import KafkaBroker, delete_consumer_groups, delete_topics
from tests.support.schedule import SuiteScheduling, uses_the_session_outside_its_modules
from tests.support.servers import Clients, LocalServer, ServerPair, connect, drop_user_databases, start_pair
from tests.support.spark import start_session, use_quick_spark_home
from tests.support.tree import tree_entries


def pytest_configure(config: pytest.Config) -> None:
    """Spark's JVMs started by the suite (the session's, each ``mcdc --engine spark``'s, a cluster's) get a
    ``SPARK_HOME`` whose Python processes import pyspark from its cached bytecode, not compiled from pyspark.zip
    (tests/support/spark.py says why)."""
    if importlib.util.find_spec("pyspark") is not None:
        use_quick_spark_home()


def pytest_sessionstart(session: pytest.Session) -> None:
    """What the checkout holds before the suite (see :func:`pytest_sessionfinish`)."""
    if not hasattr(session.config, "workerinput"):  # the controller (or the only process)
        session.config.stash[_TREE] = tree_entries()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The suite leaves the checkout as it found it: a test, a Spark JVM, an example or a docs command that
    wrote into the repository (Spark's ``metastore_db/``, ``derby.log``, ``spark-warehouse/``; a checkpoint,
    a log) fails the run, naming what it left. Ignored files count too: ``git status --ignored``."""
    before = session.config.stash.get(_TREE, None)
    if before is None or hasattr(session.config, "workerinput"):
        return
    left = sorted(tree_entries() - before)
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"the suite left these in the checkout (git status --ignored): {left}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_TREE = pytest.StashKey[set[str]]()


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # before pytest-xdist's own; none without xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` (scripts/test.sh runs the suite on a few workers, each with servers of its own):
    the tests that use the session's SparkSession on one worker, the longest tests first
    (tests/support/schedule.py)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    return SuiteScheduling(config, log)


#: the fixtures that start a server process (or a broker, or Spark): a test using one is no quick one
SERVER_FIXTURES = frozenset(
    {"servers", "source_uri", "target_uri", "clients", "kafka_broker", "kafka", "spark", "second_shard", "own_source"}
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that uses the session's SparkSession must run in the unit that has it. A test that uses a server's
    fixture is an integration test (``-m "not integration"``, scripts/test.sh --quick, leaves it out), whether
    or not it says so."""
    for item in items:
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)
        if uses_the_session_outside_its_modules(item):
            raise pytest.UsageError(
                f"{item.nodeid} uses the spark fixture: add its module to SESSION_MODULES in "
                "tests/support/schedule.py, so that its worker is the one with the session"
            )


@pytest.fixture(autouse=True)
def _quick_tier(monkeypatch: pytest.MonkeyPatch) -> None:
    """``scripts/test.sh --quick`` (MCDC_TEST_QUICK=1) runs the tests that start no server, broker or Spark: one
    that starts a server process there fails, saying to mark it an integration test."""
    if not os.environ.get("MCDC_TEST_QUICK"):
        return
    from tests.support.process import ManagedProcess

    def refuse(process: ManagedProcess) -> None:
        process.argv()  # what it would run: its own errors first (a missing executable)
        raise RuntimeError(f"this test starts {process!r}: mark it @pytest.mark.integration (not a quick test)")

    monkeypatch.setattr(ManagedProcess, "spawn", refuse)


@pytest.fixture(autouse=True)
def _state_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's default checkpoints (and cutover's reverse ones) in a directory of its own, not in the
    user's ~/.local/state: two tests between the same servers are two migrations, not one."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))


@pytest.fixture(scope="session")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerPair]:
    """The session's source and target servers (``.source``/``.target`` are None when external)."""
    pair = start_pair(tmp_path_factory.mktemp("servers"))
    try:
        yield pair
    finally:
        pair.stop()


@pytest.fixture
def source_uri(servers: ServerPair) -> str:
    """URI of the source server, with every non-system database dropped first."""
    drop_user_databases(servers.source_uri)
    return servers.source_uri


@pytest.fixture
def target_uri(servers: ServerPair) -> str:
    """URI of the target server, with every non-system database dropped first."""
    drop_user_databases(servers.target_uri)
    return servers.target_uri


@pytest.fixture
def clients(source_uri: str, target_uri: str) -> Iterator[Clients]:
    """Sync clients for source and target, closed at teardown."""
    pair = Clients(connect(source_uri), connect(target_uri))
    try:
        yield pair
    finally:
        pair.close()


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """The session's Kafka broker (``.external`` when MCDC_TEST_KAFKA_BOOTSTRAP names one)."""
    broker = KafkaBroker.from_env(tmp_path_factory.mktemp("kafka"))
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
async def kafka(kafka_broker: KafkaBroker) -> AsyncIterator[KafkaBroker]:
    """The session's broker, running, with every non-internal topic and every consumer group deleted first."""
    if not kafka_broker.running:  # an earlier test stopped or killed it and failed before restarting it
        kafka_broker.start()
    await delete_topics(kafka_broker.bootstrap)
    await delete_consumer_groups(kafka_broker.bootstrap)
    yield kafka_broker


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The session's one ``local[2]`` SparkSession (tests/support/spark.py), stopped at the end."""
    session = start_session()
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture
def second_shard(tmp_path: Path) -> Iterator[str]:
    """A second server, to act as a second shard of the source beside ``source_uri``."""
    with _own_server(tmp_path / "shard2") as uri:
        yield uri


@pytest.fixture
def own_source(servers: ServerPair, tmp_path: Path) -> Iterator[str]:
    """A source server of the test's own, whose oplog holds only what the test writes: for a test that reads
    the oplog from long ago, which on the session's source holds every earlier test's writes. With external
    servers, the session's source (its user databases dropped, as ``source_uri`` does)."""
    if servers.source is None:
        drop_user_databases(servers.source_uri)
        yield servers.source_uri
        return
    with _own_server(tmp_path / "own-source") as uri:
        yield uri


@contextlib.contextmanager
def _own_server(directory: Path) -> Iterator[str]:
    """A server for one test, killed at its end: no one reads its data again, and a clean stop of an idle
    SecantusDB takes 2 s."""
    server = LocalServer(directory)
    server.start()
    try:
        yield server.uri
    finally:
        server.kill()
