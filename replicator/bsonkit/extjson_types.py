"""The fast Extended JSON encoder's converters (see :func:`replicator.bsonkit.extjson.to_json_value`): per BSON
type and mode (canonical ``_C``, relaxed ``_R``), and the walkers of Python values. A raw document's
converters, which decode it, are added to the tables by :mod:`replicator.bsonkit.extjson`."""

from __future__ import annotations

import binascii
import datetime
import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import bson
import orjson
from bson.binary import Binary
from bson.code import Code
from bson.codec_options import CodecOptions
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

# --- Fast encoder -------------------------------------------------------------------------------------------
#
# ``to_json_value`` produces the same data as ``json.loads(json_util.dumps(value, json_options=CANONICAL))``
# (or RELAXED), without going through json_util or the json module: a RawBSONDocument is decoded once in C,
# its values converted by the decoder itself (see _raw_decode_options), into the plain dicts/lists that
# orjson serializes. Python values are walked: the walkers test the common exact types inline
# (``type(v) is str`` ...) and look everything else up in a ``type -> converter`` table per mode; unknown
# types (subclasses, other mappings and iterables) are resolved once the way json_util resolves them and
# then cached in that table.

_Converter = Callable[[Any], Any]

_MAX_UTC_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z, the last instant relaxed mode writes as ISO-8601
_EPOCH_NAIVE = datetime.datetime(1970, 1, 1)
_EPOCH_AWARE = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_ONE_MS = datetime.timedelta(milliseconds=1)
_NO_OFFSET = datetime.timedelta(0)
_SUBTYPES = tuple(f"{subtype:02x}" for subtype in range(256))
_REGEX_FLAGS = (
    (re.IGNORECASE, "i"),
    (re.LOCALE, "l"),
    (re.MULTILINE, "m"),
    (re.DOTALL, "s"),
    (re.UNICODE, "u"),
    (re.VERBOSE, "x"),
)  # json_util's order
_regex_options_cache: dict[int, str] = {}
_b2a_base64 = binascii.b2a_base64
# bson.decode less its argument checks: pymongo's own (C) entry point, which is what bson.decode calls.
_decode_bson: Callable[[Any, CodecOptions[dict[str, Any]]], dict[str, Any]] = getattr(
    bson, "_bson_to_dict", bson.decode
)
_orjson_dumps = orjson.dumps
_isoformat = datetime.datetime.isoformat


def _nonfinite(v: float) -> dict[str, str]:
    return {"$numberDouble": "NaN" if v != v else "Infinity" if v > 0 else "-Infinity"}


def _c_float(v: float) -> dict[str, str]:
    return {"$numberDouble": float.__repr__(v)} if v - v == 0.0 else _nonfinite(v)


def _r_float(v: float) -> Any:
    return float(v) if v - v == 0.0 else _nonfinite(v)


def _c_int(v: int) -> dict[str, str]:
    v = int(v)
    return {"$numberInt": str(v)} if -2147483648 <= v <= 2147483647 else {"$numberLong": str(v)}


def _c_int64(v: Int64) -> dict[str, str]:
    return {"$numberLong": int.__repr__(v)}


def _millis(v: datetime.datetime) -> int:
    if v.tzinfo is None or v.utcoffset() is None:
        return (v.replace(tzinfo=None) - _EPOCH_NAIVE) // _ONE_MS
    return (v - _EPOCH_AWARE) // _ONE_MS


def _c_datetime(v: datetime.datetime) -> dict[str, Any]:
    if v.tzinfo is None:
        return {"$date": {"$numberLong": str((v - _EPOCH_NAIVE) // _ONE_MS)}}
    return {"$date": {"$numberLong": str(_millis(v))}}


def _iso_millis(v: datetime.datetime) -> str:
    """``YYYY-MM-DDTHH:MM:SS[.mmm]`` of a naive datetime: milliseconds truncated, left out when zero."""
    s = _isoformat(v)  # YYYY-MM-DDTHH:MM:SS, then .ffffff unless microsecond == 0
    if len(s) == 19:
        return s
    return s[:19] if s[20:23] == "000" else s[:23]


def _r_datetime(v: datetime.datetime) -> dict[str, Any]:
    if v.tzinfo is None:
        if v >= _EPOCH_NAIVE:
            return {"$date": _iso_millis(v) + "Z"}
        return {"$date": {"$numberLong": str((v - _EPOCH_NAIVE) // _ONE_MS)}}
    if v >= _EPOCH_AWARE:  # json_util keeps the local time and writes the offset as +HHMM
        offset = v.utcoffset()
        suffix = "Z" if offset == _NO_OFFSET else v.strftime("%z")
        return {"$date": _iso_millis(v.replace(tzinfo=None)) + suffix}
    return {"$date": {"$numberLong": str(_millis(v))}}


def _c_datetime_ms(v: DatetimeMS) -> dict[str, Any]:
    return {"$date": {"$numberLong": str(int(v))}}


def _r_datetime_ms(v: DatetimeMS) -> dict[str, Any]:
    ms = int(v)
    if 0 <= ms <= _MAX_UTC_MS:
        return _r_datetime(_EPOCH_NAIVE + datetime.timedelta(milliseconds=ms))
    return {"$date": {"$numberLong": str(ms)}}


def _binary(v: Binary) -> dict[str, Any]:
    return {"$binary": {"base64": _b2a_base64(v, newline=False).decode(), "subType": _SUBTYPES[v.subtype]}}


def _bytes(v: bytes) -> dict[str, Any]:
    return {"$binary": {"base64": _b2a_base64(v, newline=False).decode(), "subType": "00"}}


def _objectid(v: ObjectId) -> dict[str, str]:
    return {"$oid": v.binary.hex()}


def _decimal128(v: Decimal128) -> dict[str, str]:
    return {"$numberDecimal": str(v)}  # every NaN (negative, signaling, with payload) is "NaN", as in the spec


def _timestamp(v: Timestamp) -> dict[str, Any]:
    return {"$timestamp": {"t": v.time, "i": v.inc}}


def _regex_options(flags: int) -> str:
    options = _regex_options_cache.get(flags)
    if options is None:
        options = _regex_options_cache[flags] = "".join(letter for flag, letter in _REGEX_FLAGS if flags & flag)
    return options


def _regex(v: Regex[Any] | re.Pattern[Any]) -> dict[str, Any]:
    pattern = v.pattern if isinstance(v.pattern, str) else v.pattern.decode("utf-8")
    return {"$regularExpression": {"pattern": pattern, "options": _regex_options(v.flags)}}


def _minkey(_: MinKey) -> dict[str, int]:
    return {"$minKey": 1}


def _maxkey(_: MaxKey) -> dict[str, int]:
    return {"$maxKey": 1}


def _uuid(_: uuid.UUID) -> Any:
    raise ValueError(
        "cannot encode a native uuid.UUID as Extended JSON without a UUID representation "
        "(as json_util with UuidRepresentation.UNSPECIFIED): use bson.Binary.from_uuid()"
    )


def _c_doc(d: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        t = type(v)
        if t is str:
            out[k] = v
        elif t is int:
            out[k] = {"$numberInt": str(v)} if -2147483648 <= v <= 2147483647 else {"$numberLong": str(v)}
        elif t is dict:
            out[k] = _c_doc(v)
        elif t is float:
            out[k] = {"$numberDouble": repr(v)} if v - v == 0.0 else _nonfinite(v)
        elif t is bool or v is None:
            out[k] = v
        elif t is list:
            out[k] = _c_list(v)
        else:
            out[k] = _C.get(t, _c_other)(v)
    return out


def _c_list(a: Iterable[Any]) -> list[Any]:
    out: list[Any] = []
    append = out.append
    for v in a:
        t = type(v)
        if t is str:
            append(v)
        elif t is int:
            append({"$numberInt": str(v)} if -2147483648 <= v <= 2147483647 else {"$numberLong": str(v)})
        elif t is dict:
            append(_c_doc(v))
        elif t is float:
            append({"$numberDouble": repr(v)} if v - v == 0.0 else _nonfinite(v))
        elif t is bool or v is None:
            append(v)
        elif t is list:
            append(_c_list(v))
        else:
            append(_C.get(t, _c_other)(v))
    return out


def _c_value(v: Any) -> Any:
    t = type(v)
    if t is str or t is bool or v is None:
        return v
    if t is int:
        return {"$numberInt": str(v)} if -2147483648 <= v <= 2147483647 else {"$numberLong": str(v)}
    if t is dict:
        return _c_doc(v)
    if t is float:
        return {"$numberDouble": repr(v)} if v - v == 0.0 else _nonfinite(v)
    if t is list:
        return _c_list(v)
    return _C.get(t, _c_other)(v)


def _r_doc(d: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        t = type(v)
        if t is str or t is int or t is bool or v is None:
            out[k] = v
        elif t is dict:
            out[k] = _r_doc(v)
        elif t is float:
            out[k] = v if v - v == 0.0 else _nonfinite(v)
        elif t is list:
            out[k] = _r_list(v)
        else:
            out[k] = _R.get(t, _r_other)(v)
    return out


def _r_list(a: Iterable[Any]) -> list[Any]:
    out: list[Any] = []
    append = out.append
    for v in a:
        t = type(v)
        if t is str or t is int or t is bool or v is None:
            append(v)
        elif t is dict:
            append(_r_doc(v))
        elif t is float:
            append(v if v - v == 0.0 else _nonfinite(v))
        elif t is list:
            append(_r_list(v))
        else:
            append(_R.get(t, _r_other)(v))
    return out


def _r_value(v: Any) -> Any:
    t = type(v)
    if t is str or t is int or t is bool or v is None:
        return v
    if t is dict:
        return _r_doc(v)
    if t is float:
        return v if v - v == 0.0 else _nonfinite(v)
    if t is list:
        return _r_list(v)
    return _R.get(t, _r_other)(v)


def _c_code(v: Code) -> dict[str, Any]:
    if v.scope is None:
        return {"$code": str.__str__(v)}
    return {"$code": str.__str__(v), "$scope": _c_doc(v.scope)}


def _r_code(v: Code) -> dict[str, Any]:
    if v.scope is None:
        return {"$code": str.__str__(v)}
    return {"$code": str.__str__(v), "$scope": _r_doc(v.scope)}


def _c_dbref(v: DBRef) -> dict[str, Any]:
    return _c_doc(v.as_doc())  # {$ref, $id[, $db], extra fields...}, as json_util writes it


def _r_dbref(v: DBRef) -> dict[str, Any]:
    return _r_doc(v.as_doc())


def _r_int(v: int) -> int:
    return int(v)


def _str(v: str) -> str:
    return str.__str__(v)


def _none(v: None) -> None:
    return v


# Converters shared by both modes (the value does not depend on canonical/relaxed).
_COMMON: dict[type, _Converter] = {
    bytes: _bytes,
    Binary: _binary,
    ObjectId: _objectid,
    Decimal128: _decimal128,
    Timestamp: _timestamp,
    Regex: _regex,
    re.Pattern: _regex,
    MinKey: _minkey,
    MaxKey: _maxkey,
    uuid.UUID: _uuid,
    str: _str,
    bool: _none,
    type(None): _none,
}
_C: dict[type, _Converter] = {
    **_COMMON,
    int: _c_int,
    Int64: _c_int64,
    float: _c_float,
    datetime.datetime: _c_datetime,
    DatetimeMS: _c_datetime_ms,
    Code: _c_code,
    DBRef: _c_dbref,
    dict: _c_doc,
    list: _c_list,
    tuple: _c_list,
}
_R: dict[type, _Converter] = {
    **_COMMON,
    int: _r_int,
    Int64: _r_int,
    float: _r_float,
    datetime.datetime: _r_datetime,
    DatetimeMS: _r_datetime_ms,
    Code: _r_code,
    DBRef: _r_dbref,
    dict: _r_doc,
    list: _r_list,
    tuple: _r_list,
}

# The order json_util.default tries base classes in, for a subclass without a known _type_marker.
_BASES: tuple[type, ...] = (bool, bytes, datetime.datetime, DatetimeMS, float, int, str, uuid.UUID, Binary, Int64)
_BASES += (Code, DBRef, MaxKey, MinKey, ObjectId, Regex, re.Pattern, Timestamp, Decimal128)
_MARKERS: dict[int, type] = {getattr(b, "_type_marker", 0): b for b in _BASES if hasattr(b, "_type_marker")}


def _instances_have(t: type, name: str) -> bool:
    """Whether instances of ``t`` have attribute ``name`` from their class (not from a metaclass)."""
    return any(name in vars(base) for base in t.__mro__)


def _resolve(t: type, table: dict[type, _Converter]) -> _Converter:
    """The converter for a type not in ``table``, found as json_util finds it; cached in ``table``."""
    if issubclass(t, RawBSONDocument):
        converter = table[RawBSONDocument]
    elif _instances_have(t, "items"):
        converter = table[dict]
    elif _instances_have(t, "__iter__") and not issubclass(t, (str, bytes)):
        converter = table[list]
    else:
        marker = getattr(t, "_type_marker", None)
        base = _MARKERS.get(marker) if isinstance(marker, int) else None
        if base is None:
            base = next((b for b in _BASES if issubclass(t, b)), None)
        if base is None:
            raise TypeError(f"cannot encode object of type {t.__qualname__} as Extended JSON")
        converter = table[base]
    table[t] = converter
    return converter


def _c_other(v: Any) -> Any:
    return _resolve(type(v), _C)(v)


def _r_other(v: Any) -> Any:
    return _resolve(type(v), _R)(v)
