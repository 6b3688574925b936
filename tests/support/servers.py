"""Run local MongoDB-compatible servers for tests, the demo and benchmarks.

No real ``mongod`` can be installed on the development machines, so this module starts SecantusDB
(``pip install SecantusDB``), a wire-protocol server that imitates a single-node replica set named
``secantus``.  Code under test must not depend on it: :func:`external_uris` lets the same tests run
against real servers named by ``MCDC_TEST_SOURCE_URI`` and ``MCDC_TEST_TARGET_URI``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import pymongo
from pymongo.errors import PyMongoError

SERVER_EXECUTABLE = "secantusd-py"
SOURCE_URI_ENV = "MCDC_TEST_SOURCE_URI"
TARGET_URI_ENV = "MCDC_TEST_TARGET_URI"
SYSTEM_DATABASES = frozenset({"admin", "local", "config"})

_LOG_TAIL_BYTES = 4000


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
    # Prefer the interpreter's own venv so an unactivated venv still finds its server.
    beside = Path(sys.executable).parent / SERVER_EXECUTABLE
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which(SERVER_EXECUTABLE)
    if found is None:
        raise RuntimeError(
            f"{SERVER_EXECUTABLE} not found next to {sys.executable} or on PATH: pip install SecantusDB "
            f"(or set {SOURCE_URI_ENV} and {TARGET_URI_ENV} to real servers)"
        )
    return found


class LocalServer:
    """One SecantusDB server process on 127.0.0.1, keeping its data in ``storage_dir``.

    The port is chosen once, so :meth:`restart` brings the server back at the same URI over the same data.
    Output goes to ``<storage_dir>.log`` beside the storage directory: a file, not a pipe, so a chatty
    server can never block on a full pipe buffer.
    """

    def __init__(self, storage_dir: Path, port: int | None = None, *, startup_timeout: float = 20.0) -> None:
        self.storage_dir = Path(storage_dir)
        self.port = port if port is not None else free_port()
        self.host = "127.0.0.1"
        self.startup_timeout = startup_timeout
        self.log_path = self.storage_dir.parent / f"{self.storage_dir.name}.log"
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._terminating = False

    @property
    def uri(self) -> str:
        """Connection string for this server; direct, since a client must not look for a replica set."""
        return f"mongodb://{self.host}:{self.port}/?directConnection=true"

    @property
    def running(self) -> bool:
        """Whether the server process has been started and has not exited."""
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        """Start the server and wait until it answers ``ping``."""
        self.spawn()
        self.wait_ready()

    def spawn(self) -> None:
        """Start the process without waiting, so several servers can boot in parallel."""
        if self.running:
            raise RuntimeError(f"server on port {self.port} is already running")
        executable = _find_executable()
        self.storage_dir.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in _reap()
        args = [executable, "--host", self.host, "--port", str(self.port)]
        args += ["--storage-path", str(self.storage_dir)]
        self._process = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=self.storage_dir.parent,  # keep a secantusd.toml in the caller's directory out of the way
        )

    def wait_ready(self) -> None:
        """Block until the server answers ``ping``; raise with the log's tail if it dies or never answers."""
        deadline = time.monotonic() + self.startup_timeout
        while True:
            if self._process is None or self._process.poll() is not None:
                raise RuntimeError(f"server on port {self.port} exited during startup:\n{self.log_tail()}")
            try:
                with connect(self.uri, timeout_ms=500) as client:
                    client.admin.command("ping")
                return
            except PyMongoError:
                if time.monotonic() > deadline:
                    self.kill()
                    raise RuntimeError(
                        f"server on port {self.port} did not answer ping within {self.startup_timeout} s:\n"
                        f"{self.log_tail()}"
                    ) from None
                time.sleep(0.1)

    def terminate(self) -> None:
        """Send SIGTERM without waiting, so several servers can shut down in parallel; then call stop()."""
        if self._process is not None and self._process.poll() is None and not self._terminating:
            self._terminating = True  # a second SIGTERM could cut a clean shutdown short
            self._process.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server with SIGTERM (a clean shutdown), falling back to SIGKILL after ``timeout``."""
        self.terminate()
        if self._process is not None:
            try:
                self._process.wait(timeout)
            except subprocess.TimeoutExpired:
                self._process.kill()
        self._reap()

    def kill(self) -> None:
        """Kill the server with SIGKILL, as a crash would."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
        self._reap()

    def restart(self) -> None:
        """Stop cleanly and start again on the same port over the same storage directory."""
        self.stop()
        self.start()

    def log_tail(self, size: int = _LOG_TAIL_BYTES) -> str:
        """The last ``size`` bytes of the server's log, for error messages."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(max(0, log.seek(0, os.SEEK_END) - size))
                return log.read().decode("utf-8", "replace")
        except OSError as exc:
            return f"(no log at {self.log_path}: {exc})"

    def _reap(self) -> None:
        if self._process is not None:
            self._process.wait()
            self._process = None
        self._terminating = False
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> LocalServer:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

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
