"""A failed Spark job or query in one line: the Python error a task raised, else Spark's own reason.
Spark's whole account (the JVM's stack, each attempt of each task) is in its log, which the CLI names
(:func:`.session.console_log`)."""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator
from typing import Any

from replicator.errors import McdcError
from replicator.settings.uri import redact

log = logging.getLogger("mcdc.spark")

#: how mcdc's HistoryLost shows in a failed task's traceback
HISTORY_LOST = "HistoryLost"
#: A traceback's last line, ``module.Class: message``, at the start of a line of Spark's text.
_PYTHON_ERROR = re.compile(r"[A-Za-z_][\w.]*: \S")
#: py4j's first line only names the JVM method the driver called.
_PY4J_CALL = "An error occurred while calling"
#: The task that failed every attempt: which attempt and executor say nothing to the user.
_STAGE_FAILURE = re.compile(
    r"(?:org\.apache\.spark\.SparkException: )?Job aborted due to stage failure: Task \S+ in stage \S+ "
    r"failed (\d+) times?, most recent failure: Lost task .*?\(TID \d+\) \([^)]*\): "
)


def reason(exc: Any) -> str:
    """What went wrong, in one line of ``exc``'s text (an exception or Spark's message)."""
    text = str(getattr(exc, "desc", None) or exc)
    lines = [line for line in text.splitlines() if line.strip()]
    for line in lines:  # the Python error a task raised, without the JVM's stack
        if "Traceback" in line:
            continue
        if "Error:" in line or f"{HISTORY_LOST}:" in line or _PYTHON_ERROR.match(line):
            return line.strip()
    for line in lines:
        if not line.startswith(_PY4J_CALL):
            return _STAGE_FAILURE.sub(lambda m: f"a task failed {m[1]} times: ", line.strip().removeprefix(": "))
    return "unknown error"


@contextlib.contextmanager
def failing_in_one_line(what: str) -> Iterator[None]:
    """Spark's own exceptions from a job of ``what`` ("the snapshot", "verify") become one McdcError line;
    with --verbose, the whole exception is logged too."""
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException

    try:
        yield
    except (Py4JError, PySparkException) as exc:
        log.debug("%s failed on Spark", what, exc_info=True)
        raise McdcError(f"{what} failed on Spark: {redact(reason(exc))}") from None
