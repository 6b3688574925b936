"""The readers' small asyncio pieces: a pump stopped for sure."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from replicator.source.pump import pump, stop_pumps


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
