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

from .conftest import Registry

SVC = ServiceKey("public", "DEFAULT_GROUP", "svc")


# --- connection-based clients ----------------------------------------------------------------
def test_connect_client_creates_a_connection_client_and_release_removes_its_instances(registry: Registry) -> None:
    registry.naming.connect_client("1700000000000_10.0.0.9_5555", "10.0.0.9", "shop", "Nacos-Java-Client:v2.3.0")
    client = registry.clients.get("1700000000000_10.0.0.9_5555")
    assert client is not None and client.kind is ClientKind.CONNECTION and client.native
    assert (client.client_ip, client.app, client.agent) == ("10.0.0.9", "shop", "Nacos-Java-Client:v2.3.0")
    registry.naming.register_instance(client.client_id, SVC, InstanceInfo("10.0.0.9", 80))
    assert registry.storage.instance_count() == 1
    registry.naming.release_client(client.client_id, "stream closed by client")
    assert registry.clients.get(client.client_id) is None and registry.storage.instance_count() == 0
    registry.naming.release_client(client.client_id, "again")  # unknown: a no-op


# --- reads ---------------------------------------------------------------------------------
def test_service_detail_lists_sorted_clusters_and_is_none_when_missing(registry: Registry) -> None:
    assert registry.naming.service_detail(SVC) is None and not registry.naming.service_exists(SVC)
    registry.connect("c1")
    registry.naming.batch_register_instances("c1", SVC, [InstanceInfo("10.0.0.1", 1, cluster="b"),
                                                         InstanceInfo("10.0.0.2", 2, cluster="a")])
    detail = registry.naming.service_detail(SVC)
    assert detail is not None and registry.naming.service_exists(SVC)
    assert (detail.service, detail.clusters, detail.ephemeral, detail.protect_threshold) == (SVC, ["a", "b"], True, 0.0)


def test_service_instances_is_the_admin_view_with_disabled_and_unhealthy_instances(registry: Registry) -> None:
    registry.connect("c1")
    registry.naming.batch_register_instances("c1", SVC, [
        InstanceInfo("10.0.0.1", 1, cluster="a"), InstanceInfo("10.0.0.2", 2, cluster="b", enabled=False),
        InstanceInfo("10.0.0.3", 3, cluster="b", healthy=False)])
    assert [i["ip"] for i in registry.naming.service_instances(SVC)] == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    assert [i["ip"] for i in registry.naming.service_instances(SVC, "b")] == ["10.0.0.2", "10.0.0.3"]
    assert [i["ip"] for i in registry.naming.service_instances(SVC, "", True)] == ["10.0.0.1", "10.0.0.2"]
    one = registry.naming.instance_json(SVC, "10.0.0.2", 2, "b")
    assert (one["enabled"], one["clusterName"], one["serviceName"]) == (False, "b", "DEFAULT_GROUP@@svc")
    with pytest.raises(NotFound):
        registry.naming.instance_json(SVC, "10.0.0.9", 9, "b")


def test_client_reads_for_both_kinds_and_a_missing_client(registry: Registry) -> None:
    registry.naming.connect_client("1700000000000_10.0.0.9_5555", "10.0.0.9", "shop", "agent/1")
    registry.naming.register_ip_port(SVC, InstanceInfo("10.0.0.5", 8080, cluster="c1"))
    registry.naming.subscribe("1700000000000_10.0.0.9_5555", SVC, "", "10.0.0.9", "agent/1", "shop")
    assert registry.naming.client_ids() == ["10.0.0.5:8080#true", "1700000000000_10.0.0.9_5555"]

    conn = registry.naming.client_detail("1700000000000_10.0.0.9_5555")
    assert (conn.connection_based, conn.client_ip, conn.client_port, conn.app) == (True, "10.0.0.9", "5555", "shop")
    ipport = registry.naming.client_detail("10.0.0.5:8080#true")
    assert (ipport.connection_based, ipport.client_ip, ipport.client_port) == (False, "10.0.0.5", "8080")

    [(service, inst)] = registry.naming.client_publications("10.0.0.5:8080#true")
    assert (service, inst.ip, inst.port, inst.cluster) == (SVC, "10.0.0.5", 8080, "c1")
    [(service, sub)] = registry.naming.client_subscriptions("1700000000000_10.0.0.9_5555")
    assert (service, sub.app, sub.ip) == (SVC, "shop", "10.0.0.9")

    for read in (registry.naming.client_detail, registry.naming.client_publications,
                 registry.naming.client_subscriptions):
        with pytest.raises(NotFound) as err:
            read("nope")
        assert err.value.message == "clientId nope not exist" and err.value.v2_code == V2Code.RESOURCE_NOT_FOUND


async def test_operator_metrics_counts_clients_and_responsibility(registry: Registry) -> None:
    registry.naming.connect_client("1700000000000_10.0.0.9_5555", "10.0.0.9", "shop", "agent/1")
    registry.naming.register_ip_port(SVC, InstanceInfo("10.0.0.5", 1))
    registry.naming.register_ip_port(SVC, InstanceInfo("10.0.0.6", 2))
    mine = await registry.naming.operator_metrics(lambda tag: None)
    assert (mine.service_count, mine.instance_count, mine.client_count, mine.connection_based_client_count,
            mine.ephemeral_ip_port_client_count, mine.responsible_client_count,
            mine.responsible_instance_count) == (1, 2, 3, 1, 2, 3, 2)
    assert 0.0 <= mine.cpu <= 1.0 and mine.load >= 0.0 and 0.0 <= mine.mem <= 1.0
    split = await registry.naming.operator_metrics(lambda tag: None if tag == "10.0.0.5:1" else "10.9.9.9:8848")
    assert (split.responsible_client_count, split.responsible_instance_count) == (2, 1)


# --- the one instance validator ----------------------------------------------------------------
@pytest.mark.parametrize("weight", [-0.5, 10000.5, float("inf"), float("nan")])
def test_every_write_path_refuses_a_bad_weight_with_the_same_error(registry: Registry, weight: float) -> None:
    registry.connect("c1")
    bad = InstanceInfo("10.0.0.5", 8080, weight=weight)
    for write in (lambda: registry.naming.register_instance("c1", SVC, bad),
                  lambda: registry.naming.batch_register_instances("c1", SVC, [bad]),
                  lambda: registry.naming.register_ip_port(SVC, bad)):
        with pytest.raises(WeightError) as err:
            write()
        assert err.value.v2_code == V2Code.WEIGHT_ERROR
    registry.naming.register_ip_port(SVC, InstanceInfo("10.0.0.5", 8080))
    with pytest.raises(WeightError):
        registry.naming.update_instance(SVC, "10.0.0.5", 8080, "DEFAULT", weight=weight)
    with pytest.raises(WeightError):  # a beat body is checked even when its instance exists
        registry.naming.beat(SVC, "10.0.0.5", 8080, bad)


def test_port_range_is_checked_wherever_a_port_is_given(registry: Registry) -> None:
    registry.connect("c1")
    for call in (lambda: registry.naming.register_instance("c1", SVC, InstanceInfo("10.0.0.5", 70000)),
                 lambda: registry.naming.register_ip_port(SVC, InstanceInfo("10.0.0.5", -1)),
                 lambda: registry.naming.deregister_ip_port(SVC, "10.0.0.5", 70000),
                 lambda: registry.naming.find_instance(SVC, "10.0.0.5", 70000, "DEFAULT"),
                 lambda: registry.naming.update_instance(SVC, "10.0.0.5", -1, "DEFAULT"),
                 lambda: registry.naming.beat(SVC, "10.0.0.5", 65536, None)):
        with pytest.raises(InvalidParam, match="'port'"):
            call()


def test_service_record_errors_carry_their_v2_codes(registry: Registry) -> None:
    registry.naming.create_service(SVC, 0.0, {}, ephemeral=True)
    with pytest.raises(ServiceAlreadyExists):
        registry.naming.create_service(SVC, 0.0, {}, ephemeral=True)
    missing = ServiceKey("public", "DEFAULT_GROUP", "nope")
    with pytest.raises(UnknownService):
        registry.naming.update_service(missing, 0.1, None)
    with pytest.raises(UnknownService):
        registry.naming.delete_service(missing)
    registry.naming.register_ip_port(SVC, InstanceInfo("10.0.0.5", 1))
    with pytest.raises(ServiceNotEmpty):
        registry.naming.delete_service(SVC)


def test_persistent_requests_are_refused_by_the_service_layer(registry: Registry) -> None:
    registry.naming.register_ip_port(SVC, InstanceInfo("10.0.0.5", 1))
    for call in (lambda: registry.naming.register_ip_port(SVC, InstanceInfo("10.0.0.5", 1), ephemeral=False),
                 lambda: registry.naming.deregister_ip_port(SVC, "10.0.0.5", 1, ephemeral=False),
                 lambda: registry.naming.update_instance(SVC, "10.0.0.5", 1, "DEFAULT", weight=2.0, ephemeral=False),
                 lambda: registry.naming.beat(SVC, "10.0.0.5", 1, None, ephemeral=False)):
        with pytest.raises(InvalidParam, match="persistent instances"):
            call()
    assert registry.naming.find_instance(SVC, "10.0.0.5", 1, "DEFAULT").weight == 1.0
