"""Numbers that never mislead (issue 41): the lag and canCommit of an idle checkpoint, the time a cutover
names, the migrations ``status`` lists, and the one vocabulary of states in ``status`` and ``/progress``."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pymongo
import pytest

from tests.test_cli import _mcdc


def _status(*args: str, env: dict[str, str]) -> dict[str, Any]:
    result = _mcdc("status", *args, "--json", env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def _run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    result = _mcdc(*args, "--no-progress", env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    return result


@pytest.mark.integration
def test_an_idle_reverse_checkpoint_has_no_lag_and_one_can_commit_whichever_way_status_finds_it(
    source_uri: str, target_uri: str, tmp_path: Path
) -> None:
    """A cutover's reverse checkpoint is at the new source's latest time: status finds it by --source and
    --target or by --checkpoint alone, and both say lag 0 (caught up) and the same canCommit."""
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    with pymongo.MongoClient(source_uri) as client:
        client.shop.orders.insert_many([{"_id": i} for i in range(20)])
    pair = ("-s", source_uri, "-t", target_uri)
    _run("sync", *pair, env=env)
    reverse = json.loads(_run("cutover", *pair, "--json", env=env).stdout)["reverse_checkpoint"]

    by_pair = _status("-s", target_uri, "-t", source_uri, env=env)
    by_path = _status("-c", reverse, env=env)
    assert by_pair["checkpoint"] == by_path["checkpoint"] == reverse
    for found in (by_pair, by_path):
        assert found["lag_s"] == 0 and found["progress"]["lagTimeSeconds"] == 0, found
    assert by_pair["lag_measured_against"] == by_path["lag_measured_against"]
    assert by_pair["progress"]["canCommit"] == by_path["progress"]["canCommit"]
    shown = _mcdc("status", "-c", reverse, env=env)
    assert "(caught up)" in shown.stdout, shown.stdout
