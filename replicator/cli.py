"""The ``mcdc`` command line: options -> Settings -> one library call. No I/O logic lives here."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import orjson
import typer
from pymongo.errors import PyMongoError

from . import __version__
from .config import Settings, resolve
from .errors import ConfigError, McdcError, OutputClosed, VerifyMismatch
from .logs import setup_logging
from .progress import make_reporter
from .sinks.registry import scheme_of
from .source.connection import server_message
from .sync import Summary, SyncJob
from .uri import check_mongo_uri, redact

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
Target = Annotated[
    str | None,
    typer.Option(
        "--target", "-t", help="mongodb://..., kafka://HOST:PORT[,...], stdout (or -), jsonl:PATH, or a plug-in scheme."
    ),
]
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
ShardOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--shard", help="A shard's replica set URI: one change stream each (repeatable; default: listShards)."
    ),
]
BatchDocs = Annotated[int | None, typer.Option("--batch-docs", help="Documents per write batch. [default: 1000]")]
MaxRetries = Annotated[
    int | None, typer.Option("--max-retries", help="-1 forever, 0 never, N attempts in a row. [default: 16]")
]
RetryInitial = Annotated[
    float | None, typer.Option("--retry-initial-delay", help="Seconds before the first retry. [default: 1]")
]
RetryMax = Annotated[
    float | None, typer.Option("--retry-max-delay", help="Longest wait between retries. [default: 120]")
]
Verbose = Annotated[bool, typer.Option("--verbose", "-v", help="Log debug details.")]
# event sinks (kafka://, stdout, jsonl:): Debezium's conventions
TopicPrefix = Annotated[
    str | None, typer.Option("--topic-prefix", help="Topics are PREFIX.db.collection (Debezium's topic.prefix).")
]
TopicRoute = Annotated[
    list[str] | None,
    typer.Option("--topic-route", help="REGEX=TOPIC: namespaces matching REGEX go to TOPIC (\\1 = group; repeatable)."),
]
SanitizeNames = Annotated[
    bool | None, typer.Option("--sanitize-names", help="Avro-safe topic and schema names ([A-Za-z0-9_] only).")
]
EnvelopeOpt = Annotated[
    str | None,
    typer.Option(
        "--envelope", "--format", help="debezium | debezium-legacy (after/patch/filter) | plain (mcdc's own event)."
    ),
]
SchemasOpt = Annotated[
    bool | None, typer.Option("--schemas", help="Wrap key and value in {schema, payload} (Kafka Connect JSON).")
]
ExtJsonOpt = Annotated[
    str | None, typer.Option("--extended-json", help="canonical (lossless, default) | relaxed extended JSON.")
]
TombstonesOpt = Annotated[
    str | None, typer.Option("--tombstones", help="on | off: a null-value record after each delete. [default: on]")
]
TxMetadata = Annotated[
    bool | None, typer.Option("--tx-metadata", help="Transaction BEGIN/END records to PREFIX.transaction.")
]
HeartbeatOpt = Annotated[
    float | None,
    typer.Option("--heartbeat-interval", help="Seconds between heartbeat records while idle (0: off)."),
]
KafkaOpt = Annotated[
    list[str] | None,
    typer.Option("--kafka-opt", help="KEY=VALUE producer setting, e.g. compression.type=zstd (repeatable)."),
]
PreImages = Annotated[
    str | None, typer.Option("--pre-images", help="off | whenAvailable | required: emit 'before' (MongoDB 6.0+).")
]


def _flags(params: dict[str, Any]) -> dict[str, Any]:
    """A command's parameters that are Settings fields (not --config or --verbose)."""
    return {k: v for k, v in params.items() if k not in ("config", "verbose")}


def _settings(flags: dict[str, Any], config: Path | None, *, need_target: bool = True) -> Settings:
    flags = {k: (tuple(v) if isinstance(v, list) else v) for k, v in flags.items()}
    return resolve(flags, config_file=config, need_target=need_target)


def _setup_logging(verbose: bool, fmt: str | None = None) -> None:
    try:
        setup_logging(fmt or os.environ.get("MCDC_LOG_FORMAT") or "text", verbose)
    except McdcError as exc:
        typer.echo(f"mcdc: error: {exc}", err=True)
        raise typer.Exit(exc.exit_code) from None


def _run(make: Callable[[], Awaitable[T]]) -> T:
    """Run a library call; user errors become one line on stderr and the error's exit code."""
    try:
        return asyncio.run(make())  # type: ignore[arg-type]
    except OutputClosed:
        raise typer.Exit(0) from None  # `mcdc tail --target - | head`: the reader has what it wanted
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

    async def go() -> tuple[Summary, Settings]:
        settings = _settings(flags, config)
        reporter = make_reporter(settings.progress and not settings.json_output)
        try:
            return await SyncJob(settings, reporter, command=command).run(), settings
        finally:
            reporter.close()

    _print_summary(*_run(go))


def _print_summary(summary: Summary, settings: Settings) -> None:
    """The end-of-run summary: on stdout, unless the events themselves go there (then on stderr)."""
    to_stderr = scheme_of(settings.target) == "stdout"
    if settings.json_output:
        text = orjson.dumps(summary.to_json(), option=orjson.OPT_INDENT_2).decode()
    else:
        text = "\n".join(summary.lines())
    typer.echo(text, err=to_stderr)


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
    max_retries: MaxRetries = None,
    retry_initial_s: RetryInitial = None,
    retry_max_s: RetryMax = None,
    topic_prefix: TopicPrefix = None,
    topic_routes: TopicRoute = None,
    sanitize_names: SanitizeNames = None,
    envelope: EnvelopeOpt = None,
    schemas: SchemasOpt = None,
    extended_json: ExtJsonOpt = None,
    tombstones: TombstonesOpt = None,
    tx_metadata: TxMetadata = None,
    heartbeat_interval_s: HeartbeatOpt = None,
    kafka_opts: KafkaOpt = None,
    pre_images: PreImages = None,
    config: ConfigOpt = None,
    json_output: JsonOpt = None,
    progress: ProgressOpt = None,
    verbose: Verbose = False,
) -> None:
    """One-shot migration: snapshot every selected collection, then replay the changes made meanwhile.

    Records the change stream position first, copies collections (options, views, indexes) with
    concurrent workers, replays changes up to the end of the copy, and exits 0 with a summary. Outages of
    the source or the target are retried with backoff (--max-retries). Kill it at any moment: the same
    command resumes without recopying finished partitions, and each other partition after its last
    acknowledged _id.
    """
    flags = _flags(locals())
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
    max_retries: MaxRetries = None,
    retry_initial_s: RetryInitial = None,
    retry_max_s: RetryMax = None,
    topic_prefix: TopicPrefix = None,
    topic_routes: TopicRoute = None,
    sanitize_names: SanitizeNames = None,
    envelope: EnvelopeOpt = None,
    schemas: SchemasOpt = None,
    extended_json: ExtJsonOpt = None,
    tombstones: TombstonesOpt = None,
    tx_metadata: TxMetadata = None,
    heartbeat_interval_s: HeartbeatOpt = None,
    kafka_opts: KafkaOpt = None,
    pre_images: PreImages = None,
    config: ConfigOpt = None,
    json_output: JsonOpt = None,
    progress: ProgressOpt = None,
    verbose: Verbose = False,
) -> None:
    """Resume from the checkpoint, replicate up to the source's current time, and exit 0.

    The unit a cron job runs. A second run on the same checkpoint while one is active exits at once with
    code 3. An interrupted snapshot is finished first.
    """
    flags = _flags(locals())
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
    flags = _flags(locals())
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


LogFormat = Annotated[str | None, typer.Option("--log-format", help="text | json (one JSON object per line).")]


@app.command(
    epilog="Example:\n\n  mcdc tail --source mongodb://src/?replicaSet=rs0 --target mongodb://dst "
    "--checkpoint /var/lib/mcdc/live.json --metrics-port 9464 --log-format json",
)
def tail(
    source: Source = None,
    target: Target = None,
    checkpoint: CheckpointOpt = None,
    include: Include = None,
    exclude: Exclude = None,
    rename: Rename = None,
    start_at: Annotated[
        str | None,
        typer.Option("--start-at", help="Without a checkpoint: start here (ISO-8601 time or SECONDS,INCREMENT)."),
    ] = None,
    snapshot: Snapshot = None,
    workers: Workers = None,
    shards: ShardOpt = None,
    on_history_lost: Annotated[
        str | None, typer.Option("--on-history-lost", help="fail | resnapshot, when the position left the oplog.")
    ] = None,
    oversize: Annotated[
        str | None,
        typer.Option("--oversize", help="fail | skip: change events over 16 MB the server cannot split."),
    ] = None,
    max_retries: MaxRetries = None,
    retry_initial_s: RetryInitial = None,
    retry_max_s: RetryMax = None,
    replay_batch: Annotated[
        int | None, typer.Option("--max-batch-size", help="Events per write batch (Debezium's max.batch.size).")
    ] = None,
    max_queue_events: Annotated[
        int | None, typer.Option("--max-queue-size", help="Events read ahead at most (Debezium's max.queue.size).")
    ] = None,
    metrics_port: Annotated[
        int | None, typer.Option("--metrics-port", help="Serve Prometheus /metrics and /health on this port.")
    ] = None,
    metrics_host: Annotated[
        str | None, typer.Option("--metrics-host", help="Address to bind the metrics port. [default: 127.0.0.1]")
    ] = None,
    log_format: LogFormat = None,
    topic_prefix: TopicPrefix = None,
    topic_routes: TopicRoute = None,
    sanitize_names: SanitizeNames = None,
    envelope: EnvelopeOpt = None,
    schemas: SchemasOpt = None,
    extended_json: ExtJsonOpt = None,
    tombstones: TombstonesOpt = None,
    tx_metadata: TxMetadata = None,
    heartbeat_interval_s: HeartbeatOpt = None,
    kafka_opts: KafkaOpt = None,
    pre_images: PreImages = None,
    config: ConfigOpt = None,
    json_output: JsonOpt = None,
    progress: ProgressOpt = None,
    verbose: Verbose = False,
) -> None:
    """Live replication: follow the source from the checkpoint until SIGINT/SIGTERM, then flush, save
    the checkpoint and exit 0.

    Starts from the checkpoint's resume token; else --start-at; else a snapshot as --snapshot says (or
    now with --snapshot never). Reconnects with backoff through elections, restarts and outages of the
    source or the target; nothing is skipped (events after the checkpoint are applied again,
    idempotently).
    """
    flags = _flags(locals())
    _setup_logging(verbose, log_format)

    async def go() -> tuple[Summary, Settings]:
        from .metrics import Metrics, serve

        settings = _settings(flags, config)
        stop = asyncio.Event()
        task = asyncio.current_task()

        def on_signal() -> None:
            if stop.is_set() and task is not None:
                task.cancel()  # a second signal: stop now; the checkpoint is still consistent
            stop.set()

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal)
        metrics = Metrics()
        metrics.set_info(version=__version__, source=redact(settings.source), target=redact(settings.target))
        server = None
        if settings.metrics_port is not None:
            try:
                server = await serve(metrics, settings.metrics_port, settings.metrics_host)
            except OSError as exc:
                raise ConfigError(
                    f"cannot serve metrics on {settings.metrics_host}:{settings.metrics_port}: {exc.strerror}"
                ) from None
        reporter = make_reporter(settings.progress and not settings.json_output)
        try:
            job = SyncJob(settings, reporter, command="tail", stop=stop, metrics=metrics)
            return await job.run(), settings
        finally:
            reporter.close()
            if server is not None:
                server.close()
                await server.wait_closed()

    try:
        summary, settings = _run(go)
    except asyncio.CancelledError:
        raise typer.Exit(130) from None
    _print_summary(summary, settings)


@app.command(
    epilog="Example:\n\n  mcdc status --checkpoint /var/lib/mcdc/live.json --source mongodb://src/?replicaSet=rs0",
)
def status(
    checkpoint: Annotated[Path, typer.Option("--checkpoint", "-c", help="The checkpoint file to read.")],
    source: Annotated[
        str | None, typer.Option("--source", "-s", help="Measure lag against this source's current time.")
    ] = None,
    json_output: JsonOpt = None,
) -> None:
    """Print a checkpoint's position, age, lag and snapshot state (reads the file; changes nothing)."""

    async def go() -> dict[str, Any]:
        from .status import checkpoint_status

        if source is not None:
            check_mongo_uri(source, "--source")
        return await checkpoint_status(checkpoint, source)

    data = _run(go)
    if json_output:
        _emit_json(data)
    else:
        from .status import status_lines

        typer.echo("\n".join(status_lines(data)))


@app.command()
def version() -> None:
    """Print mcdc's version.

    Example: mcdc version
    """
    typer.echo(f"mcdc {__version__}")


#: Each change event allocates a few dozen short-lived objects; with the default first-generation
#: threshold (700) the cyclic GC runs every ~15 events. 10,000 cut normalize + encode CPU by ~12%
#: (measured in-process, batches of 1,000) at the cost of a few MB more garbage awaiting collection.
GC_THRESHOLDS = (10_000, 10, 10)


def main() -> None:
    gc.set_threshold(*GC_THRESHOLDS)
    app()


if __name__ == "__main__":
    main()
