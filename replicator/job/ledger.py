"""The migrations this machine's runs recorded in the state directory (``mcdc status --list``), and how a
finished one is forgotten (``mcdc status --forget PATH``).

A migration is recorded (checkpoint.registry) when a run of it starts, and its default checkpoint is kept
in the state directory; neither goes away by itself, since a stopped migration can be resumed and holds its
target namespaces until then. Forgetting one deletes its checkpoint (with its backup and lock file) and its
record: its target's copies stay as they are, and are no migration's any more. It is refused while a run
holds the checkpoint, and for a way back that has not been cut over (the one way to carry the new side's
writes back to the old side).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from replicator.checkpoint.registry import Registry, held
from replicator.checkpoint.store import CheckpointStore
from replicator.errors import ConfigError
from replicator.job.migrations import _with_unrecorded, flags
from replicator.replay.recorded import Recorded
from replicator.settings.config import state_dir


def migrations() -> list[dict[str, Any]]:
    """Every recorded migration: its checkpoint, state (running, stopped, cut over, way back, gone), source
    and target identities, and selection (as options)."""
    registry = Registry(state_dir())
    with registry.locked() as leases:
        found = _with_unrecorded(leases)
    out = []
    for lease in found:
        other = held(lease)
        cp = CheckpointStore(Path(lease.checkpoint)).load() if Path(lease.checkpoint).exists() else None
        if other is not None and other.running:
            state = "running"
        elif cp is None:
            state = "gone"
        elif cp.cutover is not None:
            state = "cut over"
        elif cp.reverse_of is not None:
            state = "way back"
        else:
            state = "stopped"
        recorded = cp.recorded if cp is not None and cp.recorded is not None else lease.recorded
        out.append({
            "checkpoint": lease.checkpoint,
            "state": state,
            "source": (cp.source_identity if cp is not None else None) or lease.source,
            "target": (cp.target_identity if cp is not None else None) or lease.target,
            "selection": flags(Recorded.from_json(recorded)) or "everything",
            "way_back_of": (cp.reverse_of or {}).get("checkpoint") if cp is not None else None,
            "updated_at": cp.updated_at if cp is not None else None,
        })  # fmt: skip
    return sorted(out, key=lambda m: str(m["checkpoint"]))


def listing_lines(found: list[dict[str, Any]]) -> list[str]:
    """``status --list`` as text: one line per migration, then how to forget one."""
    if not found:
        return [f"no migration is recorded in {state_dir()}"]
    lines = [f"{m['checkpoint']}  {m['state']}  {m['source']} -> {m['target']}  ({m['selection']})" for m in found]
    return [*lines, "forget a finished one (its checkpoint and record) with: mcdc status --forget CHECKPOINT"]


def forget(path: Path) -> dict[str, Any]:
    """Forget the migration of checkpoint ``path`` (see the module's docstring); what was forgotten."""
    store = CheckpointStore(path)
    real = str(store.real)
    registry = Registry(state_dir())
    with registry.locked() as leases:
        if store.in_use():
            raise ConfigError(f"checkpoint {path}: a run holds it; stop that run first (mcdc keeps what it records)")
        cp = store.load()
        recorded = next((lease for lease in leases if lease.checkpoint == real), None)
        if cp is None and recorded is None:
            raise ConfigError(f"no migration is recorded at {path} (mcdc status --list lists them)")
        if cp is not None and cp.reverse_of is not None and cp.cutover is None:
            raise ConfigError(
                f"checkpoint {path} is the way back of {cp.reverse_of.get('checkpoint') or 'a migration'}: the one "
                "way to carry the new side's writes back to the old side, kept while they may need to go back"
            )
        registry.save([lease for lease in leases if lease.checkpoint != real])
        for file in (store.real, store.backup, store.real.with_name(store.real.name + ".lock")):
            with contextlib.suppress(FileNotFoundError):
                file.unlink()
    state = "cut over" if cp is not None and cp.cutover is not None else "never cut over"
    return {"forgotten": real, "state": state}
