"""The data source's options: mcdc's own option names (the CLI's long flags, parsed by the one option
table), plus the few that only the data source reads."""

from __future__ import annotations

from collections.abc import Mapping

from ..config import Settings, settings_from_strings
from ..errors import ConfigError

#: Options Spark itself hands to every data source, not ours to check.
SPARK_OWN = frozenset({"path", "checkpointlocation"})
#: The stream's start as an offset (offsets.py's JSON): the Spark engine passes mcdc's checkpoint position.
START_POSITIONS = "start-positions"
_OWN = frozenset({START_POSITIONS})


def settings_for(options: Mapping[str, str], need: str) -> Settings:
    """Settings from Spark's options, with the same one-line errors as the CLI (an unknown name is named,
    with the closest option). ``need``: "source" (readers) or "target" (writers)."""
    mcdc = {k: v for k, v in options.items() if k.lower() not in SPARK_OWN | _OWN}
    # command "status": the one that needs neither a source nor a target (a writer needs no source); the
    # one this role needs is checked below, and each URI given is still validated
    settings = settings_from_strings(mcdc, command="status")
    if not getattr(settings, need):
        raise ConfigError(f'no {need}: pass .option("{need}", "mongodb://...") to the mcdc data source')
    return settings
