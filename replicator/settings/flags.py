"""How the option table (options.py) becomes typer flags: each option's parameter, the --config flag, the
help's option panels, example and exit codes."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperCommand, TyperGroup, TyperOption

from replicator.errors import EXIT_UNAVAILABLE
from replicator.settings.config import Settings, field_kind
from replicator.settings.options import BY_FIELD, ENV_CONFIG, PANELS, Option

_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Settings)}
_METAVARS = {int: "INTEGER", float: "NUMBER", str: "TEXT", Path: "PATH", tuple: "TEXT"}
CONFIG = inspect.Parameter(
    "config",
    inspect.Parameter.KEYWORD_ONLY,
    default=None,
    annotation=Annotated[
        Path | None,
        typer.Option(
            "--config",
            metavar="PATH",
            help=f"TOML file of settings, keys named like the flags ({ENV_CONFIG} names one too). "
            "Flags win over MCDC_* variables, which win over the file.",
        ),
    ],
)


def parameter(option: Option, command: str) -> inspect.Parameter:
    """One typer option of ``mcdc COMMAND``. Values stay text: resolve.resolve parses flags, MCDC_*
    variables and the config file alike, so a bad value reads the same whichever way it came."""
    kind = field_kind(option.field)
    names = [option.flag, *option.aliases, *([option.short] if option.short else [])]
    default = _DEFAULTS[option.field]
    if kind is bool and default is True:
        names[0] += f"/--no-{option.name}"
    annotation: Any = bool if kind is bool else list[str] if kind is tuple else str
    info = typer.Option(
        *names,
        help=option.help_on(command) + shown(default),
        metavar=None if kind is bool else option.metavar or _METAVARS[kind],
        show_default=False,
    )
    keyword = inspect.Parameter.KEYWORD_ONLY
    return inspect.Parameter(option.field, keyword, default=None, annotation=Annotated[annotation | None, info])


def shown(default: Any) -> str:
    """`` [default: 4]`` for a help text; nothing for flags, lists and options without a default."""
    if default is None or default is dataclasses.MISSING or isinstance(default, bool) or default in ((), ""):
        return ""
    return f" [default: {default:g}]" if isinstance(default, float) else f" [default: {default}]"


#: Every exit code of the commands that take options, for their --help (docs/reference/exit-codes.md says the same).
EXIT_CODES = (
    (0, "done (verify: identical)"),
    (1, "verify found differences"),
    (2, "a mistake to fix: a bad option or URI, a refused login, a bad checkpoint"),
    (3, "another mcdc holds the checkpoint's lock"),
    (4, "the checkpoint's position left the source's oplog (see --on-history-lost)"),
    (5, "cutover refused: the source took writes while it checked"),
    (EXIT_UNAVAILABLE, "an outage: a server unreachable (past --max-retries); run again later"),
    (130, "interrupted (Ctrl-C, or SIGTERM of sync and catch-up): run it again to go on"),
)
EXIT_CODES_HELP = "\n\nExit codes:\n\n\b\n" + "\n".join(f"  {code:<4} {text}" for code, text in EXIT_CODES)


class _TextOption(TyperOption):
    """An option of the table, or --config: its value reaches the command as the command line gave it (text,
    texts, a flag's bool, or None), for resolve to parse as it parses MCDC_* and the config file. typer's
    own coercion builds a pydantic TypeAdapter for each option on every run: about 0.1 s of CPU, spent
    before a catch-up with nothing to do has begun."""

    def process_value(self, ctx: Any, value: Any) -> Any:
        if value is not None and self.type_descriptor.annotation is Path:
            value = Path(value)
        return value if self.callback is None else self.callback(ctx, self, value)


def _as_given(params: list[Any], names: Any) -> None:
    for param in params:
        if type(param) is TyperOption and param.name in names:
            param.__class__ = _TextOption  # the same object, without typer's coercion


class _HelpAsGiven:
    """-h/--help (made when first asked for) is a flag passed on as given too."""

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)  # type: ignore[misc]
        _as_given([option], {"help"})
        return option


class PanelCommand(_HelpAsGiven, TyperCommand):
    """A command whose --help lists its options in panels (options.PANELS), most used first."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _as_given(self.params, {*BY_FIELD, CONFIG.name})

    def format_options(self, ctx: Any, formatter: Any) -> None:
        panels: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                option = BY_FIELD.get(param.name or "")
                panels.setdefault(option.panel if option is not None else GENERAL, []).append(record)
        for panel in (*PANELS, GENERAL):
            if panel in panels:
                with formatter.section(panel):
                    formatter.write_dl(panels[panel])


class FlagGroup(_HelpAsGiven, TyperGroup):
    """mcdc itself: its one option (--version, a flag) is passed on as given, like the commands' options."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _as_given(self.params, {"version"})


GENERAL = "General"


def epilog(example: str, heading: str = "Example") -> str:
    """A command's example for its help: each command line indented, a line continuing one that ends in
    a backslash indented more."""
    lines = [line.strip() for line in example.splitlines()]
    shown = [("      " if n and lines[n - 1].endswith("\\") else "  ") + line for n, line in enumerate(lines)]
    return f"{heading}:\n\n\b\n" + "\n".join(shown)  # "\b": click leaves the example's lines as they are
