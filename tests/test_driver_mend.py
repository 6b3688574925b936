"""replicator/source/driver_mend.py: a pymongo operation cancelled twice while it waits for a server must not
leave its client's lock held (a tail stopped replicating after a target outage: every write, the client's
monitor and its periodic tasks waited on the target's topology lock)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from typing import Any

import pytest
from pymongo._asyncio_lock import Condition, Lock

from tests.support.servers import free_port


def _cond_wait_of(module_name: str) -> Any:
    import importlib

    import replicator.source.connection  # noqa: F401  (mends pymongo on import)

    return importlib.import_module(module_name)._async_cond_wait


async def _twice_cancelled(cond_wait: Any) -> tuple[bool, list[str]]:
    """A task waits on a condition through ``cond_wait`` inside ``async with lock``; another task holds the lock
    when the first is cancelled, then cancels it again as it releases the lock. Whether the lock is left held
    with nobody inside, and how the waiting task ended."""
    lock = Lock()
    condition = Condition(lock)
    ended: list[str] = []

    async def waits() -> None:  # server selection: pymongo's Topology._select_servers_loop
        try:
            async with lock:
                await cond_wait(condition, 0.5)
        except BaseException as exc:
            ended.append(type(exc).__name__)
            raise

    task = asyncio.create_task(waits())
    while not condition._waiters:  # it waits on the condition, the lock released
        await asyncio.sleep(0.001)
    await lock.acquire()  # a monitor updates the topology
    task.cancel()  # the wait is cancelled: it must take the lock again, and queues for it
    while not lock._waiters:
        await asyncio.sleep(0.001)
    task.cancel()  # cancelled again...
    lock.release()  # ...as the monitor lets go
    await asyncio.gather(task, return_exceptions=True)
    for _ in range(10):
        await asyncio.sleep(0)
    return lock.locked(), ended


@pytest.mark.parametrize("module", ["pymongo.asynchronous.topology", "pymongo.asynchronous.pool"])
async def test_a_wait_cancelled_twice_leaves_the_lock_free(module: str) -> None:
    held, ended = await _twice_cancelled(_cond_wait_of(module))
    assert not held, "the lock is held by nobody, for ever"
    assert ended == ["CancelledError"], ended


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="Python 3.12's wait_for waits in the calling task")
async def test_pymongo_s_own_wait_leaks_the_lock_on_this_python() -> None:
    """What the mend is for: pymongo's own function, as the installed release ships it, leaks the lock. When this
    fails, pymongo or Python changed: check whether the mend is still needed."""
    from replicator.source.driver_mend import replaced

    _cond_wait_of("pymongo.lock")  # mended, its own kept
    held, ended = await _twice_cancelled(replaced["pymongo.lock"])
    assert held and ended == ["RuntimeError"], (held, ended)


def test_the_mend_reaches_every_module_that_waits() -> None:
    from replicator.source.driver_mend import cond_wait, mend_pymongo

    mended = mend_pymongo()
    if sys.version_info >= (3, 12):
        assert mended == []
        return
    assert mended == ["pymongo.lock", "pymongo.asynchronous.topology", "pymongo.asynchronous.pool"]
    for name in mended:
        assert _cond_wait_of(name) is cond_wait


async def test_a_client_whose_server_selection_was_cancelled_twice_still_answers() -> None:
    """The same sequence on a real client of mcdc's, waiting to select a server that refuses connections: its
    next operation must fail in its server selection timeout, not wait on a lock for ever."""
    from pymongo.errors import ServerSelectionTimeoutError

    from replicator.source.connection import make_client

    client = make_client(f"mongodb://127.0.0.1:{free_port()}/?directConnection=true", timeout_s=5)
    topology: Any = None
    try:
        first = asyncio.create_task(client.db.c.find_one({}))
        while topology is None or not topology._condition._waiters:
            await asyncio.sleep(0.01)
            topology = client._topology
        lock = topology._lock
        await lock.acquire()
        first.cancel()
        while not lock._waiters:
            await asyncio.sleep(0.001)
        first.cancel()
        lock.release()
        await asyncio.gather(first, return_exceptions=True)
        with pytest.raises(ServerSelectionTimeoutError):
            await asyncio.wait_for(client.db.c.find_one({}), 30)  # a leaked lock: TimeoutError
    finally:
        with contextlib.suppress(TimeoutError):  # closing needs the lock too
            await asyncio.wait_for(client.close(), 10)
