"""Users of least privilege, against servers started with ``--auth`` (SCRAM-SHA-256, built-in roles enforced):
sync, catch-up, tail and cutover with the roles docs/how-to/least-privilege.md names (read on the one selected
database follows that database's change stream); each missing privilege refused in one line naming the side and
the role, before anything is written; no credential in any output.

The test server's quirks (tests/INFRA): its readAnyDatabase lacks listDatabases (clusterMonitor grants it,
as on mongod), and its connectionStatus names the roles without listing their privileges."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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
            "src_read": [_db("shop")],  # one database: its own change stream, not the deployment's
            "src_crm": [_db("crm")],  # read on another database than the one selected
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
            # read on shop follows shop's own stream, but two databases need the deployment's
            "src_read", "tgt_least", [SHOP, r"other\..*"],
            "source: user src_read may not open a change stream on the whole deployment: changeStream on every "
            "database (grant readAnyDatabase: read on a database is enough only for a selection of that "
            "database alone)",
            id="source-read-on-two-databases",
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
    include: str | list[str],
    expected: str,
) -> None:
    source, target = servers_clean
    src, tgt = source.user_uri(source_user), target.user_uri(target_user)
    out = Outputs(tmp_path)
    includes = [
        arg for pattern in ([include] if isinstance(include, str) else include) for arg in ("--include", pattern)
    ]
    result = out.run("sync", "-s", src, "-t", tgt, "-c", str(tmp_path / "cp.json"), *includes, "--no-progress")
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert errors == [f"mcdc: error: {errors[0].removeprefix('mcdc: error: ')}"], result.stderr
    assert expected in errors[0], errors[0]
    assert _user_databases(target) == []  # nothing written
    out.assert_no_credentials(src, tgt)


@pytest.mark.parametrize("side", ["source", "target"])
def test_a_uri_without_a_user_is_told_to_put_one_in_not_to_grant_a_role(
    servers_clean: tuple[SecureServer, SecureServer], tmp_path: Path, side: str
) -> None:
    """No user in the URI of a server that requires one: no role can help, the URI needs a user."""
    source, target = servers_clean
    src = source.uri if side == "source" else source.user_uri("src_whole")
    tgt = target.uri if side == "target" else target.user_uri("tgt_least")
    out = Outputs(tmp_path)
    for include in ([SHOP], [r"sh.p\..*"]):  # a database named literally (listCollections), or listDatabases
        args = [arg for pattern in include for arg in ("--include", pattern)]
        result = out.run("sync", "-s", src, "-t", tgt, "-c", str(tmp_path / "cp.json"), *args, "--no-progress")
        errors = [line for line in result.stderr.splitlines() if line.startswith("mcdc: error:")]
        assert result.returncode == 2 and len(errors) == 1 and "Traceback" not in result.stderr, result.stderr
        assert errors[0] == (
            f"mcdc: error: {side}: the server requires authentication: put a user in the URI "
            "(mongodb://USER:PASSWORD@HOST/...)"
        ), errors[0]
        assert _user_databases(target) == []
    out.assert_no_credentials(src, tgt)


def test_read_on_another_database_is_told_the_read_the_selection_needs(
    servers_clean: tuple[SecureServer, SecureServer], tmp_path: Path
) -> None:
    """read on crm, selecting shop: read on shop is enough (least-privilege.md's table), not readAnyDatabase."""
    source, target = servers_clean
    src, tgt = source.user_uri("src_crm"), target.user_uri("tgt_least")
    out = Outputs(tmp_path)
    for extra in ((), ("--snapshot-only",)):
        result = out.run("sync", "-s", src, "-t", tgt, "-c", str(tmp_path / "cp.json"), "--include", SHOP, *extra)
        errors = [line for line in result.stderr.splitlines() if line.startswith("mcdc: error:")]
        assert result.returncode == 2 and len(errors) == 1, result.stderr
        assert errors[0].startswith("mcdc: error: source: user src_crm may not "), errors[0]
        assert errors[0].endswith("on shop (grant read on shop, or readAnyDatabase)"), errors[0]
    assert _user_databases(target) == []
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
    """Spark's tasks connect with the same URIs, so the same roles do: sync and catch-up on --engine spark,
    with read on the one selected database (the driver reads that database's change stream)."""
    source, target = servers_clean
    src, tgt = source.user_uri("src_read"), target.user_uri("tgt_least")
    out = Outputs(tmp_path)
    spark = ["--engine", "spark", "--spark-master", "local[2]", "--spark-conf", "spark.ui.enabled=false",
             "--spark-conf", "spark.driver.host=127.0.0.1", *quick_jvm_conf()]  # fmt: skip
    common = ["-s", src, "-t", tgt, "-c", str(tmp_path / "cp.json"), "--include", SHOP, "--no-progress", *spark]
    result = out.run("sync", *common, timeout=300)
    assert result.returncode == 0, result.stderr
    with admin_client(source) as client:
        client.shop.orders.insert_many([{"_id": i, "n": i} for i in range(200, 250)])
    result = out.run("catch-up", *common, "--spark-start-after", "0", timeout=300)  # Spark's tasks write it
    assert result.returncode == 0, result.stderr
    assert _count(target, "shop", "orders") == 250
    out.assert_no_credentials(src, tgt)


def _checkpoint(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def _same(source: SecureServer, target: SecureServer) -> bool:
    with admin_client(source) as s, admin_client(target) as t:
        return list(s.shop.orders.find().sort("_id")) == list(t.shop.orders.find().sort("_id"))


def _tail(log: Path, *args: str) -> subprocess.Popen[bytes]:
    """A tail whose output goes to ``log`` (a file: a pipe nobody reads while it runs could fill and block it)."""
    with log.open("ab") as sink:
        return subprocess.Popen(_argv("tail", *args), stdout=sink, stderr=subprocess.STDOUT)


def _stop(tail: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    tail.send_signal(sig)
    tail.wait(timeout=60)


def test_read_on_the_one_selected_database_syncs_catches_up_tails_through_a_drop_and_cuts_over(
    servers_clean: tuple[SecureServer, SecureServer], tmp_path: Path
) -> None:
    """A source user with read on shop alone: mcdc follows shop's own change stream (db.watch), recorded in
    the checkpoint. Dropping the database in the middle of a tail invalidates that stream: the tail opens it
    again after the invalidate and replays what comes next."""
    source, target = servers_clean
    src, tgt = source.user_uri("src_read"), target.user_uri("tgt_least")
    out = Outputs(tmp_path)
    cp = tmp_path / "cp.json"
    common = ["-s", src, "-t", tgt, "-c", str(cp), "--include", SHOP, "--no-progress", "-v"]

    result = out.run("sync", *common)
    assert result.returncode == 0, result.stderr
    assert "following the change stream of database shop" in result.stderr
    assert _checkpoint(cp)["stream"] == {"scope": "database", "database": "shop"}
    assert _count(target, "shop", "orders") == 200

    with admin_client(source) as client:
        client.shop.orders.insert_many([{"_id": i, "n": i} for i in range(200, 300)])
        client.other.things.insert_one({"_id": 1})  # another database: neither read nor written
    result = out.run("catch-up", *common)
    assert result.returncode == 0, result.stderr
    assert _count(target, "shop", "orders") == 300

    log = tmp_path / "tail.log"
    tail = _tail(log, *common)
    try:
        with admin_client(source) as client:
            client.shop.orders.insert_many([{"_id": i, "n": i} for i in range(300, 350)])
            _wait(lambda: _count(target, "shop", "orders") == 350, "the tail to replay the inserts")
            client.drop_database("shop")
            _wait(lambda: "orders" not in _collections(target, "shop"), "the tail to replay the drop")
            client.shop.create_collection("orders")  # explicitly (tests/INFRA: the server's implicit create)
            client.shop.orders.insert_many([{"_id": i, "n": -i} for i in range(1000, 1040)])
            client.shop.orders.delete_one({"_id": 1000})
            client.shop.orders.update_one({"_id": 1001}, {"$set": {"n": 1}})
        _wait(lambda: _same(source, target) and _count(target, "shop", "orders") == 39, "the writes after the drop")
    finally:
        _stop(tail)
    assert tail.returncode == 0, log.read_text()
    assert "invalidated" in log.read_text()
    assert _checkpoint(cp)["stream"] == {"scope": "database", "database": "shop"}

    result = out.run("verify", "-s", src, "-t", tgt, "--include", SHOP)
    assert result.returncode == 0, result.stdout + result.stderr
    with admin_client(source) as client:
        client.shop.orders.insert_many([{"_id": i, "n": i} for i in range(2000, 2010)])
    result = out.run("cutover", *common, "--json")
    assert result.returncode == 0, result.stderr
    assert _same(source, target) and _count(target, "shop", "orders") == 49

    # the way back: the reverse checkpoint names no stream yet; its first run, whose source user (the old
    # target's) has readWrite on shop alone, follows shop's stream and records it
    reverse = Path(json.loads(result.stdout)["reverse_checkpoint"])
    assert _checkpoint(reverse)["stream"] is None
    with admin_client(target) as client:
        client.shop.orders.insert_one({"_id": "after cutover"})
    back = source.user_uri("admin")
    result = out.run("catch-up", "-s", tgt, "-t", back, "-c", str(reverse), "--include", SHOP, "--no-progress")
    assert result.returncode == 0, result.stderr
    assert _checkpoint(reverse)["stream"] == {"scope": "database", "database": "shop"}
    assert _same(source, target) and _count(source, "shop", "orders") == 50
    out.assert_no_credentials(src, tgt, back)


def test_a_tail_on_a_database_stream_killed_and_resumed_converges(
    servers_clean: tuple[SecureServer, SecureServer], tmp_path: Path
) -> None:
    """kill -9 a tail that follows shop's own stream just after a dropDatabase (its checkpoint before, at or
    after the invalidate), write on, and tail again: the target converges to the source. Then a drop while
    no mcdc runs: the catch-up resumes from before the invalidate, through it."""
    source, target = servers_clean
    src, tgt = source.user_uri("src_read"), target.user_uri("tgt_least")
    out = Outputs(tmp_path)
    cp = tmp_path / "cp.json"
    common = ["-s", src, "-t", tgt, "-c", str(cp), "--include", SHOP, "--no-progress", "-v"]
    assert out.run("sync", *common).returncode == 0

    log = tmp_path / "tail.log"
    tail = _tail(log, *common)
    try:
        with admin_client(source) as client:
            client.shop.orders.insert_many([{"_id": i, "n": i} for i in range(200, 260)])
            _wait(lambda: _count(target, "shop", "orders") == 260, "the tail to replay the inserts")
            client.drop_database("shop")
            client.shop.create_collection("orders")
            client.shop.orders.insert_many([{"_id": i, "n": i} for i in range(500, 520)])
            _wait(lambda: _count(target, "shop", "orders") > 0 and _count(target, "shop", "orders") < 260,
                  "the tail to replay the drop")  # fmt: skip
    finally:
        _stop(tail, signal.SIGKILL)
    with admin_client(source) as client:
        client.shop.orders.insert_many([{"_id": i, "n": i} for i in range(520, 540)])
        client.shop.orders.update_many({"_id": {"$lt": 510}}, {"$inc": {"n": 100}})

    tail = _tail(log, *common)
    try:
        _wait(lambda: _same(source, target) and _count(target, "shop", "orders") == 40, "the resumed tail")
    finally:
        _stop(tail)
    assert tail.returncode == 0, log.read_text()
    with admin_client(source) as client:  # dropped while no mcdc runs: the checkpoint is before the invalidate
        client.drop_database("shop")
        client.shop.create_collection("orders")
        client.shop.orders.insert_many([{"_id": i, "n": i} for i in range(900, 905)])
    result = out.run("catch-up", *common)
    assert result.returncode == 0, result.stderr
    assert "invalidated" in result.stderr
    assert _same(source, target) and _count(target, "shop", "orders") == 5
    result = out.run("verify", "-s", src, "-t", tgt, "--include", SHOP)
    assert result.returncode == 0, result.stdout + result.stderr
    out.assert_no_credentials(src, tgt)


def test_a_checkpoint_keeps_the_scope_of_its_stream(
    servers_clean: tuple[SecureServer, SecureServer], tmp_path: Path
) -> None:
    """A checkpoint's positions belong to one kind of stream. One of the deployment's stream resumed by a
    user with read on the database only, and one of a database's stream whose selection reaches beyond
    that database, are refused in one line (exit 2), before anything is written."""
    source, target = servers_clean
    tgt = target.user_uri("tgt_least")
    out = Outputs(tmp_path)
    whole, shop = tmp_path / "whole.json", tmp_path / "shop.json"
    assert out.run("sync", "-s", source.user_uri("src_least"), "-t", tgt, "-c", str(whole), "--include", SHOP,
                   "--no-progress").returncode == 0  # fmt: skip
    assert _checkpoint(whole)["stream"] == {"scope": "deployment"}
    result = out.run("catch-up", "-s", source.user_uri("src_read"), "-t", tgt, "-c", str(whole), "--include", SHOP,
                     "--no-progress")  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        "mcdc: error: source: user src_read may not open a change stream on the whole deployment: changeStream on "
        "every database (grant readAnyDatabase)"
    ], result.stderr

    whole.unlink()  # that migration is over: its target namespaces are free for the next
    with admin_client(target) as client:
        client.drop_database("shop")
    src = source.user_uri("src_read")
    assert out.run("sync", "-s", src, "-t", tgt, "-c", str(shop), "--include", SHOP, "--no-progress").returncode == 0
    with admin_client(source) as client:
        client.shop.orders.insert_one({"_id": "later"})
    # even a user who may read everything resumes the database's stream the checkpoint follows
    result = out.run("catch-up", "-s", source.user_uri("src_least"), "-t", tgt, "-c", str(shop), "--include", SHOP,
                     "--no-progress", "-v")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "following the change stream of database shop" in result.stderr
    assert _count(target, "shop", "orders") == 201
    result = out.run("catch-up", "-s", src, "-t", tgt, "-c", str(shop), "--include", SHOP, "--include",
                     r"other\..*", "--no-progress")  # fmt: skip
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"mcdc: error: checkpoint {shop} follows the change stream of database shop alone"), line
    out.assert_no_credentials(src, tgt)


def _collections(server: SecureServer, db: str) -> list[str]:
    with admin_client(server) as client:
        return client[db].list_collection_names()


def test_cutover_after_a_clean_verifier_pass_reads_the_database_stream_the_checkpoint_follows(
    servers_clean: tuple[SecureServer, SecureServer], tmp_path: Path
) -> None:
    """cutover compares only what changed since tail --verify's last clean pass: it reads those changes from
    the stream the checkpoint follows, here shop's own (the user may not open the deployment's)."""
    source, target = servers_clean
    src, tgt = source.user_uri("src_read"), target.user_uri("tgt_least")
    out = Outputs(tmp_path)
    cp, port, log = tmp_path / "cp.json", free_port(), tmp_path / "tail.log"
    common = ["-s", src, "-t", tgt, "-c", str(cp), "--include", SHOP, "--no-progress"]
    assert out.run("sync", *common).returncode == 0
    tail = _tail(log, *common, "--verify", "--verify-interval", "3600", "--metrics-port", str(port))
    try:
        _wait(lambda: (_progress(port).get("verification") or {}).get("cleanPasses", 0) >= 1, "a clean verifier pass")
        with admin_client(source) as client:  # after the pass began: not proven by it
            client.shop.orders.update_many({"_id": {"$lt": 5}}, {"$set": {"n": -1}})
        _wait(lambda: _same(source, target), "the updates replayed")
    finally:
        _stop(tail)
    assert tail.returncode == 0, log.read_text()
    result = out.run("cutover", *common, "--json")
    assert result.returncode == 0, result.stderr
    verified = json.loads(result.stdout)
    assert verified["verified"] == "changes since the verifier's last clean pass" and verified["documents"] == 5
    out.assert_no_credentials(src, tgt)


def _progress(port: int) -> Any:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/progress", timeout=10) as reply:
            return json.loads(reply.read())["progress"]
    except OSError:
        return {}
