"""The Kafka test broker and helpers, and the broker/aiokafka behaviours a Kafka sink relies on.

The outage tests pin down what aiokafka 0.14 does while the broker is down, measured against noida-db:

* an idempotent producer's ``send_and_wait`` on a topic it already knows neither fails nor times out, however
  small ``request_timeout_ms`` is: it waits for the broker and succeeds moments after it is back, in order,
  without duplicates.  Cancelling the wait (``asyncio.wait_for``) does not cancel the send: it is delivered;
* a non-idempotent producer fails the send with ``NodeNotReadyError`` after ``request_timeout_ms``;
* a send to a topic the producer has no metadata for fails with ``UnknownTopicOrPartitionError`` after
  ``request_timeout_ms``, idempotent or not;
* per partition a producer holds only the batch being retried plus one more (``max_batch_size``): a ``send()``
  beyond that raises ``KafkaTimeoutError`` after ``request_timeout_ms`` and its record is not queued;
* after a SIGKILL lost acknowledged records, an idempotent producer that wrote them raises
  ``OutOfOrderSequenceNumber`` on every later send; a new producer works.
"""

from __future__ import annotations

import asyncio
import importlib.util
import time
from collections import defaultdict
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import (
    KafkaConnectionError,
    KafkaTimeoutError,
    NodeNotReadyError,
    OutOfOrderSequenceNumber,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)

from tests.support.kafka import (
    KafkaBroker,
    consume_all,
    create_topic,
    delete_consumer_groups,
    delete_topics,
    list_topics,
)

pytestmark = pytest.mark.integration

OUTAGE_S = 3.0


def _local(broker: KafkaBroker) -> KafkaBroker:
    if broker.external:
        pytest.skip("the broker is external (MCDC_TEST_KAFKA_BOOTSTRAP): it cannot be stopped or restarted here")
    return broker


def _producer(
    broker: KafkaBroker, *, idempotent: bool = True, request_timeout_ms: int = 40_000, max_batch_size: int = 16384
) -> AIOKafkaProducer:
    return AIOKafkaProducer(
        bootstrap_servers=broker.bootstrap,
        acks="all",
        enable_idempotence=idempotent,
        request_timeout_ms=request_timeout_ms,
        max_batch_size=max_batch_size,
    )


async def _consume_and_commit(broker: KafkaBroker, topic: str, group: str, count: int) -> None:
    """Read ``count`` records of ``topic`` as consumer group ``group`` and commit the offsets."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=broker.bootstrap, group_id=group, auto_offset_reset="earliest")
    await consumer.start()
    try:
        seen = 0
        deadline = time.monotonic() + 10
        while seen < count and time.monotonic() < deadline:
            seen += sum(len(batch) for batch in (await consumer.getmany(timeout_ms=500)).values())
        assert seen == count
        await consumer.commit()
    finally:
        await consumer.stop()


async def _end_offset(broker: KafkaBroker, topic: str, partition: int = 0) -> int:
    consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap)
    await consumer.start()
    try:
        tp = TopicPartition(topic, partition)
        return int((await consumer.end_offsets([tp]))[tp])
    finally:
        await consumer.stop()


async def test_idempotent_acks_all_round_trip_keeps_keys_values_tombstones_and_headers(kafka: KafkaBroker) -> None:
    sent: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]] = [
        (b"k1", b'{"a":1}', [("op", b"i")]),
        (b"k2", b'{"b":2}', []),
        (b"k1", b'{"a":3}', [("op", b"u"), ("ts", b"\x00\x01")]),
        (b"k1", None, [("op", b"d")]),  # tombstone
        (None, b"no key", []),
        (b"k2", b"", []),  # an empty value is not a tombstone
    ]
    async with _producer(kafka) as producer:  # the topic is created on first use
        offsets = [
            (await producer.send_and_wait("round-trip", value, key=key, headers=headers)).offset
            for key, value, headers in sent
        ]
    assert offsets == list(range(len(sent)))
    assert "round-trip" in await list_topics(kafka.bootstrap)

    records = await consume_all(kafka.bootstrap, ["round-trip"])
    assert [(r.key, r.value, list(r.headers)) for r in records] == sent
    assert [(r.topic, r.partition, r.offset) for r in records] == [("round-trip", 0, i) for i in range(len(sent))]
    assert all(r.timestamp > 0 for r in records)
    assert records[3].value is None and records[5].value == b""


async def test_three_partitions_keep_per_key_order(kafka: KafkaBroker) -> None:
    await create_topic(kafka.bootstrap, "keyed", 3)
    keys = [f"key-{n}".encode() for n in range(8)]
    async with _producer(kafka) as producer:
        for seq in range(25):
            for key in keys:
                await producer.send("keyed", f"{seq:03d}".encode(), key=key)
        await producer.flush()

    records = await consume_all(kafka.bootstrap)  # every topic: just this one
    assert len(records) == 25 * len(keys)
    partitions_of: dict[bytes | None, set[int]] = defaultdict(set)
    values_of: dict[bytes | None, list[bytes | None]] = defaultdict(list)
    for record in records:
        partitions_of[record.key].add(record.partition)
        values_of[record.key].append(record.value)
    assert all(len(partitions) == 1 for partitions in partitions_of.values())
    assert set().union(*partitions_of.values()) == {0, 1, 2}
    assert all(values == [f"{seq:03d}".encode() for seq in range(25)] for values in values_of.values())
    for partition in range(3):
        offsets = [r.offset for r in records if r.partition == partition]
        assert offsets == list(range(len(offsets)))


async def test_helpers_create_list_delete_and_read_nothing_from_a_missing_topic(kafka: KafkaBroker) -> None:
    assert await list_topics(kafka.bootstrap) == set()  # the fixture deleted everything; internal topics hidden
    await create_topic(kafka.bootstrap, "two", 2)
    with pytest.raises(TopicAlreadyExistsError):
        await create_topic(kafka.bootstrap, "two", 2)
    assert await consume_all(kafka.bootstrap, ["two", "missing"]) == []
    assert await list_topics(kafka.bootstrap) == {"two"}  # reading did not auto-create "missing"

    async with _producer(kafka) as producer:
        await producer.send_and_wait("two", b"x", partition=1)
    await _consume_and_commit(kafka, "two", "g", 1)

    assert await delete_topics(kafka.bootstrap) == ["two"]
    assert await list_topics(kafka.bootstrap) == set()
    assert await delete_consumer_groups(kafka.bootstrap) == ["g"]  # its offsets outlived the topic until now
    assert await delete_consumer_groups(kafka.bootstrap) == []


async def test_stop_and_restart_keep_data_and_offsets_and_producers_reconnect(kafka: KafkaBroker) -> None:
    broker = _local(kafka)
    port = broker.port
    producer = _producer(broker)
    await producer.start()
    try:
        for n in range(10):
            await producer.send_and_wait("durable", str(n).encode(), key=b"k")
        await _consume_and_commit(broker, "durable", "g", 10)

        broker.restart()  # SIGTERM, then start on the same port and data directory
        assert broker.port == port and broker.bootstrap == f"127.0.0.1:{port}"
        assert (await producer.send_and_wait("durable", b"10", key=b"k")).offset == 10  # the same producer
    finally:
        await producer.stop()
    async with _producer(broker) as fresh:
        assert (await fresh.send_and_wait("durable", b"11", key=b"k")).offset == 11

    assert [r.value for r in await consume_all(broker.bootstrap, ["durable"])] == [str(n).encode() for n in range(12)]
    consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, group_id="g")
    await consumer.start()
    try:
        assert await consumer.committed(TopicPartition("durable", 0)) == 10
    finally:
        await consumer.stop()
    assert broker.log_path is not None and broker.log_path.parent == broker.data_dir
    assert b"127.0.0.1:" in broker.log_path.read_bytes()


async def test_idempotent_send_waits_out_an_outage_and_succeeds(kafka: KafkaBroker) -> None:
    """``request_timeout_ms`` (1 s here) does not bound it: the batch is retried until the broker is back."""
    broker = _local(kafka)
    async with _producer(broker, request_timeout_ms=1000) as producer:
        await producer.send_and_wait("outage", b"before", key=b"k")
        broker.stop()
        down_at = time.monotonic()
        sends = [asyncio.create_task(producer.send_and_wait("outage", b"during-%d" % n, key=b"k")) for n in range(3)]
        # A caller's own timeout cancels only its wait: the record stays queued and is delivered later.
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(producer.send_and_wait("outage", b"abandoned", key=b"k"), 1.0)
        stranger = _producer(broker)
        with pytest.raises(KafkaConnectionError):  # a new client cannot even bootstrap meanwhile
            await stranger.start()
        await stranger.stop()
        await asyncio.sleep(OUTAGE_S - (time.monotonic() - down_at))
        assert not any(send.done() for send in sends)
        broker.start()
        up_at = time.monotonic()
        results = await asyncio.wait_for(asyncio.gather(*sends), 10)
        waited = time.monotonic() - up_at
        assert [result.offset for result in results] == [1, 2, 3]
        assert waited < 2.0, f"sends finished {waited:.2f} s after the broker was back"
        assert (await producer.send_and_wait("outage", b"after", key=b"k")).offset == 5
    values = [r.value for r in await consume_all(broker.bootstrap, ["outage"])]
    assert values == [b"before", b"during-0", b"during-1", b"during-2", b"abandoned", b"after"]


async def test_sends_that_cannot_wait_fail_after_request_timeout(kafka: KafkaBroker) -> None:
    """Non-idempotent sends raise NodeNotReadyError; sends to a topic without metadata UnknownTopicOrPartition;
    and a producer holds a partition's records only up to the batch being retried plus one more batch
    (max_batch_size): a send() beyond that raises KafkaTimeoutError and is not queued, while the records
    held are delivered once the broker is back."""
    broker = _local(kafka)
    async with (
        _producer(broker, idempotent=False, request_timeout_ms=1000) as plain,
        _producer(broker, request_timeout_ms=1000) as idempotent,
        _producer(broker, request_timeout_ms=1000, max_batch_size=1024) as small,
    ):
        await plain.send_and_wait("known", b"before")
        await idempotent.send_and_wait("known", b"before")
        await small.send_and_wait("batched", b"before")
        broker.stop()
        try:
            started = time.monotonic()
            queued = [await small.send("batched", b"%d" % n * 400) for n in range(4)]  # two per 1 KiB batch
            outcomes = await asyncio.gather(
                plain.send_and_wait("known", b"during"),
                plain.send_and_wait("never-seen", b"during"),
                idempotent.send_and_wait("never-seen", b"during"),
                small.send("batched", b"4" * 400),  # the second batch is full and cannot drain
                return_exceptions=True,
            )
            elapsed = time.monotonic() - started
            assert not any(future.done() for future in queued)
        finally:
            broker.start()
        assert [type(outcome) for outcome in outcomes] == [
            NodeNotReadyError,
            UnknownTopicOrPartitionError,
            UnknownTopicOrPartitionError,
            KafkaTimeoutError,
        ]
        assert 0.9 < elapsed < 2.5, f"failed after {elapsed:.2f} s"
        assert [(await future).offset for future in queued] == [1, 2, 3, 4]
        assert (await plain.send_and_wait("known", b"after")).offset == 2  # the failed send was not written
        assert (await idempotent.send_and_wait("known", b"after")).offset == 3
        assert (await small.send_and_wait("batched", b"after")).offset == 5  # nor was the one that did not fit
    assert "never-seen" not in await list_topics(broker.bootstrap)


async def test_sigkill_keeps_records_written_out_and_loses_the_last_second(kafka: KafkaBroker) -> None:
    """kafka.json is rewritten about once a second: SIGKILL loses acknowledged records younger than that,
    and an idempotent producer that wrote some of them fails every later send with OutOfOrderSequenceNumber."""
    broker = _local(kafka)
    async with _producer(broker) as old:
        for n in range(5):
            await old.send_and_wait("crash", b"old-%d" % n)
    await asyncio.sleep(1.5)  # at least one rewrite of kafka.json since

    producer = _producer(broker)
    await producer.start()
    try:
        assert (await producer.send_and_wait("crash", b"acked-then-lost")).offset == 5
        broker.kill()
        broker.start()
        end = await _end_offset(broker, "crash")
        if end == 6:
            pytest.skip("the periodic rewrite of kafka.json happened between the ack and the SIGKILL")
        assert end == 5
        for _ in range(2):
            with pytest.raises(OutOfOrderSequenceNumber):
                await asyncio.wait_for(producer.send_and_wait("crash", b"next"), 10)
    finally:
        await producer.stop()
    async with _producer(broker) as fresh:
        assert (await fresh.send_and_wait("crash", b"fresh")).offset == 5
    assert [r.value for r in await consume_all(broker.bootstrap, ["crash"])] == [
        *(b"old-%d" % n for n in range(5)),
        b"fresh",
    ]


async def test_external_broker_is_only_probed(kafka: KafkaBroker) -> None:
    external = KafkaBroker(bootstrap=kafka.bootstrap)
    assert external.external and external.bootstrap == kafka.bootstrap and external.running
    with external:  # start() only waits for it to answer; stop() leaves it alone
        pass
    for action in (external.kill, external.restart, external.spawn):
        with pytest.raises(RuntimeError, match="external"):
            action()
    assert await list_topics(kafka.bootstrap) == set()


def test_a_missing_binary_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *args: None if name == "noida_db" else real_find_spec(name, *args)
    )
    broker = KafkaBroker(tmp_path / "kafka")
    with pytest.raises(RuntimeError, match=r"pip install noida-db==0\.2\.3.*MCDC_TEST_KAFKA_BOOTSTRAP"):
        broker.start()
    assert not broker.running
