"""``mcdc verify``: do the selected source namespaces exist byte for byte on the target?

Schema first (kind, options, indexes), then documents. Documents are compared one snapshot partition at a
time: the source partition is hashed into ``_id -> digest``, then the same ``_id`` range is streamed from the
target and matched against it. Memory holds one source partition per worker; documents that exist only on
the target are counted and sampled, not kept. Keys and digests cover raw BSON, so an Int32 ``_id`` 1 and an
Int64 ``_id`` 1 are different documents, and a field that turned from Int32 into Int64 is a changed one.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, cast

import bson
from bson.raw_bson import RawBSONDocument

from replicator.bsonkit import extjson
from replicator.checking.measurements import Measurements
from replicator.checking.recheck import key_of, raw_key
from replicator.errors import ConfigError
from replicator.events import CollectionSpec, Namespace
from replicator.settings.config import Settings
from replicator.settings.fields import FieldEditor, FieldRules
from replicator.settings.filters import filtered
from replicator.settings.selection import rename_spec, target_databases
from replicator.settings.unmatched import unmatched_rule
from replicator.settings.uri import is_mongo_uri, redact
from replicator.sinks.mongo.schema import same_index
from replicator.sinks.mongo.sharding import same_key
from replicator.sinks.mongo.ttl import as_source
from replicator.source import catalog
from replicator.source.connection import DICT_CODEC, Client, make_client, probe
from replicator.source.partitions import ALL, Partition, plan_collection, with_catch_all
from replicator.source.reads import ReadPolicy, SourceReads, start_reads
from replicator.source.sharding import with_shard_keys
from replicator.source.snapshot import read_partition

log = logging.getLogger("mcdc.verify")

#: ``_id``s read per query when only some documents are compared
_BY_KEY = 1000
#: Document-level difference kinds, in report order.
DOCUMENT_KINDS = ("missing", "extra", "changed")
_DOCUMENT_TEXT = {"missing": "missing on the target", "extra": "only on the target", "changed": "differ"}


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _label(src: Namespace, dst: Namespace) -> str:
    return str(dst) if src == dst else f"{src} -> {dst}"


@dataclass
class Difference:
    """One way the target differs from the source.

    ``kind`` is one of missing_namespace, extra_namespace, count, missing, extra, changed, index, options,
    kind. ``ns`` is the target's name ("src -> dst" when renamed); ``ids`` holds a few of the differing
    ``_id``s as canonical extended JSON.
    """

    ns: str
    kind: str
    detail: str
    ids: list[str] = field(default_factory=list)

    def line(self) -> str:
        text = f"{self.ns}: {self.detail}"
        return f"{text} e.g. _id {', '.join(self.ids)}" if self.ids else text


@dataclass
class VerifyReport:
    """The outcome of a verify run; ``ok`` when no difference was found."""

    namespaces: int
    documents: int
    differences: list[Difference]
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.differences

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "namespaces": self.namespaces,
            "documents": self.documents,
            "elapsed_s": self.elapsed_s,
            "differences": [asdict(d) for d in self.differences],
        }

    def lines(self) -> list[str]:
        """One readable line per difference, then a summary line."""
        summary = (
            f"verify: {_plural(self.namespaces, 'namespace')}, {_plural(self.documents, 'document')} compared, "
            f"{_plural(len(self.differences), 'difference')}"
        )
        return [d.line() for d in self.differences] + [summary]


def id_key(doc: RawBSONDocument) -> bytes:
    """The document's ``_id`` as BSON: equal keys mean byte-identical ``_id`` values, type included."""
    return raw_key(doc.raw) or key_of(doc["_id"])


def id_json(key: bytes) -> str:
    """An :func:`id_key` as canonical extended JSON (lossless, so Int32 and Int64 read differently)."""
    return extjson.dumps(bson.decode(key, codec_options=DICT_CODEC)["_id"])


def edited(docs: list[RawBSONDocument], editor: FieldEditor | None) -> list[RawBSONDocument]:
    """Source documents as the field rules make them on the target (``editor`` None: as they are)."""
    return docs if editor is None else [cast(RawBSONDocument, editor.document(d)) for d in docs]


def digest(doc: RawBSONDocument) -> bytes:
    # a 16-byte digest rather than the document keeps a partition small in memory; collisions are negligible
    return hashlib.blake2b(doc.raw, digest_size=16).digest()


@dataclass
class DocumentDiff:
    """How the documents of one partition (or, merged, of one collection) differ: full counts per kind and
    at most ``sample`` ``_id`` keys per kind."""

    sample: int
    source_docs: int = 0
    target_docs: int = 0
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DOCUMENT_KINDS, 0))
    ids: dict[str, list[bytes]] = field(default_factory=lambda: {k: [] for k in DOCUMENT_KINDS})

    def note(self, kind: str, keys: Iterable[bytes], count: int) -> None:
        self.counts[kind] += count
        self.ids[kind].extend(itertools.islice(keys, max(0, self.sample - len(self.ids[kind]))))

    def merge(self, other: DocumentDiff) -> None:
        self.source_docs += other.source_docs
        self.target_docs += other.target_docs
        for kind in DOCUMENT_KINDS:
            self.note(kind, other.ids[kind], other.counts[kind])

    def differences(self, ns: str) -> list[Difference]:
        sides = f"{self.source_docs} on the source, {self.target_docs} on the target"
        out = []
        for kind in DOCUMENT_KINDS:
            n = self.counts[kind]
            if n:
                text = "differs" if kind == "changed" and n == 1 else _DOCUMENT_TEXT[kind]
                detail = f"{_plural(n, 'document')} {text} ({kind}"
                detail += ")" if kind == "changed" else f"; {sides})"
                out.append(Difference(ns, kind, detail, [id_json(k) for k in self.ids[kind]]))
        return out


class DocumentDiffer:
    """Compares one partition: feed every source document, then every target document, then ``finish()``."""

    def __init__(self, sample: int) -> None:
        self.diff = DocumentDiff(sample)
        self._pending: dict[bytes, bytes] = {}  # source documents not yet seen on the target

    def add_source(self, docs: Iterable[RawBSONDocument]) -> None:
        for doc in docs:
            self._pending[id_key(doc)] = digest(doc)
            self.diff.source_docs += 1

    def add_target(self, docs: Iterable[RawBSONDocument]) -> None:
        for doc in docs:
            self.diff.target_docs += 1
            key = id_key(doc)
            want = self._pending.pop(key, None)
            if want is None:
                self.diff.note("extra", (key,), 1)
            elif want != digest(doc):
                self.diff.note("changed", (key,), 1)

    def finish(self) -> DocumentDiff:
        self.diff.note("missing", iter(self._pending), len(self._pending))
        self._pending.clear()
        return self.diff


def diff_documents(
    source: Iterable[RawBSONDocument], target: Iterable[RawBSONDocument], *, sample: int
) -> DocumentDiff:
    """Compare two sets of raw documents by ``_id`` (byte-exact keys and contents); order does not matter."""
    differ = DocumentDiffer(sample)
    differ.add_source(source)
    differ.add_target(target)
    return differ.finish()


def _encoded(options: Mapping[str, Any], key: str) -> bytes | None:
    return bson.encode({"v": options[key]}) if key in options else None


def schema_differences(ns: str, want: CollectionSpec, found: CollectionSpec, *, held: bool = True) -> list[Difference]:
    """Options (byte-exact; a view's viewOn, already renamed, and pipeline are options) and indexes by name.
    ``want`` is the source spec as named on the target. ``held``: a TTL the target holds while a migration
    writes it (sinks/mongo/ttl.py) is taken for the source's value; after a cutover, not."""
    if held:
        source_ix = {str(ix["name"]): ix for ix in want.indexes}
        found = replace(
            found,
            options=as_source(found.options, want.options),
            indexes=tuple(as_source(ix, source_ix.get(str(ix["name"]))) for ix in found.indexes),
        )
    out = []
    if bson.encode(want.options) != bson.encode(found.options):
        keys = [k for k in {**want.options, **found.options} if _encoded(want.options, k) != _encoded(found.options, k)]
        out.append(Difference(ns, "options", f"options differ: {', '.join(keys) or 'field order'}"))
    source_ix = {str(ix["name"]): ix for ix in want.indexes}
    target_ix = {str(ix["name"]): ix for ix in found.indexes}
    for name in {**source_ix, **target_ix}:
        a, b = source_ix.get(name), target_ix.get(name)
        if same_index(a, b):
            continue
        if a is None and b is not None and found.shard is not None and same_key(b["key"], found.shard.key):
            continue  # the index the target's shard key needs (--shard-target): the target's own
        if b is None:
            where = "missing on the target"
        elif a is None:
            where = "only on the target"
        else:
            where = f"differs: source {extjson.dumps(a, relaxed=True)}, target {extjson.dumps(b, relaxed=True)}"
        out.append(Difference(ns, "index", f"index {name} {where}"))
    return out


def namespace_differences(
    src: Namespace, want: CollectionSpec | None, found: CollectionSpec | None, *, held: bool = True
) -> list[Difference]:
    """How a namespace differs beyond its documents: missing on either side, of another kind, or with
    other options or indexes. ``want``: the source's spec as named on the target (None: not on the
    source); ``found``: the target's; ``held``: see :func:`schema_differences`."""
    if want is None and found is None:
        return []
    if want is None:
        assert found is not None
        return [Difference(_label(src, found.ns), "extra_namespace", "only on the target")]
    ns = _label(src, want.ns)
    if found is None:
        return [Difference(ns, "missing_namespace", f"{want.kind} missing on the target")]
    if found.kind != want.kind:
        return [Difference(ns, "kind", f"a {want.kind} on the source, a {found.kind} on the target")]
    return schema_differences(ns, want, found, held=held)


async def diff_partition(
    settings: Settings,
    source: Client,
    target: Client,
    part: Partition,
    dst: Namespace,
    fields: FieldRules,
    *,
    sample: int | None = None,
    pace: Callable[[], Awaitable[None]] | None = None,
    reads: SourceReads | None = None,
) -> DocumentDiff:
    """Compare one source partition, edited by the field rules, with the same ``_id`` range of ``dst`` on
    the target. ``sample``: differing ``_id``s kept per kind (default: --verify-sample); ``pace``: awaited
    after each batch (the embedded verifier gives way to a busy replay there); ``reads``: where the source
    is read, from when and how fast (the target is read on its primary, unpaced)."""
    differ = DocumentDiffer(settings.verify_sample if sample is None else sample)
    editor = fields.for_namespace(part.ns)
    kept = settings.guard.kept(dst)
    docs, size = settings.batch_docs, settings.batch_bytes
    async for batch in read_partition(source, part, batch_docs=docs, batch_bytes=size, reads=reads):  # as edited
        differ.add_source(edited(edited(batch, editor), kept))
        if pace is not None:
            await pace()
    # the plan's $type + bound filters mean the same on any server, so they select the same range there
    # (the target holds only what a --filter kept: its whole range is compared, not the range's matches;
    # a way back's target also holds what the migration did not copy, which is not compared: settings.guard)
    theirs = replace(part, ns=dst, where=settings.guard.where(dst))
    async for batch in read_partition(target, theirs, batch_docs=docs, batch_bytes=size):
        differ.add_target(edited(batch, kept))
        if pace is not None:
            await pace()
    return differ.finish()


#: How a namespace's partitions are compared: each with the target's ``dst``, the source read as ``reads``
#: says; results in plan order.
RangeDiffer = Callable[[Sequence[Partition], Namespace, SourceReads], Awaitable[list[DocumentDiff]]]


#: Which documents of a source namespace to compare: their ``id_key``s, or None for all of them.
Scope = Callable[[Namespace], "set[bytes] | None"]


class _Verifier:
    def __init__(
        self,
        settings: Settings,
        source: Client,
        target: Client,
        differ: RangeDiffer | None = None,
        scope: Scope | None = None,
        reads: SourceReads | None = None,
        held: bool = True,
    ) -> None:
        self.s = settings
        self.reads = reads if reads is not None else SourceReads()
        self.source = source
        self.target = target
        self.scope = scope
        self.slots = asyncio.Semaphore(settings.workers)
        self.documents = 0
        self.fields = FieldRules(settings.field_exclude, settings.field_rename)
        self._differ = differ or self._diff_here
        self.held = held

    async def run(self) -> VerifyReport:
        s = self.s
        namespaces = await catalog.list_namespaces(self.source, s.selection)
        problem = catalog.unmatched(s.selection, namespaces)
        if problem is not None:  # nothing to compare would pass as "identical"
            raise ConfigError(f"nothing to verify: {problem}")
        rule = unmatched_rule(s, namespaces)
        if rule is not None:  # a slip here shows as differences, never as "identical": said, not refused
            log.warning("%s", rule)
        specs = await catalog.describe(self.source, s.selection)
        wanted = {s.renamer(spec.ns): spec for spec in specs}
        on_target = await catalog.describe(self.target, target_databases(s.selection, s.renamer))
        found = {spec.ns: spec for spec in await with_shard_keys(self.target, on_target)}
        per_ns = await asyncio.gather(*(self._namespace(spec, found.get(ns)) for ns, spec in wanted.items()))
        differences = [d for diffs in per_ns for d in diffs]
        inverse = s.renamer.inverse()
        for ns in found:
            origin = inverse(ns)
            # renamer(origin) == ns: only names the selected source could write to (with a rename on one
            # server, the source's own namespaces are on the target too and are not extra)
            if ns not in wanted and s.renamer(origin) == ns and s.selection(origin):
                differences += namespace_differences(origin, None, found[ns])
        return VerifyReport(len(specs), self.documents, differences)

    async def _namespace(self, spec: CollectionSpec, found: CollectionSpec | None) -> list[Difference]:
        want = rename_spec(spec, self.s.renamer)
        ns = _label(spec.ns, want.ns)
        differences = namespace_differences(spec.ns, want, found, held=self.held)
        if found is None or found.kind != want.kind:
            return differences
        keys = None if self.scope is None else self.scope(spec.ns)
        if want.kind == "collection" and keys is not None:
            differences += await self._documents_by_key(spec.ns, want.ns, ns, keys)
        elif want.kind == "collection":
            differences += await self._documents(spec.ns, want.ns, ns)
        elif want.kind == "timeseries":  # no unique _id to key on: measurements compared as a whole
            differences += await self._measurements(spec.ns, want.ns, ns)
        return differences

    async def _documents(self, src: Namespace, dst: Namespace, ns: str) -> list[Difference]:
        async with self.slots:  # planning scans the _id index: one reader like a partition
            plan = await plan_collection(
                self.reads.collection(self.source, src), src, self.s.partition_docs, split=self.s.split
            )
        where = self.s.filters.where(src)
        plan = [replace(part, where=where) for part in with_catch_all(plan)]
        parts = await self._differ(plan, dst, self.reads)
        total = DocumentDiff(self.s.verify_sample)
        for part in parts:  # in plan order, so the sampled _ids do not depend on timing
            total.merge(part)
        self.documents += total.source_docs
        return total.differences(ns)

    async def _documents_by_key(self, src: Namespace, dst: Namespace, ns: str, keys: set[bytes]) -> list[Difference]:
        """Only the documents of these ``_id``s, in chunks (``$in`` on each side)."""
        total = DocumentDiff(self.s.verify_sample)
        editor = self.fields.for_namespace(src)
        where = self.s.filters.where(src)
        kept, guarded = self.s.guard.kept(dst), self.s.guard.where(dst)
        ordered = sorted(keys)
        for start in range(0, len(ordered), _BY_KEY):
            values = [bson.decode(k, codec_options=DICT_CODEC)["_id"] for k in ordered[start : start + _BY_KEY]]
            query = {"_id": {"$in": values}}
            differ = DocumentDiffer(self.s.verify_sample)
            async with self.slots, self.reads.session(self.source) as session:
                await self.reads.pace(len(values))
                source = self.reads.collection(self.source, src)
                found = await source.find(filtered(query, where), session=session).to_list()
                differ.add_source(edited(edited(found, editor), kept))
                theirs = await self.target[dst.db][dst.coll or ""].find(filtered(query, guarded)).to_list()
                differ.add_target(edited(theirs, kept))
            total.merge(differ.finish())
        self.documents += total.source_docs
        return total.differences(ns)

    async def _diff_here(self, plan: Sequence[Partition], dst: Namespace, reads: SourceReads) -> list[DocumentDiff]:
        async def one(part: Partition) -> DocumentDiff:
            async with self.slots:
                return await diff_partition(self.s, self.source, self.target, part, dst, self.fields, reads=reads)

        return list(await asyncio.gather(*(one(p) for p in plan)))

    async def _measurements(self, src: Namespace, dst: Namespace, ns: str) -> list[Difference]:
        """A time-series collection's measurements, each side folded by content (checking/measurements.py):
        the source's as the field rules and --filter make them, the target's within a way back's guard."""
        editor, kept = self.fields.for_namespace(src), self.s.guard.kept(dst)
        docs, size = self.s.batch_docs, self.s.batch_bytes
        whole = Partition(src, 0, ALL, keyed=False, where=self.s.filters.where(src))
        theirs = replace(whole, ns=dst, where=self.s.guard.where(dst))

        async def source() -> AsyncIterator[list[RawBSONDocument]]:
            async for batch in read_partition(self.source, whole, batch_docs=docs, batch_bytes=size, reads=self.reads):
                yield edited(edited(batch, editor), kept)

        async def target() -> AsyncIterator[list[RawBSONDocument]]:
            async for batch in read_partition(self.target, theirs, batch_docs=docs, batch_bytes=size):
                yield edited(batch, kept)

        async with self.slots:
            mine, found = await Measurements.of(source()), await Measurements.of(target())
        self.documents += mine.count
        problem = mine.differs(found)
        if problem is None:
            return []
        return [Difference(ns, "count" if mine.count != found.count else "changed", problem)]


async def verify(
    settings: Settings, differ: RangeDiffer | None = None, scope: Scope | None = None, *, held: bool = True
) -> VerifyReport:
    """Compare the selected source namespaces with their (renamed) target namespaces: kinds, options,
    indexes and every document, byte for byte. Differences are reported, not raised. ``differ``: how
    ranges are compared (default: here, ``--workers`` at once; the Spark engine's runs them as tasks).
    ``scope``: compare only these documents of a namespace (cutover after a verifier's clean pass).
    ``held``: a TTL the target holds still while a migration writes it counts as the source's value."""
    if not is_mongo_uri(settings.target):
        raise ConfigError(
            f"verify compares two MongoDB deployments: --target {redact(settings.target)} is not mongodb://"
        )
    started = time.monotonic()
    source = make_client(settings.source, timeout_s=settings.connect_timeout_s, io_timeout_s=settings.io_timeout_s)
    try:
        target = make_client(
            settings.target, timeout_s=settings.connect_timeout_s, io_timeout_s=settings.io_timeout_s, side="target"
        )
        try:
            info = await probe(source, settings.source, "source")
            await probe(target, settings.target, "target")
            reads = await start_reads(source, info, ReadPolicy.of(settings))
            report = await _Verifier(settings, source, target, differ, scope, reads, held).run()
        finally:
            await target.close()
    finally:
        await source.close()
    report.elapsed_s = round(time.monotonic() - started, 3)
    return report
