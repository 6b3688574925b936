"""Run a local Kafka-protocol broker for tests, and read back what was written to it.

No real Kafka can be installed on the development machines, so this module starts noida-db
(``pip install noida-db==0.2.3``), one small binary that speaks the Kafka protocol well enough for aiokafka:
topics with partitions, auto-created topics, ``acks=all``, idempotent producers, consumer groups, null-value
tombstones and headers.  Set ``MCDC_TEST_KAFKA_BOOTSTRAP`` to ``host:port`` of a real broker to run the same
tests against it instead; nothing is started then, and tests that stop or restart the broker skip.

Behaviour of noida-db 0.2.3 worth knowing (measured, see tests/test_kafka_support.py):

* Its whole state is one JSON file, ``<data dir>/kafka.json``, rewritten about once a second.  SIGTERM
  writes it out before exiting (in ~40 ms), so :meth:`KafkaBroker.stop` + :meth:`KafkaBroker.start` keep
  every acknowledged record, committed offset and topic, when no request is in flight.
* SIGTERM *while a producer writes* loses records it acknowledged around the shutdown, which a Kafka broker
  never does (measured: of 40k-100k records a producer had acknowledged, sending without pause, 1k-14k were
  gone after the restart, in 10 trials of 10; none lost after 50 ms without requests).  To restart it under
  a writer, pause the writer first, as the chaos harness does.
* SIGKILL (:meth:`KafkaBroker.kill`) loses whatever was acknowledged since the last rewrite, up to ~1 s of
  ``acks=all`` writes; an idempotent producer that wrote some of them then fails every later send with
  ``OutOfOrderSequenceNumber``.
* Topics and consumer groups can be deleted; deleting a topic leaves the groups' committed offsets for it.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import socket
import stat
import struct
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import for_code
from aiokafka.protocol.admin import DeleteGroupsRequest

from tests.support.process import ManagedProcess
from tests.support.servers import free_port

BOOTSTRAP_ENV = "MCDC_TEST_KAFKA_BOOTSTRAP"
BROKER_PACKAGE = "noida_db"
BROKER_BINARY = "noida-db"
LOG_NAME = "noida-db.log"

_GROUP_ID_NOT_FOUND = 69


def external_bootstrap() -> str | None:
    """``host:port`` of an externally run broker named by ``MCDC_TEST_KAFKA_BOOTSTRAP``, if set."""
    return os.environ.get(BOOTSTRAP_ENV) or None


def find_executable() -> str:
    """Path of the noida-db binary inside the installed ``noida_db`` package, made executable if pip did not."""
    spec = importlib.util.find_spec(BROKER_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        binary = Path(location) / BROKER_BINARY
        if binary.is_file():
            if not os.access(binary, os.X_OK):
                binary.chmod(binary.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
            return str(binary)
    where = f"in {locations}" if locations else "(package noida_db is not installed)"
    raise RuntimeError(
        f"{BROKER_BINARY} binary not found {where}: pip install noida-db==0.2.3 "
        f"(or set {BOOTSTRAP_ENV} to a running Kafka broker)"
    )


def _kafka_string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack(">h", len(raw)) + raw


def probe_metadata(host: str, port: int, timeout: float = 1.0) -> list[tuple[int, str, int]]:
    """Send one Kafka Metadata (v1, all topics) request and return the brokers it lists as (id, host, port).

    A blocking socket, so it works both inside and outside a running event loop; raises OSError if the
    broker does not answer a well-formed response.
    """
    correlation_id = 0x6D636463
    header = struct.pack(">hhi", 3, 1, correlation_id) + _kafka_string("mcdc-tests")
    request = header + struct.pack(">i", -1)  # null topic array: every topic
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(struct.pack(">i", len(request)) + request)
        (size,) = struct.unpack(">i", _recv_exactly(sock, 4))
        body = _recv_exactly(sock, size)
    (answered_id, count) = struct.unpack_from(">ii", body, 0)
    if answered_id != correlation_id:
        raise OSError(f"metadata response for correlation id {answered_id}, expected {correlation_id}")
    brokers: list[tuple[int, str, int]] = []
    offset = 8
    for _ in range(count):
        (node_id, host_len) = struct.unpack_from(">ih", body, offset)
        offset += 6
        broker_host = body[offset : offset + host_len].decode()
        offset += host_len
        (broker_port, rack_len) = struct.unpack_from(">ih", body, offset)
        offset += 6 + max(rack_len, 0)
        brokers.append((node_id, broker_host, broker_port))
    return brokers


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(size - len(chunks))
        if not chunk:
            raise OSError("connection closed mid-response")
        chunks += chunk
    return bytes(chunks)


class KafkaBroker(ManagedProcess):
    """One noida-db Kafka broker on 127.0.0.1 keeping its data in ``data_dir``, or an external broker.

    The port is chosen once, so :meth:`restart` brings the broker back at the same bootstrap address over
    the same data.  Output goes to ``<data_dir>/noida-db.log``.  With ``bootstrap`` given (see :meth:`from_env`)
    nothing is started: :meth:`start` only waits until that broker answers, :meth:`stop` does nothing and
    :meth:`spawn`/:meth:`kill`/:meth:`restart` raise.  The process handling is :class:`ManagedProcess`'s:
    :meth:`stop` sends SIGTERM, on which the broker writes its data out before exiting; :meth:`kill` sends
    SIGKILL, as a crash would, losing the writes acknowledged in the last ~1 s.
    """

    kind = "broker"
    readiness = "answer a metadata request"
    probe_errors = (OSError, struct.error)
    poll_interval = 0.02

    def __init__(
        self,
        data_dir: Path | None = None,
        port: int | None = None,
        *,
        bootstrap: str | None = None,
        startup_timeout: float = 20.0,
    ) -> None:
        if (data_dir is None) == (bootstrap is None):
            raise ValueError("give either data_dir (start a local broker) or bootstrap (an external one)")
        self._external = bootstrap
        self.data_dir = Path(data_dir) if data_dir is not None else None
        if bootstrap is not None:
            host, _, port_text = bootstrap.split(",")[0].strip().rpartition(":")
            super().__init__(host or "127.0.0.1", int(port_text), None, startup_timeout=startup_timeout)
        else:
            assert self.data_dir is not None
            port = port if port is not None else free_port()
            super().__init__("127.0.0.1", port, self.data_dir / LOG_NAME, startup_timeout=startup_timeout)

    @classmethod
    def from_env(cls, data_dir: Path, *, startup_timeout: float = 20.0) -> KafkaBroker:
        """The external broker named by ``MCDC_TEST_KAFKA_BOOTSTRAP`` if set, else a local one in ``data_dir``."""
        bootstrap = external_bootstrap()
        if bootstrap is not None:
            return cls(bootstrap=bootstrap, startup_timeout=startup_timeout)
        return cls(data_dir, startup_timeout=startup_timeout)

    @property
    def external(self) -> bool:
        """Whether the broker runs elsewhere (and so cannot be stopped, killed or restarted here)."""
        return self._external is not None

    @property
    def bootstrap(self) -> str:
        """``bootstrap_servers`` for aiokafka: ``127.0.0.1:PORT``, or the external address as given."""
        return self._external if self._external is not None else f"{self.host}:{self.port}"

    @property
    def name(self) -> str:
        """``broker on port PORT``, or ``broker at <bootstrap>`` when external, naming it in messages."""
        return f"{self.kind} at {self.bootstrap}" if self.external else super().name

    @property
    def cwd(self) -> Path | None:
        """The data directory."""
        return self.data_dir

    def argv(self) -> list[str]:
        """``noida-db start`` with only its Kafka protocol, serving ``data_dir`` on ``host:port``."""
        assert self.data_dir is not None
        args = [find_executable(), "start", "--data-dir", str(self.data_dir), "--host", self.host]
        return [*args, "--only", "kafka", "--kafka-port", str(self.port)]

    def prepare(self) -> None:
        """Create the data directory."""
        assert self.data_dir is not None
        self.data_dir.mkdir(parents=True, exist_ok=True)

    def probe(self) -> None:
        """Return once the broker answers a Kafka metadata request listing a broker; raise OSError until then."""
        if not probe_metadata(self.host, self.port, timeout=0.5):
            raise OSError("metadata response lists no broker")

    def __repr__(self) -> str:
        if self.external:
            return f"KafkaBroker(bootstrap={self.bootstrap!r})"
        return f"KafkaBroker(data_dir={str(self.data_dir)!r}, port={self.port})"


@dataclass(frozen=True)
class Record:
    """One record read back from a topic."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp: int


def _admin(bootstrap: str) -> AIOKafkaAdminClient:
    return AIOKafkaAdminClient(bootstrap_servers=bootstrap, client_id="mcdc-tests")


async def _partitions(bootstrap: str) -> dict[str, list[int]]:
    """Partition ids of every topic but the internal ones, by topic name."""
    admin = _admin(bootstrap)
    await admin.start()
    try:
        described = await admin.describe_topics()
    finally:
        await admin.close()
    return {
        topic["topic"]: sorted(partition["partition"] for partition in topic["partitions"])
        for topic in described
        if not topic["is_internal"] and not topic["error_code"]
    }


async def list_topics(bootstrap: str) -> set[str]:
    """Names of every topic but the internal ones (``__consumer_offsets``, ``__transaction_state``)."""
    return set(await _partitions(bootstrap))


async def create_topic(bootstrap: str, name: str, partitions: int, *, timeout_s: float = 10.0) -> None:
    """Create ``name`` with ``partitions`` partitions (replication 1) and wait until metadata shows them all.

    Raises aiokafka's error for a failure, e.g. ``TopicAlreadyExistsError`` (aiokafka only returns it).
    """
    admin = _admin(bootstrap)
    await admin.start()
    try:
        response = await admin.create_topics([NewTopic(name, partitions, 1)])
        for _topic, code, *rest in response.topic_errors:
            if code:
                raise for_code(code)(rest[0] if rest and rest[0] else name)
        deadline = time.monotonic() + timeout_s
        while True:
            described = await admin.describe_topics([name])
            if described and not described[0]["error_code"] and len(described[0]["partitions"]) == partitions:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"topic {name!r} did not show {partitions} partitions within {timeout_s} s")
            await asyncio.sleep(0.05)
    finally:
        await admin.close()


async def delete_topics(bootstrap: str, names: Iterable[str] | None = None, *, timeout_s: float = 10.0) -> list[str]:
    """Delete ``names`` (default: every non-internal topic), wait until they are gone, return what was deleted."""
    targets = sorted(await list_topics(bootstrap) if names is None else set(names))
    if not targets:
        return []
    admin = _admin(bootstrap)
    await admin.start()
    try:
        await admin.delete_topics(targets)
    finally:
        await admin.close()
    deadline = time.monotonic() + timeout_s
    while remaining := set(targets) & await list_topics(bootstrap):
        if time.monotonic() > deadline:
            raise TimeoutError(f"topics {sorted(remaining)} still listed {timeout_s} s after deletion")
        await asyncio.sleep(0.05)
    return targets


async def delete_consumer_groups(bootstrap: str) -> list[str]:
    """Delete every consumer group (their committed offsets outlive a topic's deletion); return their ids.

    aiokafka's admin client has no ``delete_consumer_groups``, so this sends DeleteGroups (API 42) itself.
    """
    admin = _admin(bootstrap)
    await admin.start()
    try:
        groups = sorted(group_id for group_id, _protocol in await admin.list_consumer_groups())
        if not groups:
            return []
        response = await admin._send_request(DeleteGroupsRequest(groups))
        for group_id, code in response.results:
            if code and code != _GROUP_ID_NOT_FOUND:
                raise for_code(code)(f"deleting consumer group {group_id!r}")
        return groups
    finally:
        await admin.close()


async def consume_all(bootstrap: str, topics: list[str] | None = None, *, timeout_s: float = 10.0) -> list[Record]:
    """Every record of ``topics`` (default: every non-internal topic) from the start to the end offsets.

    The end offsets are measured once, when called: records written afterwards are left out, and this
    raises TimeoutError if the records up to them cannot all be read within ``timeout_s``.  A topic that
    does not exist contributes nothing (and is not created).  Records come sorted by (topic, partition,
    offset), so each partition's are in offset order.  No consumer group is used or committed to.
    """
    existing = await _partitions(bootstrap)
    wanted = sorted(existing if topics is None else set(topics) & set(existing))
    partitions = [TopicPartition(topic, partition) for topic in wanted for partition in existing[topic]]
    if not partitions:
        return []
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        client_id="mcdc-tests",
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        ends = await consumer.end_offsets(partitions)
        starts = await consumer.beginning_offsets(partitions)
        pending = {tp for tp in partitions if ends[tp] > starts[tp]}
        records: list[Record] = []
        if not pending:
            return records
        consumer.assign(sorted(pending))
        await consumer.seek_to_beginning(*pending)
        deadline = time.monotonic() + timeout_s
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                progress = {f"{tp.topic}[{tp.partition}]": (await consumer.position(tp), ends[tp]) for tp in pending}
                raise TimeoutError(f"read (position, end) {progress} of records within {timeout_s} s")
            batches = await consumer.getmany(*pending, timeout_ms=int(min(remaining, 0.5) * 1000))
            for tp, batch in batches.items():
                for message in batch:
                    if message.offset < ends[tp]:
                        records.append(
                            Record(
                                topic=message.topic,
                                partition=message.partition,
                                offset=message.offset,
                                key=message.key,
                                value=message.value,
                                headers=tuple((name, bytes(value)) for name, value in message.headers),
                                timestamp=message.timestamp,
                            )
                        )
            for tp in list(pending):
                if await consumer.position(tp) >= ends[tp]:
                    pending.discard(tp)
                    consumer.pause(tp)
        records.sort(key=lambda record: (record.topic, record.partition, record.offset))
        return records
    finally:
        await consumer.stop()
