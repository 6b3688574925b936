"""Kafka sink (``kafka://HOST:PORT[,HOST:PORT...]``): Debezium-compatible records through aiokafka.

Delivery: ``write(batch)`` encodes and hands records to the producer (acks=all, idempotent) and returns
only when the broker acknowledged every one of them, so the checkpoint never passes an unacknowledged
record. Records are keyed by document ``_id`` and placed by Kafka's default partitioner (computed here,
see ``partitioner.py``), so equal keys go to one partition: a document's events stay in order.

A broker that cannot be reached at ``start`` is :class:`SinkUnavailable` too, as an unreachable MongoDB
target is an outage: sync ends at once (exit 75), tail (or a run given ``--max-retries``) waits for it
with backoff under ``--max-retries``. An address that takes the connection but does not answer as a
Kafka broker (probe.py: a MongoDB port, a TLS listener asked in plain text) is a ConfigError (exit 2).

A broker outage pauses ``write``: the idempotent producer retries until the broker is back (a warning
is logged every 15 s meanwhile). Errors it does give up on (a full buffer, metadata unavailable) surface
as :class:`SinkUnavailable`, which the stream retries with backoff from the checkpoint (at-least-once:
records may repeat, none is lost); the producer is rebuilt before the next attempt. Errors retrying
cannot fix (authorization, a record over the broker's size limit) are :class:`SinkError`.

A record over ``max.request.size`` (1 MiB unless ``--kafka-opt`` says otherwise, like Kafka's own
default) stops the run with the document's topic and key, or is skipped and logged with ``--oversize skip``.

Errors are told in words (:func:`describe_error`), never as Python reprs; aiokafka's own error line for
each failed connection attempt is left to ``--verbose``, since the sink reports the outage itself.

Encoding runs in slices between sends, so the producer's sender ships the first records while the rest
of the batch is still being encoded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from replicator.errors import ConfigError, SinkError, SinkUnavailable
from replicator.events import ChangeEvent, Namespace, Position
from replicator.settings.config import Settings
from replicator.settings.uri import kafka_bootstrap, redact
from replicator.sinks.base import Sink, read_events
from replicator.sinks.kafka.options import producer_config
from replicator.sinks.kafka.partitioner import partition
from replicator.sinks.kafka.probe import speaks_another_protocol
from replicator.sinks.records.envelope import Encoder, Message

log = logging.getLogger("mcdc.sinks.kafka")

_SLICE = 512  # records encoded between two yields to the producer's sender
_STALL_WARN_S = 15.0
_RECORD_OVERHEAD = 128  # a record's framing in a batch, generously
_UNREACHABLE_HINT = "check that the broker is running and reachable from here, and that --target names its listener"
_REFUSED_HINT = "check --kafka-opt sasl.* / ssl.* and the ACLs of this client on the broker"
_REPR = re.compile(r"[\[\](){}<>'\"]")  # a message carrying a Python repr (of an address, a tuple, ...)


def _import_aiokafka() -> Any:
    try:
        import aiokafka
    except ImportError:
        raise ConfigError("the Kafka sink needs aiokafka: pip install 'mcdc[kafka]'") from None
    logging.getLogger("aiokafka").addFilter(_QUIET_CONNECT_ERRORS)
    return aiokafka


class _QuietConnectErrors(logging.Filter):
    """aiokafka logs an ERROR for each connection attempt that fails, with a tuple repr of the address
    (and one with a list of node ids when no broker answers for metadata); the sink reports an unreachable
    broker itself (and the run retries it), so these lines show only with --verbose (DEBUG)."""

    _NOISE = ("Unable connect to", "Unable to update metadata from")

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and str(record.msg).startswith(self._NOISE):
            return logging.getLogger("aiokafka").isEnabledFor(logging.DEBUG)
        return True


_QUIET_CONNECT_ERRORS = _QuietConnectErrors()  # one instance: addFilter adds it once however many sinks


class KafkaSink(Sink):
    """Writes each event batch as keyed records; acknowledged means acknowledged by all in-sync replicas."""

    schemes = ("kafka",)
    spreads = "document"  # a key's records keep their order: its events are in one task

    def __init__(self, uri: str, settings: Settings) -> None:
        self.uri = uri
        self._aiokafka = _import_aiokafka()
        self._config = producer_config(settings.kafka_opts, kafka_bootstrap(uri))
        self._timeout_s = settings.connect_timeout_s
        self.encoder = Encoder.from_settings(settings)
        self.marks_snapshot_end = settings.envelope == "debezium"
        self._producer: Any = None
        self._max_record = int(self._config.get("max_request_size", 1_048_576))
        self._oversize = settings.oversize
        self.skipped = 0
        self._lock = asyncio.Lock()
        self.records = 0

    async def start(self) -> None:
        """Connect; an unreachable broker is :class:`SinkUnavailable` (retried), a refusal :class:`SinkError`."""
        self.encoder.source_name = self.source_name
        await self._connect()

    async def _connect(self) -> None:
        producer = self._aiokafka.AIOKafkaProducer(**self._config)
        try:
            await asyncio.wait_for(producer.start(), self._timeout_s)
        except Exception as exc:  # aiokafka raises KafkaConnectionError, KafkaError, OSError, TimeoutError
            log.debug("starting the Kafka producer failed", exc_info=True)
            with contextlib.suppress(Exception):
                await producer.stop()
            reason = describe_error(exc, self._timeout_s)
            if self._fatal(exc):
                raise SinkError(f"Kafka {redact(self.uri)} refused the producer: {reason}; {_REFUSED_HINT}") from None
            other = await self._another_protocol()
            if other is not None:
                raise ConfigError(
                    f"Kafka {redact(self.uri)}: {other} answers, but not as a Kafka broker (another server's port, "
                    "or a TLS listener asked in plain text: --kafka-opt security.protocol=SSL); fix --target"
                ) from None
            raise SinkUnavailable(f"Kafka {redact(self.uri)} is unreachable: {reason}; {_UNREACHABLE_HINT}") from None
        self._producer = producer

    async def _another_protocol(self) -> str | None:
        """The first bootstrap address that takes a connection but does not speak Kafka (in plain text: a
        TLS listener is asked nothing), else None: the producer's failure is an outage."""
        if str(self._config.get("security_protocol", "PLAINTEXT")).upper() not in ("PLAINTEXT", "SASL_PLAINTEXT"):
            return None
        for address in self._config["bootstrap_servers"]:
            if await speaks_another_protocol(address, self._timeout_s):
                return str(address)
        return None

    async def write(self, batch: Sequence[ChangeEvent]) -> None:
        await self.send(self.encoder.iter_encode(batch))
        self.encoder.carried = None  # acknowledged: a transaction carried over is continued or ended

    def carry_transaction(self, tx_id: str, counts: Sequence[tuple[str, int]]) -> None:
        self.encoder.carried = (tx_id, tuple(counts))

    async def write_copy(
        self, ns: Namespace, documents: Sequence[Mapping[str, Any]], at: Position | None, *, last: bool = False
    ) -> None:
        await self.send(self.encoder.iter_copy(read_events(ns, documents, at), last=last))

    async def send(self, messages: Iterable[Message]) -> None:
        """Send records and wait until the broker acknowledged all of them.

        Records are appended to one batch per partition (aiokafka's batch API), in order; a full batch is
        handed to the producer at once, the rest at the end. That saves the per-record bookkeeping of
        ``producer.send``, and the partition is computed here (see ``partitioner.py``)."""
        producer = await self._ready()
        pending: list[asyncio.Future[Any]] = []
        partitions: dict[str, list[int]] = {}  # per topic, read once per call
        builders: dict[tuple[str, int], Any] = {}
        sent = 0
        try:
            for message in messages:
                topic, key, value = message.topic, message.key, message.value
                size = len(value or b"") + len(key or b"") + _RECORD_OVERHEAD
                if size > self._max_record:
                    self._too_large(message, size)
                    continue
                sent += 1
                if key is None:  # not made by the encoder; let the producer place it
                    pending.append(await producer.send(topic, value))
                    continue
                ids = partitions.get(topic)
                if ids is None:
                    ids = partitions[topic] = sorted(await producer.partitions_for(topic))
                part = ids[partition(key, len(ids))]
                builder = builders.get((topic, part))
                if builder is None:
                    builder = builders[(topic, part)] = producer.create_batch()
                if builder.append(key=key, value=value, timestamp=None) is None:  # full: ship it, start another
                    pending.append(await producer.send_batch(builder, topic, partition=part))
                    builder = builders[(topic, part)] = producer.create_batch()
                    builder.append(key=key, value=value, timestamp=None)  # an empty batch takes any record
                if sent % _SLICE == 0:
                    await asyncio.sleep(0)  # let the sender ship what is ready
            for (topic, part), builder in builders.items():
                if builder.record_count():
                    pending.append(await producer.send_batch(builder, topic, partition=part))
            await self._acknowledged(pending)
        except (asyncio.CancelledError, SinkError):
            raise
        except Exception as exc:
            for fut in pending:
                if fut.done() and not fut.cancelled():
                    fut.exception()  # retrieved: no "exception never retrieved" noise
            log.debug("Kafka send failed", exc_info=True)
            if isinstance(exc, self._aiokafka.errors.MessageSizeTooLargeError):
                raise SinkError(
                    "the broker refused a record as too large: raise its message.max.bytes (or the topic's "
                    "max.message.bytes), or lower --kafka-opt max.request.size so mcdc catches such records first"
                ) from None
            reason = describe_error(exc, self._timeout_s)
            if self._fatal(exc):
                raise SinkError(f"Kafka {redact(self.uri)} refused a record: {reason}; {_REFUSED_HINT}") from None
            await self._discard(producer)  # the retry starts with a fresh producer
            hint = ""
            if isinstance(exc, self._aiokafka.errors.UnknownTopicOrPartitionError):
                hint = " (a topic that does not exist: create it, or enable the broker's auto.create.topics.enable)"
            raise SinkUnavailable(f"Kafka {redact(self.uri)} did not take a batch: {reason}{hint}") from None
        self.records += sent

    def _too_large(self, message: Message, size: int) -> None:
        """A record over max.request.size: stop with a clear message, or (--oversize skip) log and skip it."""
        key = (message.key or b"")[:200].decode(errors="replace")
        what = f"the record for {message.topic} with key {key} is {size:,} bytes, over max.request.size"
        if self._oversize == "skip":
            log.warning("skipped %s (--oversize skip)", what)
            self.skipped += 1
            return
        raise SinkError(
            f"{what} ({self._max_record:,}): raise it with --kafka-opt max.request.size=N (and the broker's "
            "message.max.bytes), or pass --oversize skip to skip such records (each is logged)"
        )

    async def _ready(self) -> Any:
        """The producer, started once even when snapshot workers write at the same time."""
        async with self._lock:
            if self._producer is None:
                await self._connect()
            return self._producer

    async def _acknowledged(self, pending: list[asyncio.Future[Any]]) -> None:
        """Wait for every acknowledgement. An idempotent producer keeps retrying while the broker is away,
        so this is where an outage pauses the stream: say so every ``_STALL_WARN_S`` seconds."""
        started = time.monotonic()
        waiting = set(pending)
        while waiting:
            done, waiting = await asyncio.wait(waiting, timeout=_STALL_WARN_S)
            for fut in done:
                fut.result()  # raises the first failure
            if waiting:
                log.warning(
                    "Kafka %s has not acknowledged %d records for %.0f s; waiting (nothing is lost)",
                    redact(self.uri), len(waiting), time.monotonic() - started,
                )  # fmt: skip

    async def heartbeat(self) -> None:
        message = self.encoder.due_heartbeat()
        if message is not None:
            await self.send([message])

    async def flush(self) -> None:
        if self._producer is not None:
            await self._producer.flush()

    async def close(self) -> None:
        if self._producer is not None:
            producer, self._producer = self._producer, None
            try:
                await asyncio.wait_for(producer.stop(), self._timeout_s)
            except Exception:  # closing after a failure: nothing unacknowledged is counted as delivered
                log.debug("closing the Kafka producer failed", exc_info=True)

    async def _discard(self, producer: Any) -> None:
        """Drop a producer after a failure; the next write starts a fresh one (and re-sends)."""
        async with self._lock:
            if self._producer is not producer:
                return  # another writer already replaced it
            self._producer = None
        with contextlib.suppress(Exception):
            await asyncio.wait_for(producer.stop(), 5)

    def _fatal(self, exc: BaseException) -> bool:
        """Errors retrying cannot fix: authentication, authorization, a record too large, bad settings."""
        errors = self._aiokafka.errors
        fatal: tuple[type[BaseException], ...] = (
            errors.MessageSizeTooLargeError,
            errors.TopicAuthorizationFailedError,
            errors.ClusterAuthorizationFailedError,
            errors.UnsupportedVersionError,
            errors.InvalidTopicError,
        )
        auth = getattr(errors, "SaslAuthenticationFailed", None) or getattr(errors, "AuthenticationFailedError", None)
        if auth is not None:
            fatal = (*fatal, auth)
        return isinstance(exc, fatal)


def describe_error(exc: BaseException, timeout_s: float) -> str:
    """What went wrong, in words a user reads: a broker's answer by its Kafka error name and meaning,
    a timeout with its limit, an OS error by its reason; never a Python repr."""
    from aiokafka import errors

    if isinstance(exc, errors.KafkaConnectionError):
        return "could not connect to the broker"
    if isinstance(exc, errors.KafkaTimeoutError):
        return "timed out waiting for the broker (for metadata, or for room in the send buffer)"
    if isinstance(exc, errors.BrokerResponseError):
        meaning = exc.description.strip().rstrip(".")
        return f"the broker answered {exc.message}" + (f": {meaning}" if meaning else "")
    if isinstance(exc, TimeoutError):
        return f"no answer within {timeout_s:g} s"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    name = re.sub(r"(?<=[a-z])(?=[A-Z])", " ", type(exc).__name__).lower()  # NodeNotReadyError: node not ready error
    text = str(exc.args[0]).strip() if exc.args else ""
    return f"{name}: {text}" if text and not _REPR.search(text) else name
