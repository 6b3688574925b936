"""Canonical (lossless) MongoDB Extended JSON for values kept in checkpoints and reports."""

from __future__ import annotations

import json
from typing import Any

from bson import json_util
from bson.codec_options import DatetimeConversion
from bson.json_util import JSONMode, JSONOptions
from bson.raw_bson import RawBSONDocument

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
