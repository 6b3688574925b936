"""What a run did: the summary printed at its end (lines for a person, or JSON with --json)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bson.timestamp import Timestamp

from replicator.events import ts_to_json
from replicator.observe.tally import average, format_rate, format_ts, listing, plural


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
    #: namespaces this run copied again from the source, and those whose indexes and options it made the
    #: source's (the DDL window, a collection renamed into the selection, a widened selection)
    recopied: list[str] = field(default_factory=list)
    reconciled: list[str] = field(default_factory=list)
    #: "source" or "target": the run was stopped while it waited for that server, never having reached it
    never_reached: str | None = None
    #: documents an earlier run had copied of the partitions this run's resumed snapshot went on with
    copied_before: int = 0

    @property
    def docs_per_s(self) -> float | None:
        return average(self.documents, self.snapshot_s)

    @property
    def events_per_s(self) -> float | None:
        return average(self.events, self.replay_s)

    def to_json(self) -> dict[str, Any]:
        """The summary as JSON; a rate is left out when nothing was timed (no copy, no replay)."""
        data = dict(self.__dict__)
        data["snapshot_s"], data["replay_s"] = round(self.snapshot_s, 3), round(self.replay_s, 3)
        for name, rate in (("docs_per_s", self.docs_per_s), ("events_per_s", self.events_per_s)):
            if rate is not None:
                data[name] = round(rate, 1)
        data["position"] = ts_to_json(self.position)
        return data

    def lines(self) -> list[str]:
        """The summary a person reads at the end of a run."""
        copied = f"{plural(self.documents, 'document')} copied (snapshot {self.snapshot}"
        if self.copied_before:
            copied += f", after {self.copied_before:,} an earlier run copied"
        if self.docs_per_s is not None and self.documents:
            copied += f", {format_rate(self.docs_per_s)} docs/s"
        replayed = f"{plural(self.events, 'change event')} replayed"
        if self.events_per_s is not None:
            replayed += f" in {self.replay_s:.1f} s ({format_rate(self.events_per_s)} events/s)"
        lines = [
            f"{self.command} finished in {self.elapsed_s:.1f} s: {plural(self.collections, 'collection')}, "
            f"{copied}), {replayed}",
        ]
        if self.never_reached is not None:
            lines = [
                f"{self.command} stopped after {self.elapsed_s:.1f} s waiting for the {self.never_reached}, which "
                "never answered: nothing was replicated (check its URI and that it is up, then run again)"
            ]
        if self.recopied:
            lines.append(f"copied again from the source: {listing(self.recopied, 20)}")
        if self.reconciled:
            lines.append(f"indexes and options made the source's: {listing(self.reconciled, 20)}")
        return [
            *lines,
            f"source {self.source} -> target {self.target}",
            f"checkpoint {self.checkpoint}, position {format_ts(self.position) if self.position else '-'}",
        ]
