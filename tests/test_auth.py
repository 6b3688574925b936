"""Users of least privilege, against servers started with ``--auth`` (SCRAM-SHA-256, built-in roles enforced):
sync, catch-up, tail and cutover with the roles the README names; each missing privilege refused in one
line naming the side and the role, before anything is written; no credential in any output.

The test server's quirks (tests/INFRA): its readAnyDatabase lacks listDatabases (clusterMonitor grants it,
as on mongod), and its connectionStatus names the roles without listing their privileges."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pymongo
import pytest

from tests.support.secure import PASSWORD, SecureServer, admin_client, start_with_users
from tests.support.servers import SYSTEM_DATABASES, free_port
from tests.support.spark import quick_jvm_conf

pytestmark = pytest.mark.integration

SHOP = r"shop\..*"


def _db(name: str, role: str = "read") -> dict[str, str]:
    return {"role": role, "db": name}


@pytest.fixture(scope="module")
def auth_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SecureServer, SecureServer]]:
    base = tmp_path_factory.mktemp("auth")
    source = start_with_users(
        base / "source",
        {
            "src_least": ["readAnyDatabase"],  # a selection that names its databases
            "src_whole": ["readAnyDatabase", "clusterMonitor"],  # the deployment (mongod: readAnyDatabase)
            "src_read": [_db("shop")],  # enough for --snapshot-only, not for a change stream
        },
    )
    try:
        target = start_with_users(
            base / "target",
            {
                "tgt_least": [_db("shop", "readWrite")],
                "tgt_read": [_db("shop")],
                "tgt_elsewhere": [_db("other", "readWrite")],
                "tgt_custom": ["shopReader"],
            },
            # a custom role: the test server lists no privileges for it, so only the server can refuse
            roles={"shopReader": [{"resource": {"db": "shop", "collection": ""}, "actions": ["find"]}]},
        )
    except BaseException:
        source.stop()
        raise
    yield source, target
    source.stop()
    target.stop()


@pytest.fixture
def servers_clean(auth_pair: tuple[SecureServer, SecureServer]) -> Iterator[tuple[SecureServer, SecureServer]]:
    for server in auth_pair:
        with admin_client(server) as client:
            for name in client.list_database_names():
                if name not in SYSTEM_DATABASES:
                    client.drop_database(name)
    with admin_client(auth_pair[0]) as client:
        client.shop.create_collection("orders")
        client.shop.orders.insert_many([{"_id": i, "n": i} for i in range(200)])
        client.shop.orders.create_index("n")
    yield auth_pair


class Outputs:
    """Every output of the runs of one test, to check that no credential is in any."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.texts: list[str] = []

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(_argv(*args), capture_output=True, text=True, timeout=timeout)
        self.texts += [result.stdout, result.stderr]
        return result

    def assert_no_credentials(self, *uris: str) -> None:
        files = [p.read_text(errors="replace") for p in self.directory.rglob("*") if p.is_file()]
        for text in [*self.texts, *files]:
            assert PASSWORD not in text
            for uri in uris:
                userinfo = uri.split("://", 1)[1].split("@", 1)[0]
                assert userinfo not in text


def _argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "replicator.cli", *args]


def _wait(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _count(server: SecureServer, db: str, coll: str) -> int:
    with admin_client(server) as client:
        return client[db][coll].count_documents({})


def _user_databases(server: SecureServer) -> list[str]:
    with admin_client(server) as client:
        return [n for n in client.list_database_names() if n not in SYSTEM_DATABASES]


def test_least_roles_sync_catch_up_tail_and_cutover(
    servers_clean: tuple[SecureServer, SecureServer], tmp_path: Path
) -> None:
    source, target = servers_clean
    src, tgt = source.user_uri("src_least"), target.user_uri("tgt_least")
    out = Outputs(tmp_path)
    cp = tmp_path / "cp.json"
    common = ["-s", src, "-t", tgt, "-c", str(cp), "--include", SHOP, "--no-progress", "-v"]

    result = out.run("sync", *common)
    assert result.returncode == 0, result.stderr
    assert _count(target, "shop", "orders") == 200

    with admin_client(source) as client:
        client.shop.orders.insert_many([{"_id": i, "n": i} for i in range(200, 300)])
    result = out.run("catch-up", *common)
    assert result.returncode == 0, result.stderr
    assert _count(target, "shop", "orders") == 300

    port = free_port()
    tail = subprocess.Popen(
        _argv("tail", *common, "--metrics-port", str(port)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        with admin_client(source) as client:
            client.shop.orders.insert_many([{"_id": i, "n": i} for i in range(300, 350)])
            client.shop.orders.update_one({"_id": 0}, {"$set": {"n": -1}})
        _wait(lambda: _count(target, "shop", "orders") == 350, "the tail to replay the inserts")
        for path in ("/progress", "/metrics"):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as reply:
                out.texts.append(reply.read().decode())
    finally:
        tail.send_signal(signal.SIGTERM)
        stdout, stderr = tail.communicate(timeout=60)
    out.texts += [stdout, stderr]
    assert tail.returncode == 0, stderr

    result = out.run("cutover", *common, "--json")
    assert result.returncode == 0, result.stderr
    with admin_client(source) as s, admin_client(target) as t:
        assert list(s.shop.orders.find().sort("_id")) == list(t.shop.orders.find().sort("_id"))
        assert t.shop.orders.index_information().keys() == s.shop.orders.index_information().keys()
    out.assert_no_credentials(src, tgt)


def test_the_whole_deployment_with_read_any_database_and_cluster_monitor(
    servers_clean: tuple[SecureServer, SecureServer], tmp_path: Path
) -> None:
    source, target = servers_clean
    src = source.user_uri("src_whole")
    tgt = target.user_uri("admin")  # root: the check passes it
    out = Outputs(tmp_path)
    result = out.run("sync", "-s", src, "-t", tgt, "-c", str(tmp_path / "cp.json"), "--no-progress", "-v")
    assert result.returncode == 0, result.stderr
    assert _count(target, "shop", "orders") == 200
    out.assert_no_credentials(src, tgt)


def test_read_on_one_database_is_enough_for_a_snapshot_only_copy(
    servers_clean: tuple[SecureServer, SecureServer], tmp_path: Path
) -> None:
    source, target = servers_clean
    src, tgt = source.user_uri("src_read"), target.user_uri("tgt_least")
    out = Outputs(tmp_path)
    result = out.run(
        "sync", "-s", src, "-t", tgt, "-c", str(tmp_path / "cp.json"), "--include", SHOP, "--snapshot-only",
        "--no-progress",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert _count(target, "shop", "orders") == 200
    out.assert_no_credentials(src, tgt)


@pytest.mark.parametrize(
    ("source_user", "target_user", "include", "expected"),
    [
        pytest.param(
            "src_read", "tgt_least", SHOP,
            "source: user src_read may not open a change stream on the whole deployment: changeStream on every "
            "database (grant readAnyDatabase)",
            id="source-read-on-one-database",
        ),
        pytest.param(
            "src_least", "tgt_read", SHOP,
            "target: user tgt_read may not run insert on shop (grant readWrite on shop, or readWriteAnyDatabase)",
            id="target-read-only",
        ),
        pytest.param(
            "src_least", "tgt_elsewhere", SHOP,
            "target: user tgt_elsewhere may not run insert on shop (grant readWrite on shop",
            id="target-another-database",
        ),
        pytest.param(
            # a selection that names no database lists them: the test server's readAnyDatabase lacks
            # listDatabases (mongod's has it), so the server refuses it at run time: told the same way
            "src_least", "tgt_least", r"sh.p\..*",
            "source: the user may not run listDatabases on the cluster (grant clusterMonitor)",
            id="source-list-databases",
        ),
    ],
)  # fmt: skip
def test_a_missing_privilege_is_one_line_naming_the_side_and_the_role_before_any_write(
    servers_clean: tuple[SecureServer, SecureServer],
    tmp_path: Path,
    source_user: str,
    target_user: str,
    include: str,
    expected: str,
) -> None:
    source, target = servers_clean
    src, tgt = source.user_uri(source_user), target.user_uri(target_user)
    out = Outputs(tmp_path)
    result = out.run("sync", "-s", src, "-t", tgt, "-c", str(tmp_path / "cp.json"), "--include", include,
                     "--no-progress")  # fmt: skip
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert errors == [f"mcdc: error: {errors[0].removeprefix('mcdc: error: ')}"], result.stderr
    assert expected in errors[0], errors[0]
    assert _user_databases(target) == []  # nothing written
    out.assert_no_credentials(src, tgt)


def test_a_server_without_auth_is_not_checked(source_uri: str, target_uri: str, tmp_path: Path) -> None:
    """connectionStatus without authentication names no user: nothing to check, nothing refused."""
    with pymongo.MongoClient(source_uri) as client:
        client.shop.orders.insert_one({"_id": 1})
    result = subprocess.run(
        _argv("sync", "-s", source_uri, "-t", target_uri, "-c", str(tmp_path / "cp.json"), "--include", SHOP,
              "--no-progress"),
        capture_output=True, text=True, timeout=120, env={**os.environ},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    with pymongo.MongoClient(target_uri) as client:
        assert client.shop.orders.count_documents({}) == 1


def test_a_refusal_at_run_time_names_the_side_and_the_role(
    servers_clean: tuple[SecureServer, SecureServer], tmp_path: Path
) -> None:
    """A custom role the server lists no privileges for cannot be judged at start: the server's refusal of
    the first write is told in one line, naming the target and the role."""
    source, target = servers_clean
    src, tgt = source.user_uri("src_least"), target.user_uri("tgt_custom")
    out = Outputs(tmp_path)
    result = out.run("sync", "-s", src, "-t", tgt, "-c", str(tmp_path / "cp.json"), "--include", SHOP,
                     "--no-progress")  # fmt: skip
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("mcdc: error:")]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr
    assert errors[0].startswith("mcdc: error: target: the user may not run "), errors[0]
    assert "(grant readWrite on shop, or readWriteAnyDatabase)" in errors[0], errors[0]
    out.assert_no_credentials(src, tgt)


def test_the_spark_engine_with_the_least_roles(
    servers_clean: tuple[SecureServer, SecureServer], tmp_path: Path
) -> None:
    """Spark's tasks connect with the same URIs, so the same roles do: sync and catch-up on --engine spark."""
    source, target = servers_clean
    src, tgt = source.user_uri("src_least"), target.user_uri("tgt_least")
    out = Outputs(tmp_path)
    spark = ["--engine", "spark", "--spark-master", "local[2]", "--spark-conf", "spark.ui.enabled=false",
             "--spark-conf", "spark.driver.host=127.0.0.1", *quick_jvm_conf()]  # fmt: skip
    common = ["-s", src, "-t", tgt, "-c", str(tmp_path / "cp.json"), "--include", SHOP, "--no-progress", *spark]
    result = out.run("sync", *common, timeout=300)
    assert result.returncode == 0, result.stderr
    with admin_client(source) as client:
        client.shop.orders.insert_many([{"_id": i, "n": i} for i in range(200, 250)])
    result = out.run("catch-up", *common, timeout=300)
    assert result.returncode == 0, result.stderr
    assert _count(target, "shop", "orders") == 250
    out.assert_no_credentials(src, tgt)
