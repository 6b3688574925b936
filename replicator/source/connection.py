"""Connecting to MongoDB with raw-BSON codec options, and telling what kind of deployment it is."""

from __future__ import annotations

import asyncio
import re
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from bson.codec_options import DatetimeConversion
from bson.raw_bson import RawBSONDocument
from pymongo import AsyncMongoClient, MongoClient, monitoring, uri_parser
from pymongo.errors import BulkWriteError, ConfigurationError, OperationFailure, PyMongoError

from replicator.bsonkit.rawbson import DICT_CODEC as DICT_CODEC  # re-exported: the source's codecs
from replicator.bsonkit.rawbson import RAW_CODEC as RAW_CODEC
from replicator.errors import ConfigError, ConnectionFailed, McdcError, ServerUnavailable, quoted
from replicator.settings.uri import host_set, redact
from replicator.source.driver_mend import mend_pymongo
from replicator.source.privileges import UNAUTHORIZED, Grants, command_refusal, grants_of

mend_pymongo()  # before any client of this process waits on a condition (see driver_mend)

Client = AsyncMongoClient[RawBSONDocument]
#: Either driver's client: what a failure is told from (its topology) is the same in both.
AnyClient = AsyncMongoClient[Any] | MongoClient[Any]


@dataclass(frozen=True)
class ServerInfo:
    """What ``hello`` says about a deployment."""

    kind: str  # "replicaset" | "sharded" | "standalone"
    set_name: str | None
    process_id: str | None
    max_wire_version: int
    #: The deployment's own unique id ("rs:<set name>/<replicaSetId>" or "cluster:<clusterId>"), when the
    #: server has one and lets us read it; see :func:`deployment_identity`.
    deployment_id: str | None = None
    #: a replica set's members as its own configuration names them (hello's hosts, passives and arbiters),
    #: sorted: the same however a URI spells them
    members: tuple[str, ...] = ()

    @property
    def has_change_streams(self) -> bool:
        return self.kind != "standalone"


def deployment_identity(info: ServerInfo, uri: str) -> str:
    """What tells this deployment from any other, for a checkpoint and for the migrations of a target: its
    own id when the server gave one, else a replica set's name with its members as the set names them
    (every replica set called rs0 looks alike by name alone; a URI may name a member by another host name
    or address), else the URI's sorted seed hosts (a mongos or a standalone server says no more of itself).
    Never holds credentials."""
    if info.deployment_id:
        return info.deployment_id
    if info.set_name and info.members:
        return f"rs:{info.set_name}@{','.join(info.members)}"
    return uri_identity(info, uri)


def uri_identity(info: ServerInfo, uri: str) -> str:
    """A deployment named by the URI's sorted seed hosts (and its replica set's name): what an older mcdc
    recorded of a server that hid its own id, still taken as this deployment's."""
    hosts = ",".join(sorted(host_set(uri)))
    return f"rs:{info.set_name}@{hosts}" if info.set_name else f"hosts:{hosts}"


def uri_options(uri: str) -> set[str]:
    """The lower-cased option names in a URI's query string."""
    query = uri.split("?", 1)[1] if "?" in uri else ""
    return {key.lower() for key in parse_qs(query, keep_blank_values=True)}


def server_message(exc: PyMongoError) -> str:
    """A server error in one redacted line: its message and code name, without the reply's noise."""
    details = getattr(exc, "details", None) or {}
    message = details.get("errmsg") or str(exc).split(", full error:")[0]
    code = details.get("codeName")
    return redact(f"{message} ({code})" if code else message)


def client_options(timeout_s: float, appname: str, uri: str = "") -> dict[str, Any]:
    """The options of every client mcdc opens, async or sync: raw BSON documents, dates outside Python's
    range kept, UUIDs left as binary, and the connect timeouts (--connect-timeout), unless ``uri`` sets
    its own (a keyword would override the URI's)."""
    options: dict[str, Any] = {
        "document_class": RAW_CODEC.document_class,
        "datetime_conversion": DatetimeConversion.DATETIME_AUTO,
        "uuidRepresentation": "unspecified",
        "appname": appname,
    }
    given = uri_options(uri)
    for name in ("serverSelectionTimeoutMS", "connectTimeoutMS"):
        if name.lower() not in given:
            options[name] = int(timeout_s * 1000)
    return options


def read_timeout(uri: str, io_timeout_s: float | None) -> dict[str, Any]:
    """socketTimeoutMS for a client that only reads (a source), unless the URI sets its own: a reply that
    never comes (a request a restarted server lost) then fails the read, which is retried, instead of
    waiting forever. A source's operations are all short (its change stream waits ``max_await_ms``); a
    target's index builds are not, so its document writes are bounded where they are sent instead."""
    if not io_timeout_s or "sockettimeoutms" in uri_options(uri):
        return {}
    return {"socketTimeoutMS": int(io_timeout_s * 1000)}


def make_client(
    uri: str,
    *,
    timeout_s: float = 10.0,
    durable_writes: bool = False,
    io_timeout_s: float | None = None,
    side: str = "source",
) -> Client:
    """An AsyncMongoClient that returns raw BSON documents. Does no I/O.

    ``durable_writes``: unless the URI sets its own write concern, writes wait for a journaled majority,
    so what the checkpoint records as acknowledged survives a target crash. ``side`` ("source" or
    "target") names the server in what :func:`explain_refusal` says of a command it refused."""
    extra: dict[str, Any] = read_timeout(uri, io_timeout_s)
    if durable_writes and not uri_options(uri) & {"w", "journal", "wtimeoutms"}:
        extra.update(w="majority", journal=True)
    try:
        return AsyncMongoClient(
            uri, **client_options(timeout_s, "mcdc", uri), connect=False, event_listeners=[refusals(side, uri)], **extra
        )
    except (ConfigurationError, ValueError, TypeError) as exc:
        raise ConnectionFailed(f"cannot use {redact(uri)}: {redact(str(exc))}") from None


async def probe(client: Client, uri: str, role: str) -> ServerInfo:
    """Ping the server and classify it. A refusal becomes a one-line ConnectionFailed, no answer a
    ServerUnavailable (an outage: exit 75), and what no retry can mend a ConfigError: a replicaSet= the
    servers say is not theirs, a TLS certificate that fails verification or does not name the host, a host
    name that does not resolve. Those are told as soon as every server has failed so."""
    try:
        hello = await _hello(client, uri, role)
        deployment_id = await _deployment_id(client, hello)
    except PyMongoError as exc:
        raise await failure(exc, client, uri, role) from None
    topology = hello.get("topologyVersion") or {}
    pid = topology.get("processId")
    return ServerInfo(
        kind=kind_of(hello),
        set_name=hello.get("setName"),
        process_id=str(pid) if pid is not None else None,
        max_wire_version=int(hello.get("maxWireVersion", 0)),
        deployment_id=deployment_id,
        members=tuple(sorted({str(h) for key in ("hosts", "passives", "arbiters") for h in hello.get(key) or ()})),
    )


async def failure(exc: PyMongoError, client: AnyClient, uri: str, role: str) -> McdcError:
    """What :func:`probe` says of ``exc``, raised by ``client`` (async or sync) of ``uri``: a refusal is a
    ConnectionFailed, what no retry mends a ConfigError, anything else no answer (ServerUnavailable)."""
    if isinstance(exc, OperationFailure):
        refused = explain_refusal(exc)  # a command the user may not run: the role that grants it
        return ConnectionFailed(refused or f"{role} {redact(uri)} refused us: {server_message(exc)}")
    problem = _configuration_problem(client) or _not_mongodb(str(exc))  # the last error, or the first
    if problem is not None:
        return ConfigError(f"{role} {redact(uri)}: {problem}")
    # pymongo drops a seed whose set is not the URI's, then finds no member: ask the seeds directly
    no_member = "No replica set members" in str(exc)
    wrong_set = await _other_set_name(uri, client.options.server_selection_timeout) if no_member else None
    if wrong_set is not None:
        return ConfigError(f"{role} {redact(uri)}: {wrong_set}")
    reason = redact(str(exc)).split(", Timeout:")[0].split(" (configured timeouts")[0]
    return ServerUnavailable(f"{role} {redact(uri)} is unreachable: {reason}")


async def _hello(client: Client, uri: str, role: str) -> dict[str, Any]:
    """The server's hello; a ConfigError as soon as every server the client knows has failed in a way no
    retry mends (see :func:`configuration_problem`), rather than at the end of the selection timeout."""
    asked = asyncio.ensure_future(client.admin.command("hello", codec_options=DICT_CODEC))
    try:
        while True:
            done, _ = await asyncio.wait([asked], timeout=0.1)
            if done:
                return asked.result()
            problem = _configuration_problem(client)
            if problem is not None:
                raise ConfigError(f"{role} {redact(uri)}: {problem}")
    finally:
        if not asked.done():
            asked.cancel()
            await asyncio.gather(asked, return_exceptions=True)


def _configuration_problem(client: AnyClient) -> str | None:
    """What to fix, when every server the client knows failed for a reason no retry mends."""
    servers = list(client.topology_description.server_descriptions().values())
    problems = [configuration_problem(str(sd.error), sd.address[0]) if sd.error else None for sd in servers]
    if servers and all(problems):
        return problems[0]
    return None


#: How name resolution says a host has no address (EAI_NONAME, EAI_NODATA); a temporary failure
#: ("Temporary failure in name resolution", EAI_AGAIN) is an outage instead.
_NO_SUCH_HOST = re.compile(
    r"Name or service not known|nodename nor servname|No address associated with hostname|"
    r"getaddrinfo failed|\[Errno -[25]\]|\[Errno 1100[01]\]"
)


def configuration_problem(error: str, host: str) -> str | None:
    """What to fix, when a connection to ``host`` failed with ``error`` for a reason no retry mends: a
    certificate that does not name the host, one that fails verification, a server that wants a client
    certificate, a host name that does not resolve. None for anything else (an outage)."""
    lowered = error.lower()
    if "certificate verify failed" in lowered or "certificate_verify_failed" in lowered:
        if "mismatch" in lowered or "not valid for" in lowered or "hostname" in lowered:
            return (
                f"the server's TLS certificate does not name {host}: use a certificate whose names include "
                f"{host}, or connect by a name the certificate holds"
            )
        detail = error.split("certificate verify failed:")[-1].split("(_ssl")[0].strip(" .")
        return (
            f"the server's TLS certificate failed verification ({detail}): fix tlsCAFile (the CA that signed "
            "the server's certificate)"
        )
    if "certificate required" in lowered or "peer did not return a certificate" in lowered:
        return "the server requires a client certificate: set tlsCertificateKeyFile"
    if _NO_SUCH_HOST.search(error):
        return f"cannot resolve host {host}: fix the URI"
    return _not_mongodb(error)


#: what the driver says when a reply's first four bytes, read as a MongoDB message's length, are too many:
#: a server that speaks another protocol (b"HTTP" is 1347703880)
_MESSAGE_LENGTH = re.compile(r"Message length \((\d+)\) is larger than server max message size")


def _not_mongodb(error: str) -> str | None:
    """The port answers with something other than MongoDB (a web server on it, say): what its reply began
    with, when the length the driver read is text."""
    found = _MESSAGE_LENGTH.search(error)
    if found is None:
        return None
    length = int(found.group(1))
    head = length.to_bytes(4, "little") if length < 2**32 else b""
    detail = ""
    if head and all(32 <= b < 127 for b in head):
        text = head.decode("ascii")
        web = ": an HTTP server?" if text.upper().startswith(("HTTP", "<")) else ""
        detail = f" (its reply begins {text!r}{web})"
    return f"the port answers with something other than MongoDB{detail}: fix the host or port in the URI"


async def grants(client: Client) -> Grants | None:
    """What the connected user may do (connectionStatus with showPrivileges); None when the server does
    not authenticate, or when it cannot tell (see :func:`~replicator.source.privileges.grants_of`)."""
    try:
        reply = await client.admin.command({"connectionStatus": 1, "showPrivileges": True}, codec_options=DICT_CODEC)
    except OperationFailure:
        return None
    return grants_of(reply)


def refusals(side: str, uri: str) -> monitoring.CommandListener:
    """The listener a client of ``uri`` needs for :func:`explain_refusal` to name the role a refused command
    needs, or, for a URI without credentials, that the server wants a user (every client
    :func:`make_client` makes has one)."""
    return _Refusals(side, anonymous=not has_credentials(uri))


#: URI userinfo: ``scheme://USER[:PASSWORD]@``
_USERINFO = re.compile(r"^[a-z+]+://[^/@?]+@", re.IGNORECASE)


def has_credentials(uri: str) -> bool:
    """Does ``uri`` authenticate: a user in it, or an authMechanism that needs none there (X.509, AWS, ...)?"""
    return bool(_USERINFO.match(uri)) or "authmechanism" in uri_options(uri)


def unauthenticated(side: str) -> str:
    """What to do when ``side``'s server refused a client that gave no credentials: no role can help."""
    return f"{side}: the server requires authentication: put a user in the URI (mongodb://USER:PASSWORD@HOST/...)"


class _Refusals(monitoring.CommandListener):
    """Keeps the last commands a server refused as Unauthorized, and the last error replies, with the side
    that sent them (and whether its client gave credentials at all): the exception the driver raises says
    neither."""

    def __init__(self, side: str, *, anonymous: bool = False) -> None:
        self.side = side
        self.anonymous = anonymous

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        pass

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        if event.command_name in ("insert", "update", "delete"):  # a refusal as a write error of an ok reply
            for error in event.reply.get("writeErrors") or ():
                self._note(error, event)

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        failure = event.failure or {}
        self._note(failure, event)
        for error in failure.get("writeErrors") or ():
            self._note(error, event)

    def _note(
        self, error: Mapping[str, Any], event: monitoring.CommandSucceededEvent | monitoring.CommandFailedEvent
    ) -> None:
        said = str(error.get("errmsg", ""))
        if error.get("code") == UNAUTHORIZED:
            _REFUSED.append((self.side, event.command_name, event.database_name, said, self.anonymous))
        _FAILED.append((self.side, event.command_name, event.database_name, error.get("code"), said))


#: (side, command, database, message, no credentials given) of the latest Unauthorized replies, newest last.
_REFUSED: deque[tuple[str, str, str, str, bool]] = deque(maxlen=16)
#: (side, command, database, code, message) of the latest error replies, newest last.
_FAILED: deque[tuple[str, str, str, Any, str]] = deque(maxlen=16)


def explain_refusal(exc: BaseException) -> str | None:
    """One line for an error that is (or was caused by) a server's Unauthorized reply: which side refused
    which command, and the built-in role that grants it (or, to a client that gave no credentials, that
    the URI needs a user). None for any other error, or for a refusal no
    client of this process saw (its side unknown)."""
    seen: BaseException | None = exc
    while seen is not None:
        message = _unauthorized(seen)
        if message is not None:
            for side, command, db, said, anonymous in reversed(_REFUSED):
                if said == message:
                    # the server says so to a client that did not authenticate ("command X requires
                    # authentication"); an Unauthorized said otherwise is about the command, whoever asks
                    needs_user = anonymous and "requires authentication" in said
                    return unauthenticated(side) if needs_user else command_refusal(side, command, db)
            return None
        seen = seen.__cause__ or seen.__context__
    return None


def explain_failure(exc: BaseException) -> str | None:
    """One line for an error reply no retry mends (a BadValue, a code this mcdc does not expect): which side
    answered it to which command, what it said, and what to do. None for an error no client of this
    process saw answered (its side unknown)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OperationFailure):
            details = seen.details or {}
            if isinstance(seen, BulkWriteError):
                details = (details.get("writeErrors") or [{}])[0]
            code, said = details.get("code", seen.code), str(details.get("errmsg", ""))
            for side, command, db, failed_code, failed_said in reversed(_FAILED):
                if failed_code == code and failed_said == said:
                    name = f" {details['codeName']}" if details.get("codeName") else ""
                    return (
                        f"{side}: the server refused {command} on {db} (code {code}{name}: "
                        f"{redact(said.splitlines()[0][:300]) if said else '-'}); no retry mends that: see to what it "
                        "says, then run again (the checkpoint holds the last acknowledged position)"
                    )
            return None
        seen = seen.__cause__ or seen.__context__
    return None


def _unauthorized(exc: BaseException) -> str | None:
    """The server's message, when ``exc`` is an Unauthorized refusal."""
    if isinstance(exc, BulkWriteError):
        errors = [e for e in (exc.details or {}).get("writeErrors") or [] if e.get("code") == UNAUTHORIZED]
        return str(errors[0].get("errmsg", "")) if errors else None
    if isinstance(exc, OperationFailure) and exc.code == UNAUTHORIZED:
        return str((exc.details or {}).get("errmsg", ""))
    return None


def kind_of(hello: Mapping[str, Any]) -> str:
    """What a server's hello answer says it is: "sharded" (a mongos), "replicaset" or "standalone"."""
    if hello.get("msg") == "isdbgrid":
        return "sharded"
    return "replicaset" if hello.get("setName") else "standalone"


async def _other_set_name(uri: str, timeout_s: float) -> str | None:
    """When ``uri`` names a replica set its seed servers say they are not members of: what they say."""
    try:
        parsed = uri_parser.parse_uri(uri) if not uri.startswith("mongodb+srv://") else None
    except (ConfigurationError, ValueError):
        return None
    if parsed is None or not parsed["options"].get("replicaSet"):
        return None
    wanted = parsed["options"]["replicaSet"]
    tls = {k: v for k, v in parsed["options"].items() if k.lower().startswith(("tls", "ssl"))}
    for host, port in parsed["nodelist"]:
        direct: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
            host, port, directConnection=True, serverSelectionTimeoutMS=int(timeout_s * 1000), **tls
        )
        try:
            actual = (await direct.admin.command("hello")).get("setName")
        except PyMongoError:
            continue
        finally:
            await direct.close()
        if actual != wanted:
            member = f"a member of replica set {quoted(actual)}" if actual else "not a replica set member"
            return f"the URI names replica set {quoted(wanted)}, but {host}:{port} is {member} (fix replicaSet=)"
    return None


async def _deployment_id(client: Client, hello: dict[str, Any]) -> str | None:
    """A replica set's ``settings.replicaSetId`` (replSetGetConfig, else local.system.replset) or a sharded
    cluster's ``clusterId`` (config.version); None where the server has neither or we may not read them."""
    try:
        if hello.get("msg") == "isdbgrid":
            cluster_id = (await _first(client, "config", "version")).get("clusterId")
            return f"cluster:{cluster_id}" if cluster_id is not None else None
        if not hello.get("setName"):
            return None
        try:
            reply = await client.admin.command("replSetGetConfig", codec_options=DICT_CODEC)
            config = reply.get("config") or {}
        except OperationFailure:  # no clusterMonitor privilege, or a server without the command
            config = await _first(client, "local", "system.replset")
        set_id = (config.get("settings") or {}).get("replicaSetId")
        return f"rs:{hello['setName']}/{set_id}" if set_id is not None else None
    except OperationFailure:  # not allowed to read it: deployment_identity falls back to the seed hosts
        return None


async def _first(client: Client, db: str, coll: str) -> Mapping[str, Any]:
    return await client[db].get_collection(coll, codec_options=DICT_CODEC).find_one() or {}
