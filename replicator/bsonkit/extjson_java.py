"""BSON as the MongoDB Java driver's ``JsonWriter`` writes it: the JSON Debezium's MongoDB connector puts in its
records. Pure: BSON in, UTF-8 JSON text out.

Debezium (3.6, ``JsonSerialization`` and ``MongoDbCollectionSchema``) writes three forms:

* documents (``after``, ``before``): ``JsonMode.STRICT`` (the driver's legacy "strict" Extended JSON) with
  ``indent(true)``, ``indentCharacters("")`` and ``newLineCharacters("")``: ``{"a": 1,"b": [1,2]}``
  (:func:`strict`);
* a key's ``_id``: ``JsonMode.RELAXED``, written the same compact way (:func:`relaxed_id`);
* ``updatedFields``: ``BsonDocument.toJson()``, ``JsonMode.RELAXED`` without indentation:
  ``{"a": 1, "b": [1, 2]}`` (:func:`relaxed`).

The values, by type (the driver's converters for those modes):

==============  ==========================================  =================================================
type            strict                                      relaxed
==============  ==========================================  =================================================
int32           ``1``                                       ``1``
int64           ``{"$numberLong": "1"}``                    ``1``
double          ``1.0``, ``1.0E+16``, ``-0.0``, ``NaN``,    ``1.0``, ``1.0E+16``, ``-0.0``;
                ``Infinity`` (Java's ``Double.toString``)   ``{"$numberDouble": "NaN"}`` and the infinities
date            ``{"$date": 1577836800000}``                ``{"$date": "2020-01-01T00:00:00.1Z"}`` (1970 to
                                                            9999; else ``{"$date": {"$numberLong": "-1"}}``)
binary          ``{"$binary": "AAE=","$type": "00"}``       ``{"$binary": {"base64": "AAE=","subType": "00"}}``
regex           ``{"$regex": "a","$options": "i"}``         ``{"$regularExpression": {"pattern": ...}}``
DBPointer       ``{"$ref": "db.c","$id": {"$oid": ...}}``   the same
==============  ==========================================  =================================================

and for both: ``{"$oid": ...}``, ``{"$numberDecimal": ...}``, ``{"$timestamp": {"t": 1,"i": 2}}``,
``{"$minKey": 1}``, ``{"$maxKey": 1}``, ``{"$code": ...}`` (with ``"$scope"``), ``{"$symbol": ...}``,
``{"$undefined": true}``. A binary subtype is two upper-case hex digits.

Strings (names too) are escaped as the driver's ``StrictCharacterStreamJsonWriter`` does: ``\\"``, ``\\\\``,
``\\b``, ``\\f``, ``\\n``, ``\\r``, ``\\t``, and ``\\uXXXX`` (lower-case hex) for every UTF-16 unit that is not a
letter, digit, punctuation, symbol or space separator by ``Character.getType``: controls (DEL included),
format characters, combining marks, modifier letters, private use, unassigned code points, and each half of
a character beyond U+FFFF. Categories come from Python's ``unicodedata`` (Unicode 14 on Python 3.11), the
JVM's from its own version (Unicode 13 on Java 17, 15 on Java 21): a code point assigned between the two is
written differently (see docs/how-to/switch-from-debezium.md).

How: pymongo's C decoder turns a raw document into Python data with these converters (as
:mod:`replicator.bsonkit.extjson` does for canonical Extended JSON), doubles as ``orjson.Fragment`` s of
Java's text, and orjson writes it; the driver's separators (``": "``) are put in afterwards, exactly: in
orjson's compact output every ``":`` is a name's end unless a string holds an escaped quote or starts with
a colon (``_COLON_STRING``), and then orjson's indented output, whose line breaks are all separators, is
used instead. Text that is not all ASCII
is escaped last.
"""

from __future__ import annotations

import binascii
import datetime
import functools
import math
import re
import unicodedata
import uuid
from collections.abc import Callable, Mapping
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

import orjson
from bson.binary import Binary, UuidRepresentation
from bson.code import Code
from bson.codec_options import CodecOptions, DatetimeConversion, TypeDecoder, TypeRegistry
from bson.datetime_ms import DatetimeMS
from bson.dbref import DBRef
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.objectid import ObjectId
from bson.raw_bson import RawBSONDocument
from bson.regex import Regex
from bson.timestamp import Timestamp

from replicator.bsonkit.deprecated import CANDIDATE, convert, holds_deprecated, value_end
from replicator.bsonkit.extjson_types import _decode_bson, _regex_options

_Converter = Callable[[Any], Any]
_Fragment = orjson.Fragment
_dumps = orjson.dumps
_b64 = binascii.b2a_base64
_INDENT = orjson.OPT_INDENT_2
_LAST_MS_OF_9999 = 253_402_300_799_999
_EPOCH = datetime.datetime(1970, 1, 1)
_HEX = tuple(f"{subtype:02X}" for subtype in range(256))
_BREAK = re.compile(rb"\n *")  # orjson's indentation: a line break and the next line's spaces
#: in orjson's compact text, what makes a '":' other than a name's end: a quote escaped in a string (``\\"``), or
#: a string that starts with ':' (its opening quote follows one of '{[,:'; so does a name's end when a name ends
#: in one). The regular expression begins with the literal '":', which the engine skips to in C: a fifth of
#: the time of searching for the four sequences as literals, or of one expression with a character class first
_COLON_STRING = re.compile(rb'":(?<=[{\[,:]":)')
_TENTH = Decimal("0.1")


# -- numbers and dates ---------------------------------------------------------------------------------------


def java_double(value: float) -> str:
    """``value`` as the driver writes a double: Java's ``Double.toString`` (the shortest decimal that reads
    back as ``value``, as from Java 19 on), with a ``+`` in a positive exponent (``JsonDoubleHelper``)."""
    magnitude = abs(value)
    if 1e-3 <= magnitude < 1e7 or magnitude == 0.0:
        return repr(value)  # plain notation, at least one fractional digit: the same as Python's
    if value != value:
        return "NaN"
    if magnitude == math.inf:
        return "Infinity" if value > 0 else "-Infinity"
    mantissa, _, exponent = repr(magnitude).partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = (whole + fraction).lstrip("0")
    scale = int(exponent or 0) - len(fraction)
    stripped = digits.rstrip("0")
    scale += len(digits) - len(stripped)
    digits = stripped
    power = scale + len(digits) - 1  # value = d.ddd x 10**power
    if len(digits) == 1:  # Java writes two digits then: the two-digit decimal nearest the exact value
        nearest = (Decimal(magnitude).scaleb(-power)).quantize(_TENTH, rounding=ROUND_HALF_EVEN)
        digits = str(nearest).replace(".", "").rstrip("0") or "0"
    sign = "-" if value < 0 else ""
    sign_exp = "+" if power >= 0 else ""
    return f"{sign}{digits[0]}.{digits[1:] or '0'}E{sign_exp}{power}"


def java_instant(ms: int) -> str:
    """A date (1970 to 9999) as ``ISO_OFFSET_DATE_TIME`` writes it in UTC: seconds always, the fraction
    without trailing zeros, ``Z``."""
    seconds, millis = divmod(ms, 1000)
    text = (_EPOCH + datetime.timedelta(seconds=seconds)).isoformat()
    return text + ("." + f"{millis:03d}".rstrip("0") if millis else "") + "Z"


# -- converters, per mode ------------------------------------------------------------------------------------


def _s_double(v: float) -> _Fragment:
    return _Fragment(java_double(v))


def _r_double(v: float) -> Any:
    if v - v == 0.0:
        return _Fragment(java_double(v))
    return {"$numberDouble": java_double(v)}


def _s_int64(v: int) -> dict[str, str]:
    return {"$numberLong": int.__repr__(v)}


def _r_int64(v: int) -> int:
    return int(v)


def _s_date(v: DatetimeMS) -> dict[str, int]:
    return {"$date": int(v)}


def _r_date(v: DatetimeMS) -> dict[str, Any]:
    ms = int(v)
    if 0 <= ms <= _LAST_MS_OF_9999:
        return {"$date": java_instant(ms)}
    return {"$date": {"$numberLong": str(ms)}}


def _s_binary(v: bytes) -> dict[str, str]:
    subtype = v.subtype if isinstance(v, Binary) else 0
    return {"$binary": _b64(v, newline=False).decode(), "$type": _HEX[subtype]}


def _r_binary(v: bytes) -> dict[str, Any]:
    subtype = v.subtype if isinstance(v, Binary) else 0
    return {"$binary": {"base64": _b64(v, newline=False).decode(), "subType": _HEX[subtype]}}


def _pattern(v: Regex[Any] | re.Pattern[Any]) -> str:
    return v.pattern if isinstance(v.pattern, str) else v.pattern.decode("utf-8")


def _s_regex(v: Regex[Any]) -> dict[str, str]:
    return {"$regex": _pattern(v), "$options": _regex_options(v.flags)}


def _r_regex(v: Regex[Any]) -> dict[str, Any]:
    return {"$regularExpression": {"pattern": _pattern(v), "options": _regex_options(v.flags)}}


def _dbpointer(ns: str, oid: str) -> dict[str, Any]:
    return {"$ref": ns, "$id": {"$oid": oid}}


def _objectid(v: ObjectId) -> dict[str, str]:
    return {"$oid": v.binary.hex()}


def _decimal(v: Decimal128) -> dict[str, str]:
    return {"$numberDecimal": str(v)}  # every NaN is "NaN", as Java's Decimal128.toString writes it


def _timestamp(v: Timestamp) -> dict[str, Any]:
    return {"$timestamp": {"t": v.time, "i": v.inc}}


def _minkey(_: Any) -> dict[str, int]:
    return {"$minKey": 1}


def _maxkey(_: Any) -> dict[str, int]:
    return {"$maxKey": 1}


def _dbref(v: DBRef) -> dict[str, Any]:
    return dict(v.as_doc())  # values converted already (raw decoding); see _walk for Python values


def _code(v: Code) -> dict[str, Any]:
    return {"$code": str.__str__(v)} if v.scope is None else {"$code": str.__str__(v), "$scope": dict(v.scope)}


_COMMON: dict[type, _Converter] = {
    ObjectId: _objectid,
    Decimal128: _decimal,
    Timestamp: _timestamp,
    MinKey: _minkey,
    MaxKey: _maxkey,
    DBRef: _dbref,
    Code: _code,
}
_STRICT: dict[type, _Converter] = {
    **_COMMON, float: _s_double, Int64: _s_int64, DatetimeMS: _s_date, bytes: _s_binary, Binary: _s_binary,
    Regex: _s_regex,
}  # fmt: skip
_RELAXED: dict[type, _Converter] = {
    **_COMMON, float: _r_double, Int64: _r_int64, DatetimeMS: _r_date, bytes: _r_binary, Binary: _r_binary,
    Regex: _r_regex,
}  # fmt: skip


def _decoder(bson_type: type, converter: _Converter) -> TypeDecoder:
    body = {"bson_type": bson_type, "transform_bson": staticmethod(converter)}
    return type(f"_Java{bson_type.__name__}", (TypeDecoder,), body)()  # type: ignore[no-any-return]


def _options(table: dict[type, _Converter]) -> CodecOptions[dict[str, Any]]:
    return CodecOptions(
        document_class=dict,
        tz_aware=False,
        uuid_representation=UuidRepresentation.UNSPECIFIED,  # subtypes 3 and 4 stay Binary
        datetime_conversion=DatetimeConversion.DATETIME_MS,
        type_registry=TypeRegistry([_decoder(t, c) for t, c in table.items()]),
    )


_STRICT_DECODE = _options(_STRICT)
_RELAXED_DECODE = _options(_RELAXED)


def _data(value: Any, relaxed: bool) -> Any:
    """``value`` (a raw document, or Python BSON values) as data orjson writes in the mode's forms."""
    if isinstance(value, RawBSONDocument):
        data = value.raw
        options = _RELAXED_DECODE if relaxed else _STRICT_DECODE
        first = CANDIDATE.search(data)
        if first is None or not holds_deprecated(whole := bytes(data), first.start()):
            return _decode_bson(data, options)
        return convert(whole, lambda one: _decode_bson(one, options), dbpointer=_dbpointer)
    return _walk(value, _RELAXED if relaxed else _STRICT)


def _walk(v: Any, table: dict[type, _Converter]) -> Any:
    """Python BSON values (as pymongo decodes them with its defaults) converted by ``table``."""
    t = type(v)
    if t is str or t is bool or v is None:
        return v
    if t is int:
        return v if -2147483648 <= v <= 2147483647 else table[Int64](v)  # pymongo writes a larger int as int64
    if isinstance(v, RawBSONDocument):
        return _data(v, table is _RELAXED)
    if isinstance(v, Mapping):
        return {k: _walk(x, table) for k, x in v.items()}
    if t is list or t is tuple:
        return [_walk(x, table) for x in v]
    if isinstance(v, datetime.datetime):
        return table[DatetimeMS](DatetimeMS(v))
    if isinstance(v, DBRef):
        return _walk(v.as_doc(), table)
    if isinstance(v, Code):
        code = {"$code": str.__str__(v)}
        return code if v.scope is None else {**code, "$scope": _walk(v.scope, table)}
    if isinstance(v, uuid.UUID):
        raise ValueError("cannot write a native uuid.UUID as the Java driver's JSON: use bson.Binary.from_uuid()")
    if isinstance(v, re.Pattern):
        return table[Regex](Regex.from_native(v))
    converter = table.get(t)
    if converter is not None:
        return converter(v)
    if isinstance(v, int):  # a subclass of int (not Int64, which is in the table): as pymongo writes an int
        return _walk(int(v), table)
    if isinstance(v, str):
        return str.__str__(v)
    for base, converter in table.items():  # a subclass of a BSON type: as its base
        if isinstance(v, base):
            return converter(v)
    raise TypeError(f"cannot write an object of type {t.__qualname__} as the Java driver's JSON")


# -- text ------------------------------------------------------------------------------------------------


def _compact(data: Any) -> bytes:
    """``data`` with the driver's separators when indenting with no characters: ``{"a": 1,"b": [1,2]}``."""
    text = _dumps(data)
    # every '":' ends a name (one byte's search first: a text without any escape needs no second one)
    if (b"\\" not in text or b'\\"' not in text) and _COLON_STRING.search(text) is None:
        text = text.replace(b'":', b'": ')
    else:
        text = _BREAK.sub(b"", _dumps(data, option=_INDENT))
    return _ascii(text)


def _ascii(text: bytes) -> bytes:
    return text if text.isascii() and b"\x7f" not in text else _escape(text)


def _spaced(data: Any) -> bytes:
    """``data`` with the driver's default separators: ``{"a": 1, "b": [1, 2]}``."""
    text = _dumps(data)
    # no array, no escape, no string starting with ':': every '":' ends a name, and every ',"' separates two
    # members unless a string ends with ',' (then ',",' or ',"}' follows): the common updatedFields
    simple = b"[" not in text and b"\\" not in text and _COLON_STRING.search(text) is None
    if simple and b',",' not in text and b',"}' not in text:
        return _ascii(text.replace(b'":', b'": ').replace(b',"', b', "'))
    text = _dumps(data, option=_INDENT).replace(b",\n", b",\x00\n")  # NUL: never raw in JSON text
    return _ascii(_BREAK.sub(b"", text).replace(b",\x00", b", "))


def strict(document: Any) -> bytes:
    """A document as Debezium writes ``after`` and ``before``."""
    return _compact(_data(document, False))


def relaxed(document: Any) -> bytes:
    """A document as Debezium writes ``updatedFields`` (``BsonDocument.toJson()``)."""
    return _spaced(_data(document, True))


def relaxed_id(value: Any) -> bytes:
    """A key's ``_id`` (a Python BSON value) as Debezium writes it."""
    t = type(value)
    if t is str:
        text = _dumps(value)
        return text if text.isascii() and b"\x7f" not in text else _escape(text)
    if t is int and -2147483648 <= value <= 2147483647:
        return b"%d" % value
    return _compact(_walk(value, _RELAXED))


def relaxed_key(document: RawBSONDocument) -> bytes | None:
    """A raw document's ``_id`` as Debezium writes it in a key (None: it has none). Only that element is
    decoded: the server puts ``_id`` first, so it is found at once."""
    raw = document.raw
    data = raw if isinstance(raw, bytes) else bytes(raw)
    pos, end = 4, len(data) - 1
    while pos < end:
        name_end = data.index(0, pos + 1)
        stop = value_end(data, data[pos], name_end + 1)
        if data[pos + 1 : name_end] == b"_id":
            kind, value = data[pos], name_end + 1
            if kind == 0x07:  # the common kinds first, written from the bytes: an ObjectId
                return b'{"$oid": "' + data[value:stop].hex().encode() + b'"}'
            if kind == 0x10 or kind == 0x12:  # int32, int64 (relaxed: a number)
                return b"%d" % int.from_bytes(data[value:stop], "little", signed=True)
            if kind == 0x02:
                return relaxed_id(data[value + 4 : stop - 1].decode())
            element = bytes(data[pos:stop])
            one = (len(element) + 5).to_bytes(4, "little") + element + b"\x00"
            text = _compact(_data(RawBSONDocument(one), True))
            return text[8:-1]  # {"_id": X} -> X
        pos = stop
    return None


# -- strings ---------------------------------------------------------------------------------------------

#: the Character.getType categories the driver writes as they are (StrictCharacterStreamJsonWriter)
_AS_IS = frozenset(("Lu", "Ll", "Lt", "Lo", "Nd", "Nl", "No", "Zs", "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "Sm"))
_AS_IS |= {"Sc", "Sk", "So"}


@functools.cache
def _escaped_characters() -> re.Pattern[str]:
    """Every character the driver writes as ``\\uXXXX``: built once, on the first text that is not ASCII."""
    ranges: list[str] = []
    start = None
    for code in range(0x7F, 0x10000):
        escaped = 0xD800 <= code <= 0xDFFF or unicodedata.category(chr(code)) not in _AS_IS
        if escaped and start is None:
            start = code
        elif not escaped and start is not None:
            ranges.append(f"\\u{start:04x}-\\u{code - 1:04x}")
            start = None
    if start is not None:
        ranges.append(f"\\u{start:04x}-\\uffff")
    return re.compile("[" + "".join(ranges) + "\\U00010000-\\U0010ffff]")


def _unit(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000  # a UTF-16 surrogate pair, each half escaped
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def _escape(text: bytes) -> bytes:
    """orjson's JSON text with the characters the driver escapes (and orjson does not) escaped: they occur
    only inside strings, which orjson writes with the same escapes as the driver otherwise."""
    return _escaped_characters().sub(_unit, text.decode()).encode()
