"""``--engine spark``: mcdc's job with its data work done by Spark.

What runs where:

* the driver (the ``mcdc`` process): the order of phases (:class:`replicator.job.SyncJob`), the plan,
  the target's preparation and index build, reading the change streams, DDL, the checkpoint and the
  progress;
* the executors: copying snapshot partitions (:mod:`.snapshot`), writing the replay's batches split by
  document (:mod:`.apply`) and hashing verify ranges (:mod:`.verify`).
"""
