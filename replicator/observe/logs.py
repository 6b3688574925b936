"""Log output: human text or one JSON object per line, on stderr, with credentials redacted.

A :class:`RedactFilter` on the handler passes the message, string ``extra=`` values, the formatted
traceback and stack through :func:`~replicator.settings.uri.redact` before either formatter sees the record.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, TextIO

import orjson

from replicator.errors import ConfigError, quoted
from replicator.settings.uri import redact

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

MCDC_LOGGER = "mcdc"  # the parent of every mcdc logger ("mcdc.stream", "mcdc.sink.mongo", ...)
_HANDLER_NAME = "mcdc"  # marks the handler setup_logging owns, so a second call replaces it
# attributes every LogRecord has; anything else on a record came from extra=
_STANDARD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}
_JSON_FIELDS = ("ts", "level", "logger", "message", "error", "stack")


def setup_logging(
    fmt: str = "text", verbose: bool = False, stream: TextIO | None = None, *, driver: bool = False
) -> None:
    """Send log records at INFO and above to ``stream`` (stderr) as ``fmt``; ``verbose`` adds mcdc's own
    DEBUG records, ``driver`` the MongoDB driver's (its command log, which would drown mcdc's).

    Calling it again replaces the handler it installed earlier; handlers others added are kept.
    """
    if fmt not in FORMATS:
        raise ConfigError(f"unknown log format {quoted(fmt)}; use one of: {', '.join(FORMATS)}")
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.set_name(_HANDLER_NAME)
    handler.addFilter(RedactFilter())
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == _HANDLER_NAME]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    logging.getLogger(MCDC_LOGGER).setLevel(logging.DEBUG if verbose else logging.NOTSET)
    # pymongo's DEBUG/INFO (command monitoring, server selection) drowns ours unless asked for
    logging.getLogger("pymongo").setLevel(logging.DEBUG if driver else logging.WARNING)


class RedactFilter(logging.Filter):
    """Redacts credentials in a record in place: message, string extras, traceback and stack."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:
            return True  # bad %-args: let the handler report it the usual way
        record.msg, record.args = redact(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        for key, value in _extras(record).items():
            if isinstance(value, str | dict | list | tuple):
                setattr(record, key, _scrub(value))
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts (UTC, ms), level, logger, message, extras, and error/stack."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info and not record.exc_text:  # no RedactFilter on this handler
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            data["error"] = record.exc_text
        if record.stack_info:
            data["stack"] = record.stack_info
        for key, value in _extras(record).items():
            data[f"extra_{key}" if key in _JSON_FIELDS else key] = value
        try:
            return orjson.dumps(data, default=_fallback, option=orjson.OPT_NON_STR_KEYS).decode()
        except TypeError:  # orjson.JSONEncodeError: e.g. an int beyond 64 bits inside an extra
            safe = {k: v if k in _JSON_FIELDS else _fallback(v) for k, v in data.items()}
            return orjson.dumps(safe).decode()


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD_ATTRS and not k.startswith("_")}


def _scrub(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: _scrub(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_scrub(v) for v in value]
    return value


def _fallback(value: Any) -> str:
    """What orjson cannot serialize (ObjectId, Timestamp, an exception) goes out as redacted text."""
    return redact(str(value))
