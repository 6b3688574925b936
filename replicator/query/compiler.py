"""Compiling a query document into the tests that decide it (see the package's docstring). Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import bson
from bson.binary import UuidRepresentation
from bson.codec_options import CodecOptions
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.regex import Regex

from replicator.errors import ConfigError
from replicator.query import order as bson_order
from replicator.query.order import (
    BRACKET,
    MISSING,
    NUMBER,
    fields,
    is_nan,
    object_bytes,
)
from replicator.query.paths import DECODE, TRAVERSE, WHOLE, DocTest, ValueTest, path_test
from replicator.query.values import (
    BITS,
    EQ,
    GT,
    GTE,
    LT,
    LTE,
    bit_test,
    comparison,
    fail,
    in_test,
    mod_test,
    number_of,
    regex_of,
    regex_test,
    size_test,
    type_test,
)

#: how a query or a document given as Python values is encoded: a uuid.UUID as binary subtype 4, as a
#: driver configured with the standard representation sends it
ENCODE: CodecOptions[Any] = CodecOptions(uuid_representation=UuidRepresentation.STANDARD)

#: operators the server has but this matcher refuses, with why (the rest of the message says how to go on)
_REFUSED: dict[str, str] = {
    "$where": "runs JavaScript on the server",
    "$expr": "is an aggregation expression, evaluated by the server only",
    "$jsonSchema": "is a JSON Schema validation, evaluated by the server only",
    "$text": "needs the server's text index",
    "$sampleRate": "is a random sample, decided differently on each read",
    "$near": "needs the server's geospatial index",
    "$nearSphere": "needs the server's geospatial index",
    "$geoWithin": "is a geospatial query, decided with the server's geometry",
    "$geoIntersects": "is a geospatial query, decided with the server's geometry",
    "$within": "is a geospatial query, decided with the server's geometry",
    "$alwaysTrue": "is not supported by mcdc's matcher",
    "$alwaysFalse": "is not supported by mcdc's matcher",
}
_HINT = "use operators on fields (see docs/how-to/partial-replication.md)"


def _refuse(op: str) -> ConfigError:
    why = _REFUSED.get(op)
    if why is None:
        return fail(f"unknown operator {op}")
    return fail(f"{op} cannot be decided outside the server ({why}); {_HINT}")


# --- operators on a path ------------------------------------------------------------------------------


class _Field:
    """One path's operator document compiled twice: as a document test (the path's values, negations
    over the whole path) and as a value test (for $elemMatch's operators, which see one element)."""

    __slots__ = ("doc", "value")

    def __init__(self, doc: DocTest, value: ValueTest) -> None:
        self.doc = doc
        self.value = value


def _leaf(path: str, test: ValueTest, leaf: bool = TRAVERSE) -> _Field:
    return _Field(path_test(path, test, leaf), test)


def _negated(field: _Field) -> _Field:
    doc, value = field.doc, field.value
    return _Field(lambda d: not doc(d), lambda v: not value(v))


def _all_of(parts: list[_Field]) -> _Field:
    if len(parts) == 1:
        return parts[0]
    docs = [p.doc for p in parts]
    values = [p.value for p in parts]
    return _Field(lambda d: all(t(d) for t in docs), lambda v: all(t(v) for t in values))


def is_operator_document(value: Any) -> bool:
    """Does ``{path: value}`` hold operators (else it is an equality with a document)? mongod's
    isExpressionDocument: the first field starts with $, and it is no DBRef ($ref and $id)."""
    if not isinstance(value, dict) or not value:
        return False
    return next(iter(value)).startswith("$") and not ("$ref" in value and "$id" in value)


def _operand(value: Any) -> Any:
    """A value of the query as the matcher holds a document's values (sub-documents as bytes)."""
    return fields(bson.encode({"v": value}, codec_options=ENCODE))["v"]


def _equality(path: str, value: Any) -> _Field:
    if type(value) is Regex:
        return _leaf(path, regex_of(value))
    if value is None:
        _check_null(path, "{path: null}")
    return _leaf(path, comparison(EQ, _operand(value)))


def _check_null(path: str, op: str) -> None:
    """Null on a dotted path is refused: where the path crosses an array holding no document (``[]``,
    ``[1, 2]``) or a scalar beside documents, MongoDB 5.0 to 8.x and 9.0 answer differently (9.0 takes
    such an element as a missing field: SERVER-36681); a top-level field is answered alike."""
    if "." in path:
        raise fail(
            f"{op} on the dotted path {path!r}: MongoDB versions match it differently where the path "
            f'crosses an array, so mcdc cannot decide it exactly; use $exists: false, or $type: "null"'
        )


def _check_range(op: str, operand: Any) -> None:
    """$lt/$lte MaxKey and $gt/$gte MinKey hold for every value; whether they hold for a missing field
    is not the same in every MongoDB version and query engine."""
    if (op in (LT, LTE) and type(operand) is MaxKey) or (op in (GT, GTE) and type(operand) is MinKey):
        name = type(operand).__name__
        raise fail(f"{op}: {name} (any value) cannot be decided outside the server; use $exists: true")


def _operators(path: str, ops: dict[str, Any]) -> _Field:
    parts: list[_Field] = []
    regex = ops.get("$regex")
    if "$options" in ops and "$regex" not in ops:
        raise fail("$options needs a $regex")
    for op, arg in ops.items():
        if op == "$options":
            continue
        if op == "$regex":
            parts.append(_leaf(path, _regex_operator(regex, ops.get("$options"))))
        elif op in (EQ, LT, LTE, GT, GTE):
            if type(arg) is Regex and op != EQ:
                raise fail(f"{op} cannot take a regular expression")
            if arg is None and op in (EQ, LTE, GTE):
                _check_null(path, f"{op}: null")
            _check_range(op, arg)
            parts.append(_leaf(path, comparison(op, _operand(arg))))
        elif op == "$ne":
            if type(arg) is Regex:
                raise fail("$ne cannot take a regular expression (use $not)")
            if arg is None:
                _check_null(path, "$ne: null")
            parts.append(_negated(_leaf(path, comparison(EQ, _operand(arg)))))
        elif op in ("$in", "$nin"):
            if type(arg) is not list:
                raise fail(f"{op} needs an array")
            for one in arg:
                if is_operator_document(one):
                    raise fail(f"{op} cannot hold an operator document ({next(iter(one))})")
                if one is None:
                    _check_null(path, f"{op}: [null]")
            test = in_test([one if type(one) is Regex else _operand(one) for one in arg])
            parts.append(_leaf(path, test) if op == "$in" else _negated(_leaf(path, test)))
        elif op == "$exists":
            exists = _leaf(path, lambda value: value is not MISSING)
            parts.append(exists if _true_value(arg) else _negated(exists))
        elif op == "$type":
            parts.append(_leaf(path, type_test(_operand(arg))))
        elif op == "$mod":
            parts.append(_leaf(path, mod_test(_operand(arg))))
        elif op in BITS:
            parts.append(_leaf(path, bit_test(op, _operand(arg))))
        elif op == "$size":
            parts.append(_leaf(path, size_test(_operand(arg)), WHOLE))
        elif op == "$not":
            parts.append(_negated(_not_argument(path, arg)))
        elif op == "$all":
            parts.append(_all(path, arg))
        elif op == "$elemMatch":
            parts.append(_elem_match(path, arg))
        elif op == "$comment":
            raise fail("$comment belongs at the top level of the query")
        else:
            raise _refuse(op)
    return _all_of(parts)


def _true_value(value: Any) -> bool:
    """BSONElement::trueValue: false for false, 0, null; true for anything else."""
    if value is None or value is False:
        return False
    if BRACKET.get(type(value)) == NUMBER:
        return bool(number_of(value)) or is_nan(value)
    return True


def _regex_operator(regex: Any, options: Any) -> ValueTest:
    if options is not None and type(options) is not str:
        raise fail("$options needs a string")
    if type(regex) is Regex:
        if options is not None and bson_order.regex_flags(regex):
            raise fail("$regex: options set in both $regex and $options")
        return regex_test(regex.pattern, options if options is not None else bson_order.regex_flags(regex))
    if type(regex) is not str:
        raise fail("$regex needs a string or a regular expression")
    return regex_test(regex, options or "")


def _not_argument(path: str, arg: Any) -> _Field:
    if type(arg) is Regex:
        return _leaf(path, regex_of(arg))
    if not isinstance(arg, dict):
        raise fail("$not needs a regular expression or a document of operators")
    if not arg:
        raise fail("$not cannot be empty")
    if not is_operator_document(arg):
        raise fail("$not needs a document of operators")
    return _operators(path, arg)


def _all(path: str, arg: Any) -> _Field:
    if type(arg) is not list:
        raise fail("$all needs an array")
    if not arg:
        return _Field(lambda d: False, lambda v: False)  # $all: [] matches nothing
    elem = [isinstance(one, dict) and next(iter(one), None) == "$elemMatch" for one in arg]
    if any(elem) and not all(elem):
        raise fail("$all cannot mix $elemMatch with values")
    if all(elem):
        return _all_of([_elem_match(path, one["$elemMatch"]) for one in arg])
    parts = []
    for one in arg:
        if is_operator_document(one):
            raise fail(f"$all cannot hold an operator document ({next(iter(one))})")
        parts.append(_equality(path, one))
    return _all_of(parts)


def _elem_match(path: str, arg: Any) -> _Field:
    if not isinstance(arg, dict):
        raise fail("$elemMatch needs a document")
    first = next(iter(arg), "")
    if is_operator_document(arg) and first not in ("$and", "$or", "$nor", "$where", "$expr", "$comment"):
        # on the elements themselves: each operator on the one element
        inner = _operators("", arg).value

        def element_values(value: Any) -> bool:
            if type(value) is not list:
                return False
            return any(inner(element) for element in value)

        return _leaf(path, element_values, WHOLE)
    # on elements that are documents (or arrays, read as documents whose fields are "0", "1", ...)
    query = compile_spec(arg)
    decode = DECODE.get()

    def element_documents(value: Any) -> bool:
        if type(value) is not list:
            return False
        for element in value:
            kind = BRACKET.get(type(element))
            if kind == bson_order.OBJECT:
                if query(decode(object_bytes(element))):
                    return True
            elif kind == bson_order.ARRAY and query({str(n): v for n, v in enumerate(element)}):
                return True
        return False

    return _leaf(path, element_documents, WHOLE)


# --- the query document -------------------------------------------------------------------------------


def compile_spec(spec: Mapping[str, Any]) -> DocTest:
    tests: list[DocTest] = []
    for key, value in spec.items():
        if key.startswith("$"):
            if key in ("$and", "$or", "$nor"):
                tests.append(_logical(key, value))
            elif key == "$comment":
                continue
            else:
                raise _refuse(key)
        elif "" in key.split("."):
            raise fail(f"the path {key!r} has an empty part")
        elif is_operator_document(value):
            tests.append(_operators(key, value).doc)
        else:
            tests.append(_equality(key, value).doc)
    if not tests:
        return lambda doc: True
    if len(tests) == 1:
        return tests[0]
    return lambda doc: all(t(doc) for t in tests)


def _logical(op: str, value: Any) -> DocTest:
    if type(value) is not list or not value:
        raise fail(f"{op} needs a non-empty array of queries")
    if not all(isinstance(one, dict) for one in value):
        raise fail(f"{op}'s elements must be query documents")
    branches = [compile_spec(one) for one in value]
    if op == "$and":
        return lambda doc: all(t(doc) for t in branches)
    if op == "$or":
        return lambda doc: any(t(doc) for t in branches)
    return lambda doc: not any(t(doc) for t in branches)
