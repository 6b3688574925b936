"""Small asyncio pieces shared by the readers: :class:`Pump`, a task that drains an async iterator into a
bounded buffer whose ``get`` raises that task's error instead of waiting forever, :func:`stop_pumps`, which
ends such tasks for sure, and :func:`read_ahead`, which reads a source ahead of its consumer through one."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable
from typing import Any, TypeVar, cast

T = TypeVar("T")

#: Handed out after an iterator's last item.
DONE = object()


def _one(_item: Any) -> int:
    return 1


class _Room:
    """How much a pump's buffer holds: the pump waits for room, the consumer makes it."""

    def __init__(self, most: int) -> None:
        self.most = max(most, 1)
        self.held = 0
        self._freed = asyncio.Event()

    async def take(self, weight: int) -> None:
        """Wait until ``weight`` more fits (an empty buffer takes any one item, however heavy)."""
        while self.held and self.held + weight > self.most:
            self._freed.clear()
            await self._freed.wait()
        self.held += weight

    def free(self, weight: int) -> None:
        self.held -= weight
        self._freed.set()


class Pump:
    """A task that puts every item of ``source`` in a buffer (then DONE), waiting while the buffer holds
    ``most`` items, or ``most`` of their total ``weigh``-t (and always one); and the consumer's end of it.

    The consumer waits in :meth:`get` in its own task, on an event that the pump's items and the pump's end
    set, and takes the item only once awake. A consumer cancelled while it waits leaves nothing behind: a
    helper task waiting on a queue for it would take the next item when it came, and that item would be lost
    to the consumer's next ``get`` (a change stream's reader outlives the runs that read from it)."""

    def __init__(self, source: AsyncIterator[Any], most: int, weigh: Callable[[Any], int] = _one) -> None:
        self._items: deque[tuple[object, int]] = deque()
        self._room = _Room(most)
        self._weigh = weigh
        self._ready = asyncio.Event()
        self.task = asyncio.create_task(self._run(source))
        self.task.add_done_callback(lambda _task: self._ready.set())

    async def _run(self, source: AsyncIterator[Any]) -> None:
        async for item in source:
            weight = self._weigh(item)
            await self._room.take(weight)
            self._items.append((item, weight))
            self._ready.set()
        self._items.append((DONE, 0))
        self._ready.set()

    def __len__(self) -> int:
        """Items waiting to be taken (DONE included)."""
        return len(self._items)

    def get_nowait(self) -> object:
        """The next waiting item (IndexError: none)."""
        item, weight = self._items.popleft()
        self._room.free(weight)
        return item

    async def get(self) -> object:
        """The next item (DONE after the last); when the pump failed first, its error."""
        while not self._items:
            if self.task.done():
                self.task.result()  # raises its error, or CancelledError when it was stopped
                raise AssertionError("a pump ended without DONE")  # pragma: no cover
            self._ready.clear()
            await self._ready.wait()
        return self.get_nowait()

    def drop(self) -> None:
        """Let go of every waiting item (a pump waiting for room goes on)."""
        while self._items:
            self.get_nowait()


async def stop_pumps(pumps: Iterable[Pump]) -> None:
    """Cancel the pumps' tasks and wait for them to end. A cancellation can be swallowed below a pump (in a
    driver's call it interrupted), and the pump then goes on to wait for room in its full buffer, which nobody
    reads any more: so the buffers are emptied and the tasks cancelled again until they have ended."""
    pumps = list(pumps)
    while pending := [p.task for p in pumps if not p.task.done()]:
        for task in pending:
            task.cancel()
        for p in pumps:
            p.drop()
        await asyncio.wait(pending, timeout=0.1)
    for p in pumps:  # collect their errors: nobody reads them
        if not p.task.cancelled():
            p.task.exception()


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
    ahead = Pump(source, maxsize, weigh) if weigh is not None else Pump(source, maxsize)
    held: object | None = None  # taken from the queue, not joinable to the item before it
    try:
        while True:
            item = held if held is not None else await ahead.get()
            held = None
            if item is DONE:
                break
            while join is not None and len(ahead):
                after = ahead.get_nowait()
                both = join(cast(T, item), cast(T, after)) if after is not DONE else None
                if both is None:
                    held = after
                    break
                item = both
            yield cast(T, item)
        await ahead.task
    finally:  # also when the pump failed just as this consumer was cancelled: its error is collected
        await stop_pumps([ahead])
