"""The README's and the docs' commands work as written: each ``bash`` block of README.md and docs/ runs here
against the fixtures' servers, or is listed below with the reason it cannot (a new block fails the test until
it is run or listed). A block shown on several pages is the same block on each.

Hosts and paths that only exist on the reader's machines are replaced with the fixtures' (``SUBSTITUTE``);
``$SRC`` and ``$DST`` are set in the environment as the README assumes. A ``tail`` runs until its first
checkpoint, then gets SIGTERM and must exit 0.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pymongo
import pytest

from replicator.settings.resolve import resolve
from tests.support.kafka import KafkaBroker
from tests.support.servers import drop_user_databases, free_port

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
#: The pages whose blocks are run, the README first: a block on several pages is run where it comes first.
PAGES = (README, *sorted((ROOT / "docs").rglob("*.md")))

#: docs/how-to/migrate-a-cluster.md's whole migration, with its way back
WALKTHROUGH = "# a migration of part of a collection, cut over, and its way back"
#: Blocks not run here, by their first line, and why.
NOT_RUN = {
    "# 1. install and run the demo": "the demo is run by test_scripts.py, the test command is this suite",
    "mcdc sync --engine spark --spark-master spark://HOST:7077": "needs a Spark cluster",
    "spark-submit --master yarn": "needs YARN",
    "python scripts/soak.py --minutes 30": "a 30-minute soak; CI runs the chaos seeds (tests/chaos)",
    "pip install 'mcdc[pipelines]'": "needs a catalog whose tables take MERGE (Delta's or Iceberg's jars); "
    "tests/test_auto_cdc_example.py runs the example's README steps, these among them, over a test catalog",
    "bash scripts/test.sh": "the test command is this suite",
    "mcdc sync -s 'mongodb://a,b,c/?replicaSet=rs0'": "a three-member replica set is not here; "
    "tests/test_read_policy.py runs both options end to end on the test server",
    "# Kafka Connect 3.5+; with an older worker, DELETE the connector": "no Kafka Connect worker and no Kafka "
    "distribution here; tests/test_debezium_switch.py reads the offsets topic these print, as they print it",
    "# the connector's topics, keys and transaction records": "it starts where a Debezium connector stopped: "
    "tests/test_debezium_switch.py runs this block's command after stopping Debezium 3.6 on the test broker",
    'mcdc sync -s "$SRC" -t delta:/data/lake': "an object store and a REST catalog are not here; tests/test_lake.py "
    "runs the local forms (sync, catch-up, tail into delta: and iceberg:)",
    WALKTHROUGH: "run three ways (a filter, a selection, everything) by test_the_migration_walkthrough_runs_as_written",
    'mcdc cutover --source "$SRC" --target "$DST" --checkpoint mig.json --release-only': "a migration abandoned "
    "with its TTLs held: tests/test_ttl_hold.py runs the command on one and checks nothing else changed",
}
#: The first lines of the blocks that run every command they hold, in the pages' order. The blocks that copy
#: run on an empty target, each as if it were the reader's first run; a block that begins with status,
#: verify or cutover reads what the block before it left.
RUN = (
    "# with mcdc installed",  # the trial on two dev servers
    'mcdc sync --source "mongodb://src1,src2/?replicaSet=rs0"',
    'mcdc catch-up --source "$SRC" --target "$DST" --checkpoint /var/lib/mcdc/prod.json',
    'mcdc tail --source "$SRC" --target "$DST" --checkpoint /var/lib/mcdc/live.json',
    "mcdc status --checkpoint /var/lib/mcdc/live.json",
    'mcdc verify --source "$SRC" --target "$DST"',
    'mcdc cutover --source "$SRC" --target "$DST" --checkpoint /var/lib/mcdc/live.json',
    "mcdc dev-server --port 27017 --dir mcdc-dev-data",
    """mcdc sync -s "$SRC" -t "$SRC" --include 'scratch\\.a'""",
    """mcdc sync -s "$SRC" -t "$DST" --include 'shop\\.orders' --filter""",
    'mcdc tail -s "$SRC" -t kafka://broker1:9092,broker2:9092',
    "# the migration goes on between the same servers",  # README, tutorials/first-migration.md: the next steps
    "# step 1: every document of the source as a Debezium record",  # docs/tutorials/first-kafka-stream.md
    "# step 2: the snapshot, then every change as it comes",
    "# pip install 'mcdc[lake]' first",  # docs/tutorials/first-lake-table.md
)
READS = ("mcdc status", "mcdc verify", "mcdc cutover")


def _blocks(pages: tuple[Path, ...] = PAGES) -> list[list[str]]:
    """The pages' bash blocks, each as its lines, in the pages' order."""
    blocks = [b for page in pages for b in re.findall(r"^( *)```bash\n(.*?)^ *```", page.read_text(), re.S | re.M)]
    return [textwrap.dedent(body).strip("\n").splitlines() for _, body in blocks]


def _commands(lines: list[str]) -> list[str]:
    """A block's commands: continuation lines joined, comments and blank lines left out."""
    commands, current = [], ""
    for line in lines:
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current += line.rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        commands.append(current)
        current = ""
    return commands


def test_every_bash_block_is_run_or_says_why_not() -> None:
    firsts = [lines[0] for lines in _blocks()]
    unlisted = [f for f in firsts if not any(f.startswith(p) for p in (*RUN, *NOT_RUN))]
    assert unlisted == [], "a README or docs block neither run by test_readme.py nor listed in NOT_RUN"
    assert [p for p in RUN if not any(f.startswith(p) for f in firsts)] == []  # the listed ones are all there


def test_a_block_shown_on_several_pages_is_the_same_on_each() -> None:
    # only a block's first occurrence is run: a copy elsewhere that differed would go unchecked
    by_first: dict[str, list[str]] = {}
    for lines in _blocks():
        assert by_first.setdefault(lines[0], lines) == lines, f"two blocks begin with {lines[0]!r} but differ"


class Shell:
    """Runs README lines with bash: ``$SRC``/``$DST`` set, the reader's hosts and paths swapped for ours."""

    def __init__(self, tmp: Path, substitute: dict[str, str], env: dict[str, str]) -> None:
        self.tmp = tmp
        self.substitute = substitute
        bin_dir = str(Path(sys.executable).parent)  # this venv's mcdc
        self.env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ["PATH"], **env}

    def line(self, command: str) -> str:
        for theirs, ours in self.substitute.items():
            command = command.replace(theirs, ours)
        return command

    def run(self, command: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        script = "set -o pipefail\n" + self.line(command)
        return subprocess.run(
            ["bash", "-c", script], capture_output=True, text=True, timeout=timeout, env=self.env, cwd=self.tmp
        )

    def tail(self, command: str, checkpoint: Path) -> tuple[int, str]:
        """Start a long-running command, wait for its first save of ``checkpoint``, SIGTERM it."""
        before = checkpoint.stat().st_mtime_ns if checkpoint.exists() else 0
        proc = subprocess.Popen(
            ["bash", "-c", "exec " + self.line(command)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=self.env, cwd=self.tmp,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            if checkpoint.exists() and checkpoint.stat().st_mtime_ns != before and _replaying(checkpoint):
                break
            time.sleep(0.2)
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        return proc.returncode, err


def _replaying(checkpoint: Path) -> bool:
    """Has the run behind ``checkpoint`` finished its snapshot (or taken none) and saved a position?"""
    try:
        data = json.loads(checkpoint.read_text())
    except (OSError, ValueError):
        return False  # being replaced right now
    return data["snapshot"]["status"] in ("done", "none") and bool(data["position"]["cluster_time"])


def _checkpoint_of(command: str, state: Path) -> Path:
    """The checkpoint a README command line uses: its --checkpoint, else its pair's default one."""
    words = shlex.split(command, comments=True)
    if "--checkpoint" in words:
        return Path(words[words.index("--checkpoint") + 1])
    flags = dict(zip(words[2::2], words[3::2], strict=False))
    source, target = flags.get("--source", flags.get("-s")), flags.get("--target", flags.get("-t"))
    prefix = flags.get("--topic-prefix", "mcdc")
    settings = resolve({"source": source, "target": target, "topic_prefix": prefix}, env={})
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_STATE_HOME", str(state))
        return settings.checkpoint_path()


def _block(prefix: str) -> list[str]:
    return next(lines for lines in _blocks() if lines[0].startswith(prefix))


def _ok(result: subprocess.CompletedProcess[str], command: str) -> None:
    assert result.returncode == 0, f"{command}\nexit {result.returncode}\n{result.stderr[-3000:]}"


@pytest.mark.integration
def test_the_readme_commands_run_as_written(
    source_uri: str, target_uri: str, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    if not kafka_broker.running:
        kafka_broker.start()
    with pymongo.MongoClient(source_uri) as client:
        client.shop.orders.insert_many([{"_id": i, "total": i * 10} for i in range(50)])
        client.logs.app.insert_many([{"_id": i} for i in range(5)])
        client.scratch.a.insert_many([{"_id": i} for i in range(5)])
    shell = Shell(
        tmp_path,
        {
            "mongodb://src1,src2/?replicaSet=rs0": source_uri,
            "mongodb://dst/?replicaSet=rs1": target_uri,
            "/var/lib/mcdc/": f"{tmp_path}/",
            "kafka://broker1:9092,broker2:9092": f"kafka://{kafka_broker.bootstrap}",
            "kafka://broker1:9092": f"kafka://{kafka_broker.bootstrap}",
            "--metrics-port 9464": f"--metrics-port {free_port()}",
        },
        {"SRC": source_uri, "DST": target_uri},
    )
    states: list[Path] = []
    for n, prefix in enumerate(RUN[1:]):
        if prefix.startswith("mcdc dev-server"):
            continue  # test_devserver.py runs the command; the trial block below runs it as the README does
        if not _commands(_block(prefix))[0].startswith(READS):  # a reader's first run: an empty target
            drop_user_databases(target_uri)
            states.append(tmp_path / f"state-{n}")
        # status's --source --target reads the pair's default checkpoint: the sync block's (the others name
        # theirs); the other reads follow the block before them
        state = states[0] if prefix.startswith("mcdc status") else states[-1]
        shell.env["XDG_STATE_HOME"] = str(state)
        for command in _commands(_block(prefix)):
            if command.startswith("mcdc tail"):
                jsonl = "jsonl:" in command
                expanded = shell.line(command).replace("$SRC", source_uri).replace("$DST", target_uri)
                code, err = shell.tail(command, _checkpoint_of(expanded, state))
                assert code == 0, f"{command}\nexit {code}\n{err[-3000:]}"
                if jsonl:
                    assert (tmp_path / "events.jsonl").stat().st_size > 0
            else:
                result = shell.run(command)
                _ok(result, command)
                if "| jq" in command:  # the documents themselves, not their after images as JSON strings
                    documents = [json.loads(line) for line in result.stdout.splitlines()]
                    assert documents and all(isinstance(d, dict) and "_id" in d for d in documents), result.stdout
                    assert any("total" in d for d in documents), result.stdout


@pytest.mark.integration
def test_the_readme_trial_on_two_dev_servers(tmp_path: Path) -> None:
    lines = _block(RUN[0])
    ports = {"27017": str(free_port()), "27018": str(free_port())}
    script = ["set -e", "trap 'kill $(jobs -p) 2>/dev/null; wait' EXIT"]
    for command in _commands(lines):
        for theirs, ours in ports.items():
            command = command.replace(theirs, ours)
        if command.startswith("mcdc dev-server"):  # "terminals 1 and 2 (or put & after both in one terminal)"
            port = command.split("--port ")[1].split()[0]
            script += [command.split("#")[0] + " > /dev/null &", _wait_for_port(port)]
        else:
            script.append(command)
    env = {
        **os.environ,
        "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"],
        "XDG_STATE_HOME": str(tmp_path / "state"),  # the default checkpoint, out of the home directory
    }
    result = subprocess.run(
        ["bash", "-c", "\n".join(script)], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "1,000 documents copied" in result.stdout and "0 differences" in result.stdout, result.stdout


def _wait_for_port(port: str) -> str:
    """A bash line waiting up to 60 s for a server to listen on ``port``."""
    return f"for _ in $(seq 300); do (exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null && break; sleep 0.2; done"


@pytest.mark.integration
@pytest.mark.parametrize("kind", ["filter", "selection", "everything"])
def test_the_migration_walkthrough_runs_as_written(source_uri: str, target_uri: str, tmp_path: Path, kind: str) -> None:
    """docs/how-to/migrate-a-cluster.md's commands, as written, for a migration of part of a collection, of one
    collection (without --filter), and of everything (without --include either): the application's writes on
    the new side (a collMod among them) go back, and the old side keeps what the migration did not copy."""
    with pymongo.MongoClient(source_uri) as client:
        client.shop.orders.insert_many([{"_id": i, "total": i} for i in range(50, 250)])
        client.shop.users.insert_many([{"_id": i} for i in range(5)])
        before = {d["_id"]: d for d in client.shop.orders.find({"total": {"$lt": 100}})}
    shell = Shell(tmp_path, {}, {"SRC": source_uri, "DST": target_uri, "XDG_STATE_HOME": str(tmp_path / "state")})
    for command in _commands(_block(WALKTHROUGH)):
        if kind != "filter":
            command = re.sub(r" --filter '[^']*'", "", command)
        if kind == "everything":
            command = re.sub(r" --include '[^']*'", "", command)
        if not command.startswith("mcdc tail"):
            _ok(shell.run(command), command)
            continue
        with pymongo.MongoClient(target_uri) as client:  # the application, moved to the new side
            client.shop.command("collMod", "orders", validator={"total": {"$exists": True}})
            client.shop.orders.update_one({"_id": 200}, {"$set": {"note": "paid"}})
            client.shop.orders.delete_one({"_id": 201})
            client.shop.orders.insert_one({"_id": 9999, "total": 500})
        proc = subprocess.Popen(["bash", "-c", "exec " + command], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True, env=shell.env, cwd=tmp_path)  # fmt: skip
        with pymongo.MongoClient(source_uri) as old:
            deadline = time.monotonic() + 120
            while old.shop.orders.find_one({"_id": 9999}) is None and proc.poll() is None:
                assert time.monotonic() < deadline, "the way back did not carry the new side's writes"
                time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err[-3000:]
    with pymongo.MongoClient(source_uri) as client:
        orders = {d["_id"]: d for d in client.shop.orders.find()}
    assert orders[200]["note"] == "paid" and 201 not in orders and orders[9999]["total"] == 500
    assert {i: orders.get(i) for i in before} == before  # copied or not, each is the old side's, as it was
