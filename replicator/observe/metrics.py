"""Prometheus metrics and a health endpoint for long runs (``mcdc tail``, sync, catch-up).

:class:`Metrics` holds one run's counters: the pipeline updates dicts and numbers per batch, and the
families are built from them only when scraped (:meth:`Metrics.collect`, a prometheus_client collector).
Each run has a ``CollectorRegistry`` of its own, with the standard process and platform collectors;
prometheus_client writes the exposition (text 0.0.4, or OpenMetrics when the scraper asks for it).
:func:`serve` answers ``GET /metrics``, ``GET /health`` and ``GET /progress`` (migration.py) on a tiny
asyncio HTTP/1.1 server, in the
run's event loop (prometheus_client's own servers run in a thread, and have no /health).
``set_info`` label values pass through :func:`~replicator.settings.uri.redact`: no credentials reach a label.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import time
from collections.abc import Callable, Iterator
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, NamedTuple

import orjson

from replicator.observe.migration import STATES as MIGRATION_STATES
from replicator.observe.migration import Facts, Verification, progress_document
from replicator.settings.uri import redact

if TYPE_CHECKING:
    from prometheus_client.metrics_core import CounterMetricFamily, Metric

log = logging.getLogger("mcdc.metrics")

STATES = ("starting", "snapshot", "streaming", "retrying", "stopping", "committing", "committed")
#: /health answers 503 once the run has been retrying an outage for longer than this
UNHEALTHY_RETRYING_S = 60.0

_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_MAX_HEAD = 8192  # request line + headers; a scrape sends a few hundred bytes
_READ_TIMEOUT_S = 10.0  # a client that sends nothing must not hold a connection open


class Metrics:
    """Counters and gauges of one run; every update is a dict or attribute write, cheap per batch.

    ``registry`` is the run's CollectorRegistry: these metrics, the process's (CPU, memory, open files)
    and the platform's (``python_info``). ``clock`` is the monotonic clock behind :meth:`health` (tests
    pass a fake one).
    """

    def __init__(
        self,
        *,
        unhealthy_after_s: float = UNHEALTHY_RETRYING_S,
        stall_after_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self._unhealthy_after = unhealthy_after_s
        self._stall_after = stall_after_s
        self._events: dict[tuple[str, str], int] = {}
        self._retries: dict[str, int] = {}
        self._errors: dict[str, int] = {}
        self._info: dict[str, str] = {}
        self._lag: float | None = None
        self._lag_at = 0.0  # when the lag was confirmed (the clock's time)
        self._last_event_time: float | None = None
        self._snapshot_total = 0
        self._snapshot_remaining = 0
        self._snapshot_docs = 0
        self._snapshot_estimate: int | None = None  # documents the snapshot plans to copy (estimated counts)
        self._copied_before = 0  # documents of the snapshot that earlier runs copied
        self._snapshot_done = False  # the snapshot is done (or none is needed): the replay is what remains
        self.verification: Verification | None = None  # the embedded verifier's findings, when it runs
        #: what the run's target holds still (its sink's Sink.held_ttls), for /progress
        self.held: Callable[[], dict[str, dict[str, Any]] | None] = lambda: None
        self.max_read_rate: float = 0  # --max-read-rate, shown in /progress (0: no cap)
        #: tail --control: POST /commit asks the tail to stop and cut over (argument: block the source's
        #: writes first); returns None when accepted, else why not. None: no /commit.
        self.commit: Callable[[bool], str | None] | None = None
        self._batches = 0
        self._state = "starting"
        self._state_since = self._progress_at = clock()
        # prometheus_client is imported by a run that serves metrics (this class, made by served_metrics),
        # not by every module that names Metrics: a catch-up without --metrics-port never loads it
        from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector

        self.registry = CollectorRegistry()
        self.registry.register(self)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)

    # --- updates (hot path) ---

    def events(self, op: str, ns: str, n: int = 1) -> None:
        key = (op, ns)
        self._events[key] = self._events.get(key, 0) + n

    def set_lag(self, seconds: float | None) -> None:
        """The target is ``seconds`` behind the source's writes, as confirmed now (None: unknown)."""
        self._lag, self._lag_at = seconds, self._clock()

    def lag(self) -> float | None:
        """How far the target is behind the source's writes: the confirmed lag, plus the time since it was
        confirmed. While the source cannot be read (an outage, a stalled stream) it grows with the clock:
        nothing read means nothing known to be caught up."""
        return None if self._lag is None else self._lag + max(0.0, self._clock() - self._lag_at)

    def set_last_event_time(self, epoch_s: float) -> None:
        self._last_event_time = epoch_s

    def snapshot(self, collections_total: int, collections_remaining: int) -> None:
        self._snapshot_total = collections_total
        self._snapshot_remaining = collections_remaining

    def snapshot_docs(self, n: int) -> None:
        self._snapshot_docs += n

    def snapshot_estimate(self, documents: int, copied_before: int = 0) -> None:
        """Add ``documents`` to the snapshot's estimated total (collections are counted as they come), and
        ``copied_before``, documents earlier runs copied, to those copied."""
        self._snapshot_estimate = (self._snapshot_estimate or 0) + documents
        self._copied_before += copied_before

    def snapshot_done(self) -> None:
        """The snapshot is done, or none was needed: what remains is the replay."""
        self._snapshot_done = True

    def retry(self, what: str) -> None:
        self._retries[what] = self._retries.get(what, 0) + 1

    def error(self, what: str) -> None:
        self._errors[what] = self._errors.get(what, 0) + 1

    def batch_applied(self) -> None:
        """Count a batch the sink acknowledged; it is also the progress :meth:`health` watches."""
        self._batches += 1
        self._progress_at = self._clock()

    def heartbeat(self) -> None:
        """Record progress without a batch: an idle source's empty stream batch is not a stall."""
        self._progress_at = self._clock()

    def set_state(self, state: str) -> None:
        if state not in STATES:
            raise ValueError(f"unknown state {state!r}; expected one of {', '.join(STATES)}")
        if state == self._state:
            return  # keep the time the state was entered: "retrying for 2 minutes" counts from the first
        now = self._clock()
        self._state, self._state_since = state, now
        if state == "streaming":
            self._progress_at = now  # the stall clock starts when streaming does, not at the last snapshot batch

    def set_info(self, **labels: str) -> None:
        for name in labels:
            if not _LABEL_NAME.fullmatch(name) or name.startswith("__"):
                raise ValueError(f"invalid Prometheus label name {name!r}")
        self._info = {name: redact(str(value)) for name, value in labels.items()}

    # --- reads ---

    def health(self) -> tuple[bool, dict[str, Any]]:
        """Whether the run is healthy, and the state, lag and progress age behind the verdict."""
        now = self._clock()
        in_state = now - self._state_since
        since_progress = now - self._progress_at
        reason = None
        if self._state == "retrying" and in_state > self._unhealthy_after:
            reason = f"retrying for {in_state:.0f}s (limit {self._unhealthy_after:g}s)"
        elif self._state == "streaming" and since_progress > self._stall_after:
            reason = f"no progress for {since_progress:.0f}s while streaming (limit {self._stall_after:g}s)"
        lag = self.lag()
        detail: dict[str, Any] = {
            "state": self._state,
            "lag_seconds": None if lag is None else round(lag, 3),
            "seconds_since_progress": round(since_progress, 3),
            "seconds_in_state": round(in_state, 3),
        }
        if reason is not None:
            detail["reason"] = reason
        return reason is None, detail

    def events_applied(self) -> int:
        return sum(self._events.values())

    def facts(self) -> Facts:
        """This run as the progress document (migration.py) reads it."""
        return Facts(
            state=MIGRATION_STATES[self._state],
            snapshot_done=self._snapshot_done,
            lag_s=self.lag(),
            events_applied=self.events_applied(),
            estimated_documents=self._snapshot_estimate,
            copied_documents=self._copied_before + self._snapshot_docs,
            verification=self.verification,
            max_read_rate=self.max_read_rate,
            held=self.held(),
        )

    def render(self) -> str:
        """The run's registry (these metrics and the process's) in the Prometheus text format 0.0.4."""
        from prometheus_client.exposition import generate_latest

        return generate_latest(self.registry).decode()

    def collect(self) -> Iterator[Metric]:
        """The families of this run, built from its counters when scraped (prometheus_client's Collector)."""
        from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

        nan = math.nan  # an unknown gauge is NaN, not 0: a 0 lag would read as "caught up"
        yield InfoMetricFamily("mcdc", "Run information; the value is always 1.", value=self._info)
        state = GaugeMetricFamily(
            "mcdc_state", "Replicator state: 1 for the current state, 0 for the others.", labels=["state"]
        )
        for name in STATES:
            state.add_metric([name], int(name == self._state))
        yield state
        events = CounterMetricFamily(
            "mcdc_events_total", "Change events applied, by operation and namespace.", labels=["op", "namespace"]
        )
        for (op, ns), n in sorted(self._events.items()):
            events.add_metric([op, ns], n)
        yield events
        yield CounterMetricFamily("mcdc_batches_total", "Batches the sink acknowledged.", value=self._batches)
        lag = self.lag()
        yield GaugeMetricFamily(
            "mcdc_lag_seconds",
            "Seconds the target is behind the source's writes: as of the last batch read (0 when it was "
            "empty), plus the time since; it grows while the source cannot be read. NaN when unknown.",
            value=nan if lag is None else lag,
        )
        yield GaugeMetricFamily(
            "mcdc_last_applied_timestamp_seconds",
            "Cluster time of the last applied event, in Unix seconds; NaN before the first.",
            value=nan if self._last_event_time is None else self._last_event_time,
        )
        yield GaugeMetricFamily(
            "mcdc_snapshot_collections_total", "Collections the snapshot plans to copy.", value=self._snapshot_total
        )
        yield GaugeMetricFamily(
            "mcdc_snapshot_collections_remaining",
            "Collections the snapshot has not finished copying.",
            value=self._snapshot_remaining,
        )
        yield CounterMetricFamily(
            "mcdc_snapshot_documents_scanned_total",
            "Documents the snapshot read from the source.",
            value=self._snapshot_docs,
        )
        if self.verification is not None:
            yield from _verification(self.verification)
        yield _by_what("mcdc_retries_total", "Retried operations, by what was retried.", self._retries)
        yield _by_what("mcdc_errors_total", "Errors, by where they happened.", self._errors)


def _verification(v: Verification) -> Iterator[Metric]:
    """The embedded verifier's counts (tail --verify)."""
    from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily

    yield CounterMetricFamily(
        "mcdc_verify_documents_scanned_total", "Documents the embedded verifier compared.", value=v.scanned_documents
    )
    yield CounterMetricFamily("mcdc_verify_passes_total", "Verify passes completed.", value=v.passes)
    yield GaugeMetricFamily(
        "mcdc_verify_mismatches",
        "Documents or namespaces that differ after a re-check (this pass and the last).",
        value=v.mismatches,
    )
    yield GaugeMetricFamily(
        "mcdc_verify_rechecking", "Differences waiting for the replay to pass them.", value=v.rechecking
    )
    yield GaugeMetricFamily(
        "mcdc_verify_clean_passes", "Verify passes in a row that ended with no mismatch.", value=v.clean_passes
    )


def _by_what(name: str, help_text: str, counts: dict[str, int]) -> CounterMetricFamily:
    from prometheus_client.metrics_core import CounterMetricFamily

    family = CounterMetricFamily(name, help_text, labels=["what"])
    for what, n in sorted(counts.items()):
        family.add_metric([what], n)
    return family


# --- HTTP ---


class _Response(NamedTuple):
    status: int
    content_type: str = "text/plain; charset=utf-8"
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()


async def serve(metrics: Metrics, port: int, host: str = "127.0.0.1") -> asyncio.Server:
    """Serve ``GET /metrics`` and ``GET /health`` on ``host:port`` (0 picks a free port).

    The caller owns the returned server: ``server.sockets[0].getsockname()[1]`` is the bound port, and
    ``server.close(); await server.wait_closed()`` stops it.
    """

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _handle(metrics, reader, writer)

    return await asyncio.start_server(handle, host, port, limit=_MAX_HEAD)


async def _handle(metrics: Metrics, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One request, one response, then close; a failure is logged and the connection dropped."""
    try:
        try:
            async with asyncio.timeout(_READ_TIMEOUT_S):
                head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            if not exc.partial:
                return  # connected and closed without a byte: a port probe
            response, send_body = _text(HTTPStatus.BAD_REQUEST, "incomplete request\n"), True
        except asyncio.LimitOverrunError:
            response, send_body = _text(HTTPStatus.BAD_REQUEST, "request headers too large\n"), True
        else:
            response, send_body = _respond(metrics, head)
        writer.write(_encode(response, send_body))
        await writer.drain()
    except (TimeoutError, ConnectionError):
        log.debug("metrics: client went away or sent nothing", exc_info=True)
    except Exception:
        log.warning("metrics: dropped a request", exc_info=True)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


def _respond(metrics: Metrics, head: bytes) -> tuple[_Response, bool]:
    """The response to a request head, and whether to send its body (not for HEAD)."""
    first_line, _, header_lines = head.partition(b"\r\n")
    try:
        request_line = first_line.decode("ascii")
    except UnicodeDecodeError:
        return _text(HTTPStatus.BAD_REQUEST, "request line is not ASCII\n"), True
    parts = request_line.split(" ")
    if len(parts) != 3 or not parts[1].startswith("/") or not parts[2].startswith("HTTP/1."):
        return _text(HTTPStatus.BAD_REQUEST, "malformed request line\n"), True
    method, target, _ = parts
    path, _, query = target.partition("?")
    if path == "/commit" and metrics.commit is not None:
        return _commit(metrics, method, query), True
    if path not in ("/metrics", "/health", "/progress"):
        return _text(HTTPStatus.NOT_FOUND, "not found; try /metrics, /health or /progress\n"), method != "HEAD"
    if method not in ("GET", "HEAD"):
        response = _text(HTTPStatus.METHOD_NOT_ALLOWED, "use GET\n")
        return response._replace(headers=(("Allow", "GET, HEAD"),)), True
    try:
        if path == "/metrics":  # the format the scraper asks for, as prometheus_client's own servers do
            from prometheus_client.exposition import choose_encoder

            encode, content_type = choose_encoder(_header(header_lines, b"accept"))
            response = _Response(HTTPStatus.OK, content_type, encode(metrics.registry))
        elif path == "/progress":
            response = _Response(HTTPStatus.OK, "application/json", orjson.dumps(progress_document(metrics.facts())))
        else:
            ok, detail = metrics.health()
            body = orjson.dumps({"healthy": ok, **detail})
            response = _Response(HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE, "application/json", body)
    except Exception:
        log.exception("metrics: could not answer %s", path)
        response = _text(HTTPStatus.INTERNAL_SERVER_ERROR, "internal error\n")
    return response, method != "HEAD"


def _commit(metrics: Metrics, method: str, query: str) -> _Response:
    """POST /commit[?blockWrites=true]: 202 once the tail is asked to cut over, 409 when it cannot."""
    assert metrics.commit is not None
    if method != "POST":
        return _text(HTTPStatus.METHOD_NOT_ALLOWED, "use POST\n")._replace(headers=(("Allow", "POST"),))
    block = "blockwrites=true" in query.lower().replace("%3d", "=")
    refused = metrics.commit(block)
    if refused is not None:
        return _Response(HTTPStatus.CONFLICT, "application/json", orjson.dumps({"error": refused}))
    return _Response(HTTPStatus.ACCEPTED, "application/json", orjson.dumps(progress_document(metrics.facts())))


def _header(lines: bytes, name: bytes) -> str:
    """A request header's value ("" when absent); ``name`` in lower case."""
    for line in lines.split(b"\r\n"):
        key, colon, value = line.partition(b":")
        if colon and key.strip().lower() == name:
            return value.strip().decode("latin-1")
    return ""


def _text(status: HTTPStatus, message: str) -> _Response:
    return _Response(status, body=message.encode())


def _encode(response: _Response, send_body: bool) -> bytes:
    headers = [
        ("Content-Type", response.content_type),
        ("Content-Length", str(len(response.body))),
        ("Connection", "close"),
        *response.headers,
    ]
    head = f"HTTP/1.1 {response.status} {HTTPStatus(response.status).phrase}\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in headers) + "\r\n"
    return head.encode("ascii") + (response.body if send_body else b"")
