"""The asyncio engine as the job drives it: the driver (:class:`replicator.engines.driver.Driver`) does
everything, in this process."""

from __future__ import annotations

from replicator.engines.driver import Driver


class AsyncioEngine(Driver):
    """The embedded default: copies, replay and writes all on this process's event loop."""
