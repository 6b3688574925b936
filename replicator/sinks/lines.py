"""JSON-lines sinks: ``--target stdout`` (or ``-``) and ``--target jsonl:PATH``.

Each record the Kafka sink would send becomes one line, ``{"topic": ..., "key": {...}, "value": {...}}``
(``--envelope``, ``--schemas`` and friends apply as for Kafka); tombstones, which only serve Kafka's log
compaction, are left out. With ``--format plain`` a line is mcdc's own event, which carries its key.

A batch is written whole (one writer at a time) and flushed before ``write`` returns; a file is also
fsync'd, so the checkpoint never passes a line that is not on disk. When the reader of stdout goes
away (``mcdc tail --target - | head``) the run stops quietly with exit 0 (:class:`OutputClosed`); the
batch it was writing is not acknowledged.

At start, a file whose last line was cut short by a crash is truncated back to its last whole line
(that line's batch was never acknowledged, so it is written again).

A file is one destination for every namespace, and it belongs to the checkpoint that wrote it: catch-up,
tail, a resumed snapshot, even a new snapshot under that checkpoint append to it. A run that starts a
new checkpoint and would snapshot into a file that already holds records is refused, as a MongoDB
target holding data is (the two snapshots would mix); with ``--drop-target`` the file is truncated
first, and the log says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from replicator.errors import ConfigError, OutputClosed, SinkError, SinkUnavailable
from replicator.events import ChangeEvent, CollectionSpec, Namespace, Position
from replicator.settings.config import Settings
from replicator.sinks.base import Sink, read_events
from replicator.sinks.records.envelope import Encoder, Message

log = logging.getLogger("mcdc.sinks.lines")

_TRANSIENT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EAGAIN})


class LineSink(Sink):
    """Writes one JSON document per line to stdout or to a file."""

    schemes = ("stdout", "jsonl")

    def __init__(self, uri: str, settings: Settings) -> None:
        self.path: Path | None = None
        if uri.lower().startswith("jsonl:"):
            self.path = Path(uri[len("jsonl:") :]).expanduser()
        self.encoder = Encoder.from_settings(settings)
        self._plain = settings.envelope == "plain"
        self.marks_snapshot_end = settings.envelope == "debezium"
        topics = self.encoder.topics
        self._meta_topics = frozenset({topics.transaction, topics.heartbeat})
        self._fd: int | None = None
        self._lock = asyncio.Lock()
        self.lines = 0
        self._drop_target = settings.drop_target
        # read before this run saves anything: does the file go on under the checkpoint that wrote it?
        self._new_checkpoint = not settings.checkpoint_path().exists()

    async def start(self) -> None:
        self.encoder.source_name = self.source_name
        if self.path is None:
            self._fd = sys.stdout.fileno()
            return
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
            _cut_partial_line(self._fd)
        except OSError as exc:
            raise ConfigError(f"--target jsonl:{self.path}: cannot open for writing: {exc.strerror}") from None

    async def existing(self, namespaces: Sequence[Namespace]) -> list[Namespace]:
        """A file is one destination for all namespaces: when it holds records and a new checkpoint meets it,
        the file itself is what holds data (any snapshot into it would mix), and it is named as such."""
        if self.path is None or self._fd is None or not self._new_checkpoint:
            return []
        records = await asyncio.to_thread(_count_lines, self._fd)
        if records:
            log.info("%s holds %s records of an earlier run (another checkpoint)", self.path, f"{records:,}")
            return [Namespace(str(self.path))]
        return []

    async def prepare(self, specs: Sequence[CollectionSpec], *, drop_existing: bool) -> None:
        """With ``--drop-target``, a run that starts a new checkpoint starts the file anew: truncated. Under
        the checkpoint that wrote the file (a resumed snapshot preparing the namespaces created since it
        began, a new snapshot after the stream's history was lost) its records stay."""
        fd = self._fd
        if not (drop_existing and self._drop_target and self._new_checkpoint and specs and self.path):
            return
        if fd is None or not os.fstat(fd).st_size:
            return
        async with self._lock:
            records = await asyncio.to_thread(_truncate, fd)
        log.warning("truncated %s (--drop-target): %s records of an earlier run removed", self.path, f"{records:,}")

    async def write(self, batch: Sequence[ChangeEvent]) -> None:
        await self._write(self.encoder.iter_encode(batch))
        self.encoder.carried = None  # acknowledged: a transaction carried over is continued or ended

    def carry_transaction(self, tx_id: str, counts: Sequence[tuple[str, int]]) -> None:
        self.encoder.carried = (tx_id, tuple(counts))

    async def write_copy(
        self, ns: Namespace, documents: Sequence[Mapping[str, Any]], at: Position | None, *, last: bool = False
    ) -> None:
        await self._write(self.encoder.iter_copy(read_events(ns, documents, at), last=last))

    async def heartbeat(self) -> None:
        message = self.encoder.due_heartbeat()
        if message is not None:
            await self._write([message])

    async def _write(self, messages: Iterable[Message]) -> None:
        if self._plain:
            lines = [m.value for m in messages if m.value is not None and m.topic not in self._meta_topics]
        else:
            lines = [_record(m) for m in messages if m.value is not None]
        if not lines:
            return
        data = b"\n".join(lines) + b"\n"
        async with self._lock:
            await asyncio.to_thread(self._write_all, data)
        self.lines += len(lines)

    def _write_all(self, data: bytes) -> None:
        fd = self._fd
        assert fd is not None, "start() first"
        start = os.lseek(fd, 0, os.SEEK_END) if self.path is not None else 0
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(fd, view) :]
            if self.path is not None:
                os.fsync(fd)
        except BrokenPipeError:
            _silence_stdout()
            raise OutputClosed("the reader of stdout went away") from None
        except OSError as exc:
            if self.path is None:
                raise SinkError(f"cannot write to stdout: {exc.strerror}") from None
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)  # no half batch: the retry writes it whole
            if exc.errno in _TRANSIENT_ERRNOS:  # a full disk can be freed: retried with backoff
                raise SinkUnavailable(f"cannot write to {self.path}: {exc.strerror}") from None
            raise SinkError(f"cannot write to {self.path}: {exc.strerror}") from None

    async def close(self) -> None:
        if self._fd is not None and self.path is not None:
            os.close(self._fd)
        self._fd = None


def _record(m: Message) -> bytes:
    assert m.value is not None
    return b'{"topic":' + orjson.dumps(m.topic) + b',"key":' + (m.key or b"null") + b',"value":' + m.value + b"}"


def _count_lines(fd: int) -> int:
    count, offset = 0, 0
    while chunk := os.pread(fd, 1 << 20, offset):
        count += chunk.count(b"\n")
        offset += len(chunk)
    return count


def _truncate(fd: int) -> int:
    """Empty the file (durably); the number of records it held."""
    records = _count_lines(fd)
    os.ftruncate(fd, 0)
    os.fsync(fd)
    return records


def _cut_partial_line(fd: int) -> None:
    """Truncate a file back to its last newline (a crash can leave half a line)."""
    size = os.fstat(fd).st_size
    if size == 0:
        return
    pos = size
    while pos > 0:
        start = max(0, pos - 65536)
        chunk = os.pread(fd, pos - start, start)
        newline = chunk.rfind(b"\n")
        if newline >= 0:
            end = start + newline + 1
            if end != size:
                os.ftruncate(fd, end)
            return
        pos = start
    os.ftruncate(fd, 0)


def _silence_stdout() -> None:
    """After EPIPE, point stdout at /dev/null so the interpreter's final flush does not complain."""
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
