"""The read path's caches: a query does not re-select or re-encode what did not change,
and every change is still seen by the next read."""

from __future__ import annotations

import json
from typing import Any

import pytest

from shoal.metrics import Metrics
from shoal.model.instance import InstanceInfo
from shoal.model.keys import ServiceKey
from shoal.model.services import ServiceView
from shoal.testing import Registry

SVC = ServiceKey("public", "DEFAULT_GROUP", "cached")


def info(registry: Registry, clusters: str = "", healthy_only: bool = False) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(registry.naming.reads.query(SVC, clusters, healthy_only))
    return result


def count_calls(monkeypatch: pytest.MonkeyPatch, owner: type, name: str) -> list[int]:
    calls = [0]
    original = getattr(owner, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls


def register(registry: Registry, client_id: str, ip: str, **fields: Any) -> None:
    if registry.clients.get(client_id) is None:
        registry.connect(client_id)
    registry.naming.ephemeral.register_instance(client_id, SVC, InstanceInfo(ip, 8080, **fields))


def test_repeated_queries_select_once_and_a_change_selects_again(registry: Registry,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    register(registry, "c1", "10.0.0.1")
    selects = count_calls(monkeypatch, ServiceView, "select")
    first, second = info(registry), info(registry)
    assert selects[0] == 1
    assert first["hosts"] == second["hosts"] and second["lastRefTime"] > first["lastRefTime"]
    register(registry, "c2", "10.0.0.2")
    assert sorted(h["ip"] for h in info(registry)["hosts"]) == ["10.0.0.1", "10.0.0.2"]
    assert selects[0] == 2


def test_each_reader_shape_is_cached_apart(registry: Registry) -> None:
    register(registry, "c1", "10.0.0.1", cluster="A")
    register(registry, "c2", "10.0.0.2", cluster="B", healthy=False)
    assert [h["ip"] for h in info(registry, "A")["hosts"]] == ["10.0.0.1"]
    assert [h["ip"] for h in info(registry, "B")["hosts"]] == ["10.0.0.2"]
    assert info(registry, "B", healthy_only=True)["hosts"] == []
    assert info(registry, "A,B")["clusters"] == "A,B"
    grouped = json.loads(registry.naming.reads.query(SVC, "", False, grouped_name=True))
    assert grouped["name"] == "DEFAULT_GROUP@@cached" and info(registry)["name"] == "cached"


def test_protection_settings_are_part_of_the_key(registry: Registry) -> None:
    register(registry, "c1", "10.0.0.1")
    register(registry, "c2", "10.0.0.2", healthy=False)
    assert info(registry)["reachProtectionThreshold"] is False
    record = registry.services.get(SVC)
    assert record is not None
    record.has_metadata, record.protect_threshold = True, 0.9  # changed without an event
    protected = info(registry)
    assert protected["reachProtectionThreshold"] is True and all(h["healthy"] for h in protected["hosts"])
    record.protect_threshold = 0.1
    assert info(registry)["reachProtectionThreshold"] is False


def test_distinct_readers_kept_per_view_are_bounded(registry: Registry) -> None:
    register(registry, "c1", "10.0.0.1")
    for i in range(ServiceView.MAX_CACHED_INFOS * 3):
        info(registry, f"C{i}")
    view = registry.storage.view(SVC)
    assert len(view._infos) <= ServiceView.MAX_CACHED_INFOS


def test_a_rebuilt_view_encodes_only_the_instances_that_changed(registry: Registry,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(10):
        register(registry, f"c{i}", f"10.0.0.{i}", metadata={"k": "v"})
    info(registry)
    encodes = count_calls(monkeypatch, InstanceInfo, "to_json")
    register(registry, "c3", "10.0.0.3", metadata={"k": "changed"})  # same address, new metadata
    register(registry, "c10", "10.0.0.10")
    hosts = {h["ip"]: h for h in info(registry)["hosts"]}
    assert encodes[0] == 2
    assert hosts["10.0.0.3"]["metadata"] == {"k": "changed"} and len(hosts) == 11


def test_no_stale_view_is_kept_for_a_service_nobody_publishes(registry: Registry) -> None:
    register(registry, "c1", "10.0.0.1")
    info(registry)
    registry.naming.ephemeral.deregister_instance("c1", SVC)
    assert info(registry)["hosts"] == []
    assert SVC not in registry.storage._stale


def test_request_counter_renders_as_a_prometheus_counter() -> None:
    metrics = Metrics()
    for _ in range(3):
        metrics.request("grpc", "InstanceRequest", 200)
    metrics.request("grpc", "InstanceRequest", 400)
    text = metrics.render().decode()
    assert 'shoal_requests_total{code="200",transport="grpc",type="InstanceRequest"} 3.0' in text
    assert 'shoal_requests_total{code="400",transport="grpc",type="InstanceRequest"} 1.0' in text
    assert metrics.request_count("grpc", "InstanceRequest", 200) == 3
