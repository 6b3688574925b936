"""Sinks: where events are written. See :mod:`replicator.sinks.base` for the contract."""
