"""The randomized fault harness on fixed seeds (tests/chaos/harness.py): every checkpoint mcdc saved
replays to a target identical to the source, through kill -9, restored checkpoints, server pauses and
restarts, and DDL churn. scripts/soak.py runs the same plans for as long as asked."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.harness import Plan, Servers, run_plan
from tests.support.kafka import KafkaBroker
from tests.support.servers import ServerPair

pytestmark = pytest.mark.integration


def _servers(pair: ServerPair, broker: KafkaBroker | None = None) -> Servers:
    if pair.source is None or pair.target is None:
        pytest.skip("the harness restarts its servers: external ones cannot be")
    return Servers(pair.source, pair.target, broker)


@pytest.mark.parametrize(("seed", "mode"), [(1, "tail"), (2, "catch-up"), (3, "tail")])
def test_asyncio_into_mongodb(
    servers: ServerPair, source_uri: str, target_uri: str, tmp_path: Path, seed: int, mode: str
) -> None:
    run_plan(Plan.draw(seed, mode=mode, length=5, replays=3), _servers(servers), tmp_path)
