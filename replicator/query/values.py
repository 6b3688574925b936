"""What one operator says of one value (a path's one candidate), as mongod's matchesSingleElement. Pure."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from bson.binary import Binary
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.regex import Regex

from replicator.errors import ConfigError
from replicator.query import order as bson_order
from replicator.query.order import BRACKET, MISSING, NULL, NUMBER, UNDEFINED, Symbol, bracket, compare, is_nan
from replicator.query.paths import ValueTest
from replicator.query.regex import compile_regex

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


def fail(message: str) -> ConfigError:
    """The error a query gets for what mcdc will not decide (one line, the --filter option named)."""
    return ConfigError(f"--filter: {message}")


EQ, LT, LTE, GT, GTE = "$eq", "$lt", "$lte", "$gt", "$gte"


def comparison(op: str, operand: Any) -> ValueTest:
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


def regex_test(pattern: str, flags: str) -> ValueTest:
    """mongod's RegexMatchExpression: a search in strings; a stored regex matches when it is the same one."""
    search = compile_regex(pattern, flags).search
    letters = "".join(sorted(flags))

    def test(value: Any) -> bool:
        if type(value) is str or type(value) is Symbol:
            return search(value) is not None
        if type(value) is Regex:
            return value.pattern == pattern and bson_order.regex_flags(value) == letters
        return False

    return test


def regex_of(value: Regex[Any]) -> ValueTest:
    return regex_test(value.pattern, bson_order.regex_flags(value))


def in_test(operands: list[Any]) -> ValueTest:
    """mongod's InMatchExpression: equal to one of them, or matched by one of its regexes; null also
    matches a missing field."""
    tests = []
    strings = set()  # looked up at once (a str's hash and equality are the server's string equality)
    has_null = False
    for operand in operands:
        if type(operand) is Regex:
            tests.append(regex_of(operand))
        elif type(operand) is str:
            strings.add(operand)
        else:
            has_null = has_null or operand is None
            tests.append(comparison(EQ, operand))

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


def type_test(operand: Any) -> ValueTest:
    codes: set[int] = set()
    for one in operand if type(operand) is list else [operand]:
        if type(one) is str:
            if one not in TYPE_ALIASES:
                raise fail(f"$type: unknown type name {one!r}")
            codes |= TYPE_ALIASES[one]
        elif BRACKET.get(type(one)) == NUMBER:
            code = _whole(one)
            if code is None or code not in _TYPE_CODES:
                raise fail(f"$type: invalid type code {one}")
            codes.add(code)
        else:
            raise fail("$type takes a type name, a type number, or an array of them")
    if not codes:
        raise fail("$type needs at least one type")
    wanted = frozenset(codes)
    return lambda value: value is not MISSING and _type_code(value) in wanted


def _whole(value: Any) -> int | None:
    """A number's value when it is a whole number (NaN and infinities are not), else None."""
    number = number_of(value)
    if isinstance(number, float) and not math.isfinite(number):
        return None
    if isinstance(number, Decimal) and not number.is_finite():
        return None
    return int(number) if number == int(number) else None


def number_of(value: Any) -> int | float | Decimal:
    return value.to_decimal() if type(value) is Decimal128 else value


def _int64(value: Any, what: str) -> int:
    """A $mod argument as the server takes it (5.1 on: truncated toward zero; NaN, infinity and values
    outside 64 bits refused)."""
    if BRACKET.get(type(value)) != NUMBER:
        raise fail(f"$mod: {what} must be a number")
    number = number_of(value)
    if isinstance(number, (float, Decimal)):
        if not (math.isfinite(number) if isinstance(number, float) else number.is_finite()):
            raise fail(f"$mod: {what} must be a finite number")
        number = int(number)  # toward zero
    if not -(2**63) <= number < 2**63:
        raise fail(f"$mod: {what} out of the 64-bit range")
    return int(number)


def mod_test(operand: Any) -> ValueTest:
    if type(operand) is not list or len(operand) != 2:
        raise fail("$mod takes an array of two numbers: [divisor, remainder]")
    divisor, remainder = _int64(operand[0], "divisor"), _int64(operand[1], "remainder")
    if divisor == 0:
        raise fail("$mod: divisor cannot be 0")

    def test(value: Any) -> bool:
        if BRACKET.get(type(value)) != NUMBER:
            return False
        number = number_of(value)
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


def size_test(operand: Any) -> ValueTest:
    if BRACKET.get(type(operand)) != NUMBER or is_nan(operand):
        raise fail("$size needs a number")
    size = _whole(operand)
    if size is None:  # older servers match no array, newer ones refuse the query
        raise fail("$size needs a whole number")
    if size < 0:
        raise fail("$size may not be negative")
    return lambda value: type(value) is list and len(value) == size


BITS = ("$bitsAllSet", "$bitsAllClear", "$bitsAnySet", "$bitsAnyClear")
_U64 = 2**64 - 1


def bit_test(op: str, operand: Any) -> ValueTest:
    """mongod's BitTestMatchExpression: a bitmask as a number, an array of bit positions, or binData; it
    tests integral numbers (two's complement, 64 bits) and binData (bit 0 is the first byte's lowest)."""
    mask, positions = _bit_mask(op, operand)
    all_bits, want_set = op in ("$bitsAllSet", "$bitsAllClear"), op in ("$bitsAllSet", "$bitsAnySet")

    def on_number(number: int) -> bool:
        bits = (number & _U64) if want_set else (~number & _U64)
        return (bits & mask) == mask if all_bits else (bits & mask) != 0

    def on_bytes(data: bytes) -> bool:
        size = len(data) * 8
        for position in positions:
            is_set = position < size and bool(data[position >> 3] & (1 << (position & 7)))
            if is_set != want_set and all_bits:
                return False
            if is_set == want_set and not all_bits:
                return True
        return all_bits

    def test(value: Any) -> bool:
        kind = type(value)
        if kind is bytes or kind is Binary:
            return on_bytes(bytes(value))
        if BRACKET.get(kind) != NUMBER:
            return False
        number = _long(value)
        return number is not None and on_number(number)

    return test


def _long(value: Any) -> int | None:
    """A number as the bit tests read it: an integral double or decimal within 64 bits, else none (the
    decimal rules are MongoDB 7.0's on; earlier servers rounded a decimal to a long)."""
    if type(value) is int or type(value) is Int64:
        return int(value)
    whole = _whole(value)
    return whole if whole is not None and -(2**63) <= whole < 2**63 else None


def _bit_mask(op: str, operand: Any) -> tuple[int, list[int]]:
    """The mask numbers are tested with, and the positions binData is tested at."""
    if type(operand) is list:
        positions = []
        for one in operand:
            position = _whole(one) if BRACKET.get(type(one)) == NUMBER else None
            if position is None or not 0 <= position < 2**31:
                raise fail(f"{op}: bit positions must be whole numbers from 0 to 2^31-1")
            positions.append(position)
        return sum({1 << min(p, 63) for p in positions}), positions
    if BRACKET.get(type(operand)) == NUMBER:
        mask = _whole(operand) if type(operand) is not float or math.isfinite(operand) else None
        if mask is None or not 0 <= mask < 2**63:
            raise fail(f"{op}: a bitmask must be a whole number from 0 to 2^63-1")
        return mask, [bit for bit in range(64) if mask >> bit & 1]
    if type(operand) is bytes or type(operand) is Binary:
        data = bytes(operand)
        if any(byte >= 0x80 for byte in data[:8]):
            # mongod builds the mask from C chars, whose sign depends on the platform
            raise fail(f"{op}: a binData bitmask with a byte from 0x80 on in its first 8 bytes is not supported")
        mask = sum(byte << (8 * n) for n, byte in enumerate(data[:8]))
        if any(data[8:]):
            mask |= 1 << 63
        positions = [8 * n + bit for n, byte in enumerate(data) for bit in range(8) if byte >> bit & 1]
        return mask, positions
    raise fail(f"{op} takes an array of bit positions, a number or binData")
