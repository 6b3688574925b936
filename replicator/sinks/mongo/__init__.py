"""The MongoDB target: the sink (:mod:`.sink`: idempotent replay, DDL, copies), its write plan for a batch
(:mod:`.plan`, pure), the target's collections and indexes made like the source's (:mod:`.schema`), and
replays that meet unique indexes (:mod:`.unique`)."""
