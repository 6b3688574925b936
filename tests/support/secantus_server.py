"""The SecantusDB server the tests start: ``secantusd-py`` with two quirks mended, so that the tests see
what mongod does.

SecantusDB's listCollections reads the collection names first, then each collection's UUID, and a UUID
not stored yet is minted and stored. When the collection was dropped or renamed away in between, storing
that UUID creates the collection again: empty, and with no change event. mongod lists collections from
one snapshot, and never does this. Any client that lists collections while another drops them meets it:

- the chaos harness: "chaos.in_84 collection missing on the target" (seed 44) and "chaos.log_69"
  (soak seed 7402) were brought back on the source by mcdc's verifier listing them, after their rename
  out or their drop had been replayed;
- the cutover test: ``shop.users`` came back on the target after the tail replayed its drop.

Mended here: a name that is gone by the time its UUID is read gets a UUID that is not stored. The listing
is then as of just before the drop, as a snapshot read may be. Also in ``tests/support/servers.py``.

Second: SecantusDB honours ``writeConcern: {j: true}`` on document writes only (their commit syncs the
journal). A ``drop`` or ``createIndexes`` acknowledged with ``j: true`` is still in memory: a kill -9 right
after it loses it (checked with plain pymongo: 3 of 3 drops of a collection or a view, 3 of 3 index
builds, 0 of 3 inserts), until a later journaled write syncs it with its own. mongod acknowledges ``j:
true`` once the journal holds the command. The chaos harness kills the target right after a checkpoint
save: "namespaces differ: ['chaos.view_64']" (soak seed 3802, catch-up) was mcdc's drop of a view, the
last write of its run, acknowledged with its journaled majority, then lost, with the checkpoint past it.
A ``commitTransaction`` is the same (3 of 3 lost on the plain server): a tail's replayed transactions were
lost behind its saved checkpoint. Mended here: a schema command or a commit asking for the journal returns
once the journal is synced.

Third: its ``collMod`` answers ok to a clustered collection's ``expireAfterSeconds`` and changes nothing
(mongod 5.3+ sets it): mcdc holds such a TTL still while it writes a target and gives the source's value
back at cutover with that command (replicator/sinks/mongo/ttl.py), which the chaos harness's cutovers
found left held ("cutover left TTLs held on the target: ['chaos.ttl_clustered']"). Mended here: the value
is stored. (Its change event still leaves the field out.)

Fourth, not a quirk of its protocol: ``secantusd-py`` reads ``[storage] ttl_sweep_seconds`` from its config
file but does not hand it to the server, whose TTL monitor then runs every 60 s (as mongod's does by
default; ``ttlMonitorSleepSecs`` changes it there). ``--ttl-sweep-seconds S`` here hands it over, so that
a test can watch the monitor work (tests/test_ttl_hold.py).

Run as ``python secantus_server.py ARGS``, with ``secantusd-py``'s arguments.
"""

from __future__ import annotations

import sys
import uuid
from typing import Any

from secantus import commands
from secantus.cli import main
from secantus.storage import Storage


def collection_uuid(self: Any, db: str, coll: str) -> uuid.UUID:
    """``Storage.collection_uuid`` that never creates the collection it is asked about."""
    stored = _uuid_in(self._coll_options(db, coll))
    if stored is not None:  # read without a lock, as SecantusDB does
        return stored
    with self._lock:  # the lock that DDL and the mint itself hold
        self._refresh_read_snapshot()
        if self._coll_options(db, coll) is None:
            return uuid.uuid4()
        minted: uuid.UUID = self._collection_uuid(db, coll)
        return minted


def _uuid_in(options: dict[str, Any] | None) -> uuid.UUID | None:
    """The UUID stored in a collection's options (the forms SecantusDB reads back), else None."""
    value = (options or {}).get("uuid")
    if isinstance(value, uuid.UUID):
        return value
    if isinstance(value, bytes) and len(value) == 16:  # bson.Binary is a bytes subclass
        return uuid.UUID(bytes=bytes(value))
    return None


#: the schema commands whose ``j: true`` SecantusDB leaves unsynced (its document writes sync theirs)
SCHEMA_COMMANDS = ("create", "drop", "dropDatabase", "renameCollection", "collMod", "createIndexes", "dropIndexes")
#: and the commit of a transaction, whose writes are the transaction's (issue 48: a target killed -9 as the
#: checkpoint moved lost 5 to 105 replayed documents of committed transactions, in 5 of 7 trials)
JOURNALED_COMMANDS = (*SCHEMA_COMMANDS, "commitTransaction")


def journaled(handler: Any) -> Any:
    """``handler`` of a schema command, returning once the journal holds what it wrote when its write
    concern asks for the journal (``j: true``)."""

    def handle(doc: dict[str, Any], ctx: Any) -> Any:
        reply = handler(doc, ctx)
        if commands._wants_journal(doc) and isinstance(reply, dict) and reply.get("ok") == 1:
            ctx.storage._session().log_flush("sync=on")
        return reply

    return handle


#: what the mends read: a SecantusDB release without them runs as it is (and says so in its log)
_NEEDED = (
    "collection_uuid", "_collection_uuid", "_coll_options", "_refresh_read_snapshot", "_session",
    "get_collection_options", "set_collection_options",
)  # fmt: skip
_NEEDED_COMMANDS = ("_HANDLERS", "_wants_journal")


def clustered_ttl(handler: Any) -> Any:
    """``collMod``'s handler, storing a clustered collection's ``expireAfterSeconds`` as mongod does."""

    def handle(doc: dict[str, Any], ctx: Any) -> Any:
        reply = handler(doc, ctx)
        seconds = doc.get("expireAfterSeconds")
        coll = doc.get("collMod")
        if isinstance(reply, dict) and reply.get("ok") == 1 and isinstance(seconds, int) and isinstance(coll, str):
            options = ctx.storage.get_collection_options(ctx.db_name, coll)
            if options.get("clusteredIndex"):
                ctx.storage.set_collection_options(ctx.db_name, coll, expireAfterSeconds=seconds)
        return reply

    return handle


def _ttl_sweep(argv: list[str]) -> float | None:
    """``--ttl-sweep-seconds S`` taken out of ``argv`` (None: not given)."""
    if "--ttl-sweep-seconds" not in argv:
        return None
    at = argv.index("--ttl-sweep-seconds")
    seconds = float(argv[at + 1])
    del argv[at : at + 2]
    return seconds


def _with_ttl_sweep(server_class: Any, seconds: float) -> Any:
    def make(*args: Any, **kwargs: Any) -> Any:
        return server_class(*args, ttl_sweep_seconds=seconds, **kwargs)

    return make


if __name__ == "__main__":
    sweep = _ttl_sweep(sys.argv)
    if sweep is not None:
        import secantus.cli

        secantus.cli.SecantusDBServer = _with_ttl_sweep(secantus.cli.SecantusDBServer, sweep)
    if all(hasattr(Storage, name) for name in _NEEDED) and all(hasattr(commands, n) for n in _NEEDED_COMMANDS):
        Storage.collection_uuid = collection_uuid
        commands._HANDLERS["collMod"] = clustered_ttl(commands._HANDLERS["collMod"])
        for name in JOURNALED_COMMANDS:
            commands._HANDLERS[name] = journaled(commands._HANDLERS[name])
    else:
        print("secantus_server.py: this SecantusDB is not the one mended here; running it as it is", file=sys.stderr)
    sys.exit(main())
