"""Shared fixtures: a source and a target server per test session, wiped clean before each test.

Set MCDC_TEST_SOURCE_URI and MCDC_TEST_TARGET_URI to run against real servers instead of SecantusDB;
note that every database except admin, local and config on them is dropped before each test.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.servers import Clients, ServerPair, connect, drop_user_databases, start_pair


@pytest.fixture(scope="session")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerPair]:
    """The session's source and target servers (``.source``/``.target`` are None when external)."""
    pair = start_pair(tmp_path_factory.mktemp("servers"))
    try:
        yield pair
    finally:
        pair.stop()


@pytest.fixture
def source_uri(servers: ServerPair) -> str:
    """URI of the source server, with every non-system database dropped first."""
    drop_user_databases(servers.source_uri)
    return servers.source_uri


@pytest.fixture
def target_uri(servers: ServerPair) -> str:
    """URI of the target server, with every non-system database dropped first."""
    drop_user_databases(servers.target_uri)
    return servers.target_uri


@pytest.fixture
def clients(source_uri: str, target_uri: str) -> Iterator[Clients]:
    """Sync clients for source and target, closed at teardown."""
    pair = Clients(connect(source_uri), connect(target_uri))
    try:
        yield pair
    finally:
        pair.close()
