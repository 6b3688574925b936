"""What a checkout holds, as ``git status --porcelain --ignored`` lists it (tests/conftest.py checks that the
suite leaves it as it found it)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
#: what running the code and its tools writes by design: bytecode and the linters' and pytest's caches
_CACHES = ("__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".egg-info")


def tree_entries(root: Path = ROOT) -> set[str]:
    """Every changed, untracked or ignored entry of the checkout at ``root`` but caches (empty outside git)."""
    try:
        out = subprocess.run(
            ["git", "status", "--porcelain", "--ignored"], cwd=root, capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.SubprocessError):
        return set()
    if out.returncode != 0:
        return set()
    return {line for line in out.stdout.splitlines() if not line.rstrip("/").endswith(_CACHES) and line.strip()}
