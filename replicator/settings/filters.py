"""Partial replication by document: ``--filter 'REGEX=QUERY'``. Pure: no I/O.

``REGEX`` is matched against the whole source ``db.collection``, as ``--include``'s patterns are; ``QUERY``
is a MongoDB query in Extended JSON (``{"region": "EU"}``). Several filters whose patterns match one
namespace all apply (AND): a document is replicated when it matches every one of them.

The target holds exactly the source's documents that match, at every checkpoint:

* the snapshot (and ``verify``) reads with the query, on the server (:meth:`DocumentFilters.where`);
* in the stream, :func:`filter_event` decides each event's fate with the query's own matcher
  (:mod:`replicator.query`, which agrees with the server's ``find`` or refuses the query at start):
  a document that does not match is not inserted, a replacement or update that makes it stop matching is
  a delete of its ``_id``, an update that makes it match writes it whole (the looked-up document, so the
  change stream must carry one: :func:`needs_lookup`), and deletes and DDL pass through.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from replicator.errors import ConfigError, quoted
from replicator.events import ChangeEvent, CollectionSpec, Namespace, Op
from replicator.query import Query, compile_query
from replicator.settings.rules import regex_and_document


@dataclass(frozen=True)
class _Filter:
    pattern: re.Pattern[str]
    spec: Mapping[str, Any]
    rule: str = ""  # as given, for messages


def _parse(text: str) -> _Filter:
    example = '\'shop\\.orders={"region": "EU"}\''
    pattern, spec = regex_and_document("--filter", text, "REGEX=QUERY", example)
    try:
        compile_query(spec)
    except ConfigError as exc:
        raise ConfigError(f"--filter {quoted(text)}: {str(exc).removeprefix('--filter: ')}") from None
    return _Filter(pattern, spec, text)


class DocumentFilters:
    """The run's ``--filter`` rules: the query of each source namespace (or None: every document)."""

    def __init__(self, rules: Sequence[str] = (), *, by: Callable[[Namespace], Namespace] | None = None) -> None:
        """``by``: the name a namespace's filter is found by, where it is not its own (the way back of a
        migration that renamed collections filters by the names the migration's filters named)."""
        self._filters = [_parse(rule) for rule in rules]
        self._queries: dict[Namespace, Query | None] = {}
        self._by = by

    def __bool__(self) -> bool:
        return bool(self._filters)

    def patterns(self) -> list[tuple[str, re.Pattern[str]]]:
        """Each rule as given, with its compiled REGEX."""
        return [(f.rule, f.pattern) for f in self._filters]

    def __getstate__(self) -> dict[str, Any]:  # pickled into Spark tasks: the compiled matchers stay here
        return {"_filters": self._filters, "_queries": {}, "_by": self._by}

    def where(self, ns: Namespace) -> Mapping[str, Any] | None:
        """The find() filter that selects ``ns``'s replicated documents on the server; None: all of them."""
        if ns.coll is not None and self._by is not None:
            ns = self._by(ns)
        if ns.coll is None:
            return None
        text = f"{ns.db}.{ns.coll}"
        specs = [f.spec for f in self._filters if f.pattern.fullmatch(text)]
        if not specs:
            return None
        return specs[0] if len(specs) == 1 else {"$and": specs}

    def for_namespace(self, ns: Namespace) -> Query | None:
        """The matcher of ``ns``'s documents, or None when no filter applies to it."""
        if ns in self._queries:
            return self._queries[ns]
        where = self.where(ns)
        query = compile_query(where) if where is not None else None
        if len(self._queries) >= _MEMO_MOST:
            self._queries.clear()
        self._queries[ns] = query
        return query

    def collation_refusal(self, specs: Sequence[CollectionSpec]) -> str | None:
        """Why the filters cannot be decided as the source's find() decides them, or None. The stream's
        matcher compares strings as the simple collation does; a collection whose default collation is
        another one ("en", strength 2: "eu" equals "EU") answers a query comparing strings otherwise."""
        for spec in specs:
            collation = spec.options.get("collation")
            locale = collation.get("locale") if isinstance(collation, Mapping) else None
            query = self.for_namespace(spec.ns) if locale not in (None, "simple") else None
            if query is not None and query.compares_strings:
                return (
                    f"source: --filter on {spec.ns} compares strings, but {spec.ns}'s default collation is "
                    f"{quoted(str(locale))}, and mcdc decides the stream's documents with the simple collation "
                    "(bytes): filter it on fields that are not strings, or leave it out of --filter"
                )
        return None


#: namespaces remembered before starting again (the distinct ones of a deployment)
_MEMO_MOST = 10_000


def filtered(query: Mapping[str, Any], where: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """A find() filter (a partition's range, a set of ``_id``s) narrowed to the documents ``where`` selects."""
    if not where:
        return query
    if not query:
        return where
    return {"$and": [query, where]}


def filter_event(event: ChangeEvent, query: Query) -> ChangeEvent | None:
    """A source namespace's document event as the filtered target must see it (None: dropped).

    * a snapshot read or an insert of a document that does not match: dropped;
    * a replacement by a document that does not match: a delete of that ``_id`` (it may have matched before);
    * an update: its full document decides. No full document (the document was deleted by the time the
      server looked it up) or one that does not match: a delete. One that matches: a replacement by it,
      written whole, since the target may not hold the document yet (it may just have come to match).
      Only with a pre-image that matches (``--pre-images``) is it known to be there: then it stays an update;
    * a delete passes, and so does anything else (DDL).

    A converted delete keeps the event's key, position and pre-image, so an event sink writes it as it
    writes any delete (Debezium's ``op: d``, with ``before`` when pre-images are on)."""
    op = event.op
    if op is Op.READ or op is Op.INSERT:
        return event if event.document is not None and query.matches(event.document) else None
    if op is Op.REPLACE or op is Op.UPDATE:
        doc = event.document
        if doc is None or not query.matches(doc):
            return _as_delete(event)
        if op is Op.UPDATE and not (event.before is not None and query.matches(event.before)):
            return replace(event, op=Op.REPLACE, update=None)
        return event
    return event


def _as_delete(event: ChangeEvent) -> ChangeEvent:
    return replace(event, op=Op.DELETE, key=event.document_key, document=None, update=None)


def transform_filters(filters: DocumentFilters) -> Callable[[ChangeEvent], ChangeEvent | None]:
    """The filter stage for :func:`~replicator.settings.selection.make_transform`: applies the query of the
    event's (source) namespace; events of other namespaces pass as they are."""

    def apply(event: ChangeEvent) -> ChangeEvent | None:
        query = filters.for_namespace(event.ns)
        return filter_event(event, query) if query is not None else event

    return apply


def needs_lookup(full_document: str) -> bool:
    """Does this ``--full-document`` mode leave updates without the document a filter must decide on?
    ``default`` sends none; ``whenAvailable`` may send none for a document that still exists (its post-image
    expired), which a filter would take for a deleted one. updateLookup and required always send one."""
    return full_document in ("default", "whenAvailable")
