"""Which table format a lake target names (``delta:PATH``, ``iceberg:PATH``), opened with its ``--lake-opt``
options; a one-line error when the ``lake`` extra is not installed."""

from __future__ import annotations

from collections.abc import Iterable

from replicator.errors import ConfigError
from replicator.sinks.lake.backend import Backend


def open_backend(uri: str, options: Iterable[str]) -> Backend:
    """The backend for ``delta:PATH`` or ``iceberg:PATH``; a one-line error without the lake extra."""
    scheme, _, path = uri.partition(":")
    scheme = scheme.lower()
    if not path.strip():
        raise ConfigError(f"--target {scheme}:PATH needs a path, e.g. {scheme}:/data/lake")
    pairs = lake_options(options)
    try:
        if scheme == "delta":
            from replicator.sinks.lake.delta import DeltaBackend

            return DeltaBackend(path, pairs)
        from replicator.sinks.lake.iceberg import IcebergBackend

        return IcebergBackend(path, pairs)
    except ImportError as exc:
        raise ConfigError(
            f"--target {scheme}: needs the lake extra ({exc.name} is not installed): pip install 'mcdc[lake]'"
        ) from None


def lake_options(options: Iterable[str]) -> dict[str, str]:
    pairs = {}
    for opt in options:
        key, sep, value = opt.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--lake-opt {key.strip() or '?'}: expected KEY=VALUE (e.g. AWS_REGION=eu-west-1)")
        pairs[key.strip()] = value
    return pairs
