"""Helpers shared by the demo and the benchmark: the mcdc command, local servers, headings.

Not a public module: scripts import it as ``_local`` (the scripts directory is on ``sys.path`` when a
script runs) after putting the repository root on ``sys.path`` for ``tests.support``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import shlex
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    import psutil

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from replicator.settings.uri import host_set  # noqa: E402
from tests.support.kafka import KafkaBroker  # noqa: E402
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


@contextmanager
def work_dir(logdir: Path | None, prefix: str) -> Iterator[Path]:
    """A benchmark's directory for outputs and checkpoints: ``--logdir`` (kept, created if missing), else a
    temporary one removed afterwards."""
    if logdir is not None:
        logdir.mkdir(parents=True, exist_ok=True)
        yield logdir
        return
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        yield Path(tmp)


@contextmanager
def bench_servers(prog: str, source: str | None, target: str | None) -> Iterator[tuple[str, str, str]]:
    """(source URI, target URI, server description) for a benchmark: the given URIs, else two fresh local
    SecantusDB servers in a temporary directory. ``prog`` names the script in usage errors."""
    if source or target:
        if not (source and target):
            raise SystemExit(f"{prog}: pass both --source and --target, or neither")
        if host_set(source) & host_set(target):
            raise SystemExit(f"{prog}: --source and --target must be different servers")
        yield source, target, "the given servers"
        return
    heading("Starting two local SecantusDB servers")
    with tempfile.TemporaryDirectory(prefix="mcdc-bench-") as base, local_servers(Path(base)) as pair:
        version = importlib.metadata.version("SecantusDB")
        yield pair.source_uri, pair.target_uri, f"SecantusDB {version} (Python server, slower than mongod)"


@contextmanager
def bench_setup(prog: str, args: argparse.Namespace, prefix: str) -> Iterator[tuple[Path, str, str, str]]:
    """(work directory, source URI, target URI, server description) of a benchmark run from its
    ``--logdir``, ``--source`` and ``--target`` (see :func:`work_dir` and :func:`bench_servers`), printed."""
    with work_dir(args.logdir, prefix) as workdir, bench_servers(prog, args.source, args.target) as uris:
        source, target, server = uris
        print(f"source: {source}\ntarget: {target}\nserver: {server}")
        yield workdir, source, target, server


@contextmanager
def local_kafka(base_dir: Path) -> Iterator[str]:
    """A local Kafka-protocol broker (noida-db, as the tests use) with its data under ``base_dir``; yields its
    bootstrap address (``127.0.0.1:PORT``) once it answers, and stops it on exit."""
    with KafkaBroker(base_dir) as broker:
        yield broker.bootstrap


def tree_rss(proc: psutil.Process) -> int:
    """RSS in bytes of a process and its descendants; 0 for any that already exited."""
    import psutil  # a dev dependency: only the benchmarks need it

    total = 0
    try:
        members = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return 0
    for member in members:
        with suppress(psutil.Error):
            total += member.memory_info().rss
    return total


def code_version() -> str:
    """The commit being measured, and whether replicator/ had uncommitted changes (figures move with them)."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "replicator"], cwd=REPO_ROOT, capture_output=True)
    except OSError:
        return "unknown (no git)"
    if commit.returncode != 0:
        return "unknown (not a git checkout)"
    return commit.stdout.strip() + (" + uncommitted changes in replicator/" if dirty.stdout.strip() else "")


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def sigterm_as_interrupt() -> None:
    """SIGTERM as Ctrl-C: the way out stops the running mcdc and the local servers (a plain SIGTERM left
    them running)."""
    signal.signal(signal.SIGTERM, _interrupted)


class BenchError(Exception):
    """A run crashed, never finished, or left the wrong data: the figures would mean nothing."""


def run_bench(
    prog: str, bench: Callable[[], dict[str, Any]], report: Callable[[dict[str, Any]], None], as_json: bool
) -> int:
    """Run a benchmark, print its report (and JSON); exit code 1 on BenchError, 130 on Ctrl-C."""
    try:
        data = bench()
    except BenchError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"\n{prog}: interrupted", file=sys.stderr)
        return 130
    report(data)
    if as_json:
        sys.stdout.write(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode() + "\n")
    return 0


def print_verdicts(targets: dict[str, bool], commands: dict[str, str] | None) -> None:
    """The end of every benchmark report: PASS/FAIL per target, then the commands that were measured."""
    for name, ok in targets.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    if commands:
        print("commands:")
        for name, command in commands.items():
            print(f"  {name}: {command}")


def add_server_options(parser: argparse.ArgumentParser, mcdc_arg_help: str) -> None:
    """The options every benchmark takes: external servers, extra mcdc arguments, a log dir, JSON."""
    parser.add_argument("--source", help="use this source server (only its bench database is touched)")
    parser.add_argument("--target", help="use this target server (its bench database is dropped)")
    parser.add_argument("--mcdc-arg", action="append", default=[], metavar="ARG", help=mcdc_arg_help)
    parser.add_argument("--logdir", type=Path, help="keep mcdc's output and checkpoints here (default: a temp dir)")
    parser.add_argument("--json", action="store_true", help="also print the figures as JSON")
