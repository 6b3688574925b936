"""Metrics render in the Prometheus text format, health follows the state and progress clocks, and the
HTTP endpoint answers a real scrape."""

from __future__ import annotations

import asyncio
import math
import re
import urllib.error
import urllib.request

import orjson
import pytest

from replicator.observe.metrics import STATES, Metrics, serve

# the 0.0.4 text format: name, optional {label="value",...} with escaped values, one space, a float
_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
_SAMPLE = re.compile(rf"(?P<name>{_NAME})(?:\{{(?P<labels>{_LABEL}(?:,{_LABEL})*)?\}})? (?P<value>\S+)")
_LABEL_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"')


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), value)


def parse(text: str) -> tuple[dict[str, tuple[str, str]], dict[tuple[str, frozenset[tuple[str, str]]], float]]:
    """A strict reader of the exposition format: HELP/TYPE per family, each sample `name{labels} value`."""
    assert text.endswith("\n")
    meta: dict[str, tuple[str, str]] = {}
    helps: dict[str, str] = {}
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for line in text[:-1].split("\n"):
        if line.startswith("# HELP "):
            name, _, help_text = line[7:].partition(" ")
            assert name not in helps, f"second HELP for {name}"
            helps[name] = help_text
        elif line.startswith("# TYPE "):
            name, kind = line[7:].split(" ")
            assert kind in ("counter", "gauge", "untyped"), line
            assert name in helps and name not in meta, f"TYPE for {name} must follow its HELP, once"
            meta[name] = (helps[name], kind)
        else:
            match = _SAMPLE.fullmatch(line)
            assert match, f"not a sample line: {line!r}"
            name = match.group("name")
            assert name in meta, f"sample {name} before its TYPE"
            labels = frozenset((k, _unescape(v)) for k, v in _LABEL_PAIR.findall(match.group("labels") or ""))
            key = (name, labels)
            assert key not in samples, f"duplicate sample {line!r}"
            value = match.group("value")
            assert value in ("NaN", "+Inf", "-Inf") or re.fullmatch(r"-?[0-9.]+(e[+-]?[0-9]+)?", value), line
            samples[key] = float(value)
    return meta, samples


def _value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def test_every_family_has_help_and_type() -> None:
    meta, samples = parse(Metrics().render())
    meta = {name: value for name, value in meta.items() if name.startswith("mcdc_")}
    assert set(meta) == {
        "mcdc_info",
        "mcdc_state",
        "mcdc_events_total",
        "mcdc_batches_total",
        "mcdc_lag_seconds",
        "mcdc_last_applied_timestamp_seconds",
        "mcdc_snapshot_collections_total",
        "mcdc_snapshot_collections_remaining",
        "mcdc_snapshot_documents_scanned_total",
        "mcdc_retries_total",
        "mcdc_errors_total",
    }
    assert all(help_text for help_text, _ in meta.values())
    assert {name for name, (_, kind) in meta.items() if kind == "counter"} == {
        name for name in meta if name.endswith("_total") and "collections" not in name
    }
    assert _value(samples, "mcdc_batches_total") == 0
    assert math.isnan(_value(samples, "mcdc_lag_seconds"))
    assert math.isnan(_value(samples, "mcdc_last_applied_timestamp_seconds"))


def test_process_and_platform_metrics_are_exposed() -> None:
    meta, samples = parse(Metrics().render())
    assert meta["process_cpu_seconds_total"][1] == "counter"
    assert _value(samples, "process_resident_memory_bytes") > 0
    assert _value(samples, "process_open_fds") > 0
    assert {labels for name, labels in samples if name == "python_info"}  # the interpreter's version


def test_each_run_has_a_registry_of_its_own() -> None:
    from prometheus_client import REGISTRY, CollectorRegistry

    first, second = Metrics(), Metrics()
    assert isinstance(first.registry, CollectorRegistry) and first.registry is not second.registry
    assert first.registry is not REGISTRY
    first.events("insert", "db.a", 2)
    assert _value(parse(first.render())[1], "mcdc_events_total", op="insert", namespace="db.a") == 2
    assert not any(name == "mcdc_events_total" for name, _ in parse(second.render())[1])
    assert REGISTRY.get_sample_value("mcdc_batches_total") is None  # nothing in the process-wide registry


def test_no_credentials_in_labels() -> None:
    m = Metrics()
    m.set_info(source="mongodb://admin:s3cret@h1:27017/?tlsCertificateKeyFilePassword=k3y", target="kafka://b:9092")
    text = m.render()
    assert "s3cret" not in text and "k3y" not in text
    _, samples = parse(text)
    info = next(dict(labels) for name, labels in samples if name == "mcdc_info")
    assert info["source"].startswith("mongodb://***@h1:27017/") and info["target"] == "kafka://b:9092"


def test_counters_accumulate_and_gauges_overwrite() -> None:
    m = Metrics()
    m.events("insert", "db.a")
    m.events("insert", "db.a", 4)
    m.events("delete", "db.b", 2)
    m.retry("source")
    m.retry("source")
    m.error("sink")
    m.snapshot_docs(100)
    m.snapshot_docs(23)
    m.snapshot(5, 4)
    m.snapshot(5, 2)
    m.batch_applied()
    m.batch_applied()
    m.set_lag(1.5)
    m.set_lag(0.25)
    m.set_last_event_time(1700000000.5)
    _, samples = parse(m.render())
    assert _value(samples, "mcdc_events_total", op="insert", namespace="db.a") == 5
    assert _value(samples, "mcdc_events_total", op="delete", namespace="db.b") == 2
    assert _value(samples, "mcdc_retries_total", what="source") == 2
    assert _value(samples, "mcdc_errors_total", what="sink") == 1
    assert _value(samples, "mcdc_snapshot_documents_scanned_total") == 123
    assert _value(samples, "mcdc_snapshot_collections_total") == 5
    assert _value(samples, "mcdc_snapshot_collections_remaining") == 2
    assert _value(samples, "mcdc_batches_total") == 2
    assert _value(samples, "mcdc_lag_seconds") == pytest.approx(0.25, abs=0.5)  # plus the time since: none
    assert _value(samples, "mcdc_last_applied_timestamp_seconds") == 1700000000.5
    m.set_lag(None)
    assert "mcdc_lag_seconds NaN\n" in m.render()


def test_state_gauge_is_one_hot() -> None:
    m = Metrics()
    for state in STATES:
        m.set_state(state)
        _, samples = parse(m.render())
        assert {s: _value(samples, "mcdc_state", state=s) for s in STATES} == {s: float(s == state) for s in STATES}
    with pytest.raises(ValueError, match="unknown state"):
        m.set_state("sleeping")


def test_label_values_are_escaped() -> None:
    m = Metrics()
    nasty = 'a\\b"c\nd'
    m.events("update", nasty)
    m.set_info(version="0.1.0", source="mongodb://***@h:27017", note=nasty)
    text = m.render()
    assert 'namespace="a\\\\b\\"c\\nd"' in text
    assert text.count("\n") == len(text.splitlines())  # no raw newline inside a sample
    _, samples = parse(text)
    assert _value(samples, "mcdc_events_total", op="update", namespace=nasty) == 1
    assert _value(samples, "mcdc_info", version="0.1.0", source="mongodb://***@h:27017", note=nasty) == 1
    with pytest.raises(ValueError, match="label name"):
        m.set_info(__reserved="x")


def test_health_retrying_too_long() -> None:
    clock = FakeClock()
    m = Metrics(unhealthy_after_s=120, clock=clock)
    m.set_state("retrying")
    clock.now += 100
    m.set_state("retrying")  # staying in a state does not restart its clock
    assert m.health()[0]
    clock.now += 21
    ok, detail = m.health()
    assert not ok
    assert detail["state"] == "retrying" and "retrying for 121s" in detail["reason"]
    m.set_state("streaming")
    assert m.health()[0]


def test_the_lag_grows_while_nothing_confirms_it_and_health_fails_after_a_minute_of_retries() -> None:
    """An outage: the last batch read said caught up (0 s); 25 s later with the source down and retrying,
    the target is 25 s behind the source's writes as far as anyone can know; past 60 s of retries the
    run is unhealthy."""
    clock = FakeClock()
    m = Metrics(clock=clock)
    m.set_state("streaming")
    m.set_lag(0.0)
    clock.now += 5
    m.set_state("retrying")
    clock.now += 20
    assert m.lag() == 25.0 and _value(parse(m.render())[1], "mcdc_lag_seconds") == 25.0
    ok, detail = m.health()
    assert ok and detail["lag_seconds"] == 25.0
    clock.now += 41  # retrying for 61 s
    ok, detail = m.health()
    assert not ok and "retrying for 61s (limit 60s)" in detail["reason"]
    m.set_state("streaming")
    m.set_lag(3.0)  # the source answered: the first batch after the outage was 3 s behind
    assert m.lag() == 3.0 and m.health()[0]


def test_health_stalled_stream() -> None:
    clock = FakeClock()
    m = Metrics(stall_after_s=300, clock=clock)
    m.set_state("snapshot")
    clock.now += 1000  # a long snapshot is not a stall
    assert m.health()[0]
    m.set_state("streaming")
    clock.now += 299
    m.batch_applied()
    clock.now += 300
    ok, detail = m.health()
    assert ok and detail["seconds_since_progress"] == 300
    clock.now += 1
    ok, detail = m.health()
    assert not ok and "no progress for 301s" in detail["reason"]
    m.heartbeat()
    assert m.health()[0]
    clock.now += 301
    m.set_lag(2.5)
    ok, detail = m.health()
    assert not ok and detail["lag_seconds"] == 2.5
    m.set_state("stopping")  # only a streaming run can stall
    assert m.health()[0]


async def _request(port: int, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    writer.write_eof()  # a client that stops short of the blank line must get an answer, not a wait
    await writer.drain()
    data = await reader.read()  # the server closes after one response
    writer.close()
    await writer.wait_closed()
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode().split("\r\n")
    assert status_line.startswith("HTTP/1.1 ")
    headers = {k.lower(): v for k, v in (line.split(": ", 1) for line in header_lines)}
    assert int(headers["content-length"]) == len(body) or raw.startswith(b"HEAD ")
    return int(status_line.split(" ")[1]), headers, body


def _get(port: int, path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: localhost:{port}\r\n\r\n".encode()


async def test_http_scrape() -> None:
    clock = FakeClock()
    m = Metrics(clock=clock)
    m.events("insert", "db.a", 3)
    m.set_state("streaming")
    server = await serve(m, 0)
    try:
        port = server.sockets[0].getsockname()[1]

        status, headers, body = await _request(port, _get(port, "/metrics"))
        assert status == 200
        assert headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
        _, samples = parse(body.decode())
        assert _value(samples, "mcdc_events_total", op="insert", namespace="db.a") == 3

        status, headers, body = await _request(port, _get(port, "/health"))
        assert (status, headers["content-type"]) == (200, "application/json")
        assert orjson.loads(body) == {
            "healthy": True,
            "state": "streaming",
            "lag_seconds": None,
            "seconds_since_progress": 0,
            "seconds_in_state": 0,
        }

        clock.now += 301
        status, _, body = await _request(port, _get(port, "/health"))
        assert status == 503 and orjson.loads(body)["healthy"] is False

        assert (await _request(port, _get(port, "/nope")))[0] == 404
        assert (await _request(port, _get(port, "/metrics?x=1")))[0] == 200
        assert (await _request(port, b"POST /metrics HTTP/1.1\r\n\r\n"))[0] == 405
        assert (await _request(port, b"garbage\r\n\r\n"))[0] == 400
        assert (await _request(port, b"GET /metrics\r\n"))[0] == 400  # closed before the headers ended
        assert (await _request(port, b"GET /" + b"x" * 10_000 + b" HTTP/1.1\r\n\r\n"))[0] == 400
        # a scraper that asks for OpenMetrics gets it, as from prometheus_client's own servers
        accept = b"Accept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5\r\n"
        status, headers, body = await _request(port, b"GET /metrics HTTP/1.1\r\n" + accept + b"\r\n")
        assert status == 200 and headers["content-type"].startswith("application/openmetrics-text")
        assert body.endswith(b"# EOF\n") and b'mcdc_events_total{namespace="db.a",op="insert"} 3.0' in body
        status, headers, body = await _request(port, b"HEAD /metrics HTTP/1.1\r\n\r\n")
        assert status == 200 and body == b"" and int(headers["content-length"]) > 0

        # a connection that sends nothing is dropped quietly and the server keeps answering
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.close()
        await writer.wait_closed()

        def fetch(path: str) -> tuple[int, str, bytes]:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
                    return resp.status, resp.headers["Content-Type"], resp.read()
            except urllib.error.HTTPError as exc:
                return exc.code, exc.headers["Content-Type"], exc.read()

        status, ctype, body = await asyncio.to_thread(fetch, "/metrics")
        assert status == 200 and ctype.startswith("text/plain; version=0.0.4")
        parse(body.decode())
        status, ctype, body = await asyncio.to_thread(fetch, "/health")
        assert (status, ctype) == (503, "application/json") and orjson.loads(body)["state"] == "streaming"
        assert (await asyncio.to_thread(fetch, "/nope"))[0] == 404
    finally:
        server.close()
        await server.wait_closed()
