"""A replication job (``mcdc sync``, ``catch-up``, ``tail``, and cutover's catch-up), whichever engine runs
it: :mod:`.phases` holds the order of phases, :mod:`.startup` the checks made before anything is written,
:mod:`.copy` the snapshot's checkpointed copy. The engine (:mod:`replicator.engines`) does the copying and
the replay."""

from .phases import SyncJob

__all__ = ["SyncJob"]
