"""A source transaction the target will not take as one transaction (issue 50, item 4): mcdc stops in one line,
without looping, and doing what the line says ends with ``verify`` exit 0.

mongod refuses a transaction that lives longer than ``transactionLifetimeLimitSeconds`` (60 s by default):
the statement running when it expires fails with TransactionExceededLifetimeLimitSeconds (290), a later one
with NoSuchTransaction (251, labelled TransientTransactionError, which a retry meets again); and one too large
for its cache with TransactionTooLargeForCache (334). The test server has none of those limits (it knows no
``transactionLifetimeLimitSeconds``): its ``failCommand`` fail point answers the transaction's writes as mongod
does, and turning it off stands for the raised limit. A 50,000-document transaction's replay, and mcdc's
memory for it, are measured by ``scripts/bench_big_txn.py``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pymongo
import pytest

from tests.support.failpoint import Fault, arm, disarm

pytestmark = pytest.mark.integration

LIFETIME, NO_SUCH_TRANSACTION, TOO_LARGE_FOR_CACHE = 290, 251, 334


def _mcdc(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "replicator.cli", *args], capture_output=True, text=True, timeout=180)


def _transaction(uri: str, docs: int) -> None:
    with pymongo.MongoClient(uri) as client, client.start_session() as session, session.start_transaction():
        client.big.txn.insert_many([{"_id": n, "pad": "x" * 200} for n in range(docs)], session=session)
        client.big.other.insert_one({"_id": "in the same transaction"}, session=session)


@pytest.mark.parametrize(
    ("code", "labels", "says"),
    [
        (LIFETIME, [], "transactionLifetimeLimitSeconds"),
        (NO_SUCH_TRANSACTION, ["TransientTransactionError"], "transactionLifetimeLimitSeconds"),
        (TOO_LARGE_FOR_CACHE, [], "transactionTooLargeForCacheThreshold"),
    ],
)
def test_a_transaction_the_target_refuses_stops_mcdc_in_one_line_and_the_advice_converges(
    source_uri: str, target_uri: str, tmp_path: Path, code: int, labels: list[str], says: str
) -> None:
    with pymongo.MongoClient(source_uri) as client:
        client.big.create_collection("txn")
        client.big.create_collection("other")
    common = ["-s", source_uri, "-t", target_uri, "-c", str(tmp_path / "cp.json"), "--include", r"big\..*"]
    retries = ["--max-retries", "5", "--retry-initial-delay", "0.1", "--retry-max-delay", "0.2"]
    assert _mcdc("sync", *common, "--no-progress").returncode == 0
    _transaction(source_uri, 2000)
    data = {"errorCode": code, **({"errorLabels": labels} if labels else {})}
    # every write of mcdc's to the target: the transaction's statements and its commit
    arm(target_uri, Fault(f"error {code}", data), ["insert", "update", "delete", "commitTransaction"])
    try:
        refused = _mcdc("catch-up", *common, *retries, "--no-progress")
    finally:
        disarm(target_uri)
    errors = [line for line in refused.stderr.splitlines() if line.startswith("mcdc: error:")]
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert len(errors) == 1 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    line = errors[0]
    assert line.startswith("mcdc: error: target: refused to replay a source transaction of 2001 writes"), line
    assert "big.other, big.txn" in line and says in line and "run mcdc again" in line
    # stopped, not looping: a NoSuchTransaction is tried once more (an election aborts one too), no more
    assert refused.stderr.count("retrying in") == (1 if code == NO_SUCH_TRANSACTION else 0), refused.stderr
    with pymongo.MongoClient(target_uri) as client:
        assert client.big.txn.count_documents({}) == 0  # nothing of it applied
    # what the line says: the target's limit raised (here, the fail point off), then mcdc again
    again = _mcdc("catch-up", *common, "--no-progress")
    assert again.returncode == 0, again.stderr[-3000:]
    with pymongo.MongoClient(target_uri) as client:
        assert client.big.txn.count_documents({}) == 2000
    checked = _mcdc("verify", *common)
    assert checked.returncode == 0, checked.stdout + checked.stderr
