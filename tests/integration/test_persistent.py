"""Persistent instances on the CP store with real processes: the 1.x HTTP client,
raw gRPC PersistentInstanceRequest, service creation then registration, three nodes on their
managed etcd members (visibility, health checks with pushes, a full restart)."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from v2.nacos import SubscribeServiceParam

from shoal.testing import OPEN, NodeCluster, ServerProcess, http, poll_until, start_server, wait_until
from shoal.testing.openapi import hosts as listed
from shoal.testing.rawclient import RawClient, register_body

from .test_http_sdk import nacos_v1, v1_client  # noqa: F401 - fixtures
from .test_sdk_naming import Pushes

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:nacos.*")

FAST_HEALTH = ["-D", "shoal.health.check-interval-ms=300", "-D", "shoal.health.check-jitter-ms=0",
               "-D", "shoal.health.check-times=1"]
# Default member reports: a member marked down under a loaded CI box would move the service's
# checks to another node mid-test, which the "only one node checks" assertion must not see.
FAST_CLUSTER = ["-D", "shoal.cp.request-timeout-ms=2000",
                "-D", "nacos.core.protocol.distro.data.load.timeoutMs=15000"]


def call(server: ServerProcess, method: str, path: str, **params: Any) -> tuple[int, str]:
    """One request to ``server`` with ``params`` in the query."""
    return http.call(method, server.url(path), params)


def test_v1_http_client_registers_lists_and_removes_a_persistent_instance(
        servers: Callable[..., ServerProcess], v1_client: Callable[..., Any]) -> None:  # noqa: F811
    server = servers()
    client = v1_client(server)
    assert client.add_naming_instance("db", "10.5.0.1", 3306, ephemeral=False, metadata={"role": "primary"})
    [inst] = client.list_naming_instance("db")["hosts"]
    assert (inst["ip"], inst["port"], inst["ephemeral"], inst["metadata"]) == ("10.5.0.1", 3306, False,
                                                                                {"role": "primary"})
    # Nacos: the service is persistent now; an ephemeral registration into it is a 400 naming it.
    status, body = call(server, "POST", "/nacos/v1/ns/instance", serviceName="db", ip="10.5.0.2", port=1)
    assert status == 400 and "persistent service" in body
    assert client.remove_naming_instance("db", "10.5.0.1", 3306, ephemeral=False)
    assert client.list_naming_instance("db")["hosts"] == []


def test_a_persistent_instance_into_an_ephemeral_service_is_refused(servers: Callable[..., ServerProcess]) -> None:
    server = servers()
    assert call(server, "POST", "/nacos/v1/ns/instance", serviceName="eph", ip="10.5.1.1", port=80)[0] == 200
    status, body = call(server, "POST", "/nacos/v2/ns/instance", serviceName="eph", ip="10.5.1.2", port=80,
                        ephemeral="false")
    assert status == 400 and "ephemeral service" in body


def test_created_service_takes_persistent_instances_and_keeps_its_metadata(
        servers: Callable[..., ServerProcess]) -> None:
    server = servers()
    assert call(server, "POST", "/nacos/v1/ns/service", serviceName="made", protectThreshold=0.5,
                metadata="team=core")[0] == 200
    assert call(server, "POST", "/nacos/v1/ns/instance", serviceName="made", ip="10.5.2.1", port=5432,
                ephemeral="false")[0] == 200
    [inst] = listed(server, "made")
    assert inst["ip"] == "10.5.2.1" and inst["ephemeral"] is False
    status, body = call(server, "GET", "/nacos/v2/ns/service", serviceName="made")
    detail = json.loads(body)["data"]
    assert status == 200 and detail["ephemeral"] is False
    assert detail["protectThreshold"] == 0.5 and detail["metadata"] == {"team": "core"}
    # an ephemeral registration into the created (persistent) service is refused
    assert call(server, "POST", "/nacos/v1/ns/instance", serviceName="made", ip="10.5.2.2", port=1)[0] == 400
    # health set by hand (HealthController), for a cluster whose checker is NONE
    assert call(server, "PUT", "/nacos/v1/ns/cluster", serviceName="made", clusterName="DEFAULT",
                healthChecker='{"type":"NONE"}')[0] == 200
    assert call(server, "PUT", "/nacos/v1/ns/health", serviceName="made", ip="10.5.2.1", port=5432,
                healthy="false")[0] == 200
    status, body = call(server, "GET", "/nacos/v1/ns/instance", serviceName="made", ip="10.5.2.1", port=5432)
    assert status == 200 and json.loads(body)["healthy"] is False
    # (the listing shows it healthy: 0 of 1 healthy is under the 0.5 protection threshold)
    assert [h["healthy"] for h in listed(server, "made")] == [True]
    # a non-empty service cannot be deleted; once empty it can
    assert call(server, "DELETE", "/nacos/v1/ns/service", serviceName="made")[0] == 400
    assert call(server, "DELETE", "/nacos/v1/ns/instance", serviceName="made", ip="10.5.2.1", port=5432,
                ephemeral="false")[0] == 200
    assert call(server, "DELETE", "/nacos/v1/ns/service", serviceName="made")[0] == 200
    assert call(server, "GET", "/nacos/v1/ns/service", serviceName="made")[0] != 200


async def test_raw_grpc_persistent_instance_request(servers: Callable[..., ServerProcess]) -> None:
    server = servers()
    client = RawClient(server.grpc_port)
    try:
        await client.connect()
        kind, reply = await client.call("PersistentInstanceRequest",
                                        register_body("grpc-db", ip="10.5.3.1", port=6379, ephemeral=False))
        assert kind == "InstanceResponse" and reply["resultCode"] == 200 and reply["type"] == "registerInstance"
        [inst] = listed(server, "grpc-db")
        assert (inst["ip"], inst["port"], inst["ephemeral"]) == ("10.5.3.1", 6379, False)
        # the instance is not bound to the connection: it stays when the connection goes
        await client.close()
        client = RawClient(server.grpc_port)
        await client.connect()
        assert [h["ip"] for h in listed(server, "grpc-db")] == ["10.5.3.1"]
        body = {**register_body("grpc-db", ip="10.5.3.1", port=6379, ephemeral=False), "type": "deregisterInstance"}
        kind, reply = await client.call("PersistentInstanceRequest", body)
        assert kind == "InstanceResponse" and reply["resultCode"] == 200
        assert listed(server, "grpc-db") == []
        # into an ephemeral service: a 400 naming the rule
        assert (await client.call("InstanceRequest", register_body("grpc-eph")))[1]["resultCode"] == 200
        kind, reply = await client.call("PersistentInstanceRequest", register_body("grpc-eph", ephemeral=False))
        assert kind == "ErrorResponse" and reply["errorCode"] == 400 and "ephemeral service" in reply["message"]
    finally:
        await client.close()


def batch_body(service: str, kind: str, *instances: dict[str, Any]) -> dict[str, Any]:
    return {"headers": {}, "namespace": "public", "serviceName": service, "groupName": "DEFAULT_GROUP",
            "type": kind, "module": "naming", "instances": list(instances)}


def instance(ip: str, port: int, **fields: Any) -> dict[str, Any]:
    return {"ip": ip, "port": port, "weight": 1.0, "healthy": True, "enabled": True, "clusterName": "DEFAULT",
            "metadata": {}, **fields}


async def test_raw_grpc_persistent_batch(servers: Callable[..., ServerProcess]) -> None:
    """Nacos has no persistent batch: its SDKs refuse ``ephemeral=false`` in BatchInstanceRequest
    (400) and so does Shoal; Shoal's own is PersistentInstanceRequest of type batchRegisterInstance
    / batchDeregisterInstance with an ``instances`` list (docs/protocol.md §3.5)."""
    server = servers()
    client = RawClient(server.grpc_port)
    try:
        await client.connect()
        kind, reply = await client.call("BatchInstanceRequest", batch_body(
            "grpc-batch", "batchRegisterInstance", instance("10.5.5.1", 1, ephemeral=False)))
        assert kind == "ErrorResponse" and reply["errorCode"] == 400
        assert "Batch registration does not allow persistent instance registration" in reply["message"]
        assert listed(server, "grpc-batch") == []

        kind, reply = await client.call("PersistentInstanceRequest", batch_body(
            "grpc-batch", "batchRegisterInstance", instance("10.5.5.1", 5432),
            instance("10.5.5.2", 5432, clusterName="dr", metadata={"role": "replica"}), instance("10.5.5.3", 5432)))
        assert kind == "InstanceResponse" and reply["resultCode"] == 200, reply
        assert reply["type"] == "batchRegisterInstance"
        hosts = sorted((h["ip"], h["clusterName"], h["ephemeral"], h["metadata"]) for h in listed(server, "grpc-batch"))
        assert hosts == [("10.5.5.1", "DEFAULT", False, {}), ("10.5.5.2", "dr", False, {"role": "replica"}),
                         ("10.5.5.3", "DEFAULT", False, {})]
        # not bound to the connection
        await client.close()
        client = RawClient(server.grpc_port)
        await client.connect()
        assert len(listed(server, "grpc-batch")) == 3
        # one illegal instance: the whole batch is refused before anything is written
        kind, reply = await client.call("PersistentInstanceRequest", batch_body(
            "grpc-batch", "batchRegisterInstance", instance("10.5.5.4", 1), instance("10.5.5.5", 70000)))
        assert kind == "ErrorResponse" and reply["errorCode"] == 400
        assert len(listed(server, "grpc-batch")) == 3
        # one CP store transaction: more than 128 instances are refused whole, with what to do
        kind, reply = await client.call("PersistentInstanceRequest", batch_body(
            "grpc-batch", "batchRegisterInstance", *(instance(f"10.5.6.{i}", 1) for i in range(1, 130))))
        assert kind == "ErrorResponse" and reply["errorCode"] == 400 and "at most 128" in reply["message"]
        assert len(listed(server, "grpc-batch")) == 3
        kind, reply = await client.call("PersistentInstanceRequest", batch_body(
            "grpc-batch", "batchDeregisterInstance", instance("10.5.5.1", 5432), instance("10.5.5.2", 5432)))
        assert kind == "InstanceResponse" and reply["type"] == "batchDeregisterInstance"
        assert [h["ip"] for h in listed(server, "grpc-batch")] == ["10.5.5.3"]
        # the kinds still do not mix
        assert (await client.call("InstanceRequest", register_body("grpc-batch-eph")))[1]["resultCode"] == 200
        kind, reply = await client.call("PersistentInstanceRequest", batch_body(
            "grpc-batch-eph", "batchRegisterInstance", instance("10.5.5.6", 1)))
        assert kind == "ErrorResponse" and reply["errorCode"] == 400 and "ephemeral service" in reply["message"]
    finally:
        await client.close()


def test_persistent_instances_survive_a_restart_standalone(tmp_path: Path) -> None:
    server = start_server(tmp_path, auth=OPEN)
    try:
        assert call(server, "POST", "/nacos/v1/ns/instance", serviceName="kept", ip="10.5.4.1", port=1,
                    ephemeral="false")[0] == 200
        server.stop()
        server = start_server(tmp_path, port=server.port, auth=OPEN)
        assert [h["ip"] for h in listed(server, "kept")] == ["10.5.4.1"]
    finally:
        server.kill()


# --- three nodes, each with its managed etcd member -----------------------------------------
@pytest.fixture
def cp_cluster(tmp_path: Path) -> Iterator[NodeCluster]:
    cluster = NodeCluster(tmp_path, 3, FAST_CLUSTER, ready_timeout=60, auth=OPEN)
    yield cluster
    cluster.kill_all()


def _all_members_up(node: ServerProcess, size: int) -> bool:
    return sum(1 for m in node.members() if m.get("state") == "UP") == size


async def test_three_nodes_share_persistent_instances_checks_and_restart(
        cp_cluster: NodeCluster, sdk: Any) -> None:
    cp_cluster.start_all(*FAST_HEALTH)
    a, b, c = cp_cluster.all()
    for node in cp_cluster.all():
        poll_until(lambda n=node: _all_members_up(n, 3), 20, 0.1, "every member UP")  # type: ignore[misc]

    # A real listener: healthy while it accepts, unhealthy once closed, healthy again on reopen.
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    port = int(listener.getsockname()[1])
    assert call(b, "POST", "/nacos/v1/ns/instance", serviceName="checked", ip="127.0.0.1", port=port,
                ephemeral="false")[0] == 200
    watcher = await sdk(c.addr)
    pushes = Pushes()
    await watcher.subscribe(SubscribeServiceParam(service_name="checked", subscribe_callback=pushes))

    def pushed_health() -> bool | None:
        if not pushes.calls or len(pushes.calls[-1]) != 1:
            return None
        return bool(pushes.calls[-1][0].healthy)

    checks_before = [n.metric("health_checks_total", type="TCP") for n in cp_cluster.all()]
    await wait_until(lambda: pushed_health() is True, 10, "a push with the healthy instance")
    await wait_until(lambda: sum(n.metric("health_checks_total", type="TCP") for n in cp_cluster.all())
                     > sum(checks_before) + 2, 10, "checks running")
    listener.close()
    await wait_until(lambda: pushed_health() is False, 10, "a push with the instance unhealthy")
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(16)
    try:
        await wait_until(lambda: pushed_health() is True, 10, "a push with the instance healthy again")
    finally:
        listener.close()
    # Only one node runs the checks of a service (the only persistent service so far).
    counts = [n.metric("health_checks_total", type="TCP") for n in cp_cluster.all()]
    assert sum(1 for count in counts if count > 0) == 1, counts

    # Written on A, listed on B and C within a second.
    assert call(a, "POST", "/nacos/v1/ns/instance", serviceName="shared", ip="10.6.0.1", port=7000,
                ephemeral="false")[0] == 200
    for node in (b, c):
        poll_until(lambda n=node: [h["ip"] for h in listed(n, "shared")] == ["10.6.0.1"], 1.0, 0.02,  # type: ignore[misc]
                   f"the persistent instance on {node.addr}")

    # Service metadata written on B applies on A and C (the protection threshold included).
    assert call(b, "PUT", "/nacos/v1/ns/service", serviceName="shared", protectThreshold=0.9,
                metadata="owner=dba")[0] == 200

    def metadata_on(node: ServerProcess) -> tuple[float, dict[str, str]] | None:
        status, body = call(node, "GET", "/nacos/v2/ns/service", serviceName="shared")
        data = json.loads(body)["data"] if status == 200 else None
        return (data["protectThreshold"], data["metadata"]) if data else None

    for node in (a, c):
        poll_until(lambda n=node: metadata_on(n) == (0.9, {"owner": "dba"}), 5, 0.05,  # type: ignore[misc]
                   f"the service metadata on {node.addr}")

    # All three nodes (and their etcd members) killed and restarted: the instances are back.
    cp_cluster.kill_all()
    await asyncio.to_thread(cp_cluster.start_all, *FAST_HEALTH)
    for node in cp_cluster.all():
        assert {h["ip"] for h in listed(node, "shared")} == {"10.6.0.1"}
        assert [h["port"] for h in listed(node, "checked")] == [port]

    # Two of three members gone: the last node refuses CP writes with a clear 503, keeps reading
    # its view and keeps taking ephemeral (AP) registrations.
    survivor = cp_cluster.all()[0]
    for node in cp_cluster.all()[1:]:
        node.kill()
    status, body = call(survivor, "POST", "/nacos/v1/ns/instance", serviceName="shared", ip="10.6.0.2",
                        port=7000, ephemeral="false")
    assert status == 503 and "CP store" in body, (status, body)
    assert {h["ip"] for h in listed(survivor, "shared")} == {"10.6.0.1"}
    assert call(survivor, "POST", "/nacos/v1/ns/instance", serviceName="ap-still", ip="10.6.0.3", port=1)[0] == 200


def _service_known(node: ServerProcess, service: str) -> bool:
    return call(node, "GET", "/nacos/v1/ns/service", serviceName=service)[0] == 200


async def test_deleting_a_service_on_one_node_deletes_it_on_every_node(cp_cluster: NodeCluster) -> None:
    """ServiceOperatorV2Impl.delete goes through Raft in Nacos: a service is deleted cluster-wide,
    whether it was created through the API (a document) or made by registrations (none); one that
    still has instances is a 400 (v2: 21009 SERVICE_DELETE_FAILURE), an unknown one 21008."""
    cp_cluster.start_all()
    a, b, c = cp_cluster.all()
    for node in cp_cluster.all():
        poll_until(lambda n=node: _all_members_up(n, 3), 20, 0.1, "every member UP")  # type: ignore[misc]

    # made by an ephemeral registration on A (Distro gives B and C its record), then emptied
    assert call(a, "POST", "/nacos/v1/ns/instance", serviceName="used", ip="10.7.0.1", port=1)[0] == 200
    for node in cp_cluster.all():
        poll_until(lambda n=node: len(listed(n, "used")) == 1, 10, 0.05, f"the instance on {node.addr}")  # type: ignore[misc]
    # while it has an instance, no node deletes it
    status, body = call(b, "DELETE", "/nacos/v1/ns/service", serviceName="used")
    assert status == 400 and "is not empty" in body, (status, body)
    status, body = call(c, "DELETE", "/nacos/v2/ns/service", serviceName="used")
    assert status == 400 and json.loads(body)["code"] == 21009, (status, body)
    assert call(a, "DELETE", "/nacos/v1/ns/instance", serviceName="used", ip="10.7.0.1", port=1)[0] == 200
    for node in cp_cluster.all():
        poll_until(lambda n=node: listed(n, "used") == [], 10, 0.05, f"the instance gone on {node.addr}")  # type: ignore[misc]
        assert _service_known(node, "used")
    assert call(b, "DELETE", "/nacos/v1/ns/service", serviceName="used")[0] == 200
    for node in (a, c):
        poll_until(lambda n=node: not _service_known(n, "used"), 5, 0.05, f"the service gone on {node.addr}")  # type: ignore[misc]
    status, body = call(c, "DELETE", "/nacos/v2/ns/service", serviceName="used")
    assert status == 400 and json.loads(body)["code"] == 21008, (status, body)

    # created through the API on A, with a persistent instance written on C: refused until it is empty
    assert call(a, "POST", "/nacos/v1/ns/service", serviceName="made", metadata="team=core")[0] == 200
    assert call(c, "POST", "/nacos/v1/ns/instance", serviceName="made", ip="10.7.0.2", port=5432,
                ephemeral="false")[0] == 200
    poll_until(lambda: len(listed(b, "made")) == 1, 5, 0.05, "the persistent instance on B")
    status, body = call(b, "DELETE", "/nacos/v2/ns/service", serviceName="made")
    assert status == 400 and json.loads(body)["code"] == 21009, (status, body)
    assert call(b, "DELETE", "/nacos/v1/ns/instance", serviceName="made", ip="10.7.0.2", port=5432,
                ephemeral="false")[0] == 200
    assert call(b, "DELETE", "/nacos/v2/ns/service", serviceName="made")[0] == 200
    for node in cp_cluster.all():
        poll_until(lambda n=node: not _service_known(n, "made"), 5, 0.05, f"the service gone on {node.addr}")  # type: ignore[misc]
