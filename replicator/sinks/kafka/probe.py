"""Does a bootstrap address speak Kafka? Asked only once the producer failed to start, to tell an outage
(exit 75: try again later) from a URI that names another kind of server (exit 2: a person must fix it).

A Kafka broker answers an ApiVersions request (version 0, which every broker since 0.10 takes, SASL
listeners included, before authentication) with a response whose correlation id is the request's. A
server of another protocol (MongoDB's port, say) closes the connection or answers something else. A TLS
listener asked in plain text does too: that is a mistake in the options, not an outage, as well.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct

_API_VERSIONS = 18
_CORRELATION = 0x6D636463  # "mcdc"
_CLIENT = b"mcdc-probe"
#: a response larger than this is no ApiVersions answer (its length read from another protocol's bytes)
_MOST = 1 << 20


def api_versions_request() -> bytes:
    """An ApiVersions v0 request, framed (its size first)."""
    body = struct.pack(">hhih", _API_VERSIONS, 0, _CORRELATION, len(_CLIENT)) + _CLIENT
    return struct.pack(">i", len(body)) + body


def answers_as_kafka(reply: bytes) -> bool:
    """Is ``reply`` (the first bytes read back) the beginning of an answer to :func:`api_versions_request`?"""
    if len(reply) < 8:
        return False
    size, correlation = struct.unpack(">ii", reply[:8])
    return bool(4 <= size <= _MOST and correlation == _CORRELATION)


async def speaks_another_protocol(address: str, timeout_s: float) -> bool:
    """True when ``HOST:PORT`` takes a connection but does not answer as a Kafka broker. False when it
    answers as one, or cannot be reached at all (refused, no route, no answer in time: an outage)."""
    host, _, port = address.rpartition(":")
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host.strip("[]"), int(port)), timeout_s)
    except (OSError, TimeoutError, ValueError):
        return False
    try:
        writer.write(api_versions_request())
        await writer.drain()
        reply = await asyncio.wait_for(reader.read(8), timeout_s)
    except TimeoutError:
        return False  # connected but silent: a broker too busy to answer is an outage, not a mistake
    except OSError:
        reply = b""  # reset as soon as it read the request: another protocol's server
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    return not answers_as_kafka(reply)
