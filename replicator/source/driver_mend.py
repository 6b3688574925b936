"""A mend for pymongo's asyncio client on Python 3.11, where a cancelled operation can leave a client's lock
held for ever, and every later operation of that client waits on it.

pymongo waits on its conditions (a server to select, a connection of the pool) with
``asyncio.wait_for(condition.wait(), timeout)``. On Python 3.11, ``wait_for`` runs ``condition.wait()`` as a
task of its own. When the task that called it is cancelled a second time while that inner task re-takes the
condition's lock (as a wait must, even when cancelled), ``wait_for`` returns without it; the caller leaves its
``async with lock`` and releases a lock it does not hold, and the inner task then takes the lock, which nobody
releases. Seen in a tail after a target outage: its writes, the client's monitor and its periodic tasks all
waited on the target's topology lock, and the tail replicated nothing more, silently
(tests/test_driver_mend.py reproduces it with pymongo's own lock and condition). Python 3.12's ``wait_for``
waits in the calling task, as the mend does with ``asyncio.timeout``: the lock is re-taken by the task that
holds it, whatever cancels it."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

#: pymongo's modules that wait on a condition through ``_async_cond_wait`` (imported there by name)
_WAITERS = ("pymongo.lock", "pymongo.asynchronous.topology", "pymongo.asynchronous.pool")
#: pymongo's own functions, by module, where they were replaced (tests check they still need it)
replaced: dict[str, Any] = {}


async def cond_wait(condition: Any, timeout: float | None) -> bool:
    """pymongo's ``_async_cond_wait``, in the calling task: True when notified, False after ``timeout``; the
    condition's lock is held again on return, and when a cancellation is raised."""
    try:
        async with asyncio.timeout(timeout):
            return bool(await condition.wait())
    except TimeoutError:
        return False


def mend_pymongo() -> list[str]:
    """Put :func:`cond_wait` in pymongo's place where Python's ``wait_for`` needs it (before 3.12); the modules
    mended. A pymongo that no longer has the function is left as it is (tests/test_driver_mend.py says so)."""
    if sys.version_info >= (3, 12):
        return []
    import importlib

    mended = []
    for name in _WAITERS:
        module = importlib.import_module(name)
        own = getattr(module, "_async_cond_wait", None)
        if own is not None:
            if own is not cond_wait:
                replaced[name] = own
            module._async_cond_wait = cond_wait  # type: ignore[attr-defined]
            mended.append(name)
    return mended
