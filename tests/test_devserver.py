"""``mcdc dev-server``: one local MongoDB-compatible replica set for trying mcdc, stopped cleanly by a signal."""

from __future__ import annotations

import ast
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pymongo
import pytest
from typer.testing import CliRunner

import replicator
from replicator.cli import app
from tests.support.servers import free_port
from tests.test_cli import _assert_one_line_error, _mcdc

STARTUP_TIMEOUT = 60.0  # the machine is shared with long benchmarks: the server may take a while to answer
STOP_TIMEOUT = 30.0


class DevServer:
    """``mcdc dev-server`` as a child process, with its stdout read line by line as it comes."""

    def __init__(self, port: int, directory: Path, log: Path) -> None:
        self.port = port
        self._stderr = open(log, "ab")  # noqa: SIM115 - closed in close()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "replicator.cli", "dev-server", "--port", str(port), "--dir", str(directory)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            process_group=0,  # as a shell's job: Ctrl-C signals the whole group
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)

    def uri(self) -> str:
        """The URI the command prints once the server answers."""
        deadline = time.monotonic() + STARTUP_TIMEOUT
        seen = []
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                assert self.process.poll() is None, f"exited with {self.process.returncode}: {seen}"
                continue
            seen.append(line)
            uri = next((word for word in line.split() if word.startswith("mongodb://")), None)
            if uri is not None:
                return uri
        raise AssertionError(f"no URI printed within {STARTUP_TIMEOUT} s: {seen}")

    def stop(self, sig: signal.Signals) -> int:
        """Send ``sig`` to the command and return its exit code."""
        self.process.send_signal(sig)
        return self.process.wait(STOP_TIMEOUT)

    def ctrl_c(self) -> int:
        """SIGINT to the command's process group, as a terminal sends it; return the exit code."""
        os.killpg(self.process.pid, signal.SIGINT)
        return self.process.wait(STOP_TIMEOUT)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._stderr.close()


def _answers(port: int) -> bool:
    """Whether anything accepts connections on 127.0.0.1:port."""
    with socket.socket() as sock:
        sock.settimeout(2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.integration
def test_dev_server_is_a_replica_set_with_change_streams_and_sigterm_stops_it_with_exit_0(tmp_path: Path) -> None:
    port = free_port()
    server = DevServer(port, tmp_path / "data", tmp_path / "stderr.log")
    try:
        uri = server.uri()
        assert uri.startswith(f"mongodb://127.0.0.1:{port}/?") and "replicaSet=" in uri
        with pymongo.MongoClient(uri, serverSelectionTimeoutMS=10_000) as client:
            things = client.trial.things
            with things.watch() as stream:  # refused by a standalone server: this one is a replica set
                things.insert_one({"_id": 1, "name": "first"})
                assert things.find_one({"_id": 1}) == {"_id": 1, "name": "first"}
                change = None
                deadline = time.monotonic() + 10
                while change is None and time.monotonic() < deadline:
                    change = stream.try_next()
            assert change is not None and change["operationType"] == "insert"
            assert change["documentKey"] == {"_id": 1}
            assert client.topology_description.topology_type_name == "ReplicaSetWithPrimary"
        assert server.stop(signal.SIGTERM) == 0
        assert not _answers(port)  # the server stopped with the command
    finally:
        server.close()
    assert "Traceback" not in (tmp_path / "stderr.log").read_text()


@pytest.mark.integration
def test_ctrl_c_stops_the_dev_server_with_exit_130_and_its_data_stays(tmp_path: Path) -> None:
    port = free_port()
    server = DevServer(port, tmp_path / "data", tmp_path / "stderr.log")
    try:
        with pymongo.MongoClient(server.uri(), serverSelectionTimeoutMS=10_000) as client:
            client.trial.things.insert_one({"_id": 1})
        assert server.ctrl_c() == 130
        assert not _answers(port)
    finally:
        server.close()
    again = DevServer(port, tmp_path / "data", tmp_path / "stderr.log")
    try:
        with pymongo.MongoClient(again.uri(), serverSelectionTimeoutMS=10_000) as client:
            assert client.trial.things.find_one() == {"_id": 1}
        assert again.stop(signal.SIGTERM) == 0
    finally:
        again.close()


def test_a_port_in_use_is_a_one_line_error_with_exit_2(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _mcdc("dev-server", "--port", str(port), "--dir", str(tmp_path / "data"))
    _assert_one_line_error(result, 2, f"port {port}", "in use", "--port")


def test_a_directory_of_other_files_is_refused_with_exit_2(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    result = _mcdc("dev-server", "--port", str(free_port()), "--dir", str(tmp_path))
    _assert_one_line_error(result, 2, str(tmp_path), "--dir")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["notes.txt"]


def test_without_secantusdb_the_error_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))  # no secantusd-py beside the interpreter
    monkeypatch.setenv("PATH", str(tmp_path))  # nor on PATH
    result = CliRunner().invoke(app, ["dev-server", "--dir", str(tmp_path / "data")])
    assert result.exit_code == 2
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("mcdc: error:"), result.stderr
    assert "pip install SecantusDB" in errors[0]
    assert not (tmp_path / "data").exists()


def test_dev_server_help_says_it_is_for_trials_with_an_example() -> None:
    text = CliRunner().invoke(app, ["dev-server", "--help"], terminal_width=200).output
    assert "for trials, not production" in " ".join(text.split())
    assert "Example" in text and "mcdc dev-server --port" in text and "mcdc sync" in text
    assert "[default: 27017]" in text and "[default: mcdc-dev-data]" in text


def _imports_devserver(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("devserver"):
            return True
        if isinstance(node, ast.ImportFrom | ast.Import) and any(a.name.endswith("devserver") for a in node.names):
            return True
    return False


def test_only_the_cli_imports_the_dev_server() -> None:
    """The dev server is for trials: the replication code never reaches it, and it reaches none of it."""
    root = Path(replicator.__file__).parent
    importers = {path.relative_to(root).as_posix() for path in root.rglob("*.py") if _imports_devserver(path)}
    assert importers == {"cli.py"}
    own = ast.parse((root / "job" / "devserver.py").read_text())
    local = {
        node.module
        for node in ast.walk(own)
        if isinstance(node, ast.ImportFrom) and (node.level > 0 or (node.module or "").startswith("replicator"))
    }
    assert local <= {"replicator.errors"}
