"""A TCP proxy in front of a MongoDB-compatible server that can make it "forget" to answer.

It forwards wire-protocol messages both ways (each framed by its int32 length). After
:meth:`WireProxy.swallow_reply` with a marker (e.g. ``b"insert\\x00"``, the command's first key as a BSON
cstring), the next request holding the marker is passed on, the server executes it, and its reply is
dropped: the connection stays open and idle, as a server that took a write and never answered leaves it
(a restarted server, a black-holing network). Everything else passes untouched.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator

from tests.support.servers import free_port


async def _message(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readexactly(4)
    return head + await reader.readexactly(int.from_bytes(head, "little") - 4)


class WireProxy:
    """Runs in a thread of its own; ``uri`` reaches the server through it."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.port = free_port()
        self.swallowed = 0
        #: set once a reply was swallowed; ``swallowed_from`` is the (host, port) of the client it was owed to
        self.swallowed_event = threading.Event()
        self.swallowed_from: tuple[str, int] | None = None
        self._marker: bytes | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None

    @property
    def uri(self) -> str:
        return f"mongodb://127.0.0.1:{self.port}/?directConnection=true"

    def swallow_reply(self, marker: bytes) -> None:
        """Drop the reply to the next request holding ``marker`` (once)."""
        self._marker = marker

    def _take_marker(self, message: bytes) -> bool:
        if self._marker is not None and self._marker in message:
            self._marker = None
            return True
        return False

    async def _pipe(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(*self.upstream)
        drop = asyncio.Event()

        async def up() -> None:
            while True:
                message = await _message(client_r)
                if self._take_marker(message):
                    drop.set()
                    self.swallowed_from = client_w.get_extra_info("peername")[:2]
                server_w.write(message)
                await server_w.drain()

        async def down() -> None:
            while True:
                message = await _message(server_r)
                if drop.is_set():
                    drop.clear()
                    self.swallowed += 1
                    self.swallowed_event.set()
                    continue
                client_w.write(message)
                await client_w.drain()

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

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@contextlib.contextmanager
def wire_proxy(uri: str) -> Iterator[WireProxy]:
    """A proxy in front of the server at ``uri`` (host and port of its first seed)."""
    hostport = uri.split("://", 1)[1].split("/", 1)[0].split(",")[0]
    host, _, port = hostport.rpartition(":")
    proxy = WireProxy(host, int(port))
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()
