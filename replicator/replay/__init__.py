"""The replay's decisions, the same on either engine: what a batch goes through (:mod:`.stage`), which DDL
is replayed as it is and which namespaces are copied again (:mod:`.ddl_window`, :mod:`.resync`), and what a
checkpoint's copies followed (:mod:`.recorded`)."""
