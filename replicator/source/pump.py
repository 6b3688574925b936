"""Small asyncio pieces shared by the readers: a task that drains an async iterator into a bounded
queue, a get that raises that task's error instead of waiting forever, a stop that ends such tasks
for sure, and :func:`read_ahead`, which reads a source ahead of its consumer through them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable
from typing import Any, TypeVar, cast

T = TypeVar("T")

#: Put after an iterator's last item.
DONE = object()


async def pump(source: AsyncIterator[Any], queue: asyncio.Queue[object]) -> None:
    """Put every item of ``source`` on ``queue`` (waiting while it is full), then DONE."""
    async for item in source:
        await queue.put(item)
    await queue.put(DONE)


async def get_or_raise(queue: asyncio.Queue[object], producer: asyncio.Task[None]) -> object:
    """The next item; when the producer failed first, its error."""
    getter = asyncio.ensure_future(queue.get())
    await asyncio.wait({getter, producer}, return_when=asyncio.FIRST_COMPLETED)
    if getter.done():
        return getter.result()
    getter.cancel()
    producer.result()  # raises the producer's error
    return await queue.get()  # it finished normally: its last items are queued


async def stop_pumps(tasks: Iterable[asyncio.Task[None]], queues: Iterable[asyncio.Queue[object]]) -> None:
    """Cancel ``pump`` tasks and wait for them to end. A cancellation can be swallowed below the pump (in
    a driver's call it interrupted), and the pump then goes on to wait on its full queue, which nobody
    reads any more: so the queues are emptied and the tasks cancelled again until they have ended."""
    tasks, queues = list(tasks), list(queues)
    while pending := [task for task in tasks if not task.done()]:
        for task in pending:
            task.cancel()
        for queue in queues:
            while not queue.empty():
                queue.get_nowait()
        await asyncio.wait(pending, timeout=0.1)
    for task in tasks:  # collect their errors: nobody reads them
        if not task.cancelled():
            task.exception()


class _Room:
    """How much a weighed read-ahead queue holds: the reader waits for room, the consumer makes it."""

    def __init__(self, most: int) -> None:
        self.most = max(most, 1)
        self.held = 0
        self._freed = asyncio.Event()

    async def take(self, weight: int) -> None:
        """Wait until ``weight`` more fits (an empty queue takes any one item, however heavy)."""
        while self.held and self.held + weight > self.most:
            self._freed.clear()
            await self._freed.wait()
        self.held += weight

    def free(self, weight: int) -> None:
        self.held -= weight
        self._freed.set()


async def _pump_weighed(
    source: AsyncIterator[Any], queue: asyncio.Queue[object], room: _Room, weigh: Callable[[Any], int]
) -> None:
    async for item in source:
        await room.take(weigh(item))
        queue.put_nowait(item)
    queue.put_nowait(DONE)


async def read_ahead(
    source: AsyncIterator[T],
    maxsize: int,
    join: Callable[[T, T], T | None] | None = None,
    *,
    weigh: Callable[[T], int] | None = None,
) -> AsyncGenerator[T, None]:
    """Iterate ``source`` from a separate task through a queue of ``maxsize`` items: reading overlaps the
    consumer's writes, and runs ahead of them by at most ``maxsize`` items (backpressure). The source's
    error is raised here; closing the generator cancels the reading task (a consumer that may leave its loop by an
    exception closes it with ``contextlib.aclosing``: the garbage collector would keep the task alive until it
    finalized the generator, and asyncio then reports a task destroyed while pending). ``join(a, b)``: items already
    waiting in the queue are joined to the one taken while it returns them as one (None: not these).
    ``weigh(item)``: the queue holds items up to ``maxsize`` of their total weight instead (and always one)."""
    room = _Room(maxsize) if weigh is not None else None
    queue: asyncio.Queue[object] = asyncio.Queue(maxsize=0 if room is not None else max(maxsize, 1))
    if room is not None and weigh is not None:
        producer = asyncio.create_task(_pump_weighed(source, queue, room, weigh))
    else:
        producer = asyncio.create_task(pump(source, queue))

    def taken(item: object) -> object:
        if room is not None and weigh is not None and item is not DONE:
            room.free(weigh(cast(T, item)))
        return item

    held: object | None = None  # taken from the queue, not joinable to the item before it
    try:
        while True:
            item = held if held is not None else taken(await get_or_raise(queue, producer))
            held = None
            if item is DONE:
                break
            while join is not None and not queue.empty():
                after = taken(queue.get_nowait())
                both = join(cast(T, item), cast(T, after)) if after is not DONE else None
                if both is None:
                    held = after
                    break
                item = both
            yield cast(T, item)
        await producer
    finally:  # also when the producer failed just as this consumer was cancelled: its error is collected
        await stop_pumps([producer], [queue])
