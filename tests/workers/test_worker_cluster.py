"""A cluster of three real nodes of two workers each, on loopback, CP store on managed etcd (issue 21).

Each node is a supervisor (which runs the node's etcd member) and two workers; every worker is a
Distro member of its own. To the outside the cluster stays three nodes: the member list, what
every worker of every node lists, pushes across nodes, CP writes, and a worker killed under load.
The cluster is shared by the module's tests (each uses its own services); the kill comes last.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from shoal.testing import OPEN, CpCluster, ServerProcess, call, poll_until, wait_until
from shoal.testing.openapi import register
from shoal.testing.workers import (
    every_worker,
    listed_by_every_worker,
    worker_client_ids,
    worker_connections,
    worker_listed_ips,
)

pytestmark = pytest.mark.integration

WORKERS = 2


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CpCluster]:
    nodes = CpCluster(tmp_path_factory.mktemp("worker-cluster"), 3, auth=OPEN, workers=WORKERS)
    with nodes:
        nodes.start_all()
        yield nodes


async def listed_everywhere(cluster: CpCluster, service: str, ips: set[str]) -> bool:
    return await asyncio.to_thread(listed_by_every_worker, cluster.all(), service, ips)


async def everywhere(cluster: CpCluster, service: str, ips: set[str], timeout: float, what: str) -> None:
    """Wait until every worker of every node lists exactly ``ips`` for ``service``; on timeout,
    say what each worker listed."""
    try:
        await wait_until(lambda: listed_everywhere(cluster, service, ips), timeout, what=what)
    except AssertionError as exc:
        seen = {f"{node.port}/{i}": await asyncio.to_thread(worker_listed_ips, node, i, service)
                for node, i in every_worker(cluster.all())}
        raise AssertionError(f"{exc}; listed: {seen}") from None


def test_every_node_and_worker_lists_three_members_up(cluster: CpCluster) -> None:
    expected = {cluster.addr(i): "UP" for i in range(len(cluster))}
    # A node whose workers were still starting refused the first reports (it binds the public ports
    # only once it serves), so a peer may hold it DOWN until the next report round (2 s) or its own
    # report comes in: the states converge within a few rounds, one member per node, never per worker.
    for i in range(len(cluster)):
        poll_until(lambda i=i: cluster.member_states(i) == expected, 15,
                   what=f"node {i} to list every node UP, once each")
    for node, index in every_worker(cluster.all()):
        status, text = call("GET", node.worker_url(index, "/nacos/v1/core/cluster/nodes"))
        assert status == 200, text
        assert sorted(text.count(addr) for addr in expected) == [1, 1, 1], text
        for private in node.worker_ports():
            assert f":{private}\"" not in text, f"worker port {private} listed as a node: {text}"


async def test_http_and_grpc_registrations_are_listed_by_every_worker(cluster: CpCluster, sdk: Any) -> None:
    from v2.nacos import RegisterInstanceParam

    first, second = cluster.node(0), cluster.node(1)
    assert (await asyncio.to_thread(register, first, "wc-http", "10.21.0.1", 80))[0] == 200
    client = await sdk(second.addr)
    assert await client.register_instance(RegisterInstanceParam(service_name="wc-grpc", ip="10.21.0.2", port=81))
    await everywhere(cluster, "wc-http", {"10.21.0.1"}, 15, "every worker to list the HTTP instance")
    await everywhere(cluster, "wc-grpc", {"10.21.0.2"}, 15, "every worker to list the gRPC instance")


async def test_a_subscriber_on_one_node_gets_the_push_for_a_registration_on_another(
        cluster: CpCluster, sdk: Any) -> None:
    from v2.nacos import RegisterInstanceParam, SubscribeServiceParam

    a, c = cluster.node(0), cluster.node(2)
    subscriber, registrar = await sdk(a.addr), await sdk(c.addr)
    pushed: list[set[str]] = []

    async def on_push(instances: list[Any]) -> None:
        pushed.append({i.ip for i in instances})

    await subscriber.subscribe(SubscribeServiceParam(service_name="wc-push", subscribe_callback=on_push))
    sub_held = set().union(*[await asyncio.to_thread(worker_connections, a, i) for i in range(a.workers)])
    assert await registrar.register_instance(RegisterInstanceParam(service_name="wc-push", ip="10.21.1.3", port=3))
    reg_held = set().union(*[await asyncio.to_thread(worker_connections, c, i) for i in range(c.workers)])
    assert sub_held and reg_held and not sub_held & reg_held  # two connections, on workers of two nodes
    await wait_until(lambda: any("10.21.1.3" in ips for ips in pushed), 15,
                     what="node A's subscriber to get the push for node C's registration")


async def test_subscriber_and_registrar_on_different_workers_of_different_nodes(
        cluster: CpCluster, sdk: Any) -> None:
    """The stock SDK subscribes through worker 0 of node A and registers through worker 1 of
    node C (new connections until the kernel gives each worker one)."""
    from v2.nacos import RegisterInstanceParam, SubscribeServiceParam

    a, c = cluster.node(0), cluster.node(2)
    on_a = await _client_on_worker(a, 0, sdk)
    on_c = await _client_on_worker(c, 1, sdk)
    pushed: list[set[str]] = []

    async def on_push(instances: list[Any]) -> None:
        pushed.append({i.ip for i in instances})

    await on_a.subscribe(SubscribeServiceParam(service_name="wc-cross", subscribe_callback=on_push))
    assert await on_c.register_instance(RegisterInstanceParam(service_name="wc-cross", ip="10.21.2.4", port=4))
    await wait_until(lambda: any("10.21.2.4" in ips for ips in pushed), 15,
                     what="worker 0 of node A to push worker 1 of node C's registration")


async def _client_on_worker(node: ServerProcess, index: int, sdk: Any) -> Any:
    """A new SDK client whose connection worker ``index`` of ``node`` holds."""
    from v2.nacos import ListServiceParam

    for _ in range(40):
        before = await asyncio.to_thread(worker_connections, node, index)
        client = await sdk(node.addr)
        await client.list_services(ListServiceParam())
        if await asyncio.to_thread(worker_connections, node, index) - before:
            return client
    raise AssertionError(f"the kernel never gave worker {index} of {node.port} a connection")


async def test_a_persistent_instance_written_on_one_worker_is_listed_everywhere(cluster: CpCluster) -> None:
    node = cluster.node(1)
    status, text = await asyncio.to_thread(
        call, "POST", node.worker_url(1, "/nacos/v1/ns/instance"),
        {"serviceName": "wc-durable", "ip": "10.21.3.1", "port": 80, "ephemeral": "false"})
    assert status == 200, text
    await everywhere(cluster, "wc-durable", {"10.21.3.1"}, 15, "every worker to list the persistent instance")


async def test_a_killed_worker_is_restarted_losing_nothing_and_leaving_no_ghost(
        cluster: CpCluster, sdk: Any) -> None:
    from v2.nacos import RegisterInstanceParam

    b = cluster.node(1)
    assert (await asyncio.to_thread(register, b, "wk-http", "10.21.4.1", 80))[0] == 200
    status, _ = await asyncio.to_thread(
        call, "POST", b.url("/nacos/v1/ns/instance"),
        {"serviceName": "wk-durable", "ip": "10.21.4.2", "port": 80, "ephemeral": "false"})
    assert status == 200
    victim = 0
    clients = [await _client_on_worker(b, victim, sdk), await _client_on_worker(b, 1 - victim, sdk)]
    redo = set()
    for n, client in enumerate(clients):
        ip = f"10.21.4.{n + 10}"
        assert await client.register_instance(RegisterInstanceParam(service_name="wk-redo", ip=ip, port=2))
        redo.add(ip)
    kept = {"wk-http": {"10.21.4.1"}, "wk-durable": {"10.21.4.2"}, "wk-redo": redo}
    for service, ips in kept.items():
        await everywhere(cluster, service, ips, 15, f"every worker to list {service} before the kill")
    ghosts = await asyncio.to_thread(worker_connections, b, victim)
    assert ghosts
    old = b.worker_pids()[victim]
    os.kill(old, signal.SIGKILL)
    new = await asyncio.to_thread(b.wait_worker_restarted, victim, old)
    assert new != old
    state = b.workers_state()
    assert state is not None and state["workers"][victim]["restarts"] == 1
    # The client the dead worker held reconnects at once (to the live worker) but nacos-sdk-python
    # 3.x redoes its registrations only on its redo timer (every 30 s): the instance is back within it.
    for service, ips in kept.items():
        await everywhere(cluster, service, ips, 45, f"every worker to list {service} after the kill")

    async def no_ghost() -> bool:
        for node, i in every_worker(cluster.all()):
            if ghosts & await asyncio.to_thread(worker_client_ids, node, i):
                return False
        return True
    await wait_until(no_ghost, 30, what="the killed worker's connections to leave every worker of every node")
    for node in cluster.all():
        node.check_alive()
