"""A BSON document in the binary encoding of Spark's VARIANT type (value and metadata bytes, as Spark's
``VariantVal`` and Parquet's variant spec define them), made straight from BSON values: no JSON on the way,
so a date stays a timestamp, an int64 a long and a binary a binary. Pure: no Spark here.

How BSON maps (the rest have no VARIANT counterpart):

==============================  =====================================================================
BSON                            VARIANT
==============================  =====================================================================
double                          double
int32 / int64                   int (4 bytes) / long (8 bytes)
string, symbol                  string
boolean, null, undefined        boolean, null, null
document, array, DBRef           object (fields in name order, as VARIANT keeps them), array, object
date                            timestamp (UTC, microseconds); one outside years 1-9999: as below
decimal128                      decimal (up to 38 digits); NaN, infinities, more digits: as below
binary of subtype 0             binary
ObjectId                        string of its 24 hex digits
anything else                   its canonical Extended JSON, as an object: ``{"$timestamp": {"t", "i"}}``,
                                ``{"$binary": ...}`` (other subtypes, UUIDs), ``{"$regularExpression":
                                ...}``, ``{"$code": ...}``, ``{"$minKey": 1}``, ``{"$maxKey": 1}``, ...
==============================  =====================================================================
"""

from __future__ import annotations

import datetime
import decimal
import json
import struct
from collections.abc import Mapping
from typing import Any

import bson
from bson import json_util
from bson.binary import UuidRepresentation
from bson.code import Code
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.dbref import DBRef
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.objectid import ObjectId

from replicator.bsonkit.extjson import CANONICAL

#: The most bytes Spark accepts in a variant's value, and in its metadata.
SIZE_LIMIT = 16 * 1024 * 1024

#: BSON decoded for encoding: dates as aware UTC datetimes, binaries kept. A date outside Python's years
#: (1-9999, Spark's TIMESTAMP range too) decodes as a DatetimeMS, which has no VARIANT counterpart.
_DECODE: CodecOptions[Mapping[str, Any]] = CodecOptions(
    tz_aware=True,
    tzinfo=datetime.UTC,
    datetime_conversion=DatetimeConversion.DATETIME_AUTO,
    uuid_representation=UuidRepresentation.UNSPECIFIED,
)
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_VERSION = 1
# basic types (the header's low 2 bits)
_PRIMITIVE, _SHORT_STR, _OBJECT, _ARRAY = 0, 1, 2, 3
# primitive types
_NULL, _TRUE, _FALSE, _INT1, _INT2, _INT4, _INT8, _DOUBLE = 0, 1, 2, 3, 4, 5, 6, 7
_DECIMAL4, _DECIMAL8, _DECIMAL16, _TIMESTAMP, _BINARY, _LONG_STR = 8, 9, 10, 12, 15, 16
_MAX_SHORT_STR = 0x3F
_INT64 = (-(2**63), 2**63 - 1)
_INT32 = (-(2**31), 2**31 - 1)


class TooLarge(ValueError):
    """A document whose variant would be over :data:`SIZE_LIMIT`."""


def encode_bson(raw: bytes) -> tuple[bytes, bytes]:
    """The (value, metadata) of a raw BSON document."""
    return encode(bson.decode(raw, codec_options=_DECODE))


def encode(document: Mapping[str, Any]) -> tuple[bytes, bytes]:
    """The (value, metadata) of a decoded BSON document (see the module's table)."""
    keys: dict[str, int] = {}
    value = _value(document, keys)
    names = [key.encode("utf-8") for key in keys]
    size = _width(max(sum(len(name) for name in names), len(names)))
    metadata = bytearray([_VERSION | ((size - 1) << 6)])
    metadata += len(names).to_bytes(size, "little")
    offset = 0
    for name in names:
        metadata += offset.to_bytes(size, "little")
        offset += len(name)
    metadata += offset.to_bytes(size, "little")
    metadata += b"".join(names)
    if len(value) > SIZE_LIMIT or len(metadata) > SIZE_LIMIT:
        raise TooLarge(f"over VARIANT's {SIZE_LIMIT} bytes")
    return bytes(value), bytes(metadata)


def _width(value: int) -> int:
    """The fewest bytes (1 to 4) an unsigned ``value`` fits in."""
    return 1 if value <= 0xFF else 2 if value <= 0xFFFF else 3 if value <= 0xFFFFFF else 4


def _primitive(kind: int, payload: bytes = b"") -> bytes:
    return bytes([kind << 2 | _PRIMITIVE]) + payload


def _value(value: Any, keys: dict[str, int]) -> bytes:
    if value is None:
        return _primitive(_NULL)
    if isinstance(value, bool):
        return _primitive(_TRUE if value else _FALSE)
    if isinstance(value, int) and not isinstance(value, Int64) and _INT32[0] <= value <= _INT32[1]:
        return _primitive(_INT4, struct.pack("<i", value))
    if isinstance(value, int) and _INT64[0] <= value <= _INT64[1]:
        return _primitive(_INT8, struct.pack("<q", value))
    if isinstance(value, int):  # only from Extended JSON: a $timestamp's halves fit in a long
        return _string(str(value))
    if isinstance(value, float):
        return _primitive(_DOUBLE, struct.pack("<d", value))
    if isinstance(value, str) and not isinstance(value, Code):
        return _string(value)
    if isinstance(value, ObjectId):
        return _string(str(value))
    if isinstance(value, bytes) and getattr(value, "subtype", 0) == 0:  # subtype 0 decodes as bytes
        return _primitive(_BINARY, struct.pack("<I", len(value)) + value)
    if isinstance(value, datetime.datetime):
        return _timestamp((value - _EPOCH) // datetime.timedelta(microseconds=1))
    if isinstance(value, Decimal128):
        encoded = _decimal(value.to_decimal())
        if encoded is not None:
            return encoded
    if isinstance(value, DBRef):
        return _object(value.as_doc(), keys)
    if isinstance(value, Mapping):
        return _object(value, keys)
    if isinstance(value, list):
        return _array([_value(item, keys) for item in value])
    # no VARIANT counterpart: the value's canonical Extended JSON, as plain JSON values
    return _value(json.loads(json_util.dumps(value, json_options=CANONICAL)), keys)


def _string(text: str) -> bytes:
    data = text.encode("utf-8")
    if len(data) <= _MAX_SHORT_STR:
        return bytes([len(data) << 2 | _SHORT_STR]) + data
    return _primitive(_LONG_STR, struct.pack("<I", len(data)) + data)


def _timestamp(micros: int) -> bytes:
    return _primitive(_TIMESTAMP, struct.pack("<q", micros))


def _decimal(number: decimal.Decimal) -> bytes | None:
    """A decimal of at most 38 digits and scale, as the smallest VARIANT decimal it fits; else None."""
    if not number.is_finite():
        return None
    sign, digits, exponent = number.as_tuple()
    assert isinstance(exponent, int)
    if exponent > 0:  # 1E+3: VARIANT's scale is never negative
        digits, exponent = (*digits, *(0,) * exponent), 0
    scale, precision = -exponent, len(digits)
    if scale > 38 or precision > 38:
        return None
    unscaled = int("".join(map(str, digits)) or "0") * (-1 if sign else 1)
    for kind, most, size in ((_DECIMAL4, 9, 4), (_DECIMAL8, 18, 8), (_DECIMAL16, 38, 16)):
        if precision <= most and scale <= most:
            return _primitive(kind, bytes([scale]) + unscaled.to_bytes(size, "little", signed=True))
    return None


def _object(document: Mapping[str, Any], keys: dict[str, int]) -> bytes:
    # fields in the order Spark looks them up by (a binary search over Java's UTF-16 string order)
    fields = sorted(document.items(), key=lambda item: item[0].encode("utf-16-be"))
    ids = [keys.setdefault(name, len(keys)) for name, _ in fields]
    values = [_value(value, keys) for _, value in fields]
    data = b"".join(values)
    large = len(fields) > 0xFF
    id_size, offset_size = _width(max(ids, default=0)), _width(len(data))
    header = (large << 4 | (id_size - 1) << 2 | (offset_size - 1)) << 2 | _OBJECT
    out = bytearray([header]) + len(fields).to_bytes(4 if large else 1, "little")
    for field_id in ids:
        out += field_id.to_bytes(id_size, "little")
    out += _offsets(values, offset_size)
    return bytes(out + data)


def _array(values: list[bytes]) -> bytes:
    data = b"".join(values)
    large = len(values) > 0xFF
    offset_size = _width(len(data))
    header = (large << 2 | (offset_size - 1)) << 2 | _ARRAY
    out = bytearray([header]) + len(values).to_bytes(4 if large else 1, "little")
    out += _offsets(values, offset_size)
    return bytes(out + data)


def _offsets(values: list[bytes], size: int) -> bytes:
    out = bytearray()
    offset = 0
    for value in values:
        out += offset.to_bytes(size, "little")
        offset += len(value)
    return bytes(out + offset.to_bytes(size, "little"))
