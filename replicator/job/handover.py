"""A start where a Debezium MongoDB connector stopped (``--start-after-debezium-offset``): no snapshot, the change
stream resumed right after the connector's offset, its open transaction continued on the same topics.

The offset is read when the job starts (:func:`read`), before any connection; the source is checked against it
once reached (:func:`check`): a per-replica-set offset (a sharded connector's of Debezium 2.x in
``replica_set`` mode) resumes one shard's own stream, which a cluster-wide stream through mongos cannot, and one
of another replica set than the source's is another source's; an offset whose time is later than the source's
is another deployment's. A token that left the oplog fails when the stream opens (exit 4, as a checkpoint's).

The checkpoint records the hand-over; while its position is still the offset's token (nothing acknowledged
since, even across restarts), :func:`carry` tells the sink of the transaction Debezium had begun writing.
"""

from __future__ import annotations

from replicator.checkpoint.debezium_offset import OPTION, DebeziumOffset, parse, read_option
from replicator.checkpoint.store import Checkpoint
from replicator.errors import ConfigError
from replicator.observe.tally import format_ts
from replicator.settings.config import Settings
from replicator.settings.uri import redact
from replicator.sinks.base import Sink
from replicator.source.changestream import current_time, refuse_later_start
from replicator.source.connection import Client, ServerInfo


def read(s: Settings) -> DebeziumOffset | None:
    """The offset the settings name (None: the option is not given), checked against what it goes with. A
    one-line ConfigError if unusable."""
    if s.start_after_debezium_offset is None:
        return None
    if s.start_at is not None:
        raise ConfigError(f"{OPTION} and --start-at both say where to start: drop one of them")
    target = s.target.lower()
    if not (target.startswith(("kafka:", "jsonl:")) or target in ("-", "stdout")):
        raise ConfigError(
            f"{OPTION} continues Debezium's records on its topics: --target {redact(s.target)} is not an event "
            "target (kafka://, stdout or jsonl:)"
        )
    if s.envelope != "debezium" or s.extended_json != "debezium":
        raise ConfigError(
            f"{OPTION}: the records would not be Debezium's bytes (--envelope {s.envelope}, --extended-json "
            f"{s.extended_json}), so keys would land on other partitions and compaction would keep both: pass "
            "--envelope debezium --extended-json debezium"
        )
    if s.engine == "spark":
        raise ConfigError(f"{OPTION} runs with --engine asyncio (the default), not --engine spark")
    return parse(read_option(s.start_after_debezium_offset), prefix=s.topic_prefix)


async def check(offset: DebeziumOffset, client: Client, info: ServerInfo, *, shard_streams: bool) -> None:
    """Refuse an offset this source cannot resume (see the module's docstring)."""
    rs = offset.replica_set
    if rs is not None and (info.kind == "sharded" or shard_streams):
        raise ConfigError(
            f"{OPTION}: a per-replica-set offset (replica set {rs}) resumes that shard's own change stream; mcdc "
            "reads the sharded source's cluster-wide stream through mongos, which its token cannot resume: take a "
            "new snapshot instead (leave the option out)"
        )
    if rs is not None and rs != info.set_name:
        raise ConfigError(
            f"{OPTION}: the offset is of replica set {rs}, the source is {info.set_name or 'not a replica set'}: "
            "it is another source's offset"
        )
    at = offset.position.cluster_time
    if at is not None:
        given = f"(its time {format_ts(at)})"
        refuse_later_start(given, at, await current_time(client), option=OPTION, otherwise="it is another source's")


def record(cp: Checkpoint, offset: DebeziumOffset) -> None:
    """Start ``cp`` at the offset's position, and record the hand-over in it."""
    cp.position = offset.position
    cp.handover = offset.to_json()


def describe(cp: Checkpoint) -> str:
    """The position a hand-over starts after, for the run's log line."""
    at = cp.position.cluster_time
    token = (cp.position.resume_token or {}).get("_data", "")
    where = f"at {format_ts(at)}, " if at is not None else ""
    return f"({where}resume token {str(token)[:24]}...)"


def carry(sink: Sink, cp: Checkpoint) -> None:
    """Tell the sink of the transaction Debezium had begun writing, while nothing was acknowledged since."""
    if cp.handover is None:
        return
    offset = DebeziumOffset.from_json(cp.handover)
    if offset.transaction is not None and cp.position.resume_token == offset.position.resume_token:
        sink.carry_transaction(offset.transaction.id, offset.transaction.counts)
