"""Connection strings: parsing, validation and credential redaction.

MongoDB URIs are read by pymongo's own parser (:mod:`pymongo.uri_parser`), so mcdc sees a URI exactly as
the driver that connects with it does: IPv6 literals, percent-encoded credentials, option names in any
case. A ``mongodb+srv://`` URI is parsed without its DNS lookups: its one host name stands for the
deployment (the driver resolves it when it connects).

Every URI that reaches a log line, an error, the progress display or a summary goes through
:func:`redact` first.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any, NamedTuple

from pymongo.errors import PyMongoError
from pymongo.uri_parser import parse_uri, parse_userinfo, split_hosts, split_options

from replicator.errors import ConfigError, quoted

_SCHEME, _SRV_SCHEME = "mongodb://", "mongodb+srv://"
_DEFAULT_PORT = 27017
_REFUSED = (PyMongoError, ValueError, TypeError)  # InvalidURI, ConfigurationError; ValueError from a bad port
_ANY_URI = re.compile(r"[a-zA-Z][a-zA-Z0-9+.\-]*://\S+")
# secrets that may also travel as query options
_SECRET_OPTS = re.compile(
    r"(?i)((?:password|secret|token|sasl\.password|tlsCertificateKeyFilePassword|authMechanismProperties)"
    r"=)[^&;]*"
)


class MongoUri(NamedTuple):
    """A MongoDB connection string as pymongo reads it; the password is not kept."""

    #: (host, port): host lower-cased, an IPv6 literal without its brackets, a socket path decoded; port
    #: None for the host name of a ``mongodb+srv://`` URI
    hosts: tuple[tuple[str, int | None], ...]
    username: str | None
    database: str | None
    #: pymongo's parsed option values, keyed by lower-cased name: use :meth:`option`
    options: Mapping[str, Any]
    srv: bool

    def option(self, name: str) -> Any:
        """An option's value by its name in any case (``replicaSet``, ``replicaset``), or None."""
        return self.options.get(name.lower())


def is_mongo_uri(uri: str) -> bool:
    return uri.startswith((_SCHEME, _SRV_SCHEME))


def parse_mongo_uri(uri: str, *, validate: bool = True) -> MongoUri:
    """Parse a MongoDB URI with pymongo (``validate``: option values too); ConfigError, redacted, when
    pymongo would refuse it."""
    try:
        return _parse(uri, validate)
    except _REFUSED as exc:
        raise ConfigError(f"URI {redact(uri)} is malformed: {_why(uri, exc)}") from None


def _why(uri: str, exc: Exception) -> str:
    """pymongo's reason, without its hint about escaping a user name where the URI has none to escape."""
    reason = redact(str(exc))
    authority = uri.partition("://")[2].partition("/")[0].partition("?")[0]
    if "Port contains non-digit characters" in reason and "@" not in authority:
        ports = [host.rpartition(":")[2] for host in authority.split(",") if not host.endswith("]")]
        bad = [port for port in ports if port and not port.isdigit()]
        return f"port {quoted(bad[0] if bad else '')} is not a number (a port is 0 to 65535)"
    return reason


def _parse(uri: str, validate: bool) -> MongoUri:
    if uri.startswith(_SRV_SCHEME):
        return _parse_srv(uri, validate)
    parsed = parse_uri(uri, validate=validate, warn=False)
    return MongoUri(
        hosts=tuple(parsed["nodelist"]),
        username=parsed["username"],
        database=parsed["database"],
        options={name.lower(): value for name, value in parsed["options"].items()},
        srv=False,
    )


def _parse_srv(uri: str, validate: bool) -> MongoUri:
    """``parse_uri`` without the SRV and TXT lookups it would make: the same split and the same pymongo
    checks of user info, host and options, and the rules pymongo sets for ``mongodb+srv://``."""
    authority_and_path, _, query = uri[len(_SRV_SCHEME) :].partition("?")
    authority, _, path = authority_and_path.partition("/")
    userinfo, at, hosts = authority.rpartition("@")
    username = parse_userinfo(userinfo)[0] if at else None
    nodes = split_hosts(hosts, default_port=None)
    if len(nodes) != 1:
        raise ValueError("a mongodb+srv:// URI names one, and only one, host name")
    if nodes[0][1] is not None:
        raise ValueError("a mongodb+srv:// URI must not include a port number")
    options = {name.lower(): value for name, value in split_options(query, validate).items()} if query else {}
    if options.get("directconnection"):
        raise ValueError("directConnection=true cannot be used with a mongodb+srv:// URI")
    database = parse_uri(_SCHEME + "h/" + path).get("database") if path else None  # pymongo's name rules
    return MongoUri(hosts=tuple(nodes), username=username, database=database, options=options, srv=True)


def check_mongo_uri(uri: str, role: str) -> str:
    """Validate a MongoDB URI's shape (not reachability; no DNS lookup) and return it unchanged."""
    if not is_mongo_uri(uri):
        raise ConfigError(f"{role} must be a mongodb:// or mongodb+srv:// URI, got {redact(uri)}")
    try:
        parse_mongo_uri(uri)
    except ConfigError as exc:
        raise ConfigError(f"{role} {exc}") from None
    return uri


def host_set(uri: str) -> frozenset[str]:
    """The hosts a URI names as ``host:port``, for a cheap same-server check and for naming a deployment:
    lower-cased, ``localhost`` as 127.0.0.1, IPv6 literals in brackets, the default port when none is
    given (also for an srv host name and a socket path: the default checkpoint path is derived from this
    set, so it keeps the shape it always had)."""
    hosts = set()
    for host, port in parse_mongo_uri(uri).hosts:
        name = f"[{host}]" if ":" in host and not host.endswith(".sock") else host
        hosts.add(f"{name}:{port or _DEFAULT_PORT}".replace("localhost", "127.0.0.1"))
    return frozenset(hosts)


def redact(text: str) -> str:
    """Replace the credentials (user info, secret option values) of every URI inside ``text`` with ``***``."""
    return _ANY_URI.sub(lambda match: _redact_uri(match.group(0)), text)


@functools.lru_cache(maxsize=256)  # the same few URIs come back in every message
def _redact_uri(uri: str) -> str:
    scheme, _, rest = uri.partition("://")
    at = _credentials_end(uri, rest)
    if at >= 0:
        rest = "***" + rest[at:]
    return scheme + "://" + _SECRET_OPTS.sub(r"\1***", rest)


def _credentials_end(uri: str, rest: str) -> int:
    """Where the user info of ``uri`` ends (its ``@``), or -1. A MongoDB URI pymongo parses is cut where
    pymongo cuts it (the last ``@`` before the path); one it refuses, such as a password typed with a raw
    ``@``, ``/`` or ``?``, at its last ``@`` of all, so no part of that password shows. Other schemes
    follow RFC 3986: the authority ends at the first ``/``, ``?`` or ``#``."""
    if is_mongo_uri(uri):
        try:
            _parse(uri, validate=False)
        except _REFUSED:
            return rest.rfind("@")
        return rest.partition("?")[0].partition("/")[0].rfind("@")
    return re.split(r"[/?#]", rest, maxsplit=1)[0].rfind("@")


def kafka_bootstrap(uri: str) -> list[str]:
    """``kafka://HOST:PORT[,HOST:PORT...]`` -> the bootstrap servers, checked for shape."""
    scheme, sep, rest = uri.partition("://")
    if scheme.lower() != "kafka" or not sep:
        raise ConfigError(f"Kafka target {redact(uri)} must look like kafka://HOST:PORT[,HOST:PORT...]")
    hosts = rest.split("/", 1)[0].split("?", 1)[0]
    if "@" in hosts:
        raise ConfigError("Kafka credentials go in --kafka-opt sasl.username=... / sasl.password=..., not the URI")
    out = []
    for host in hosts.split(","):
        name, colon, port = host.rpartition(":")
        if not colon or not name or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"Kafka target {redact(uri)}: {host} is not HOST:PORT")
        out.append(host)
    return out
