"""The data source's options: mcdc's own option names (the CLI's long flags, parsed by the one option
table), plus the few that only the data source reads; and how a mistake in them reaches the user."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping

from replicator.errors import ConfigError, McdcError
from replicator.settings.config import Settings
from replicator.settings.resolve import settings_from_strings

#: Options Spark itself hands to every data source, not ours to check.
SPARK_OWN = frozenset({"path", "checkpointlocation"})
#: The stream's start as an offset (offsets.py's JSON): the Spark engine passes mcdc's checkpoint position.
START_POSITIONS = "start-positions"
#: json (the default: Extended JSON strings) or variant: the type of the document columns (variant.py).
DOCUMENT_TYPE = "document-type"
_OWN = frozenset({START_POSITIONS, DOCUMENT_TYPE})


class DataSourceError(McdcError):
    """An error of the data source that is the user's to fix, as Spark shows it: ``mcdc: <the CLI's line>``.

    Spark puts a Python data source's error after its own prefix the way Python prints an exception's last
    line, ``module.Class: message``, and Python leaves the module out for a class of ``builtins``: so this
    class says it is ``builtins.mcdc``, and the user reads ``...: mcdc: source ... is unreachable: ...``."""

    __module__ = "builtins"
    __qualname__ = "mcdc"


class OptionError(DataSourceError, ConfigError):
    """A mistake in the data source's options or set-up (``...: mcdc: option workers must be ...``)."""

    __module__ = "builtins"
    __qualname__ = "mcdc"


def settings_for(options: Mapping[str, str], need: str | None = None) -> Settings:
    """Settings from Spark's options, with the same one-line errors as the CLI (an unknown name is named,
    with the closest option). ``need``: "source" (readers) or "target" (writers), if already known."""
    mcdc = {k: v for k, v in options.items() if k.lower() not in SPARK_OWN | _OWN}
    # command "status": the one that needs neither a source nor a target (a writer needs no source); the
    # one this role needs is checked below, and each URI given is still validated
    settings = settings_from_strings(mcdc, command="status")
    if settings.start_after_debezium_offset is not None or settings.extended_json == "debezium":
        given = "start-after-debezium-offset" if settings.start_after_debezium_offset is not None else "extended-json"
        raise ConfigError(
            f"option {given}: Debezium's records and offsets are for mcdc's Kafka, stdout and jsonl targets (the CLI); "
            "the data source's rows hold canonical or relaxed Extended JSON"
        )
    if need is not None and not getattr(settings, need):
        raise ConfigError(f'no {need}: pass .option("{need}", "mongodb://...") to the mcdc data source')
    return settings


@contextlib.contextmanager
def one_line() -> Iterator[None]:
    """Around what the data source does in Spark's Python workers (the driver's: options, schema, plans
    and offsets; the executors': reads): an error that is the user's to fix (a McdcError: a mistake in
    the options, a source that cannot be reached or refuses us, ...) reaches the user as mcdc's one line
    (:class:`DataSourceError`, :class:`OptionError` for a ConfigError), without a traceback of mcdc's code.

    Spark's worker prints the error with its traceback unless SPARK_HIDE_TRACEBACK is set
    (spark.sql.execution.pyspark.udf.hideTraceback.enabled), which it reads when it formats the error,
    after this has raised; then the worker exits. So only this worker, about to end, is told."""
    try:
        yield
    except DataSourceError:
        raise  # told already, by a one_line() within this one
    except McdcError as exc:
        if os.environ.get("SPARK_PYTHON_RUNTIME") == "PYTHON_WORKER":  # never the user's own process
            os.environ["SPARK_HIDE_TRACEBACK"] = "1"
        shown = OptionError if isinstance(exc, ConfigError) else DataSourceError
        raise shown(str(exc)) from None
