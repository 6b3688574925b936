"""Namespace selection and renaming: pure functions of a namespace, no I/O."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from replicator.errors import ConfigError, quoted
from replicator.events import ChangeEvent, CollectionSpec, Namespace, Op
from replicator.settings.fields import FieldRules, transform_fields
from replicator.settings.filters import DocumentFilters, transform_filters

SYSTEM_DATABASES = frozenset({"admin", "local", "config"})
#: a punctuation character escaped in a regular expression (``\\.``): the character itself
_ESCAPED = re.compile(r"\\([^A-Za-z0-9])")
#: what makes a pattern more than one name (outside an escape; an unescaped dot matches itself too)
_SPECIAL = frozenset("\\^$*+?{}[]|()")


def _compile(patterns: Iterable[str], flag: str) -> tuple[re.Pattern[str], ...]:
    compiled = []
    for pattern in patterns:
        try:
            compiled.append(re.compile(pattern))
        except re.error as exc:
            raise ConfigError(f"{flag} {quoted(pattern)} is not a valid regular expression: {exc}") from None
    return tuple(compiled)


@dataclass(frozen=True)
class Selection:
    """Which namespaces are replicated.

    A namespace is selected when it is not a system namespace (admin, local, config, ``system.*``), matches
    one ``include`` pattern (all when there are none), and matches no ``exclude`` pattern. Patterns are
    regular expressions matched against the whole ``db.collection``, as Debezium's include lists are.
    """

    include: tuple[re.Pattern[str], ...] = ()
    exclude: tuple[re.Pattern[str], ...] = ()

    @classmethod
    def from_patterns(cls, include: Sequence[str] = (), exclude: Sequence[str] = ()) -> Selection:
        return cls(_compile(include, "--include"), _compile(exclude, "--exclude"))

    def database(self, db: str) -> bool:
        """Could any collection of this database be selected? (cheap pre-filter for listings)"""
        return db not in SYSTEM_DATABASES

    def named(self) -> list[Namespace]:
        """The namespaces the ``include`` patterns name literally (``a\\.x`` names ``a.x``): selected as soon
        as they exist, whether or not they do yet."""
        out = []
        for pattern in self.include:
            if _SPECIAL & set(_ESCAPED.sub("", pattern.pattern)):
                continue
            db, dot, coll = _ESCAPED.sub(r"\1", pattern.pattern).partition(".")
            if dot and db and coll and pattern.fullmatch(f"{db}.{coll}") and self(Namespace(db, coll)):
                out.append(Namespace(db, coll))
        return out

    def databases(self) -> tuple[str, ...] | None:
        """The databases the ``include`` patterns name literally (``shop\\..*`` and ``shop\\.orders`` both
        name ``shop``): the source's databases then need no listing. None when there is no include pattern,
        or one does not name its database literally (``.*\\.orders``, ``(a|b)\\..*``)."""
        names: set[str] = set()
        for pattern in self.include:
            head, dot, _ = pattern.pattern.partition("\\.")
            bare = _ESCAPED.sub("", head)
            if not dot or not head or _SPECIAL & set(bare) or "." in bare or "|" in _ESCAPED.sub("", pattern.pattern):
                return None
            names.add(_ESCAPED.sub(r"\1", head))
        return tuple(sorted(n for n in names if self.database(n))) if names else None

    def __call__(self, ns: Namespace) -> bool:
        if ns.db in SYSTEM_DATABASES:
            return False
        if ns.coll is None:  # database-wide event: kept when any collection could be
            return True
        if ns.coll.startswith("system."):
            return False
        text = f"{ns.db}.{ns.coll}"
        if self.include and not any(p.fullmatch(text) for p in self.include):
            return False
        return not any(p.fullmatch(text) for p in self.exclude)


@dataclass(frozen=True)
class Renamer:
    """Maps source namespaces to target namespaces (``--rename SRC=DST``; a name without a dot is a
    whole database). Collection rules win over database rules."""

    collections: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)
    databases: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_rules(cls, rules: Sequence[str]) -> Renamer:
        colls: dict[tuple[str, str], tuple[str, str]] = {}
        dbs: dict[str, str] = {}
        for rule in rules:
            src, sep, dst = rule.partition("=")
            src, dst = src.strip(), dst.strip()
            if not sep or not src or not dst:
                raise ConfigError(f"--rename {quoted(rule)} must look like SRC_DB.COLL=DST_DB.COLL or SRC_DB=DST_DB")
            if ("." in src) != ("." in dst):
                raise ConfigError(
                    f"--rename {quoted(rule)} maps a collection to a database (or back); use both or neither"
                )
            if "." in src:
                s_db, s_coll = src.split(".", 1)
                d_db, d_coll = dst.split(".", 1)
                if not all((s_db, s_coll, d_db, d_coll)):
                    raise ConfigError(f"--rename {quoted(rule)} has an empty database or collection name")
                colls[(s_db, s_coll)] = (d_db, d_coll)
            else:
                dbs[src] = dst
        return cls(colls, dbs)

    def __bool__(self) -> bool:
        return bool(self.collections or self.databases)

    def __call__(self, ns: Namespace) -> Namespace:
        if ns.coll is not None:
            hit = self.collections.get((ns.db, ns.coll))
            if hit is not None:
                return Namespace(*hit)
        return Namespace(self.databases.get(ns.db, ns.db), ns.coll)

    def inverse(self) -> Renamer:
        return Renamer({v: k for k, v in self.collections.items()}, {v: k for k, v in self.databases.items()})

    def shadowed(self, ns: Namespace) -> bool:
        """Does ``ns`` map onto a target that a collection rule gives to another source namespace?
        (``--rename legacy.users=app.users_legacy``: a source ``app.users_legacy`` would land on the same
        target, which belongs to the rule.) Such a namespace is not replicated."""
        if ns.coll is None or (ns.db, ns.coll) in self.collections:
            return False
        target = self(ns)
        return any(dst == (target.db, target.coll) for dst in self.collections.values())


@dataclass(frozen=True)
class Scope:
    """The target namespaces a run may write, drop or rename: exactly those its selection maps to.

    A target namespace is in scope when a selected source namespace is renamed onto it. Everything else
    on the target (other databases, collections that exist only there) is never touched.
    """

    selection: Selection = field(default_factory=Selection)
    renamer: Renamer = field(default_factory=Renamer)

    def source_of(self, target: Namespace) -> Namespace | None:
        """The selected source namespace that maps to ``target``, or None when ``target`` is not ours. A
        target named by a collection rule belongs to that rule's source alone."""
        if target.coll is None:
            return None
        for candidate in (self.renamer.inverse()(target), target):
            if self.selection(candidate) and self.renamer(candidate) == target and not self.renamer.shadowed(candidate):
                return candidate
        return None

    def __call__(self, target: Namespace) -> bool:
        return self.source_of(target) is not None

    def mapped(self, namespaces: Iterable[Namespace]) -> set[Namespace]:
        """The target namespaces these source namespaces, and those the ``--include`` patterns name (which
        may not exist yet), are written to."""
        out = set()
        for ns in [*namespaces, *self.selection.named()]:
            if ns.coll is not None and self.selection(ns) and not self.renamer.shadowed(ns):
                out.add(self.renamer(ns))
        return out

    def outside(self, event: ChangeEvent) -> Namespace | None:
        """The target namespace a DDL event would touch that is not ours, if any (a dropDatabase touches only
        what :meth:`database_drops` names)."""
        if event.op is Op.DROP_DATABASE:
            return None
        for ns in (event.ns, event.to):
            if ns is not None and not self(ns):
                return ns
        return None

    def database_drops(self, source_db: str, target_db: str, collections: Iterable[str]) -> list[Namespace]:
        """What a ``dropDatabase`` of ``source_db`` drops among the ``collections`` of ``target_db`` (the
        database it is renamed to): those a selected namespace of ``source_db`` maps to, and no other."""
        inverse = {dst: Namespace(*src) for src, dst in self.renamer.collections.items() if src[0] == source_db}
        out = []
        for name in collections:
            target = Namespace(target_db, name)
            for candidate in (Namespace(source_db, name), inverse.get((target_db, name))):
                if candidate is None or not self.selection(candidate) or self.renamer.shadowed(candidate):
                    continue
                if self.renamer(candidate) == target:
                    out.append(target)
                    break
        return out


@dataclass(frozen=True)
class Image(Selection):
    """The target namespaces a migration writes, as the selection of a run that reads them: its way back,
    whose source is that migration's target. A namespace is selected when the migration maps a namespace
    of its selection onto it (``of``, its :class:`Scope`), whether or not that one exists.

    ``origin`` is the migration's own selection options as JSON, which the way back's checkpoint records."""

    of: Scope = field(default_factory=Scope)
    origin: str = ""

    def __call__(self, ns: Namespace) -> bool:
        if ns.db in SYSTEM_DATABASES:
            return False
        if ns.coll is None:  # database-wide event: kept when any collection could be (as Selection does)
            return True
        return not ns.coll.startswith("system.") and self.of(ns)

    def named(self) -> list[Namespace]:
        return [self.of.renamer(ns) for ns in self.of.selection.named()]


def target_databases(selection: Selection, renamer: Renamer) -> Selection:
    """Every collection of the target databases ``selection`` maps to, when it names its databases
    literally (see :meth:`Selection.databases`): listing the target then needs no listDatabases. Else
    every target database."""
    named = selection.databases()
    if named is None:
        return Selection()
    dbs = {renamer(Namespace(db, None)).db for db in named}
    dbs |= {target[0] for source, target in renamer.collections.items() if source[0] in named}
    return Selection.from_patterns([re.escape(db) + r"\..*" for db in sorted(dbs)])


def shared_targets(
    mine: Scope, my_targets: Iterable[Namespace], theirs: Scope, their_targets: Iterable[Namespace]
) -> list[Namespace]:
    """The target namespaces two migrations would both write: those each maps (``*_targets``, from
    :meth:`Scope.mapped`) that the other's selection and renames map onto too, existing or not."""
    shared = {ns for ns in my_targets if theirs(ns)} | {ns for ns in their_targets if mine(ns)}
    return sorted(shared, key=str)


def check_collisions(selected: Iterable[Namespace], renamer: Renamer) -> None:
    """Refuse two selected source namespaces that ``--rename`` maps onto one target namespace: their
    documents would mix, and either one's drop would drop the other's."""
    seen: dict[Namespace, Namespace] = {}
    for ns in sorted(selected, key=str):
        target = renamer(ns)
        if renamer.shadowed(ns):
            owner = renamer.inverse()(target)
            raise ConfigError(
                f"{ns} would be written to {target}, which --rename gives to {owner}; exclude {ns} (--exclude) "
                "or rename it elsewhere"
            )
        other = seen.setdefault(target, ns)
        if other != ns:
            raise ConfigError(
                f"{other} and {ns} would both be written to {target} (--rename); exclude one of them "
                "(--exclude) or rename it elsewhere"
            )


def check_copy_within(
    selected: Iterable[Namespace], existing: Iterable[Namespace], selection: Selection, renamer: Renamer
) -> None:
    """Source and target are one deployment (a copy made with ``--rename``): refuse any mapping that
    would write over the source. Every selected namespace must be renamed onto a namespace that does
    not exist on the source, and that the selection does not read (else replication would copy its
    own writes again, forever)."""
    on_source = set(existing)
    for ns in selected:
        target = renamer(ns)
        if target == ns:
            problem = "is not renamed, so it would be written onto itself"
        elif target in on_source:
            problem = f"is renamed onto {target}, which exists on the source"
        elif selection(target):
            problem = f"is renamed onto {target}, which the selection also reads: it would copy its own writes"
        else:
            continue
        raise ConfigError(
            f"source and target are the same deployment, and {ns} {problem}; narrow --include/--exclude "
            "to the namespaces to copy and --rename each to a new name"
        )


def keep_event(event: ChangeEvent, selection: Selection) -> bool:
    """Is this event in the selection? A rename is kept when either side is selected."""
    if selection(event.ns):
        return True
    return event.to is not None and selection(event.to)


def bound_rename(event: ChangeEvent, selection: Selection) -> ChangeEvent:
    """A rename that crosses the selection's edge, as the target sees it.

    Renamed out of the selection, the collection leaves what the target mirrors: it is a drop of the
    old name (the new name is not ours to create or overwrite). Renamed into the selection, whatever the
    target held under the new name was replaced: a drop of the new name, after which the caller copies
    the collection from the source (its earlier changes were never replicated)."""
    if event.op is not Op.RENAME or event.to is None:
        return event
    source_in, target_in = selection(event.ns), selection(event.to)
    if source_in and target_in:
        return event
    if source_in:
        return replace(event, op=Op.DROP, to=None, ddl=None)
    return replace(event, op=Op.DROP, ns=event.to, to=None, ddl=None)


def renamed_into_selection(event: ChangeEvent, selection: Selection) -> bool:
    """Does this rename bring a collection whose changes were never replicated into the selection?"""
    return event.op is Op.RENAME and event.to is not None and selection(event.to) and not selection(event.ns)


def rename_event(event: ChangeEvent, renamer: Renamer) -> ChangeEvent:
    """The event with source namespaces mapped to target namespaces (a view's viewOn too)."""
    ns = renamer(event.ns)
    to = renamer(event.to) if event.to is not None else None
    ddl = event.ddl
    if ddl is not None and "viewOn" in ddl and event.ns.coll is not None:
        ddl = {**ddl, "viewOn": renamer(Namespace(event.ns.db, str(ddl["viewOn"]))).coll}
    if ns == event.ns and to == event.to and ddl is event.ddl:
        return event
    return replace(event, ns=ns, to=to, ddl=ddl, origin=event.ns)


def rename_spec(spec: CollectionSpec, renamer: Renamer) -> CollectionSpec:
    """A catalog entry as it is named on the target."""
    options = spec.options
    if "viewOn" in options:
        options = {**options, "viewOn": renamer(Namespace(spec.ns.db, str(options["viewOn"]))).coll}
    return replace(spec, ns=renamer(spec.ns), options=options)


INDEX_DDL = frozenset({Op.CREATE_INDEXES, Op.DROP_INDEXES})


def make_transform(
    selection: Selection,
    renamer: Renamer,
    *,
    skip_index_ddl: bool = False,
    fields: FieldRules | None = None,
    filters: DocumentFilters | None = None,
) -> Callable[[ChangeEvent], ChangeEvent | None]:
    """The filter/transform stage: drop unselected events (and index DDL while indexes are deferred to
    the end of a snapshot), bound renames to the selection (see :func:`bound_rename`), apply the document
    filters (``--filter``: on the source's document, before any field rule), then the field rules (named by
    source namespace), then rename."""
    edit = transform_fields(fields) if fields else None
    keep = transform_filters(filters) if filters else None
    # a document event's fate depends on its namespace alone: kept or not, and the target namespace it goes
    # to (the namespace itself where --rename leaves it), worked out once per namespace
    targets: dict[Namespace, Namespace | None] = {}

    def target_of(ns: Namespace) -> Namespace | None:
        if len(targets) >= _MEMO_MOST:
            targets.clear()
        target = None
        if selection(ns) and not (renamer and renamer.shadowed(ns)):
            target = renamer(ns) if renamer else ns
        targets[ns] = target
        return target

    # the last namespace seen and its target: a run of events of one Namespace object (the stream reader
    # makes one per namespace) is not hashed again, Namespace's hash and == being Python calls
    last: list[Any] = [None, None]

    def transform(event: ChangeEvent) -> ChangeEvent | None:
        if event.op in DOCUMENT_OPS:
            ns = event.ns
            if ns is last[0]:
                target = last[1]
            else:
                target = targets.get(ns, _UNKNOWN)
                if target is _UNKNOWN:
                    target = target_of(ns)
                last[0], last[1] = ns, target
            if target is None:
                return None
            if keep is not None:
                kept = keep(event)
                if kept is None:
                    return None
                event = kept
            if edit is not None:
                event = edit(event)
            return event if target is ns or target == ns else replace(event, ns=target, origin=ns)
        if not keep_event(event, selection) or (renamer and renamer.shadowed(event.ns)):
            return None
        if skip_index_ddl and event.op in INDEX_DDL:
            return None
        event = bound_rename(event, selection)
        if edit is not None:
            event = edit(event)
        return rename_event(event, renamer) if renamer else event

    return transform


#: the ops of events about one document (a rename or DDL goes the general way)
DOCUMENT_OPS = frozenset({Op.READ, Op.INSERT, Op.UPDATE, Op.REPLACE, Op.DELETE})
_UNKNOWN: Any = object()
#: namespaces remembered by one transform before it starts again (the distinct ones of a deployment)
_MEMO_MOST = 10_000
