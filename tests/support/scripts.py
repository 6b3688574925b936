"""Running the repository's scripts/ from the tests: this interpreter, the repository root as the working
directory, output captured as text and unbuffered."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_script(name: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``scripts/<name>`` with ``args``; never raises on a non-zero exit (the caller asserts)."""
    return subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / name), *args],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
