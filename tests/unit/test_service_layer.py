"""Naming use cases against the in-memory model (docs/protocol.md §3.4–§3.9)."""

from __future__ import annotations

import json

import pytest

from shoal.errors import ClientDisconnected, Code, InvalidParam, ParamCheckFailed
from shoal.model.events import ClientChanged, ServiceChanged
from shoal.model.instance import InstanceInfo
from shoal.model.keys import ServiceKey
from shoal.testing import Registry, make_registry

SVC = ServiceKey("public", "DEFAULT_GROUP", "svc")


def hosts(registry: Registry, service: ServiceKey = SVC, clusters: str = "", healthy_only: bool = False) -> list[dict]:
    return json.loads(registry.naming.reads.query(service, clusters, healthy_only))["hosts"]


def test_register_generates_id_defaults_cluster_and_bumps_revision(registry: Registry) -> None:
    client = registry.connect("c1")
    registry.naming.ephemeral.register_instance("c1", SVC,
                                                InstanceInfo("10.0.0.5", 8080, weight=2.0, metadata={"k": "v"}))
    [host] = hosts(registry)
    assert host["instanceId"] == "10.0.0.5#8080#DEFAULT#DEFAULT_GROUP@@svc"
    assert host["clusterName"] == "DEFAULT"
    assert host["serviceName"] == "DEFAULT_GROUP@@svc"
    assert host["weight"] == 2.0 and host["metadata"] == {"k": "v"}
    assert host["instanceHeartBeatTimeOut"] == 15000 and "instanceIdGenerator" not in host
    assert client.revision == 1


def test_second_register_from_same_client_replaces_the_first(registry: Registry) -> None:
    registry.connect("c1")
    registry.naming.ephemeral.register_instance("c1", SVC, InstanceInfo("10.0.0.5", 8080))
    registry.naming.ephemeral.register_instance("c1", SVC, InstanceInfo("10.0.0.6", 9090))
    assert [(h["ip"], h["port"]) for h in hosts(registry)] == [("10.0.0.6", 9090)]


def test_identical_reregister_is_a_no_op_without_events(registry: Registry) -> None:
    client = registry.connect("c1")
    registry.naming.ephemeral.register_instance("c1", SVC, InstanceInfo("10.0.0.5", 8080))
    seen: list[object] = []
    registry.bus.subscribe(ServiceChanged, seen.append)
    registry.bus.subscribe(ClientChanged, seen.append)
    registry.naming.ephemeral.register_instance("c1", SVC, InstanceInfo("10.0.0.5", 8080))
    assert seen == [] and client.revision == 1


def test_register_needs_a_naming_client(registry: Registry) -> None:
    with pytest.raises(ClientDisconnected) as err:
        registry.naming.ephemeral.register_instance("nobody", SVC, InstanceInfo("10.0.0.5", 8080))
    assert err.value.code == Code.CLIENT_DISCONNECT


def test_deregister_ignores_ip_and_is_a_no_op_for_unknown(registry: Registry) -> None:
    registry.connect("c1")
    registry.naming.ephemeral.deregister_instance("c1", SVC)  # service does not exist: success
    registry.naming.ephemeral.register_instance("c1", SVC, InstanceInfo("10.0.0.5", 8080))
    registry.naming.ephemeral.deregister_instance("c1", SVC)
    assert hosts(registry) == []
    assert registry.clients.get("c1").revision == 2  # type: ignore[union-attr]


def test_batch_replaces_the_set_and_empty_batch_removes_it(registry: Registry) -> None:
    registry.connect("c1")
    registry.naming.ephemeral.register_instance("c1", SVC, InstanceInfo("10.0.0.5", 8080))
    batch = [InstanceInfo("10.0.0.7", 1), InstanceInfo("10.0.0.8", 2), InstanceInfo("10.0.0.7", 1)]
    registry.naming.ephemeral.batch_register_instances("c1", SVC, batch)
    assert sorted((h["ip"], h["port"]) for h in hosts(registry)) == [("10.0.0.7", 1), ("10.0.0.8", 2)]
    registry.naming.ephemeral.batch_register_instances("c1", SVC, [InstanceInfo("10.0.0.8", 2)])
    assert [(h["ip"], h["port"]) for h in hosts(registry)] == [("10.0.0.8", 2)]
    registry.naming.ephemeral.batch_register_instances("c1", SVC, [])
    assert hosts(registry) == []
    assert registry.index.publishers_of(SVC) == set()


def test_instances_of_several_clients_merge_and_disconnect_removes_them(registry: Registry) -> None:
    registry.connect("c1")
    registry.connect("c2")
    registry.naming.ephemeral.register_instance("c1", SVC, InstanceInfo("10.0.0.1", 1))
    registry.naming.ephemeral.register_instance("c2", SVC, InstanceInfo("10.0.0.2", 2))
    assert len(hosts(registry)) == 2
    registry.clients.remove("c1", "test")
    assert [h["ip"] for h in hosts(registry)] == ["10.0.0.2"]


def test_query_filters_clusters_enabled_and_healthy_only(registry: Registry) -> None:
    registry.connect("c1")
    registry.naming.ephemeral.batch_register_instances("c1", SVC, [
        InstanceInfo("10.0.0.1", 1, cluster="a"),
        InstanceInfo("10.0.0.2", 2, cluster="b"),
        InstanceInfo("10.0.0.3", 3, cluster="a", enabled=False),
        InstanceInfo("10.0.0.4", 4, cluster="a", healthy=False),
    ])
    assert {h["ip"] for h in hosts(registry)} == {"10.0.0.1", "10.0.0.2", "10.0.0.4"}
    assert {h["ip"] for h in hosts(registry, clusters="a")} == {"10.0.0.1", "10.0.0.4"}
    assert {h["ip"] for h in hosts(registry, clusters="a,b", healthy_only=True)} == {"10.0.0.1", "10.0.0.2"}
    info = json.loads(registry.naming.reads.query(SVC, "a"))
    assert info["clusters"] == "a" and info["name"] == "svc" and info["groupName"] == "DEFAULT_GROUP"
    assert info["allIPs"] is False and info["allIps"] is False and info["checksum"] == ""


def test_protection_threshold_applies_only_with_service_metadata(registry: Registry) -> None:
    registry.connect("c1")
    registry.naming.ephemeral.batch_register_instances("c1", SVC, [
        InstanceInfo("10.0.0.1", 1, healthy=False), InstanceInfo("10.0.0.2", 2, healthy=False),
        InstanceInfo("10.0.0.3", 3),
    ])
    info = json.loads(registry.naming.reads.query(SVC))
    assert info["reachProtectionThreshold"] is False
    assert sorted(h["healthy"] for h in info["hosts"]) == [False, False, True]
    record = registry.services.get(SVC)
    assert record is not None
    record.has_metadata, record.protect_threshold = True, 0.5  # 1/3 healthy <= 0.5 → protect
    info = json.loads(registry.naming.reads.query(SVC))
    assert info["reachProtectionThreshold"] is True
    assert [h["healthy"] for h in info["hosts"]] == [True, True, True]
    record.protect_threshold = 0.2  # 1/3 > 0.2 → no protection
    assert json.loads(registry.naming.reads.query(SVC))["reachProtectionThreshold"] is False


def test_missing_service_answers_empty_hosts_without_creating_it(registry: Registry) -> None:
    info = json.loads(registry.naming.reads.query(ServiceKey("public", "G", "nothing")))
    assert info["hosts"] == [] and info["name"] == "nothing" and info["groupName"] == "G"
    assert len(registry.services) == 0


def test_service_list_pages_in_stable_order(registry: Registry) -> None:
    registry.connect("c1")
    for name in ["s3", "s1", "s2", "s5", "s4"]:
        registry.naming.ephemeral.register_instance("c1", ServiceKey("public", "G", name), InstanceInfo("10.0.0.1", 1))
    page1 = registry.naming.reads.list_services("public", "G", 1, 2)
    page3 = registry.naming.reads.list_services("public", "G", 3, 2)
    assert (page1.count, page1.names) == (5, ["s1", "s2"])
    assert page3.names == ["s5"]
    assert registry.naming.reads.list_services("public", "G", 4, 2).names == []
    assert registry.naming.reads.list_services("public", "OTHER", 1, 10).count == 0


@pytest.mark.parametrize(("service", "message"), [
    (ServiceKey("bad ns!", "G", "s"), "namespaceId"),
    (ServiceKey("public", "G", "@svc"), "serviceName"),
    (ServiceKey("public", "G", "a@@b"), "serviceName"),
    (ServiceKey("public", "G", "has space"), "serviceName"),
    (ServiceKey("public", "G/1", "s"), "group"),
    (ServiceKey("public", "G", "x" * 513), "serviceName"),
])
def test_parameter_checker_refuses_bad_names(registry: Registry, service: ServiceKey, message: str) -> None:
    registry.connect("c1")
    with pytest.raises(ParamCheckFailed) as err:
        registry.naming.ephemeral.register_instance("c1", service, InstanceInfo("10.0.0.1", 1))
    assert err.value.code == 400 and message in err.value.message
    assert err.value.message.startswith("Param check invalid:")


def test_parameter_checker_can_be_disabled() -> None:
    registry = make_registry(param_check_enabled=False)
    registry.connect("c1")
    registry.naming.ephemeral.register_instance("c1", ServiceKey("public", "G", "has space"),
                                                InstanceInfo("10.0.0.1", 1))
    assert len(registry.services) == 1


@pytest.mark.parametrize(("inst", "message"), [
    (InstanceInfo("10.0.0.1", 1, metadata={"preserved.heart.beat.interval": "20000"}), "heart beat interval"),
    (InstanceInfo("10.0.0.1", 1, cluster="under_score"), "clusterName"),
    (InstanceInfo("", 1), "ip"),
    (InstanceInfo("10.0.0.1", 70000), "port"),
    (InstanceInfo("10.0.0.1", 1, weight=-1.0), "weight"),
    (InstanceInfo("10.0.0.1", 1, weight=float("nan")), "weight"),
])
def test_instance_legality(registry: Registry, inst: InstanceInfo, message: str) -> None:
    registry.connect("c1")
    with pytest.raises(InvalidParam) as err:
        registry.naming.ephemeral.register_instance("c1", SVC, inst)
    assert message in err.value.message
    assert len(registry.services) == 0


def test_metadata_length_limit(registry: Registry) -> None:
    registry.connect("c1")
    with pytest.raises(ParamCheckFailed, match="Metadata"):
        registry.naming.ephemeral.register_instance("c1", SVC, InstanceInfo("10.0.0.1", 1, metadata={"k": "v" * 1024}))


def test_subscribe_records_subscriber_and_reports_first_time(registry: Registry) -> None:
    registry.connect("c1")
    info = json.loads(registry.naming.subscriptions.subscribe("c1", SVC, "", "10.1.1.1", "agent", "app"))
    assert info["hosts"] == []
    assert registry.index.subscribers_of(SVC) == {"c1"}
    registry.naming.subscriptions.unsubscribe("c1", SVC, "")
    assert registry.index.subscribers_of(SVC) == set()


def test_empty_service_cleaner_waits_for_expiry(registry: Registry) -> None:
    registry.connect("c1")
    registry.naming.ephemeral.register_instance("c1", SVC, InstanceInfo("10.0.0.1", 1))
    registry.naming.ephemeral.deregister_instance("c1", SVC)
    assert registry.naming.cleaner.clean_empty_services() == 0
    registry.clock.advance(registry.config.empty_service_expired_ms)
    assert registry.naming.cleaner.clean_empty_services() == 1
    assert registry.services.get(SVC) is None


def test_last_ref_time_strictly_increases_within_one_millisecond(registry: Registry) -> None:
    stamps = [json.loads(registry.naming.reads.query(SVC))["lastRefTime"] for _ in range(3)]
    assert stamps == sorted(set(stamps)) and stamps[0] == registry.clock.now_ms()
