"""Field-level selection: ``--field-exclude`` and ``--field-rename`` (Debezium's ``field.exclude.list`` and
``field.renames``). Pure: raw BSON in, raw BSON out, no I/O.

A rule names a field by ``db.collection.path`` (the source's names; ``*`` in the database or collection
matches any characters), e.g. ``shop.customers.card.number`` or ``shop.*.secret``; a rename adds
``=newname``, the field's new name at the same place (``shop.users.pwd=password_hash``). Paths go through
arrays: ``shop.orders.items.cost`` applies to every document in the ``items`` array.

Documents are edited at the byte level: the elements on a rule's path are dropped or renamed, and every
other element keeps its bytes and its place, so what is not excluded stays byte-exact. Update
descriptions (``updatedFields`` keys are dotted paths, with array indexes), removed fields and truncated
arrays are mapped the same way: the ``$set``/``$unset`` of an excluded path is dropped, a renamed path
is renamed.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import bson
from bson.raw_bson import RawBSONDocument

from replicator.errors import ConfigError, quoted
from replicator.events import ChangeEvent, Namespace, Op, UpdateDescription

_INT32 = struct.Struct("<i")
_DOCUMENT, _ARRAY = 0x03, 0x04
#: value sizes of the fixed-size BSON types
_FIXED = {0x01: 8, 0x06: 0, 0x07: 12, 0x08: 1, 0x09: 8, 0x0A: 0, 0x10: 4, 0x11: 8, 0x12: 8, 0x13: 16, 0xFF: 0, 0x7F: 0}


@dataclass
class _Node:
    """What happens to one field: dropped, renamed, and/or rules for the fields inside it."""

    exclude: bool = False
    rename: bytes | None = None
    children: dict[bytes, _Node] = field(default_factory=dict)


@dataclass(frozen=True)
class _Rule:
    db: re.Pattern[str]
    rest: tuple[str, ...]  # collection name parts, then the field path
    rename: str | None
    text: str = ""  # as given, with its flag, for messages
    names: str = ""  # the db.collection part as given (the rule's first two names), for "did you mean"

    def on_id(self, ns: Namespace) -> ConfigError:
        return ConfigError(
            f"{self.text}: in {ns} this names {'.'.join(_match(self, ns) or ())}, but _id is the document key: "
            "it and the fields inside it cannot be excluded or renamed"
        )


def _wildcard(text: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in text.split("*")))


def _parse(rule: str, flag: str, *, rename: bool) -> _Rule:
    target, sep, new = rule.partition("=")
    if rename and not sep:
        target, sep, new = rule.rpartition(":")  # Debezium's field.renames form: path:newname
    target, new = target.strip(), new.strip()
    parts = target.split(".")
    example = "db.collection.field=newname" if rename else "db.collection.field"
    if len(parts) < 3 or not all(parts) or (sep and not rename):
        raise ConfigError(f"{flag} {quoted(rule)} must look like {example} (the path may go deeper: a.b.c)")
    if rename and (not sep or not new or "." in new or new.startswith("$")):
        raise ConfigError(f"{flag} {quoted(rule)}: the new name must be one field name, e.g. {example}")
    if parts[2] == "_id":
        raise ConfigError(
            f"{flag} {quoted(rule)}: _id is the document key: it and the fields inside it cannot be excluded or renamed"
        )
    text = f"{flag} {quoted(rule)}"
    return _Rule(_wildcard(parts[0]), tuple(parts[1:]), new if rename else None, text, ".".join(parts[:2]))


class FieldRules:
    """The run's field rules; :meth:`for_namespace` gives the editor of one source namespace."""

    def __init__(self, exclude: Sequence[str] = (), rename: Sequence[str] = ()) -> None:
        self._rules = [_parse(r, "--field-exclude", rename=False) for r in exclude]
        self._rules += [_parse(r, "--field-rename", rename=True) for r in rename]
        self._editors: dict[Namespace, FieldEditor | None] = {}

    def __bool__(self) -> bool:
        return bool(self._rules)

    def check(self, namespaces: Sequence[Namespace]) -> None:
        """Refuse a rule that names ``_id`` (or a field inside it) in one of these namespaces: a rule such
        as ``db.a.b._id`` does in a collection named ``a.b``. Run on the source's namespaces before
        anything is written; :meth:`for_namespace` refuses the same for a namespace that appears later."""
        for ns in namespaces:
            self.for_namespace(ns)

    def matching_none(self, namespaces: Sequence[Namespace]) -> tuple[str, str] | None:
        """The first rule that names a field of none of these namespaces: the rule as given (with its flag)
        and its ``db.collection`` part, for a near name; None when each names a field of one of them."""
        for rule in self._rules:
            if not any(_match(rule, ns) for ns in namespaces):
                return rule.text, rule.names
        return None

    def unique_refusal(self, ns: Namespace, indexes: Iterable[Mapping[str, Any]]) -> str | None:
        """Why one of source namespace ``ns``'s ``indexes`` cannot be built on the target as these rules edit
        its documents: a unique index on a field a rule drops or renames (or on a field inside one, or on
        a document holding one) finds that field missing, that is null, in every target document, and two
        of them repeat its key. None when there is no such index. A sparse index on that one field is kept:
        it indexes no document that lacks it."""
        for index in indexes:
            key = index.get("key")
            if not index.get("unique") or not isinstance(key, Mapping):
                continue
            fields = [str(name) for name in key]
            if index.get("sparse") and len(fields) == 1:
                continue
            for name in fields:
                rule = self._editing(ns, tuple(name.split(".")))
                if rule is not None:
                    what = "renames" if rule.rename is not None else "drops"
                    return (
                        f"source: {ns}'s unique index {index.get('name')} is on {name}, which {rule.text} {what}: "
                        "every target document would lack it, and the index could not be built there; leave the "
                        f"field as it is (remove the rule), or leave {ns} out of the selection (--exclude)"
                    )
        return None

    def _editing(self, ns: Namespace, path: tuple[str, ...]) -> _Rule | None:
        """The rule that drops or renames ``path`` of ``ns``'s documents, a field inside it, or a document
        that holds it (array indexes left aside)."""
        for rule in self._rules:
            named = _match(rule, ns)
            if named and (path[: len(named)] == named or named[: len(path)] == path):
                return rule
        return None

    def for_namespace(self, ns: Namespace) -> FieldEditor | None:
        """The editor for documents of ``ns`` (a source namespace), or None when no rule applies. A rule
        that resolves to ``_id`` here is refused (ConfigError): a document's key is never edited."""
        if ns in self._editors:
            return self._editors[ns]
        root: dict[bytes, _Node] = {}
        for rule in self._rules:
            path = _match(rule, ns)
            if path and path[0] == "_id":
                raise rule.on_id(ns)
            if path:
                _insert(root, path, rule.rename)
        editor = FieldEditor(root) if root else None
        self._editors[ns] = editor
        return editor


def _match(rule: _Rule, ns: Namespace) -> tuple[str, ...] | None:
    """The field path a rule names inside ``ns``, or None. Collection names may hold dots: the first
    split of the rule's parts whose head matches the collection wins."""
    if ns.coll is None or not rule.db.fullmatch(ns.db):
        return None
    for k in range(1, len(rule.rest)):
        if _wildcard(".".join(rule.rest[:k])).fullmatch(ns.coll):
            return rule.rest[k:]
    return None


def _insert(root: dict[bytes, _Node], path: tuple[str, ...], rename: str | None) -> None:
    nodes = root
    for i, name in enumerate(path):
        node = nodes.setdefault(name.encode(), _Node())
        if i == len(path) - 1:
            if rename is None:
                node.exclude = True
            else:
                node.rename = rename.encode()
        nodes = node.children


class FieldEditor:
    """Applies one namespace's field rules to documents, update descriptions and events."""

    def __init__(self, root: dict[bytes, _Node]) -> None:
        self._root = root

    def event(self, event: ChangeEvent) -> ChangeEvent:
        """The event with its document, pre-image and update description edited (the key is kept)."""
        document = self.document(event.document) if event.document is not None else None
        before = self.document(event.before) if event.before is not None else None
        update = self.update(event.update) if event.update is not None else None
        if document is event.document and before is event.before and update is event.update:
            return event
        return replace(event, document=document, before=before, update=update)

    def document(self, doc: Mapping[str, Any]) -> Mapping[str, Any]:
        """A document without its excluded fields and with its renamed ones, every other byte kept."""
        raw = _raw(doc)
        edited = _edit_document(raw, self._root)
        if edited is raw:
            return doc
        return RawBSONDocument(edited, getattr(doc, "codec_options", None))

    def update(self, update: UpdateDescription) -> UpdateDescription:
        """``updatedFields``, ``removedFields`` and ``truncatedArrays`` with the same rules."""
        raw = _raw(update.updated_fields)
        updated = _edit_elements(raw, self._edit_path)
        removed = tuple(p for p in (self._path(f) for f in update.removed_fields) if p is not None)
        truncated = tuple(
            (p, size) for p, size in ((self._path(f), size) for f, size in update.truncated_arrays) if p is not None
        )
        if updated is raw and removed == update.removed_fields and truncated == update.truncated_arrays:
            return update
        fields = update.updated_fields if updated is raw else RawBSONDocument(updated, _codec(update.updated_fields))
        return UpdateDescription(fields, removed, truncated)

    def renamed_fields(self) -> set[str]:
        """The top-level fields a rename touches (at their level or under them), by both names."""
        out: set[str] = set()

        def renames(node: _Node) -> bool:
            return node.rename is not None or any(renames(child) for child in node.children.values())

        for name, node in self._root.items():
            if renames(node):
                out.add(name.decode())
                if node.rename is not None:
                    out.add(node.rename.decode())
        return out

    def excluded_paths(self) -> list[str]:
        """The dotted paths this editor excludes (through arrays, as the rules name them)."""
        out: list[str] = []

        def walk(nodes: dict[bytes, _Node], prefix: str) -> None:
            for name, node in nodes.items():
                path = f"{prefix}{name.decode()}"
                if node.exclude:
                    out.append(path)
                walk(node.children, path + ".")

        walk(self._root, "")
        return out

    def kept(self, old: Mapping[str, Any], new: Mapping[str, Any]) -> Mapping[str, Any]:
        """``new`` without the fields this editor excludes, and with ``old``'s values of them, each in its
        place (after the field that came before it in ``old``): the document the way back of a migration
        that excluded those fields writes over ``old``. Every other byte of ``new`` is kept. Raises
        :class:`KeptFieldConflict` where ``new`` has no place for one of them (its parent is gone or no
        longer a document, or an array of them changed its length)."""
        raw = _keep_document(_raw(old), _raw(new), self._root, "")
        return new if raw == _raw(new) else RawBSONDocument(raw, _codec(new))

    def _walk(self, path: bytes) -> tuple[bytes, dict[bytes, _Node] | None] | None:
        """A dotted path as renamed, and the rules that apply inside its value; None when excluded.
        Array indexes (numeric parts) pass through."""
        nodes: dict[bytes, _Node] | None = self._root
        out: list[bytes] = []
        for part in path.split(b"."):
            node = nodes.get(part) if nodes else None
            if node is None:
                out.append(part)
                if not part.isdigit():
                    nodes = None  # off every rule's path: the rest is kept as is
                continue
            if node.exclude:
                return None
            out.append(node.rename or part)
            nodes = node.children
        return b".".join(out), nodes

    def _path(self, path: str) -> str | None:
        walked = self._walk(path.encode())
        return walked[0].decode() if walked is not None else None

    def _edit_path(self, name: bytes, kind: int, value: bytes) -> tuple[bytes, bytes] | None:
        walked = self._walk(name)
        if walked is None:
            return None
        new_name, inside = walked
        return new_name, _edit_value(kind, value, inside) if inside else value


def _raw(doc: Mapping[str, Any]) -> bytes:
    return bytes(doc.raw) if isinstance(doc, RawBSONDocument) else bson.encode(doc)


def _codec(doc: Mapping[str, Any]) -> Any:
    return getattr(doc, "codec_options", None)


def _value_size(data: bytes, kind: int, at: int) -> int:
    """The size of the BSON value of type ``kind`` that starts at ``at``."""
    fixed = _FIXED.get(kind)
    if fixed is not None:
        return fixed
    if kind in (0x02, 0x0D, 0x0E):  # string, code, symbol: int32 length + bytes
        return 4 + int(_INT32.unpack_from(data, at)[0])
    if kind in (_DOCUMENT, _ARRAY, 0x0F):  # document, array, code with scope: int32 total size
        return int(_INT32.unpack_from(data, at)[0])
    if kind == 0x05:  # binary: int32 length, subtype, bytes
        return 5 + int(_INT32.unpack_from(data, at)[0])
    if kind == 0x0B:  # regex: two cstrings
        end = data.index(b"\x00", data.index(b"\x00", at) + 1)
        return end + 1 - at
    if kind == 0x0C:  # DBPointer: string + ObjectId
        return 16 + int(_INT32.unpack_from(data, at)[0])
    raise ValueError(f"unknown BSON type 0x{kind:02x}")


def _elements(data: bytes) -> Iterator[tuple[int, int, bytes, int, int]]:
    """(start, kind, name, value start, end) of each element of a BSON document."""
    pos, end = 4, len(data) - 1
    while pos < end:
        kind = data[pos]
        name_end = data.index(b"\x00", pos + 1)
        value_at = name_end + 1
        stop = value_at + _value_size(data, kind, value_at)
        yield pos, kind, data[pos + 1 : name_end], value_at, stop
        pos = stop


_Edit = Callable[[bytes, int, bytes], "tuple[bytes, bytes] | None"]


def _edit_elements(data: bytes, edit: _Edit) -> bytes:
    """Rebuild a document through ``edit(name, kind, value) -> (name, value) | None`` (None drops the
    element); returns ``data`` itself when nothing changed."""
    parts: list[bytes] = []
    changed = False
    for start, kind, name, value_at, stop in _elements(data):
        value = data[value_at:stop]
        result = edit(name, kind, value)
        if result is None:
            changed = True
            continue
        new_name, new_value = result
        if new_name is name and new_value is value:
            parts.append(data[start:stop])
            continue
        changed = changed or new_name != name or new_value != value
        parts.append(bytes((kind,)) + new_name + b"\x00" + new_value)
    if not changed:
        return data
    body = b"".join(parts)
    return _INT32.pack(len(body) + 5) + body + b"\x00"


def _edit_value(kind: int, value: bytes, nodes: dict[bytes, _Node]) -> bytes:
    if kind == _DOCUMENT:
        return _edit_document(value, nodes)
    if kind == _ARRAY:  # the rules apply to each document in the array
        return _edit_elements(value, lambda name, k, v: (name, _edit_value(k, v, nodes)))
    return value


def _edit_document(data: bytes, nodes: dict[bytes, _Node]) -> bytes:
    def edit(name: bytes, kind: int, value: bytes) -> tuple[bytes, bytes] | None:
        node = nodes.get(name)
        if node is None:
            return name, value
        if node.exclude:
            return None
        inside = _edit_value(kind, value, node.children) if node.children else value
        return node.rename or name, inside

    return _edit_elements(data, edit)


class KeptFieldConflict(ValueError):
    """A document has no place for a field the way back keeps: ``path`` (dotted) names where it was."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


def _holds_excluded(kind: int, value: bytes, nodes: dict[bytes, _Node]) -> bool:
    return _edit_value(kind, value, _excluded_only(nodes)) != value


def _excluded_only(nodes: dict[bytes, _Node]) -> dict[bytes, _Node]:
    return {name: _Node(exclude=node.exclude, children=_excluded_only(node.children)) for name, node in nodes.items()}


def _keep_value(old_kind: int, old: bytes, kind: int, new: bytes, nodes: dict[bytes, _Node], path: str) -> bytes:
    """``new`` (of type ``kind``) stripped of the excluded fields inside it, with ``old``'s values of them."""
    if old_kind == kind == _DOCUMENT:
        return _keep_document(old, new, nodes, path + ".")
    if old_kind == kind == _ARRAY:
        old_items, new_items = list(_elements(old)), list(_elements(new))
        if len(old_items) == len(new_items):
            parts = []
            for (_, ok, _, ova, ost), (_, nk, name, nva, nst) in zip(old_items, new_items, strict=True):
                value = _keep_value(ok, old[ova:ost], nk, new[nva:nst], nodes, path)
                parts.append(bytes((nk,)) + name + b"\x00" + value)
            body = b"".join(parts)
            return _INT32.pack(len(body) + 5) + body + b"\x00"
    if _holds_excluded(old_kind, old, nodes):
        raise KeptFieldConflict(path)
    return _edit_value(kind, new, _excluded_only(nodes))


def _keep_document(old: bytes, new: bytes, nodes: dict[bytes, _Node], prefix: str) -> bytes:
    old_items = {name: (kind, old[at:stop], old[value_at:stop]) for at, kind, name, value_at, stop in _elements(old)}
    parts: list[tuple[bytes, bytes]] = []  # (name, element)
    for start, kind, name, value_at, stop in _elements(new):
        node = nodes.get(name)
        if node is not None and node.exclude:
            continue  # the new side's own value of a field the way back never writes
        if node is None or not node.children:
            parts.append((name, new[start:stop]))
            continue
        was = old_items.get(name)
        value = new[value_at:stop]
        if was is not None:
            value = _keep_value(was[0], was[2], kind, value, node.children, prefix + name.decode())
        else:
            value = _edit_value(kind, value, _excluded_only(node.children))
        parts.append((name, bytes((kind,)) + name + b"\x00" + value))
    names = [name for name, _ in parts]
    for name, (kind, _, value) in old_items.items():  # a parent of kept fields the new document lacks
        node = nodes.get(name)
        if node is not None and not node.exclude and name not in names and _holds_excluded(kind, value, node.children):
            raise KeptFieldConflict(prefix + name.decode())
    order = list(old_items)
    for i, name in enumerate(order):
        node = nodes.get(name)
        if node is None or not node.exclude:
            continue
        at = 0  # after the nearest field before it in old that the document still has
        for before in reversed(order[:i]):
            if before in names:
                at = names.index(before) + 1
                break
        parts.insert(at, (name, old_items[name][1]))
        names.insert(at, name)
    body = b"".join(element for _, element in parts)
    return _INT32.pack(len(body) + 5) + body + b"\x00"


def transform_fields(rules: FieldRules) -> Callable[[ChangeEvent], ChangeEvent]:
    """The field stage for :func:`~replicator.settings.selection.make_transform`: edits an event of a source
    namespace that has rules, passes every other event as it is."""

    def apply(event: ChangeEvent) -> ChangeEvent:
        if event.op is Op.CREATE_INDEXES:  # a unique index made on an edited field: see unique_refusal
            problem = rules.unique_refusal(event.ns, (event.ddl or {}).get("indexes") or ())
            if problem is not None:
                raise ConfigError(problem)
        editor = rules.for_namespace(event.ns)
        return editor.event(event) if editor is not None else event

    return apply
