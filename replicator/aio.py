"""Small asyncio pieces shared by the readers: a task that drains an async iterator into a bounded
queue, and a get that raises that task's error instead of waiting forever."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

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
