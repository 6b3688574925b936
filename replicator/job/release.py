"""Giving back what a migration holds on its target: the TTLs it held still (sinks/mongo/ttl.py).

``mcdc cutover`` does it once it proved the target identical, before it reports success; ``mcdc cutover
--release-only`` does it alone, for a migration abandoned rather than cut over, and changes nothing else.
Each held TTL gets the source's value, read from the source now, else the checkpoint's record. Run again
after being cut short (a kill -9 mid-way), it restores what is still held.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from replicator.checkpoint.store import Checkpoint, CheckpointStore
from replicator.errors import ConfigError
from replicator.events import Namespace
from replicator.observe.progress import Reporter
from replicator.observe.tally import listing
from replicator.settings.config import Settings
from replicator.sinks.mongo.ttl import COLLECTION, Held, restore
from replicator.source import catalog
from replicator.source.connection import Client, make_client, probe


@dataclass
class Released:
    """What ``--release-only`` gave back."""

    checkpoint: str
    restored: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def lines(self) -> list[str]:
        if not self.restored:
            return [f"nothing held on the target by {self.checkpoint}"]
        return [f"restored the source's TTLs on the target: {listing(self.restored, 20)} (nothing else changed)"]


async def release_ttls(settings: Settings, source: Client | None, cp: Checkpoint) -> list[str]:
    """Give every TTL the migration holds on the target its source's value (see the module's docstring)."""
    values = Held(cp.held)
    namespaces = {Namespace.parse(ns) for ns in values.record}
    if source is not None:
        for spec in await catalog.describe(source, settings.selection):
            target = settings.renamer(spec.ns)
            namespaces.add(target)
            if "expireAfterSeconds" in spec.options:
                values.hold(str(target), COLLECTION, spec.options["expireAfterSeconds"])
            for index in spec.indexes:
                if "expireAfterSeconds" in index:
                    values.hold(str(target), str(index["name"]), index["expireAfterSeconds"])
    client = make_client(settings.target, timeout_s=settings.connect_timeout_s, durable_writes=True, side="target")
    try:
        await probe(client, settings.target, "target")
        return await restore(client, sorted(namespaces, key=str), values)
    finally:
        await client.close()


async def release_only(settings: Settings, reporter: Reporter) -> Released:
    """``mcdc cutover --release-only``: restore what the checkpoint's migration holds, and nothing else."""
    store = CheckpointStore(settings.checkpoint_path())
    cp = store.load()
    if cp is None:
        raise ConfigError(f"no checkpoint at {store.path}: --release-only gives back what a migration holds")
    source = make_client(settings.source, timeout_s=settings.connect_timeout_s, io_timeout_s=settings.io_timeout_s)
    try:
        await probe(source, settings.source, "source")
        restored = await release_ttls(settings, source, cp)
    finally:
        await source.close()
    if restored:
        reporter.info(f"restored the source's TTLs on the target: {listing(restored, 20)}")
    with store.locked():
        cp = store.load()
        if cp is not None:
            cp.held = {}
            store.save(cp)
    return Released(str(store.path), restored)
