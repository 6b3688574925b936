"""The readers' small asyncio pieces: a pump stopped for sure, and its error never left unread."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import AsyncIterator

from replicator.source.pump import pump, read_ahead, stop_pumps


async def _swallows_one_cancellation() -> AsyncIterator[int]:
    """A source whose call below swallowed the cancellation it was interrupted by (as a driver's call can),
    then hands out one more item."""
    n = 0
    while True:
        with contextlib.suppress(asyncio.CancelledError):  # swallowed below the pump: the pump goes on
            await asyncio.sleep(3600)  # a getMore waiting for the server
        yield n
        n += 1


async def test_a_pump_whose_cancellation_was_swallowed_still_stops() -> None:
    queue: asyncio.Queue[object] = asyncio.Queue(maxsize=1)
    queue.put_nowait("unread")  # full: the consumer stopped reading
    task = asyncio.create_task(pump(_swallows_one_cancellation(), queue))
    await asyncio.sleep(0.01)
    # a cancel and a wait would hang: the pump takes the swallowed cancellation, gets an item and waits on
    # its full queue, which nobody reads
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=0.5)
    assert not done
    await asyncio.wait_for(stop_pumps([task], [queue]), timeout=10)
    assert task.done()


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
