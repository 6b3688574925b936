"""TLS against test servers started with ``--tls-cert-file``/``--tls-key-file``/``--tls-ca-file`` (a
self-signed CA made with openssl): sync and tail work, with a client certificate too; a certificate that fails
verification, one that does not name the host, a missing client certificate and a host name that does not
resolve are configuration errors (exit 2, one line saying what to fix), not outages; a port nobody listens on
stays an outage (exit 75)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pymongo
import pytest

from tests.support.secure import SecureServer
from tests.support.tls import Certificates, make_ca, make_server_cert

pytestmark = pytest.mark.integration


@pytest.fixture(scope="session")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Certificates]:
    """``good``: names 127.0.0.1 and localhost; ``misnamed``: names db.example only; ``other_ca``: a CA
    that signed neither."""
    directory = tmp_path_factory.mktemp("tls")
    ca = make_ca(directory)
    other = make_ca(directory, "other")
    client = make_server_cert(directory, ca, "DNS:mcdc-client", "client")
    combined = directory / "client-combined.pem"  # tlsCertificateKeyFile: the certificate, then its key
    combined.write_text(client.cert.read_text() + client.key.read_text())
    return {
        "good": make_server_cert(directory, ca, "IP:127.0.0.1,DNS:localhost"),
        "misnamed": make_server_cert(directory, ca, "DNS:db.example", "misnamed"),
        "other_ca": Certificates(other[0], other[0], other[1]),
        "client": Certificates(ca[0], combined, client.key),
    }


def _tls_server(directory: Path, certs: Certificates) -> SecureServer:
    server = SecureServer(directory, tls=certs)
    server.extra = server.tls_args()
    server.start()
    return server


@pytest.fixture(scope="module")
def tls_pair(
    tmp_path_factory: pytest.TempPathFactory, certificates: dict[str, Certificates]
) -> Iterator[tuple[SecureServer, SecureServer]]:
    base = tmp_path_factory.mktemp("tls-servers")
    source = _tls_server(base / "source", certificates["good"])
    try:
        target = _tls_server(base / "target", certificates["good"])
    except BaseException:
        source.stop()
        raise
    yield source, target
    source.stop()
    target.stop()


def _client(server: SecureServer) -> pymongo.MongoClient[dict[str, object]]:
    return pymongo.MongoClient(server.uri, serverSelectionTimeoutMS=10_000)


def _mcdc(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "replicator.cli", *args], capture_output=True, text=True, timeout=120)


def _one_line(result: subprocess.CompletedProcess[str], code: int) -> str:
    assert result.returncode == code, (result.returncode, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("mcdc: error: "), result.stderr
    return lines[0]


def test_sync_and_tail_over_tls(tls_pair: tuple[SecureServer, SecureServer], tmp_path: Path) -> None:
    source, target = tls_pair
    with _client(source) as s, _client(target) as t:
        for client in (s, t):
            client.drop_database("shop")
        s.shop.create_collection("orders")
        s.shop.orders.insert_many([{"_id": i} for i in range(100)])
        cp = tmp_path / "cp.json"
        common = ["-s", source.uri, "-t", target.uri, "-c", str(cp), "--include", r"shop\..*", "--no-progress"]
        result = _mcdc("sync", *common)
        assert result.returncode == 0, result.stderr
        assert t.shop.orders.count_documents({}) == 100

        tail = subprocess.Popen(
            [sys.executable, "-m", "replicator.cli", "tail", *common],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            s.shop.orders.insert_many([{"_id": i} for i in range(100, 150)])
            deadline = time.monotonic() + 60
            while t.shop.orders.count_documents({}) < 150 and time.monotonic() < deadline:
                time.sleep(0.2)
            assert t.shop.orders.count_documents({}) == 150
        finally:
            tail.send_signal(signal.SIGTERM)
            _, stderr = tail.communicate(timeout=60)
        assert tail.returncode == 0, stderr


def test_a_certificate_from_another_ca_is_a_configuration_error(
    tls_pair: tuple[SecureServer, SecureServer], certificates: dict[str, Certificates], tmp_path: Path
) -> None:
    source, target = tls_pair
    wrong = source.uri.replace(str(certificates["good"].ca), str(certificates["other_ca"].ca))
    result = _mcdc("sync", "-s", wrong, "-t", target.uri, "-c", str(tmp_path / "cp.json"), "--no-progress")
    line = _one_line(result, 2)
    assert "source" in line and "failed verification" in line and "fix tlsCAFile" in line, line


def test_a_certificate_that_does_not_name_the_host_is_a_configuration_error(
    tls_pair: tuple[SecureServer, SecureServer], certificates: dict[str, Certificates], tmp_path: Path
) -> None:
    source, _ = tls_pair
    with _client(source) as s:  # a source with a collection: no "holds no collection" warning before the error
        s.shop.orders.replace_one({"_id": "tls"}, {"_id": "tls"}, upsert=True)
    misnamed = _tls_server(tmp_path / "misnamed", certificates["misnamed"])
    try:
        result = _mcdc("sync", "-s", source.uri, "-t", misnamed.uri, "-c", str(tmp_path / "cp.json"), "--no-progress")
    finally:
        misnamed.stop()
    line = _one_line(result, 2)
    assert "target" in line, line
    assert "does not name 127.0.0.1: use a certificate whose names include 127.0.0.1" in line, line


def test_a_host_that_does_not_resolve_is_a_configuration_error(
    tls_pair: tuple[SecureServer, SecureServer], tmp_path: Path
) -> None:
    _, target = tls_pair
    result = _mcdc(
        "tail", "-s", "mongodb://no-such-host.invalid:27017/?directConnection=true", "-t", target.uri,
        "-c", str(tmp_path / "cp.json"), "--no-progress",
    )  # fmt: skip
    line = _one_line(result, 2)
    assert "cannot resolve host no-such-host.invalid: fix the URI" in line, line


def test_a_port_nobody_listens_on_stays_an_outage(tls_pair: tuple[SecureServer, SecureServer], tmp_path: Path) -> None:
    _, target = tls_pair
    result = _mcdc(
        "sync", "-s", "mongodb://127.0.0.1:1/?directConnection=true", "-t", target.uri,
        "-c", str(tmp_path / "cp.json"), "--no-progress", "--connect-timeout", "1",
    )  # fmt: skip
    line = _one_line(result, 75)
    assert "unreachable" in line, line


def test_a_server_that_requires_a_client_certificate(
    tls_pair: tuple[SecureServer, SecureServer], certificates: dict[str, Certificates], tmp_path: Path
) -> None:
    """Without tlsCertificateKeyFile: exit 2, saying to set it; with the client's certificate: the sync works."""
    _, target = tls_pair
    pem = certificates["client"].cert
    source = SecureServer(tmp_path / "source", tls=certificates["good"], client_pem=pem)
    source.extra = [*source.tls_args(), "--tls-require-client-cert"]
    source.start()
    try:
        with pymongo.MongoClient(f"{source.uri}&tlsCertificateKeyFile={pem}") as s, _client(target) as t:
            t.drop_database("certs")
            s.certs.create_collection("c")
            s.certs.c.insert_many([{"_id": i} for i in range(10)])
            args = ["-t", target.uri, "-c", str(tmp_path / "cp.json"), "--include", r"certs\..*", "--no-progress"]
            line = _one_line(_mcdc("sync", "-s", source.uri, *args), 2)
            assert "requires a client certificate: set tlsCertificateKeyFile" in line, line
            result = _mcdc("sync", "-s", f"{source.uri}&tlsCertificateKeyFile={pem}", *args)
            assert result.returncode == 0, result.stderr
            assert t.certs.c.count_documents({}) == 10
    finally:
        source.stop()
