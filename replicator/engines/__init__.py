"""The loops that run mcdc's pipeline, driven by the job (:mod:`replicator.job`, the order of phases). Both
run the same stages (source, normalize, transform, sink, checkpoint); only the loop differs.
:mod:`.base` says what an engine does; :mod:`.driver` is what both do on the driver (read and replay the
change streams). The job opens the one ``--engine`` names (:mod:`replicator.job.engines`).

* asyncio (:mod:`.asyncio`), the embedded default: the driver does everything, in one process.
* spark (:mod:`.spark`): snapshot partitions, the replay's writes and verify ranges as Spark tasks;
  the driver reads the change streams and keeps the order of phases, the checkpoint and the progress.
  Users' own Spark jobs read MongoDB through the ``mcdc`` data source (:mod:`replicator.spark_datasource`).
The two engine packages are siblings: neither imports the other.
"""
