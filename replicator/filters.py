"""Namespace selection and renaming: pure functions of a namespace, no I/O."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

from .errors import ConfigError
from .events import ChangeEvent, CollectionSpec, Namespace, Op

SYSTEM_DATABASES = frozenset({"admin", "local", "config"})


def _compile(patterns: Iterable[str], flag: str) -> tuple[re.Pattern[str], ...]:
    compiled = []
    for pattern in patterns:
        try:
            compiled.append(re.compile(pattern))
        except re.error as exc:
            raise ConfigError(f"{flag} {pattern!r} is not a valid regular expression: {exc}") from None
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
                raise ConfigError(f"--rename {rule!r} must look like SRC_DB.COLL=DST_DB.COLL or SRC_DB=DST_DB")
            if ("." in src) != ("." in dst):
                raise ConfigError(f"--rename {rule!r} maps a collection to a database (or back); use both or neither")
            if "." in src:
                s_db, s_coll = src.split(".", 1)
                d_db, d_coll = dst.split(".", 1)
                if not all((s_db, s_coll, d_db, d_coll)):
                    raise ConfigError(f"--rename {rule!r} has an empty database or collection name")
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


def keep_event(event: ChangeEvent, selection: Selection) -> bool:
    """Is this event in the selection? A rename is kept when either side is selected."""
    if selection(event.ns):
        return True
    return event.to is not None and selection(event.to)


def rename_event(event: ChangeEvent, renamer: Renamer) -> ChangeEvent:
    """The event with source namespaces mapped to target namespaces (a view's viewOn too)."""
    ns = renamer(event.ns)
    to = renamer(event.to) if event.to is not None else None
    ddl = event.ddl
    if ddl is not None and "viewOn" in ddl and event.ns.coll is not None:
        ddl = {**ddl, "viewOn": renamer(Namespace(event.ns.db, str(ddl["viewOn"]))).coll}
    if ns == event.ns and to == event.to and ddl is event.ddl:
        return event
    return replace(event, ns=ns, to=to, ddl=ddl)


def rename_spec(spec: CollectionSpec, renamer: Renamer) -> CollectionSpec:
    """A catalog entry as it is named on the target."""
    options = spec.options
    if "viewOn" in options:
        options = {**options, "viewOn": renamer(Namespace(spec.ns.db, str(options["viewOn"]))).coll}
    return replace(spec, ns=renamer(spec.ns), options=options)


INDEX_DDL = frozenset({Op.CREATE_INDEXES, Op.DROP_INDEXES})


def make_transform(
    selection: Selection, renamer: Renamer, *, skip_index_ddl: bool = False
) -> Callable[[ChangeEvent], ChangeEvent | None]:
    """The filter/transform stage: drop unselected events (and index DDL while indexes are deferred to
    the end of a snapshot), then rename."""

    def transform(event: ChangeEvent) -> ChangeEvent | None:
        if not keep_event(event, selection):
            return None
        if skip_index_ddl and event.op in INDEX_DDL:
            return None
        return rename_event(event, renamer) if renamer else event

    return transform
