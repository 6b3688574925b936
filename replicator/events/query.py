"""A MongoDB query (``find``'s filter) decided outside the server, exactly as the server decides it. Pure.

:func:`compile_query` turns a query document into a :class:`Query` whose :meth:`Query.matches` says
whether ``find(query)`` would return a given document. The rules are mongod's own matcher's:

- a dotted path reaches into sub-documents, and through arrays into each element that is a document; a
  numeric part also names an array's element by position; the path yields every value it reaches, and a
  query on a path matches when any of them does;
- where a path ends at an array, the array's elements are candidates and so is the whole array
  (``{a: 1}`` matches ``{a: [1, 2]}``, ``{a: [1, 2]}`` matches ``{a: [1, 2]}`` and ``{a: [[1, 2]]}``);
- comparisons stay within one type bracket (:mod:`.bson_order`); ``null`` also matches a missing field;
- the negations (``$ne``, ``$nin``, ``$not``, ``$nor``, ``$exists: false``) negate the whole path's
  answer, not each value's.

What cannot be decided exactly outside the server (``$where``, ``$expr``, ``$text``, geo queries, ...)
is refused at compile time, in one line naming the operator.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from decimal import Decimal
from typing import Any

import bson
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.raw_bson import RawBSONDocument
from bson.regex import Regex

from replicator.bsonkit.rawbson import SPAN_CODEC, raw_of
from replicator.errors import ConfigError
from replicator.events import bson_order
from replicator.events.bson_order import (
    BRACKET,
    MISSING,
    NULL,
    NUMBER,
    UNDEFINED,
    Decode,
    Symbol,
    bracket,
    compare,
    fields,
    is_nan,
    object_bytes,
    plain_fields,
)
from replicator.events.regex import compile_regex

#: how the query being compiled reads documents: told apart from pymongo's reading of a symbol (a
#: string) and undefined (None) only where the query's answer depends on it (see _reads_types)
_DECODE: ContextVar[Decode] = ContextVar("decode", default=fields)

#: a predicate on one value (a path's one candidate); a predicate on a document's top-level fields
ValueTest = Callable[[Any], bool]
DocTest = Callable[[dict[str, Any]], bool]

#: how the query itself is read: documents as dicts (they are the query's structure), dates as DatetimeMS
_SPEC_CODEC: CodecOptions[dict[str, Any]] = CodecOptions(
    document_class=dict,
    datetime_conversion=DatetimeConversion.DATETIME_MS,
    uuid_representation=SPAN_CODEC.uuid_representation,
)

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
    "$bitsAllSet": "is not supported by mcdc's matcher",
    "$bitsAnySet": "is not supported by mcdc's matcher",
    "$bitsAllClear": "is not supported by mcdc's matcher",
    "$bitsAnyClear": "is not supported by mcdc's matcher",
    "$alwaysTrue": "is not supported by mcdc's matcher",
    "$alwaysFalse": "is not supported by mcdc's matcher",
}
_HINT = "use operators on fields (see the README's --filter section)"

#: $type's names (and "number"), as the server spells them
TYPE_ALIASES: dict[str, frozenset[int]] = {
    "double": frozenset({1}),
    "string": frozenset({2}),
    "object": frozenset({3}),
    "array": frozenset({4}),
    "binData": frozenset({5}),
    "undefined": frozenset({6}),
    "objectId": frozenset({7}),
    "bool": frozenset({8}),
    "date": frozenset({9}),
    "null": frozenset({10}),
    "regex": frozenset({11}),
    "dbPointer": frozenset({12}),
    "javascript": frozenset({13}),
    "symbol": frozenset({14}),
    "javascriptWithScope": frozenset({15}),
    "int": frozenset({16}),
    "timestamp": frozenset({17}),
    "long": frozenset({18}),
    "decimal": frozenset({19}),
    "minKey": frozenset({-1}),
    "maxKey": frozenset({127}),
    "number": frozenset({1, 16, 18, 19}),
}
_TYPE_CODES = frozenset().union(*TYPE_ALIASES.values())

# how a path's last part treats an array it ends at (mongod's LeafArrayBehavior)
_TRAVERSE = True  # the array's elements, then the array itself
_WHOLE = False  # the array itself only ($size, $elemMatch)


def _fail(message: str) -> ConfigError:
    return ConfigError(f"--filter: {message}")


def _refuse(op: str) -> ConfigError:
    why = _REFUSED.get(op)
    if why is None:
        return _fail(f"unknown operator {op}")
    return _fail(f"{op} cannot be decided outside the server ({why}); {_HINT}")


# --- paths -------------------------------------------------------------------------------------------


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


def _path_test(path: str, test: ValueTest, leaf: bool = _TRAVERSE) -> DocTest:
    """A document test: does any value the path reaches pass ``test``? (No value: no.)"""
    parts = tuple(path.split("."))
    decode = _DECODE.get()
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


# --- value tests --------------------------------------------------------------------------------------

EQ, LT, LTE, GT, GTE = "$eq", "$lt", "$lte", "$gt", "$gte"


def _comparison(op: str, operand: Any) -> ValueTest:
    """mongod's ComparisonMatchExpression::matchesSingleElement."""
    want = bracket(operand)
    operand_nan = is_nan(operand)
    with_equal = op in (EQ, LTE, GTE)

    # the common cases without the general path's calls: within the bracket, Python's own comparison is
    # the server's (strings by code point, which is UTF-8's byte order; numbers exactly across int, float
    # and Decimal, as mongod compares a decimal with a double); outside it, nothing
    holds = _OPERATORS[op]
    if want == bson_order.STRING:
        return lambda value: (type(value) is str or type(value) is Symbol) and holds(value, operand)
    if want == NUMBER and not operand_nan:
        return _numeric(holds, operand.to_decimal() if type(operand) is Decimal128 else operand)

    def test(value: Any) -> bool:
        have = bracket(value)
        if have != want:
            if have + want == NULL:  # null against missing: equal (against undefined not, from 8.0 on)
                return with_equal and value is MISSING
            if want == bson_order.MAXKEY:
                return op in (LT, LTE)
            if want == bson_order.MINKEY:
                return op in (GT, GTE)
            return False
        if op != EQ and (operand_nan or is_nan(value)):
            return op != LT and op != GT and operand_nan and is_nan(value)
        c = compare(value, operand)
        if op == EQ:
            return c == 0
        if op == LT:
            return c < 0
        if op == LTE:
            return c <= 0
        if op == GT:
            return c > 0
        return c >= 0

    return test


_OPERATORS: dict[str, Callable[[Any, Any], bool]] = {
    EQ: operator.eq,
    LT: operator.lt,
    LTE: operator.le,
    GT: operator.gt,
    GTE: operator.ge,
}


def _numeric(holds: Callable[[Any, Any], bool], number: int | float | Decimal) -> ValueTest:
    """A comparison with a number that is not NaN: only numbers pass, and a NaN never does."""

    def test(value: Any) -> bool:
        kind = type(value)
        if kind is int or kind is Int64:
            return holds(value, number)
        if kind is float:
            return value == value and holds(value, number)
        if kind is Decimal128:
            exact = value.to_decimal()
            return not exact.is_nan() and holds(exact, number)  # a signalling NaN would raise
        return False

    return test


def _regex_test(pattern: str, flags: str) -> ValueTest:
    """mongod's RegexMatchExpression: a search in strings; a stored regex matches when it is the same one."""
    search = compile_regex(pattern, flags).search
    letters = "".join(sorted(flags))

    def test(value: Any) -> bool:
        if type(value) is str or type(value) is Symbol:
            return search(value) is not None
        if type(value) is Regex:
            return value.pattern == pattern and bson_order._flags(value) == letters
        return False

    return test


def _regex_of(value: Regex[Any]) -> ValueTest:
    return _regex_test(value.pattern, bson_order._flags(value))


def _in(operands: list[Any]) -> ValueTest:
    """mongod's InMatchExpression: equal to one of them, or matched by one of its regexes; null also
    matches a missing field."""
    tests = []
    strings = set()  # looked up at once (a str's hash and equality are the server's string equality)
    has_null = False
    for operand in operands:
        if type(operand) is Regex:
            tests.append(_regex_of(operand))
        elif type(operand) is str:
            strings.add(operand)
        else:
            has_null = has_null or operand is None
            tests.append(_comparison(EQ, operand))

    def test(value: Any) -> bool:
        if has_null and value is MISSING:
            return True
        kind = type(value)
        if (kind is str or kind is Symbol) and value in strings:
            return True
        return any(one(value) for one in tests)

    return test


def _type_code(value: Any) -> int:
    if value is UNDEFINED:
        return 6
    kind = bracket(value)
    if kind == bson_order.STRING:
        return 14 if type(value) is Symbol else 2
    if kind == NUMBER:
        t = type(value)
        return 16 if t is int else 18 if t is Int64 else 1 if t is float else 19
    if kind == bson_order.CODE:
        return 13
    if kind == bson_order.CODE_W_SCOPE:
        return 15
    return _CODE_OF_BRACKET[kind]


_CODE_OF_BRACKET = {
    bson_order.EOO: 0,
    bson_order.NULL: 10,
    bson_order.OBJECT: 3,
    bson_order.ARRAY: 4,
    bson_order.BINDATA: 5,
    bson_order.OID: 7,
    bson_order.BOOL: 8,
    bson_order.DATE: 9,
    bson_order.TIMESTAMP: 17,
    bson_order.REGEX: 11,
    bson_order.DBPOINTER: 12,
    bson_order.MINKEY: -1,
    bson_order.MAXKEY: 127,
}


def _type_test(operand: Any) -> ValueTest:
    codes: set[int] = set()
    for one in operand if type(operand) is list else [operand]:
        if type(one) is str:
            if one not in TYPE_ALIASES:
                raise _fail(f"$type: unknown type name {one!r}")
            codes |= TYPE_ALIASES[one]
        elif BRACKET.get(type(one)) == NUMBER:
            code = _whole(one)
            if code is None or code not in _TYPE_CODES:
                raise _fail(f"$type: invalid type code {one}")
            codes.add(code)
        else:
            raise _fail("$type takes a type name, a type number, or an array of them")
    if not codes:
        raise _fail("$type needs at least one type")
    wanted = frozenset(codes)
    return lambda value: value is not MISSING and _type_code(value) in wanted


def _whole(value: Any) -> int | None:
    """A number's value when it is a whole number (NaN and infinities are not), else None."""
    number = _number(value)
    if isinstance(number, float) and not math.isfinite(number):
        return None
    if isinstance(number, Decimal) and not number.is_finite():
        return None
    return int(number) if number == int(number) else None


def _number(value: Any) -> int | float | Decimal:
    return value.to_decimal() if type(value) is Decimal128 else value


def _int64(value: Any, what: str) -> int:
    """A $mod argument as the server takes it (5.1 on: truncated toward zero; NaN, infinity and values
    outside 64 bits refused)."""
    if BRACKET.get(type(value)) != NUMBER:
        raise _fail(f"$mod: {what} must be a number")
    number = _number(value)
    if isinstance(number, (float, Decimal)):
        if not (math.isfinite(number) if isinstance(number, float) else number.is_finite()):
            raise _fail(f"$mod: {what} must be a finite number")
        number = int(number)  # toward zero
    if not -(2**63) <= number < 2**63:
        raise _fail(f"$mod: {what} out of the 64-bit range")
    return int(number)


def _mod_test(operand: Any) -> ValueTest:
    if type(operand) is not list or len(operand) != 2:
        raise _fail("$mod takes an array of two numbers: [divisor, remainder]")
    divisor, remainder = _int64(operand[0], "divisor"), _int64(operand[1], "remainder")
    if divisor == 0:
        raise _fail("$mod: divisor cannot be 0")

    def test(value: Any) -> bool:
        if BRACKET.get(type(value)) != NUMBER:
            return False
        number = _number(value)
        if isinstance(number, (float, Decimal)):
            if not (math.isfinite(number) if isinstance(number, float) else number.is_finite()):
                return False
            number = int(number)
            if not -(2**63) <= number < 2**63:
                return False
        # C's remainder: the dividend's sign (and -1 never overflows)
        rest = abs(number) % abs(divisor)
        return (-rest if number < 0 else rest) == remainder

    return test


def _size_test(operand: Any) -> ValueTest:
    if BRACKET.get(type(operand)) != NUMBER or is_nan(operand):
        raise _fail("$size needs a number")
    size = _whole(operand)
    if size is None:  # older servers match no array, newer ones refuse the query
        raise _fail("$size needs a whole number")
    if size < 0:
        raise _fail("$size may not be negative")
    return lambda value: type(value) is list and len(value) == size


# --- operators on a path ------------------------------------------------------------------------------


class _Field:
    """One path's operator document compiled twice: as a document test (the path's values, negations
    over the whole path) and as a value test (for $elemMatch's operators, which see one element)."""

    __slots__ = ("doc", "value")

    def __init__(self, doc: DocTest, value: ValueTest) -> None:
        self.doc = doc
        self.value = value


def _leaf(path: str, test: ValueTest, leaf: bool = _TRAVERSE) -> _Field:
    return _Field(_path_test(path, test, leaf), test)


def _negated(field: _Field) -> _Field:
    doc, value = field.doc, field.value
    return _Field(lambda d: not doc(d), lambda v: not value(v))


def _all_of(parts: list[_Field]) -> _Field:
    if len(parts) == 1:
        return parts[0]
    docs = [p.doc for p in parts]
    values = [p.value for p in parts]
    return _Field(lambda d: all(t(d) for t in docs), lambda v: all(t(v) for t in values))


def _is_operator_document(value: Any) -> bool:
    """Does ``{path: value}`` hold operators (else it is an equality with a document)? mongod's
    isExpressionDocument: the first field starts with $, and it is no DBRef ($ref and $id)."""
    if not isinstance(value, dict) or not value:
        return False
    return next(iter(value)).startswith("$") and not ("$ref" in value and "$id" in value)


def _operand(value: Any) -> Any:
    """A value of the query as the matcher holds a document's values (sub-documents as bytes)."""
    return fields(bson.encode({"v": value}))["v"]


def _equality(path: str, value: Any) -> _Field:
    if type(value) is Regex:
        return _leaf(path, _regex_of(value))
    if value is None:
        _check_null(path, "{path: null}")
    return _leaf(path, _comparison(EQ, _operand(value)))


def _check_null(path: str, op: str) -> None:
    """Null on a dotted path is refused: where the path crosses an array holding no document (``[]``,
    ``[1, 2]``) or a scalar beside documents, MongoDB 5.0 to 8.x and 9.0 answer differently (9.0 takes
    such an element as a missing field: SERVER-36681); a top-level field is answered alike."""
    if "." in path:
        raise _fail(
            f"{op} on the dotted path {path!r}: MongoDB versions match it differently where the path "
            f'crosses an array, so mcdc cannot decide it exactly; use $exists: false, or $type: "null"'
        )


def _check_range(op: str, operand: Any) -> None:
    """$lt/$lte MaxKey and $gt/$gte MinKey hold for every value; whether they hold for a missing field
    is not the same in every MongoDB version and query engine."""
    if (op in (LT, LTE) and type(operand) is MaxKey) or (op in (GT, GTE) and type(operand) is MinKey):
        name = type(operand).__name__
        raise _fail(f"{op}: {name} (any value) cannot be decided outside the server; use $exists: true")


def _operators(path: str, ops: dict[str, Any]) -> _Field:
    parts: list[_Field] = []
    regex = ops.get("$regex")
    if "$options" in ops and "$regex" not in ops:
        raise _fail("$options needs a $regex")
    for op, arg in ops.items():
        if op == "$options":
            continue
        if op == "$regex":
            parts.append(_leaf(path, _regex_operator(regex, ops.get("$options"))))
        elif op in (EQ, LT, LTE, GT, GTE):
            if type(arg) is Regex and op != EQ:
                raise _fail(f"{op} cannot take a regular expression")
            if arg is None and op in (EQ, LTE, GTE):
                _check_null(path, f"{op}: null")
            _check_range(op, arg)
            parts.append(_leaf(path, _comparison(op, _operand(arg))))
        elif op == "$ne":
            if type(arg) is Regex:
                raise _fail("$ne cannot take a regular expression (use $not)")
            if arg is None:
                _check_null(path, "$ne: null")
            parts.append(_negated(_leaf(path, _comparison(EQ, _operand(arg)))))
        elif op in ("$in", "$nin"):
            if type(arg) is not list:
                raise _fail(f"{op} needs an array")
            for one in arg:
                if _is_operator_document(one):
                    raise _fail(f"{op} cannot hold an operator document ({next(iter(one))})")
                if one is None:
                    _check_null(path, f"{op}: [null]")
            test = _in([one if type(one) is Regex else _operand(one) for one in arg])
            parts.append(_leaf(path, test) if op == "$in" else _negated(_leaf(path, test)))
        elif op == "$exists":
            exists = _leaf(path, lambda value: value is not MISSING)
            parts.append(exists if _true_value(arg) else _negated(exists))
        elif op == "$type":
            parts.append(_leaf(path, _type_test(_operand(arg))))
        elif op == "$mod":
            parts.append(_leaf(path, _mod_test(_operand(arg))))
        elif op == "$size":
            parts.append(_leaf(path, _size_test(_operand(arg)), _WHOLE))
        elif op == "$not":
            parts.append(_negated(_not_argument(path, arg)))
        elif op == "$all":
            parts.append(_all(path, arg))
        elif op == "$elemMatch":
            parts.append(_elem_match(path, arg))
        elif op == "$comment":
            raise _fail("$comment belongs at the top level of the query")
        else:
            raise _refuse(op)
    return _all_of(parts)


def _true_value(value: Any) -> bool:
    """BSONElement::trueValue: false for false, 0, null; true for anything else."""
    if value is None or value is False:
        return False
    if BRACKET.get(type(value)) == NUMBER:
        return bool(_number(value)) or is_nan(value)
    return True


def _regex_operator(regex: Any, options: Any) -> ValueTest:
    if options is not None and type(options) is not str:
        raise _fail("$options needs a string")
    if type(regex) is Regex:
        if options is not None and bson_order._flags(regex):
            raise _fail("$regex: options set in both $regex and $options")
        return _regex_test(regex.pattern, options if options is not None else bson_order._flags(regex))
    if type(regex) is not str:
        raise _fail("$regex needs a string or a regular expression")
    return _regex_test(regex, options or "")


def _not_argument(path: str, arg: Any) -> _Field:
    if type(arg) is Regex:
        return _leaf(path, _regex_of(arg))
    if not isinstance(arg, dict):
        raise _fail("$not needs a regular expression or a document of operators")
    if not arg:
        raise _fail("$not cannot be empty")
    if not _is_operator_document(arg):
        raise _fail("$not needs a document of operators")
    return _operators(path, arg)


def _all(path: str, arg: Any) -> _Field:
    if type(arg) is not list:
        raise _fail("$all needs an array")
    if not arg:
        return _Field(lambda d: False, lambda v: False)  # $all: [] matches nothing
    elem = [isinstance(one, dict) and next(iter(one), None) == "$elemMatch" for one in arg]
    if any(elem) and not all(elem):
        raise _fail("$all cannot mix $elemMatch with values")
    if all(elem):
        return _all_of([_elem_match(path, one["$elemMatch"]) for one in arg])
    parts = []
    for one in arg:
        if _is_operator_document(one):
            raise _fail(f"$all cannot hold an operator document ({next(iter(one))})")
        parts.append(_equality(path, one))
    return _all_of(parts)


def _elem_match(path: str, arg: Any) -> _Field:
    if not isinstance(arg, dict):
        raise _fail("$elemMatch needs a document")
    first = next(iter(arg), "")
    if _is_operator_document(arg) and first not in ("$and", "$or", "$nor", "$where", "$expr", "$comment"):
        # on the elements themselves: each operator on the one element
        inner = _operators("", arg).value

        def element_values(value: Any) -> bool:
            if type(value) is not list:
                return False
            return any(inner(element) for element in value)

        return _leaf(path, element_values, _WHOLE)
    # on elements that are documents (or arrays, read as documents whose fields are "0", "1", ...)
    query = _compile(arg)
    decode = _DECODE.get()

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

    return _leaf(path, element_documents, _WHOLE)


# --- the query document -------------------------------------------------------------------------------


def _compile(spec: Mapping[str, Any]) -> DocTest:
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
            raise _fail(f"the path {key!r} has an empty part")
        elif _is_operator_document(value):
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
        raise _fail(f"{op} needs a non-empty array of queries")
    if not all(isinstance(one, dict) for one in value):
        raise _fail(f"{op}'s elements must be query documents")
    branches = [_compile(one) for one in value]
    if op == "$and":
        return lambda doc: all(t(doc) for t in branches)
    if op == "$or":
        return lambda doc: any(t(doc) for t in branches)
    return lambda doc: not any(t(doc) for t in branches)


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

    __slots__ = ("_decode", "_fields", "_test", "spec")

    def __init__(self, spec: Mapping[str, Any], test: DocTest, names: frozenset[str], decode: Decode) -> None:
        self.spec = spec
        self._test = test
        self._fields = names
        self._decode = decode

    def matches(self, doc: Mapping[str, Any]) -> bool:
        """Would the server's ``find(spec)`` return ``doc``? ``doc`` is a RawBSONDocument (read without
        decoding its sub-documents) or any mapping bson can encode."""
        data = raw_of(doc) if isinstance(doc, RawBSONDocument) else bson.encode(doc)
        return self._test(self._decode(data))

    def fields(self) -> frozenset[str]:
        """The top-level fields the query reads."""
        return self._fields

    def __repr__(self) -> str:
        return f"Query({self.spec!r})"


def compile_query(spec: Mapping[str, Any]) -> Query:
    """``spec`` (a find filter, as bson decodes one) compiled; ConfigError, one line naming the operator,
    for what the matcher cannot decide exactly as the server does (or the server itself refuses)."""
    if not isinstance(spec, Mapping):
        raise _fail("the query must be a document")
    as_dicts = bson.decode(bson.encode(spec), _SPEC_CODEC)
    decode = fields if _reads_types(as_dicts) else plain_fields
    token = _DECODE.set(decode)
    try:
        test = _compile(as_dicts)
    finally:
        _DECODE.reset(token)
    return Query(spec, test, frozenset(_top_fields(as_dicts)), decode)


def _reads_types(spec: Mapping[str, Any]) -> bool:
    """Can the query's answer tell a symbol from a string or undefined from null? Only through $type, a
    null operand, or a document or array operand (compared element by element, types first): elsewhere a
    symbol compares as the string it holds, and undefined as pymongo's None (no number, string, ... either)."""
    for key, value in spec.items():
        if key in ("$and", "$or", "$nor"):
            if isinstance(value, list) and any(_reads_types(one) for one in value if isinstance(one, dict)):
                return True
        elif not key.startswith("$") and (
            _operators_read_types(value) if _is_operator_document(value) else _operand_reads_types(value)
        ):
            return True
    return False


def _operators_read_types(ops: Mapping[str, Any]) -> bool:
    for op, arg in ops.items():
        if op == "$type":
            return True
        if op == "$elemMatch":
            if isinstance(arg, dict) and (
                _operators_read_types(arg) if _is_operator_document(arg) else _reads_types(arg)
            ):
                return True
        elif op == "$not":
            if isinstance(arg, dict) and _operators_read_types(arg):
                return True
        elif op in ("$in", "$nin", "$all"):
            if isinstance(arg, list) and any(_operand_reads_types(one) for one in arg):
                return True
        elif op not in ("$regex", "$options", "$exists", "$size", "$mod") and _operand_reads_types(arg):
            return True
    return False


def _operand_reads_types(value: Any) -> bool:
    return value is None or isinstance(value, (dict, list))
