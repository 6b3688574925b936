"""A field path through a document, as mongod's matcher walks it (its BSONElementIterator). Pure.

A dotted path reaches into sub-documents, and through arrays into each element that is a document; a
numeric part also names an array's element by position (an element so reached is not expanded). Where
the path ends at an array, its elements are candidates and then the array itself (unless the operator
wants the array only: $size, $elemMatch). A path that leads nowhere yields MISSING; a path that runs
into arrays without documents yields nothing at all.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from replicator.query import order as bson_order
from replicator.query.order import BRACKET, MISSING, Decode, fields, object_bytes

#: how the query being compiled reads documents: told apart from pymongo's reading of a symbol (a
#: string) and undefined (None) only where the query's answer depends on it (see _reads_types)
DECODE: ContextVar[Decode] = ContextVar("decode", default=fields)

#: a predicate on one value (a path's one candidate); a predicate on a document's top-level fields
ValueTest = Callable[[Any], bool]
DocTest = Callable[[dict[str, Any]], bool]

# how a path's last part treats an array it ends at (mongod's LeafArrayBehavior)
TRAVERSE = True  # the array's elements, then the array itself
WHOLE = False  # the array itself only ($size, $elemMatch)


def _first_value(obj: dict[str, Any], parts: tuple[str, ...], start: int, decode: Decode) -> tuple[Any, int]:
    """mongod's getFieldDottedOrArray: follow ``parts`` from ``start`` through sub-documents; stop at the
    first array (with the index of the part that named it), the end of the path, or a dead end (MISSING)."""
    i, last = start, len(parts) - 1
    while True:
        value = obj.get(parts[i], MISSING)
        kind = BRACKET.get(type(value))
        if kind == bson_order.OBJECT:
            if i == last:
                return value, i
            obj = decode(object_bytes(value))
            i += 1
            continue
        if kind == bson_order.ARRAY or value is MISSING or i == last:
            return value, i
        return MISSING, i  # a scalar in the middle of the path


def _collect(
    obj: dict[str, Any], parts: tuple[str, ...], start: int, leaf: bool, out: list[Any], decode: Decode
) -> None:
    """Every value the path ``parts[start:]`` reaches in ``obj``, in mongod's BSONElementIterator's terms."""
    value, i = _first_value(obj, parts, start, decode)
    if type(value) is not list:
        out.append(value)
    elif i + 1 == len(parts):
        if leaf:
            out.extend(value)
        out.append(value)
    else:
        _through_array(value, parts, i + 1, leaf, out, decode)


def _through_array(
    array: list[Any], parts: tuple[str, ...], k: int, leaf: bool, out: list[Any], decode: Decode
) -> None:
    """The path ``parts[k:]`` continued into each element of ``array``."""
    piece = parts[k]
    position = int(piece) if piece.isascii() and piece.isdigit() else -1
    if position >= 0 and str(position) != piece:
        position = -1  # "01" names no position
    end = k + 1 == len(parts)
    for n, element in enumerate(array):
        kind = BRACKET.get(type(element))
        if kind == bson_order.OBJECT:
            fields_of_element = decode(object_bytes(element))
            if end:  # the common case ("items.qty"), inline: what _collect does with one part left
                value = fields_of_element.get(piece, MISSING)
                if type(value) is list and leaf:
                    out.extend(value)
                out.append(value)
            else:
                _collect(fields_of_element, parts, k, leaf, out, decode)
            if n == position:
                if end:
                    out.append(element)
                else:
                    _collect(fields_of_element, parts, k + 1, leaf, out, decode)
        elif n == position:
            if end:
                out.append(element)
            elif kind == bson_order.ARRAY:
                _through_array(element, parts, k + 1, leaf, out, decode)


def path_test(path: str, test: ValueTest, leaf: bool = TRAVERSE) -> DocTest:
    """A document test: does any value the path reaches pass ``test``? (No value: no.)"""
    parts = tuple(path.split("."))
    decode = DECODE.get()
    if len(parts) == 1:
        name = parts[0]

        def one_part(doc: dict[str, Any]) -> bool:
            value = doc.get(name, MISSING)
            if type(value) is list:
                if leaf:
                    for element in value:
                        if test(element):
                            return True
                return test(value)
            return test(value)

        return one_part

    def dotted(doc: dict[str, Any]) -> bool:
        out: list[Any] = []
        _collect(doc, parts, 0, leaf, out, decode)
        return any(test(value) for value in out)

    return dotted
