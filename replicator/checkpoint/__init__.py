"""Progress that survives a crash: what a checkpoint holds and its versioned JSON (:mod:`.model`), the file
written atomically and never ahead of what the sink acknowledged (:mod:`.store`), the migrations recorded
beside it (:mod:`.registry`), and a Debezium connector's offset read as a start (:mod:`.debezium_offset`)."""
