"""Raw BSON as the source sends it: codecs, and reading a document's top level without the rest.

pymongo's RawBSONDocument decodes every top-level field on first access and builds a RawBSONDocument for
each sub-document. A change event needs a handful of small fields and passes its documents on untouched,
so :func:`top_level` decodes the top level in C (pymongo's own decoder) with each sub-document left as a
:class:`Span` of its bytes, and the reader wraps only the documents it keeps.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import Any

import bson
from bson.binary import UuidRepresentation
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.raw_bson import RawBSONDocument

DOCUMENT = 3


class RawDocument(RawBSONDocument):
    """A RawBSONDocument whose ``_id``, when it is the first field and a document (a change event's resume
    token), is read without decoding the rest: the driver reads every change event's ``_id`` to follow
    the stream, and decoding all of a RawBSONDocument's fields for it (a RawBSONDocument made for each
    sub-document) cost as much as the rest of reading the event. Any other field is read as usual."""

    __slots__ = ()

    def __init__(self, bson_bytes: bytes | memoryview, codec_options: CodecOptions[Any] | None = None) -> None:
        """RawBSONDocument's fields, set without its checks: the C decoder, which makes nearly all of these
        (every document a snapshot copies), hands over a document's bytes once it has checked their size
        and end, and mcdc's own calls pass bytes that bson encoded. The checks (the codec's class, the size
        in Python) cost twice the rest of decoding a small document."""
        self._RawBSONDocument__raw: bytes = bson_bytes  # type: ignore[assignment]  # memoryview: never here
        self._RawBSONDocument__inflated_doc = None
        self._RawBSONDocument__codec_options = RAW_CODEC if codec_options is None else codec_options

    def __getitem__(self, name: str) -> Any:
        if name == "_id":
            data = self._RawBSONDocument__raw
            if data[4] == DOCUMENT and data[5:9] == b"_id\x00":
                return wrap(data[9 : 9 + int.from_bytes(data[9:13], "little")])
        return super().__getitem__(name)

    def __bool__(self) -> bool:
        """Not empty: said from the bytes' length (an empty document is 5 bytes). RawBSONDocument has no
        ``__bool__``, so truth fell to ``__len__``, which decodes every field: pymongo's ReplaceOne asks
        ``if replacement`` of every replacement it sends."""
        return len(self._RawBSONDocument__raw) > 5


#: What :func:`top_level` leaves a sub-document (or an array's document) as: a ``slice`` whose ``start`` is
#: its bytes. pymongo's decoder calls a raw-BSON document class (one marked with
#: ``_type_marker`` 101) with the bytes and the codec options; ``slice`` takes those two without a Python
#: frame, where a class of our own ran its ``__init__`` for every sub-document, four to six per change
#: event: half of the decoder's time.
Span = slice
_SPAN_CLASS: Any = functools.partial(slice)
_SPAN_CLASS._type_marker = 101


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

#: How :func:`top_level` decodes: sub-documents as Spans, dates as DatetimeMS (milliseconds, never a float).
SPAN_CODEC: CodecOptions[Any] = CodecOptions(
    document_class=_SPAN_CLASS,
    datetime_conversion=DatetimeConversion.DATETIME_MS,
    uuid_representation=UuidRepresentation.UNSPECIFIED,
)
# the decoder of a document's elements into a given dict, which RawBSONDocument itself uses: the C function
# itself where pymongo has it (bson._raw_to_dict is a Python wrapper of it: a frame per event), else Python
_raw_to_dict: Callable[..., dict[str, Any]] | None = getattr(
    getattr(bson, "_cbson", None), "_raw_to_dict", getattr(bson, "_raw_to_dict", None)
)


def top_level(data: bytes) -> dict[str, Any] | None:
    """The top-level fields of the document in ``data``, decoded in one C call, sub-documents as Spans;
    None where this pymongo has no such decoder (then read it as a RawBSONDocument)."""
    if _raw_to_dict is None:
        return None
    return _raw_to_dict(data, 4, len(data) - 1, SPAN_CODEC, {}, False)


_new_document = object.__new__


def wrap(data: bytes) -> RawDocument:
    """A RawDocument of bytes the C decoder has already bounded (a Span's): RawBSONDocument's constructor
    checks its codec options and the document's size again, which cost three times the object itself,
    for every document of every event. The same fields are set as the constructor sets them."""
    doc: Any = _new_document(RawDocument)
    doc._RawBSONDocument__raw = data
    doc._RawBSONDocument__inflated_doc = None
    doc._RawBSONDocument__codec_options = RAW_CODEC
    return doc  # type: ignore[no-any-return]


#: a RawBSONDocument's bytes, read in C (its ``raw`` property is a Python call)
raw_of = operator.attrgetter("_RawBSONDocument__raw")
#: a Timestamp's ``(time, inc)``, read in C: compared as tuples, a third of Timestamp's own ``>`` (a Python
#: call that reads both through properties), for every event a catch-up reads
ts_parts = operator.attrgetter("_Timestamp__time", "_Timestamp__inc")


def document(span: Span | None) -> RawDocument | None:
    """A Span as a RawDocument (None stays None: a null field)."""
    return None if span is None else wrap(span.start)


def decoded(span: Span) -> dict[str, Any]:
    """A Span's document decoded (for the small ones code inspects)."""
    return bson.decode(span.start, DICT_CODEC)
