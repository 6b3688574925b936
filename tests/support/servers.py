"""Run local MongoDB-compatible servers for tests, the demo and benchmarks.

No real ``mongod`` can be installed on the development machines, so this module starts SecantusDB
(``pip install SecantusDB``), a wire-protocol server that imitates a single-node replica set named
``secantus``.  Code under test must not depend on it: :func:`external_uris` lets the same tests run
against real servers named by ``MCDC_TEST_SOURCE_URI`` and ``MCDC_TEST_TARGET_URI``.
"""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pymongo
from pymongo.errors import PyMongoError

from replicator.job.devserver import EXECUTABLE, find_executable, server_argv
from tests.support.process import ManagedProcess

SOURCE_URI_ENV = "MCDC_TEST_SOURCE_URI"
TARGET_URI_ENV = "MCDC_TEST_TARGET_URI"
SYSTEM_DATABASES = frozenset({"admin", "local", "config"})
_MENDED_SERVER = Path(__file__).with_name("secantus_server.py")


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago (another process may still take it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def external_uris() -> tuple[str, str] | None:
    """Return ``(source, target)`` URIs of externally run servers when both environment variables are set."""
    source = os.environ.get(SOURCE_URI_ENV)
    target = os.environ.get(TARGET_URI_ENV)
    if source and target:
        return source, target
    return None


def _find_executable() -> str:
    found = find_executable()
    if found is None:
        raise RuntimeError(
            f"{EXECUTABLE} not found next to {sys.executable} or on PATH: pip install SecantusDB "
            f"(or set {SOURCE_URI_ENV} and {TARGET_URI_ENV} to real servers)"
        )
    return found


class LocalServer(ManagedProcess):
    """One SecantusDB server process on 127.0.0.1, keeping its data in ``storage_dir``.

    The port is chosen once, so :meth:`restart` brings the server back at the same URI over the same data.
    Output goes to ``<storage_dir>.log`` beside the storage directory.  Starting, stopping (SIGTERM, then
    SIGKILL), killing and waiting for it to answer ``ping`` are :class:`ManagedProcess`'s.
    """

    kind = "server"
    readiness = "answer ping"
    probe_errors = (PyMongoError,)

    def __init__(
        self,
        storage_dir: Path,
        port: int | None = None,
        *,
        startup_timeout: float = 20.0,
        oplog_entries: int | None = None,
        ttl_sweep_s: float | None = None,
    ) -> None:
        """``oplog_entries``: the oplog's bound (None: the server's own, 100,000 entries); ``ttl_sweep_s``: how
        often its TTL monitor deletes expired documents (None: every 60 s, as mongod's ttlMonitorSleepSecs)."""
        self.storage_dir = Path(storage_dir)
        self.oplog_entries = oplog_entries
        self.ttl_sweep_s = ttl_sweep_s
        super().__init__(
            "127.0.0.1",
            port if port is not None else free_port(),
            self.storage_dir.parent / f"{self.storage_dir.name}.log",
            startup_timeout=startup_timeout,
        )

    @property
    def uri(self) -> str:
        """Connection string for this server; direct, since a client must not look for a replica set."""
        return f"mongodb://{self.host}:{self.port}/?directConnection=true"

    @property
    def cwd(self) -> Path:
        """The storage directory's parent, keeping a secantusd.toml in the caller's directory out of the way."""
        return self.storage_dir.parent

    def argv(self) -> list[str]:
        """``secantusd-py`` serving ``storage_dir`` on ``host:port``, started through secantus_server.py:
        SecantusDB with its listCollections no longer bringing back a collection dropped meanwhile, and with
        ``configureFailPoint`` (tests/support/failpoint.py) enabled, as MongoDB's driver tests run mongod."""
        _find_executable()  # installed, or say how to install it
        argv = server_argv(
            str(_MENDED_SERVER), self.host, self.port, self.storage_dir, oplog_entries=self.oplog_entries
        )
        if self.ttl_sweep_s is not None:  # a flag of the test wrapper's (secantus_server.py)
            argv += ["--ttl-sweep-seconds", str(self.ttl_sweep_s)]
        return [sys.executable, *argv, "--enable-test-commands"]

    def prepare(self) -> None:
        """Create the storage directory."""
        self.storage_dir.mkdir(parents=True, exist_ok=True)

    def probe(self) -> None:
        """Return once the server answers ``ping``; raise PyMongoError until then."""
        with connect(self.uri, timeout_ms=500) as client:
            client.admin.command("ping")

    def __repr__(self) -> str:
        return f"LocalServer(storage_dir={str(self.storage_dir)!r}, port={self.port})"


@dataclass
class ServerPair:
    """A source and a target server; ``source`` and ``target`` are None when the URIs are external."""

    source_uri: str
    target_uri: str
    source: LocalServer | None = None
    target: LocalServer | None = None

    @property
    def external(self) -> bool:
        """Whether the servers were started elsewhere (and so cannot be stopped or restarted here)."""
        return self.source is None

    def stop(self) -> None:
        """Stop whichever servers this pair started."""
        started = [server for server in (self.source, self.target) if server is not None]
        for server in started:
            server.terminate()
        for server in started:
            server.stop()


@dataclass
class Clients:
    """Sync clients on a source and a target server."""

    source: pymongo.MongoClient[dict[str, Any]]
    target: pymongo.MongoClient[dict[str, Any]]

    def close(self) -> None:
        """Close both clients."""
        self.source.close()
        self.target.close()


def start_pair(base_dir: Path) -> ServerPair:
    """Use the external servers if configured, else start two local ones under ``base_dir`` in parallel."""
    uris = external_uris()
    if uris is not None:
        return ServerPair(*uris)
    source = LocalServer(Path(base_dir) / "source")
    target = LocalServer(Path(base_dir) / "target")
    try:
        source.spawn()
        target.spawn()
        source.wait_ready()
        target.wait_ready()
    except BaseException:
        source.kill()
        target.kill()
        raise
    return ServerPair(source.uri, target.uri, source, target)


def connect(uri: str, timeout_ms: int = 10_000) -> pymongo.MongoClient[dict[str, Any]]:
    """A sync client on ``uri`` that gives up selecting a server after ``timeout_ms``."""
    return pymongo.MongoClient(uri, serverSelectionTimeoutMS=timeout_ms)


def user_databases(client: pymongo.MongoClient[Any]) -> list[str]:
    """Names of the databases on ``client``'s server other than admin, local and config."""
    return [name for name in client.list_database_names() if name not in SYSTEM_DATABASES]


def drop_user_databases(uri: str) -> list[str]:
    """Drop every database but admin, local and config on the server at ``uri``; return the dropped names."""
    with connect(uri) as client:
        names = user_databases(client)
        for name in names:
            client.drop_database(name)
    return names
