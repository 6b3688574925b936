"""BSON as mcdc reads and writes it: raw BSON (:mod:`.rawbson`), Extended JSON (:mod:`.extjson`, with its
per-type converters and BSON's deprecated types). Pure: bytes and values in, bytes and values out. Named
so as not to shadow pymongo's ``bson``."""
