"""The peer that comes back lists no ghosts.

Three real nodes; real nacos-sdk-python clients on A and B, one instance each. Peer P is taken
away — SIGSTOP, or an iptables blackhole — long enough for A and B to mark it DOWN (from then on
nothing is queued for it), and some of the clients close their connections. Their owners remove
them, but P never gets the DELETE. When P is back, every node must list exactly the live
instances again within :data:`AGREE_S` (the issue's bound), with the default copy expiry
(180 s, which is how long P listed the ghosts before verify removed them). Nothing live is
removed on the way, no traceback, and no coroutine dropped unawaited.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from v2.nacos import ClientConfigBuilder, GRPCConfig, NacosNamingService, RegisterInstanceParam

from shoal.testing.faults import Partition, freeze, thaw, tracebacks
from shoal.testing.nodes import FAST_MEMBERS, FaultCluster

pytestmark = pytest.mark.faults

SERVICE = "ghosts"
#: The issue's goal: every node agrees at most this long after SIGCONT or the heal.
AGREE_S = 10.0
#: How long the test waits for agreement before it reports that there was none.
WAIT_S = 30.0
#: Clients per owner node, and how many of them close while P is away.
PER_OWNER, CLOSING = 3, 2


@pytest.fixture
async def sdk(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    """Factory of real nacos-sdk-python naming clients; those still open are shut down after."""
    made: list[Any] = []

    async def factory(addr: str) -> Any:
        config = (ClientConfigBuilder().server_address(addr).log_level("WARNING")
                  .log_dir(str(tmp_path / "sdk-logs")).cache_dir(str(tmp_path / "sdk-cache"))
                  .grpc_config(GRPCConfig(grpc_timeout=5000)).build())
        client = await NacosNamingService.create_naming_service(config)
        made.append(client)
        return client

    yield factory
    for client in made:
        with contextlib.suppress(Exception):  # already shut down by the test, or its server is gone
            await client.shutdown()


async def _views(cluster: FaultCluster, nodes: tuple[int, ...] = (0, 1, 2)) -> list[set[tuple[str, int]]]:
    """The instances of SERVICE on ``nodes`` (HTTP Open API), read off the event loop so the SDK
    clients keep answering their servers' probes."""
    return [await asyncio.to_thread(cluster.instance_ips, i, SERVICE) for i in nodes]


async def _states(cluster: FaultCluster, i: int) -> dict[str, str]:
    return await asyncio.to_thread(cluster.member_states, i)


async def _poll(predicate: Callable[[], Any], timeout: float, what: str) -> float:
    """Await ``predicate`` (a coroutine function) until truthy; seconds it took (AssertionError on timeout)."""
    started = time.monotonic()
    deadline = started + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        await asyncio.sleep(0.1)
    return time.monotonic() - started


async def _ghost_scenario(cluster: FaultCluster, sdk: Callable[..., Any], away: Callable[[], None],
                          back: Callable[[], None], label: str) -> None:
    cluster.start_all()
    p = cluster.addr(2)
    await _poll(lambda: _all_up(cluster), 30, "every member UP everywhere")
    clients: list[tuple[Any, tuple[str, int]]] = []
    for owner in (0, 1):
        for j in range(PER_OWNER):
            client = await sdk(cluster.addr(owner))
            ip = f"10.22.{owner}.{j + 1}"
            await client.register_instance(RegisterInstanceParam(service_name=SERVICE, ip=ip, port=8000))
            clients.append((client, (ip, 8000)))
    everything = {instance for _, instance in clients}

    async def agreed_on(expected: set[tuple[str, int]]) -> bool:
        return all(view == expected for view in await _views(cluster))

    await _poll(lambda: agreed_on(everything), 30, "every node to list every instance")
    logs_from = [len(cluster.nodes[i].log()) for i in range(3)]

    away()
    away_at = time.monotonic()

    async def p_down() -> bool:
        return [(await _states(cluster, i)).get(p) for i in (0, 1)] == ["DOWN", "DOWN"]

    await _poll(p_down, 30, f"A and B to mark {p} DOWN")
    closing = [c for owner in (0, 1) for c in clients[owner * PER_OWNER:owner * PER_OWNER + CLOSING]]
    for client, _ in closing:
        await client.shutdown()
    live = everything - {instance for _, instance in closing}

    async def owners_removed() -> bool:
        return await _views(cluster, (0, 1)) == [live, live]  # P answers nothing now

    await _poll(owners_removed, 30, "A and B to remove the closed clients")
    back()
    back_at = time.monotonic()
    try:
        agreed = await _poll(lambda: agreed_on(live), WAIT_S, f"{p} to drop the ghosts after {label}")
    except AssertionError:
        views = await _views(cluster)
        raise AssertionError(f"{label}: no agreement {WAIT_S:.0f} s after P came back; P lists "
                             f"{sorted(views[2] - live)} that no owner has") from None
    logs = [cluster.nodes[i].log()[logs_from[i]:] for i in range(3)]
    unawaited = sum(text.count("was never awaited") for text in logs)
    print(f"ghosts: P away {back_at - away_at:.1f} s ({label}); {len(closing)} clients closed meanwhile; "
          f"every node agreed {agreed:.1f} s after P came back; tracebacks {sum(map(tracebacks, logs))}, "
          f"unawaited coroutines {unawaited}")
    assert agreed <= AGREE_S, f"agreed only {agreed:.1f} s after {label}"
    assert sum(map(tracebacks, logs)) == 0
    assert unawaited == 0


async def _all_up(cluster: FaultCluster) -> bool:
    for i in range(3):
        if not all(s == "UP" for s in (await _states(cluster, i)).values()):
            return False
    return True


async def test_a_paused_peer_drops_the_clients_that_went_while_it_was_stopped(
        fault_cluster: Callable[..., FaultCluster], sdk: Callable[..., Any]) -> None:
    cluster = fault_cluster(3, *FAST_MEMBERS)
    await _ghost_scenario(cluster, sdk, lambda: freeze(cluster.nodes[2]), lambda: thaw(cluster.nodes[2]),
                          "SIGCONT")


async def test_a_cut_off_peer_drops_the_clients_that_went_while_it_was_unreachable(
        fault_cluster: Callable[..., FaultCluster], sdk: Callable[..., Any], partition: Partition) -> None:
    cluster = fault_cluster(3, *FAST_MEMBERS)
    await _ghost_scenario(cluster, sdk, lambda: partition.blackhole(cluster.hosts[2], cluster.ports_of(2)),
                          partition.heal, "the partition healed")
