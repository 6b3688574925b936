"""A one-minute tour of mcdc on two local servers: sync, writes on the source, catch-up, verify.

    python scripts/demo.py [--workdir DIR]

Starts a source and a target SecantusDB server (the Python MongoDB-compatible server installed by
``pip install -e '.[dev]'``) with their data under ``--workdir`` (default ``.mcdc-demo/`` in the repository,
wiped at start), loads sample data (every BSON type, views, capped and validated collections, many index
kinds, plus 20,000 orders), then runs ``mcdc sync``, makes a few writes on the source, runs ``mcdc catch-up``
with the same checkpoint and ``mcdc verify``. Exits with verify's code; the servers are stopped on exit.
"""

from __future__ import annotations

import argparse
import datetime as dt
import shutil
import subprocess
import sys
import time
from pathlib import Path

import harness

from tests.support.corpus import load_bulk, load_corpus
from tests.support.servers import ServerPair, connect

_MARKER = ".mcdc-demo-workdir"  # only a directory holding it (or an empty one) is ever wiped
ORDERS = 20_000


def _fresh_workdir(path: Path) -> None:
    if path.exists():
        if any(path.iterdir()) and not (path / _MARKER).exists():
            raise SystemExit(f"demo: {path} is not empty and was not made by this demo; pass another --workdir")
        shutil.rmtree(path)
    path.mkdir(parents=True)
    (path / _MARKER).write_text("made by scripts/demo.py; wiped at each run\n")


def _run(argv: list[str]) -> int:
    """Run one mcdc command with its output on the terminal; return its exit code."""
    print(f"$ {harness.show(argv)}", flush=True)
    started = time.monotonic()
    code = subprocess.run(argv, check=False).returncode
    print(f"(exit {code}, {time.monotonic() - started:.1f} s)", flush=True)
    return code


def _load(pair: ServerPair, orders: int) -> None:
    with connect(pair.source_uri) as client:
        info = load_corpus(client, "corpus")
        load_bulk(client, "shop", "orders", orders, doc_size=512)
    for ns, count in info["namespaces"].items():
        print(f"  {ns:<28} {count:>6} documents")
    print(f"  {'shop.orders':<28} {orders:>6} documents")


def _write_on_source(pair: ServerPair, orders: int) -> None:
    with connect(pair.source_uri) as client:
        shop = client.shop
        new = [{"_id": orders + i, "name": f"late-{i}", "at": dt.datetime(2025, 1, 1)} for i in range(3)]
        shop.orders.insert_many(new)
        print(f"  inserted 3 orders (_id {orders}..{orders + 2})")
        updated = shop.orders.update_many({"_id": {"$lt": 10}}, {"$set": {"status": "shipped"}, "$inc": {"count": 1}})
        print(f"  updated {updated.modified_count} orders ($set status, $inc count)")
        shop.orders.replace_one({"_id": 10}, {"name": "replaced", "items": [1, 2, 3]})
        print("  replaced order 10")
        deleted = shop.orders.delete_many({"_id": {"$gte": 100, "$lt": 110}})
        print(f"  deleted {deleted.deleted_count} orders")
        shop.returns.insert_one({"_id": 1, "order": 5, "reason": "too big"})
        print("  created shop.returns with one document")
        shop.orders.create_index("status")
        print("  created index status_1 on shop.orders")


def demo(workdir: Path, orders: int) -> int:
    """The whole tour; returns mcdc verify's exit code (or the first failing command's)."""
    _fresh_workdir(workdir)
    checkpoint = workdir / "checkpoint.json"
    harness.heading(f"Starting two local SecantusDB servers under {workdir}")
    with harness.local_servers(workdir / "servers") as pair:
        print(f"  source: {pair.source_uri}\n  target: {pair.target_uri}")
        harness.heading("Loading sample data into the source")
        _load(pair, orders)
        uris = ["--source", pair.source_uri, "--target", pair.target_uri]

        harness.heading("mcdc sync: snapshot every collection, then replay what changed meanwhile")
        code = _run(harness.mcdc("sync", *uris, "--checkpoint", str(checkpoint)))
        if code != 0:
            return code

        harness.heading("Writing to the source after the sync")
        _write_on_source(pair, orders)

        harness.heading("mcdc catch-up: replay those changes from the checkpoint")
        code = _run(harness.mcdc("catch-up", *uris, "--checkpoint", str(checkpoint)))
        if code != 0:
            return code

        harness.heading("mcdc verify: compare source and target document by document")
        code = _run(harness.mcdc("verify", *uris))
        harness.heading("Stopping the servers")
    print("identical: the target is a byte-exact copy of the source" if code == 0 else f"verify exited {code}")
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--workdir",
        type=Path,
        default=harness.REPO_ROOT / ".mcdc-demo",
        help="servers' data, logs and the checkpoint; wiped at start (default: .mcdc-demo/ in the repository)",
    )
    parser.add_argument("--orders", type=int, default=ORDERS, help=f"documents in shop.orders (default {ORDERS})")
    args = parser.parse_args(argv)
    try:
        return demo(args.workdir.resolve(), args.orders)
    except KeyboardInterrupt:
        print("\ndemo: interrupted; servers stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
