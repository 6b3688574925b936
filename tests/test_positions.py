"""Positions without a server: the total order of events and snapshot rows, and per-stream marks."""

from __future__ import annotations

from bson.timestamp import Timestamp

from replicator.events import ChangeEvent, Namespace, Op, Position
from replicator.events.positions import WHOLE_TIME, Mark, Numbering, Seq, advanced, seq_of, snapshot_position

NS = Namespace("d", "c")


def _ev(t: int, n: int, shard: str | None = None) -> ChangeEvent:
    return ChangeEvent(Op.INSERT, NS, {"_id": n}, position=Position({"_data": "x"}, Timestamp(t, 1), n, shard))


def test_positions_order_by_time_then_shard_then_place_and_snapshot_rows_come_first() -> None:
    a0, a1, b0 = _ev(5, 0, "a"), _ev(5, 1, "a"), _ev(5, 0, "b")
    snap = seq_of(snapshot_position(Timestamp(5, 1)))
    assert snap == Seq(5, 1, "", -1)
    keys = [seq_of(e.position) for e in (b0, a1, a0)]
    assert sorted([*keys, snap]) == [snap, seq_of(a0.position), seq_of(a1.position), seq_of(b0.position)]
    assert seq_of(Position({"_data": "idle"})) is None  # a post-batch token alone has no place


def test_numbering_starts_at_zero_from_a_time_and_goes_on_after_a_saved_event() -> None:
    fresh = Numbering(Position(cluster_time=Timestamp(5, 1)))  # startAtOperationTime: its events from the first
    assert [fresh.next(Timestamp(5, 1)), fresh.next(Timestamp(5, 1)), fresh.next(Timestamp(6, 1))] == [0, 1, 0]
    resumed = Numbering(Position({"_data": "x"}, Timestamp(5, 1), 3))
    assert [resumed.next(Timestamp(5, 1)), resumed.next(Timestamp(7, 1))] == [4, 0]
    assert Numbering().next(None) is None


def test_a_mark_covers_each_streams_prefix_whatever_the_order_shards_were_merged_in() -> None:
    # a batch cut between two shards' events of one cluster time, shard b's taken first
    mark = advanced([_ev(5, 0, "b"), _ev(5, 0, "a")])
    assert mark is not None
    assert mark.covers(_ev(5, 0, "a")) and mark.covers(_ev(5, 0, "b")) and mark.covers(_ev(4, 9, "a"))
    assert not mark.covers(_ev(5, 1, "a"))  # the rest of shard a's transaction is still to be written
    assert not mark.covers(_ev(5, 0, "c"))  # a stream the table has not seen
    assert advanced([ChangeEvent(Op.DROP, NS)]) is None  # an event of mcdc's own, no position


def test_an_old_mark_of_a_cluster_time_alone_covers_every_event_at_that_time() -> None:
    old = Mark({}, (5, 1, WHOLE_TIME))
    assert old.covers(_ev(5, 7)) and old.covers(_ev(5, 0, "a")) and not old.covers(_ev(6, 0))
    assert not Mark() and Mark({"": (1, 1, 0)})
