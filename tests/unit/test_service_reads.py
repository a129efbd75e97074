"""Service-layer use cases the transports used to do themselves: connection clients, the
Open API reads, and the one instance validator every write runs."""

from __future__ import annotations

import pytest

from shoal.errors import (
    InvalidParam,
    NotFound,
    ServiceAlreadyExists,
    ServiceNotEmpty,
    UnknownService,
    V2Code,
    WeightError,
)
from shoal.model.client import ClientKind
from shoal.model.instance import InstanceInfo
from shoal.model.keys import ServiceKey
from shoal.service_layer import BEAT_OK

from .conftest import Registry

SVC = ServiceKey("public", "DEFAULT_GROUP", "svc")


# --- connection-based clients ----------------------------------------------------------------
def test_connect_client_creates_a_connection_client_and_release_removes_its_instances(registry: Registry) -> None:
    registry.naming.connections.connect_client("1700000000000_10.0.0.9_5555", "10.0.0.9", "shop",
                                               "Nacos-Java-Client:v2.3.0")
    client = registry.clients.get("1700000000000_10.0.0.9_5555")
    assert client is not None and client.kind is ClientKind.CONNECTION and client.native
    assert (client.client_ip, client.app, client.agent) == ("10.0.0.9", "shop", "Nacos-Java-Client:v2.3.0")
    registry.naming.ephemeral.register_instance(client.client_id, SVC, InstanceInfo("10.0.0.9", 80))
    assert registry.storage.instance_count() == 1
    registry.naming.connections.release_client(client.client_id, "stream closed by client")
    assert registry.clients.get(client.client_id) is None and registry.storage.instance_count() == 0
    registry.naming.connections.release_client(client.client_id, "again")  # unknown: a no-op


# --- reads ---------------------------------------------------------------------------------
def test_service_detail_lists_sorted_clusters_and_is_none_when_missing(registry: Registry) -> None:
    assert registry.naming.reads.service_detail(SVC) is None and not registry.naming.reads.service_exists(SVC)
    registry.connect("c1")
    registry.naming.ephemeral.batch_register_instances("c1", SVC, [InstanceInfo("10.0.0.1", 1, cluster="b"),
                                                         InstanceInfo("10.0.0.2", 2, cluster="a")])
    detail = registry.naming.reads.service_detail(SVC)
    assert detail is not None and registry.naming.reads.service_exists(SVC)
    assert (detail.service, detail.clusters, detail.ephemeral, detail.protect_threshold) == (SVC, ["a", "b"], True, 0.0)


def test_service_instances_is_the_admin_view_with_disabled_and_unhealthy_instances(registry: Registry) -> None:
    registry.connect("c1")
    registry.naming.ephemeral.batch_register_instances("c1", SVC, [
        InstanceInfo("10.0.0.1", 1, cluster="a"), InstanceInfo("10.0.0.2", 2, cluster="b", enabled=False),
        InstanceInfo("10.0.0.3", 3, cluster="b", healthy=False)])
    assert [i["ip"] for i in registry.naming.reads.service_instances(SVC)] == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    assert [i["ip"] for i in registry.naming.reads.service_instances(SVC, "b")] == ["10.0.0.2", "10.0.0.3"]
    assert [i["ip"] for i in registry.naming.reads.service_instances(SVC, "", True)] == ["10.0.0.1", "10.0.0.2"]
    one = registry.naming.reads.instance_json(SVC, "10.0.0.2", 2, "b")
    assert (one["enabled"], one["clusterName"], one["serviceName"]) == (False, "b", "DEFAULT_GROUP@@svc")
    with pytest.raises(NotFound):
        registry.naming.reads.instance_json(SVC, "10.0.0.9", 9, "b")


def test_client_reads_for_both_kinds_and_a_missing_client(registry: Registry) -> None:
    registry.naming.connections.connect_client("1700000000000_10.0.0.9_5555", "10.0.0.9", "shop", "agent/1")
    registry.naming.ip_port.register(SVC, InstanceInfo("10.0.0.5", 8080, cluster="c1"))
    registry.naming.subscriptions.subscribe("1700000000000_10.0.0.9_5555", SVC, "", "10.0.0.9", "agent/1", "shop")
    assert registry.naming.introspection.client_ids() == ["10.0.0.5:8080#true", "1700000000000_10.0.0.9_5555"]

    conn = registry.naming.introspection.client_detail("1700000000000_10.0.0.9_5555")
    assert (conn.connection_based, conn.client_ip, conn.client_port, conn.app) == (True, "10.0.0.9", "5555", "shop")
    ipport = registry.naming.introspection.client_detail("10.0.0.5:8080#true")
    assert (ipport.connection_based, ipport.client_ip, ipport.client_port) == (False, "10.0.0.5", "8080")

    [(service, inst)] = registry.naming.introspection.client_publications("10.0.0.5:8080#true")
    assert (service, inst.ip, inst.port, inst.cluster) == (SVC, "10.0.0.5", 8080, "c1")
    [(service, sub)] = registry.naming.introspection.client_subscriptions("1700000000000_10.0.0.9_5555")
    assert (service, sub.app, sub.ip) == (SVC, "shop", "10.0.0.9")

    for read in (registry.naming.introspection.client_detail, registry.naming.introspection.client_publications,
                 registry.naming.introspection.client_subscriptions):
        with pytest.raises(NotFound) as err:
            read("nope")
        assert err.value.message == "clientId nope not exist" and err.value.v2_code == V2Code.RESOURCE_NOT_FOUND


async def test_operator_metrics_counts_clients_and_responsibility(registry: Registry) -> None:
    registry.naming.connections.connect_client("1700000000000_10.0.0.9_5555", "10.0.0.9", "shop", "agent/1")
    registry.naming.ip_port.register(SVC, InstanceInfo("10.0.0.5", 1))
    registry.naming.ip_port.register(SVC, InstanceInfo("10.0.0.6", 2))
    mine = await registry.naming.introspection.operator_metrics(lambda tag: None)
    assert (mine.service_count, mine.instance_count, mine.client_count, mine.connection_based_client_count,
            mine.ephemeral_ip_port_client_count, mine.responsible_client_count,
            mine.responsible_instance_count) == (1, 2, 3, 1, 2, 3, 2)
    assert 0.0 <= mine.cpu <= 1.0 and mine.load >= 0.0 and 0.0 <= mine.mem <= 1.0
    split = await registry.naming.introspection.operator_metrics(
        lambda tag: None if tag == "10.0.0.5:1" else "10.9.9.9:8848")
    assert (split.responsible_client_count, split.responsible_instance_count) == (2, 1)


# --- the one instance validator ----------------------------------------------------------------
@pytest.mark.parametrize("weight", [-0.5, 10000.5, float("inf"), float("nan")])
async def test_every_write_path_refuses_a_bad_weight_with_the_same_error(registry: Registry, weight: float) -> None:
    registry.connect("c1")
    bad = InstanceInfo("10.0.0.5", 8080, weight=weight)
    for write in (lambda: registry.naming.ephemeral.register_instance("c1", SVC, bad),
                  lambda: registry.naming.ephemeral.batch_register_instances("c1", SVC, [bad]),
                  lambda: registry.naming.ip_port.register(SVC, bad)):
        with pytest.raises(WeightError) as err:
            write()
        assert err.value.v2_code == V2Code.WEIGHT_ERROR
    registry.naming.ip_port.register(SVC, InstanceInfo("10.0.0.5", 8080))
    with pytest.raises(WeightError):  # an operator's edit: refused before anything is written
        await registry.naming.instance_ops.update(SVC, "10.0.0.5", 8080, "DEFAULT", ephemeral=True, weight=weight)
    with pytest.raises(WeightError):  # a beat body is checked even when its instance exists
        registry.naming.ip_port.beat(SVC, "10.0.0.5", 8080, bad)


async def test_port_range_is_checked_wherever_a_port_is_given(registry: Registry) -> None:
    registry.connect("c1")
    for call in (lambda: registry.naming.ephemeral.register_instance("c1", SVC, InstanceInfo("10.0.0.5", 70000)),
                 lambda: registry.naming.ip_port.register(SVC, InstanceInfo("10.0.0.5", -1)),
                 lambda: registry.naming.ip_port.deregister(SVC, "10.0.0.5", 70000),
                 lambda: registry.naming.reads.find_instance(SVC, "10.0.0.5", 70000, "DEFAULT"),
                 lambda: registry.naming.ip_port.beat(SVC, "10.0.0.5", 65536, None)):
        with pytest.raises(InvalidParam, match="'port'"):
            call()
    with pytest.raises(InvalidParam, match="'port'"):
        await registry.naming.instance_ops.update(SVC, "10.0.0.5", -1, "DEFAULT", ephemeral=True)


async def test_service_record_errors_carry_their_v2_codes(cp_registry: Registry) -> None:
    service_ops = cp_registry.naming.service_ops
    await service_ops.create(SVC, 0.0, {}, ephemeral=True)
    with pytest.raises(ServiceAlreadyExists):
        await service_ops.create(SVC, 0.0, {}, ephemeral=True)
    missing = ServiceKey("public", "DEFAULT_GROUP", "nope")
    with pytest.raises(UnknownService):
        await service_ops.update(missing, 0.1, None)
    with pytest.raises(UnknownService):
        await service_ops.delete(missing)
    cp_registry.naming.ip_port.register(SVC, InstanceInfo("10.0.0.5", 1))
    with pytest.raises(ServiceNotEmpty):
        await service_ops.delete(SVC)


async def test_a_persistent_beat_is_refused_by_the_instance_facade(registry: Registry) -> None:
    registry.naming.ip_port.register(SVC, InstanceInfo("10.0.0.5", 1))
    with pytest.raises(InvalidParam, match="persistent instances"):
        await registry.naming.instance_ops.beat(SVC, "10.0.0.5", 1, None, ephemeral=False)
    assert await registry.naming.instance_ops.beat(SVC, "10.0.0.5", 1, None) == (
        BEAT_OK, registry.config.client_beat_interval_ms)
