"""Options whose rules read ``REGEX=DOCUMENT``: ``--filter 'REGEX=QUERY'`` and ``--shard-target 'REGEX=KEY'``.
Pure: no I/O.

REGEX is matched against a source's whole ``db.collection``, as ``--include``'s patterns are; DOCUMENT is a
JSON object in MongoDB Extended JSON, canonical or relaxed, as mongosh and mongoexport write it. The rule
is split at the first ``=`` that a JSON object follows, so a regex may hold ``=`` itself.
"""

from __future__ import annotations

import re
from typing import Any

from bson import json_util
from bson.errors import BSONError
from bson.json_util import JSONOptions

from replicator.errors import ConfigError, quoted

_FORM = re.compile(r"(?s)(.*?)=\s*(\{.*)")
_JSON = JSONOptions(document_class=dict)


def regex_and_document(flag: str, rule: str, shape: str, example: str) -> tuple[re.Pattern[str], dict[str, Any]]:
    """``rule`` (a value of ``flag``) read as REGEX=DOCUMENT. ``shape`` names its parts for the user
    (``"REGEX=QUERY"``) and ``example`` shows one; a rule that is not one is a one-line ConfigError."""
    named = f"{flag} {quoted(rule)}"
    found = _FORM.fullmatch(rule.strip())
    if found is None or not found.group(1).strip():
        raise ConfigError(f"{named} must look like {shape}, e.g. {example}")
    regex, text = found.group(1).strip(), found.group(2)
    document = shape.partition("=")[2]
    try:
        pattern = re.compile(regex)
    except re.error as exc:
        raise ConfigError(f"{named}: {quoted(regex)} is not a valid regular expression: {exc}") from None
    try:
        value = json_util.loads(text, json_options=_JSON)
    except (ValueError, TypeError, KeyError, ArithmeticError, BSONError) as exc:  # a bad $oid, $numberDecimal...
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"{named}: {document} is not valid Extended JSON: {detail}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{named}: {document} must be a JSON object")
    return pattern, value
