"""BatchAssembler without a server: raw change documents and empty polls in, Batches out."""

from __future__ import annotations

import logging
from typing import Any

import bson
import pytest
from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp

from replicator.events import Position
from replicator.source.batching import OVERSIZE_FLAG, BatchAssembler, Fragments


def token(secs: int, inc: int = 1) -> dict[str, str]:
    """A resume token whose KeyString starts with the cluster time (secs, inc)."""
    return {"_data": f"82{secs:08X}{inc:08X}2B0229"}


def change(_id: int, secs: int, txn: int | None = None, **extra: Any) -> RawBSONDocument:
    """A raw insert change document at cluster time (secs, 1), in transaction ``txn`` when given."""
    doc: dict[str, Any] = {
        "_id": token(secs),
        "operationType": "insert",
        "clusterTime": Timestamp(secs, 1),
        "ns": {"db": "shop", "coll": "orders"},
        "documentKey": {"_id": _id},
        "fullDocument": {"_id": _id},
    }
    if txn is not None:
        doc["lsid"] = {"id": bson.Binary(b"\x01" * 16, 4)}
        doc["txnNumber"] = bson.Int64(txn)
    doc.update(extra)
    return RawBSONDocument(bson.encode(doc))


def ids(batch: Any) -> list[int]:
    return [e.key["_id"] for e in batch.events]


def test_split_event_fragments_arrive_as_one_event() -> None:
    assembler = BatchAssembler(batch_size=10)
    whole = change(1, 100)
    fragment_1 = {"_id": token(100, 1), "splitEvent": {"fragment": 1, "of": 2}}
    fragment_1.update((k, whole[k]) for k in ("operationType", "clusterTime", "ns", "documentKey"))
    fragment_2 = {"_id": token(100, 2), "splitEvent": {"fragment": 2, "of": 2}, "fullDocument": {"_id": 1, "a": 1}}
    assert not assembler.add(fragment_1)
    assert assembler.nothing_more(token(100, 1))  # the server paused between the fragments
    idle = assembler.take()
    assert idle.caught_up and not idle.events and not idle.position  # the token is past the first fragment
    assembler.add(fragment_2)
    assert assembler.nothing_more(token(100, 2))
    (event,) = assembler.take().events
    assert event.document == {"_id": 1, "a": 1} and dict(event.key) == {"_id": 1}
    assert event.position == Position(
        resume_token=token(100, 2), cluster_time=Timestamp(100, 1), index=0
    )  # the last _id


def test_raw_fragments_and_whole_events_marked_one_of_one() -> None:
    """Fragments that arrive as raw bytes are merged as before; an event marked as fragment 1 of 1 (a
    whole event: some servers mark every event when the split stage is on) is the same event unmarked."""
    assembler = BatchAssembler(batch_size=10)
    marked = change(1, 100, splitEvent={"fragment": 1, "of": 1})
    whole = change(1, 100)
    first = RawBSONDocument(bson.encode({**{k: whole[k] for k in whole if k != "fullDocument"},
                                         "splitEvent": {"fragment": 1, "of": 2}}))  # fmt: skip
    second = RawBSONDocument(bson.encode({"_id": token(101), "splitEvent": {"fragment": 2, "of": 2},
                                          "fullDocument": {"_id": 2, "big": "x"}}))  # fmt: skip
    assembler.add(marked)
    assembler.add(first)
    assembler.add(second)
    assert assembler.nothing_more(token(101))
    one, merged = assembler.take().events
    assert one == BatchAssembler(batch_size=1)._event(whole)
    assert merged.document is not None and dict(merged.document) == {"_id": 2, "big": "x"}
    assert merged.position is not None
    assert dict(merged.position.resume_token or {}) == token(101)


def test_a_pending_fragment_is_never_acknowledged_and_outlives_the_run() -> None:
    fragments = Fragments()
    first = BatchAssembler(batch_size=10, until=Timestamp(50, 1), fragments=fragments)
    assert not first.add({"_id": token(60), "splitEvent": {"fragment": 1, "of": 2}, "operationType": "insert"})
    assert first.nothing_more(token(60))  # the stream reached `until`
    batch = first.take()
    assert batch.caught_up and not batch.events and not batch.position  # the token is past the fragment
    assert first.finished and fragments
    second = BatchAssembler(batch_size=10, fragments=fragments)
    second.add({"_id": token(60, 2), "splitEvent": {"fragment": 2, "of": 2}, "clusterTime": Timestamp(60, 1),
                "ns": {"db": "shop", "coll": "orders"}, "documentKey": {"_id": 7}})  # fmt: skip
    second.nothing_more(token(60, 2))
    assert ids(second.take()) == [7] and not fragments


def test_until_finishes_a_transaction_already_begun() -> None:
    assembler = BatchAssembler(batch_size=10, until=Timestamp(100, 1))
    assembler.add(change(1, 100, txn=5))
    # the transaction's later operations carry later times in a sharded cluster: still part of this run
    assert not assembler.add(change(2, 101, txn=5))
    assert assembler.add(change(3, 102))  # past `until` and outside the transaction: the run ends
    batch = assembler.take()
    assert ids(batch) == [1, 2] and batch.position.cluster_time == Timestamp(101, 1)
    assert assembler.finished


def test_an_event_past_until_is_held_back_and_never_acknowledged() -> None:
    assembler = BatchAssembler(batch_size=10, until=Timestamp(100, 1))
    assert assembler.add(change(1, 200))
    batch = assembler.take()
    assert not batch.events and not batch.position  # the stream's token is already past that event
    assert assembler.finished


def test_batch_size_cuts_only_at_a_transaction_boundary() -> None:
    assembler = BatchAssembler(batch_size=2)
    assert not assembler.add(change(1, 100))
    assert not assembler.add(change(2, 101, txn=7))
    assert not assembler.add(change(3, 101, txn=7))  # full, but inside the transaction
    assert assembler.add(change(4, 102))  # the first event after it is held back
    batch = assembler.take()
    assert ids(batch) == [1, 2, 3] and not assembler.finished
    assert not assembler.empty  # the held event starts the next batch
    assembler.nothing_more(token(103))
    assert ids(assembler.take()) == [4]


def test_a_drained_reply_closes_the_batch_outside_a_transaction() -> None:
    assembler = BatchAssembler(batch_size=10)
    assert not assembler.add(change(1, 100, txn=3), drained=True)  # a transaction may go on in the next reply
    assert assembler.add(change(2, 101), drained=True)
    assert ids(assembler.take()) == [1, 2]


def test_an_idle_batch_acknowledges_the_post_batch_token_and_its_time() -> None:
    assembler = BatchAssembler(batch_size=10)
    assert assembler.nothing_more(token(300))
    batch = assembler.take(read_at=5.0, poll_started=4.0)
    assert batch.caught_up and not batch.events
    assert batch.position == Position(resume_token=token(300), cluster_time=Timestamp(300, 1))  # a KeyString's
    other = BatchAssembler(batch_size=10)
    other.nothing_more({"_data": "3b00ff"})  # a token of another layout: no time to read from it
    assert other.take().position == Position(resume_token={"_data": "3b00ff"})
    assert batch.read_at == 5.0 and batch.idle_since == 4.0
    assert not assembler.finished  # no `until`: forever


def test_the_run_goes_on_until_the_token_reaches_until() -> None:
    assembler = BatchAssembler(batch_size=10, until=Timestamp(300, 1))
    assert not assembler.nothing_more(token(200))  # behind `until`, nothing read: keep polling
    assert assembler.nothing_more(token(300))
    assert assembler.take().caught_up and assembler.finished


def test_a_batch_with_events_is_not_idle() -> None:
    assembler = BatchAssembler(batch_size=10, until=Timestamp(300, 1))
    assembler.add(change(1, 100))
    assert assembler.nothing_more(token(200))  # not caught up, but there is something to hand out
    batch = assembler.take(poll_started=1.0)
    assert ids(batch) == [1] and not batch.caught_up and batch.idle_since is None
    assert not assembler.finished


def test_oversize_skip_drops_the_marked_event_and_logs_it(caplog: pytest.LogCaptureFixture) -> None:
    assembler = BatchAssembler(batch_size=10)
    with caplog.at_level(logging.WARNING, logger="mcdc.source"):
        assert not assembler.add(change(1, 100, **{OVERSIZE_FLAG: True}))
    assert "skipped a change event over 16 MB" in caplog.text and "shop.orders" in caplog.text
    assembler.add(change(2, 101))
    assembler.nothing_more(token(102))
    assert ids(assembler.take()) == [2]


def test_events_of_one_cluster_time_are_numbered_in_stream_order_and_again_from_a_saved_place() -> None:
    """A transaction's events share a cluster time: each gets its place (``index``), the same when the
    stream is read again from any saved event of it, one inside the transaction included."""
    stream = [change(1, 100, txn=7), change(2, 100, txn=7), change(3, 100, txn=7), change(4, 101), change(5, 101)]
    whole = BatchAssembler(batch_size=100, shard="shard-a")
    for raw in stream:
        whole.add(raw)
    whole.nothing_more(None)
    events = whole.take().events
    assert [(e.position.cluster_time.time, e.position.index) for e in events] == [
        (100, 0), (100, 1), (100, 2), (101, 0), (101, 1),
    ]  # fmt: skip
    assert {e.position.shard for e in events} == {"shard-a"}
    for saved in range(len(events)):
        from replicator.events.positions import Numbering

        again = BatchAssembler(batch_size=100, shard="shard-a", numbering=Numbering(events[saved].position))
        for raw in stream[saved + 1 :]:
            again.add(raw)
        again.nothing_more(None)
        assert [e.position for e in again.take().events] == [e.position for e in events[saved + 1 :]]


def test_an_idle_batch_joined_after_events_keeps_their_cluster_time() -> None:
    """The replay joins batches that wait in its read-ahead queue. An idle poll's post-batch token whose time
    cannot be read (the test server's tokens are not KeyString) joined after a batch of events: the joined
    batch's position takes the later token and keeps the last event's cluster time, as a batch acknowledged
    with one applied before it does (the shards' positions too). It kept no time: the checkpoint's token
    moved past the events while its cluster time stayed at an earlier batch's."""
    from replicator.events import ChangeEvent, Namespace, Op
    from replicator.source.batching import Batch, joined

    ns, last = Namespace("db", "c"), Position({"_data": "e"}, Timestamp(10, 5), 0)
    events = [ChangeEvent(Op.INSERT, ns, key={"_id": 1}, document={"_id": 1}, position=last)]
    first = Batch(events, last, caught_up=False, shard_positions={"a": last})
    later = Position({"_data": "later"})
    idle = Batch([], later, caught_up=True, shard_positions={"b": later})
    both = joined(first, idle, 10)
    assert both is not None and both.events == events and both.caught_up
    assert both.position == Position({"_data": "later"}, Timestamp(10, 5), 0)
    assert both.shard_positions == {"a": last, "b": later}
