"""The snapshot: whether a run copies (:mod:`.mode`, Debezium's snapshot.mode) and where a partition's
copy may resume (:mod:`.watermark`)."""
