"""Log setup: text and JSON lines, credentials redacted in both, one handler however often it is set up."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from replicator.errors import ConfigError
from replicator.observe.logs import setup_logging

SECRET_URI = "mongodb://user:secret@h:27017/?authSource=admin"


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """setup_logging changes the root, mcdc and pymongo loggers; put them back for the other tests."""
    root, mcdc, pymongo = logging.getLogger(), logging.getLogger("mcdc"), logging.getLogger("pymongo")
    handlers, levels = list(root.handlers), [(logger, logger.level) for logger in (root, mcdc, pymongo)]
    yield
    for handler in root.handlers:
        if handler not in handlers:
            root.removeHandler(handler)
    for logger, level in levels:
        logger.setLevel(level)


def _json_lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in stream.getvalue().splitlines()]


def test_json_lines_carry_the_fields_and_extras() -> None:
    out = io.StringIO()
    setup_logging("json", stream=out)
    log = logging.getLogger("mcdc.test")
    log.info("copied %d documents", 5, extra={"ns": "db.c", "docs": 5, "level": "shadowed"})
    log.debug("not shown without verbose")
    (line,) = _json_lines(out)
    assert line["level"] == "INFO" and line["logger"] == "mcdc.test" and line["message"] == "copied 5 documents"
    assert line["ns"] == "db.c" and line["docs"] == 5 and line["extra_level"] == "shadowed"
    assert len(line["ts"]) == len("2024-01-01T00:00:00.000Z") and line["ts"].endswith("Z")
    assert "error" not in line


def test_json_error_and_odd_extras() -> None:
    out = io.StringIO()
    setup_logging("json", stream=out)
    try:
        raise RuntimeError(f"cannot reach {SECRET_URI}")
    except RuntimeError:
        logging.getLogger("mcdc").exception("failed", extra={"obj": object(), "big": 2**70, "nested": [SECRET_URI]})
    (line,) = _json_lines(out)
    assert "Traceback" in line["error"] and "RuntimeError: cannot reach mongodb://***@h:27017" in line["error"]
    assert line["big"] == str(2**70) and line["obj"].startswith("<object")
    assert "secret" not in out.getvalue()


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_credentials_are_redacted(fmt: str) -> None:
    out = io.StringIO()
    setup_logging(fmt, stream=out)
    log = logging.getLogger("mcdc.test")
    log.warning("connecting to %s", SECRET_URI, extra={"uri": SECRET_URI})
    log.warning(f"connecting to {SECRET_URI}?password=hunter2")
    try:
        raise ValueError(SECRET_URI)
    except ValueError:
        log.error("boom", exc_info=True)
    text = out.getvalue()
    assert "secret" not in text and "hunter2" not in text
    assert "mongodb://***@h:27017" in text
    assert "ValueError: mongodb://***@h:27017" in text
    if fmt == "json":
        assert _json_lines(out)[0]["uri"] == "mongodb://***@h:27017/?authSource=admin"


def test_text_format() -> None:
    out = io.StringIO()
    setup_logging("text", verbose=True, stream=out)
    logging.getLogger("mcdc.test").debug("hello")
    line = out.getvalue().rstrip("\n")
    assert line.endswith(" DEBUG mcdc.test: hello")


def test_verbose_shows_mcdc_debug_lines_and_the_driver_has_its_own_flag() -> None:
    out = io.StringIO()
    setup_logging("text", verbose=True, stream=out)
    logging.getLogger("pymongo.command").debug("find: {...}")
    logging.getLogger("aiokafka").debug("metadata")
    logging.getLogger("mcdc.stream").debug("batch of 3")
    assert out.getvalue().splitlines()[0].endswith("DEBUG mcdc.stream: batch of 3")
    assert len(out.getvalue().splitlines()) == 1
    out = io.StringIO()
    setup_logging("text", stream=out, driver=True)
    logging.getLogger("pymongo.command").debug("find: {...}")
    logging.getLogger("mcdc.stream").debug("not without verbose")
    assert [line.split(" ", 2)[2] for line in out.getvalue().splitlines()] == ["DEBUG pymongo.command: find: {...}"]


def test_second_setup_replaces_the_handler() -> None:
    first, second = io.StringIO(), io.StringIO()
    before = len(logging.getLogger().handlers)
    setup_logging("text", stream=first)
    setup_logging("json", stream=second)
    assert len(logging.getLogger().handlers) == before + 1
    logging.getLogger("mcdc").info("once")
    assert first.getvalue() == ""
    assert [line["message"] for line in _json_lines(second)] == ["once"]
    assert logging.getLogger("pymongo").level == logging.WARNING


def test_default_stream_is_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging()
    logging.getLogger("mcdc").info("to stderr")
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.endswith("INFO mcdc: to stderr\n")


def test_unknown_format() -> None:
    with pytest.raises(ConfigError, match="unknown log format 'xml'"):
        setup_logging("xml")
