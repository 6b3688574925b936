"""``--engine spark``: mcdc's job with its data work done by Spark.

What runs where:

* the driver (the ``mcdc`` process): the order of phases (:class:`replicator.job.SyncJob`), the plan,
  the target's preparation and index build, the checkpoint and the progress;
* the executors: copying snapshot partitions (:mod:`.snapshot`), hashing verify ranges (:mod:`.verify`)
  and reading the change streams between two offsets (the ``mcdc`` data source's stream reader).
"""
