"""Finding a sink for a target URI: built-in schemes first, then ``mcdc.sinks`` entry points.

Built in: ``mongodb://`` / ``mongodb+srv://`` (replay into MongoDB), ``kafka://`` (Debezium-compatible
records), ``stdout`` or ``-`` and ``jsonl:PATH`` (JSON lines),
``delta:PATH`` and ``iceberg:PATH`` (lakehouse tables), ``memory:`` (tests and dry runs).

A plug-in package registers ``scheme = "package.module:SinkClass"`` under the ``mcdc.sinks`` entry-point
group; the class is called with the target URI and the run's Settings (``cls(uri, settings)``).
"""

from __future__ import annotations

import difflib
from importlib.metadata import entry_points
from typing import Any

from replicator.errors import ConfigError, quoted
from replicator.settings.config import Settings
from replicator.settings.uri import redact
from replicator.sinks.base import Sink


def scheme_of(uri: str) -> str:
    if uri in ("-", "stdout"):
        return "stdout"
    head, sep, _ = uri.partition(":")
    return head.lower() if sep else uri.lower()


def open_sink(settings: Settings) -> Sink:
    """A sink for ``settings.target`` (not started yet)."""
    uri = settings.target
    scheme = scheme_of(uri)
    if scheme in ("mongodb", "mongodb+srv"):
        from replicator.settings.selection import Scope
        from replicator.sinks.mongo.sink import MongoSink

        scope = Scope(settings.selection, settings.renamer)
        return MongoSink(
            uri, timeout_s=settings.connect_timeout_s, scope=scope, io_timeout_s=settings.io_timeout_s,
            guard=settings.guard,
        )  # fmt: skip
    if scheme == "memory":
        from replicator.sinks.memory import MemorySink

        return MemorySink()
    if scheme == "kafka":
        from replicator.sinks.kafka.sink import KafkaSink

        return KafkaSink(uri, settings)
    if scheme in ("delta", "iceberg"):
        from replicator.sinks.lake.sink import LakeSink

        return LakeSink(uri, settings)
    if scheme in ("stdout", "jsonl"):
        from replicator.sinks.lines import LineSink

        return LineSink(uri, settings)
    for ep in entry_points(group="mcdc.sinks"):
        if ep.name == scheme:
            factory: Any = ep.load()
            sink = factory(uri, settings)
            if not isinstance(sink, Sink):
                raise ConfigError(f"plug-in sink {quoted(ep.value)} for {scheme}:// is not a replicator Sink")
            return sink
    schemes = [*BUILT_IN, *(ep.name for ep in entry_points(group="mcdc.sinks"))]
    meant = _meant(redact(uri), scheme, schemes)
    hint = f"did you mean {quoted(meant)}?" if meant else "mcdc writes to " + ", ".join(_shape(s) for s in schemes)
    raise ConfigError(f"no sink for target {quoted(redact(uri))}: unknown scheme {quoted(scheme)} ({hint})")


#: the schemes a target may have (``-`` is stdout too; ``memory:`` is the tests')
BUILT_IN = ("mongodb", "mongodb+srv", "kafka", "delta", "iceberg", "jsonl", "stdout")
#: schemes written as URLs (``kafka://``), the others as ``scheme:PATH``
_URLS = frozenset({"mongodb", "mongodb+srv", "kafka"})


def _shape(scheme: str) -> str:
    return f"{scheme}://" if scheme in _URLS else scheme if scheme == "stdout" else f"{scheme}:PATH"


def _meant(uri: str, scheme: str, schemes: list[str]) -> str | None:
    """The target ``uri`` (redacted) most likely meant: a known scheme without its colon (``delta/tmp/x``),
    or the known scheme nearest to a misspelled one (``kafak://``), the rest kept."""
    for name in sorted(schemes, key=len, reverse=True):
        if uri.lower().startswith(name) and uri[len(name) : len(name) + 1] != ":" and len(uri) > len(name):
            rest = uri[len(name) :]
            return f"{name}://{rest.lstrip('/')}" if name in _URLS else f"{name}:{rest}"
    near = difflib.get_close_matches(scheme, schemes, n=1, cutoff=0.6)
    return near[0] + uri[len(scheme) :] if near and uri.lower().startswith(scheme) else None
