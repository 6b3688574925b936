"""The compiled query: :class:`Query` and :func:`compile_query` (see the package's docstring). Pure."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import bson
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.errors import InvalidDocument
from bson.raw_bson import RawBSONDocument

from replicator.bsonkit.rawbson import SPAN_CODEC, raw_of
from replicator.query.compiler import ENCODE, compile_spec, is_operator_document
from replicator.query.order import Decode, fields, plain_fields, some_fields
from replicator.query.paths import DECODE, DocTest
from replicator.query.values import EQ, GT, GTE, LT, LTE, fail

#: from this size on (bytes), the fields a query reads are found by their headers rather than by decoding
#: the document's whole top level (measured on a 1 KB document: 5 us against 3.5; on 22 KB holding an
#: array of 560 documents: 7 us against 70; on 1 MB: 5 us against 5.8 ms)
LARGE_DOCUMENT = 16 * 1024


#: how the query itself is read: documents as dicts (they are the query's structure), dates as DatetimeMS
_SPEC_CODEC: CodecOptions[dict[str, Any]] = CodecOptions(
    document_class=dict,
    datetime_conversion=DatetimeConversion.DATETIME_MS,
    uuid_representation=SPAN_CODEC.uuid_representation,
)


def _top_fields(spec: Mapping[str, Any]) -> set[str]:
    names: set[str] = set()
    for key, value in spec.items():
        if key in ("$and", "$or", "$nor"):
            for one in value:
                names |= _top_fields(one)
        elif not key.startswith("$"):
            names.add(key.split(".", 1)[0])
    return names


class Query:
    """A compiled query: :meth:`matches` says whether ``find(spec)`` returns a document."""

    __slots__ = ("_decode", "_fields", "_test", "compares_strings", "spec")

    def __init__(self, spec: Mapping[str, Any], test: DocTest, as_dicts: Mapping[str, Any], decode: Decode) -> None:
        self.spec = spec
        self._test = test
        self._fields = frozenset(_top_fields(as_dicts))
        self._decode = decode
        #: does the query compare strings? The matcher compares them as the simple collation does; a
        #: collection whose default collation is another one answers such a query otherwise
        self.compares_strings = _compares_strings(as_dicts)

    def matches(self, doc: Mapping[str, Any]) -> bool:
        """Would the server's ``find(spec)`` return ``doc``? ``doc`` is a RawBSONDocument (read without
        decoding its sub-documents) or any mapping bson can encode."""
        data = raw_of(doc) if isinstance(doc, RawBSONDocument) else bson.encode(doc, codec_options=ENCODE)
        if len(data) > LARGE_DOCUMENT:
            # a stream's raw documents may be views into the reply; the field walk searches bytes
            return self._test(some_fields(bytes(data), self._fields, self._decode))
        return self._test(self._decode(data))

    def fields(self) -> frozenset[str]:
        """The top-level fields the query reads."""
        return self._fields

    def __repr__(self) -> str:
        return f"Query({self.spec!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its query, compiled again where it is unpickled (a Spark executor): the compiled
        tests are closures, which pickle cannot carry."""
        return compile_query, (self.spec,)


def compile_query(spec: Mapping[str, Any]) -> Query:
    """``spec`` (a find filter, as bson decodes one) compiled; ConfigError, one line naming the operator,
    for what the matcher cannot decide exactly as the server does (or the server itself refuses)."""
    if not isinstance(spec, Mapping):
        raise fail("the query must be a document")
    try:
        as_dicts = bson.decode(bson.encode(spec, codec_options=ENCODE), _SPEC_CODEC)
    except (InvalidDocument, TypeError, ValueError, OverflowError) as exc:
        raise fail(f"the query is no BSON document ({exc})") from None
    decode = fields if _reads_types(as_dicts) else plain_fields
    token = DECODE.set(decode)
    try:
        test = compile_spec(as_dicts)
    finally:
        DECODE.reset(token)
    return Query(spec, test, as_dicts, decode)


_COMPARED = frozenset({EQ, "$ne", LT, LTE, GT, GTE})


def _reads_types(spec: Mapping[str, Any]) -> bool:
    """Can the query's answer tell a symbol from a string or undefined from null? Only through $type, a
    null operand, or a document or array operand (compared element by element, types first): elsewhere a
    symbol compares as the string it holds, and undefined as pymongo's None (no number, string, ... either)."""
    return any(
        op == "$type" or (op in _COMPARED and (arg is None or isinstance(arg, (dict, list))))
        for op, arg in _operands(spec)
    )


def _compares_strings(spec: Mapping[str, Any]) -> bool:
    """Does the query compare strings (a collation other than the simple one would answer otherwise)?"""
    return any(op in _COMPARED and _holds_string(arg) for op, arg in _operands(spec))


def _holds_string(value: Any) -> bool:
    if isinstance(value, str):
        return True
    if isinstance(value, dict):
        return any(_holds_string(one) for one in value.values())
    return isinstance(value, list) and any(_holds_string(one) for one in value)


def _operands(spec: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    """Every operator of a query with its argument, $in's, $nin's and $all's values as $eq's, through
    $and, $or, $nor, $not and $elemMatch (a malformed part is skipped: compiling it says what is wrong)."""
    for key, value in spec.items():
        if key in ("$and", "$or", "$nor"):
            for one in value if isinstance(value, list) else ():
                if isinstance(one, dict):
                    yield from _operands(one)
        elif key.startswith("$"):
            continue
        elif is_operator_document(value):
            yield from _operator_operands(value)
        else:
            yield EQ, value


def _operator_operands(ops: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    for op, arg in ops.items():
        if op == "$elemMatch" and isinstance(arg, dict):
            yield from _operator_operands(arg) if is_operator_document(arg) else _operands(arg)
        elif op == "$not" and isinstance(arg, dict):
            yield from _operator_operands(arg)
        elif op in ("$in", "$nin", "$all") and isinstance(arg, list):
            for one in arg:
                if isinstance(one, dict) and isinstance(one.get("$elemMatch"), dict):
                    yield from _operator_operands(one)
                else:
                    yield EQ, one
        else:
            yield op, arg
