"""A source transaction the target will not take as one transaction, told in one line. Pure.

mongod aborts a transaction that lives longer than ``transactionLifetimeLimitSeconds`` (60 s by default):
the statement running then fails with TransactionExceededLifetimeLimitSeconds, a later one (or the commit)
with NoSuchTransaction, labelled TransientTransactionError. A retry of the same transaction meets the same
limit, so a replay would loop on it for ever: the second NoSuchTransaction of one source transaction is
taken as the limit. One too large for the target's cache fails with TransactionTooLargeForCache (6.0+);
before 4.2, one over 16 MB with TransactionTooLarge or BSONObjectTooLarge (its oplog entry's limit).
"""

from __future__ import annotations

from collections.abc import Sequence

from pymongo.errors import OperationFailure

from replicator.errors import SinkError
from replicator.events import ChangeEvent
from replicator.observe.tally import listing

LIFETIME = 290  # TransactionExceededLifetimeLimitSeconds
NO_SUCH_TRANSACTION = 251
TOO_LARGE_FOR_CACHE = 334  # TransactionTooLargeForCache
TOO_LARGE = frozenset({257, 10334})  # TransactionTooLarge, BSONObjectTooLarge (before MongoDB 4.2)

_FIX = {
    LIFETIME: (
        "it outlived the target's transactionLifetimeLimitSeconds",
        "raise it above the {seconds:.0f} s this one took "
        "(db.adminCommand({{setParameter: 1, transactionLifetimeLimitSeconds: N}}))",
    ),
    TOO_LARGE_FOR_CACHE: (
        "it is too large for the target's cache",
        "raise the target's transactionTooLargeForCacheThreshold (setParameter) or its cache",
    ),
    10334: ("it is over the target's 16 MB for one transaction", "upgrade the target to MongoDB 4.2 or later"),
}


def transaction_key(events: Sequence[ChangeEvent]) -> tuple[bytes, int] | None:
    """The source transaction ``events`` belong to, as a set's key."""
    txn = events[0].txn
    return txn.key if txn is not None else None


def refusal(
    exc: OperationFailure, events: Sequence[ChangeEvent], seconds: float, aborted_before: bool
) -> SinkError | None:
    """The line that stops the run when the target refused ``events`` (one source transaction) as one
    transaction for good; None for any other failure. ``aborted_before``: the target already aborted this
    transaction once (NoSuchTransaction)."""
    code = exc.code
    if code == NO_SUCH_TRANSACTION and aborted_before:
        code = LIFETIME
    elif code in TOO_LARGE:
        code = 10334
    if code not in _FIX:
        return None
    why, fix = _FIX[code]
    namespaces = listing(sorted({str(e.ns) for e in events}), 5)
    message = str(exc.details.get("errmsg") if exc.details else exc).splitlines()[0][:200]
    return SinkError(
        f"target: refused to replay a source transaction of {len(events)} writes on {namespaces} as one "
        f"transaction: {why} (code {exc.code}: {message}). {fix.format(seconds=seconds)}, and run mcdc again"
    )
