"""BSON's deprecated types in Extended JSON: Symbol, Undefined and DBPointer. Pure: raw BSON in, data out.

pymongo decodes a Symbol as a ``str``, Undefined as ``None`` and a DBPointer as a ``DBRef``, so a document
holding one loses it on the way to Extended JSON. The spec's canonical (and relaxed) forms are
``{"$symbol": s}``, ``{"$undefined": true}`` and ``{"$dbPointer": {"$ref": ns, "$id": {"$oid": hex}}}``.

Finding such an element exactly takes a walk over the element headers, which costs more than the C
decoder's whole conversion. So a document is first searched, in C, for a byte of those three types
followed by a field name, its NUL and the start of such a value (``CANDIDATE``): a document without one
holds none of them, and goes the fast way. Only a document with a candidate is walked (:func:`holds_deprecated`), and
only one that holds such an element is converted here (:func:`convert`), every other element through the
caller's decoder. A deprecated-type field whose name is empty or starts with a control character is not
seen by the search (a limit: no driver writes such names).
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Callable
from typing import Any

_SYMBOL, _UNDEFINED, _DBPOINTER = 0x0E, 0x06, 0x0C
DEPRECATED = frozenset({_SYMBOL, _UNDEFINED, _DBPOINTER})
#: A deprecated type byte, a field name (printable or UTF-8) and its NUL, then what its value must start
#: with: for Undefined (no value) the next element's type byte or the document's end; for Symbol and
#: DBPointer a string's int32 length (1 to 16 MB: its last byte is 0)
#: (one leading character set, then the alternatives by lookbehind: the regex engine then skips, in C,
#: every position that does not start with one of the three type bytes; half the cost of an alternation)
CANDIDATE = re.compile(
    rb"[\x06\x0c\x0e](?:(?<=\x06)[\x20-\xff]+\x00[\x00-\x13\x7f\xff]"
    rb"|(?<=[\x0c\x0e])[\x20-\xff]+\x00[\x00-\xff][\x00-\xff][\x00-\xff]\x00)"
)
#: value sizes of the fixed-size types
_FIXED = {0x01: 8, 0x06: 0, 0x07: 12, 0x08: 1, 0x09: 8, 0x0A: 0, 0x10: 4, 0x11: 8, 0x12: 8, 0x13: 16, 0xFF: 0, 0x7F: 0}
_LENGTH_PREFIXED = frozenset({0x02, 0x0D, 0x0E})  # int32 length, then that many bytes


def _int32(data: bytes, pos: int) -> int:
    return int.from_bytes(data[pos : pos + 4], "little", signed=True)


def _value_end(data: bytes, t: int, pos: int) -> int:
    """Where the value of type ``t`` starting at ``pos`` ends."""
    size = _FIXED.get(t)
    if size is not None:
        return pos + size
    if t in _LENGTH_PREFIXED:
        return pos + 4 + _int32(data, pos)
    if t in (0x03, 0x04, 0x0F):  # document, array, code with scope: their int32 counts themselves
        return pos + _int32(data, pos)
    if t == 0x05:  # binary: length, subtype, bytes
        return pos + 5 + _int32(data, pos)
    if t == 0x0B:  # regex: two cstrings
        return data.index(0, data.index(0, pos) + 1) + 1
    if t == _DBPOINTER:  # a string, then an ObjectId
        return pos + 4 + _int32(data, pos) + 12
    raise ValueError(f"unknown BSON type 0x{t:02x}")


#: where the value of an element of type ``t`` starting at ``pos`` ends: for other readers of raw elements
value_end = _value_end


def holds_deprecated(data: bytes, start: int = 0) -> bool:
    """Does this BSON document hold a Symbol, Undefined or DBPointer, at any depth? Cheap when
    :data:`CANDIDATE` finds nothing; else the element headers are walked, skipping every nested document
    that holds no candidate, and stopping after the last one. ``start``: no candidate comes before it
    (the caller's search found the first there)."""
    spots = [m.start() for m in CANDIDATE.finditer(data, start)]
    return bool(spots) and _walk(data, 4, len(data) - 1, spots)


def _walk(data: bytes, pos: int, end: int, spots: list[int]) -> bool:
    """Is one of ``spots`` the type byte of an element between ``pos`` and ``end`` (or deeper)?"""
    last = spots[-1]
    while pos < end and pos <= last:
        t = data[pos]
        if t in DEPRECATED and pos == spots[bisect_left(spots, pos)]:
            return True
        value = data.index(0, pos + 1) + 1  # past the field name
        stop = _value_end(data, t, value)
        inside = bisect_left(spots, value) < len(spots) and spots[bisect_left(spots, value)] < stop
        if inside and t in (0x03, 0x04) and _walk(data, value + 4, stop - 1, spots):
            return True
        if inside and t == 0x0F:
            scope = value + 8 + _int32(data, value + 4)
            if _walk(data, scope + 4, stop - 1, spots):
                return True
        pos = stop
    return False


def convert(
    data: bytes,
    decode: Callable[[bytes], dict[str, Any]],
    start: int = 0,
    array: bool = False,
    *,
    dbpointer: Callable[[str, str], Any] | None = None,
) -> Any:
    """The document (or array) at ``start`` as Extended JSON data: deprecated types in their spec form,
    documents and arrays walked, every other element converted by ``decode`` (the caller's C decoder, given
    a one-element document). ``dbpointer``: a DBPointer's form other than the spec's, from its namespace
    and ObjectId hex (the Java driver's JSON writes ``{"$ref": ns, "$id": {"$oid": hex}}``)."""
    out: dict[str, Any] = {}
    pos, end = start + 4, start + _int32(data, start) - 1
    while pos < end:
        t = data[pos]
        name_end = data.index(0, pos + 1)
        name = data[pos + 1 : name_end].decode()
        value = name_end + 1
        stop = _value_end(data, t, value)
        if t == _SYMBOL:
            out[name] = {"$symbol": data[value + 4 : stop - 1].decode()}
        elif t == _UNDEFINED:
            out[name] = {"$undefined": True}
        elif t == _DBPOINTER:
            ns = data[value + 4 : stop - 13].decode()
            oid = data[stop - 12 : stop].hex()
            out[name] = dbpointer(ns, oid) if dbpointer else {"$dbPointer": {"$ref": ns, "$id": {"$oid": oid}}}
        elif t in (0x03, 0x04) and holds_deprecated(data[value:stop]):
            out[name] = convert(data, decode, value, array=t == 0x04, dbpointer=dbpointer)
        elif t == 0x0F and holds_deprecated(data[(scope := value + 8 + _int32(data, value + 4)) : stop]):
            code = data[value + 8 : scope - 1].decode()
            out[name] = {"$code": code, "$scope": convert(data, decode, scope, dbpointer=dbpointer)}
        else:
            element = data[pos:stop]
            out.update(decode((len(element) + 5).to_bytes(4, "little") + element + b"\x00"))
        pos = stop
    return list(out.values()) if array else out
