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
from typing import Any

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

    def __init__(self, port: int, directory: Path, log: Path, *flags: str) -> None:
        self.port = port
        self._stderr = open(log, "ab")  # noqa: SIM115 - closed in close()
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "replicator.cli",
                "dev-server",
                "--port",
                str(port),
                "--dir",
                str(directory),
                *flags,
            ],
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
            assert _oplog_cap(client) == 2_000_000  # a 1,000,000-document trial leaves a waiting checkpoint's place
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


def _oplog_cap(client: pymongo.MongoClient[Any]) -> int:
    """The oplog's entry cap as the server reports it (local.oplog.rs's capped ``max``, as on mongod)."""
    (oplog,) = client.local.list_collections(filter={"name": "oplog.rs"})
    return int(oplog["options"]["max"])


@pytest.mark.integration
def test_oplog_entries_bounds_the_servers_oplog_and_older_entries_go(tmp_path: Path) -> None:
    server = DevServer(free_port(), tmp_path / "data", tmp_path / "stderr.log", "--oplog-entries", "100")
    try:
        with pymongo.MongoClient(server.uri(), serverSelectionTimeoutMS=10_000) as client:
            assert _oplog_cap(client) == 100
            oplog = client.local["oplog.rs"]
            first = oplog.find_one(sort=[("$natural", 1)])
            assert first is not None
            client.trial.create_collection("things")
            for batch in range(15):  # an entry per document
                client.trial.things.insert_many([{"_id": batch * 100 + n} for n in range(100)])
            # the server prunes as it writes (every 1,000 entries, here): the first entries are gone
            assert oplog.find_one({"ts": first["ts"]}) is None
            assert oplog.count_documents({}) < 1_000
        assert server.stop(signal.SIGTERM) == 0
    finally:
        server.close()


@pytest.mark.integration
def test_oplog_hours_bounds_how_long_the_servers_oplog_keeps_an_entry(tmp_path: Path) -> None:
    hours = 0.0002  # 0.72 s
    server = DevServer(free_port(), tmp_path / "data", tmp_path / "stderr.log", "--oplog-hours", str(hours))
    try:
        with pymongo.MongoClient(server.uri(), serverSelectionTimeoutMS=10_000) as client:
            things = client.trial.things
            things.insert_one({"_id": "marker"})
            oplog = client.local["oplog.rs"]
            marker = {"o._id": "marker"}
            assert oplog.find_one(marker) is not None
            written = time.monotonic()
            n = 0
            # writes until the server prunes (it does as it writes) an entry older than the bound; with the
            # default bound of days, this entry would stay
            while oplog.find_one(marker) is not None and time.monotonic() < written + 120:
                things.insert_many([{"_id": n + k} for k in range(200)])
                n += 200
            assert oplog.find_one(marker) is None, f"still there after {n} writes"
        assert server.stop(signal.SIGTERM) == 0
    finally:
        server.close()


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (("--oplog-entries", "0"), ("--oplog-entries", "at least 1")),
        (("--oplog-entries", "many"), ("--oplog-entries", "whole number")),
        (("--oplog-hours", "0"), ("--oplog-hours", "more than 0")),
        (("--oplog-hours", "soon"), ("--oplog-hours", "number")),
    ],
)
def test_a_bad_oplog_bound_is_a_one_line_error_with_exit_2(
    tmp_path: Path, flags: tuple[str, ...], words: tuple[str, ...]
) -> None:
    result = _mcdc("dev-server", "--port", str(free_port()), "--dir", str(tmp_path / "data"), *flags)
    _assert_one_line_error(result, 2, *words)
    assert not (tmp_path / "data").exists()  # refused before anything started


def test_dev_server_help_says_what_the_oplog_bounds_mean_for_a_waiting_checkpoint() -> None:
    text = " ".join(CliRunner().invoke(app, ["dev-server", "--help"], terminal_width=200).output.split())
    assert "--oplog-entries" in text and "--oplog-hours" in text
    assert "[default: 2000000]" in text and "[default: 24]" in text
    assert "checkpoint" in text and "exit 4" in text  # what happens to a checkpoint that waits past them
