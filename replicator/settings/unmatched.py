"""Rules that name namespaces and match none of the source's. Pure: no I/O.

A slip in a rule's name fails in the dangerous direction: ``--exclude 'shop\\.secret'`` for a collection
called ``shop.secrets`` copies what it was written to keep out, ``--filter 'shop\\.order=...'`` copies every
document of ``shop.orders``. So every rule is checked against the source's namespaces before a migration
writes anything, as ``--include`` is (:func:`replicator.source.catalog.unmatched`): ``--exclude`` against
every namespace, the rules that act on what is copied (``--filter``, ``--rename``, ``--field-exclude``,
``--field-rename``, ``--shard-target``) against the selected ones. ``--allow-unmatched`` is the way to say
that a rule means a namespace created later.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence

from replicator.errors import quoted
from replicator.events import Namespace
from replicator.settings.config import Settings
from replicator.settings.fields import FieldRules
from replicator.settings.shard_target import ShardTargets


def refusal(said: str, allow: str = "--allow-unmatched") -> str:
    """The refusal of what :func:`unmatched_rule` (or an ``--include``'s check) ``said``, with the way to
    allow it (``allow``: the option as this entry point spells it)."""
    return f"{said}: fix the rule, or pass {allow} if it names a namespace created later"


def near(text: str, names: Sequence[str]) -> str:
    """`` (did you mean 'NAME'?)`` for the name of ``names`` closest to ``text`` (a pattern: its escapes
    dropped), or ``""``."""
    found = difflib.get_close_matches(text.replace("\\", ""), list(names), n=1)
    return f" (did you mean {quoted(found[0])}?)" if found else ""


def unmatched_rule(settings: Settings, namespaces: Sequence[Namespace]) -> str | None:
    """The first rule of ``settings`` that matches no namespace of the source (``namespaces``: every
    collection and view it holds, as :func:`~replicator.source.catalog.list_namespaces` lists them), in one
    line; None when each matches one."""
    every = sorted(str(ns) for ns in namespaces if ns.coll is not None)
    selected = sorted((ns for ns in namespaces if ns.coll is not None and settings.selection(ns)), key=str)
    names = [str(ns) for ns in selected]
    for pattern in settings.selection.exclude:
        if not any(pattern.fullmatch(name) for name in every):
            return _said(f"--exclude {quoted(pattern.pattern)}", "namespace", near(pattern.pattern, every))
    for rule, pattern in settings.filters.patterns():
        if not any(pattern.fullmatch(name) for name in names):
            return _said(f"--filter {quoted(rule)}", "selected namespace", near(pattern.pattern, names))
    renamer = settings.renamer
    for (db, coll), (to_db, to_coll) in renamer.collections.items():
        if Namespace(db, coll) not in selected:
            rule = f"--rename {quoted(f'{db}.{coll}={to_db}.{to_coll}')}"
            return _said(rule, "selected namespace", near(f"{db}.{coll}", names))
    databases = sorted({ns.db for ns in selected})
    for db, to_db in renamer.databases.items():
        if db not in databases:
            return _said(f"--rename {quoted(f'{db}={to_db}')}", "database", near(db, databases))
    fields = FieldRules(settings.field_exclude, settings.field_rename).matching_none(selected)
    if fields is not None:
        rule, head = fields
        return _said(rule, "selected namespace", near(head, names))
    shard_rules = ShardTargets.from_rules(settings.shard_target).rules
    for text, (pattern, _) in zip(settings.shard_target, shard_rules, strict=True):
        if not any(pattern.fullmatch(name) for name in names):
            return _said(f"--shard-target {quoted(text)}", "selected namespace", near(pattern.pattern, names))
    return None


def _said(rule: str, what: str, hint: str) -> str:
    return f"{rule} matches no {what} on the source{hint}"
