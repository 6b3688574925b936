"""The ``mcdc`` command line: options -> Settings -> one library call. No I/O logic lives here."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import orjson
import typer
from pymongo.errors import PyMongoError

from . import __version__
from .config import Settings, resolve
from .errors import McdcError, VerifyMismatch
from .progress import make_reporter
from .source.connection import server_message
from .sync import Summary, SyncJob
from .uri import redact

T = TypeVar("T")

app = typer.Typer(
    name="mcdc",
    help="mcdc: MongoDB change-data-capture. Byte-exact sync, resumable after any crash.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

# Shared options. Every default is None ("not given"), so config.resolve can layer flags over MCDC_*
# variables over the --config file over Settings' defaults.
Source = Annotated[str | None, typer.Option("--source", "-s", help="Source MongoDB URI (replica set or mongos).")]
Target = Annotated[str | None, typer.Option("--target", "-t", help="Target URI: mongodb://... (more sinks to come).")]
CheckpointOpt = Annotated[
    Path | None, typer.Option("--checkpoint", "-c", help="Checkpoint file (default: one per source/target pair).")
]
Include = Annotated[
    list[str] | None, typer.Option("--include", help="Regex on db.collection to copy (repeatable; default: all).")
]
Exclude = Annotated[list[str] | None, typer.Option("--exclude", help="Regex on db.collection to skip (repeatable).")]
Rename = Annotated[
    list[str] | None, typer.Option("--rename", help="SRC_NS=DST_NS, a collection or a whole database (repeatable).")
]
ConfigOpt = Annotated[Path | None, typer.Option("--config", help="TOML file of settings (flags win).")]
JsonOpt = Annotated[bool | None, typer.Option("--json", help="Print a machine-readable JSON summary on stdout.")]
ProgressOpt = Annotated[bool | None, typer.Option("--progress/--no-progress", help="Show progress bars.")]
Workers = Annotated[int | None, typer.Option("--workers", "-w", help="Concurrent snapshot workers. [default: 4]")]
Snapshot = Annotated[
    str | None,
    typer.Option("--snapshot", help="initial | always | never | when_needed (as Debezium's snapshot.mode)."),
]
SnapshotOnly = Annotated[
    bool | None, typer.Option("--snapshot-only", help="Copy without replaying changes (standalone sources).")
]
DropTarget = Annotated[
    bool | None, typer.Option("--drop-target", help="Drop target collections that already hold data before copying.")
]
PartitionDocs = Annotated[
    int | None, typer.Option("--partition-docs", help="Split collections into _id ranges of this many documents.")
]
Split = Annotated[
    str | None,
    typer.Option("--split", help="Split large collections into _id ranges: auto (when index-bounded), always, never."),
]
BatchDocs = Annotated[int | None, typer.Option("--batch-docs", help="Documents per write batch. [default: 1000]")]
Verbose = Annotated[bool, typer.Option("--verbose", "-v", help="Log debug details.")]


def _settings(flags: dict[str, Any], config: Path | None, *, need_target: bool = True) -> Settings:
    flags = {k: (tuple(v) if isinstance(v, list) else v) for k, v in flags.items()}
    return resolve(flags, config_file=config, need_target=need_target)


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if not verbose:
        logging.getLogger("pymongo").setLevel(logging.WARNING)


def _run(make: Callable[[], Awaitable[T]]) -> T:
    """Run a library call; user errors become one line on stderr and the error's exit code."""
    try:
        return asyncio.run(make())  # type: ignore[arg-type]
    except McdcError as exc:
        typer.echo(f"mcdc: error: {redact(str(exc))}", err=True)
        raise typer.Exit(exc.exit_code) from None
    except PyMongoError as exc:
        # a server refusal (permissions, a dropped connection that outlived the retries, ...): one line;
        # --verbose logs the traceback for a bug report
        logging.getLogger("mcdc").debug("server error", exc_info=True)
        typer.echo(f"mcdc: error: MongoDB: {server_message(exc)} (--verbose shows where)", err=True)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        typer.echo("mcdc: interrupted; the checkpoint holds the last acknowledged position", err=True)
        raise typer.Exit(130) from None


def _emit_json(data: dict[str, Any]) -> None:
    sys.stdout.write(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode() + "\n")


def _replicate(command: str, flags: dict[str, Any], config: Path | None, verbose: bool) -> None:
    _setup_logging(verbose)

    async def go() -> tuple[Summary, bool]:
        settings = _settings(flags, config)
        reporter = make_reporter(settings.progress and not settings.json_output)
        try:
            return await SyncJob(settings, reporter, command=command).run(), settings.json_output
        finally:
            reporter.close()

    summary, as_json = _run(go)
    if as_json:
        _emit_json(summary.to_json())
    else:
        typer.echo("\n".join(summary.lines()))


@app.command(
    epilog="Example:\n\n  mcdc sync --source mongodb://src:27017/?replicaSet=rs0 --target mongodb://dst:27017 "
    "--workers 8 --exclude 'logs\\..*'",
)
def sync(
    source: Source = None,
    target: Target = None,
    checkpoint: CheckpointOpt = None,
    include: Include = None,
    exclude: Exclude = None,
    rename: Rename = None,
    workers: Workers = None,
    snapshot: Snapshot = None,
    snapshot_only: SnapshotOnly = None,
    drop_target: DropTarget = None,
    partition_docs: PartitionDocs = None,
    split: Split = None,
    batch_docs: BatchDocs = None,
    config: ConfigOpt = None,
    json_output: JsonOpt = None,
    progress: ProgressOpt = None,
    verbose: Verbose = False,
) -> None:
    """One-shot migration: snapshot every selected collection, then replay the changes made meanwhile.

    Records the change stream position first, copies collections (options, views, indexes) with
    concurrent workers, replays changes up to the end of the copy, and exits 0 with a summary. Kill it at
    any moment: the same command resumes without recopying finished partitions.
    """
    flags = dict(locals())
    for key in ("config", "verbose"):
        flags.pop(key)
    _replicate("sync", flags, config, verbose)


@app.command(
    "catch-up",
    epilog="Example (cron, every 5 minutes):\n\n  */5 * * * * mcdc catch-up --source mongodb://src/?replicaSet=rs0 "
    "--target mongodb://dst --checkpoint /var/lib/mcdc/prod.json --no-progress",
)
def catch_up(
    source: Source = None,
    target: Target = None,
    checkpoint: CheckpointOpt = None,
    include: Include = None,
    exclude: Exclude = None,
    rename: Rename = None,
    workers: Workers = None,
    config: ConfigOpt = None,
    json_output: JsonOpt = None,
    progress: ProgressOpt = None,
    verbose: Verbose = False,
) -> None:
    """Resume from the checkpoint, replicate up to the source's current time, and exit 0.

    The unit a cron job runs. A second run on the same checkpoint while one is active exits at once with
    code 3. An interrupted snapshot is finished first.
    """
    flags = dict(locals())
    for key in ("config", "verbose"):
        flags.pop(key)
    _replicate("catch-up", flags, config, verbose)


@app.command(
    epilog="Example:\n\n  mcdc verify --source mongodb://src/?replicaSet=rs0 --target mongodb://dst --json",
)
def verify(
    source: Source = None,
    target: Target = None,
    include: Include = None,
    exclude: Exclude = None,
    rename: Rename = None,
    workers: Workers = None,
    config: ConfigOpt = None,
    json_output: JsonOpt = None,
    verbose: Verbose = False,
) -> None:
    """Compare source and target: counts, every document byte for byte, indexes, collection options.

    Exit 0 when identical; exit 1 with a report (namespace, a few _ids) when not.
    """
    flags = dict(locals())
    for key in ("config", "verbose"):
        flags.pop(key)
    _setup_logging(verbose)

    async def go() -> bool:
        from .verify import verify as run_verify

        report = await run_verify(_settings(flags, config))
        if json_output:
            _emit_json(report.to_json())
        else:
            for line in report.lines():
                typer.echo(line)
        return report.ok

    if not _run(go):
        raise typer.Exit(VerifyMismatch.exit_code)


@app.command()
def version() -> None:
    """Print mcdc's version.

    Example: mcdc version
    """
    typer.echo(f"mcdc {__version__}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
