"""The loops that run mcdc's pipeline. Both run the same stages (source, normalize, transform, sink,
checkpoint); only the loop differs.

* asyncio, the embedded default: the top-level modules :mod:`replicator.sync` (the job's order of
  phases), :mod:`replicator.pipeline` (the snapshot's workers and the replay's queue) and
  :mod:`replicator.streaming` (the replay's acknowledgements), in one process.
* spark (:mod:`replicator.engines.spark`): the same job, with snapshot partitions and verify ranges as
  Spark tasks and the replay as a Structured Streaming query over the ``mcdc`` data source
  (:mod:`replicator.spark`). The driver keeps the order of phases, the checkpoint and the progress.
"""
