"""The pure side of the privilege check: what a run needs, what a connectionStatus reply grants, what is
missing and the role that grants it; the databases a selection names; the connection errors no retry mends."""

from __future__ import annotations

from typing import Any

import pytest
from pymongo.errors import OperationFailure

from replicator.errors import SinkError
from replicator.settings.selection import Renamer, Selection, target_databases
from replicator.source import connection
from replicator.source.connection import configuration_problem, explain_refusal
from replicator.source.privileges import (
    advice,
    command_refusal,
    grants_of,
    missing,
    refusal,
    source_needs,
    stream_database,
    target_needs,
)


def _status(roles: list[tuple[str, str]], privileges: list[dict[str, Any]] | None = None, user: str = "app") -> Any:
    return {
        "authInfo": {
            "authenticatedUsers": [{"user": user, "db": "admin"}] if user else [],
            "authenticatedUserRoles": [{"role": r, "db": d} for r, d in roles],
            "authenticatedUserPrivileges": privileges or [],
        }
    }


def test_a_server_without_authentication_is_not_checked() -> None:
    assert grants_of(_status([], user="")) is None


def test_root_may_do_everything() -> None:
    grants = grants_of(_status([("root", "admin")]))
    assert grants is not None and not missing(source_needs(None, stream=True) + target_needs(["a"]), grants)


def test_read_any_database_opens_the_deployment_stream_and_reads_every_database_but_local_and_config() -> None:
    grants = grants_of(_status([("readAnyDatabase", "admin")]))
    assert grants is not None
    assert missing(source_needs(["shop", "crm"], stream=True), grants) == []
    assert grants.allows("listDatabases", None)  # as on mongod
    assert not grants.allows("find", "local")
    assert [n.action for n in missing(target_needs(["shop"]), grants)] == [
        "insert", "update", "remove", "createCollection", "createIndex", "dropCollection",
    ]  # fmt: skip


def test_read_on_one_database_is_refused_the_deployment_stream_with_the_role_to_grant() -> None:
    grants = grants_of(_status([("read", "shop")]))
    assert grants is not None
    lacking = missing(source_needs(["shop"], stream=True), grants)
    assert [n.action for n in lacking] == ["changeStream", "find"]
    assert refusal("source", grants.user, lacking[0]) == (
        "source: user app may not open a change stream on the whole deployment: changeStream on every database "
        "(grant readAnyDatabase)"
    )
    assert missing(source_needs(["shop"], stream=False), grants) == []  # --snapshot-only
    lacking = missing(source_needs(["crm"], stream=False), grants)
    assert (
        refusal("source", "app", lacking[0])
        == "source: user app may not run find on crm (grant read on crm, or readAnyDatabase)"
    )


def test_read_on_the_one_selected_database_follows_that_database_s_stream() -> None:
    """The deployment's stream whenever the user may open it; a database's only for a user who may read
    just the one database the selection names; none for several (refused, naming readAnyDatabase)."""
    read_shop = grants_of(_status([("read", "shop")]))
    read_two = grants_of(_status([("read", "shop"), ("read", "crm")]))
    any_db = grants_of(_status([("readAnyDatabase", "admin")]))
    assert read_shop is not None and read_two is not None and any_db is not None
    assert stream_database(read_shop, ("shop",)) == "shop"
    assert stream_database(any_db, ("shop",)) is None  # the deployment's stream stays the default
    assert stream_database(None, ("shop",)) is None  # no authentication, or a user that cannot be judged
    assert stream_database(read_shop, ("crm",)) is None  # not readable: refused below
    assert stream_database(read_shop, None) is None
    assert stream_database(read_two, ("crm", "shop")) is None
    assert missing(source_needs(("shop",), stream=True, stream_db="shop"), read_shop) == []
    lacking = missing(source_needs(("crm",), stream=True, stream_db="crm"), read_shop)
    assert refusal("source", "app", lacking[0]) == (
        "source: user app may not open a change stream on crm: changeStream on crm (grant read on crm, or "
        "readAnyDatabase)"
    )
    lacking = missing(source_needs(("crm", "shop"), stream=True), read_two)
    assert refusal("source", "app", lacking[0]) == (
        "source: user app may not open a change stream on the whole deployment: changeStream on every database "
        "(grant readAnyDatabase: read on a database is enough only for a selection of that database alone)"
    )


def test_read_write_on_the_target_database_and_nothing_else() -> None:
    grants = grants_of(_status([("readWrite", "shop")]))
    assert grants is not None
    assert missing(target_needs(["shop"]), grants) == []
    lacking = missing(target_needs(["shop", "crm"]), grants)
    assert {n.db for n in lacking} == {"crm"}
    assert refusal("target", "app", lacking[0]) == (
        "target: user app may not run insert on crm (grant readWrite on crm, or readWriteAnyDatabase)"
    )


def test_listed_privileges_win_over_the_role_table() -> None:
    """mongod lists the privileges: a custom role is judged by them."""
    listed = [
        {"resource": {"db": "", "collection": ""}, "actions": ["find", "changeStream"]},
        {"resource": {"db": "shop", "collection": ""}, "actions": ["listCollections", "listIndexes"]},
        {"resource": {"cluster": True}, "actions": ["listDatabases"]},
    ]
    grants = grants_of(_status([("mcdcSource", "admin")], listed))
    assert grants is not None
    assert missing(source_needs(["shop"], stream=True), grants) == []
    assert [n.action for n in missing(source_needs(["crm"], stream=True), grants)] == ["listCollections", "listIndexes"]


def test_any_resource_covers_the_cluster_and_every_database() -> None:
    grants = grants_of(_status([("x", "admin")], [{"resource": {"anyResource": True}, "actions": ["find"]}]))
    assert grants is not None and grants.allows("find", "local") and grants.allows("find", None)
    assert not grants.allows("insert", "shop")


def test_a_custom_role_the_server_does_not_expand_cannot_be_judged() -> None:
    assert grants_of(_status([("read", "shop"), ("mcdcSource", "admin")])) is None


def test_a_collection_privilege_covers_only_its_collection() -> None:
    grants = grants_of(
        _status([("c", "admin")], [{"resource": {"db": "shop", "collection": "orders"}, "actions": ["find"]}])
    )
    assert grants is not None
    assert grants.allows("find", "shop", "orders") and not grants.allows("find", "shop", "users")
    assert not grants.allows("find", "shop")  # the whole database


@pytest.mark.parametrize(
    ("side", "command", "db", "expected"),
    [
        ("source", "listDatabases", "admin", "run listDatabases on the cluster (grant clusterMonitor)"),
        ("source", "aggregate", "admin", "open a change stream on the whole deployment: changeStream on every "
         "database (grant readAnyDatabase)"),
        ("source", "find", "shop", "run find on shop (grant read on shop, or readAnyDatabase)"),
        ("target", "insert", "shop", "run insert on shop (grant readWrite on shop, or readWriteAnyDatabase)"),
        ("target", "collMod", "shop", "run collMod on shop (grant dbAdmin on shop)"),
        ("source", "setUserWriteBlockMode", "admin", "run setUserWriteBlockMode on the cluster (grant backup)"),
    ],
)  # fmt: skip
def test_a_refusal_at_run_time_names_the_side_and_the_role(side: str, command: str, db: str, expected: str) -> None:
    assert command_refusal(side, command, db) == f"{side}: the user may not {expected}"
    assert advice(side, command, db) in expected


def test_explain_refusal_follows_the_cause_and_names_the_side_that_sent_the_command() -> None:
    said = "not authorized on shop to execute command (action: insert)"
    connection._REFUSED.append(("target", "insert", "shop", said, False))
    connection._REFUSED.append(("source", "find", "local", "not authorized on local to execute command", False))
    refused = OperationFailure(said, 13, {"ok": 0, "errmsg": said, "code": 13})
    try:
        try:
            raise refused
        except OperationFailure as exc:
            raise SinkError("shop.orders: the write was refused") from exc
    except SinkError as wrapped:
        assert explain_refusal(wrapped) == command_refusal("target", "insert", "shop")
    assert explain_refusal(OperationFailure("duplicate key", 11000)) is None
    unseen = OperationFailure("x", 13, {"errmsg": "not authorized on crm", "code": 13})
    assert explain_refusal(unseen) is None  # no client saw it: its side is unknown
    # a client that gave no credentials: no role helps, the URI needs a user
    anonymous = "command listDatabases requires authentication"
    connection._REFUSED.append(("source", "listDatabases", "admin", anonymous, True))
    told = explain_refusal(OperationFailure(anonymous, 13, {"errmsg": anonymous, "code": 13}))
    assert (
        told == "source: the server requires authentication: put a user in the URI (mongodb://USER:PASSWORD@HOST/...)"
    )


@pytest.mark.parametrize(
    ("uri", "credentials"),
    [
        ("mongodb://127.0.0.1:27017/?directConnection=true", False),
        ("mongodb://app:pw@h1,h2/?replicaSet=rs0", True),
        ("mongodb+srv://app@cluster.example.net/", True),
        ("mongodb://h/?authMechanism=MONGODB-X509&tls=true", True),
        ("mongodb://h/?appName=a@b", False),
    ],
)
def test_a_uri_gives_credentials_by_a_user_or_an_auth_mechanism(uri: str, credentials: bool) -> None:
    assert connection.has_credentials(uri) is credentials


@pytest.mark.parametrize(
    ("include", "databases"),
    [
        ([r"shop\.orders"], ("shop",)),
        ([r"shop\..*", r"crm\.users"], ("crm", "shop")),
        ([r"my\-db\..*"], ("my-db",)),
        ([r".*\.orders"], None),
        ([r"(shop|crm)\..*"], None),
        ([r"shop\.orders|crm\.users"], None),
        ([r"sh.p\..*"], None),
        ([], None),
        ([r"admin\..*"], ()),
    ],
)
def test_the_databases_a_selection_names_literally(include: list[str], databases: tuple[str, ...] | None) -> None:
    assert Selection.from_patterns(include).databases() == databases


def test_the_target_databases_of_a_literal_selection_follow_the_renames() -> None:
    renamer = Renamer.from_rules(["shop=shop_copy", "crm.users=people.users"])
    mapped = target_databases(Selection.from_patterns([r"shop\..*", r"crm\.users"]), renamer)
    assert mapped.databases() == ("crm", "people", "shop_copy")
    assert target_databases(Selection.from_patterns([r".*\.x"]), renamer).databases() is None


@pytest.mark.parametrize(
    ("error", "fragment"),
    [
        ("h:1: [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed certificate in certificate "
         "chain (_ssl.c:1006)", "failed verification (self-signed certificate in certificate chain): fix tlsCAFile"),
        ("h:1: [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: IP address mismatch, certificate is not "
         "valid for 'h'. (_ssl.c:1006)", "does not name h: use a certificate whose names include h"),
        ("h:1: [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: Hostname mismatch, certificate is not "
         "valid for 'h'.", "does not name h"),
        ("h:1: [Errno -2] Name or service not known", "cannot resolve host h: fix the URI"),
        ("h:1: [Errno 8] nodename nor servname provided, or not known", "cannot resolve host h"),
        ("h:1: [SSL: TLSV13_ALERT_CERTIFICATE_REQUIRED] tlsv13 alert certificate required", "tlsCertificateKeyFile"),
        # issue 41: b"HTTP" read as a message length, and b"<!DO" (an HTML page with no status line)
        ("Message length (1347703880) is larger than server max message size (48000000)",
         "answers with something other than MongoDB (its reply begins 'HTTP': an HTTP server?)"),
        ("Message length (1329865020) is larger than server max message size (48000000)", "begins '<!DO'"),
        ("Message length (4294967295) is larger than server max message size (48000000)",
         "answers with something other than MongoDB"),
    ],
)  # fmt: skip
def test_connection_errors_no_retry_mends(error: str, fragment: str) -> None:
    problem = configuration_problem(error, "h")
    assert problem is not None and fragment in problem


@pytest.mark.parametrize(
    "error",
    [
        "h:1: [Errno 111] Connect call failed ('h', 1)",
        "h:1: [Errno -3] Temporary failure in name resolution",
        "h:1: timed out",
        "h:1: connection closed",
    ],
)
def test_outages_are_not_configuration(error: str) -> None:
    assert configuration_problem(error, "h") is None
