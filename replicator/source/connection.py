"""Connecting to MongoDB with raw-BSON codec options, and telling what kind of deployment it is."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from bson.codec_options import DatetimeConversion
from bson.raw_bson import RawBSONDocument
from pymongo import AsyncMongoClient, uri_parser
from pymongo.errors import ConfigurationError, OperationFailure, PyMongoError

from replicator.bsonkit.rawbson import DICT_CODEC as DICT_CODEC  # re-exported: the source's codecs
from replicator.bsonkit.rawbson import RAW_CODEC as RAW_CODEC
from replicator.errors import ConfigError, ConnectionFailed, ServerUnavailable, quoted
from replicator.settings.uri import host_set, redact

Client = AsyncMongoClient[RawBSONDocument]


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

    @property
    def has_change_streams(self) -> bool:
        return self.kind != "standalone"


def deployment_identity(info: ServerInfo, uri: str) -> str:
    """What tells this deployment from any other, for a checkpoint: its own id when the server gave one,
    else the replica set name with the URI's sorted seed hosts (every replica set called rs0 looks alike by
    name alone). Never holds credentials."""
    if info.deployment_id:
        return info.deployment_id
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
    uri: str, *, timeout_s: float = 10.0, durable_writes: bool = False, io_timeout_s: float | None = None
) -> Client:
    """An AsyncMongoClient that returns raw BSON documents. Does no I/O.

    ``durable_writes``: unless the URI sets its own write concern, writes wait for a journaled majority,
    so what the checkpoint records as acknowledged survives a target crash."""
    extra: dict[str, Any] = read_timeout(uri, io_timeout_s)
    if durable_writes and not uri_options(uri) & {"w", "journal", "wtimeoutms"}:
        extra.update(w="majority", journal=True)
    try:
        return AsyncMongoClient(uri, **client_options(timeout_s, "mcdc", uri), connect=False, **extra)
    except (ConfigurationError, ValueError, TypeError) as exc:
        raise ConnectionFailed(f"cannot use {redact(uri)}: {redact(str(exc))}") from None


async def probe(client: Client, uri: str, role: str) -> ServerInfo:
    """Ping the server and classify it. A refusal becomes a one-line ConnectionFailed, no answer a
    ServerUnavailable (an outage: exit 75), and a replicaSet= the servers say is not theirs a ConfigError."""
    try:
        hello = await client.admin.command("hello", codec_options=DICT_CODEC)
        deployment_id = await _deployment_id(client, hello)
    except OperationFailure as exc:
        raise ConnectionFailed(f"{role} {redact(uri)} refused us: {server_message(exc)}") from None
    except PyMongoError as exc:
        # pymongo drops a seed whose set is not the URI's, then finds no member: ask the seeds directly
        no_member = "No replica set members" in str(exc)
        wrong_set = await _other_set_name(uri, client.options.server_selection_timeout) if no_member else None
        if wrong_set is not None:
            raise ConfigError(f"{role} {redact(uri)}: {wrong_set}") from None
        reason = redact(str(exc)).split(", Timeout:")[0].split(" (configured timeouts")[0]
        raise ServerUnavailable(f"{role} {redact(uri)} is unreachable: {reason}") from None
    topology = hello.get("topologyVersion") or {}
    pid = topology.get("processId")
    return ServerInfo(
        kind=kind_of(hello),
        set_name=hello.get("setName"),
        process_id=str(pid) if pid is not None else None,
        max_wire_version=int(hello.get("maxWireVersion", 0)),
        deployment_id=deployment_id,
    )


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
