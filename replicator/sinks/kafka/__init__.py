"""The Kafka target: the sink (:mod:`.sink`: aiokafka, delivery acknowledged before a checkpoint), the
producer's options (:mod:`.options`) and which partition a record goes to (:mod:`.partitioner`)."""
