"""A switch from a running Debezium 3.6 to mcdc on the same topics, while the source takes writes.

Debezium's MongoDB connector (embedded, tests/support/debezium_peer.py) streams into the Kafka test broker as
a Kafka Connect worker would: records produced by the Java client (its default partitioner), offsets kept in
the broker's offsets topic. It takes its snapshot, follows a workload, and stops inside a multi-document
transaction. mcdc then starts from the offset read from the offsets topic (``KEY<TAB>VALUE`` lines, as Kafka's
console consumer prints them), while the workload goes on, on topics of 6 partitions: with the command of
docs/how-to/switch-from-debezium.md, on the test's servers.

A consumer reads the topics from the start and checks, per document:

* its records, Debezium's and mcdc's, have the same key bytes and are on one partition, the one Debezium's
  producer chose;
* it sees every change of the workload once, in order (``stopped``: Debezium stopped cleanly, its offset is
  its last record). ``killed``: Debezium exits at once, its offset as its last periodic flush (1 s) left it:
  the changes after the offset that Debezium had written come again from mcdc, right after Debezium's, and
  nowhere else;
* the documents rebuilt by key equal the source's.

And the transaction Debezium was in goes on in mcdc's records: no second BEGIN (``stopped``), its orders
continue, mcdc writes its END with the whole transaction's counts.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import shlex
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pymongo
import pytest
from bson import json_util

from tests.support import debezium_peer
from tests.support.kafka import KafkaBroker, Record, consume_all, create_topic
from tests.support.rebuild import decode, rebuild, server_docs

pytestmark = pytest.mark.integration

PREFIX = "mcdc"
DEBEZIUM_VERSION = "3.6.3.Final"  # source.version in Debezium's records; mcdc writes its own
TOPICS = (f"{PREFIX}.shop.orders", f"{PREFIX}.shop.items", f"{PREFIX}.transaction")
OFFSETS = "connect-offsets"


class Workload:
    """Writes to shop.orders and shop.items from a thread, and keeps what each document went through: 0 when
    inserted (or read by the snapshot), then each ``$set: {v: n}`` (n = 1, 2, ...), then "deleted".

    First (phase A) paced single writes, then the transaction Debezium stops in (updates of two orders, an
    insert into items, a delete); then (phase B) a seeded mix of inserts, updates, deletes and two-collection
    transactions, paced, until told to stop."""

    def __init__(self, uri: str, seed: int) -> None:
        self.client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(uri)
        self.rng = random.Random(seed)
        self.changes: dict[tuple[str, int], list[Any]] = {}
        self.live: dict[str, list[int]] = {"orders": [], "items": []}
        self.next_id = 1000
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def load(self, orders: int, items: int) -> None:
        db = self.client.shop
        for name, count in (("orders", orders), ("items", items)):
            db.create_collection(name)  # explicitly: the test server's implicit creates can deadlock
            db[name].insert_many([{"_id": i, "v": 0} for i in range(count)])
            self.live[name] = list(range(count))
            for i in range(count):
                self.changes[(name, i)] = [0]

    def _insert(self, coll: str, session: Any = None) -> None:
        doc_id, self.next_id = self.next_id, self.next_id + 1
        self.client.shop[coll].insert_one({"_id": doc_id, "v": 0}, session=session)
        self.live[coll].append(doc_id)
        self.changes[(coll, doc_id)] = [0]

    def _update(self, coll: str, doc_id: int, session: Any = None) -> None:
        version = len(self.changes[(coll, doc_id)])
        self.client.shop[coll].update_one({"_id": doc_id}, {"$set": {"v": version}}, session=session)
        self.changes[(coll, doc_id)].append(version)

    def _delete(self, coll: str, doc_id: int, session: Any = None) -> None:
        self.client.shop[coll].delete_one({"_id": doc_id}, session=session)
        self.live[coll].remove(doc_id)
        self.changes[(coll, doc_id)].append("deleted")

    def _pace(self) -> bool:
        """True when told to stop; else after a short pause (a pace for the writes, not a wait for a state)."""
        return self.stop.wait(0.04)

    def _run(self) -> None:
        try:
            for n in range(40):  # phase A: about 2 s, so that Debezium flushes its offsets meanwhile
                self._update("orders", n % 10) if n % 3 else self._insert("orders")
                self._pace()
            with self.client.start_session() as session, session.start_transaction():
                self._update("orders", 1, session)
                self._insert("items", session)
                self._update("orders", 2, session)
                self._delete("orders", 3, session)
            while not self._pace():  # phase B
                self._random_write()
        except BaseException as exc:  # seen by the test
            self.error = exc

    def _random_write(self) -> None:
        rng = self.rng
        kind = rng.random()
        coll = "orders" if rng.random() < 0.7 else "items"
        if kind < 0.3 or len(self.live[coll]) < 3:
            self._insert(coll)
        elif kind < 0.8:
            self._update(coll, rng.choice(self.live[coll]))
        elif kind < 0.9:
            self._delete(coll, rng.choice(self.live[coll]))
        else:
            with self.client.start_session() as session, session.start_transaction():
                self._update("orders", rng.choice(self.live["orders"]), session)
                self._update("items", rng.choice(self.live["items"]), session)


async def _wait(
    what: str, done: Callable[[], Awaitable[bool]], procs: list[subprocess.Popen[str]], logs: list[Path]
) -> None:
    deadline = time.monotonic() + 180
    while not await done():
        for proc, log in zip(procs, logs, strict=True):
            if proc.poll() is not None and proc.returncode != 0:
                raise AssertionError(f"{log.stem} exited {proc.returncode} before {what}: {log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within 180 s")
        await asyncio.sleep(0.5)


def _documented_command(source: str, bootstrap: str, cp: Path, offset_file: Path) -> list[str]:
    """The how-to's mcdc command (docs/how-to/switch-from-debezium.md), on this test's servers and files."""
    page = (Path(__file__).parent.parent / "docs" / "how-to" / "switch-from-debezium.md").read_text()
    block = next(b for b in re.findall(r"```bash\n(.*?)```", page, re.S) if b.startswith("# the connector's topics"))
    command = " ".join(line.rstrip("\\ ") for line in block.splitlines() if not line.startswith("#"))
    for theirs, ours in {
        '"$SRC"': source, "kafka://broker1:9092": f"kafka://{bootstrap}", "/var/lib/mcdc/switch.json": str(cp),
        "@offset.json": f"@{offset_file}",
    }.items():  # fmt: skip
        assert theirs in command, theirs
        command = command.replace(theirs, ours)
    words = shlex.split(command)
    assert words[:2] == ["mcdc", "tail"] and f"--topic-prefix {PREFIX}" in command
    return [sys.executable, "-m", "replicator.cli", *words[1:], "--no-progress"]


def _lines(out: Path) -> list[dict[str, Any]]:
    if not out.exists():
        return []
    return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


def _payload(value: Any) -> Any:
    return value["payload"] if isinstance(value, dict) and "payload" in value else value


def _change(value: dict[str, Any]) -> Any:
    """What a data record says happened to its document: its version, or "deleted"."""
    if value["op"] == "d":
        return "deleted"
    if value["op"] in ("r", "c"):
        return json_util.loads(value["after"])["v"]
    return json_util.loads(value["updateDescription"]["updatedFields"])["v"]


@pytest.mark.parametrize("how", ["stopped", "killed"])
async def test_a_switch_from_debezium_keeps_partitions_and_loses_no_change(
    own_source: str, kafka: KafkaBroker, tmp_path: Path, how: str
) -> None:
    for topic in TOPICS:
        await create_topic(kafka.bootstrap, topic, 6)
    workload = Workload(own_source, seed=52)
    workload.load(orders=10, items=5)
    out = tmp_path / "debezium" / "records.jsonl"
    out.parent.mkdir()
    stop = ["--stop-after", "1"] if how == "stopped" else ["--kill-after", "1", "--flush-ms", "1000"]
    args = ["--prefix", PREFIX, "--include", r"shop\..*", "--tx-metadata", "--kafka", kafka.bootstrap]
    debezium = debezium_peer.start(own_source, out, *args, "--offsets-topic", OFFSETS, "--in-transaction", "2", *stop)
    procs, logs = [debezium], [out.with_suffix(".log")]
    mcdc: subprocess.Popen[str] | None = None
    try:

        async def snapshot_read() -> bool:
            return len([line for line in _lines(out) if line.get("value")]) >= 15

        await _wait("Debezium's snapshot", snapshot_read, procs, logs)
        workload.thread.start()
        assert debezium.wait(timeout=180) == 0, logs[0].read_text()[-3000:]
        offsets = await consume_all(kafka.bootstrap, [OFFSETS])
        offset_file = tmp_path / "offset.json"  # as kafka-console-consumer.sh --property print.key=true prints them
        offset_file.write_text(
            "".join(f"{r.key.decode()}\t{(r.value or b'null').decode()}\n" for r in offsets if r.key)
        )

        cp = tmp_path / "cp.json"
        argv = _documented_command(own_source, kafka.bootstrap, cp, offset_file)
        with cp.with_suffix(".log").open("w") as log:
            mcdc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log, text=True)
        procs, logs = [mcdc], [cp.with_suffix(".log")]

        async def mcdc_wrote(n: int) -> bool:
            records = await consume_all(kafka.bootstrap, list(TOPICS[:2]))
            return sum(1 for r in records if r.value and DEBEZIUM_VERSION not in r.value.decode()) >= n

        await _wait("mcdc's first records", lambda: mcdc_wrote(30), procs, logs)
        workload.stop.set()
        workload.thread.join(timeout=60)
        assert workload.error is None, workload.error
        workload.client.shop.orders.insert_one({"_id": 10**6, "v": 0})  # the last write
        workload.changes[("orders", 10**6)] = [0]

        async def caught_up() -> bool:
            records = await consume_all(kafka.bootstrap, [TOPICS[0]])
            return any(r.value and b"1000000" in r.value for r in records)  # by value: whatever the key

        await _wait("the last write's record", caught_up, procs, logs)
    finally:
        workload.stop.set()
        for proc in (debezium, mcdc):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=60)
    records = await consume_all(kafka.bootstrap, list(TOPICS))
    data = [r for r in records if r.topic != TOPICS[2]]
    theirs = [line for line in _lines(out) if "topic" in line]
    _check_partitions(data, theirs)
    duplicates = _check_changes(data, workload.changes, exact=how == "stopped")
    assert rebuild(decode(data)) == server_docs(own_source, ["shop"])
    if how == "stopped":
        _check_transaction(records, theirs)
    print(f"{how}: {len(data)} data records, {duplicates} sent again by mcdc after the offset")


def _check_partitions(data: list[Record], theirs: list[dict[str, Any]]) -> None:
    """One key's records, whoever wrote them, have the same bytes and one partition: Debezium's producer's."""
    keys: dict[tuple[str, str], set[bytes]] = defaultdict(set)
    partitions: dict[tuple[str, bytes], set[int]] = defaultdict(set)
    for record in data:
        assert record.key is not None
        keys[(record.topic, json_util.dumps(json_util.loads(json.loads(record.key)["id"])))].add(record.key)
        partitions[(record.topic, record.key)].add(record.partition)
    assert all(len(found) == 1 for found in keys.values()), [k for k, v in keys.items() if len(v) > 1]
    assert all(len(found) == 1 for found in partitions.values()), [k for k, v in partitions.items() if len(v) > 1]
    for line in theirs:
        if line["key"] is not None and not line["topic"].endswith(".transaction"):
            assert partitions[(line["topic"], line["key"].encode())] == {line["partition"]}, line
            assert line["partition"] == line["partition6"]


def _check_changes(data: list[Record], made: dict[tuple[str, int], list[Any]], *, exact: bool) -> int:
    """Per document: Debezium's records then mcdc's, in partition order, together the workload's changes in
    order; where they overlap (``exact``: never), mcdc's first records repeat Debezium's last ones. Returns how
    many records repeat."""
    seen: dict[tuple[str, int], list[tuple[str, Any]]] = defaultdict(list)
    for record in data:
        if record.value is None:
            continue  # a tombstone
        value = _payload(json.loads(record.value))
        writer = "debezium" if value["source"]["version"] == DEBEZIUM_VERSION else "mcdc"
        doc_id = json_util.loads(json.loads(record.key or b"{}")["id"])
        seen[(value["source"]["collection"], doc_id)].append((writer, _change(value)))
    assert set(seen) == set(made), set(seen) ^ set(made)
    repeated = 0
    for doc, records in seen.items():
        writers = [w for w, _ in records]
        assert writers == sorted(writers), f"{doc}: {records}"  # 'debezium' sorts before 'mcdc'
        theirs = [c for w, c in records if w == "debezium"]
        mine = [c for w, c in records if w == "mcdc"]
        overlap = len(theirs) + len(mine) - len(made[doc])
        assert theirs == made[doc][: len(theirs)] and mine == made[doc][len(theirs) - overlap :], (doc, records)
        assert overlap == 0 if exact else overlap >= 0, (doc, records)
        repeated += overlap
    return repeated


def _check_transaction(records: list[Record], theirs: list[dict[str, Any]]) -> None:
    """The transaction Debezium stopped in: its BEGIN from Debezium only, its END from mcdc only, with the
    whole transaction's counts; its events' orders 1..4, the first two Debezium's."""
    in_tx = [
        _payload(json.loads(line["value"])) for line in theirs if line["value"] and '"total_order"' in line["value"]
    ]
    tx_id = in_tx[0]["transaction"]["id"]
    assert [v["transaction"]["total_order"] for v in in_tx if v["transaction"]["id"] == tx_id] == [1, 2]
    markers = [json.loads(r.value) for r in records if r.topic == TOPICS[2] and r.value]
    mine = [m for m in markers if m["id"] == tx_id]
    assert [m["status"] for m in mine] == ["BEGIN", "END"], mine
    end = mine[1]
    counts = {c["data_collection"]: c["event_count"] for c in end["data_collections"]}
    assert end["event_count"] == 4 and counts == {"shop.orders": 3, "shop.items": 1}, end
    orders: Counter[int] = Counter()
    for record in records:
        value = _payload(json.loads(record.value)) if record.value and record.topic != TOPICS[2] else None
        if value and value.get("transaction") and value["transaction"]["id"] == tx_id:
            orders[value["transaction"]["total_order"]] += 1
    assert orders == Counter({1: 1, 2: 1, 3: 1, 4: 1}), orders
    begins = Counter(m["id"] for m in markers if m["status"] == "BEGIN")
    ends = Counter(m["id"] for m in markers if m["status"] == "END")
    assert begins == ends and set(begins.values()) == {1}, (begins, ends)
