"""Which migration a run goes on with, and that no other migration writes its target namespaces.

* A **way back** (the checkpoint ``mcdc cutover`` wrote) follows the selection its cutover recorded: the
  migration's, reversed. A run of it with another selection is refused.
* A **cutover** (and ``status``) given ``--source`` and ``--target`` alone finds the pair's one migration, and
  cuts over what that migration selected.
* **One writer per target namespace.** A run refuses to start when another migration of the same target,
  running or resumable, maps onto a target namespace it maps onto; it records its own in the registry
  (checkpoint.registry) in the same locked step, so two runs started together cannot both pass.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Sequence
from pathlib import Path

from replicator.checkpoint.registry import Held, Lease, Registry, held
from replicator.checkpoint.store import Checkpoint, CheckpointStore
from replicator.errors import ConfigError
from replicator.events import ChangeEvent, Namespace
from replicator.observe.tally import listing
from replicator.replay.recorded import FIELDS, Recorded
from replicator.replay.stage import Transform
from replicator.settings.config import Settings, state_dir
from replicator.settings.selection import Renamer, Scope, shared_targets
from replicator.sinks.registry import scheme_of
from replicator.source.partitions import Partition


def followed(settings: Settings, command: str) -> Settings:
    """The settings a run of ``command`` follows. A way back's checkpoint decides its selection (the options
    given must be none, or the same); a cutover or a verify given no selection takes its checkpoint's, and a
    cutover given ``--source`` and ``--target`` alone finds the pair's one migration (as status does)."""
    path = settings.checkpoint_path()
    if command == "cutover" and settings.checkpoint is None and not path.exists():
        path = find_migration(settings, path)
    cp = CheckpointStore(path).load()
    if cp is None and command == "verify" and settings.checkpoint is not None:
        raise ConfigError(f"no checkpoint at {path}: verify --checkpoint compares what a migration copies")
    if cp is None or cp.recorded is None:
        return settings
    recorded, given = Recorded.from_json(cp.recorded), Recorded.of(settings)
    if cp.reverse_of is not None or recorded.guard or recorded.keep:  # a way back, or one copied again
        if given != Recorded() and not given.same_options(recorded):
            origin = (cp.reverse_of or {}).get("checkpoint") or "a migration"
            raise ConfigError(
                f"checkpoint {path} is the way back of {origin}: it follows that migration's selection, reversed "
                f"({flags(recorded) or 'everything'}); run it with those options, or with no selection option at all"
            )
    elif command not in ("cutover", "verify") or given != Recorded():
        return settings
    return dataclasses.replace(recorded.applied(settings), checkpoint=path)


def cut_over(settings: Settings) -> bool:
    """Was the migration of these settings' checkpoint cut over (its target's TTLs given back)?"""
    cp = CheckpointStore(settings.checkpoint_path()).load()
    return cp is not None and cp.cutover is not None


def find_migration(settings: Settings, path: Path) -> Path:
    """The one default checkpoint of this source and target when it copies another selection than the
    options say (a migration of --include ..., asked about with --source and --target alone), or the one
    that copies what they say when its file is named after an earlier selection (changed by a run given its
    --checkpoint). Several, or options that select what none of them copies: each one named, whatever their
    selections became (never another migration's checkpoint for the one asked about)."""
    found = settings.pair_checkpoints()
    asked = settings.copies()
    if not found:
        raise ConfigError(
            f"no checkpoint at {path}, the default one of this source and target "
            "(pass --checkpoint if the run was given one)"
        )
    migrations = "; ".join(f"{p} ({_copies_flags(copies) or 'everything'})" for p, copies in found)
    if asked:  # the one that copies what the options say (its file named after an earlier selection)
        found = [one for one in found if one[1] == asked]
        if not found:  # never another migration's: an operator would read its state for this one's
            raise ConfigError(
                f"no migration of this source and target copies {_copies_flags(asked)}: its migrations are "
                f"{migrations}; pass the selection options of one of them, or --checkpoint"
            )
    if len(found) == 1:
        return found[0][0]
    raise ConfigError(
        f"this source and target have {len(found)} migrations: {migrations}; pass --checkpoint, or the "
        "--include (and other selection options) of the one to read"
    )


def flags(recorded: Recorded) -> str:
    """The options that select what ``recorded`` does, as a command line gives them."""
    return _copies_flags({name: list(values) for name, values in recorded.options.items()})


def _copies_flags(copies: dict[str, list[str]]) -> str:
    return " ".join(
        f"--{name.replace('_', '-')} {value}" for name, values in copies.items() if name in FIELDS for value in values
    )


def hold_targets(
    store: CheckpointStore,
    settings: Settings,
    cp: Checkpoint | None,
    *,
    source: str,
    target: str,
    namespaces: Sequence[Namespace],
    keys: Sequence[str] = (),
) -> None:
    """Refuse this run if another migration of ``target`` (a deployment's identity, or any of its other
    names: ``keys``, see :func:`~.preflight.target_keys`) writes a target namespace it would write (mapped
    from the source's ``namespaces``, or named by its ``--include``), or writes the same file; else record it
    in the registry. Before anything is written. A copy of this run's checkpoint (``cp``) elsewhere is this
    same migration: refused only while a run goes on from it."""
    scope = Scope(settings.selection, settings.renamer)
    mine = scope.mapped(namespaces)
    me = Lease(str(store.real), target, source, Recorded.of(settings).to_json(), tuple(sorted(map(str, mine))),
               keys=tuple(keys))  # fmt: skip
    if scheme_of(settings.target) == "stdout":
        return  # each run's standard output is a destination of its own
    registry = Registry(state_dir())
    with registry.locked() as leases:
        kept = []
        for lease in _with_unrecorded(leases):
            if lease.checkpoint == me.checkpoint:
                me = dataclasses.replace(me, owned=lease.owned)
                continue
            other = held(lease)
            if other is None:
                continue
            kept.append(lease)
            same = _same_target(other, me)
            files = [key for key in same if key.startswith("file:")]
            if files and not _same_migration(cp, other):  # one file, one writer: whatever each selects
                raise ConfigError(_file_refusal(other, files[0]))
            shared = _shared(other, scope, mine) if same else []
            if shared and _same_migration(cp, other):
                if other.running:
                    raise ConfigError(
                        f"checkpoint {store.path} is a copy of {lease.checkpoint}, from which an mcdc runs now: "
                        "one run per migration; stop that one first"
                    )
            elif shared:
                raise ConfigError(_refusal(other, shared, store, settings, source=source))
        registry.save([*kept, me])


def own(store: CheckpointStore, namespaces: Iterable[Namespace]) -> set[str]:
    """Record that this migration's copies write these target namespaces (a widened selection's), before
    they do; returns every target namespace recorded as its own so far."""
    registry, path = Registry(state_dir()), str(store.real)
    with registry.locked() as leases:
        mine = next((lease for lease in leases if lease.checkpoint == path), None)
        if mine is None:
            return set()  # not recorded (a standard output's run): the checkpoint's own record serves
        owned = {*mine.owned, *map(str, namespaces)}
        others = [lease for lease in leases if lease.checkpoint != path]
        registry.save([*others, dataclasses.replace(mine, owned=tuple(sorted(owned)))])
    return owned


def record_way_back(path: Path, settings: Settings, *, source: str, target: str, targets: Iterable[Namespace]) -> None:
    """Record the way back a cutover wrote (``settings``: its own) as the old side's writer of ``targets``."""
    me = Lease(str(CheckpointStore(path).real), target, source, Recorded.of(settings).to_json(),
               tuple(sorted(map(str, targets))))  # fmt: skip
    registry = Registry(state_dir())
    with registry.locked() as leases:
        registry.save([*(lease for lease in leases if lease.checkpoint != me.checkpoint), me])


def _same_migration(cp: Checkpoint | None, other: Held) -> bool:
    """Are both checkpoints versions of one migration (one a copy of the other)?"""
    mine = cp.migration_id if cp is not None else None
    return mine is not None and other.checkpoint is not None and other.checkpoint.migration_id == mine


def _target_of(other: Held) -> str:
    cp = other.checkpoint
    return cp.target_identity if cp is not None and cp.target_identity else other.lease.target


def _same_target(other: Held, me: Lease) -> set[str]:
    """The names under which ``other``'s target is this run's (``me``'s): empty when it is another target."""
    theirs = {_target_of(other), other.lease.target, *other.lease.keys}
    return theirs & {me.target, *me.keys}


def _file_refusal(other: Held, key: str) -> str:
    path = other.lease.checkpoint
    state = "running" if other.running else "stopped, resumable"
    go_on = (
        "stop it first, or" if other.running else
        f"to go on with that migration, run it with --checkpoint {path} (and --snapshot always to copy it again);"
    )  # fmt: skip
    return (
        f"target: the file {key.removeprefix('file:')} is written by another migration (checkpoint {path}, "
        f"{state}), under this name or another (a symbolic link, another --topic-prefix): one migration per file, "
        f"whose snapshot or --drop-target would empty it under the other; {go_on} give this one a file of its own"
    )


def guard_writes(store: CheckpointStore, transform: Transform) -> Transform:
    """``transform``, refusing (ConfigError, one line) an event that would write, create, drop or rename a
    target namespace another migration of this target selects: an overlap of two selections made after both
    started (a collection created on either source, or renamed onto a name, that both select), which would
    otherwise mix the two copies or drop the other's. Each target namespace is asked once per run (in the
    registry), the first time an event reaches it: before that event is written."""
    asked: set[Namespace] = set()
    last: list[Namespace | None] = [None]  # a run of events of one namespace object is not hashed again

    def guarded(event: ChangeEvent) -> ChangeEvent | None:
        out = transform(event)
        if out is None or (out.ns is last[0] and out.to is None):
            return out
        for ns in (out.ns, out.to):
            if ns is None or ns.coll is None or ns in asked:
                continue
            problem = _foreign(store, ns, out)
            if problem is not None:
                raise ConfigError(problem)
            asked.add(ns)
        last[0] = out.ns
        return out

    return guarded


def _foreign(store: CheckpointStore, ns: Namespace, event: ChangeEvent) -> str | None:
    """Why ``event`` may not reach target namespace ``ns``: another migration of the same target selects it."""
    registry, path = Registry(state_dir()), str(store.real)
    with registry.locked() as leases:
        me = next((lease for lease in leases if lease.checkpoint == path), None)
        if me is None:
            return None  # not recorded (a standard output's run)
        held_me = held(me)
        mine = held_me.checkpoint if held_me is not None else None
        for lease in _with_unrecorded(leases):
            other = held(lease) if lease.checkpoint != path else None
            if other is None or not _same_target(other, me) or _same_migration(mine, other):
                continue
            recorded = Recorded.from_json(other.recorded)
            if not Scope(recorded.selection, Renamer.from_rules(recorded.rename))(ns):
                continue
            state = "running" if other.running else "stopped, resumable"
            return (
                f"target: {ns}, which this run's {event.op.value} of {event.origin or event.ns} would reach, is "
                f"selected by another migration of this target (checkpoint {lease.checkpoint}, "
                f"{flags(recorded) or 'everything'}, {state}): one migration per target namespace; narrow one of "
                f"the two selections (--include, --exclude) so that only one of them writes {ns}"
            )
    return None


def _shared(other: Held, scope: Scope, mine: set[Namespace]) -> list[Namespace]:
    """The target namespaces ``other`` and this run (``scope``, mapping ``mine``) would both write."""
    recorded = Recorded.from_json(other.recorded)
    theirs = Scope(recorded.selection, Renamer.from_rules(recorded.rename))
    targets = {Namespace.parse(ns) for ns in other.lease.targets}
    if other.checkpoint is not None:  # what its snapshot copied, as its selection maps it now
        targets |= theirs.mapped(Partition.from_json(p).ns for p in other.checkpoint.snapshot.plan)
    return shared_targets(scope, mine, theirs, targets)


def _refusal(other: Held, shared: list[Namespace], store: CheckpointStore, settings: Settings, *, source: str) -> str:
    path, what = other.lease.checkpoint, flags(Recorded.from_json(other.recorded)) or "everything"
    names = listing([str(ns) for ns in shared], 5)
    cp = other.checkpoint
    same_source = (cp.source_identity if cp is not None and cp.source_identity else other.lease.source) == source
    if same_source and settings.checkpoint is None and not store.real.exists():
        return (
            f"this source and target already have a migration that writes {names} (checkpoint {path}, {what}): "
            f"to change its selection, run with --checkpoint {path} and the new options; to run a second "
            "migration beside it, select only namespaces it does not write (--include, --exclude)"
        )
    state = "running" if other.running else "stopped, resumable"
    written = f"the target's {names} {'is' if len(shared) == 1 else 'are'} written by"
    origin = (cp.reverse_of or {}).get("checkpoint") if cp is not None else None
    if cp is not None and cp.reverse_of is not None:  # never advise throwing a way back away
        return (
            f"{written} the way back of {origin or 'a migration'} (checkpoint {path}, as its cutover wrote it, "
            f"{state}): one way back per migration; run it with --checkpoint {path} (the command its cutover "
            "printed), not another checkpoint"
        )
    go_on = (
        "stop it first, or select only" if other.running else
        f"to go on with that migration, run it with --checkpoint {path} (and --snapshot always to copy it "
        "again); to run another one beside it, select only"
    )  # fmt: skip
    return (
        f"{written} another migration (checkpoint {path}, {what}, {state}): one migration per target "
        f"namespace; {go_on} namespaces it does not write (--include, --exclude)"
    )


def _with_unrecorded(leases: list[Lease]) -> list[Lease]:
    """The registry's migrations, and the default checkpoints in the state directory that no run recorded
    there (an older mcdc's)."""
    known = {lease.checkpoint for lease in leases}
    found = list(leases)
    for path in sorted(state_dir().glob("checkpoint-*.json")):
        real = str(CheckpointStore(path).real)
        if real in known:
            continue
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and data.get("target_identity"):
            found.append(Lease(real, str(data["target_identity"]), str(data.get("source_identity") or ""),
                               dict(data.get("recorded") or {})))  # fmt: skip
    return found
