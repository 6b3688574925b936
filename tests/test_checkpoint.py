"""Checkpoint files round-trip exactly, are written atomically with a backup, and lock."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from bson import Binary, Int64, ObjectId
from bson.timestamp import Timestamp
from pymongo.errors import OperationFailure

from replicator.checkpoint.store import DEPLOYMENT, Checkpoint, CheckpointStore, SnapshotProgress, StreamScope
from replicator.errors import CheckpointError, CheckpointLocked, ConfigError
from replicator.events import Namespace, Position
from replicator.source.partitions import Partition


def _sample() -> Checkpoint:
    part = Partition(Namespace("db", "c"), 1, "number", lower=Int64(5), upper=7.5, estimated_docs=3)
    return Checkpoint(
        "rs:rs0",
        position=Position(resume_token={"_data": "8265AB"}, cluster_time=Timestamp(1700000000, 7)),
        snapshot=SnapshotProgress(status="in_progress", plan=[part.to_json()], done={"db.c#0"}),
    )


def test_round_trip_is_exact(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "cp.json")
    store.save(_sample())
    loaded = store.load()
    assert loaded is not None
    assert loaded.position.cluster_time == Timestamp(1700000000, 7)
    assert loaded.position.resume_token == {"_data": "8265AB"}
    assert loaded.snapshot.done == {"db.c#0"}
    part = Partition.from_json(loaded.snapshot.plan[0])
    assert isinstance(part.lower, Int64) and part.lower == 5 and part.upper == 7.5
    assert stat.S_IMODE(os.stat(store.path).st_mode) == 0o600


def test_binary_token_round_trip(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "cp.json")
    cp = _sample()
    cp.position = Position(resume_token={"_data": Binary(b"\x01\x02", 0)})
    store.save(cp)
    loaded = store.load()
    assert loaded is not None and loaded.position.resume_token == {"_data": b"\x01\x02"}


def test_previous_version_kept_as_backup(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "cp.json")
    cp = _sample()
    store.save(cp)
    cp.snapshot.done.add("db.c#1")
    store.save(cp)
    backup = json.loads(store.backup.read_text())
    assert backup["snapshot"]["done"] == ["db.c#0"]
    current = store.load()
    assert current is not None and current.snapshot.done == {"db.c#0", "db.c#1"}
    # a checkpoint deleted by hand while its backup remains: say so rather than resume from the backup
    store.path.unlink()
    with pytest.raises(CheckpointError, match=r"missing but cp\.json\.backup exists"):
        store.load()


def test_corrupt_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "cp.json"
    path.write_text("{not json")
    with pytest.raises(CheckpointError, match="is corrupt"):
        CheckpointStore(path).load()
    path.write_text(json.dumps({"format": "mcdc-checkpoint", "version": 99}))
    with pytest.raises(CheckpointError, match="version 99"):
        CheckpointStore(path).load()


def test_unwritable_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="cannot be created"):
        CheckpointStore(Path("/proc/mcdc/cp.json")).check_writable()
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        store = CheckpointStore(ro / "cp.json")
        if os.access(ro, os.W_OK):  # running as root: permissions do not bind
            pytest.skip("root ignores directory permissions")
        with pytest.raises(CheckpointError, match="not writable"):
            store.check_writable()
    finally:
        ro.chmod(0o700)


def test_second_holder_is_refused(tmp_path: Path) -> None:
    a = CheckpointStore(tmp_path / "cp.json")
    b = CheckpointStore(tmp_path / "cp.json")
    with a.locked(), pytest.raises(CheckpointLocked, match="in use by another mcdc process"), b.locked():
        pass
    with b.locked():
        pass


def test_a_released_lock_leaves_no_file(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "cp.json")
    with store.locked():
        assert (tmp_path / "cp.json.lock").exists()
        with pytest.raises(CheckpointLocked), CheckpointStore(tmp_path / "cp.json").locked():
            pass
    assert list(tmp_path.iterdir()) == []  # a run refused before its first save leaves nothing behind
    with store.locked():  # and the next run locks afresh
        store.save(_sample())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cp.json"]


def _big_plan(parts: int) -> list[dict[str, object]]:
    ns = Namespace("db", "c")
    return [Partition(ns, i, "number", lower=Int64(i), upper=Int64(i + 1)).to_json() for i in range(parts)]


_SAVE_UNDER_FILE_SIZE_LIMIT = """
import resource, signal, sys
from pathlib import Path
from replicator.checkpoint.store import DEPLOYMENT, Checkpoint, CheckpointStore, SnapshotProgress, StreamScope
from replicator.errors import CheckpointError
from tests.test_checkpoint import _big_plan

limit = int(sys.argv[2])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit a write is short, then fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
try:
    CheckpointStore(Path(sys.argv[1])).save(Checkpoint("rs:rs0", snapshot=SnapshotProgress(plan=_big_plan(200))))
except CheckpointError as exc:
    print(exc)
    sys.exit(exc.exit_code)
"""


def test_disk_full_keeps_previous_checkpoint_and_backup(tmp_path: Path) -> None:
    """A checkpoint larger than what the file system takes (here: RLIMIT_FSIZE in a child process) is
    refused whole: the current file and its backup keep their bytes, and no temporary file is left."""
    store = CheckpointStore(tmp_path / "cp.json")
    cp = _sample()
    store.save(cp)
    cp.snapshot.done.add("db.c#1")
    store.save(cp)
    before = store.path.read_bytes(), store.backup.read_bytes()
    limit = 4096
    assert len(before[0]) < limit
    result = subprocess.run(
        [sys.executable, "-c", _SAVE_UNDER_FILE_SIZE_LIMIT, str(store.path), str(limit)],
        capture_output=True, text=True, timeout=60, cwd=Path(__file__).parent.parent,
    )  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout.count("\n") == 1 and "cannot be written: File too large" in result.stdout
    assert (store.path.read_bytes(), store.backup.read_bytes()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cp.json", "cp.json.backup"]


def test_short_writes_are_completed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_write = os.write
    store = CheckpointStore(tmp_path / "cp.json")
    cp = _sample()
    cp.snapshot.plan = _big_plan(50)
    with monkeypatch.context() as m:
        m.setattr(os, "write", lambda fd, data: real_write(fd, bytes(data)[:100]))  # at most 100 bytes a call
        store.save(cp)
    loaded = store.load()
    assert loaded is not None and loaded.snapshot.plan == cp.snapshot.plan


def test_write_that_reads_back_different_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_write = os.write
    store = CheckpointStore(tmp_path / "cp.json")
    store.save(_sample())
    before = store.path.read_bytes()

    def flip_last_byte(fd: int, data: bytes) -> int:  # a device that acknowledges bytes it did not keep
        data = bytes(data)
        return real_write(fd, data[:-1] + bytes([data[-1] ^ 1])) if data else 0

    with monkeypatch.context() as m:
        m.setattr(os, "write", flip_last_byte)
        with pytest.raises(CheckpointError, match="read back"):
            store.save(_sample())
    assert store.path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cp.json"]


@pytest.mark.parametrize(
    "content",
    [
        b"\xff\xfe\x00\x80garbage\xc3\x28",  # not UTF-8
        b'{"format": "mcdc-checkpoint", "version": 1, "source": "rs:x", "position": 5}',  # a field of a wrong type
        b'{"format": "mcdc-checkpoint", "version": 1, "source": "rs:x", "snapshot": "done"}',
        b"[" * 100_000,  # nested past the parser's recursion limit
    ],
)
def test_garbage_checkpoint_is_a_one_line_refusal(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "cp.json"
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match="is corrupt") as caught:
        CheckpointStore(path).load()
    assert "\n" not in str(caught.value)
    assert path.read_bytes() == content  # left as it was for the user to inspect


def test_corrupt_message_names_the_backup_only_when_there_is_one(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "cp.json")
    store.path.write_text("{not json")
    with pytest.raises(CheckpointError) as caught:
        store.load()
    assert "backup" not in str(caught.value)
    store.save(_sample())  # the corrupt file becomes the backup: make a good backup, then break the current one
    store.save(_sample())
    store.path.write_text("{not json")
    with pytest.raises(CheckpointError, match=r"the previous version is cp\.json\.backup"):
        store.load()


def test_symlinked_checkpoint_stays_a_link_and_locks_the_real_file(tmp_path: Path) -> None:
    real_dir = tmp_path / "real"
    real_dir.mkdir()
    real = real_dir / "cp.json"
    link = tmp_path / "cp.json"
    link.symlink_to(Path("real") / "cp.json")  # relative, and dangling until the first save
    store = CheckpointStore(link)
    cp = _sample()
    with store.locked():
        # the same file by its real name is the same checkpoint
        with pytest.raises(CheckpointLocked), CheckpointStore(real).locked():
            pass
        store.save(cp)
        cp.snapshot.done.add("db.c#1")
        store.save(cp)
    assert link.is_symlink() and os.readlink(link) == str(Path("real") / "cp.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cp.json", "real"]
    assert sorted(p.name for p in real_dir.iterdir()) == ["cp.json", "cp.json.backup"]
    assert json.loads(real.read_text())["snapshot"]["done"] == ["db.c#0", "db.c#1"]
    assert json.loads((real_dir / "cp.json.backup").read_text())["snapshot"]["done"] == ["db.c#0"]
    loaded = CheckpointStore(link).load()
    assert loaded is not None and loaded.snapshot.done == {"db.c#0", "db.c#1"}


# What a checkpoint belongs to: the source and target identities it records and checks.

SOURCE = "rs:rs0/6552f0c0a1b2c3d4e5f60718"
TARGET = "rs:rs0@dst:27017"


def test_identities_round_trip_and_are_stamped_on_every_save(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "cp.json")
    store.claim(None, source=SOURCE, target=TARGET, source_name="rs:rs0")
    store.save(_sample())  # a checkpoint made by the run that claimed the store
    data = json.loads(store.path.read_text())
    assert (data["source_identity"], data["target_identity"], data["source"]) == (SOURCE, TARGET, "rs:rs0")
    loaded = store.load()
    assert loaded is not None and (loaded.source_identity, loaded.target_identity) == (SOURCE, TARGET)


def test_old_checkpoint_without_identities_is_accepted_and_filled_in(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "cp.json")
    old = _sample().to_json()
    old.pop("source_identity", None)
    old.pop("target_identity", None)
    store.path.write_text(json.dumps(old))
    cp = store.load()
    assert cp is not None and cp.source_identity is None and cp.target_identity is None
    store.claim(cp, source=SOURCE, target=TARGET, source_name="rs:rs0")
    store.save(cp)
    data = json.loads(store.path.read_text())
    assert (data["version"], data["source_identity"], data["target_identity"]) == (1, SOURCE, TARGET)


def test_old_checkpoint_of_another_replica_set_name_is_refused(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "cp.json")
    with pytest.raises(ConfigError, match=r"belongs to source 'rs:rs0'.*not this run's source 'rs:other/"):
        store.claim(_sample(), source="rs:other/65", target=TARGET, source_name="rs:other")


@pytest.mark.parametrize(
    ("source", "target", "names"),
    [
        (SOURCE, "jsonl:/tmp/x.jsonl#mcdc", ["target 'rs:rs0@dst:27017'", "target 'jsonl:/tmp/x.jsonl#mcdc'"]),
        ("rs:rs0/0000f0c0a1b2c3d4e5f60718", TARGET, [f"source '{SOURCE}'", "source 'rs:rs0/0000f0c0a1b2c3d4e5f60718'"]),
        (TARGET, SOURCE, [f"source '{SOURCE}'", f"target '{TARGET}'", f"source '{TARGET}'", f"target '{SOURCE}'"]),
    ],
    ids=["other-target", "other-source", "swapped"],
)
def test_checkpoint_of_another_deployment_is_refused(
    tmp_path: Path, source: str, target: str, names: list[str]
) -> None:
    store = CheckpointStore(tmp_path / "cp.json")
    cp = _sample()
    cp.source_identity, cp.target_identity = SOURCE, TARGET
    with pytest.raises(ConfigError) as caught:
        store.claim(cp, source=source, target=target, source_name="rs:rs0")
    message = str(caught.value)
    assert "\n" not in message and "another --checkpoint" in message and "delete" in message
    for name in names:
        assert name in message
    store.save(cp)  # a refused claim stamps nothing
    assert json.loads(store.path.read_text())["target_identity"] == TARGET


def test_deployment_identity_prefers_the_servers_own_id() -> None:
    from replicator.source.connection import ServerInfo, deployment_identity, uri_identity

    strong = ServerInfo("replicaset", "rs0", "p", 21, deployment_id=SOURCE)
    assert deployment_identity(strong, "mongodb://a:1,b:2/?replicaSet=rs0") == SOURCE
    # no id to read (no privilege, or a server without one): the set name and the sorted seed hosts
    weak = ServerInfo("replicaset", "rs0", "p", 21)
    uri = "mongodb://user:hunter2@B:2,a:1/db?replicaSet=rs0&authSource=admin"
    assert deployment_identity(weak, uri) == "rs:rs0@a:1,b:2"
    mongos = ServerInfo("sharded", None, "p", 21)
    assert deployment_identity(mongos, "mongodb://router") == "hosts:router:27017"
    # a set that hides its id is named by its members as its configuration names them, not by the URI
    members = ServerInfo("replicaset", "rs0", "p", 21, members=("db1:27017", "db2:27017"))
    for spelled in ("mongodb://db1/?replicaSet=rs0", "mongodb://10.0.0.7:27017,db2/?replicaSet=rs0"):
        assert deployment_identity(members, spelled) == "rs:rs0@db1:27017,db2:27017"
    assert uri_identity(members, "mongodb://10.0.0.7/?replicaSet=rs0") == "rs:rs0@10.0.0.7:27017"


def test_event_target_identity_is_the_redacted_uri_and_topic_prefix(tmp_path: Path) -> None:
    from replicator.job.preflight import target_identity
    from replicator.settings.resolve import resolve
    from replicator.sinks.registry import open_sink

    def identity(target: str, **flags: object) -> str | None:
        settings = resolve({"source": "mongodb://a", "target": target, **flags}, env={})
        return target_identity(open_sink(settings), settings)

    assert identity("kafka://k1:9092", topic_prefix="prod") == "kafka://k1:9092#prod"
    assert identity("-") == identity("stdout") == "stdout#mcdc"
    assert identity(f"jsonl:{tmp_path}/out.jsonl") == f"jsonl:{tmp_path}/out.jsonl#mcdc"
    assert identity("mongodb://u:hunter2@dst:27017") is None  # known once the sink has probed its server


class _FakeServer:
    """Answers the reads _deployment_id makes, like a real mongod / mongos would (or refuses them)."""

    def __init__(self, config: dict[str, Any] | None, docs: dict[str, dict[str, Any]]) -> None:
        self.config, self.docs = config, docs
        self.admin = self

    async def command(self, name: str, **kwargs: Any) -> dict[str, Any]:
        assert name == "replSetGetConfig"
        if self.config is None:
            raise OperationFailure("not authorized on admin", code=13)
        return {"config": self.config, "ok": 1}

    def __getitem__(self, db: str) -> Any:
        server = self

        class _Db:
            def get_collection(self, coll: str, **kwargs: Any) -> Any:
                class _Coll:
                    async def find_one(self) -> dict[str, Any] | None:
                        if f"{db}.{coll}" not in server.docs:
                            raise OperationFailure("not authorized", code=13)
                        return server.docs[f"{db}.{coll}"]

                return _Coll()

        return _Db()


RS_ID = ObjectId("6552f0c0a1b2c3d4e5f60718")


@pytest.mark.parametrize(
    ("hello", "config", "docs", "expected"),
    [
        ({"setName": "rs0"}, {"settings": {"replicaSetId": RS_ID}}, {}, f"rs:rs0/{RS_ID}"),
        # no replSetGetConfig privilege: the same id from local.system.replset
        ({"setName": "rs0"}, None, {"local.system.replset": {"settings": {"replicaSetId": RS_ID}}}, f"rs:rs0/{RS_ID}"),
        ({"setName": "rs0"}, None, {}, None),  # may read neither: deployment_identity falls back to the hosts
        ({"setName": "rs0"}, None, {"local.system.replset": None}, None),  # a server without one
        ({"msg": "isdbgrid"}, None, {"config.version": {"_id": 1, "clusterId": RS_ID}}, f"cluster:{RS_ID}"),
        ({"msg": "isdbgrid"}, None, {}, None),
        ({}, None, {}, None),  # a standalone has no id
    ],
)
async def test_deployment_id_is_read_from_the_server(
    hello: dict[str, Any], config: dict[str, Any] | None, docs: dict[str, Any], expected: str | None
) -> None:
    from replicator.source.connection import _deployment_id

    assert await _deployment_id(_FakeServer(config, docs), hello) == expected  # type: ignore[arg-type]


def test_the_checkpoint_moves_its_positions_on_acknowledgement() -> None:
    from bson.timestamp import Timestamp

    from replicator.events import Position

    cp = Checkpoint("rs:x", position=Position({"_data": "a"}, Timestamp(10, 1)))
    cp.acknowledge(Position({"_data": "b"}, None))  # an idle post-batch token: the last known time stays
    assert cp.position == Position({"_data": "b"}, Timestamp(10, 1))
    shards = {"s1": Position({"_data": "s1"}, Timestamp(11, 1))}
    cp.acknowledge(Position({"_data": "c"}, Timestamp(12, 1)), shards, applied=False)  # shards polled idle
    assert cp.position.resume_token == {"_data": "b"} and cp.shards["s1"] == shards["s1"]
    cp.acknowledge(Position({"_data": "c"}, Timestamp(12, 1)), shards, applied=True)
    assert cp.position == Position({"_data": "c"}, Timestamp(12, 1))
    cp.add_shard("s2", Position(cluster_time=Timestamp(9, 1)))
    cp.add_shard("s1", Position(cluster_time=Timestamp(1, 1)))  # known already: kept
    assert cp.shards["s1"] == shards["s1"] and cp.shards["s2"].cluster_time == Timestamp(9, 1)


def test_the_stream_scope_round_trips_and_an_older_checkpoint_followed_the_deployment(tmp_path: Path) -> None:
    """A checkpoint keeps the change stream its positions belong to: a database's, or the deployment's (what
    a checkpoint written before scopes were recorded read); one that names none yet (a reverse checkpoint)
    is left for the next run to decide."""
    store = CheckpointStore(tmp_path / "cp.json")
    for scope in (StreamScope("shop"), DEPLOYMENT, None):
        cp = _sample()
        cp.stream = scope
        store.save(cp)
        loaded = store.load()
        assert loaded is not None and loaded.stream == scope
    old = _sample().to_json()
    old.pop("stream")
    store.path.write_text(json.dumps(old))
    loaded = store.load()
    assert loaded is not None and loaded.stream == DEPLOYMENT and loaded.stream.database is None
    bad = {**old, "stream": {"scope": "collection"}}
    store.path.write_text(json.dumps(bad))
    with pytest.raises(CheckpointError):
        store.load()
