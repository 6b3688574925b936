"""A misspelled target scheme or Kafka producer setting is answered with the one it most likely meant
(issue 49, item 5), in one line (no server)."""

from __future__ import annotations

import pytest

from replicator.errors import ConfigError
from replicator.settings.config import Settings
from replicator.sinks.kafka.options import producer_config
from replicator.sinks.registry import open_sink


@pytest.mark.parametrize(
    ("target", "meant"),
    [
        ("kafak://broker:9092", "kafka://broker:9092"),
        ("delta/tmp/x", "delta:/tmp/x"),
        ("icebreg:/lake", "iceberg:/lake"),
        ("jsnol:/tmp/e.jsonl", "jsonl:/tmp/e.jsonl"),
        ("mongdb://app:secret@db1/", "mongodb://***@db1/"),
    ],
)
def test_an_unknown_scheme_names_the_target_it_most_likely_meant(target: str, meant: str) -> None:
    with pytest.raises(ConfigError) as caught:
        open_sink(Settings(source="mongodb://src", target=target))
    said = str(caught.value)
    assert "unknown scheme" in said and f"(did you mean '{meant}'?)" in said, said
    assert "secret" not in said and "\n" not in said


def test_a_scheme_like_no_other_is_said_with_the_ones_there_are() -> None:
    with pytest.raises(ConfigError, match=r"unknown scheme 'zzz' \(mcdc writes to mongodb://, .*kafka://"):
        open_sink(Settings(source="mongodb://src", target="zzz://x"))


@pytest.mark.parametrize(
    ("key", "meant"),
    [("compresion.type", "compression.type"), ("linger_ms", "linger.ms"), ("sasl.usrname", "sasl.username")],
)
def test_an_unknown_kafka_opt_names_the_setting_it_most_likely_meant(key: str, meant: str) -> None:
    with pytest.raises(ConfigError) as caught:
        producer_config((f"{key}=x",), ["broker:9092"])
    said = str(caught.value)
    assert f"--kafka-opt {key}: " in said and f"(did you mean '{meant}'?)" in said, said
    assert "mcdc --help" not in said


def test_an_unknown_kafka_opt_like_no_other_lists_the_ones_mcdc_takes() -> None:
    with pytest.raises(ConfigError) as caught:
        producer_config(("zzz=1",), ["broker:9092"])
    said = str(caught.value)
    assert "compression.type" in said and "sasl.jaas.config" in said and "mcdc --help" not in said, said
