"""What a run did: the summary printed at its end (lines for a person, or JSON with --json)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bson.timestamp import Timestamp

from replicator.events import ts_to_json
from replicator.observe.tally import average, format_rate, format_ts, listing, plural

#: where a run was stopped by a signal: what its first line says, and what the same command does next
STOPPED = {
    "start": ("before it began", "begin"),
    "snapshot": (
        "during the snapshot",
        "go on with the snapshot (collections finished are not copied again)",
    ),
    "window": (
        "after the snapshot's copy, before the changes made during it were replayed and the indexes built",
        "replay them and build the indexes (the copy is not made again)",
    ),
    "replay": ("before it replayed up to the source's time", "go on replaying from there"),
}


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
    #: of ``documents`` and ``snapshot_s``: what copying ``recopied`` again wrote, and its wall time
    recopied_documents: int = 0
    recopied_s: float = 0.0
    #: namespaces a copy again found gone from the source: dropped on the target, not copied
    dropped: list[str] = field(default_factory=list)
    #: "source" or "target": the run was stopped while it waited for that server, never having reached it
    never_reached: str | None = None
    #: documents an earlier run had copied of the partitions this run's resumed snapshot went on with
    copied_before: int = 0
    #: where a signal stopped the run short of its end (see :data:`STOPPED`); None when it ran to its end
    #: (a tail's stop in its replay is its end)
    stopped: str | None = None
    #: the snapshot's collections, of which ``collections`` were copied when it was stopped
    collections_planned: int = 0
    #: a line on how the run used its engine: a Spark catch-up over before Spark would have been up says so
    engine_note: str | None = None

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

    def _copies(self) -> list[str]:
        """What the copies did, each counted apart: the snapshot's collections and documents (or that it was
        skipped), the collections copied again, those dropped because the source no longer had them."""
        documents = self.documents - self.recopied_documents
        if self.snapshot == "stopped":
            copied = f"{plural(documents, 'document')} copied so far"
            rate = average(documents, self.snapshot_s - self.recopied_s)
            if rate is not None and documents:
                copied += f" ({format_rate(rate)} docs/s"
                copied += f", after {self.copied_before:,} an earlier run copied)" if self.copied_before else ")"
            elif self.copied_before:
                copied += f" (after {self.copied_before:,} an earlier run copied)"
            parts = [f"{self.collections} of {plural(self.collections_planned, 'collection')}, {copied}"]
        elif self.snapshot == "skipped" and not self.collections and not documents:
            parts = ["snapshot skipped"]
        else:
            copied = f"{plural(documents, 'document')} copied (snapshot {self.snapshot}"
            if self.copied_before:
                copied += f", after {self.copied_before:,} an earlier run copied"
            rate = average(documents, self.snapshot_s - self.recopied_s)
            if rate is not None and documents:
                copied += f", {format_rate(rate)} docs/s"
            parts = [f"{plural(self.collections, 'collection')}, {copied})"]
        if self.recopied:
            again = plural(self.recopied_documents, "document")
            rate = average(self.recopied_documents, self.recopied_s)
            if rate is not None and self.recopied_documents:
                again += f", {format_rate(rate)} docs/s"
            parts.append(f"{plural(len(self.recopied), 'collection')} copied again ({again})")
        if self.dropped:
            parts.append(f"{plural(len(self.dropped), 'collection')} dropped as on the source")
        return parts

    def lines(self) -> list[str]:
        """The summary a person reads at the end of a run."""
        replayed = f"{plural(self.events, 'change event')} replayed"
        if self.events_per_s is not None:
            replayed += f" in {self.replay_s:.1f} s ({format_rate(self.events_per_s)} events/s)"
        head = f"finished in {self.elapsed_s:.1f} s"
        if self.stopped is not None:
            head = f"stopped by a signal after {self.elapsed_s:.1f} s {STOPPED[self.stopped][0]}"
        lines = [f"{self.command} {head}: {', '.join([*self._copies(), replayed])}"]
        if self.never_reached is not None:
            lines = [
                f"{self.command} stopped after {self.elapsed_s:.1f} s waiting for the {self.never_reached}, which "
                "never answered: nothing was replicated (check its URI and that it is up, then run again)"
            ]
        if self.engine_note is not None:
            lines.append(self.engine_note)
        if self.recopied:
            lines.append(f"copied again from the source: {listing(self.recopied, 20)}")
        if self.dropped:
            lines.append(f"dropped as on the source (gone from it): {listing(self.dropped, 20)}")
        if self.reconciled:
            lines.append(f"indexes and options made the source's: {listing(self.reconciled, 20)}")
        if self.stopped is not None and self.never_reached is None:
            lines.append(
                f"the checkpoint holds what the target acknowledged: run the same command again to "
                f"{STOPPED[self.stopped][1]}"
            )
        return [
            *lines,
            f"source {self.source} -> target {self.target}",
            f"checkpoint {self.checkpoint}, position {format_ts(self.position) if self.position else '-'}",
        ]
