"""The write concern of the target's commands: each command that writes carries the client's (mcdc's
durable ``{w: "majority", j: true}``, or the URI's own), and a write whose concern failed is not written.

The driver's own write methods (``bulk_write``, ``drop_collection``, ...) send the collection's write
concern and raise on its failure; a command sent with ``Database.command`` gets neither: no write concern
is added (the server then applies its default, ``w: 1`` before MongoDB 5.0), and a ``writeConcernError``
in the reply comes back without an exception. The commands mcdc builds itself go through here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pymongo.errors import OperationFailure
from pymongo.write_concern import WriteConcern

from replicator.errors import SinkError, SinkUnavailable
from replicator.events import Namespace
from replicator.source.retry import is_retryable

#: WriteConcernFailed: the write concern's wtimeout passed before enough members had the writes
_WRITE_CONCERN_TIMEOUT = 64


def with_concern(command: dict[str, Any], concern: WriteConcern) -> dict[str, Any]:
    """``command``, carrying ``concern`` (none for the server's default, as the driver sends it)."""
    if not concern.is_server_default:
        command["writeConcern"] = concern.document
    return command


def concern_failed(ns: Namespace, error: Mapping[str, Any]) -> SinkError:
    """A batch the target applied but did not acknowledge with its write concern (a ``writeConcernError``):
    it is not written. It is written again (idempotently) where waiting can satisfy the concern: a
    ``wtimeout`` that passed while replication lagged, an election; any other (a mode the target does not
    know, more members than it has) stops the run, in one line."""
    code = error.get("code")
    message = str(error.get("errmsg") or "").splitlines()[0][:300] if error.get("errmsg") else ""
    which = f"code {code} {error.get('codeName') or ''}".rstrip()
    text = f"writing into {ns}: the target did not satisfy the write concern ({which}: {message})"
    if code == _WRITE_CONCERN_TIMEOUT or is_retryable(OperationFailure(message, code, dict(error))):
        return SinkUnavailable(f"{text}; writing the batch again")
    return SinkError(text)


def check_reply(ns: Namespace, reply: Mapping[str, Any]) -> None:
    """Raise :func:`concern_failed` when a command's reply says its write concern failed."""
    error = reply.get("writeConcernError")
    if error:
        raise concern_failed(ns, error)
