"""A stand-in for a MongoDB server that holds time-series collections: a wire proxy in front of a test server.

The test server stores a collection created with ``timeseries`` options as a plain one (an INFRA quirk), so no
test of its own can see what mongod does with one. This proxy answers as mongod does for the namespaces it is
given, in the manner of :mod:`tests.support.mongos`:

* ``listCollections`` reports each as ``type: "timeseries"`` with its ``timeseries`` options (timeField,
  metaField, granularity), no ``uuid`` and no ``idIndex``, as mongod 5.0+ reports the view over its buckets;
* change streams (``aggregate`` with ``$changeStream`` and their ``getMore``) report no event of them, as
  mongod's do not ("Time series collections do not support change streams", MongoDB's manual): a write to
  one changes its ``system.buckets`` collection, which a change stream leaves out;
* everything else goes to the server as it is (reads, writes, indexes: the test server's plain collection).
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import bson

from tests.support.mongos import _CODEC, OP_MSG, _message, parse_request
from tests.support.servers import free_port

_CHECKSUM = 1


def _body(message: bytes) -> tuple[int, int, bytes, int, int] | None:
    """(requestID, responseTo, the reply's head up to its body, the body's offset and size) of an OP_MSG reply
    whose first section is its body; None for anything else."""
    _, request_id, response_to, op = struct.unpack_from("<iiii", message)
    if op != OP_MSG:
        return None
    (flags,) = struct.unpack_from("<I", message, 16)
    if message[20] != 0 or flags & _CHECKSUM:
        return None
    size = struct.unpack_from("<i", message, 21)[0]
    return request_id, response_to, message[16:21], 21, size


class TimeseriesStandIn:
    """Runs in a thread of its own; ``uri`` reaches the server through it. ``collections``: namespace ->
    its ``timeseries`` options, the namespaces it reports as time-series collections."""

    def __init__(self, host: str, port: int, collections: Mapping[str, Mapping[str, Any]]) -> None:
        self.upstream = (host, port)
        self.collections = {ns: dict(options) for ns, options in collections.items()}
        self.port = free_port()
        self.hidden = 0  # change events left out (a test can tell the stream did carry some)
        self._streams: set[int] = set()  # cursor ids of change streams
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None

    @property
    def uri(self) -> str:
        return f"mongodb://127.0.0.1:{self.port}/?directConnection=true"

    def _note(self, message: bytes, pending: dict[int, str]) -> None:
        """Remember what a request asks (``pending``: requestID -> "listCollections:DB" or "changeStream", per
        connection: two clients may use one requestID)."""
        request = parse_request(message)
        if request is None or not request.body:
            return
        body = request.body
        name = next(iter(body))
        db = str(body.get("$db", ""))
        if name == "listCollections":
            pending[request.request_id] = f"listCollections:{db}"
        else:
            opens = name == "aggregate" and any("$changeStream" in stage for stage in body.get("pipeline") or ())
            if opens or (name == "getMore" and int(body["getMore"]) in self._streams):
                pending[request.request_id] = "changeStream"

    def _rewrite(self, message: bytes, pending: dict[int, str]) -> bytes:
        parts = _body(message)
        if parts is None:
            return message
        request_id, response_to, head, at, size = parts
        what = pending.pop(response_to, None)
        if what is None:
            return message
        doc = bson.decode(message[at : at + size], _CODEC)
        cursor = doc.get("cursor")
        if not isinstance(cursor, dict):
            return message
        batch = "firstBatch" if "firstBatch" in cursor else "nextBatch"
        if what == "changeStream":
            if cursor.get("id"):
                self._streams.add(int(cursor["id"]))
            kept = [event for event in cursor.get(batch) or () if not self._of_timeseries(event)]
            self.hidden += len(cursor.get(batch) or ()) - len(kept)
            cursor[batch] = kept
        else:
            db = what.split(":", 1)[1]
            cursor[batch] = [self._listed(db, info) for info in cursor.get(batch) or ()]
        body = head + bson.encode(doc, codec_options=_CODEC) + message[at + size :]
        return struct.pack("<iiii", 16 + len(body), request_id, response_to, OP_MSG) + body

    def _of_timeseries(self, event: Mapping[str, Any]) -> bool:
        ns = event.get("ns") or {}
        return f"{ns.get('db')}.{ns.get('coll')}" in self.collections

    def _listed(self, db: str, info: dict[str, Any]) -> dict[str, Any]:
        options = self.collections.get(f"{db}.{info.get('name')}")
        if options is None:
            return info
        info["type"] = "timeseries"
        if "options" in info or "info" in info:  # not nameOnly: the view's options, as mongod lists them
            info["options"] = {"timeseries": dict(options)}
            info["info"] = {"readOnly": False}
            info.pop("idIndex", None)
        return info

    async def _pipe(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(*self.upstream)
        pending: dict[int, str] = {}

        async def up() -> None:
            while True:
                message = await _message(client_r)
                self._note(message, pending)
                server_w.write(message)
                await server_w.drain()

        async def down() -> None:
            while True:
                client_w.write(self._rewrite(await _message(server_r), pending))
                await client_w.drain()

        # stopped (cancelled) or closed by either side: the connection ends, quietly
        with contextlib.suppress(Exception, asyncio.CancelledError):
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
            tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@contextlib.contextmanager
def timeseries_server(uri: str, collections: Mapping[str, Mapping[str, Any]]) -> Iterator[TimeseriesStandIn]:
    """A stand-in in front of the server at ``uri`` that holds ``collections`` as time-series collections."""
    hostport = uri.split("://", 1)[1].split("/", 1)[0].split(",")[0].rsplit("@", 1)[-1]
    host, _, port = hostport.rpartition(":")
    stand_in = TimeseriesStandIn(host, int(port), collections)
    stand_in.start()
    try:
        yield stand_in
    finally:
        stand_in.stop()
