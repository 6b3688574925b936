"""The readers' small asyncio pieces: a pump stopped for sure, and its error never left unread."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import AsyncIterator

from replicator.source.pump import Pump, read_ahead, stop_pumps


async def _swallows_one_cancellation() -> AsyncIterator[int]:
    """A source whose call below swallowed the cancellation it was interrupted by (as a driver's call can),
    then hands out one more item."""
    yield 0
    n = 1
    while True:
        with contextlib.suppress(asyncio.CancelledError):  # swallowed below the pump: the pump goes on
            await asyncio.sleep(3600)  # a getMore waiting for the server
        yield n
        n += 1


async def test_a_pump_whose_cancellation_was_swallowed_still_stops() -> None:
    stuck = Pump(_swallows_one_cancellation(), 1)
    await asyncio.sleep(0.01)  # its first item fills it (the consumer stopped reading); it waits on its source
    # a cancel and a wait would hang: the pump takes the swallowed cancellation, gets an item and waits for
    # room in its full buffer, which nobody reads
    stuck.task.cancel()
    done, _ = await asyncio.wait({stuck.task}, timeout=0.5)
    assert not done
    await asyncio.wait_for(stop_pumps([stuck]), timeout=10)
    assert stuck.task.done()


async def test_a_read_ahead_whose_reader_failed_as_its_consumer_was_cancelled_leaves_no_error_unread() -> None:
    """A snapshot reads partitions side by side: when two fail at once, one consumer is cancelled by the other's
    error just as its own reader fails. That reader's error must be collected, not logged by asyncio as "Task
    exception was never retrieved" (with a traceback) when the task is collected."""
    unread: list[dict[str, object]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _loop, context: unread.append(context))
    gate = asyncio.Event()

    async def fails_when_let() -> AsyncIterator[int]:
        await gate.wait()
        raise RuntimeError("PrimarySteppedDown")
        yield 0  # pragma: no cover  (an async generator)

    async def consume() -> None:
        async with contextlib.aclosing(read_ahead(fails_when_let(), 4)) as ahead:
            async for _ in ahead:
                pass

    consumer = asyncio.create_task(consume())
    await asyncio.sleep(0.01)  # the consumer waits on the reader
    gate.set()
    await asyncio.sleep(0)  # the reader runs and fails; the consumer has not yet been woken
    consumer.cancel()  # a sibling's error cancels it
    with contextlib.suppress(asyncio.CancelledError):
        await consumer
    gc.collect()
    await asyncio.sleep(0)
    assert not unread, unread


async def test_a_consumer_cancelled_while_it_waits_leaves_nothing_behind_and_the_next_get_loses_no_item() -> None:
    """A change stream's reader outlives one ``batches()`` (it reads ahead into the next run). A ``batches()``
    cancelled while it waits on the reader (its replay failed on the target) must leave no task waiting on the
    queue: such a task took the next reply from the next run, and asyncio later logged it "destroyed but
    pending" (seen in a tail that stopped replicating after a target outage)."""
    gate = asyncio.Event()

    async def source() -> AsyncIterator[int]:
        await gate.wait()
        for n in range(3):
            yield n

    reader = Pump(source(), 4)
    before = asyncio.all_tasks()
    waiting = asyncio.create_task(reader.get())
    await asyncio.sleep(0.01)  # it waits on the reader
    waiting.cancel()
    await asyncio.wait({waiting})
    left = {t for t in asyncio.all_tasks() - before if t is not waiting and not t.done()}
    assert not left, f"left waiting: {left}"
    gate.set()
    assert [await reader.get() for _ in range(3)] == [0, 1, 2]
    await stop_pumps([reader])
