"""The embedded default engine: the whole pipeline in one process on asyncio (:mod:`.engine`). Its loops
are the driver's (:mod:`replicator.engines.driver`), the snapshot copy's (:mod:`replicator.snapshot.copy`)
and the replay's (:mod:`replicator.replay.loop`, :mod:`replicator.replay.streaming`), which the Spark
engine's driver runs too."""
