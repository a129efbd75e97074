"""Integration fixtures: real server processes and real nacos-sdk-python clients.

Every test collected under this directory carries the ``integration`` marker, so
``pytest -m "not integration"`` runs everything that needs no server process.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from shoal.testing import OPEN, AuthMode, NodeCluster, ServerProcess, kill, start_server

HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The hook sees the whole session's items; mark only the ones that live under this directory.
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    """Factory starting `shoal server` processes, :data:`OPEN` (no login anywhere) unless told
    ``auth=SECURE`` or given ``--auth``; every one is killed at teardown."""
    started: list[ServerProcess] = []

    def factory(*args: str, env: dict[str, str] | None = None, wait: bool = True,
                auth: AuthMode = OPEN) -> ServerProcess:
        server = start_server(tmp_path, list(args), env=env, wait=wait, auth=auth)
        started.append(server)
        return server

    yield factory
    for server in started:
        kill(server)


@pytest.fixture
def three_nodes(tmp_path: Path) -> Iterator[Callable[..., list[ServerProcess]]]:
    """Factory of three nodes on one member list (member reports every 300 ms), ``extra`` arguments
    going to each, :data:`OPEN` unless told; it returns them once all are ready (``ready_timeout``), all are
    killed at teardown."""
    made: list[NodeCluster] = []

    def factory(*extra: str, ready_timeout: float = 20, auth: AuthMode = OPEN) -> list[ServerProcess]:
        cluster = NodeCluster(tmp_path, 3, ["-D", "shoal.member.report-interval-ms=300"], auth=auth)
        made.append(cluster)
        cluster.start_all(*extra, timeout=ready_timeout)
        return cluster.all()

    yield factory
    for cluster in made:
        cluster.kill_all()


@pytest.fixture
def server(servers: Callable[..., ServerProcess]) -> ServerProcess:
    return servers()


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server for a whole module (its tests also show it keeps serving after each other's
    bad input). A small inbound limit makes the oversized-payload case cheap."""
    server = start_server(tmp_path_factory.mktemp("shared"),
                          ["-D", "nacos.remote.server.grpc.sdk.max-inbound-message-size=65536"], auth=OPEN)
    yield server
    kill(server)


@pytest.fixture
async def sdk(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    """Factory of real nacos-sdk-python 3.x (v2.nacos) naming clients; all shut down after."""
    from v2.nacos import ClientConfigBuilder, GRPCConfig, NacosNamingService

    made: list[Any] = []

    async def factory(addr: str, namespace: str = "") -> Any:
        builder = (ClientConfigBuilder().server_address(addr).log_level("WARNING")
                   .log_dir(str(tmp_path / "sdk-logs")).cache_dir(str(tmp_path / "sdk-cache"))
                   .grpc_config(GRPCConfig(grpc_timeout=5000)))
        if namespace:
            builder = builder.namespace_id(namespace)
        config = builder.build()
        config.set_update_cache_when_empty(True)
        client = await NacosNamingService.create_naming_service(config)
        made.append(client)
        return client

    yield factory
    for client in made:
        try:
            await client.shutdown()
        except Exception:  # a client whose server was killed may fail to close cleanly
            logging.getLogger(__name__).debug("sdk shutdown failed", exc_info=True)
