"""The ``mcdc`` command line: options -> Settings -> one library call. No I/O logic lives here.

No command lists its flags: :func:`_command` gives each command's function a signature made from the
option table (options.py), so a flag, its MCDC_* variable and its config-file key cannot drift apart.

Only what every command's help needs is imported here (typer, the option table, Settings); the driver,
the job, the sinks, the metrics server and Spark are imported by the command that runs them, so that
``mcdc --version`` and ``mcdc --help`` cost about what ``import pymongo`` costs (tests/test_start_cost.py).
"""

from __future__ import annotations

import gc
import inspect
import logging
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer

from replicator import __version__
from replicator.errors import EXIT_UNAVAILABLE, McdcError, OutputClosed, VerifyMismatch
from replicator.job import devserver
from replicator.settings.config import Settings
from replicator.settings.flags import CONFIG, EXIT_CODES_HELP, FlagGroup, PanelCommand, epilog, parameter, shown
from replicator.settings.options import for_command

if TYPE_CHECKING:
    from replicator.observe.summary import Summary

T = TypeVar("T")
log = logging.getLogger("mcdc")

app = typer.Typer(
    name="mcdc",
    cls=FlagGroup,
    help="mcdc: MongoDB change-data-capture. Byte-exact sync, resumable after any crash.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(wanted: bool) -> None:
    if wanted:
        typer.echo(f"mcdc {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool | None,
        typer.Option("--version", is_eager=True, callback=_print_version, help="Print mcdc's version and exit."),
    ] = None,
) -> None:
    pass


# --------------------------------------------------------------------------- flags from the option table


def _command(
    name: str, example: str, heading: str = "Example"
) -> Callable[[Callable[[Settings], None]], Callable[[Settings], None]]:
    """Register ``body`` as ``mcdc NAME``, with the flags of the options NAME takes: the flags given
    (and MCDC_*, and --config) resolve into Settings, logging is set up, then ``body(settings)`` runs."""
    help_epilog = epilog(example, heading) + EXIT_CODES_HELP

    def register(body: Callable[[Settings], None]) -> Callable[[Settings], None]:
        def command(config: Path | None = None, **flags: Any) -> None:
            body(_settings(name, flags, config))

        params = [parameter(option, name) for option in for_command(name)]
        command.__signature__ = inspect.Signature([*params, CONFIG])  # type: ignore[attr-defined]
        app.command(name, help=body.__doc__, epilog=help_epilog, cls=PanelCommand)(command)
        return body

    return register


def _settings(command: str, flags: dict[str, Any], config: Path | None) -> Settings:
    from replicator.observe.logs import setup_logging
    from replicator.settings.resolve import resolve

    warnings: list[str] = []  # logged once logging is set up as the settings say
    try:
        settings = resolve(flags, config_file=config, command=command, warn=warnings.append)
        setup_logging(settings.log_format, settings.verbose, driver=settings.debug_driver)
    except McdcError as exc:
        _fail(exc)
    for warning in warnings:
        logging.getLogger("mcdc.config").warning(warning)
    return settings


# --------------------------------------------------------------------------- running a library call


def _fail(exc: McdcError) -> NoReturn:
    from replicator.settings.uri import redact

    _error(redact(str(exc)))
    raise typer.Exit(exc.exit_code) from None


def _error(message: str) -> None:
    """``mcdc: error: MESSAGE`` on stderr, naming Spark's log when this run's Spark wrote one (the rest of
    the story: each task's failure, the JVM's stack)."""
    from replicator.engines.spark.session import console_log

    spark_log = console_log()
    typer.echo(f"mcdc: error: {message}" + (f" (Spark's log: {spark_log})" if spark_log else ""), err=True)


def _run(make: Callable[[], Awaitable[T]]) -> T:
    """Run a library call; user errors become one line on stderr and the error's exit code
    (run_control.ended_by). Spark's log is removed after a run that succeeded, and kept after one that did
    not."""
    import asyncio

    from pymongo.errors import PyMongoError

    from replicator.engines.spark.session import drop_console_log
    from replicator.job.run_control import ended_by

    gc.freeze()  # what the imports made lives as long as the process: no collection need walk it again
    try:
        result: T = asyncio.run(make())  # type: ignore[arg-type]
    except OutputClosed:
        drop_console_log()
        raise typer.Exit(0) from None  # `mcdc tail --target - | head`: the reader has what it wanted
    except (McdcError, PyMongoError) as exc:
        log.debug("run ended by %s", type(exc).__name__, exc_info=True)  # --verbose: where, for a bug report
        code, line = ended_by(exc)
        _error(line)
        raise typer.Exit(code) from None
    except KeyboardInterrupt:
        typer.echo(
            "mcdc: interrupted; the checkpoint holds the last acknowledged position: run the same command again "
            "to go on from there",
            err=True,
        )
        raise typer.Exit(130) from None
    drop_console_log()
    return result


def _emit_json(data: dict[str, Any]) -> None:
    import orjson

    sys.stdout.write(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode() + "\n")


def _replicate(command: str, settings: Settings) -> None:
    """sync, catch-up and tail: one SyncJob, with metrics served when --metrics-port says so."""
    import asyncio
    import dataclasses

    from replicator.job.migrations import followed
    from replicator.job.phases import SyncJob
    from replicator.job.run_control import check_control, commit_hook, served_metrics, stop_on_signals
    from replicator.observe.progress import make_reporter

    async def go() -> tuple[Summary, Any]:
        # SIGINT/SIGTERM stop any of the three at an acknowledged batch, with a summary of what it did
        stop = stop_on_signals()
        control = command == "tail" and settings.control
        if control:
            check_control(settings)
        async with served_metrics(settings) as metrics:
            reporter = make_reporter(
                settings.progress and not settings.json_output, max_read_rate=settings.max_read_rate
            )
            asked: list[bool] = []  # POST /commit was accepted (with blockWrites or not)
            if control and metrics is not None:
                metrics.commit = commit_hook(metrics, stop, asked)
            try:
                run = followed(settings, command)  # a way back follows the selection its checkpoint recorded
                summary = await SyncJob(run, reporter, command=command, stop=stop, metrics=metrics).run()
                if not asked:
                    return summary, None
                from replicator.job.cutover import cutover as run_cutover

                assert metrics is not None
                metrics.set_state("committing")
                result = await run_cutover(dataclasses.replace(settings, block_writes=asked[0]), reporter)
                metrics.set_state("committed")
                return summary, result
            finally:
                reporter.close()

    try:
        summary, committed = _run(go)
    except asyncio.CancelledError:
        raise typer.Exit(130) from None
    _print_summary(summary, settings)
    if summary.never_reached is not None:  # stopped before it could start: not a finished run
        raise typer.Exit(EXIT_UNAVAILABLE)
    if summary.stopped is not None and command != "tail":  # interrupted short of its end (a tail has none)
        raise typer.Exit(130)
    if committed is not None:
        _print_cutover(committed, settings)


def _print_summary(summary: Summary, settings: Settings) -> None:
    """The end-of-run summary: on stdout, unless the events themselves go there (then on stderr)."""
    import orjson

    from replicator.sinks.registry import scheme_of

    to_stderr = scheme_of(settings.target) == "stdout"
    if settings.json_output:
        text = orjson.dumps(summary.to_json(), option=orjson.OPT_INDENT_2).decode()
    else:
        text = "\n".join(summary.lines())
    typer.echo(text, err=to_stderr)


# --------------------------------------------------------------------------- the commands


@_command(
    "sync",
    """mcdc sync --source "mongodb://src:27017/?replicaSet=rs0" --target "mongodb://dst:27017" \\
      --workers 8 --exclude 'logs\\..*'""",
)
def sync(settings: Settings) -> None:
    """One-shot migration: snapshot every selected collection, then replay the changes made meanwhile.

    Records the change stream position first, copies collections (options, views, indexes) with
    concurrent workers, replays changes up to the end of the copy, and exits 0 with a summary. Outages of
    the source or the target are retried with backoff (--max-retries). Kill it at any moment: the same
    command resumes without recopying finished partitions, and each other partition after its last
    acknowledged _id.
    """
    _replicate("sync", settings)


@_command(
    "catch-up",
    """*/5 * * * * mcdc catch-up --source "mongodb://src/?replicaSet=rs0" --target "mongodb://dst" \\
      --checkpoint /var/lib/mcdc/prod.json --no-progress""",
    heading="Example (cron, every 5 minutes)",
)
def catch_up(settings: Settings) -> None:
    """Resume from the checkpoint, replicate up to the source's current time, and exit 0.

    The unit a cron job runs. Its first run (no checkpoint yet) begins as sync does: a snapshot, as
    --snapshot says. A second run on the same checkpoint while one is active exits at once with code 3.
    An interrupted snapshot is finished first.
    """
    _replicate("catch-up", settings)


@_command(
    "tail",
    """mcdc tail --source "mongodb://src/?replicaSet=rs0" --target "mongodb://dst" \\
      --checkpoint /var/lib/mcdc/live.json --metrics-port 9464 --log-format json""",
)
def tail(settings: Settings) -> None:
    """Live replication: follow the source from the checkpoint until SIGINT/SIGTERM, then flush, save
    the checkpoint and exit 0.

    Starts from the checkpoint's resume token; else --start-at; else a snapshot as --snapshot says (or
    now with --snapshot never). Reconnects with backoff through elections, restarts and outages of the
    source or the target; nothing is skipped (events after the checkpoint are applied again,
    idempotently).
    """
    _replicate("tail", settings)


@_command("verify", 'mcdc verify --source "mongodb://src/?replicaSet=rs0" --target "mongodb://dst" --json')
def verify(settings: Settings) -> None:
    """Compare source and target: counts, every document byte for byte, indexes, collection options.

    Exit 0 when identical; exit 1 with a report (namespace, a few _ids) when not; exit 2 when the
    selection matches no namespace on the source.
    """
    from replicator.job.migrations import cut_over, followed

    if settings.engine == "spark":
        from replicator.engines.spark.verify import verify_on_spark as run_verify
    else:
        from replicator.checking.verify import verify as run_verify

    settings = followed(settings, "verify")  # a migration's checkpoint says what it copies
    held = not cut_over(settings)  # TTLs held while a migration writes count as the source's, not after
    report = _run(lambda: run_verify(settings, held=held))
    if settings.json_output:
        _emit_json(report.to_json())
    else:
        for line in report.lines():
            typer.echo(line)
    if not report.ok:
        raise typer.Exit(VerifyMismatch.exit_code)


@_command("status", 'mcdc status --checkpoint /var/lib/mcdc/live.json --source "mongodb://src/?replicaSet=rs0"')
def status(settings: Settings) -> None:
    """Print a checkpoint's position, age, lag and snapshot state (reads the file; changes nothing).

    The checkpoint is --checkpoint's, else the default one of --source and --target (as sync, catch-up
    and tail find it; --config works too).
    """
    from replicator.job.status import status as read_status
    from replicator.job.status import status_lines

    data = _run(lambda: read_status(settings))
    if settings.json_output:
        _emit_json(data)
    else:
        typer.echo("\n".join(status_lines(data)))


@_command(
    "cutover",
    """mcdc cutover --source "mongodb://src/?replicaSet=rs0" --target "mongodb://dst/?replicaSet=rs1" \\
      --checkpoint /var/lib/mcdc/live.json --block-writes""",
)
def cutover(settings: Settings) -> None:
    """End a migration: with the source's writes stopped, prove the target identical, and leave a reverse
    checkpoint for the way back.

    Needs a checkpoint whose snapshot is done (stop the tail on it first). Blocks the source's writes
    with --block-writes (MongoDB 6.0+; else stop the application), catches up to the source's current
    time, verifies every selected document, index and option, and checks that the source took no write
    meanwhile: exit 5 if it did, exit 1 if the target differs. On success prints the cutover point and
    writes the reverse checkpoint: `mcdc tail --source TARGET --target SOURCE` then carries writes made
    on the new side back. Running it again after success only says so. --release-only gives back the
    target's TTLs the migration held still, and does nothing else (a migration abandoned, not cut over).
    """
    from replicator.job.cutover import cutover as run_cutover
    from replicator.job.release import release_only
    from replicator.observe.progress import make_reporter

    reporter = make_reporter(settings.progress and not settings.json_output, max_read_rate=settings.max_read_rate)
    run = release_only if settings.release_only else run_cutover
    try:
        result = _run(lambda: run(settings, reporter))
    finally:
        reporter.close()
    _print_cutover(result, settings)


def _print_cutover(result: Any, settings: Settings) -> None:
    if settings.json_output:
        _emit_json(result.to_json())
    else:
        for line in result.lines():
            typer.echo(line)


@app.command()
def version() -> None:
    """Print mcdc's version.

    Example: mcdc version
    """
    typer.echo(f"mcdc {__version__}")


def dev_server(
    port: Annotated[
        int,
        typer.Option(
            "--port",
            min=1,
            max=65535,
            metavar="PORT",
            help="Port on 127.0.0.1 to serve." + shown(devserver.DEFAULT_PORT),
            show_default=False,
        ),
    ] = devserver.DEFAULT_PORT,
    directory: Annotated[
        Path,
        typer.Option(
            "--dir",
            metavar="DIR",
            help="Data directory; created if missing, kept when the server stops." + shown(devserver.DEFAULT_DIR),
            show_default=False,
        ),
    ] = devserver.DEFAULT_DIR,
    config: Path | None = None,
    **flags: Any,
) -> None:
    """Start a local MongoDB-compatible server to try mcdc on: for trials, not production.

    Runs SecantusDB (pip install SecantusDB), a MongoDB wire-protocol server written in Python, as a
    single-node replica set with change streams, in the foreground. Prints the URI to use once the server
    answers; Ctrl-C stops it cleanly (exit 130), as does SIGTERM (exit 0). The data stays in --dir. Its
    oplog keeps --oplog-entries entries for --oplog-hours at most: a checkpoint on it that waits past
    either (more writes, or more time, since it was saved) can no longer resume.
    """
    settings = _settings("dev-server", flags, config)
    try:
        code = devserver.serve(
            port,
            directory,
            on_ready=typer.echo,
            note=lambda text: typer.echo(f"mcdc dev-server: {text}", err=True),
            oplog_entries=settings.oplog_entries,
            oplog_hours=settings.oplog_hours,
        )
    except McdcError as exc:
        _fail(exc)
    raise typer.Exit(code)


# --port and --dir are its own; the oplog's bounds (and --config) come from the option table, as every
# other command's flags do
dev_server.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [
        *list(inspect.signature(dev_server, eval_str=True).parameters.values())[:2],
        *(parameter(option, "dev-server") for option in for_command("dev-server")),
        CONFIG,
    ]
)
app.command(
    "dev-server",
    cls=PanelCommand,
    epilog=epilog(
        """mcdc dev-server --port 27017 --dir src-data &
        mcdc dev-server --port 27018 --dir dst-data &
        mcdc sync --source "mongodb://127.0.0.1:27017/?replicaSet=secantus" \\
          --target "mongodb://127.0.0.1:27018/?replicaSet=secantus\"""",
        heading="Example (two servers for a trial, then a sync between them)",
    ),
)(dev_server)


#: Each change event allocates a few dozen short-lived objects; with the default first-generation
#: threshold (700) the cyclic GC runs every ~15 events. 10,000 cut normalize + encode CPU by ~12%
#: (measured in-process, batches of 1,000) at the cost of a few MB more garbage awaiting collection.
GC_THRESHOLDS = (10_000, 10, 10)


def main() -> None:
    gc.set_threshold(*GC_THRESHOLDS)
    app()


if __name__ == "__main__":
    main()
