"""mcdc's vocabulary: one declaration per option.

An option's long flag name is its name everywhere: ``--max-batch-size`` on the command line, the
``max-batch-size`` key of a ``--config`` file and of :func:`~replicator.settings.config.settings_from_strings`
(Spark options), and the ``MCDC_MAX_BATCH_SIZE`` environment variable. Each option sets one
:class:`~replicator.settings.config.Settings` field, whose type and default live there; the CLI builds every
command's flags from this table (see cli.py), and config.py parses every layer with it.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping

#: The commands that run a replication job (replicator.job.SyncJob; cutover's catch-up is one).
JOB = ("sync", "catch-up", "tail", "cutover")
#: Of them, those that copy and write to any kind of target (cutover only catches up a MongoDB one).
REPLICATE = ("sync", "catch-up", "tail")
#: Commands that read the source's selected namespaces.
SELECTING = (*JOB, "verify")
COMMANDS = (*SELECTING, "status")

#: MCDC_* variables that are not options but belong to mcdc: --config's file, the test suite's servers,
#: the scripts' virtual environment and the collection the Auto CDC example reads (examples/spark/auto_cdc,
#: beside MCDC_SOURCE). They never draw an "unknown variable" warning.
ENV_CONFIG = "MCDC_CONFIG"
OTHER_ENV = frozenset({ENV_CONFIG, "MCDC_VENV", "MCDC_DATABASE", "MCDC_COLLECTION"})
OTHER_ENV_PREFIXES = ("MCDC_TEST_",)


@dataclasses.dataclass(frozen=True)
class Option:
    """One option: its name, the Settings field it sets, its help and the commands that take it."""

    name: str  # the long flag without its dashes: the config-file key and, upper-cased, the MCDC_ variable
    field: str  # the Settings field it sets (its type and default live on Settings)
    help: str
    commands: tuple[str, ...]
    metavar: str = ""  # "" = from the field's type: INTEGER, NUMBER, TEXT, PATH
    choices: tuple[str, ...] = ()
    short: str = ""  # e.g. "-s"
    aliases: tuple[str, ...] = ()  # other spellings of the flag, e.g. "--format"
    commas: bool = True  # a repeatable option's MCDC_*/Spark text splits at commas (else: a JSON array)
    minimum: int | None = None
    maximum: int | None = None
    panel: str = ""  # the --help panel it is listed in (see PANELS)
    # the help of a command where the common wording does not fit
    help_for: Mapping[str, str] = dataclasses.field(default_factory=dict, compare=False, hash=False)

    @property
    def flag(self) -> str:
        return "--" + self.name

    @property
    def env(self) -> str:
        return "MCDC_" + self.name.upper().replace("-", "_")

    def help_on(self, command: str) -> str:
        return self.help_for.get(command, self.help)


def _choices(*values: str) -> str:
    return "[" + "|".join(values) + "]"


_SNAPSHOT_MODES = ("initial", "always", "never", "when_needed")
_SPLIT_MODES = ("auto", "always", "never")
_FULL_DOCUMENT_MODES = ("updateLookup", "whenAvailable", "required", "default")
_PRE_IMAGE_MODES = ("off", "whenAvailable", "required")
_READ_PREFERENCES = ("primary", "primaryPreferred", "secondary", "secondaryPreferred", "nearest")
_ENVELOPES = ("debezium", "debezium-legacy", "plain")


def _choice(name: str, field_name: str, values: tuple[str, ...], text: str, commands: tuple[str, ...]) -> Option:
    """An option that takes one of ``values``, shown as its metavar ([a|b|c])."""
    return Option(name, field_name, text, commands, metavar=_choices(*values), choices=values)


#: status's help of the selection options: they name the migration whose default checkpoint it reads
_AS_RUN = "With --source and --target: as the migration whose default checkpoint to read was run (repeatable)."
#: --help's panels, in the order shown; each option belongs to one (its table section below)
SOURCE, SELECTION, SNAPSHOT, REPLAY = "Source and target", "Selection", "Snapshot", "Replay"
OUTAGES, EVENTS, SPARK, OUTPUT = "Outages", "Kafka and event targets", "Spark", "Output"
CUTOVER, TRIAL = "Cutover", "Trial server"
PANELS = (SOURCE, SELECTION, SNAPSHOT, REPLAY, OUTAGES, EVENTS, SPARK, CUTOVER, OUTPUT, TRIAL)


def _panel(panel: str, *options: Option) -> tuple[Option, ...]:
    return tuple(dataclasses.replace(option, panel=panel) for option in options)


OPTIONS: tuple[Option, ...] = (
    # where from, where to
    *_panel(
        SOURCE,
        Option(
            "source", "source", "Source MongoDB URI (replica set, mongos, or standalone with --snapshot-only).",
            COMMANDS, metavar="URI", short="-s",
            help_for={"status": "Source MongoDB URI: with --target, it finds the default checkpoint; a "
                      "checkpoint with no lag recorded is measured against its current time.",
                      "verify": "Source MongoDB URI.",
                      "cutover": "Source MongoDB URI: the migration's source, whose writes must have stopped."},
        ),
        Option(
            "target", "target", "Where to: mongodb://..., kafka://HOST:PORT[,...], stdout (or -), jsonl:PATH, "
            "delta:PATH, iceberg:PATH, or a plug-in's scheme.",
            COMMANDS, metavar="URI", short="-t",
            help_for={"verify": "Target MongoDB URI (mongodb:// or mongodb+srv://) to compare with the source.",
                      "status": "Target URI: with --source, finds the default checkpoint.",
                      "cutover": "Target MongoDB URI: the migration's target, proven identical to the source."},
        ),
        Option(
            "checkpoint", "checkpoint", "Checkpoint file (default: one per migration, that is per source, target "
            "and selection, under $XDG_STATE_HOME/mcdc or ~/.local/state/mcdc).",
            (*JOB, "verify", "status"), metavar="PATH", short="-c",
            help_for={"status": "Checkpoint file to read (default: the one of --source and --target).",
                      "verify": "A migration's checkpoint: compare what it copies (its selection, filters and "
                      "field rules, which selection options must then repeat or leave out); a way back's "
                      "compares the old side's part that the migration copied (default: the one of --source "
                      "and --target, where there is one)."},
        ),
        Option(
            "list", "list_migrations", "List the migrations recorded in the state directory ($XDG_STATE_HOME/mcdc or "
            "~/.local/state/mcdc): each one's checkpoint, state, servers and selection.", ("status",),
        ),
        Option(
            "forget", "forget", "Forget a finished migration: delete its checkpoint (with its backup and lock) and "
            "its record; refused while a run holds it, and for a way back not cut over.", ("status",),
            metavar="PATH",
        ),
    ),
    # which namespaces and fields
    *_panel(
        SELECTION,
        Option(
            "include", "include", "Only namespaces whose db.collection matches REGEX (repeatable; default: all).",
            (*SELECTING, "status"), metavar="REGEX",
            help_for={"status": "With --source and --target: the --include of the migration whose default "
                      "checkpoint to read (the selection options are part of its name; repeatable)."},
        ),
        Option("exclude", "exclude", "Skip namespaces whose db.collection matches REGEX (repeatable).",
               (*SELECTING, "status"), metavar="REGEX", help_for={"status": _AS_RUN}),
        Option(
            "rename", "rename", "Write a collection (db.coll=db2.coll2) or a whole database (db=db2) "
            "under another name (repeatable).", (*SELECTING, "status"), metavar="SRC=DST",
            help_for={"verify": "Compare a collection (db.coll=db2.coll2) or a whole database (db=db2) with "
                      "the target's under another name, as sync's --rename wrote it (repeatable).",
                      "status": _AS_RUN},
        ),
        Option(
            "field-exclude", "field_exclude", "Drop a field from db.coll's documents; * in db or coll matches "
            "any characters (repeatable; Debezium's field.exclude.list).", (*SELECTING, "status"),
            metavar="DB.COLL.PATH",
            help_for={"verify": "A field the target was written without, as sync's --field-exclude dropped it "
                      "(repeatable).", "status": _AS_RUN},
        ),
        Option(
            "field-rename", "field_rename", "Rename a field of db.coll's documents to NAME (repeatable; "
            "Debezium's field.renames).", (*SELECTING, "status"), metavar="DB.COLL.PATH=NAME",
            help_for={"verify": "A field the target holds under another name, as sync's --field-rename wrote "
                      "it (repeatable).", "status": _AS_RUN},
        ),
        Option(
            "filter", "filter", "Only the documents of db.coll (matched by REGEX, as --include) that match QUERY, "
            "a MongoDB query in Extended JSON, e.g. 'shop\\.orders={\"region\": \"EU\"}' (repeatable; all that "
            "match a namespace apply).", (*SELECTING, "status"), metavar="REGEX=QUERY", commas=False,
            help_for={"verify": "Compare only the source's documents that match QUERY, as sync's --filter "
                      "copied them (repeatable).", "status": _AS_RUN},
        ),
        Option(
            "allow-unmatched", "allow_unmatched", "A selection rule (--include, --exclude, --filter, --rename, "
            "--field-exclude, --field-rename, --shard-target) that matches no namespace of the source yet is "
            "allowed, with a warning, for a namespace created later (default: refused, so that a typo in a "
            "name copies nothing).", JOB,
        ),
    ),
    # the snapshot
    *_panel(
        SNAPSHOT,
        _choice(
            "snapshot", "snapshot", _SNAPSHOT_MODES, "When to copy the data (Debezium's snapshot.mode).", REPLICATE
        ),
        Option(
            "snapshot-only", "snapshot_only", "Copy without replaying changes (standalone sources): writes "
            "made during the copy are lost.", ("sync", "catch-up"),
        ),
        Option("drop-target", "drop_target", "Replace target collections that already hold data.", REPLICATE),
        Option(
            "shard-target", "shard_target", "A sharded target shards collections matching REGEX (db.coll, as "
            "--include) on KEY, e.g. '{\"region\": 1, \"_id\": \"hashed\"}', instead of as their source is "
            "sharded; '{}' leaves them unsharded (repeatable; first match wins).", REPLICATE, metavar="REGEX=KEY",
        ),
        Option(
            "start-at", "start_at", "With no checkpoint: no snapshot, replay from TIME (ISO-8601, UTC unless "
            "it says, or SECONDS,INCREMENT).", REPLICATE, metavar="TIME",
        ),
        Option(
            "start-after-debezium-offset", "start_after_debezium_offset", "With no checkpoint: no snapshot, "
            "resume the change stream right after a Debezium MongoDB connector's offset (as Kafka Connect stores "
            "it: the value, Kafka Connect's REST answer, or the KEY, tab, VALUE lines of its offsets topic), on the "
            "same topics, a transaction it had begun included (docs/how-to/switch-from-debezium.md).", REPLICATE,
            metavar="JSON|@FILE",
        ),
        Option("workers", "workers", "Collections or _id ranges copied at once.", SELECTING, short="-w",
               minimum=1, help_for={"verify": "Collections or _id ranges compared at once."}),
        Option("partition-docs", "partition_docs", "Split collections into _id ranges of about this many "
               "documents.", SELECTING, minimum=1),
        _choice("split", "split", _SPLIT_MODES, "Split large collections into _id ranges: auto (where a range "
                "read is bounded by the _id index), always, never.", SELECTING),
        Option("batch-docs", "batch_docs", "Documents per snapshot batch.", SELECTING, minimum=1),
        Option("batch-bytes", "batch_bytes", "Bytes per snapshot batch at most.", SELECTING, minimum=1),
        _choice("read-preference", "read_preference", _READ_PREFERENCES, "Where the snapshot's reads, the update "
                "lookups and verify's source reads go (maxStalenessSeconds: from the source URI); each waits "
                "until its server has the state of the stream's start (afterClusterTime). The change stream "
                "reads where the URI says.", SELECTING),
        Option("max-read-rate", "max_read_rate", "Documents read from the source per second at most, by all "
               "workers together, held over any 5 seconds (snapshot and verify; 0: no cap). --engine spark "
               "and the Spark data source give each of their concurrent tasks an equal share.",
               SELECTING, metavar="DOCS", minimum=0),
        Option("queue-batches", "queue_batches", "Batches read ahead per snapshot worker (memory: about "
               "workers x queue-batches x batch-bytes).", JOB, minimum=1),
    ),
    # the change stream
    *_panel(
        REPLAY,
        _choice("full-document", "full_document", _FULL_DOCUMENT_MODES, "The change stream's fullDocument: "
                "updateLookup reads the current document of each update.", JOB),
        _choice("pre-images", "pre_images", _PRE_IMAGE_MODES, "The change stream's fullDocumentBeforeChange: "
                "'before' images for event sinks (MongoDB 6.0+).", REPLICATE),
        Option("max-batch-size", "replay_batch", "Change events per write batch (Debezium's max.batch.size).", JOB,
               minimum=1),
        Option("max-queue-size", "max_queue_events", "Change events read ahead at most (Debezium's "
               "max.queue.size).", JOB, minimum=1),
        _choice("on-history-lost", "on_history_lost", ("fail", "resnapshot"), "When the checkpoint's position "
                "has left the oplog: fail, or take a new snapshot.", REPLICATE),
        _choice("oversize", "oversize", ("fail", "skip"), "Change events over 16 MB the server cannot split, "
                "and records over Kafka's max.request.size: fail, or skip each (logged).", JOB),
        Option("shard", "shards", "A shard's replica set URI, one change stream each (repeatable; default: "
               "listShards).", JOB, metavar="URI"),
        Option("shard-refresh-interval", "shard_refresh_s", "Seconds between looks for shards added or "
               "removed (tail of a mongos).", ("tail",), metavar="SECONDS", minimum=0),
    ),
    # outages
    *_panel(
        OUTAGES,
        Option(
            "connect-timeout", "connect_timeout_s", "Seconds a server may take to answer before it counts as "
            "unreachable.", COMMANDS, metavar="SECONDS", minimum=0,
        ),
        Option(
            "io-timeout", "io_timeout_s", "Seconds a read of the source or a write of documents to the target "
            "may wait for the server's answer before it counts as lost and is retried (index builds and "
            "other DDL are not bounded).", SELECTING, metavar="SECONDS", minimum=1,
        ),
        Option("max-retries", "max_retries", "Retries in a row before giving up: -1 forever, 0 never (default: 16). "
               "tail waits for a server unreachable at start; sync and catch-up do when this is given.", JOB,
               minimum=-1),
        Option("retry-initial-delay", "retry_initial_s", "Seconds before the first retry; doubles each time.",
               JOB, metavar="SECONDS", minimum=0),
        Option("retry-max-delay", "retry_max_s", "Longest wait between retries, in seconds.", JOB,
               metavar="SECONDS", minimum=0),
    ),
    # event sinks: Debezium's conventions
    *_panel(
        EVENTS,
        Option("topic-prefix", "topic_prefix", "Topics are PREFIX.db.collection (Debezium's topic.prefix).",
               (*REPLICATE, "status"), metavar="PREFIX",
               help_for={"status": "The topic prefix of an event-sink target: part of its default checkpoint."}),
        Option("topic-route", "topic_routes", "Namespaces matching REGEX go to TOPIC (\\1 = group 1; first "
               "match wins; repeatable).", REPLICATE, metavar="REGEX=TOPIC"),
        Option("sanitize-names", "sanitize_names", "Avro-safe topic and schema names ([A-Za-z0-9_] only).", REPLICATE),
        Option(
            "envelope", "envelope", "debezium, debezium-legacy (after/patch/filter), or plain (mcdc's own event).",
            REPLICATE, metavar=_choices(*_ENVELOPES), choices=_ENVELOPES, aliases=("--format",),
        ),
        Option("schemas", "schemas", "Wrap key and value in {schema, payload} (Kafka Connect's JSON).", REPLICATE),
        _choice("extended-json", "extended_json", ("canonical", "relaxed", "debezium"), "Extended JSON mode "
                "(canonical is lossless); debezium: Debezium 3.6's own bytes (the Java driver's strict JSON for "
                "documents, relaxed for keys and updatedFields), so that keys and partitions match Debezium's "
                "(--envelope debezium).", REPLICATE),
        _choice("tombstones", "tombstones", ("on", "off"), "A null-value record after each delete "
                "(Debezium's tombstones.on.delete).", REPLICATE),
        Option("tx-metadata", "tx_metadata", "Transaction BEGIN/END records to PREFIX.transaction.", REPLICATE),
        Option("heartbeat-interval", "heartbeat_interval_s", "Seconds between heartbeat records while idle "
               "(0: off).", REPLICATE, metavar="SECONDS", minimum=0),
        Option("kafka-opt", "kafka_opts", "A Kafka producer setting, e.g. compression.type=zstd (repeatable).",
               REPLICATE, metavar="KEY=VALUE"),
        Option("lake-opt", "lake_opts", "--target delta:/iceberg: a Delta storage option (AWS_REGION=...) or an "
               "Iceberg catalog property (type=rest, uri=...) (repeatable).", REPLICATE, metavar="KEY=VALUE"),
        _choice("lake-columns", "lake_columns", ("lossless", "typed"), "--target delta:/iceberg: typed also gives "
                "each top-level field a typed column in the state tables (mixed types: Extended JSON).", REPLICATE),
        Option("lake-compact-every", "lake_compact_every", "--target delta:/iceberg: compact a table's small "
               "files after every N commits to it (0: never).", REPLICATE, metavar="N", minimum=0),
    ),
    # the engine
    *_panel(
        SPARK,
        _choice("engine", "engine", ("asyncio", "spark"), "The loop that runs the pipeline: asyncio (embedded, "
                "one process) or spark (snapshot and replay as PySpark tasks; pip install 'mcdc[spark]').",
                SELECTING),
        Option("spark-master", "spark_master", "--engine spark: the Spark master (local[*], spark://HOST:PORT, "
               "yarn, k8s://...); under spark-submit, its session is used.", SELECTING, metavar="MASTER"),
        Option("spark-conf", "spark_conf", "--engine spark: a Spark setting, e.g. spark.executor.memory=2g "
               "(repeatable).", SELECTING, metavar="KEY=VALUE"),
        Option("replay-partitions", "replay_partitions", "--engine spark: the Spark tasks each replayed batch is "
               "applied by, split by document (0: the cluster's cores).", JOB, metavar="N", minimum=0),
        Option("spark-start-after", "spark_start_after_s", "--engine spark: a catch-up replays from this process "
               "for up to this many seconds, about what Spark takes to start, before it starts Spark for the rest "
               "(0: at once); one that finishes sooner never starts it.", ("catch-up", "cutover"),
               metavar="SECONDS", minimum=0),
    ),
    # cutover
    *_panel(
        CUTOVER,
        Option("verify", "verify", "Compare the target with the source continuously, as verify does, beside the "
               "replay; differences are re-checked after the replay passed them (see /progress).", ("tail",)),
        Option("verify-interval", "verify_interval_s", "tail --verify: seconds from the end of one verify pass "
               "to the start of the next, at least.", ("tail",), metavar="SECONDS"),
        Option("control", "control", "Answer POST /commit[?blockWrites=true] on the metrics port (loopback only): "
               "once canCommit holds, the tail stops and cuts over, as mcdc cutover does.", ("tail",)),
        Option("full-verify", "full_verify", "Compare every document, even after a clean pass of tail --verify "
               "(which else proves those the source has not changed since).", ("cutover",)),
        Option("block-writes", "block_writes", "Block writes on the source first (setUserWriteBlockMode, "
               "MongoDB 6.0+); else stop the application's writes before the cutover.", ("cutover",)),
        Option("reverse-checkpoint", "reverse_checkpoint", "Where the checkpoint of the way back goes (default: "
               "the default checkpoint of --source TARGET --target SOURCE).", ("cutover",), metavar="PATH"),
        Option("release-only", "release_only", "Only give the target's TTLs, which the migration holds still while "
               "it writes, their source's values back, and change nothing else (a migration abandoned rather "
               "than cut over).", ("cutover",)),
    ),
    # output
    *_panel(
        OUTPUT,
        Option("metrics-port", "metrics_port", "Serve Prometheus /metrics and /health on this port (0: any free one); "
               "/health answers 503 after 60 s of retries.",
               REPLICATE, metavar="PORT", minimum=0, maximum=65535),
        Option("metrics-host", "metrics_host", "Address the metrics port listens on.", REPLICATE, metavar="HOST"),
        Option("verify-sample", "verify_sample", "Differing _ids listed per namespace.", ("verify", "cutover"),
               minimum=0),
        Option("json", "json_output", "Print the summary as JSON on stdout.", COMMANDS,
               help_for={"verify": "Print the report as JSON on stdout.",
                         "status": "Print the status as JSON on stdout."}),
        Option("progress", "progress", "Show progress bars (on a terminal).", JOB),
        _choice("log-format", "log_format", ("text", "json"), "Log lines as text, or one JSON object each.",
                COMMANDS),
        Option("verbose", "verbose", "Log mcdc's debug details too.", COMMANDS, short="-v"),
        Option("debug-driver", "debug_driver", "Log the MongoDB driver's commands and server selection "
               "(very verbose).", COMMANDS),
    ),
    # mcdc dev-server: the trial server's oplog, which every checkpoint on it resumes from
    *_panel(
        TRIAL,
        Option("oplog-entries", "oplog_entries", "The server's oplog keeps this many entries at most (one per "
               "document written, updated or deleted): a checkpoint that waits while more are written cannot "
               "resume (exit 4; see --on-history-lost).", ("dev-server",), minimum=1),
        Option("oplog-hours", "oplog_hours", "The server's oplog keeps an entry this many hours at most: a "
               "checkpoint that waits longer cannot resume (exit 4).", ("dev-server",), metavar="HOURS"),
    ),
)  # fmt: skip

BY_NAME: dict[str, Option] = {o.name: o for o in OPTIONS}
BY_FIELD: dict[str, Option] = {o.field: o for o in OPTIONS}
BY_ENV: dict[str, Option] = {o.env: o for o in OPTIONS}


def for_command(command: str) -> list[Option]:
    """The options ``mcdc COMMAND`` takes, in the table's order."""
    return [o for o in OPTIONS if command in o.commands]


def closest(word: str) -> Option | None:
    """The option a misspelled name most likely meant, or None: ``wrokers``, ``MCDC_WROKERS`` and an
    older field-named spelling (``replay_batch``, ``MCDC_RETRY_INITIAL_S``) all find theirs."""
    candidates: dict[str, Option] = {}
    for option in OPTIONS:
        candidates.setdefault(_normal(option.name), option)
        candidates.setdefault(_normal(option.field), option)
    match = difflib.get_close_matches(_normal(word), list(candidates), n=1, cutoff=0.6)
    return candidates[match[0]] if match else None


def _normal(word: str) -> str:
    return word.lower().removeprefix("mcdc_").replace("_", "-")
