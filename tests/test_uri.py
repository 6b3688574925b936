"""Connection strings are read by pymongo's own parser: hosts (IPv6, sockets), credentials (percent-encoded or
not), option names in any case, mongodb+srv without a DNS lookup; and redaction never shows a password."""

from __future__ import annotations

import time

import pytest

from replicator.errors import ConfigError
from replicator.settings.uri import check_mongo_uri, host_set, is_mongo_uri, kafka_bootstrap, parse_mongo_uri, redact

# --- host_set ---


def test_host_set_reads_ipv6_literals_with_and_without_port() -> None:
    assert host_set("mongodb://[::1]:27018") == {"[::1]:27018"}
    assert host_set("mongodb://[::1]") == {"[::1]:27017"}
    assert host_set("mongodb://u:p@[2001:DB8::1]:27019,[::1]/?replicaSet=rs0") == {
        "[2001:db8::1]:27019",
        "[::1]:27017",
    }


def test_host_set_is_unmoved_by_credentials_that_hold_reserved_characters() -> None:
    # '@', ':' and '/' in a password, percent-encoded as RFC 3986 asks
    uri = "mongodb://us%3Aer:p%40ss%3Aw%2Ford@Host1.Example,host2.example:27018/admin?replicaSet=rs0"
    assert host_set(uri) == {"host1.example:27017", "host2.example:27018"}


def test_host_set_keeps_its_former_shape() -> None:
    # the default checkpoint path is derived from it: a URI that worked before must give the same set
    assert host_set("mongodb://localhost") == {"127.0.0.1:27017"}
    assert host_set("mongodb://LOCALHOST:27017,127.0.0.1:27017/?directConnection=false") == {"127.0.0.1:27017"}
    assert host_set("mongodb://h?replicaSet=rs0") == {"h:27017"}
    assert host_set("mongodb://%2Ftmp%2Fmongodb-27017.sock") == {"/tmp/mongodb-27017.sock:27017"}


def test_host_set_of_an_srv_uri_is_its_host_name_unresolved() -> None:
    started = time.monotonic()
    assert host_set("mongodb+srv://u:p@Cluster0.does-not-exist.invalid/db?retryWrites=true") == {
        "cluster0.does-not-exist.invalid:27017"
    }
    assert time.monotonic() - started < 1  # no DNS lookup


def test_host_set_refuses_a_uri_pymongo_refuses() -> None:
    with pytest.raises(ConfigError, match="malformed") as info:
        host_set("mongodb://u:se/cret@h:27017")
    assert "se/cret" not in str(info.value) and "cret" not in str(info.value)


# --- parse_mongo_uri / check_mongo_uri ---


def test_option_names_are_read_in_any_case() -> None:
    for uri in ("mongodb://h/?replicaSet=rs0", "mongodb://h/?replicaset=rs0", "mongodb://h/?REPLICASET=rs0"):
        parsed = parse_mongo_uri(uri)
        assert parsed.option("replicaSet") == "rs0" and parsed.option("replicaset") == "rs0"
    assert parse_mongo_uri("mongodb://h/?directconnection=true").option("directConnection") is True
    assert parse_mongo_uri("mongodb://h").option("replicaSet") is None


def test_parse_gives_credentials_database_and_hosts_decoded() -> None:
    parsed = parse_mongo_uri("mongodb://us%40er:p%40ss%2F%3A@[::1]:27018,h2/my_db?authSource=admin")
    assert parsed.username == "us@er"
    assert parsed.database == "my_db"
    assert parsed.hosts == (("::1", 27018), ("h2", 27017))
    assert not parsed.srv and parsed.option("authsource") == "admin"
    assert "p@ss" not in repr(parsed)  # the password is not kept


def test_check_accepts_srv_without_resolving_it() -> None:
    started = time.monotonic()
    uri = "mongodb+srv://u:p@cluster0.does-not-exist.invalid/?srvMaxHosts=2&readPreference=secondary"
    assert check_mongo_uri(uri, "--source") == uri
    assert time.monotonic() - started < 1
    parsed = parse_mongo_uri(uri)
    assert parsed.srv and parsed.hosts == (("cluster0.does-not-exist.invalid", None),)
    assert parsed.option("srvmaxhosts") == 2


@pytest.mark.parametrize(
    ("uri", "why"),
    [
        ("mongodb+srv://a.example,b.example/", "one"),
        ("mongodb+srv://a.example:27017/", "port"),
        ("mongodb+srv://a.example/?directConnection=true", "directConnection"),
        ("mongodb+srv://a.example/?replicaSet=rs0&readPreference=nope", "nope"),
        ("mongodb://h:port/", "port 'port' is not a number"),
        ("mongodb://h/?replicaSet=rs0&directConnection=true&authSource=", "authSource"),
        ("mongodb://u:p@ss@h/", "escaped"),
    ],
)
def test_check_refuses_what_pymongo_refuses(uri: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why) as info:
        check_mongo_uri(uri, "--source")
    message = str(info.value)
    assert message.startswith("--source URI mongodb") and "'" not in message.split(" is malformed")[0]


def test_is_mongo_uri() -> None:
    assert is_mongo_uri("mongodb://h") and is_mongo_uri("mongodb+srv://h")
    assert not is_mongo_uri("kafka://h:9092") and not is_mongo_uri("jsonl:/tmp/x") and not is_mongo_uri("h:27017")


# --- redact ---


@pytest.mark.parametrize(
    "uri",
    [
        "mongodb://admin:s3cr%40t@h1:27017,h2/?authSource=admin",  # '@' percent-encoded
        "mongodb://admin:s3cr%3At@h1:27017,h2/?authSource=admin",  # ':'
        "mongodb://admin:s3cr%2Ft@h1:27017,h2/?authSource=admin",  # '/'
        "mongodb://admin:s3cr@t@h1:27017,h2/?authSource=admin",  # '@' as typed: pymongo refuses it, still hidden
        "mongodb://admin:s3cr/t@h1:27017,h2/?authSource=admin",  # '/' as typed
        "mongodb://admin:s3cr?t@h1:27017,h2/?authSource=admin",  # '?' as typed
        "mongodb+srv://admin:s3cr%40t@h1/?authSource=admin",
    ],
)
def test_redact_hides_passwords_with_reserved_characters(uri: str) -> None:
    out = redact(f"cannot connect to {uri} now")
    assert "s3cr" not in out and "admin:" not in out
    assert out.startswith("cannot connect to mongodb") and out.endswith(" now")
    assert "***@h1" in out


def test_redact_keeps_the_hosts_and_options_of_a_well_formed_uri() -> None:
    text = "mongodb://u:p%40w@[::1]:27017,h2/db?appName=me@example&replicaSet=rs0"
    assert redact(text) == "mongodb://***@[::1]:27017,h2/db?appName=me@example&replicaSet=rs0"
    assert redact("mongodb://h1,h2/?replicaSet=rs0") == "mongodb://h1,h2/?replicaSet=rs0"


@pytest.mark.parametrize(
    ("option", "secret"),
    [
        ("authMechanismProperties=AWS_SESSION_TOKEN:FwoGZXIvYXdzEJr%2F", "FwoGZXIvYXdzEJr"),
        ("authmechanismproperties=AWS_SESSION_TOKEN:FwoGZXIvYXdzEJr", "FwoGZXIvYXdzEJr"),
        ("tlsCertificateKeyFilePassword=k3yp4ss", "k3yp4ss"),
        ("TLSCERTIFICATEKEYFILEPASSWORD=k3yp4ss", "k3yp4ss"),
        ("sslPEMKeyPassword=k3yp4ss", "k3yp4ss"),
    ],
)
def test_redact_hides_values_of_secret_options(option: str, secret: str) -> None:
    for uri in (
        f"mongodb://u:pw@h/?authMechanism=MONGODB-AWS&{option}&tls=true",
        f"mongodb+srv://h.example/?{option}",
    ):
        out = redact(f"error: {uri}")
        assert secret not in out and "pw" not in out
        assert "h" in out and ("tls=true" in out or "srv" in out)


def test_redact_other_schemes_and_plain_text() -> None:
    assert redact("kafka://u:p@b:9092,c:9092") == "kafka://***@b:9092,c:9092"
    assert redact("no uri here: user:pass@host") == "no uri here: user:pass@host"
    assert redact("see https://example.com/a@b") == "see https://example.com/a@b"


# --- kafka_bootstrap ---


def test_kafka_bootstrap_errors_say_what_is_wrong_without_reprs() -> None:
    assert kafka_bootstrap("kafka://a:9092,[::1]:9093") == ["a:9092", "[::1]:9093"]
    for uri, expected in (
        ("kafka://a", "kafka://a: a is not HOST:PORT"),
        ("kafka://a:99999", "kafka://a:99999: a:99999 is not HOST:PORT"),
        ("http://a:9092", "must look like kafka://HOST:PORT"),
    ):
        with pytest.raises(ConfigError) as info:
            kafka_bootstrap(uri)
        assert expected in str(info.value) and "'" not in str(info.value)


def test_timeouts_the_uri_sets_win_over_connect_timeout() -> None:
    from replicator.source.connection import client_options

    mine = client_options(10, "mcdc", "mongodb://h/?serverSelectionTimeoutMS=300")
    assert "serverSelectionTimeoutMS" not in mine and mine["connectTimeoutMS"] == 10_000
    assert client_options(2.5, "mcdc", "mongodb://h/")["serverSelectionTimeoutMS"] == 2500


def test_a_port_that_is_not_a_number_is_said_so_without_pymongos_hint_about_user_names() -> None:
    with pytest.raises(ConfigError) as info:
        check_mongo_uri("mongodb://db1:27017,db2:abc/?replicaSet=rs0", "--source")
    assert "port 'abc' is not a number" in str(info.value) and "quote_plus" not in str(info.value)
    with pytest.raises(ConfigError, match="escaped"):  # a user name with a ':' or '@' to escape: the hint helps
        check_mongo_uri("mongodb://u:p@ss@h:1/", "--source")
