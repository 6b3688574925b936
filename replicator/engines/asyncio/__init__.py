"""The embedded default engine: the whole pipeline in one process on asyncio.

* :mod:`.pipeline`: the snapshot's workers (partitions copied at once, batches in flight bounded) and
  the replay's read-ahead queue;
* :mod:`.streaming`: the replay's acknowledgements (a batch's position saved once the sink acked it);
* :mod:`.engine`: what the job drives (:class:`replicator.engines.base.Engine`).
"""
