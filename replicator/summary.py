"""What a run did: the summary printed at its end (lines for a person, or JSON with --json)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bson.timestamp import Timestamp

from .events import ts_to_json
from .tally import format_rate, format_ts, per_second


@dataclass
class Summary:
    """What this run did (not earlier runs of the same checkpoint); printed as lines or, with --json, as JSON.

    ``documents``: written by this run's copies, failed attempts' included (they were written);
    ``events``: replayed by this run; ``snapshot_s``/``replay_s``: the wall time of the copies and of the
    replays, which the rates divide by; ``position``: the checkpoint's cluster time at the end."""

    command: str
    source: str
    target: str
    checkpoint: str
    collections: int = 0
    documents: int = 0
    events: int = 0
    snapshot: str = "skipped"
    elapsed_s: float = 0.0
    snapshot_s: float = 0.0
    replay_s: float = 0.0
    retries: int = 0
    position: Timestamp | None = None

    @property
    def docs_per_s(self) -> float | None:
        return per_second(self.documents, self.snapshot_s)

    @property
    def events_per_s(self) -> float | None:
        return per_second(self.events, self.replay_s)

    def to_json(self) -> dict[str, Any]:
        data = dict(self.__dict__)
        data["snapshot_s"], data["replay_s"] = round(self.snapshot_s, 3), round(self.replay_s, 3)
        data["docs_per_s"], data["events_per_s"] = _rounded(self.docs_per_s), _rounded(self.events_per_s)
        data["position"] = ts_to_json(self.position)
        return data

    def lines(self) -> list[str]:
        """The summary a person reads at the end of a run."""
        copied = f"{self.documents:,} documents copied (snapshot {self.snapshot}"
        if self.documents:
            copied += f", {format_rate(self.docs_per_s)} docs/s"
        replayed = f"{self.events:,} change events replayed"
        if self.replay_s:
            replayed += f" in {self.replay_s:.1f} s ({format_rate(self.events_per_s)} events/s)"
        return [
            f"{self.command} finished in {self.elapsed_s:.1f} s: {self.collections} collections, {copied}), {replayed}",
            f"source {self.source} -> target {self.target}",
            f"checkpoint {self.checkpoint}, position {format_ts(self.position) if self.position else '-'}",
        ]


def _rounded(rate: float | None) -> float | None:
    return None if rate is None else round(rate, 1)
