"""Multi-worker nodes (``shoal server --workers N``): real supervisor and worker processes.

Every module here sets ``pytestmark = pytest.mark.integration``, the marker tests/integration's carry.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from shoal.testing import OPEN, ServerProcess, kill, start_server


@pytest.fixture
def two_workers(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    """Factory of a node run by a supervisor and two workers (OPEN), ready and with both workers
    answering on their private ports; killed (the supervisor, the workers with it) at teardown."""
    started: list[ServerProcess] = []

    def factory(*args: str) -> ServerProcess:
        server = start_server(tmp_path, list(args), auth=OPEN, workers=2)
        started.append(server)
        server.wait_workers()
        return server

    yield factory
    for server in started:
        kill(server)


@pytest.fixture
async def sdk(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    """Factory of real nacos-sdk-python 3.x (v2.nacos) naming clients; all shut down after."""
    from v2.nacos import ClientConfigBuilder, GRPCConfig, NacosNamingService

    made: list[Any] = []

    async def factory(addr: str) -> Any:
        config = (ClientConfigBuilder().server_address(addr).log_level("WARNING")
                  .log_dir(str(tmp_path / "sdk-logs")).cache_dir(str(tmp_path / "sdk-cache"))
                  .grpc_config(GRPCConfig(grpc_timeout=5000))).build()
        config.set_update_cache_when_empty(True)
        client = await NacosNamingService.create_naming_service(config)
        made.append(client)
        return client

    yield factory
    for client in made:
        try:
            await client.shutdown()
        except Exception:  # a client whose worker was killed may fail to close cleanly
            logging.getLogger(__name__).debug("sdk shutdown failed", exc_info=True)
