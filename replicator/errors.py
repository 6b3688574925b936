"""The exception hierarchy.

Every error a user can cause or fix derives from :class:`McdcError`; the CLI prints its message on one
line and exits with its ``exit_code``. Anything else is a bug and keeps its traceback.

::

    McdcError                      exit 2 unless stated
    ├── ConfigError                bad flag, bad regex, bad rename, bad TOML, source == target
    ├── ConnectionFailed           source/target refusing us (credentials, a URI it cannot use)
    ├── ServerUnavailable          source/target unreachable, or an outage outlived --max-retries (exit 75)
    ├── TopologyError              e.g. a standalone source without --snapshot-only
    ├── CheckpointError            unreadable, corrupt or unwritable checkpoint
    │   └── CheckpointLocked       another run holds the checkpoint (exit 3)
    ├── HistoryLost                resume position fell off the oplog (exit 4)
    ├── OversizeEvent              a change event over 16 MB the server cannot split
    ├── UnknownChange              a change to documents of a kind this mcdc does not know
    ├── SinkError                  the sink refused a write it cannot retry
    │   └── SinkUnavailable        the destination is down for now (retried with backoff; exit 75)
    ├── OutputClosed               the reader of --target stdout went away (exit 0, quietly)
    ├── DevServerError             mcdc dev-server cannot start its server, or the server stopped
    └── VerifyMismatch             verify found differences (exit 1)
"""

from __future__ import annotations


class McdcError(Exception):
    """Base of every error that is the user's to fix; carries the process exit code."""

    exit_code = 2


class ConfigError(McdcError):
    """Invalid configuration: a flag, environment variable or config file value."""


#: An outage: a server could not be reached, or stayed away longer than --max-retries allowed. Worth
#: running again later, unlike exit 2 (a mistake a person must fix). sysexits.h's EX_TEMPFAIL.
EXIT_UNAVAILABLE = 75


class ConnectionFailed(McdcError):
    """A server refused us: bad credentials, or a connection string it cannot use."""


class ServerUnavailable(McdcError):
    """A server could not be reached (or stayed unreachable through the retries): an outage, not a mistake."""

    exit_code = EXIT_UNAVAILABLE


class TopologyError(McdcError):
    """The source's topology cannot give what the command needs."""


class CheckpointError(McdcError):
    """The checkpoint file cannot be read, parsed or written."""


class CheckpointLocked(CheckpointError):
    """Another mcdc process holds the lock on this checkpoint."""

    exit_code = 3


class HistoryLost(McdcError):
    """The saved stream position is no longer in the source's oplog."""

    exit_code = 4


class OversizeEvent(McdcError):
    """A change event over 16 MB stopped the stream (see --oversize)."""


class UnknownChange(McdcError):
    """The change stream reported a document change of an operationType this mcdc cannot apply."""


class SinkError(McdcError):
    """A sink rejected a write that retrying cannot fix."""


class SinkUnavailable(SinkError, ConnectionError):
    """The destination cannot be reached right now; a ConnectionError, so the stream retries it."""

    exit_code = EXIT_UNAVAILABLE


class DevServerError(McdcError):
    """``mcdc dev-server``'s server is not installed, cannot start (port, directory), or died."""


class OutputClosed(McdcError):
    """The process reading our output closed it (``mcdc tail --target - | head``): stop, quietly."""

    exit_code = 0


class VerifyMismatch(McdcError):
    """Source and target differ."""

    exit_code = 1


class CutoverRefused(McdcError):
    """cutover did not prove the target identical to the source: not cut over."""

    exit_code = 1


class SourceNotQuiet(McdcError):
    """cutover saw writes to the selection after its cutover point: the proof is stale, not cut over."""

    exit_code = 5


def quoted(value: object) -> str:
    """``value`` quoted for a message as the user typed it: 'ap\\.users', not repr's 'ap\\\\.users'."""
    text = str(value)
    return f'"{text}"' if "'" in text and '"' not in text else f"'{text}'"
