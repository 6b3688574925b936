"""A mongos stand-in: a wire proxy in front of a test server that answers as a sharded cluster's router.

No mongos runs here (the test server has no sharding), so this proxy plays one, in the manner of
:class:`tests.support.proxy.WireProxy`:

* ``hello``/``isMaster`` answers are the server's, made a mongos's: ``msg: "isdbgrid"``, no replica set
  fields (``setName``, ``hosts``, ...), and ``maxWireVersion`` set to ``wire_version`` when given (to play
  an older or newer mongos);
* ``shardCollection``, ``enableSharding``, ``split`` and ``listShards`` are answered here, as a mongos
  answers them (``shardCollection`` again with the same key: ok; with another one: AlreadyInitialized;
  before 6.0, ``shardCollection`` in a database without ``enableSharding``: IllegalOperation), and an
  empty collection's shard key index is built on the server, as a mongos has its shard build it;
* ``find`` on ``config.collections`` and ``config.chunks`` is answered from :attr:`collections` and
  :attr:`chunks` (the test sets them for a sharded source; ``shardCollection`` adds to them);
* everything else goes to the server.

Every command is recorded in :attr:`log`, in the order the stand-in received them, so a test can say
that ``shardCollection`` came before the first document written into its namespace.

OP_MSG: a header (length, requestID, responseTo, opCode), flagBits, then sections: kind 0 is the command's
body, kind 1 a document sequence (an insert's ``documents``). The driver's first ``hello`` is an OP_QUERY,
answered by an OP_REPLY.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import struct
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import bson
import pymongo
from bson.binary import Binary, UuidRepresentation
from bson.codec_options import CodecOptions
from bson.max_key import MaxKey
from bson.min_key import MinKey

from tests.support.servers import free_port

OP_REPLY, OP_QUERY, OP_MSG = 1, 2004, 2013
_CODEC: CodecOptions[dict[str, Any]] = CodecOptions(document_class=dict, uuid_representation=0)
_CHECKSUM = 1
#: hello fields a mongos does not send
_REPLICA_SET_FIELDS = (
    "setName", "setVersion", "hosts", "passives", "arbiters", "primary", "me", "secondary", "arbiterOnly",
    "electionId", "lastWrite", "tags", "hidden",
)  # fmt: skip
#: the commands a mongos answers itself (lower-cased)
ANSWERED = frozenset({"shardcollection", "enablesharding", "split", "listshards"})
_WIRE_6_0 = 17  # from 6.0, shardCollection needs no enableSharding first

ALREADY_INITIALIZED = 23
ILLEGAL_OPERATION = 20
NAMESPACE_NOT_SHARDED = 118
UNAUTHORIZED = 13


@dataclass(frozen=True)
class Command:
    """One command the stand-in received: its name (as sent), database, the namespace it names (for
    commands on a collection, or ``shardCollection``/``split``'s argument), and its body without documents."""

    seq: int
    name: str
    db: str
    ns: str
    body: Mapping[str, Any]
    documents: int = 0


@dataclass
class _Request:
    request_id: int
    op: int
    body: dict[str, Any]
    sequences: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


def _cstring(data: bytes, at: int) -> tuple[str, int]:
    end = data.index(b"\x00", at)
    return data[at:end].decode(), end + 1


def parse_request(message: bytes) -> _Request | None:
    """An OP_MSG's body and document sequences, or an OP_QUERY's query; None for anything else."""
    _, request_id, _, op = struct.unpack_from("<iiii", message)
    if op == OP_MSG:
        (flags,) = struct.unpack_from("<I", message, 16)
        end = len(message) - (4 if flags & _CHECKSUM else 0)
        at, body, sequences = 20, None, {}
        while at < end:
            kind = message[at]
            at += 1
            if kind == 0:
                size = struct.unpack_from("<i", message, at)[0]
                body = bson.decode(message[at : at + size], _CODEC)
                at += size
            else:
                size = struct.unpack_from("<i", message, at)[0]
                stop = at + size
                name, at = _cstring(message, at + 4)
                sequences[name] = list(bson.decode_all(message[at:stop], _CODEC))
                at = stop
        return _Request(request_id, op, body or {}, sequences)
    if op == OP_QUERY:
        _, at = _cstring(message, 20)
        size = struct.unpack_from("<i", message, at + 8)[0]
        return _Request(request_id, op, bson.decode(message[at + 8 : at + 8 + size], _CODEC))
    return None


def reply_message(request: _Request, document: Mapping[str, Any]) -> bytes:
    """The answer to ``request`` (OP_MSG, or OP_REPLY to an OP_QUERY), carrying ``document``."""
    payload = bson.encode(document, codec_options=_CODEC)
    if request.op == OP_QUERY:
        body = struct.pack("<iqii", 0, 0, 0, 1) + payload
        op = OP_REPLY
    else:
        body = struct.pack("<I", 0) + b"\x00" + payload
        op = OP_MSG
    return struct.pack("<iiii", 16 + len(body), 0, request.request_id, op) + body


def _rewrite_hello(message: bytes, wire_version: int | None) -> bytes:
    """A server reply made a mongos's when it is a hello answer; other replies as they are."""
    _, request_id, response_to, op = struct.unpack_from("<iiii", message)
    if op == OP_MSG:
        (flags,) = struct.unpack_from("<I", message, 16)
        if message[20] != 0 or flags & _CHECKSUM:
            return message
        head, at = message[16:21], 21
    elif op == OP_REPLY:
        head, at = message[16:36], 36
    else:
        return message
    size = struct.unpack_from("<i", message, at)[0]
    doc = bson.decode(message[at : at + size], _CODEC)
    if "maxWireVersion" not in doc or not ("ismaster" in doc or "isWritablePrimary" in doc):
        return message
    for name in _REPLICA_SET_FIELDS:
        doc.pop(name, None)
    doc["msg"] = "isdbgrid"
    if wire_version is not None:
        doc["maxWireVersion"] = wire_version
    body = head + bson.encode(doc, codec_options=_CODEC) + message[at + size :]
    return struct.pack("<iiii", 16 + len(body), request_id, response_to, op) + body


def matches(doc: Mapping[str, Any], query: Mapping[str, Any]) -> bool:
    """The part of MongoDB's query language config reads use: equality, $in, $ne, $exists, $or."""
    for key, cond in query.items():
        if key == "$or":
            if not any(matches(doc, sub) for sub in cond):
                return False
            continue
        present, value = key in doc, doc.get(key)
        if isinstance(cond, Mapping) and cond and all(str(k).startswith("$") for k in cond):
            for op, arg in cond.items():
                if op == "$in" and not (present and any(_same(value, a) for a in arg)):
                    return False
                if op == "$ne" and present and _same(value, arg):
                    return False
                if op == "$exists" and present != bool(arg):
                    return False
                if op not in ("$in", "$ne", "$exists"):
                    raise ValueError(f"the mongos stand-in does not know {op}")
        elif not (present and _same(value, cond)):
            return False
    return True


def _same(a: Any, b: Any) -> bool:
    return bool(bson.encode({"v": a}, codec_options=_CODEC) == bson.encode({"v": b}, codec_options=_CODEC))


class MongosStandIn:
    """Runs in a thread of its own; ``uri`` reaches the server through it, as a mongos."""

    def __init__(self, host: str, port: int, *, wire_version: int | None = None, admin_uri: str = "") -> None:
        self.upstream = (host, port)
        self.admin_uri = admin_uri  # how the stand-in itself reaches the server (with --auth: a root user's URI)
        self.port = free_port()
        self.wire_version = wire_version
        #: config.collections documents by namespace (the test's, for a source; shardCollection's)
        self.collections: dict[str, dict[str, Any]] = {}
        #: config.chunks documents (the test's, for a source)
        self.chunks: list[dict[str, Any]] = []
        #: listShards' shards
        self.shards: list[dict[str, Any]] = []
        self.enabled: set[str] = set()  # databases enableSharding was sent for
        #: commands (lower-cased) refused as a user without the privilege is refused (Unauthorized)
        self.unauthorized: set[str] = set()
        #: set once a shardCollection was answered
        self.sharded_event = threading.Event()
        self._writes_open: asyncio.Event | None = None  # cleared: writes wait (see hold_writes)
        self.log: list[Command] = []
        self._seq = itertools.count()
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None

    @property
    def uri(self) -> str:
        return f"mongodb://127.0.0.1:{self.port}/?directConnection=true"

    # what a test asks

    def commands(self, name: str, ns: str | None = None) -> list[Command]:
        """The recorded commands called ``name`` (case-insensitive), about ``ns`` when given."""
        with self._lock:
            return [c for c in self.log if c.name.lower() == name.lower() and (ns is None or c.ns == ns)]

    def first_write(self, ns: str) -> Command | None:
        """The first insert, update or delete sent into ``ns``."""
        with self._lock:
            return next((c for c in self.log if c.name in ("insert", "update", "delete") and c.ns == ns), None)

    def shard_source(
        self, ns: str, key: Mapping[str, Any], *, unique: bool = False, bounds: Sequence[Mapping[str, Any]] = (),
        by_uuid: bool = True, collation: Mapping[str, Any] | None = None,
    ) -> None:  # fmt: skip
        """Make ``ns`` a sharded collection of this cluster, with chunks split at ``bounds`` (each a shard key
        value): its config.chunks name it by uuid (5.0+) or by ns (before)."""
        coll_uuid = Binary.from_uuid(uuid.uuid4(), UuidRepresentation.STANDARD)
        entry: dict[str, Any] = {"_id": ns, "key": dict(key), "unique": unique, "uuid": coll_uuid}
        if by_uuid:
            entry["timestamp"] = bson.Timestamp(1, 1)
        if collation is not None:
            entry["defaultCollation"] = dict(collation)
        self.collections[ns] = entry
        lows = [{name: MinKey() for name in key}, *bounds]
        highs = [*bounds, {name: MaxKey() for name in key}]
        for low, high in zip(lows, highs, strict=True):
            chunk: dict[str, Any] = {"_id": bson.ObjectId(), "min": dict(low), "max": dict(high), "shard": "shard0"}
            chunk.update({"uuid": coll_uuid} if by_uuid else {"ns": ns})
            self.chunks.append(chunk)

    def hold_writes(self) -> None:
        """Hold every insert, update and delete (unanswered, not passed on) until :meth:`release_writes`: a
        test can stop mcdc after it sharded a collection and before it copied anything into it."""

        def hold() -> None:
            self._writes_open = asyncio.Event()

        self._loop.call_soon_threadsafe(hold)

    def release_writes(self) -> None:
        def release() -> None:
            if self._writes_open is not None:
                self._writes_open.set()

        self._loop.call_soon_threadsafe(release)

    # the proxy

    def _record(self, request: _Request) -> Command:
        body = request.body
        name = next(iter(body), "")
        db = str(body.get("$db", ""))
        if request.op == OP_QUERY:
            db = "admin"
        arg = body.get(name)
        if name.lower() in ("shardcollection", "split", "enablesharding"):
            ns = str(arg)
        elif isinstance(arg, str):
            ns = f"{db}.{arg}"
        else:
            ns = ""
        docs = len(request.sequences.get("documents", ())) + len(body.get("documents") or ())
        clean = {k: v for k, v in body.items() if k not in ("documents", "updates", "deletes", "$clusterTime")}
        with self._lock:
            command = Command(next(self._seq), name, db, ns, clean, docs)
            self.log.append(command)
        return command

    async def _answer(self, request: _Request, command: Command) -> dict[str, Any] | None:
        """The stand-in's own answer, or None to pass the request to the server."""
        name = command.name.lower()
        body = request.body
        if name in self.unauthorized:
            return _error(UNAUTHORIZED, f"not authorized on admin to execute command {{ {command.name}: ... }}",
                          "Unauthorized")  # fmt: skip
        if name == "enablesharding":
            self.enabled.add(command.ns)
            return {"ok": 1.0}
        if name == "listshards":
            return {"shards": list(self.shards), "ok": 1.0}
        if name == "shardcollection":
            return await self._shard_collection(command.ns, body)
        if name == "split":
            if command.ns not in self.collections:
                return _error(NAMESPACE_NOT_SHARDED, f"{command.ns} is not sharded", "NamespaceNotSharded")
            return {"ok": 1.0}
        if name == "find" and command.db == "config" and body.get("find") in ("collections", "chunks"):
            rows = list(self.collections.values()) if body["find"] == "collections" else list(self.chunks)
            found = [row for row in rows if matches(row, body.get("filter") or {})]
            cursor = {"firstBatch": found, "id": bson.Int64(0), "ns": command.ns}
            return {"cursor": cursor, "ok": 1.0}
        return None

    async def _shard_collection(self, ns: str, body: Mapping[str, Any]) -> dict[str, Any]:
        key = dict(body.get("key") or {})
        unique = bool(body.get("unique", False))
        have = self.collections.get(ns)
        if have is not None:
            if _same(have["key"], key) and bool(have.get("unique")) == unique:
                return {"collectionsharded": ns, "ok": 1.0}
            return _error(
                ALREADY_INITIALIZED, f"sharding already enabled for collection {ns} with options {have}",
                "AlreadyInitialized",
            )  # fmt: skip
        db, _, coll = ns.partition(".")
        wire = self.wire_version if self.wire_version is not None else 99
        if wire < _WIRE_6_0 and db not in self.enabled:
            return _error(ILLEGAL_OPERATION, f"sharding not enabled for db {db}", "IllegalOperation")
        await asyncio.to_thread(self._key_index, db, coll, key, unique)
        self.collections[ns] = {"_id": ns, "key": key, "unique": unique, "timestamp": bson.Timestamp(1, 1)}
        self.sharded_event.set()
        return {"collectionsharded": ns, "ok": 1.0}

    def _key_index(self, db: str, coll: str, key: Mapping[str, Any], unique: bool) -> None:
        """As a mongos has its shard do for an empty collection: the index the shard key needs, unless one
        with that key is there."""
        host, port = self.upstream
        uri = self.admin_uri or f"mongodb://{host}:{port}/?directConnection=true"
        with pymongo.MongoClient(uri) as client:
            target = client[db][coll]
            with contextlib.suppress(pymongo.errors.PyMongoError):  # a key the test server cannot index
                if not any(_same(ix["key"], key) for ix in target.list_indexes()):
                    target.create_index(list(key.items()), unique=unique)

    async def _pipe(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(*self.upstream)
        lock = asyncio.Lock()  # the client's writer is shared by both directions

        async def send(data: bytes) -> None:
            async with lock:
                client_w.write(data)
                await client_w.drain()

        async def up() -> None:
            while True:
                message = await _message(client_r)
                request = parse_request(message)
                if request is not None:
                    command = self._record(request)
                    if self._writes_open is not None and command.name in ("insert", "update", "delete"):
                        await self._writes_open.wait()
                    answer = await self._answer(request, command)
                    if answer is not None:
                        await send(reply_message(request, answer))
                        continue
                server_w.write(message)
                await server_w.drain()

        async def down() -> None:
            while True:
                await send(_rewrite_hello(await _message(server_r), self.wire_version))

        with contextlib.suppress(Exception):
            await asyncio.gather(up(), down())
        for writer in (client_w, server_w):
            writer.close()

    def start(self) -> None:
        self._thread.start()

        async def serve() -> None:
            self._server = await asyncio.start_server(self._pipe, "127.0.0.1", self.port)

        asyncio.run_coroutine_threadsafe(serve(), self._loop).result(10)

    def stop(self) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()
            self.release_writes()
            tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            # awaited here, so no pending task is left for the garbage collector to report with a traceback
            # inside another test (Python 3.11 parses a traceback's lines: inside test_layers' ast.parse,
            # "SystemError: AST constructor recursion depth mismatch")
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def _error(code: int, message: str, name: str) -> dict[str, Any]:
    return {"ok": 0.0, "errmsg": message, "code": code, "codeName": name}


async def _message(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readexactly(4)
    return head + await reader.readexactly(int.from_bytes(head, "little") - 4)


@contextlib.contextmanager
def mongos(uri: str, *, wire_version: int | None = None, admin_uri: str = "") -> Iterator[MongosStandIn]:
    """A mongos stand-in in front of the server at ``uri`` (host and port of its first seed); ``admin_uri``:
    how the stand-in reaches that server for what a mongos has its shards do (a root user's, with --auth)."""
    hostport = uri.split("://", 1)[1].split("/", 1)[0].split(",")[0].rsplit("@", 1)[-1]
    host, _, port = hostport.rpartition(":")
    stand_in = MongosStandIn(host, int(port), wire_version=wire_version, admin_uri=admin_uri)
    stand_in.start()
    try:
        yield stand_in
    finally:
        stand_in.stop()
