"""Events: the one event type between stages (:mod:`.model`, re-exported here, where plug-ins import it),
raw change documents -> events (:mod:`.normalize`), every event's place in one total order
(:mod:`.positions`), an update as MongoDB operators (:mod:`.update_ops`), and an event as a table row
(:mod:`.rows`, the lake targets' and the Spark data source's schema). Pure: no I/O."""

from replicator.events.model import (
    ChangeEvent,
    CollectionSpec,
    Namespace,
    Op,
    Position,
    ShardSpec,
    Transaction,
    UpdateDescription,
    by_namespace,
    ts_from_json,
    ts_to_json,
)

__all__ = [
    "ChangeEvent",
    "CollectionSpec",
    "Namespace",
    "Op",
    "Position",
    "ShardSpec",
    "Transaction",
    "UpdateDescription",
    "by_namespace",
    "ts_from_json",
    "ts_to_json",
]
