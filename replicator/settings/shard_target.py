"""``--shard-target 'REGEX=KEY'``: the shard key a sharded target gives collections, declared by the user.
Pure: no I/O.

REGEX is matched against the source's whole ``db.collection``, as ``--include`` is; the first rule that
matches wins. KEY is a shard key pattern in Extended JSON (``{"region": 1, "_id": "hashed"}``): each field 1
(a range) or "hashed", at most one of them hashed. It applies instead of the source's own sharding: it
shards a collection whose source is not sharded, shards a sharded one's target on another key, and shards
a target collection that already exists unsharded (and is empty). The empty key ``{}`` leaves the target
collection unsharded, or as it is when it exists: mcdc then writes into it without sharding anything.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from replicator.errors import ConfigError, quoted
from replicator.events import Namespace
from replicator.settings.rules import regex_and_document


@dataclass(frozen=True)
class ShardTargets:
    """The ``--shard-target`` rules, in the order given."""

    rules: tuple[tuple[re.Pattern[str], Mapping[str, Any]], ...] = ()

    @classmethod
    def from_rules(cls, rules: Sequence[str]) -> ShardTargets:
        return cls(tuple(_parse(rule) for rule in rules))

    def __call__(self, ns: Namespace) -> Mapping[str, Any] | None:
        """The key declared for source namespace ``ns`` (``{}``: leave it unsharded), or None."""
        name = str(ns)
        return next((key for pattern, key in self.rules if pattern.fullmatch(name)), None)


def _parse(rule: str) -> tuple[re.Pattern[str], Mapping[str, Any]]:
    example = 'e.g. \'shop\\.orders={"region": 1, "_id": "hashed"}\''
    compiled, key = regex_and_document("--shard-target", rule, "REGEX=KEY", example.removeprefix("e.g. "))
    problem = key_problem(key)
    if problem is not None:
        raise ConfigError(f"--shard-target {quoted(rule)}: {problem} ({example})")
    return compiled, key


def key_problem(key: Any) -> str | None:
    """What makes ``key`` no shard key pattern (``{}`` is one here: it leaves a target unsharded)."""
    if not isinstance(key, dict):
        return "KEY must be a document"
    for name, value in key.items():
        if not name or name.startswith("$"):
            return f"{quoted(name)} cannot be a shard key field"
        if value != "hashed" and not (type(value) in (int, float) and value == 1):
            return f'field {quoted(name)} must be 1 (a range) or "hashed", not {value!r}'
    if sum(value == "hashed" for value in key.values()) > 1:
        return "a shard key has at most one hashed field"
    return None
