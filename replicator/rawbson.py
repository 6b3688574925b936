"""Reading a BSON document's top-level fields straight from its bytes, without decoding the rest.

pymongo's RawBSONDocument decodes every top-level field on first access, and builds a RawBSONDocument for
each sub-document. A change event needs a handful of small fields and passes its documents on untouched,
so :func:`fields` walks the element headers once and the readers below decode only what is asked for.
"""

from __future__ import annotations

import struct
from typing import Any

import bson
from bson.binary import UuidRepresentation
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp

#: (type, start of the value, end of the value) of one element, by field name.
Fields = dict[str, tuple[int, int, int]]

DOCUMENT, ARRAY, STRING, BINARY, NULL, INT32, TIMESTAMP, INT64, DATE = 3, 4, 2, 5, 10, 16, 17, 18, 9
_int32 = struct.Struct("<i").unpack_from


class RawDocument(RawBSONDocument):
    """A RawBSONDocument whose ``_id``, when it is the first field and a document (a change event's resume
    token), is read without decoding the rest: the driver reads every change event's ``_id`` to follow
    the stream, and decoding all of a RawBSONDocument's fields for it (a RawBSONDocument made for each
    sub-document) cost as much as the rest of reading the event. Any other field is read as usual."""

    __slots__ = ()

    def __getitem__(self, name: str) -> Any:
        if name == "_id":
            data = self.raw
            if data[4] == DOCUMENT and data[5:9] == b"_id\x00":
                return RawDocument(bytes(data[9 : 9 + _int32(data, 9)[0]]), RAW_CODEC)
        return super().__getitem__(name)


#: Documents stay raw bytes; dates outside Python's range survive; UUIDs stay Binary with their subtype.
RAW_CODEC: CodecOptions[RawBSONDocument] = CodecOptions(
    document_class=RawDocument,
    datetime_conversion=DatetimeConversion.DATETIME_AUTO,
    uuid_representation=UuidRepresentation.UNSPECIFIED,
)
#: Small documents that code inspects (catalog entries, index specs, arrays of names), as dicts.
DICT_CODEC: CodecOptions[dict[str, Any]] = CodecOptions(
    document_class=dict,
    datetime_conversion=DatetimeConversion.DATETIME_AUTO,
    uuid_representation=UuidRepresentation.UNSPECIFIED,
)

#: Value sizes of the fixed-size BSON types (double, undefined, ObjectId, bool, date, null, int32,
#: timestamp, int64, decimal128, max key, min key).
_FIXED = {1: 8, 6: 0, 7: 12, 8: 1, 9: 8, 10: 0, 16: 4, 17: 8, 18: 8, 19: 16, 127: 0, 255: 0}
#: Types whose value starts with its int32 length: the whole value (document, array, code with scope) or
#: what follows the length (string, JavaScript code, symbol: 4 more bytes; binary: 5 more, its subtype).
_SIZED = {3: 0, 4: 0, 15: 0, 2: 4, 13: 4, 14: 4, 5: 5}
_int64 = struct.Struct("<q").unpack_from
_uint32_pair = struct.Struct("<II").unpack_from


def size(data: bytes, start: int = 0) -> int:
    """The length of the document at ``start``."""
    return int(_int32(data, start)[0])


def fields(data: bytes, start: int = 0) -> Fields | None:
    """The elements of the document at ``start`` in ``data``, by name; None when it holds a type this walk
    does not size (a regular expression or a DBPointer: the caller then decodes it the usual way)."""
    pos, end = start + 4, start + _int32(data, start)[0] - 1
    out: Fields = {}
    find = data.index
    while pos < end:
        kind = data[pos]
        name_end = find(0, pos + 1)
        value = name_end + 1
        extra = _SIZED.get(kind)
        if extra is not None:
            stop = value + extra + _int32(data, value)[0]
        else:
            size = _FIXED.get(kind)
            if size is None:
                return None
            stop = value + size
        out[data[pos + 1 : name_end].decode()] = (kind, value, stop)
        pos = stop
    return out


def document(data: bytes, element: tuple[int, int, int]) -> RawBSONDocument | None:
    """A document element as a RawBSONDocument of its own bytes (None for null)."""
    kind, start, stop = element
    if kind == DOCUMENT:
        return RawDocument(data[start:stop], RAW_CODEC)
    if kind == NULL:
        return None
    raise TypeError(f"expected a document, found BSON type {kind}")


def array(data: bytes, element: tuple[int, int, int]) -> list[Any]:
    """An array element's values, decoded (sub-documents as dicts); [] for null."""
    kind, start, stop = element
    if kind == NULL or stop - start == 5:
        return []
    if kind != ARRAY:
        raise TypeError(f"expected an array, found BSON type {kind}")
    return list(bson.decode(data[start:stop], DICT_CODEC).values())


def string(data: bytes, element: tuple[int, int, int]) -> str:
    kind, start, stop = element
    if kind != STRING:
        raise TypeError(f"expected a string, found BSON type {kind}")
    return data[start + 4 : stop - 1].decode()


def integer(data: bytes, element: tuple[int, int, int]) -> int | None:
    """An int32, int64 or date (its milliseconds) as an int; None for null."""
    kind, start, _ = element
    if kind in (INT64, DATE):
        return int(_int64(data, start)[0])
    if kind == INT32:
        return int(_int32(data, start)[0])
    if kind == NULL:
        return None
    raise TypeError(f"expected an integer, found BSON type {kind}")


def timestamp(data: bytes, element: tuple[int, int, int]) -> Timestamp:
    kind, start, _ = element
    if kind != TIMESTAMP:
        raise TypeError(f"expected a timestamp, found BSON type {kind}")
    inc, time = _uint32_pair(data, start)
    return Timestamp(time, inc)
