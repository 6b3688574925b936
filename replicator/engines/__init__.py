"""The loops that run mcdc's pipeline, driven by the job (:mod:`replicator.job`, the order of phases). Both
run the same stages (source, normalize, transform, sink, checkpoint); only the loop differs.
:mod:`.base` says what an engine does and opens the one ``--engine`` names.

* asyncio (:mod:`.asyncio`), the embedded default: the snapshot's workers and the replay's queue
  (:mod:`.asyncio.pipeline`) and the replay's acknowledgements (:mod:`.asyncio.streaming`), in one process.
* spark (:mod:`.spark`): snapshot partitions, the replay's writes and verify ranges as Spark tasks;
  the driver reads the change streams (with the asyncio engine's reader) and keeps the order of phases,
  the checkpoint and the progress. Users' own Spark jobs read MongoDB through the ``mcdc`` data source
  (:mod:`replicator.spark_datasource`).
"""
