"""A MongoDB regular expression (PCRE2, UTF mode, options i/m/s/x) as a Python ``re`` pattern that
matches the same strings, or a one-line refusal. Pure.

The two engines agree on most syntax. Where they differ, the pattern is rewritten:

- ``\\d``, ``\\w``, ``\\s`` and ``\\b`` are ASCII in PCRE without UCP (as MongoDB compiles), Unicode in
  Python: spelled out as ASCII classes (``\\s`` is PCRE's: tab, LF, VT, FF, CR, space);
- ``\\Z`` (PCRE: the end, or before a final newline) and ``\\z`` (PCRE: the very end; Python's ``\\Z``);
- the ``x`` option: whitespace and ``#`` comments are taken out here, as PCRE2 takes them out.

What Python reads otherwise, or not at all, is refused: ``\\Q..\\E``, ``\\v``, ``\\h``, ``\\R``, ``\\K``,
``\\G``, ``\\p{..}``, ``\\x{..}``, ``\\N``, ``\\u``, ``\\U``, POSIX classes, ``(?<name>..)``, recursion,
inline flags other than i, m, s, ``{,n}``, and any pattern Python's compiler rejects or warns about.
"""

from __future__ import annotations

import re
import warnings

from replicator.errors import ConfigError

_WORD = "A-Za-z0-9_"
_SPACE = "\\t\\n\\x0b\\x0c\\r "
#: outside a class, with case folding switched off inside so that Python's Unicode case folding (the
#: Kelvin sign folds to k) does not widen an ASCII class that PCRE does not fold
_OUTSIDE = {
    "d": "[0-9]",
    "D": "[^0-9]",
    "w": f"(?-i:[{_WORD}])",
    "W": f"(?-i:[^{_WORD}])",
    "s": f"[{_SPACE}]",
    "S": f"[^{_SPACE}]",
    "b": f"(?-i:(?:(?<=[{_WORD}])(?![{_WORD}])|(?<![{_WORD}])(?=[{_WORD}])))",
    "B": f"(?-i:(?:(?<=[{_WORD}])(?=[{_WORD}])|(?<![{_WORD}])(?![{_WORD}])))",
    "A": "\\A",
    "z": "\\Z",
    "Z": "(?=\\n?\\Z)",
}
#: escapes that mean the same in both engines (letters; any other escaped ASCII punctuation is literal)
_SAME = set("ntrfa")
_OPTIONS = {"i": re.IGNORECASE, "m": re.MULTILINE, "s": re.DOTALL}
#: PCRE2's white space in extended mode (UTF): ASCII's and Unicode's Pattern_White_Space
_EXTENDED_SPACE = set(" \t\n\x0b\x0c\r\x85\u200e\u200f\u2028\u2029")


def _refuse(pattern: str, why: str) -> ConfigError:
    return ConfigError(f"--filter: $regex /{pattern}/: {why}; mcdc cannot match it exactly as MongoDB's PCRE does")


def compile_regex(pattern: str, options: str = "") -> re.Pattern[str]:
    """``pattern`` with MongoDB's ``options`` as a compiled Python regex that accepts the same strings."""
    flags = 0
    for letter in options:
        if letter in _OPTIONS:
            flags |= _OPTIONS[letter]
        elif letter not in "xu":  # u: accepted and ignored, as MongoDB does
            raise ConfigError(f"--filter: $regex /{pattern}/: invalid option {letter!r} (MongoDB takes i, m, s, x)")
    if "\x00" in pattern:
        raise ConfigError("--filter: $regex: a regular expression cannot contain a NUL character")
    translated = _translate(pattern, extended="x" in options, caseless="i" in options)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            return re.compile(translated, flags)
        except (re.error, Warning) as exc:
            raise _refuse(pattern, f"Python reads it otherwise ({exc})") from None


def _translate(pattern: str, *, extended: bool, caseless: bool) -> str:
    out: list[str] = []
    i, n = 0, len(pattern)
    in_class = False
    class_start = False  # just after "[" or "[^": a "]" here is literal
    while i < n:
        c = pattern[i]
        if in_class:
            if c == "]" and not class_start:
                in_class = False
                out.append(c)
            elif c == "\\":
                i = _class_escape(pattern, i, out, caseless)
                class_start = False
                continue
            elif c == "[":
                if pattern.startswith("[:", i) or pattern.startswith("[=", i) or pattern.startswith("[.", i):
                    raise _refuse(pattern, "POSIX character classes")
                out.append("\\[")
            elif c in "&|~":
                out.append("\\" + c)  # literal in PCRE; Python warns of future set operations
            else:
                out.append(c)
            class_start = False
            i += 1
            continue
        if extended and c in _EXTENDED_SPACE:
            i += 1
            continue
        if extended and c == "#":
            end = pattern.find("\n", i)
            i = n if end < 0 else end + 1
            continue
        if c == "\\":
            i = _escape(pattern, i, out)
            continue
        if c == "[":
            in_class = True
            class_start = True
            out.append(c)
            i += 1
            if i < n and pattern[i] == "^":
                out.append("^")
                i += 1
            continue
        if c == "(" and pattern.startswith("(?", i):
            _check_group(pattern, i)
        if c == "{" and re.match(r"\{\s*,", pattern[i:]):
            raise _refuse(pattern, "a {,n} quantifier")
        out.append(c)
        i += 1
    return "".join(out)


def _escape(pattern: str, i: int, out: list[str]) -> int:
    """An escape outside a class at ``pattern[i]`` (the backslash); returns where the pattern goes on."""
    if i + 1 >= len(pattern):
        raise _refuse(pattern, "a trailing backslash")
    c = pattern[i + 1]
    if c in _OUTSIDE:
        out.append(_OUTSIDE[c])
        return i + 2
    return _common_escape(pattern, i, out)


def _class_escape(pattern: str, i: int, out: list[str], caseless: bool) -> int:
    if i + 1 >= len(pattern):
        raise _refuse(pattern, "a trailing backslash")
    c = pattern[i + 1]
    if c == "d":
        out.append("0-9")
    elif c == "s":
        out.append(_SPACE)
    elif c == "w":
        if caseless:
            raise _refuse(pattern, "\\w in a character class with the i option")
        out.append(_WORD)
    elif c in "DWS":
        raise _refuse(pattern, f"\\{c} inside a character class")
    elif c == "b":
        out.append("\\x08")  # a backspace in a class, in both
    else:
        return _common_escape(pattern, i, out)
    return i + 2


def _common_escape(pattern: str, i: int, out: list[str]) -> int:
    c = pattern[i + 1]
    if c in _SAME:
        out.append("\\" + c)
        return i + 2
    if c == "x":
        digits = pattern[i + 2 : i + 4]
        if len(digits) == 2 and all(ch in "0123456789abcdefABCDEF" for ch in digits):
            out.append("\\x" + digits)
            return i + 4
        raise _refuse(pattern, "\\x needs exactly two hex digits here")
    if c == "0":
        j = i + 2
        while j < i + 4 and j < len(pattern) and pattern[j] in "01234567":
            j += 1
        out.append(f"\\x{int(pattern[i + 2 : j] or '0', 8):02x}")
        return j
    if c in "123456789":
        if i + 2 < len(pattern) and pattern[i + 2].isdigit():
            raise _refuse(pattern, "a backreference or octal escape of two digits")
        out.append("\\" + c)
        return i + 2
    if c.isascii() and c.isalnum():
        raise _refuse(pattern, f"the escape \\{c}")
    out.append("\\" + c)  # escaped punctuation (or any non-ASCII character): the character itself
    return i + 2


def _check_group(pattern: str, i: int) -> None:
    """A ``(?`` construct: let through only those Python reads as PCRE does."""
    rest = pattern[i + 2 :]
    if rest[:1] in (":", "=", "!", ">", "#") or rest[:2] in ("<=", "<!") or rest[:2] in ("P<", "P="):
        return
    if rest[:1] == "(":  # a condition: by group number or name, as Python has it
        if re.match(r"\((?:\d+|[A-Za-z_]\w*)\)", rest):
            return
        raise _refuse(pattern, "a condition other than a group's number or name")
    flags = re.match(r"([a-zA-Z]*)(?:-([a-zA-Z]*))?([:)])", rest)
    if flags is None:
        raise _refuse(pattern, f"the group (?{rest[:2]}")
    letters = (flags.group(1) or "") + (flags.group(2) or "")
    bad = set(letters) - set("ims")
    if bad:
        raise _refuse(pattern, f"the inline option(s) {''.join(sorted(bad))} (only i, m, s are taken inline)")
