"""Module-scoped servers with and without auth for the test modules of the HTTP APIs; they take
the fixtures by assignment (``node = admin.node``). The helpers behind them are
:mod:`shoal.testing.auth`'s."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from shoal.testing import OPEN, ServerProcess, kill, start_server
from shoal.testing.auth import start_with_admin


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server without auth for the whole module."""
    server = start_server(tmp_path_factory.mktemp("node"), auth=OPEN)
    yield server
    kill(server)


@pytest.fixture(scope="module")
def auth_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server with auth and the admin ``nacos`` for the whole module."""
    server = start_with_admin(tmp_path_factory.mktemp("authnode"))
    yield server
    kill(server)
