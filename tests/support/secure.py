"""Test servers with authentication (``--auth``, SCRAM-SHA-256) or TLS: users made on a first start without
``--auth``, then the server restarted with it over the same storage directory."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote_plus

import pymongo

from tests.support.servers import LocalServer, connect
from tests.support.tls import Certificates

#: Every test user's password: a test asserts it appears in no output.
PASSWORD = "s3cret-Pa55word"
ADMIN = "admin"


class SecureServer(LocalServer):
    """A LocalServer started with extra options (``--auth``, the ``--tls-*`` files); its readiness probe
    speaks TLS when the server does."""

    def __init__(self, storage_dir: Path, *, tls: Certificates | None = None, client_pem: Path | None = None) -> None:
        super().__init__(storage_dir)
        self.tls = tls
        self.client_pem = client_pem  # the client certificate and key its readiness probe shows, if any
        self.extra: list[str] = []

    def argv(self) -> list[str]:
        return [*super().argv(), *self.extra]

    @property
    def uri(self) -> str:
        if self.tls is None or "--tls-cert-file" not in self.extra:
            return super().uri
        return f"mongodb://{self.host}:{self.port}/?directConnection=true&tls=true&tlsCAFile={self.tls.ca}"

    def probe(self) -> None:
        """Ready once it answers ping (over TLS, whatever names its certificate holds)."""
        uri = self.uri + ("&tlsAllowInvalidHostnames=true" if "tls=true" in self.uri else "")
        uri += f"&tlsCertificateKeyFile={self.client_pem}" if self.client_pem else ""
        with connect(uri, timeout_ms=500) as client:
            client.admin.command("ping")

    def tls_args(self) -> list[str]:
        assert self.tls is not None
        return ["--tls-cert-file", str(self.tls.cert), "--tls-key-file", str(self.tls.key),
                "--tls-ca-file", str(self.tls.ca)]  # fmt: skip

    def user_uri(self, user: str, password: str = PASSWORD) -> str:
        """This server's URI with ``user``'s credentials."""
        rest = self.uri.split("://", 1)[1]
        return f"mongodb://{quote_plus(user)}:{quote_plus(password)}@{rest}&authSource=admin"


def start_with_users(
    storage_dir: Path, users: dict[str, Sequence[Any]], roles: dict[str, list[dict[str, Any]]] | None = None
) -> SecureServer:
    """A server whose ``users`` (name -> roles, as createUser takes them; ``admin`` is root) and custom
    ``roles`` (name -> privileges, in admin) exist, running with ``--auth``."""
    server = SecureServer(storage_dir)
    server.start()
    try:
        with connect(server.uri) as client:
            for name, privileges in (roles or {}).items():
                client.admin.command("createRole", name, privileges=privileges, roles=[])
            for name, roles in {ADMIN: ["root"], **users}.items():
                client.admin.command("createUser", name, pwd=PASSWORD, roles=list(roles))
    finally:
        server.stop()
    server.extra = ["--auth"]
    server.start()
    return server


def admin_client(server: SecureServer) -> pymongo.MongoClient[dict[str, Any]]:
    return pymongo.MongoClient(server.user_uri(ADMIN), serverSelectionTimeoutMS=10_000)
