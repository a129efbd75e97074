"""Connection rebalancing on real processes: the Nacos loader API and automatic rebalancing.

The clients are raw gRPC connections that behave as the SDKs do when moved: a Java-like one
follows ConnectResetRequest to the server it names; a Python-like one (nacos-sdk-python 3.2.0
cannot parse the reset) is closed by the server and reconnects to a server of its list.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from v2.nacos import RegisterInstanceParam

from shoal.testing import ServerProcess, http_get, wait_until
from shoal.testing.moving import JAVA, PYTHON, MovingClient, acounts, aloader, loader, python_connections


@pytest.fixture
async def moving_clients() -> AsyncIterator[Callable[..., Any]]:
    made: list[MovingClient] = []

    async def factory(ports: list[int], first: int, n: int, python_every: int = 0) -> list[MovingClient]:
        batch = [MovingClient(ports, first, PYTHON if python_every and i % python_every == 0 else JAVA)
                 for i in range(n)]
        made.extend(batch)
        await asyncio.gather(*(c.start() for c in batch))
        return batch

    yield factory
    await asyncio.gather(*(c.stop() for c in made))


async def test_manual_loader_api_moves_the_requested_count(three_nodes: Callable[..., list[ServerProcess]],
                                                           moving_clients: Callable[..., Any]) -> None:
    ports = [n.port for n in three_nodes()]
    a, b, c = ports
    clients = await moving_clients(ports, a, 30, python_every=5)
    async def settled(expected: dict[int, int]) -> bool:
        return await acounts(a) == expected

    await wait_until(lambda: settled({a: 30, b: 0, c: 0}), timeout=15)
    current = loader(a, "current")
    assert len(current) == 30
    meta = next(iter(current.values()))["metaInfo"]
    assert meta["version"] in (JAVA, PYTHON) and meta["connectType"] == "GRPC"
    summary = loader(b, "cluster")
    assert (summary["total"], summary["max"], summary["min"], summary["memberCount"], summary["completed"]) == (
        30, 30, 0, 3, True)

    # Keep 20 on a: 10 move. The Java-like ones follow the reset to b; the Python-like ones are closed.
    assert await aloader(a, f"reloadCurrent?count=20&redirectAddress=127.0.0.1:{b}") == "success"
    async def moved() -> bool:
        now = await acounts(a)
        # a closed Python-like client picks a server of its list at random: it may come back to a
        back = sum(1 for cl in clients if cl.moves and cl.version == PYTHON and cl.port == a)
        return sum(cl.moves for cl in clients) == 10 and now[a] == 20 + back and sum(now.values()) == 30

    await wait_until(moved, timeout=20, interval=0.3)
    after = await acounts(a)
    java_moved = sum(1 for cl in clients if cl.moves and cl.version == JAVA)
    assert after[b] >= java_moved > 0

    # One client by id.
    conn_id = next(iter(loader(a, "current")))
    assert loader(a, f"reloadClient?connectionId={conn_id}&redirectAddress=127.0.0.1:{c}") == "success"
    async def gone() -> bool:
        return conn_id not in await aloader(a, "current")

    await wait_until(gone, timeout=15, interval=0.3)


async def test_automatic_rebalancing_evens_out_the_members(three_nodes: Callable[..., list[ServerProcess]],
                                                            moving_clients: Callable[..., Any]) -> None:
    ports = [n.port for n in three_nodes("-D", "shoal.rebalance.enabled=true", "-D", "shoal.rebalance.interval-ms=1000",
                                         "-D", "shoal.rebalance.rate=15")]
    a = ports[0]
    await moving_clients(ports, a, 60, python_every=3)

    async def balanced() -> bool:
        now = await acounts(a)
        total = sum(now.values())
        return total == 60 and max(now.values()) - min(now.values()) <= math.floor(0.1 * total / 3)

    await wait_until(balanced, timeout=90, interval=0.5)


async def test_nacos_sdk_python_is_moved_by_closing_its_stream(three_nodes: Callable[..., list[ServerProcess]],
                                                               sdk: Any) -> None:
    ports = [n.port for n in three_nodes()]
    client = await sdk(",".join(f"127.0.0.1:{p}" for p in ports))
    await client.register_instance(RegisterInstanceParam(service_name="moved", ip="10.40.0.1", port=1))

    before = await wait_until(lambda: python_connections(ports), what="the SDK's connection")
    (conn_id, home), = before.items()
    target = next(p for p in ports if p != home)
    assert await aloader(home, f"reloadClient?connectionId={conn_id}&redirectAddress=127.0.0.1:{target}") \
        == "success"

    async def reconnected() -> bool:
        now = await python_connections(ports)
        return bool(now) and conn_id not in now

    await wait_until(reconnected, timeout=30, what="the SDK to reconnect after its stream was closed")
    # it registers again on its new connection (its redo task runs every 30 s)
    def listed() -> bool:
        status, text = http_get(f"http://127.0.0.1:{ports[0]}/nacos/v1/ns/instance/list?serviceName=moved")
        return status == 200 and bool(json.loads(text)["hosts"])

    async def alisted() -> bool:
        return await asyncio.to_thread(listed)

    await wait_until(alisted, timeout=60, interval=0.5, what="the instance to be registered again")
