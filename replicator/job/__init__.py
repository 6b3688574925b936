"""The jobs mcdc's commands run. A replication job (``mcdc sync``, ``catch-up``, ``tail``, and cutover's
catch-up), whichever engine runs it: :mod:`.phases` holds the order of phases, :mod:`.startup` and
:mod:`.preflight` the checks made before anything is written, :mod:`.copy` the snapshot's checkpointed copy,
:mod:`.run_control` what a running job listens to. The engine (:mod:`replicator.engines`) does the copying
and the replay. Besides: :mod:`.cutover`, :mod:`.status` and :mod:`.devserver`."""
