"""Debezium-compatible records, as the Kafka and lines targets write them: the envelope (:mod:`.envelope`),
written as bytes from templates (:mod:`.templates`), with Kafka Connect schemas (:mod:`.connect_schema`), the
plain and legacy forms (:mod:`.plain`), the ``source`` block (:mod:`.source_block`) and topic names
(:mod:`.topics`). Pure."""
