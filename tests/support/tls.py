"""Certificates for TLS tests, made with ``openssl``: a self-signed CA and server certificates it signs."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Certificates:
    """A CA, and a server certificate and key signed by it (``cert`` and ``key`` files)."""

    ca: Path
    cert: Path
    key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_ca(directory: Path, name: str = "ca") -> tuple[Path, Path]:
    """A self-signed CA: its certificate and key."""
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN=mcdc test {name}",
        "-keyout", str(key), "-out", str(cert), cwd=directory,
    )  # fmt: skip
    return cert, key


def make_server_cert(directory: Path, ca: tuple[Path, Path], names: str, name: str = "server") -> Certificates:
    """A server certificate signed by ``ca`` for ``names`` (a subjectAltName: "IP:127.0.0.1,DNS:localhost")."""
    ca_cert, ca_key = ca
    key, csr, cert = directory / f"{name}.key", directory / f"{name}.csr", directory / f"{name}.pem"
    ext = directory / f"{name}.ext"
    ext.write_text(f"subjectAltName={names}\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN=mcdc {name}", "-keyout", str(key),
             "-out", str(csr), cwd=directory)  # fmt: skip
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(ca_cert), "-CAkey", str(ca_key), "-CAcreateserial",
        "-days", "2", "-extfile", str(ext), "-out", str(cert), cwd=directory,
    )  # fmt: skip
    return Certificates(ca_cert, cert, key)
