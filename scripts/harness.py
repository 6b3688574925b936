"""The benchmarks' harness: what the scripts share, so that each benchmark keeps only what it measures.

- servers: two local SecantusDB servers or the given ones, a work directory (:func:`bench_setup`), a local
  Kafka-protocol broker (:func:`local_kafka`);
- data loading: the shared bench collection ``bench.docs`` loaded and scanned once (:func:`load_and_warm`),
  the target's ``bench`` database dropped (:func:`reset_target`) and its count checked (:func:`check_target`),
  a fresh checkpoint path (:func:`fresh_checkpoint`);
- timing a measured process: :func:`run_measured` runs a command to its end, its peak RSS sampled;
- result printing: the report, the JSON and the exit code (:func:`run_bench`), PASS/FAIL (:func:`print_verdicts`);
- the common options and entry: :func:`parser`, :func:`size_options`, :func:`add_server_options`, :func:`main`;
- the mcdc command line (:func:`mcdc`, :func:`show`) and headings (:func:`heading`), which the demo uses too.

Not a public module: scripts import it as ``harness`` (the scripts directory is on ``sys.path`` when a script
runs); importing it puts the repository root on ``sys.path`` for ``tests.support``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import pymongo
from bson.raw_bson import RawBSONDocument
from pymongo import monitoring

if TYPE_CHECKING:
    import psutil

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from replicator.settings.uri import host_set  # noqa: E402
from tests.support.corpus import load_bulk  # noqa: E402
from tests.support.kafka import KafkaBroker  # noqa: E402
from tests.support.servers import ServerPair, connect, drop_user_databases, start_pair  # noqa: E402

#: the shared bench collection (``bench.docs``) and mcdc's --include of it
DB = "bench"
COLL = "docs"
INCLUDE = r"bench\.docs"
SAMPLE_S = 0.05  # RSS sampling period of a measured process

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


class BenchError(Exception):
    """A run crashed, never finished, or left the wrong data: the figures would mean nothing."""


# -- servers and the work directory --------------------------------------------------------------------------


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
def bench_setup(
    prog: str, args: argparse.Namespace, prefix: str, *, load: bool = False
) -> Iterator[tuple[Path, str, str, str]]:
    """(work directory, source URI, target URI, server description) of a benchmark run from its
    ``--logdir``, ``--source`` and ``--target`` (see :func:`work_dir` and :func:`bench_servers`), printed.
    With ``load``, the source's ``bench.docs`` is loaded from ``--docs`` and ``--doc-size`` and scanned once
    first (:func:`load_and_warm`)."""
    with work_dir(args.logdir, prefix) as workdir, bench_servers(prog, args.source, args.target) as uris:
        source, target, server = uris
        print(f"source: {source}\ntarget: {target}\nserver: {server}")
        if load:
            load_and_warm(source, args.docs, args.doc_size)
        yield workdir, source, target, server


@contextmanager
def local_kafka(base_dir: Path) -> Iterator[str]:
    """A local Kafka-protocol broker (noida-db, as the tests use) with its data under ``base_dir``; yields its
    bootstrap address (``127.0.0.1:PORT``) once it answers, and stops it on exit."""
    with KafkaBroker(base_dir) as broker:
        yield broker.bootstrap


# -- data: the shared bench collection -----------------------------------------------------------------------


class _InsertCounter(monitoring.CommandListener):
    """Counts the documents the server acknowledged inserting: progress without querying the server."""

    def __init__(self) -> None:
        self.docs = 0

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        pass

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        if event.command_name == "insert":
            self.docs += int(event.reply.get("n", 0))

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


def _per_s(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else 0.0


def _load_source(uri: str, docs: int, doc_size: int) -> None:
    """Make ``bench.docs`` hold exactly the requested documents, reusing a matching earlier load."""
    wanted = {"_id": COLL, "docs": docs, "doc_size": doc_size, "seed": 0}
    counter = _InsertCounter()
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(uri, event_listeners=[counter])
    with client:
        db = client[DB]
        if db.meta.find_one({"_id": COLL}) == wanted and db[COLL].count_documents({}) == docs:
            print(f"reusing the {docs:,} documents already in {DB}.{COLL}")
            return
        client.drop_database(DB)
        started = time.monotonic()
        failure: list[BaseException] = []

        def load() -> None:
            try:
                load_bulk(client, DB, COLL, docs, doc_size=doc_size)
            except BaseException as exc:  # re-raised in the main thread
                failure.append(exc)

        loader = threading.Thread(target=load, name="load_bulk", daemon=True)
        loader.start()
        while loader.is_alive():
            loader.join(5.0)
            elapsed = time.monotonic() - started
            print(f"  loaded {counter.docs:>10,} / {docs:,}  ({_per_s(counter.docs, elapsed):,.0f} docs/s)", flush=True)
        if failure:
            raise failure[0]
        db.meta.replace_one({"_id": COLL}, wanted, upsert=True)
        size = db.command("collStats", COLL).get("avgObjSize")
        print(f"loaded {docs:,} documents (avgObjSize {size}) in {time.monotonic() - started:.1f} s")


def _warm_source(uri: str) -> float:
    """Read the whole collection once (raw, no decoding) so that the first copy does not read it cold."""
    started = time.perf_counter()
    with connect(uri) as client:
        raw = client.codec_options.with_options(document_class=RawBSONDocument)
        coll = client[DB].get_collection(COLL, codec_options=raw)
        for _ in coll.find({}):
            pass
    return time.perf_counter() - started


def load_and_warm(source: str, docs: int, doc_size: int) -> None:
    """The benchmark's source collection, loaded, then read once so both contenders find it in cache."""
    heading(f"Loading {docs:,} documents of ~{doc_size} bytes into {DB}.{COLL} on the source")
    _load_source(source, docs, doc_size)
    heading("Warming up: one raw scan of the source collection")
    print(f"scanned in {_warm_source(source):.1f} s")


def reset_target(uri: str) -> None:
    """Drop the ``bench`` database of a server (the target, before a copy or a replay)."""
    with connect(uri) as client:
        client.drop_database(DB)


def check_target(uri: str, docs: int, kind: str) -> None:
    """Raise BenchError unless the target's ``bench.docs`` holds ``docs`` documents (``kind``: who copied)."""
    with connect(uri) as client:
        count = client[DB][COLL].count_documents({})
    if count != docs:
        raise BenchError(f"{kind}: the target holds {count:,} documents in {DB}.{COLL}, not {docs:,}")


def fresh_checkpoint(workdir: Path, name: str, *, ending: str = "") -> Path:
    """``workdir / name`` with any earlier checkpoint of that name gone (mcdc keeps <name>.backup beside it).
    ``ending``: a pattern of earlier checkpoints in ``workdir`` whose migrations the new one replaces (the
    target was wiped): they are deleted too, since mcdc refuses a second migration onto a target namespace
    that another one, still resumable, writes."""
    for stale in [*workdir.glob(f"{name}*"), *(workdir.glob(ending) if ending else ())]:
        stale.unlink(missing_ok=True)
    return workdir / name


# -- timing a measured process -------------------------------------------------------------------------------


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


@dataclass
class Measured:
    """One command run to its end by :func:`run_measured`."""

    wall_s: float  # from process start to exit
    stdout: bytes
    peak_rss: int  # the largest sample, bytes (default: the process tree's RSS)
    err_path: Path  # its stderr, kept in the log directory


def run_measured(
    argv: Sequence[str],
    name: str,
    logdir: Path,
    *,
    what: str | None = None,
    timeout: float | None = None,
    sample: Callable[[psutil.Process], int] = tree_rss,
) -> Measured:
    """Run one command to its end (printed first), stdout and stderr to ``logdir/<name>.out`` and ``.err``,
    ``sample`` (default: its tree's RSS) taken every SAMPLE_S. Terminated when anything goes wrong here (Ctrl-C
    included); BenchError, naming it ``what`` (default ``name``), when it exits non-zero or outlasts ``timeout``."""
    import psutil  # a dev dependency: only the benchmarks need it

    print(f"$ {show(argv)}", flush=True)
    what = what or name
    out_path, err_path = logdir / f"{name}.out", logdir / f"{name}.err"
    peak = 0
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        started = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        try:
            watched = psutil.Process(proc.pid)
            while True:
                peak = max(peak, sample(watched))
                try:
                    proc.wait(SAMPLE_S)
                    break
                except subprocess.TimeoutExpired:
                    if timeout is not None and time.perf_counter() - started > timeout:
                        raise BenchError(f"{what} did not finish in {timeout:.0f} s") from None
        finally:
            if proc.poll() is None:  # Ctrl-C or an error here: do not leave it running
                proc.terminate()
                proc.wait()
        wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise BenchError(f"{what} exited {proc.returncode}:\n{err_path.read_text(errors='replace')[-3000:]}")
    return Measured(wall, out_path.read_bytes(), peak, err_path)


# -- result printing -----------------------------------------------------------------------------------------


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


def print_verdicts(targets: dict[str, bool], commands: dict[str, str] | None) -> None:
    """The end of every benchmark report: PASS/FAIL per target, then the commands that were measured."""
    for name, ok in targets.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    if commands:
        print("commands:")
        for name, command in commands.items():
            print(f"  {name}: {command}")


# -- the common options and entry ----------------------------------------------------------------------------


class BenchParser(argparse.ArgumentParser):
    """A benchmark's argument parser: its module docstring as the description, kept as written, and checks of
    the parsed options (see :meth:`error_if`)."""

    def __init__(self, doc: str | None) -> None:
        super().__init__(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
        self._checks: list[tuple[Callable[[argparse.Namespace], bool], str]] = []

    def error_if(self, invalid: Callable[[argparse.Namespace], bool], message: str) -> None:
        """Once parsed by :meth:`parse_checked`, exit with ``message`` and the usage (:meth:`error`) when
        ``invalid(args)``."""
        self._checks.append((invalid, message))

    def parse_checked(self, argv: Sequence[str] | None) -> argparse.Namespace:
        """:meth:`parse_args`, then the checks, in the order they were given."""
        args = self.parse_args(argv)
        for invalid, message in self._checks:
            if invalid(args):
                self.error(message)
        return args


def parser(doc: str | None) -> BenchParser:
    """A benchmark's argument parser, ``doc`` (its module docstring) as the description."""
    return BenchParser(doc)


def size_options(
    parser: argparse.ArgumentParser,
    *,
    docs: tuple[int, str] | None = None,
    doc_size: int | None = None,
    events: tuple[int, str] | None = None,
) -> None:
    """The size options a benchmark takes, only those given, with its defaults: ``--docs`` and ``--events``
    as (default, what they are), ``--doc-size`` as its default."""
    if docs is not None:
        parser.add_argument("--docs", type=int, default=docs[0], help=f"{docs[1]} (default {docs[0]})")
    if doc_size is not None:
        help_text = f"approximate BSON bytes per document (default {doc_size})"
        parser.add_argument("--doc-size", type=int, default=doc_size, help=help_text)
    if events is not None:
        parser.add_argument("--events", type=int, default=events[0], help=f"{events[1]} (default {events[0]})")


def add_server_options(
    parser: argparse.ArgumentParser,
    mcdc_arg_help: str = "one more argument for every mcdc command (repeatable), e.g. --mcdc-arg=--workers=2",
) -> None:
    """The options every benchmark takes: external servers, extra mcdc arguments, a log dir, JSON."""
    parser.add_argument("--source", help="use this source server (only its bench database is touched)")
    parser.add_argument("--target", help="use this target server (its bench database is dropped)")
    parser.add_argument("--mcdc-arg", action="append", default=[], metavar="ARG", help=mcdc_arg_help)
    parser.add_argument("--logdir", type=Path, help="keep mcdc's output and checkpoints here (default: a temp dir)")
    parser.add_argument("--json", action="store_true", help="also print the figures as JSON")


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def sigterm_as_interrupt() -> None:
    """SIGTERM as Ctrl-C: the way out stops the running mcdc and the local servers (a plain SIGTERM left
    them running)."""
    signal.signal(signal.SIGTERM, _interrupted)


def main(
    prog: str,
    parser: BenchParser,
    argv: Sequence[str] | None,
    bench: Callable[[argparse.Namespace], dict[str, Any]],
    report: Callable[[dict[str, Any]], None],
) -> int:
    """A benchmark's entry: its options parsed and checked (``argv``, default the command line's), SIGTERM as
    Ctrl-C, then ``bench(args)`` through :func:`run_bench` (``prog`` names the script in its messages)."""
    args = parser.parse_checked(argv)
    sigterm_as_interrupt()
    return run_bench(prog, lambda: bench(args), report, args.json)
