"""BSON values as MongoDB's query engine orders them: type brackets, then values. Pure.

A value here is what :mod:`replicator.bsonkit.rawbson`'s span decoder makes of a document's fields:
sub-documents stay their bytes (a :data:`~replicator.bsonkit.rawbson.Span`, or a RawBSONDocument where
a code-with-scope forced the slower decoder), arrays are lists, dates are DatetimeMS. :data:`MISSING`
stands for a path that leads nowhere (mongod's EOO element).

The order is the server's (``BSONElement::compareElements``): first the canonical type, a bracket that
puts int, long, double and decimal together, then the value within it; numbers by their exact values
(NaN below every number, and equal to NaN); strings by their UTF-8 bytes (the simple collation; code
point order is the same order); documents element by element (type, then field name, then value), the
shorter first; binData by length, then subtype, then bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from bson.binary import Binary
from bson.code import Code
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.datetime_ms import DatetimeMS
from bson.dbref import DBRef
from bson.decimal128 import Decimal128
from bson.errors import InvalidBSON
from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.objectid import ObjectId
from bson.raw_bson import RawBSONDocument
from bson.regex import Regex
from bson.timestamp import Timestamp

from replicator.bsonkit.deprecated import CANDIDATE, holds_deprecated, value_end
from replicator.bsonkit.rawbson import SPAN_CODEC, RawDocument, Span, raw_of, top_level


class _Missing:
    """A path that names no value (mongod's EOO element)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


class _Undefined:
    """BSON's deprecated undefined (pymongo reads it as None, which it is not: its own type, 6)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "UNDEFINED"


class Symbol(str):
    """BSON's deprecated symbol (pymongo reads it as a str): compared as a string, its own type (14)."""

    __slots__ = ()


MISSING: Any = _Missing()
UNDEFINED: Any = _Undefined()

# canonical types (mongod's canonicalizeBSONType)
MINKEY, EOO, NULL, NUMBER, STRING, OBJECT, ARRAY, BINDATA, OID, BOOL, DATE, TIMESTAMP, REGEX = (
    -1, 0, 5, 10, 15, 20, 25, 30, 35, 40, 45, 47, 50,
)  # fmt: skip
DBPOINTER, CODE, CODE_W_SCOPE, MAXKEY = 55, 60, 65, 127

#: the bracket of each Python type the decoder makes (Code is looked at apart: with or without scope)
BRACKET: dict[type, int] = {
    _Missing: EOO,
    _Undefined: EOO,  # mongod's canonical type puts undefined with EOO, below null
    type(None): NULL,
    int: NUMBER,
    Int64: NUMBER,
    float: NUMBER,
    Decimal128: NUMBER,
    str: STRING,
    Symbol: STRING,
    Span: OBJECT,
    RawDocument: OBJECT,
    RawBSONDocument: OBJECT,
    list: ARRAY,
    bytes: BINDATA,
    Binary: BINDATA,
    ObjectId: OID,
    bool: BOOL,
    DatetimeMS: DATE,
    Timestamp: TIMESTAMP,
    Regex: REGEX,
    DBRef: DBPOINTER,  # the span decoder leaves {$ref, $id} documents raw: a DBRef is a DBPointer
    MinKey: MINKEY,
    MaxKey: MAXKEY,
}


def bracket(value: Any) -> int:
    kind = BRACKET.get(type(value))
    if kind is not None:
        return kind
    if isinstance(value, Code):
        return CODE if value.scope is None else CODE_W_SCOPE
    raise TypeError(f"not a decoded BSON value: {type(value).__name__}")


#: How a sub-document is decoded when the span decoder cannot (pymongo builds a code-with-scope's
#: scope as a Mapping, which a Span is not): sub-documents as RawBSONDocuments.
_RAW_MS: CodecOptions[Any] = CodecOptions(
    document_class=RawDocument,
    datetime_conversion=DatetimeConversion.DATETIME_MS,
    uuid_representation=SPAN_CODEC.uuid_representation,
)


#: a document's bytes -> its top-level fields, sub-documents left undecoded
Decode = Callable[[bytes], dict[str, Any]]


def fields(data: bytes) -> dict[str, Any]:
    """A document's top-level fields, every type told apart: a symbol and undefined too, which pymongo reads
    as a string and None. Finding them costs a search of the bytes (about as much as decoding them)."""
    if CANDIDATE.search(data) is not None and holds_deprecated(data):
        return _elements(data, 4, len(data) - 1)
    return plain_fields(data)


def plain_fields(data: bytes) -> dict[str, Any]:
    """A document's top-level fields as pymongo's C decoder reads them (a symbol as a string, undefined as
    None): for a query whose answer cannot tell those apart."""
    try:
        decoded = top_level(data)
    except InvalidBSON:
        decoded = None
    if decoded is None:
        import bson

        decoded = bson._raw_to_dict(data, 4, len(data) - 1, _RAW_MS, {}, False)
    return decoded


def some_fields(data: bytes, names: frozenset[str], decode: Decode, walk: int = 48) -> dict[str, Any]:
    """The top-level fields of ``names`` only, found by their element headers (each value skipped by its
    length) and decoded one by one with ``decode``: for a large document, far cheaper than decoding all
    of its top level (its arrays element by element) when a query reads a few fields. After ``walk``
    elements (a document of many small fields) the rest is decoded at once, as the cheaper way there."""
    out: dict[str, Any] = {}
    wanted = {name.encode(): name for name in names}
    pos, end = 4, len(data) - 1
    while pos < end and len(out) < len(wanted):
        if walk == 0:
            rest = decode((end - pos + 5).to_bytes(4, "little") + data[pos:end] + b"\x00")
            out.update((name, rest[name]) for name in names if name in rest and name not in out)
            break
        walk -= 1
        kind = data[pos]
        name_end = data.index(0, pos + 1)
        stop = value_end(data, kind, name_end + 1)
        name = wanted.get(data[pos + 1 : name_end])
        if name is not None and name not in out:  # the first of a name given twice, as mongod's getField
            element = data[pos:stop]
            out[name] = decode((len(element) + 5).to_bytes(4, "little") + element + b"\x00")[name]
        pos = stop
    return out


def _elements(data: bytes, pos: int, end: int) -> dict[str, Any]:
    """The elements between ``pos`` and ``end``, read one by one: a symbol and undefined as themselves,
    every other element through the decoder (a document holding a deprecated type, rare, goes this way)."""
    out: dict[str, Any] = {}
    while pos < end:
        kind = data[pos]
        name_end = data.index(0, pos + 1)
        start = name_end + 1
        stop = value_end(data, kind, start)
        name = data[pos + 1 : name_end].decode()
        if kind == 0x0E:
            out[name] = Symbol(data[start + 4 : stop - 1].decode())
        elif kind == 0x06:
            out[name] = UNDEFINED
        elif kind == 0x03:
            out[name] = span(data[start:stop])
        elif kind == 0x04:
            out[name] = list(_elements(data, start + 4, stop - 1).values())
        else:
            element = data[pos:stop]
            out.update(fields((len(element) + 5).to_bytes(4, "little") + element + b"\x00"))
        pos = stop
    return out


def span(data: bytes) -> Any:
    """A sub-document's bytes as the span decoder leaves them (a slice whose start is the bytes)."""
    return slice(data, None)


def object_bytes(value: Any) -> bytes:
    """A sub-document's bytes (a Span's, or a RawBSONDocument's)."""
    data: bytes = value.start if type(value) is Span else raw_of(value)
    return data


def object_fields(value: Any) -> dict[str, Any]:
    """A sub-document's fields, every type told apart."""
    return fields(object_bytes(value))


def is_nan(value: Any) -> bool:
    """Is ``value`` a double or decimal NaN?"""
    if type(value) is float:
        return math.isnan(value)
    return type(value) is Decimal128 and value.to_decimal().is_nan()


def _number(value: Any) -> int | float | Decimal:
    return value.to_decimal() if type(value) is Decimal128 else value


def _sign(x: int) -> int:
    return (x > 0) - (x < 0)


def _cmp_numbers(a: Any, b: Any) -> int:
    x, y = _number(a), _number(b)
    x_nan, y_nan = _nan(x), _nan(y)
    if x_nan or y_nan:  # NaN sorts below every number and equals NaN
        return int(y_nan) - int(x_nan)
    return _cmp_plain(x, y)  # exact across int, float and Decimal (Python compares them exactly)


def _nan(number: int | float | Decimal) -> bool:
    if type(number) is float:
        return math.isnan(number)
    return type(number) is Decimal and number.is_nan()  # quiet or signalling


def _cmp_plain(a: Any, b: Any) -> int:
    return int(a > b) - int(a < b)


def _cmp_elements(a: list[tuple[str, Any]], b: list[tuple[str, Any]]) -> int:
    for (name_a, x), (name_b, y) in zip(a, b, strict=False):
        c = bracket(x) - bracket(y)
        if c:
            return _sign(c)
        if name_a != name_b:
            return _cmp_plain(name_a.encode(), name_b.encode())
        c = compare(x, y)
        if c:
            return c
    return _sign(len(a) - len(b))


def _cmp_objects(a: Any, b: Any) -> int:
    if object_bytes(a) == object_bytes(b):
        return 0
    return _cmp_elements(list(object_fields(a).items()), list(object_fields(b).items()))


def _cmp_arrays(a: list[Any], b: list[Any]) -> int:
    for x, y in zip(a, b, strict=False):
        c = bracket(x) - bracket(y)
        if c:
            return _sign(c)
        c = compare(x, y)
        if c:
            return c
    return _sign(len(a) - len(b))


def _binary(value: Any) -> tuple[int, int, bytes]:
    subtype = value.subtype if type(value) is Binary else 0
    return len(value), subtype, bytes(value)


def _cmp_regex(a: Regex[Any], b: Regex[Any]) -> int:
    return _cmp_plain((a.pattern, regex_flags(a)), (b.pattern, regex_flags(b)))


def regex_flags(value: Regex[Any]) -> str:
    """A decoded regex's flags as the letters the server stores (sorted, as drivers write them)."""
    flags = value.flags
    if isinstance(flags, str):
        return "".join(sorted(flags))
    import re

    letters = {re.IGNORECASE: "i", re.LOCALE: "l", re.MULTILINE: "m", re.DOTALL: "s", re.UNICODE: "u", re.VERBOSE: "x"}
    return "".join(sorted(letter for bit, letter in letters.items() if flags & bit))


def _cmp_code(a: Code, b: Code) -> int:
    c = _cmp_plain(str(a).encode(), str(b).encode())
    if c or a.scope is None:
        return c
    import bson

    return compare(span(bson.encode(a.scope)), span(bson.encode(b.scope or {})))


def _cmp_dbpointer(a: DBRef, b: DBRef) -> int:
    return _cmp_plain((len(a.collection), a.collection, a.id.binary), (len(b.collection), b.collection, b.id.binary))


_BY_BRACKET: dict[int, Callable[[Any, Any], int]] = {
    NUMBER: _cmp_numbers,
    STRING: lambda a, b: _cmp_plain(a, b),
    OBJECT: _cmp_objects,
    ARRAY: _cmp_arrays,
    BINDATA: lambda a, b: _cmp_plain(_binary(a), _binary(b)),
    OID: lambda a, b: _cmp_plain(a.binary, b.binary),
    BOOL: lambda a, b: int(a) - int(b),
    DATE: lambda a, b: _cmp_plain(int(a), int(b)),
    TIMESTAMP: lambda a, b: _cmp_plain((a.time, a.inc), (b.time, b.inc)),
    REGEX: _cmp_regex,
    DBPOINTER: _cmp_dbpointer,
    CODE: _cmp_code,
    CODE_W_SCOPE: _cmp_code,
}


def compare(a: Any, b: Any) -> int:
    """-1, 0 or 1: how ``a`` sorts against ``b`` in the server's order (simple collation)."""
    ka, kb = bracket(a), bracket(b)
    if ka != kb:
        return _sign(ka - kb)
    by = _BY_BRACKET.get(ka)
    return 0 if by is None else by(a, b)  # null, MinKey, MaxKey, EOO: one value each
