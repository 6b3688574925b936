"""Canonical (lossless) MongoDB Extended JSON for values kept in checkpoints and reports."""

from __future__ import annotations

import datetime
import json
from typing import Any

from bson import json_util
from bson.binary import Binary, UuidRepresentation
from bson.code import Code
from bson.codec_options import CodecOptions, DatetimeConversion, TypeDecoder, TypeRegistry
from bson.datetime_ms import DatetimeMS
from bson.dbref import DBRef
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.json_util import JSONMode, JSONOptions
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.objectid import ObjectId
from bson.raw_bson import RawBSONDocument
from bson.regex import Regex
from bson.timestamp import Timestamp

from replicator.bsonkit.deprecated import CANDIDATE, convert, holds_deprecated
from replicator.bsonkit.extjson_types import _C, _R, _c_value, _Converter, _decode_bson, _orjson_dumps, _r_value
from replicator.bsonkit.rawbson import RawDocument

CANONICAL = JSONOptions(json_mode=JSONMode.CANONICAL, datetime_conversion=DatetimeConversion.DATETIME_AUTO)
RELAXED = JSONOptions(json_mode=JSONMode.RELAXED, datetime_conversion=DatetimeConversion.DATETIME_AUTO)


def to_jsonable(value: Any) -> Any:
    """A BSON value -> plain JSON data (canonical extended JSON), lossless."""
    if isinstance(value, RawBSONDocument):
        value = json_util.loads(json_util.dumps(value, json_options=CANONICAL), json_options=CANONICAL)
    return json.loads(json_util.dumps({"v": value}, json_options=CANONICAL))["v"]


def from_jsonable(data: Any) -> Any:
    """The inverse of :func:`to_jsonable`."""
    return json_util.loads(json.dumps({"v": data}), json_options=CANONICAL)["v"]


def dumps(value: Any, *, relaxed: bool = False) -> str:
    return json_util.dumps(value, json_options=RELAXED if relaxed else CANONICAL)


# --- Fast encoder: see extjson_types for the converters ---------------------------------------------------

# Raw documents are converted while pymongo's C decoder builds them: a TypeRegistry maps each type it
# decodes to (dates as DatetimeMS, binary subtypes 3/4 as Binary, subtype 0 as bytes) to its converter
# in extjson_types, called from C on every such value, and no second walk is needed. str, bool, None,
# dict and list come out as they are; relaxed mode leaves int and finite doubles alone as well. A DBRef or a code with
# scope is built by the decoder from values already converted.


def _decoder(bson_type: type, convert: _Converter) -> TypeDecoder:
    body = {"bson_type": bson_type, "transform_bson": staticmethod(convert)}
    return type(f"_{bson_type.__name__}ToJSON", (TypeDecoder,), body)()  # type: ignore[no-any-return]


def _dbref_doc(v: DBRef) -> dict[str, Any]:
    return dict(v.as_doc())  # {$ref, $id[, $db], extra fields...}: values converted already


def _code_doc(v: Code) -> dict[str, Any]:
    return {"$code": str.__str__(v)} if v.scope is None else {"$code": str.__str__(v), "$scope": dict(v.scope)}


def _raw_decode_options(
    table: dict[type, _Converter], own: tuple[type, ...], dates: DatetimeConversion
) -> CodecOptions[dict[str, Any]]:
    kinds = (bytes, Binary, ObjectId, Decimal128, Timestamp, Regex, MinKey, MaxKey, DatetimeMS, Int64, float)
    decoders = [_decoder(t, table[t]) for t in (*kinds, *own)]
    decoders += [_decoder(DBRef, _dbref_doc), _decoder(Code, _code_doc)]
    return CodecOptions(
        document_class=dict,
        tz_aware=False,
        uuid_representation=UuidRepresentation.UNSPECIFIED,
        datetime_conversion=dates,
        type_registry=TypeRegistry(decoders),
    )


# canonical: every date as its milliseconds; relaxed: ISO-8601 text from a datetime where one exists
_CANONICAL_DECODE = _raw_decode_options(_C, (int,), DatetimeConversion.DATETIME_MS)
_RELAXED_DECODE = _raw_decode_options(_R, (datetime.datetime,), DatetimeConversion.DATETIME_AUTO)


def _c_raw(v: RawBSONDocument) -> dict[str, Any]:
    return _raw_value(v.raw, _CANONICAL_DECODE)


def _r_raw(v: RawBSONDocument) -> dict[str, Any]:
    return _raw_value(v.raw, _RELAXED_DECODE)


_C[RawBSONDocument] = _c_raw
_R[RawBSONDocument] = _r_raw


def to_json_value(value: Any, *, relaxed: bool = False) -> Any:
    """A BSON value -> plain data (dict/list/str/int/float/bool/None) that ``orjson.dumps`` writes as
    MongoDB Extended JSON v2, canonical (lossless) by default or relaxed.

    Equal to ``json.loads(json_util.dumps(value, json_options=CANONICAL or RELAXED))``, key order included,
    but several times faster. A RawBSONDocument is decoded with options of its own (its codec options are
    ignored): binary subtypes 3/4 stay binary and every date keeps its milliseconds. The result is new
    containers; a ``dict`` or ``list`` argument is not modified.

    Extended JSON has a single NaN, so a double NaN with the sign bit set and a Decimal128 sNaN/-NaN are
    written as ``"NaN"`` (as json_util does): those do not come back bit for bit. A Python int that does not
    fit in 64 bits (not a BSON value) is returned as is in relaxed mode, and orjson refuses it.
    """
    if type(value) is RawDocument or isinstance(value, RawBSONDocument):  # the common case first: raw bytes
        return _raw_value(value.raw, _RELAXED_DECODE if relaxed else _CANONICAL_DECODE)
    return _r_value(value) if relaxed else _c_value(value)


def _raw_value(data: bytes | memoryview, options: CodecOptions[dict[str, Any]]) -> dict[str, Any]:
    """A raw document's data; one that holds a deprecated type (Symbol, Undefined, DBPointer, which
    pymongo decodes as str, None and DBRef) keeps it in the spec's form (deprecated_bson)."""
    first = CANDIDATE.search(data)
    if first is None or not holds_deprecated(whole := bytes(data), first.start()):
        return _decode_bson(data, options)
    converted: dict[str, Any] = convert(whole, lambda one: _decode_bson(one, options))
    return converted


def dumps_bytes(value: Any, *, relaxed: bool = False) -> bytes:
    """``value`` as Extended JSON v2 (canonical, or relaxed), UTF-8 encoded and compact."""
    return _orjson_dumps(to_json_value(value, relaxed=relaxed))


def dumps_str(value: Any, *, relaxed: bool = False) -> str:
    """:func:`dumps_bytes` as a ``str``."""
    return _orjson_dumps(to_json_value(value, relaxed=relaxed)).decode()
