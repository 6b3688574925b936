"""Connection strings: validation and credential redaction.

Every URI that reaches a log line, an error, the progress display or a summary goes through
:func:`redact` first.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

from .errors import ConfigError

_MONGO_SCHEMES = ("mongodb://", "mongodb+srv://")
# user[:password]@ right after the scheme
_USERINFO = re.compile(r"^(?P<scheme>[a-zA-Z][a-zA-Z0-9+.\-]*://)(?P<userinfo>[^@/?#]*)@")
# secrets that may also travel as query options
_SECRET_OPTS = re.compile(
    r"(?i)((?:password|secret|token|sasl\.password|tlsCertificateKeyFilePassword|authMechanismProperties)"
    r"=)[^&]*"
)


def redact(text: str) -> str:
    """Replace credentials in every URI inside ``text`` with ``***``."""

    def _one(match: re.Match[str]) -> str:
        uri = match.group(0)
        uri = _USERINFO.sub(lambda m: f"{m.group('scheme')}***@", uri)
        return _SECRET_OPTS.sub(r"\1***", uri)

    return re.sub(r"[a-zA-Z][a-zA-Z0-9+.\-]*://\S+", _one, text)


def is_mongo_uri(uri: str) -> bool:
    return uri.startswith(_MONGO_SCHEMES)


def check_mongo_uri(uri: str, role: str) -> str:
    """Validate a MongoDB URI's shape (not reachability) and return it unchanged."""
    if not is_mongo_uri(uri):
        raise ConfigError(f"{role} must be a mongodb:// or mongodb+srv:// URI, got {redact(uri)!r}")
    try:
        from pymongo.uri_parser import parse_uri

        parse_uri(uri, validate=True, warn=False, connect_timeout=None)
    except Exception as exc:  # pymongo raises several types (InvalidURI, ConfigurationError, ValueError)
        raise ConfigError(f"{role} URI {redact(uri)!r} is malformed: {redact(str(exc))}") from None
    return uri


def host_set(uri: str) -> frozenset[str]:
    """The hosts a URI names, lower-cased with default ports, for a cheap same-server check."""
    body = uri.split("://", 1)[1]
    body = body.split("/", 1)[0].split("?", 1)[0]
    if "@" in body:
        body = body.rsplit("@", 1)[1]
    hosts = set()
    for host in body.split(","):
        host = unquote(host).lower()
        if host and ":" not in host.rsplit("]", 1)[-1]:
            host += ":27017"
        hosts.add(host.replace("localhost", "127.0.0.1"))
    return frozenset(hosts)


def kafka_bootstrap(uri: str) -> list[str]:
    """``kafka://HOST:PORT[,HOST:PORT...]`` -> the bootstrap servers, checked for shape."""
    scheme, sep, rest = uri.partition("://")
    if scheme.lower() != "kafka" or not sep:
        raise ConfigError(f"Kafka target {redact(uri)!r} must look like kafka://HOST:PORT[,HOST:PORT...]")
    hosts = rest.split("/", 1)[0].split("?", 1)[0]
    if "@" in hosts:
        raise ConfigError("Kafka credentials go in --kafka-opt sasl.username=... / sasl.password=..., not the URI")
    out = []
    for host in hosts.split(","):
        name, colon, port = host.rpartition(":")
        if not colon or not name or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"Kafka target {redact(uri)!r}: {host!r} is not HOST:PORT")
        out.append(host)
    return out
