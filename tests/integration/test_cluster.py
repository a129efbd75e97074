"""Three (or four) real `shoal server` processes replicating with Distro on loopback."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from v2.nacos import ListInstanceParam, RegisterInstanceParam, SubscribeServiceParam

from shoal.config import TestHooks
from shoal.distro.snapshot import SNAPSHOT_REQUEST
from shoal.distro.sync import SYNC_REQUEST
from shoal.distro.verify import DETAIL_REQUEST
from shoal.testing import OPEN, NodeCluster, ServerProcess, http_get, kill, wait_until
from shoal.testing.rawclient import RawClient, register_body

from .test_sdk_naming import Pushes, spawn_client

# These tests exercise Distro (AP) only: each node keeps its CP store embedded instead of starting
# a managed etcd member (tests/integration/test_persistent.py covers the managed-etcd cluster).
FAST = ["-D", "shoal.cp.mode=embedded",
        "-D", "nacos.core.protocol.distro.data.verify.intervalMs=1000",
        "-D", "shoal.member.report-interval-ms=300",
        "-D", "nacos.core.member.fail-access-cnt=2",
        "-D", "nacos.core.protocol.distro.data.load.timeoutMs=8000",
        "-D", "nacos.core.protocol.distro.data.load.retryDelayMs=300"]


def peer_requests(server: ServerProcess, type_name: str, **labels: str) -> float:
    """How many cluster-port requests of ``type_name`` the node has answered (its Prometheus counter)."""
    return server.metric("requests_total", transport="cluster", type=type_name, **labels)


@pytest.fixture
def cluster_of(tmp_path: Path) -> Iterator[Callable[[int], NodeCluster]]:
    made: list[NodeCluster] = []

    def factory(size: int) -> NodeCluster:
        cluster = NodeCluster(tmp_path, size, FAST, auth=OPEN)
        made.append(cluster)
        return cluster

    yield factory
    for cluster in made:
        cluster.kill_all()


async def ips(client: Any, service: str) -> set[tuple[str, int]]:
    found = await client.list_instances(ListInstanceParam(service_name=service, subscribe=False, healthy_only=None))
    return {(i.ip, i.port) for i in found}


async def test_register_replicates_pushes_and_disappears_with_its_client(
        cluster_of: Callable[[int], NodeCluster], sdk: Any, tmp_path: Path) -> None:
    cluster = cluster_of(3)
    cluster.start_all()
    a, b, c = [await sdk(cluster.addr(i)) for i in range(3)]
    pushes = Pushes()
    await c.subscribe(SubscribeServiceParam(service_name="repl", subscribe_callback=pushes))
    await a.register_instance(RegisterInstanceParam(service_name="repl", ip="10.20.0.1", port=1,
                                                    metadata={"zone": "z1"}))
    for node in (b, c):
        await wait_until(lambda n=node: _eq(ips(n, "repl"), {("10.20.0.1", 1)}), what="replica")
    await wait_until(lambda: pushes.latest_ips() == {("10.20.0.1", 1)}, what="push on C for a write on A")
    [inst] = await b.list_instances(ListInstanceParam(service_name="repl", subscribe=False, healthy_only=None))
    assert inst.metadata == {"zone": "z1"}

    child = await asyncio.to_thread(spawn_client, _Addr(cluster.addr(0)), tmp_path, "repl")
    try:
        for node in (b, c):
            await wait_until(lambda n=node: _eq(ips(n, "repl"), {("10.20.0.1", 1), ("10.6.0.9", 9)}),
                           what="child's instance everywhere")
        os.kill(child.pid, signal.SIGKILL)
        for node in (b, c):
            await wait_until(lambda n=node: _eq(ips(n, "repl"), {("10.20.0.1", 1)}), what="killed client gone")
    finally:
        child.kill()
        child.wait()


async def test_lost_node_failover_restart_and_snapshot(cluster_of: Callable[[int], NodeCluster], sdk: Any) -> None:
    cluster = cluster_of(3)
    cluster.start_all()
    every = ",".join(cluster.addr(i) for i in range(3))
    mover = await sdk(every)
    await mover.register_instance(RegisterInstanceParam(service_name="ha", ip="10.30.0.1", port=1))
    home = next(i for i in range(3) if cluster.gauge(i, "connections") == 1)
    survivors = [i for i in range(3) if i != home]
    watchers = {i: await sdk(cluster.addr(i)) for i in survivors}
    for i in survivors:
        await wait_until(lambda w=watchers[i]: _eq(ips(w, "ha"), {("10.30.0.1", 1)}), what="replicated")

    kill(cluster.nodes[home])  # SIGKILL: no goodbye
    # The survivors keep serving, and the client fails over and registers again on one of them
    # (nacos-sdk-python's redo runs every 30 s). Until the dead node's copies expire or it comes
    # back, a survivor holds both the old synced copy and the new registration.
    await wait_until(lambda: any(cluster.gauge(i, "connections") == 2 and cluster.gauge(i, "instances") == 2
                               for i in survivors), timeout=45, what="the client to fail over and re-register")
    for i in survivors:
        assert await ips(watchers[i], "ha") == {("10.30.0.1", 1)}

    served = {i: peer_requests(cluster.nodes[i], SNAPSHOT_REQUEST) for i in survivors}
    cluster.start(home)  # restarts on its old port, loads a snapshot, then serves
    assert sum(peer_requests(cluster.nodes[i], SNAPSHOT_REQUEST) - served[i] for i in survivors) >= 1
    restarted = await sdk(cluster.addr(home))
    await wait_until(lambda: _eq(ips(restarted, "ha"), {("10.30.0.1", 1)}), what="restarted node agrees")
    # as the owner of its previous run's connection clients it deleted them everywhere
    await wait_until(lambda: all(cluster.gauge(i, "instances") == 1 for i in range(3)), what="one copy everywhere")


async def test_divergence_is_repaired_by_verify(cluster_of: Callable[[int], NodeCluster], sdk: Any) -> None:
    cluster = cluster_of(3)
    cluster.start_all(envs={1: TestHooks(drop_incoming_sync=1).to_env()})  # B loses one batch
    a, b, c = [await sdk(cluster.addr(i)) for i in range(3)]
    await a.register_instance(RegisterInstanceParam(service_name="heal", ip="10.40.0.1", port=1))
    await wait_until(lambda: _eq(ips(c, "heal"), {("10.40.0.1", 1)}), what="C in sync")
    # B answered A's first sync batch (and dropped it): the injected loss happened
    await wait_until(lambda: peer_requests(cluster.nodes[1], SYNC_REQUEST) >= 1, what="the loss")
    await wait_until(lambda: _eq(ips(b, "heal"), {("10.40.0.1", 1)}), timeout=15, what="verify to repair B")
    # the repair came from verify: a peer's digest disagreed with B's and asked B for the detail
    assert peer_requests(cluster.nodes[1], DETAIL_REQUEST) >= 1


async def test_a_200k_instance_snapshot_loads(cluster_of: Callable[[int], NodeCluster]) -> None:
    cluster = cluster_of(2)
    cluster.start(0, "-D", "nacos.remote.server.grpc.sdk.max-inbound-message-size=67108864")
    loader = RawClient(cluster.nodes[0].grpc_port)
    try:
        await loader.connect()
        for s in range(200):
            instances = [{"ip": f"10.{s // 250}.{s % 250}.{i // 250}", "port": 1000 + i % 250, "weight": 1.0,
                          "healthy": True, "enabled": True, "ephemeral": True, "clusterName": "DEFAULT",
                          "metadata": {"app": "bulk"}} for i in range(1000)]
            _, reply = await loader.call("BatchInstanceRequest", {
                "namespace": "public", "serviceName": f"bulk-{s}", "groupName": "DEFAULT_GROUP",
                "type": "batchRegisterInstance", "instances": instances})
            assert reply["resultCode"] == 200, reply
        assert cluster.gauge(0, "instances") == 200_000
        await asyncio.to_thread(cluster.start, 1)
        assert peer_requests(cluster.nodes[0], SNAPSHOT_REQUEST, code="200") >= 1
        assert cluster.gauge(1, "instances") == 200_000
    finally:
        await loader.close()


@pytest.mark.parametrize("client", ["native", "grpcio"])
async def test_each_peer_client_replicates_and_feeds_a_restarted_nodes_snapshot(
        tmp_path: Path, sdk: Any, client: str) -> None:
    # Every Distro call (sync batches, verify, member reports, the snapshot a restarted node loads)
    # goes through the peer client that shoal.cluster.client.transport chooses. One client
    # publishes one instance per service, so each write names a service of its own.
    cluster = NodeCluster(tmp_path, 3, [*FAST, "-D", f"shoal.cluster.client.transport={client}"], auth=OPEN)
    try:
        cluster.start_all()
        writer = await sdk(cluster.addr(0))
        await writer.register_instance(RegisterInstanceParam(service_name="via", ip="10.50.0.1", port=1))
        await wait_until(lambda: all(cluster.gauge(i, "instances") == 1 for i in range(3)), what="replicated")
        kill(cluster.nodes[2])
        await writer.register_instance(RegisterInstanceParam(service_name="via-2", ip="10.50.0.2", port=2))
        await wait_until(lambda: cluster.gauge(1, "instances") == 2, what="replicated to the survivor")
        served = peer_requests(cluster.nodes[0], SNAPSHOT_REQUEST) + peer_requests(cluster.nodes[1], SNAPSHOT_REQUEST)
        await asyncio.to_thread(cluster.start, 2)  # its peers' clients reach it again at once
        assert peer_requests(cluster.nodes[0], SNAPSHOT_REQUEST) + \
            peer_requests(cluster.nodes[1], SNAPSHOT_REQUEST) >= served + 1
        assert cluster.gauge(2, "instances") == 2
        await writer.register_instance(RegisterInstanceParam(service_name="via-3", ip="10.50.0.3", port=3))
        await wait_until(lambda: all(cluster.gauge(i, "instances") == 3 for i in range(3)),
                         what="a write after the restart replicated everywhere")
        log = cluster.nodes[0].log()
        assert f"peer {cluster.addr(2)} is not answering" in log and f"peer {cluster.addr(2)} answers again" in log
    finally:
        cluster.kill_all()


class _Addr:
    def __init__(self, addr: str) -> None:
        self.addr = addr


async def _eq(awaitable: Any, expected: set[tuple[str, int]]) -> bool:
    return bool(await awaitable == expected)


async def test_cluster_port_refuses_strangers_and_a_wrong_identity(cluster_of: Callable[[int], NodeCluster]) -> None:
    cluster = cluster_of(2)
    identity = ["-D", "nacos.core.auth.server.identity.key=shoal-peer", "-D",
                "nacos.core.auth.server.identity.value=cluster-secret"]
    cluster.start_all(each={0: identity, 1: identity})
    node = cluster.nodes[0]
    peer = f"127.0.0.1:{cluster.ports[1]}"
    cluster_port = RawClient(node.port + 1001)
    try:
        report = {"node": {"ip": "127.0.0.1", "port": cluster.ports[1]}}
        # no identity header
        kind, body = await cluster_port.call("MemberReportRequest", report, headers={"shoal-member": peer})
        assert kind == "ErrorResponse" and body["errorCode"] == 403
        # wrong identity
        kind, body = await cluster_port.call("MemberReportRequest", report,
                                             headers={"shoal-member": peer, "shoal-peer": "guess"})
        assert kind == "ErrorResponse" and body["errorCode"] == 403
        # right identity but not a member
        kind, body = await cluster_port.call("MemberReportRequest", report,
                                             headers={"shoal-member": "10.66.6.6:8848", "shoal-peer": "cluster-secret"})
        assert kind == "ErrorResponse" and body["errorCode"] == 403
        # a member with the identity is answered
        kind, body = await cluster_port.call("MemberReportRequest", report,
                                             headers={"shoal-member": peer, "shoal-peer": "cluster-secret"})
        assert kind == "MemberReportResponse" and body["node"]["address"] == f"127.0.0.1:{node.port}"
        # a malformed sync batch from a member is answered with an error, not a crash
        for garbage in (b"SHSY\x01\xff\xff", b"not a batch", b""):
            kind, body = await cluster_port.call("DistroSyncRequest", raw=garbage,
                                                 headers={"shoal-member": peer, "shoal-peer": "cluster-secret"})
            assert kind == "ErrorResponse" and body["errorCode"] == 500
        kind, body = await cluster_port.call("NoSuchClusterRequest", {},
                                             headers={"shoal-member": peer, "shoal-peer": "cluster-secret"})
        assert kind == "ErrorResponse" and body["errorCode"] == 302
    finally:
        await cluster_port.close()
    # the two real peers, which carry the identity, replicate
    writer = RawClient(node.grpc_port)
    try:
        await writer.connect()
        _, reply = await writer.call("InstanceRequest", register_body("guarded"))
        assert reply["resultCode"] == 200
        await wait_until(lambda: cluster.gauge(1, "instances") == 1, what="replication between identified peers")
    finally:
        await writer.close()
    status, text = http_get(f"http://127.0.0.1:{node.port}/nacos/v1/core/cluster/nodes")
    assert status == 200 and peer in text and '"state":"UP"' in text.replace(" ", "")
