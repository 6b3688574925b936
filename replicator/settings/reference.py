"""The option table (options.py) as the documentation's reference page, so that the page cannot drift from
the table: the docs' build (scripts/docs_hooks.py) puts this Markdown where the page says ``{{ options }}``."""

from __future__ import annotations

import dataclasses
from typing import Any

from replicator.settings.config import Settings, field_kind
from replicator.settings.options import OPTIONS, PANELS, Option

_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Settings)}


def options_markdown() -> str:
    """Every option, panel by panel as ``--help`` lists them: flag, MCDC_* variable, TOML key, Spark data
    source option, default, the commands that take it, and its help."""
    parts = []
    for panel in PANELS:
        options = [o for o in OPTIONS if o.panel == panel]
        if not options:
            continue
        rows = [
            "| flag | environment | TOML key | Spark option | default | commands | help |",
            "|---|---|---|---|---|---|---|",
            *(_row(o) for o in options),
        ]
        parts.append(f"## {panel}\n\n" + "\n".join(rows))
    return "\n\n".join(parts) + "\n"


def _row(option: Option) -> str:
    flags = ", ".join(f"`{name}`" for name in (option.flag, *option.aliases, option.short) if name)
    values = f" Values: {', '.join(f'`{c}`' for c in option.choices)}." if option.choices else ""
    cells = (
        flags,
        f"`{option.env}`",
        f"`{option.name}`",
        f"`{option.name}`",
        _default(_DEFAULTS[option.field]),
        ", ".join(option.commands),
        _cell(option.help) + values + _repeatable(option),
    )
    return "| " + " | ".join(cells) + " |"


def _repeatable(option: Option) -> str:
    """How a repeatable option's values are written in one string (MCDC_* and Spark options)."""
    if field_kind(option.field) is not tuple:
        return ""
    if option.commas:
        return " In one string: comma-separated, or a JSON array."
    return " In one string: one value, or a JSON array."


def _default(value: Any) -> str:
    """The default as ``--help`` shows it; flags say off or on, an option without one says so."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None or value is dataclasses.MISSING or value in ((), ""):
        return "-"
    return f"`{value:g}`" if isinstance(value, float) else f"`{value}`"


def _cell(text: str) -> str:
    """Help text as written, in its table cell: Markdown's special characters escaped, on one line."""
    for char in "\\`*_<[|":
        text = text.replace(char, "\\" + char)
    return text.replace("\n", " ")
