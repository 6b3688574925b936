"""Topic names for event sinks: ``<prefix>.<db>.<collection>`` (Debezium's convention), routes, sanitizing.

* A route ``REGEX=TOPIC`` sends every namespace whose ``db.collection`` matches REGEX (whole name) to
  TOPIC, in which ``\\1`` ... stand for the regex's groups (Debezium's ByLogicalTableRouter). The first
  matching route wins; unrouted namespaces keep the default name.
* Kafka allows only ``[A-Za-z0-9._-]`` in topic names (at most 249 characters): other characters always
  become ``_``. With ``sanitize`` (Avro-safe names, as Debezium does for schema names) every part is
  reduced to ``[A-Za-z0-9_]`` and cannot start with a digit.
* Two namespaces that end up on one topic are logged once: their events still carry db and collection.
"""

from __future__ import annotations

import logging
import re

from replicator.events import Namespace

log = logging.getLogger("mcdc.sinks")

_KAFKA_ILLEGAL = re.compile(r"[^A-Za-z0-9._\-]")
_AVRO_ILLEGAL = re.compile(r"[^A-Za-z0-9_]")
_MAX_TOPIC = 249


def avro_name(part: str) -> str:
    """One name part made Avro-safe: ``[A-Za-z_][A-Za-z0-9_]*``."""
    out = _AVRO_ILLEGAL.sub("_", part)
    return "_" + out if not out or out[0].isdigit() else out


def kafka_name(topic: str) -> str:
    """A topic name Kafka accepts."""
    return _KAFKA_ILLEGAL.sub("_", topic)[:_MAX_TOPIC]


class TopicNamer:
    """Maps namespaces to topics; also names the transaction, DDL and heartbeat topics."""

    def __init__(self, prefix: str, routes: tuple[str, ...] = (), *, sanitize: bool = False) -> None:
        self.prefix = avro_name(prefix) if sanitize else kafka_name(prefix)
        self._sanitize = sanitize
        self._routes = [(re.compile(p), t) for p, _, t in (r.partition("=") for r in routes)]
        self._cache: dict[Namespace, str] = {}
        self._owner: dict[str, Namespace] = {}

    def name_parts(self, ns: Namespace) -> tuple[str, str]:
        """The database and collection as they appear in default topic and schema names."""
        db, coll = ns.db, ns.coll or ""
        if self._sanitize:
            return avro_name(db), avro_name(coll)
        return db, coll

    def data(self, ns: Namespace) -> str:
        """The topic of a collection's change events."""
        topic = self._cache.get(ns)
        if topic is None:
            topic = self._cache[ns] = self._name(ns)
            other = self._owner.setdefault(topic, ns)
            if other != ns:
                log.warning("namespaces %s and %s share topic %s (after routing/sanitizing)", other, ns, topic)
        return topic

    def _name(self, ns: Namespace) -> str:
        full = str(ns)
        for pattern, template in self._routes:
            match = pattern.fullmatch(full)
            if match is not None:
                return kafka_name(match.expand(template))
        db, coll = self.name_parts(ns)
        return kafka_name(f"{self.prefix}.{db}.{coll}")

    @property
    def transaction(self) -> str:
        return f"{self.prefix}.transaction"

    @property
    def ddl(self) -> str:
        return f"{self.prefix}.ddl"

    @property
    def heartbeat(self) -> str:
        return kafka_name(f"__debezium-heartbeat.{self.prefix}")
