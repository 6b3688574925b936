"""Running ``mcdc`` as a user does, and what a refusal must look like: exit code, one ``mcdc: error:`` line,
no traceback."""

from __future__ import annotations

import subprocess
import sys


def mcdc(*args: str, env: dict[str, str] | None = None, timeout: float = 150) -> subprocess.CompletedProcess[str]:
    """``mcdc ARGS`` in a process of its own (``timeout``: a safety net, not a measure)."""
    return subprocess.run(
        [sys.executable, "-m", "replicator.cli", *args], capture_output=True, text=True, timeout=timeout, env=env
    )


def one_line_error(result: subprocess.CompletedProcess[str], code: int, *fragments: str) -> str:
    """The one ``mcdc: error:`` line ``result`` ended with, exit ``code``, holding each of ``fragments``."""
    assert result.returncode == code, (result.returncode, result.stderr[-3000:])
    errors = [line for line in result.stderr.splitlines() if line.startswith("mcdc: error:")]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    return errors[0]
