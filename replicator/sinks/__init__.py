"""Sinks: where events are written. See :mod:`replicator.sinks.base` for the contract, :mod:`.registry` for
how a target URI picks one: :mod:`.mongo`, :mod:`.kafka` and :mod:`.lines` (Debezium :mod:`.records`),
:mod:`.lake` (Delta, Iceberg), :mod:`.memory` (tests), or a plug-in."""
