"""``mcdc dev-server``: one local MongoDB-compatible server to try mcdc on. For trials, not production.

It runs SecantusDB (``pip install SecantusDB``, a MongoDB wire-protocol server written in Python) as a
child process: ``secantusd-py`` on 127.0.0.1, which answers as a single-node replica set, so change
streams work. The server is a separate program rather than a library imported here; mcdc's own
process never loads it.

Nothing on the replication path imports this module, and it imports nothing of it: only the command
line uses it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

from replicator.errors import DevServerError

EXECUTABLE = "secantusd-py"
INSTALL_HINT = "pip install SecantusDB (or pip install 'mcdc[embedded]')"
#: An unauthenticated test server: it never listens beyond this machine.
HOST = "127.0.0.1"
DEFAULT_PORT = 27017
DEFAULT_DIR = Path("mcdc-dev-data")
#: It answers in about a second; a machine busy with other work may take far longer.
STARTUP_TIMEOUT_S = 60.0
_PROBE_INTERVAL_S = 0.1
#: How long a server given up on (startup failed) has to stop cleanly before it is killed.
_STOP_TIMEOUT_S = 10.0
#: A file every SecantusDB data directory holds (a mongod's has WiredTiger files too, but not this one).
_STORAGE_MARK = "secantus_collections.wt"
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def find_executable() -> str | None:
    """``secantusd-py`` beside this interpreter (an unactivated virtualenv), else on PATH; None if absent."""
    beside = Path(sys.executable).parent / EXECUTABLE
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(EXECUTABLE)


def server_argv(
    executable: str,
    host: str,
    port: int,
    directory: Path,
    *,
    oplog_entries: int | None = None,
    oplog_hours: float | None = None,
) -> list[str]:
    """The command line of one server on ``host:port`` keeping its data in ``directory``; its oplog keeps
    ``oplog_entries`` entries and ``oplog_hours`` hours at most (None: the server's own bounds)."""
    argv = [executable, "--host", host, "--port", str(port), "--storage-path", str(directory)]
    if oplog_entries is not None:
        argv += ["--oplog-max-entries", str(oplog_entries)]
    if oplog_hours is not None:
        argv += ["--oplog-retention-seconds", f"{oplog_hours * 3600:g}"]
    return argv


def serve(
    port: int,
    directory: Path,
    *,
    on_ready: Callable[[str], None],
    note: Callable[[str], None],
    oplog_entries: int | None = None,
    oplog_hours: float | None = None,
) -> int:
    """Run one server on 127.0.0.1:``port`` over ``directory`` until a signal; return the exit code.
    Its oplog keeps ``oplog_entries`` entries and ``oplog_hours`` hours at most (see :func:`server_argv`).

    ``on_ready`` gets the URI once the server answers; ``note`` gets messages for the person watching.
    SIGINT (Ctrl-C) stops the server cleanly and returns 130; SIGTERM and SIGHUP return 0. A second
    signal kills the server at once. Raises :class:`DevServerError` when it cannot start, or when it
    stops on its own.
    """
    executable = find_executable()
    if executable is None:
        raise DevServerError(f"{EXECUTABLE}, the server dev-server runs, is not installed: {INSTALL_HINT}")
    directory = directory.absolute()
    _check_directory(directory)
    _check_port(port)
    directory.mkdir(parents=True, exist_ok=True)
    with _forwarding_signals() as stopper:
        process = subprocess.Popen(
            server_argv(executable, HOST, port, directory, oplog_entries=oplog_entries, oplog_hours=oplog_hours),
            stdin=subprocess.DEVNULL,
            process_group=0,  # the terminal's Ctrl-C reaches only us; we stop the server with one SIGTERM
        )
        try:
            stopper.attach(process)
            set_name = _wait_ready(process, port, stopper)
            if set_name is not None:
                note(f"SecantusDB on {HOST}:{port}, data in {directory}: for trials, not production")
                on_ready(f"mongodb://{HOST}:{port}/?replicaSet={set_name}")
                note("Ctrl-C stops it")
            code = process.wait()
        finally:
            if process.poll() is None:  # an error on our side: never leave a server behind
                _stop(process)
    if stopper.signum is None:
        raise DevServerError(f"the server on port {port} stopped on its own (exit code {code}); see its log above")
    if code != 0 and not stopper.killed:
        raise DevServerError(f"the server on port {port} exited with code {code} while stopping; see its log above")
    note(f"stopped; the data stays in {directory}")
    return 130 if stopper.signum == signal.SIGINT else 0


def _check_directory(directory: Path) -> None:
    """Refuse a path that is not a directory, or a directory of other files (WiredTiger would write among
    them)."""
    if directory.exists() and not directory.is_dir():
        raise DevServerError(f"{directory} is not a directory: pass another --dir")
    if directory.is_dir() and any(directory.iterdir()) and not (directory / _STORAGE_MARK).exists():
        raise DevServerError(f"{directory} holds other files, not a dev server's data: pass a new or empty --dir")


def _check_port(port: int) -> None:
    """Fail in one line while the port is taken, rather than with the server's traceback."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # as a server binds: a port held only by connections closing down (TIME_WAIT) is free
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError as exc:
            raise DevServerError(f"port {port} on {HOST} is in use ({exc.strerror}): pass another --port") from None


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL if the server has not stopped after a while."""
    process.terminate()
    try:
        process.wait(_STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class _Stopper:
    """The signal handler: the first signal asks the server to stop (SIGTERM), a second one kills it."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.killed = False
        self._process: subprocess.Popen[bytes] | None = None

    def attach(self, process: subprocess.Popen[bytes]) -> None:
        self._process = process
        if self.signum is not None:  # the signal came while the server was being started
            process.terminate()

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        first = self.signum is None
        if first:
            self.signum = signum
        process = self._process
        if process is None or process.poll() is not None:
            return
        if first:
            process.terminate()
        else:
            self.killed = True
            process.kill()


@contextmanager
def _forwarding_signals() -> Iterator[_Stopper]:
    """A :class:`_Stopper` handling SIGINT, SIGTERM and SIGHUP while the block runs."""
    stopper = _Stopper()
    previous = {sig: signal.signal(sig, stopper) for sig in _STOP_SIGNALS}
    try:
        yield stopper
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _wait_ready(process: subprocess.Popen[bytes], port: int, stopper: _Stopper) -> str | None:
    """The replica set's name once the server answers; None when a signal stopped it first."""
    from pymongo.errors import PyMongoError  # here: `mcdc dev-server --help` needs no driver

    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while True:
        if stopper.signum is not None:
            return None
        code = process.poll()
        if code is not None:
            raise DevServerError(f"the server exited during startup (exit code {code}); see its log above")
        try:
            hello = _hello(port)
        except PyMongoError:
            pass  # not listening yet
        else:
            set_name = hello.get("setName")
            if not isinstance(set_name, str):
                raise DevServerError(
                    f"the server on port {port} is not a replica set, so it has no change streams "
                    "(does a secantusd.toml say standalone?)"
                )
            return set_name
        if time.monotonic() > deadline:
            raise DevServerError(f"the server did not answer within {STARTUP_TIMEOUT_S:g} s; see its log above")
        time.sleep(_PROBE_INTERVAL_S)


def _hello(port: int) -> dict[str, Any]:
    """The server's ``hello`` reply; PyMongoError while it does not answer."""
    import pymongo

    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(
        HOST, port, directConnection=True, serverSelectionTimeoutMS=500
    )
    with client:
        return client.admin.command("hello")
