"""MongoDB's ``failCommand`` fail point, as its driver tests arm it: errors, closed connections, write
concern errors and slow answers on chosen commands, for a number of times or until turned off.

The test servers run with ``--enable-test-commands`` (tests/support/servers.py), as mongod must for
``configureFailPoint``; a fail point is server-wide, so it strikes mcdc's connections and any other.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pymongo

#: the commands a target's writes go through: documents, transactions and DDL
TARGET_WRITES = (
    "insert",
    "update",
    "delete",
    "commitTransaction",
    "create",
    "drop",
    "dropDatabase",
    "renameCollection",
    "createIndexes",
    "dropIndexes",
    "collMod",
)
#: the commands a source's reads go through
SOURCE_READS = ("aggregate", "getMore", "find", "listCollections")

#: the errors MongoDB's drivers are tested against on writes: (what, failCommand data)
NOT_WRITABLE_PRIMARY = 10107
PRIMARY_STEPPED_DOWN = 189
SHUTDOWN_IN_PROGRESS = 91
INTERRUPTED_AT_SHUTDOWN = 11600
EXCEEDED_TIME_LIMIT = 262
WRITE_CONCERN_TIMEOUT = 64
HOST_UNREACHABLE = 6
CURSOR_NOT_FOUND = 43


@dataclass(frozen=True)
class Fault:
    """One ``failCommand`` configuration: what happens to the matching commands."""

    name: str  # a label for messages: "error 10107", "closeConnection", "writeConcernError 64", "block 2000 ms"
    data: dict[str, Any] = field(default_factory=dict)

    def on(self, commands: Sequence[str]) -> dict[str, Any]:
        """The fail point's ``data`` for ``commands``."""
        return {"failCommands": list(commands), **self.data}


def error(code: int) -> Fault:
    """The command fails with ``code`` (and the labels mongod attaches to it)."""
    return Fault(f"error {code}", {"errorCode": code})


def close_connection() -> Fault:
    """The server closes the connection instead of answering."""
    return Fault("closeConnection", {"closeConnection": True})


def write_concern_error(code: int) -> Fault:
    """The write is applied, and its reply carries a ``writeConcernError`` with ``code``."""
    names = {WRITE_CONCERN_TIMEOUT: "WriteConcernFailed", SHUTDOWN_IN_PROGRESS: "ShutdownInProgress"}
    wce: dict[str, Any] = {"code": code, "codeName": names.get(code, "Error"), "errmsg": f"injected ({code})"}
    if code == WRITE_CONCERN_TIMEOUT:
        wce["errInfo"] = {"wtimeout": True}
    return Fault(f"writeConcernError {code}", {"writeConcernError": wce})


def block(ms: int) -> Fault:
    """The command answers, ``ms`` milliseconds late."""
    return Fault(f"block {ms} ms", {"blockConnection": True, "blockTimeMS": ms})


#: the faults of the target's writes (issue 40's list)
WRITE_FAULTS = (
    close_connection(),
    error(NOT_WRITABLE_PRIMARY),
    error(PRIMARY_STEPPED_DOWN),
    error(SHUTDOWN_IN_PROGRESS),
    error(INTERRUPTED_AT_SHUTDOWN),
    error(EXCEEDED_TIME_LIMIT),
    write_concern_error(WRITE_CONCERN_TIMEOUT),
    write_concern_error(SHUTDOWN_IN_PROGRESS),
    block(1500),
)
#: the faults of the source's reads: the same errors (a write concern error cannot strike a read), plus
#: HostUnreachable and CursorNotFound
READ_FAULTS = (
    *(fault for fault in WRITE_FAULTS if "writeConcern" not in fault.name),
    error(HOST_UNREACHABLE),
    error(CURSOR_NOT_FOUND),
)


def _admin(uri: str) -> pymongo.MongoClient[dict[str, Any]]:
    # its own client, never the one under test: a closeConnection must not strike the arming itself
    return pymongo.MongoClient(uri, serverSelectionTimeoutMS=10_000, appname="mcdc-tests-failpoint")


#: the application name of mcdc's clients (replicator/source/connection.py): a fail point armed for it strikes
#: mcdc alone, not the test's own clients writing the workload or comparing
MCDC_APP = "mcdc"


def arm(
    uri: str,
    fault: Fault,
    commands: Sequence[str],
    *,
    times: int | None = None,
    app: str | None = MCDC_APP,
    skip: int = 0,
) -> None:
    """Arm ``fault`` on ``commands`` of the server at ``uri``: for the next ``times`` matching commands, or
    until :func:`disarm` (None); only on clients whose application name is ``app`` (None: every client);
    ``skip``: the first ``skip`` matching commands go through."""
    mode: Any = "alwaysOn" if times is None else {"times": times}
    if skip:
        mode = {"skip": skip} | ({} if times is None else {"times": times})
    data = fault.on(commands) | ({"appName": app} if app else {})
    with _admin(uri) as client:
        client.admin.command("configureFailPoint", "failCommand", mode=mode, data=data)


def disarm(uri: str) -> None:
    """Turn the ``failCommand`` fail point off."""
    with _admin(uri) as client:
        client.admin.command("configureFailPoint", "failCommand", mode="off")


@contextmanager
def failing(
    uri: str, fault: Fault, commands: Sequence[str], *, times: int | None = None, app: str | None = MCDC_APP
) -> Iterator[None]:
    """:func:`arm` for the block, then :func:`disarm` (whatever the block raised)."""
    arm(uri, fault, commands, times=times, app=app)
    try:
        yield
    finally:
        disarm(uri)
