"""Databricks Labs' Lakeflow conformance suite (``LakeflowConnectTests``) against mcdc's connector, live.

    python scripts/lakeflow_conformance.py [REPO] [--source URI] [-- PYTEST ARGS...]

``REPO`` (or $LAKEFLOW_REPO) is a checkout of databrickslabs/lakeflow-community-connectors. The script
pip-installs it into this interpreter's environment when it is not importable yet, starts a SecantusDB
test server (unless ``--source`` names a server; its ``lakeflow`` database is then replaced), loads a few
documents with updates, a transaction and deletes into ``lakeflow.orders`` and ``lakeflow.customers``,
places examples/lakeflow's connector in the checkout (``sources/mcdc/``) with the conformance test
(``tests/unit/sources/mcdc/``), and runs the checkout's pytest on it from the checkout's root with
``CONNECTOR_TEST_MODE=live`` and ``CONNECTOR_TEST_CONFIG_JSON``. Exits with pytest's code.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import harness  # noqa: F401  (puts the repository root on sys.path)
from bson import Decimal128, Int64, ObjectId

from tests.support.servers import LocalServer, connect

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "lakeflow"
DATABASE = "lakeflow"
_PACKAGE = "databricks.labs.community_connector"


def main() -> int:
    args = _parser().parse_args()
    repo = Path(args.repo or os.environ.get("LAKEFLOW_REPO") or "").expanduser()
    if not (repo / "tests" / "unit" / "sources" / "test_suite.py").is_file():
        raise SystemExit(
            "lakeflow_conformance: give a checkout of databrickslabs/lakeflow-community-connectors "
            "(argument or LAKEFLOW_REPO)"
        )
    _install(repo)
    _place(repo)
    with _server(args.source) as uri:
        _load(uri)
        config = {"source": uri, "include": rf"{DATABASE}\..*", "partition-docs": "20", "max-batch-size": "40"}
        env = {
            **os.environ,
            "CONNECTOR_TEST_MODE": "live",
            "CONNECTOR_TEST_CONFIG_JSON": json.dumps(config),
            # the checkout's tests and sources, and this repository's replicator (a worktree's wins)
            "PYTHONPATH": os.pathsep.join([str(repo / "src"), str(repo), str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        extra = args.pytest[1:] if args.pytest[:1] == ["--"] else args.pytest
        argv = [sys.executable, "-m", "pytest", "tests/unit/sources/mcdc", "-v", "-p", "no:cacheprovider", *extra]
        print("+ cd", repo, "&&", " ".join(argv), flush=True)
        return subprocess.run(argv, cwd=repo, env=env, check=False).returncode


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("repo", nargs="?", help="checkout of lakeflow-community-connectors (default: $LAKEFLOW_REPO)")
    parser.add_argument("--source", help="a MongoDB URI to use instead of a local test server")
    parser.add_argument("pytest", nargs=argparse.REMAINDER, help="arguments for pytest, after --")
    return parser


def _install(repo: Path) -> None:
    """The checkout, installed where this interpreter finds it (its deps: pydantic, pyyaml, pyjwt,
    requests; PySpark is mcdc's own)."""
    if importlib.util.find_spec(_PACKAGE.split(".")[0]) is not None:
        with contextlib.suppress(ModuleNotFoundError):
            if importlib.util.find_spec(_PACKAGE) is not None:
                return
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "-e", str(repo)], check=True)


def _place(repo: Path) -> None:
    """examples/lakeflow's connector and conformance test, copied into the checkout (never the other way)."""
    sources = repo / "src" / Path(*_PACKAGE.split(".")) / "sources" / "mcdc"
    tests = repo / "tests" / "unit" / "sources" / "mcdc"
    for directory in (sources, tests):
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
    for name in ("__init__.py", "mcdc.py"):
        shutil.copy(EXAMPLE / "connector" / name, sources / name)
    (tests / "__init__.py").write_text("")
    shutil.copy(EXAMPLE / "test_mcdc_lakeflow_connect.py", tests / "test_mcdc_lakeflow_connect.py")


@contextlib.contextmanager
def _server(uri: str | None) -> Iterator[str]:
    if uri:
        yield uri
        return
    with tempfile.TemporaryDirectory(prefix="mcdc-lakeflow-") as tmp:
        server = LocalServer(Path(tmp) / "source")
        server.spawn()
        try:
            server.wait_ready()
            yield server.uri
        finally:
            server.kill()


def _load(uri: str) -> None:
    """Two collections, each with documents of several ``_id`` types, updates, a transaction and deletes."""
    with connect(uri) as client:
        client.drop_database(DATABASE)
        db = client[DATABASE]
        orders, customers = db.create_collection("orders"), db.create_collection("customers")
        now = dt.datetime(2026, 11, 28, 12, 0, tzinfo=dt.UTC)
        orders.insert_many(
            [
                {"_id": i, "total": Decimal128(f"{i}.50"), "at": now, "lines": [{"sku": f"s{i}", "n": Int64(i)}]}
                for i in range(60)
            ]
        )
        customers.insert_many([{"_id": ObjectId(), "name": f"c{i}", "tags": ["a", i]} for i in range(30)])
        customers.insert_one({"_id": "by-name", "name": "text key"})
        orders.update_many({"_id": {"$lt": 10}}, {"$set": {"status": "paid"}})
        with client.start_session() as session, session.start_transaction():
            orders.insert_one({"_id": 100, "total": Decimal128("1.00")}, session=session)
            customers.update_one({"_id": "by-name"}, {"$set": {"vip": True}}, session=session)
            orders.delete_one({"_id": 59}, session=session)
        orders.delete_many({"_id": {"$gte": 50, "$lt": 55}})
        customers.delete_one({"name": "c0"})
        orders.replace_one({"_id": 1}, {"total": Decimal128("9.99")})


if __name__ == "__main__":
    sys.exit(main())
