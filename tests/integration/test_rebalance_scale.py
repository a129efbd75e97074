"""Rebalancing at the issue's scale: three nodes, 300 connections all on one node after the other
two restart.

The 300 connections are raw gRPC channels in this process (:class:`MovingClient`), a third of
them Python-like (closed by the server, they reconnect to a random server of their list), the
rest Java-like (they follow ConnectResetRequest); each publishes one instance and registers it
again on its new connection, so the moved clients' kept copies (the grace period) are released
as they come back.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator, Callable

import pytest

from shoal.testing import ServerProcess, wait_until
from shoal.testing.moving import JAVA, PYTHON, MovingClient, acounts, aloader, instance_body, listed, loader

pytestmark = pytest.mark.slow

log = logging.getLogger(__name__)

N = 300
SERVICE = "scale"


@pytest.fixture
async def clients() -> AsyncIterator[list[MovingClient]]:
    made: list[MovingClient] = []
    yield made
    await asyncio.gather(*(c.stop() for c in made))


async def all_on_the_first_after_the_others_restart(servers: list[ServerProcess],
                                                    made: list[MovingClient]) -> list[int]:
    """N clients spread over the three nodes; the other two restart; every client ends on the first."""
    ports = [s.port for s in servers]
    a = ports[0]
    for i in range(N):
        made.append(MovingClient(ports, ports[i % 3], PYTHON if i % 3 == 0 else JAVA,
                                 instance_body(SERVICE, f"10.60.{i // 250}.{i % 250}", 1)))
    for start in range(0, N, 50):  # in slices: 300 handshakes at once only queue on this small box
        await asyncio.gather(*(c.start() for c in made[start:start + 50]))
    for server in servers[1:]:
        server.kill()

    async def all_on_a() -> bool:
        return sum(1 for c in made if c.port == a and c.client is not None) == N

    await wait_until(all_on_a, timeout=90, interval=0.5, what="every client to reconnect to the node left")
    assert await acounts(a) == {a: N}  # the only member answering
    for server in servers[1:]:
        server.start()
    for server in servers[1:]:
        await asyncio.to_thread(server.wait_ready, 60)
    return ports


async def settled_registry(ports: list[int]) -> None:
    """Every node lists the N instances, the N connections are counted once, and no node keeps
    a moved client any more: each came back and its old copy was released."""
    def done() -> bool:
        metrics = loader(ports[0], "cluster")["detail"]
        return (all(len(listed(p, SERVICE)) == N for p in ports) and len(metrics) == 3
                and sum(int(m["metric"]["sdkConCount"]) for m in metrics) == N
                and all(m["metric"]["keptClients"] == "0" for m in metrics))

    await wait_until(lambda: asyncio.to_thread(done), timeout=90, interval=1,
                     what="every node to list the N instances with no moved client kept")


async def test_the_manual_api_moves_the_requested_count_of_300(three_nodes: Callable[..., list[ServerProcess]],
                                                              clients: list[MovingClient]) -> None:
    ports = await all_on_the_first_after_the_others_restart(three_nodes(ready_timeout=30), clients)
    a, b, c = ports

    async def counted() -> bool:
        return await acounts(a) == {a: N, b: 0, c: 0}

    await wait_until(counted, timeout=60, interval=0.5, what="every member to report, all connections on a")
    before = {id(cl): cl.moves for cl in clients}
    assert await aloader(a, f"reloadCurrent?count=200&redirectAddress=127.0.0.1:{b}") == "success"

    async def moved() -> bool:
        now = await acounts(a)
        gone = [cl for cl in clients if cl.moves > before[id(cl)]]
        back = sum(1 for cl in gone if cl.port == a)  # a closed Python-like one may pick a again
        return len(gone) == N - 200 and sum(now.values()) == N and now[a] == 200 + back

    await wait_until(moved, timeout=60, interval=0.5, what="100 connections to move off a")
    java_moved = sum(1 for cl in clients if cl.version == JAVA and cl.port == b)
    assert (await acounts(a))[b] >= java_moved > 0
    await settled_registry(ports)


async def test_automatic_rebalancing_evens_300_out_within_ten_percent(three_nodes: Callable[..., list[ServerProcess]],
                                                                     clients: list[MovingClient]) -> None:
    servers = three_nodes("-D", "shoal.rebalance.enabled=true", "-D", "shoal.rebalance.interval-ms=1000",
                          "-D", "shoal.rebalance.rate=50", ready_timeout=30)
    started = time.monotonic()
    ports = await all_on_the_first_after_the_others_restart(servers, clients)
    a = ports[0]
    back_at = time.monotonic()

    async def balanced() -> bool:
        now = await acounts(a)
        total = sum(now.values())
        return total == N and max(now.values()) - min(now.values()) <= math.floor(0.1 * total / 3)

    await wait_until(balanced, timeout=180, interval=0.5, what="the three nodes to be within 10% of each other")
    log.warning("300 connections balanced %.1f s after the restarted nodes were counted (%.1f s in all): %s",
                time.monotonic() - back_at, time.monotonic() - started, await acounts(a))
    await settled_registry(ports)
