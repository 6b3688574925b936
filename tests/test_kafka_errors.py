"""Kafka sink errors, without a broker: each says what failed, where (the redacted bootstrap) and what to do,
in plain words: no Python reprs (``KafkaConnectionError('...')``, ``<class ...>``, tuples, lists)."""

from __future__ import annotations

import asyncio
import logging
import re
import ssl
from pathlib import Path

import pytest
from aiokafka import errors as kafka_errors

from replicator.errors import ConfigError, SinkError, SinkUnavailable
from replicator.settings.resolve import resolve
from replicator.sinks.kafka.options import producer_config
from replicator.sinks.kafka.sink import KafkaSink, describe_error
from replicator.source.retry import is_retryable
from tests.support.servers import free_port

# what a Python repr looks like inside a message: Name('...'), <...>, (..., ...), [...], '...'
_REPR = re.compile(r"\w\(|<\w|\(['\"\d]|\[|\]|'[^' ]*'|Error\b|Exception\b")


def _plain(message: str) -> str:
    assert not _REPR.search(message), f"a Python repr in {message!r}"
    return message


@pytest.mark.parametrize(
    ("exc", "words"),
    [
        (kafka_errors.KafkaConnectionError("Unable to bootstrap from [('127.0.0.1', 1, <AddressFamily.AF_INET: 2>)]"),
         "could not connect"),
        (kafka_errors.KafkaTimeoutError(), "timed out"),
        (kafka_errors.RequestTimedOutError(), "REQUEST_TIMED_OUT"),
        (kafka_errors.UnknownTopicOrPartitionError(), "UNKNOWN_TOPIC_OR_PARTITION"),
        (kafka_errors.NotLeaderForPartitionError(), "not the leader"),
        (kafka_errors.NodeNotReadyError("node 1"), "node not ready"),
        (kafka_errors.KafkaError("Unexpected error during batch delivery"), "Unexpected error during batch delivery"),
        (kafka_errors.KafkaError(repr(ValueError("x"))), "kafka error"),
        (TimeoutError(), "no answer within 10 s"),
        (ConnectionRefusedError(111, "Connection refused"), "Connection refused"),
        (RuntimeError("boom ('a', 1)"), "runtime error"),
    ],
)  # fmt: skip
def test_describe_error_is_plain_words(exc: BaseException, words: str) -> None:
    text = _plain(describe_error(exc, timeout_s=10))
    assert words in text


def _settings(target: str, *opts: str) -> object:
    return resolve({"source": "mongodb://a:27017", "target": target, "kafka_opts": opts}, env={})


async def test_an_unreachable_broker_at_start_is_retryable_and_said_plainly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    port = free_port()
    sink = KafkaSink(f"kafka://127.0.0.1:{port}", _settings(f"kafka://127.0.0.1:{port}"))  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO), pytest.raises(SinkUnavailable) as info:
        await sink.start()
    await sink.close()
    assert is_retryable(info.value)  # tail, sync and catch-up retry it under --max-retries
    message = _plain(str(info.value))
    assert message.startswith(f"Kafka kafka://127.0.0.1:{port} is unreachable: ")
    assert "check that the broker is running" in message
    # aiokafka's own per-attempt error line (with a tuple repr of the address) is kept for --verbose
    assert not [r for r in caplog.records if r.name.startswith("aiokafka") and r.levelno >= logging.INFO]


async def test_a_start_that_times_out_names_the_timeout() -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)  # accepts, never answers
    port = server.sockets[0].getsockname()[1]
    try:
        settings = resolve(
            {"source": "mongodb://a:27017", "target": f"kafka://127.0.0.1:{port}", "connect_timeout_s": 0.5}, env={}
        )
        sink = KafkaSink(f"kafka://127.0.0.1:{port}", settings)
        with pytest.raises(SinkUnavailable) as info:
            await sink.start()
        await sink.close()
    finally:
        server.close()
    assert "no answer within 0.5 s" in _plain(str(info.value))


def test_kafka_option_errors_are_plain(tmp_path: Path) -> None:
    cases = [
        (("linger.ms=soon",), "--kafka-opt linger.ms=soon: not a whole number"),
        (("ssl.ca.location=" + str(tmp_path / "missing.pem"),), "missing.pem"),
    ]
    for opts, expected in cases:
        try:
            producer_config(opts, ["b:9092"])
        except ConfigError as exc:
            message = _plain(str(exc))
            assert expected is None or expected in message, message
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate")
    with pytest.raises(ConfigError) as info:
        producer_config((f"ssl.ca.location={bad}",), ["b:9092"])
    assert str(bad) in _plain(str(info.value)) and "PEM" in str(info.value)
    assert isinstance(ssl.SSLError(), OSError)  # why the TLS errors are told apart below OSError


def test_a_refused_producer_is_not_retried_and_says_what_to_check() -> None:
    sink = KafkaSink("kafka://b:9092", _settings("kafka://b:9092"))  # type: ignore[arg-type]
    assert sink._fatal(kafka_errors.TopicAuthorizationFailedError())
    text = _plain(describe_error(kafka_errors.TopicAuthorizationFailedError(), timeout_s=10))
    assert "TOPIC_AUTHORIZATION_FAILED" in text
    assert not issubclass(SinkError, ConnectionError) and issubclass(SinkUnavailable, ConnectionError)
