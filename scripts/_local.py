"""Helpers shared by the demo and the benchmark: the mcdc command, local servers, headings.

Not a public module: scripts import it as ``_local`` (the scripts directory is on ``sys.path`` when a
script runs) after putting the repository root on ``sys.path`` for ``tests.support``.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from tests.support.servers import ServerPair, drop_user_databases, start_pair  # noqa: E402

#: ``python -m replicator.cli`` with this interpreter: works whether or not the venv's bin is on PATH.
MCDC = (sys.executable, "-m", "replicator.cli")


def mcdc(*args: str) -> list[str]:
    """The argv of one mcdc command."""
    return [*MCDC, *args]


def show(argv: Sequence[str]) -> str:
    """A command line as a person would type it, with ``python -m replicator.cli`` shown as ``mcdc``."""
    if tuple(argv[: len(MCDC)]) == MCDC:
        argv = ["mcdc", *argv[len(MCDC) :]]
    return shlex.join(argv)


def heading(text: str) -> None:
    """One visible line announcing the next step."""
    print(f"\n== {text}", flush=True)


@contextmanager
def local_servers(base_dir: Path) -> Iterator[ServerPair]:
    """Start a source and a target server under ``base_dir`` and stop them on exit, Ctrl-C included.

    When MCDC_TEST_SOURCE_URI and MCDC_TEST_TARGET_URI name external servers (as for the tests), those are
    used instead and their user databases are dropped first, as the test fixtures do.
    """
    pair = start_pair(base_dir)
    try:
        if pair.external:
            print(f"using the external servers {pair.source_uri} and {pair.target_uri} (dropping their databases)")
            drop_user_databases(pair.source_uri)
            drop_user_databases(pair.target_uri)
        yield pair
    finally:
        pair.stop()
