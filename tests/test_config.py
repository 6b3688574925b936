"""Settings resolution: flags > MCDC_* environment > TOML file > defaults, and validation."""

from __future__ import annotations

from pathlib import Path

import pytest

from replicator.config import resolve
from replicator.errors import ConfigError
from replicator.uri import redact

SRC = "mongodb://a.example:27017/?replicaSet=rs0"
DST = "mongodb://b.example:27017"


def test_defaults_and_flags() -> None:
    s = resolve({"source": SRC, "target": DST, "workers": 8}, env={})
    assert s.workers == 8
    assert s.snapshot == "initial"
    assert s.batch_docs == 1000


def test_flags_beat_env_beat_file(tmp_path: Path) -> None:
    cfg = tmp_path / "mcdc.toml"
    cfg.write_text(f'source = "{SRC}"\ntarget = "{DST}"\nworkers = 2\nbatch-docs = 10\nexclude = ["x\\\\..*"]\n')
    env = {"MCDC_WORKERS": "3", "MCDC_BATCH_DOCS": "20"}
    s = resolve({"workers": 5}, env=env, config_file=cfg)
    assert (s.workers, s.batch_docs, s.exclude) == (5, 20, ("x\\..*",))
    s = resolve({}, env=env, config_file=cfg)
    assert s.workers == 3


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"source": "http://x", "target": DST}, "--source must be a mongodb://"),
        ({"source": SRC, "target": SRC}, "is the source server"),
        ({"source": SRC, "target": DST, "include": ("a[",)}, "not a valid regular expression"),
        ({"source": SRC, "target": DST, "snapshot": "sometimes"}, "--snapshot must be one of"),
        ({"source": SRC, "target": DST, "workers": 0}, "--workers must be at least 1"),
        ({"source": SRC, "target": DST, "rename": ("a.b=c",)}, "maps a collection to a database"),
        ({"source": SRC}, "no target"),
        ({}, "no source"),
    ],
)
def test_bad_input_is_one_clear_error(flags: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve(flags, env={})


def test_bad_env_value_names_the_variable() -> None:
    with pytest.raises(ConfigError, match="MCDC_WORKERS"):
        resolve({"source": SRC, "target": DST}, env={"MCDC_WORKERS": "many"})


def test_bad_toml(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text("workers = [")
    with pytest.raises(ConfigError, match="not valid TOML"):
        resolve({"source": SRC, "target": DST}, env={}, config_file=cfg)
    cfg.write_text("wrokers = 3")
    with pytest.raises(ConfigError, match="unknown setting 'wrokers'"):
        resolve({"source": SRC, "target": DST}, env={}, config_file=cfg)


def test_default_checkpoint_is_per_pair_and_credential_free(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    a = resolve({"source": "mongodb://u:secret@a.example/", "target": DST}, env={}).checkpoint_path()
    b = resolve({"source": "mongodb://u:other@a.example/", "target": DST}, env={}).checkpoint_path()
    c = resolve({"source": SRC, "target": "mongodb://c.example"}, env={}).checkpoint_path()
    assert a == b != c
    assert a.parent == tmp_path / "mcdc" and "secret" not in str(a)


def test_redact_hides_credentials_everywhere() -> None:
    text = "failed: mongodb://admin:s3cr%40t@h1:27017,h2/?authSource=admin&password=x and kafka://u:p@b:9092"
    out = redact(text)
    assert "s3cr" not in out and "password=x" not in out and "u:p@" not in out
    assert "mongodb://***@h1:27017,h2/" in out


def test_tail_settings() -> None:
    from bson.timestamp import Timestamp

    from replicator.config import parse_start_at

    s = resolve({"source": SRC, "target": DST}, env={"MCDC_METRICS_PORT": "9464", "MCDC_MAX_RETRIES": "-1"})
    assert (s.metrics_port, s.max_retries, s.metrics_host) == (9464, -1, "127.0.0.1")
    assert parse_start_at("1700000000,5") == Timestamp(1700000000, 5)
    assert parse_start_at("2023-11-14T22:13:20Z") == Timestamp(1700000000, 1)
    assert parse_start_at("2023-11-14T22:13:20") == Timestamp(1700000000, 1)  # no zone: UTC
    for bad, message in (("yesterday", "neither an ISO-8601"), ("1,x", "two whole numbers")):
        with pytest.raises(ConfigError, match=message):
            resolve({"source": SRC, "target": DST, "start_at": bad}, env={})
    with pytest.raises(ConfigError, match="--on-history-lost"):
        resolve({"source": SRC, "target": DST, "on_history_lost": "ignore"}, env={})
    with pytest.raises(ConfigError, match="--metrics-port"):
        resolve({"source": SRC, "target": DST, "metrics_port": 70000}, env={})
