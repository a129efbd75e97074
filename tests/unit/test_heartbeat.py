"""ip:port clients and the heartbeat checker on a ManualClock: Nacos's defaults (beat every 5 s,
unhealthy after 15 s, removed after 30 s), per-instance overrides, switches and events."""

from __future__ import annotations

import json
from typing import Any

import pytest

from shoal.config import Config
from shoal.errors import InvalidParam
from shoal.export.eventlog import ChangeLog, as_dicts
from shoal.health.heartbeat import HeartbeatChecker
from shoal.model.client import ClientKind
from shoal.model.events import (
    ClientChanged,
    ClientDeregisteredService,
    ClientRegisteredService,
    ClientReleased,
    InstanceHealthChanged,
    ServiceChanged,
)
from shoal.model.instance import InstanceInfo
from shoal.model.ip_port import Standalone
from shoal.model.keys import ServiceKey
from shoal.service_layer import BEAT_OK, BEAT_RESOURCE_NOT_FOUND
from shoal.testing import Registry, make_registry

SVC = ServiceKey("public", "DEFAULT_GROUP", "svc")
CID = "10.0.0.5:8080#true"


class OwnedElsewhere:
    """Responsibility stub: another node owns the listed ip:port tags."""

    def __init__(self, *tags: str) -> None:
        self.tags = set(tags)

    def owner_of(self, tag: str) -> str | None:
        return "10.9.9.9:8848" if tag in self.tags else None


def checker(registry: Registry, responsibility: Any = None) -> HeartbeatChecker:
    return HeartbeatChecker(registry.live, registry.clock, registry.clients, registry.services,
                            registry.naming.beats, responsibility or Standalone())


def record(registry: Registry, *types: type) -> list[Any]:
    events: list[Any] = []
    for t in types:
        registry.bus.subscribe(t, events.append)
    return events


def hosts(registry: Registry, service: ServiceKey = SVC) -> list[dict[str, Any]]:
    return json.loads(registry.naming.reads.query(service))["hosts"]


def register(registry: Registry, ip: str = "10.0.0.5", port: int = 8080, **md: str) -> None:
    registry.naming.ip_port.register(SVC, InstanceInfo(ip, port, metadata=md))


def test_defaults_are_nacos_switch_values() -> None:
    config = Config()
    assert (config.client_beat_interval_ms, config.beat_check_interval_ms) == (5000, 5000)
    assert config.expire_instance and config.health_check_enabled
    assert config.client_expired_time_ms == 180_000


def test_http_registration_is_an_ip_port_model_client(registry: Registry) -> None:
    events = record(registry, ClientRegisteredService, ClientChanged)
    register(registry)
    client = registry.clients.get(CID)
    assert client is not None and client.kind is ClientKind.IP_PORT and client.native
    assert client.client_ip == "10.0.0.5"
    assert [type(e) for e in events] == [ClientRegisteredService, ClientChanged]
    assert hosts(registry)[0]["instanceId"] == "10.0.0.5#8080#DEFAULT#DEFAULT_GROUP@@svc"
    assert (CID, SVC) in registry.naming.beats


def test_no_beat_turns_unhealthy_after_15s_and_is_removed_after_30s(registry: Registry) -> None:
    register(registry)
    check = checker(registry)
    registry.clock.advance(15_000)  # not yet: Nacos needs elapsed > timeout
    assert check.scan()["unhealthy"] == 0 and hosts(registry)[0]["healthy"] is True
    registry.clock.advance(1)
    assert check.scan()["unhealthy"] == 1
    assert hosts(registry)[0]["healthy"] is False
    registry.clock.advance(14_999)  # 30 000 ms since the registration
    assert check.scan()["removed"] == 0 and len(hosts(registry)) == 1
    registry.clock.advance(1)
    assert check.scan()["removed"] == 1
    assert hosts(registry) == []
    assert (CID, SVC) not in registry.naming.beats


async def test_a_round_after_this_node_was_stopped_restarts_the_windows_instead_of_judging(
        registry: Registry) -> None:
    """A node woken from SIGSTOP did not see the beats its peers took meanwhile: it must not
    remove every instance at once."""
    register(registry)
    check = checker(registry)
    await check.tick()
    registry.clock.advance(60_000)  # stopped for a minute: the next round comes 55 s late
    await check.tick()
    assert len(hosts(registry)) == 1 and hosts(registry)[0]["healthy"] is True
    for _ in range(6):  # then 30 s of regular rounds without a beat: removed as usual
        registry.clock.advance(5000)
        await check.tick()
    registry.clock.advance(1)
    await check.tick()
    assert hosts(registry) == []


def test_beats_every_5s_keep_the_instance_healthy(registry: Registry) -> None:
    register(registry)
    check = checker(registry)
    for _ in range(12):  # a minute of beats at the interval the server tells the client
        registry.clock.advance(5000)
        code, interval = registry.naming.ip_port.beat(SVC, "10.0.0.5", 8080, None)
        assert (code, interval) == (BEAT_OK, 5000)
        assert check.scan() == {"unhealthy": 0, "removed": 0, "clients_released": 0, "skipped": 0}
    assert hosts(registry)[0]["healthy"] is True


def test_a_beat_after_the_timeout_makes_it_healthy_again_with_events(registry: Registry) -> None:
    register(registry)
    check = checker(registry)
    events = record(registry, InstanceHealthChanged, ServiceChanged, ClientChanged)
    registry.clock.advance(20_000)
    check.scan()
    assert [type(e) for e in events] == [InstanceHealthChanged, ServiceChanged, ClientChanged]
    assert events[0].healthy is False and events[0].client_id == CID
    revision = registry.clients.get(CID).revision  # type: ignore[union-attr]
    events.clear()
    assert registry.naming.ip_port.beat(SVC, "10.0.0.5", 8080, None)[0] == BEAT_OK
    assert [type(e) for e in events] == [InstanceHealthChanged, ServiceChanged, ClientChanged]
    assert events[0].healthy is True
    assert hosts(registry)[0]["healthy"] is True
    assert registry.clients.get(CID).revision == revision + 1  # type: ignore[union-attr]
    registry.clock.advance(15_001)  # the beat restarted the clock
    assert check.scan()["unhealthy"] == 1


def test_preserved_metadata_overrides_timeouts_and_interval(registry: Registry) -> None:
    register(registry, **{"preserved.heart.beat.interval": "1000", "preserved.heart.beat.timeout": "3000",
                          "preserved.ip.delete.timeout": "6000"})
    check = checker(registry)
    assert registry.naming.ip_port.beat(SVC, "10.0.0.5", 8080, None) == (BEAT_OK, 1000)
    registry.clock.advance(3001)
    assert check.scan()["unhealthy"] == 1
    registry.clock.advance(3000)
    assert check.scan()["removed"] == 1


def test_enable_client_beat_on_the_instance_disables_the_check(registry: Registry) -> None:
    register(registry, enableClientBeat="true")
    registry.clock.advance(600_000)
    assert checker(registry).scan()["removed"] == 0
    assert hosts(registry)[0]["healthy"] is True


async def test_enable_client_beat_on_the_service_metadata_disables_the_check(cp_registry: Registry) -> None:
    registry = cp_registry
    await registry.naming.service_ops.create(SVC, 0.0, {"enableClientBeat": "True"}, ephemeral=True)
    register(registry)
    registry.clock.advance(40_000)
    stats = checker(registry).scan()
    assert stats["removed"] == 0 and stats["skipped"] == 1
    assert len(hosts(registry)) == 1


def test_instances_another_node_is_responsible_for_are_skipped(registry: Registry) -> None:
    register(registry)
    register(registry, ip="10.0.0.6")
    registry.clock.advance(40_000)
    elsewhere = checker(registry, OwnedElsewhere("10.0.0.5:8080"))
    stats = elsewhere.scan()
    assert stats == {"unhealthy": 0, "removed": 1, "clients_released": 0, "skipped": 1}
    assert [h["ip"] for h in hosts(registry)] == ["10.0.0.5"]
    registry.clock.advance(15_000)  # a skipped instance gets a fresh window: not rescanned every round
    assert elsewhere.scan()["skipped"] == 0
    registry.clock.advance(1)
    assert elsewhere.scan()["skipped"] == 1


def test_expire_instance_off_only_marks_unhealthy() -> None:
    registry = make_registry(expire_instance=False)
    register(registry)
    registry.clock.advance(100_000)
    assert checker(registry).scan()["unhealthy"] == 1
    assert hosts(registry)[0]["healthy"] is False


def test_health_check_switched_off_checks_nothing() -> None:
    registry = make_registry(health_check_enabled=False)
    register(registry)
    registry.clock.advance(100_000)
    assert checker(registry).scan()["removed"] == 0
    assert hosts(registry)[0]["healthy"] is True


def test_removed_instance_publishes_deregistration_and_empty_client_is_released_later(registry: Registry) -> None:
    register(registry)
    check = checker(registry)
    events = record(registry, ClientDeregisteredService, ClientReleased)
    registry.clock.advance(30_001)
    check.scan()
    assert [type(e) for e in events] == [ClientDeregisteredService]
    assert registry.clients.get(CID) is not None  # IpPortBasedClient.isExpire: only once idle long enough
    registry.clock.advance(registry.config.client_expired_time_ms)
    assert check.scan()["clients_released"] == 0
    registry.clock.advance(1)
    assert check.scan()["clients_released"] == 1
    assert [type(e) for e in events] == [ClientDeregisteredService, ClientReleased]
    assert registry.clients.get(CID) is None


def test_expired_instance_reaches_the_change_log_as_a_deregister_with_its_address(registry: Registry) -> None:
    log = ChangeLog(registry.bus, registry.clock, registry.clients, capacity=10)
    register(registry)
    events = record(registry, ClientDeregisteredService)
    registry.clock.advance(30_001)
    assert checker(registry).scan()["removed"] == 1
    assert [[(i.ip, i.port) for i in e.instances] for e in events] == [[("10.0.0.5", 8080)]]
    rows = [(r["kind"], r["service"], r["client_id"], r["ip"], r["port"]) for r in as_dicts(log.snapshot())
            if r["kind"] == "deregister"]
    assert rows == [("deregister", "svc", CID, "10.0.0.5", 8080)]


def test_beat_for_unknown_instance_answers_20404_and_a_beat_body_registers_it(registry: Registry) -> None:
    assert registry.naming.ip_port.beat(SVC, "10.0.0.5", 8080, None) == (BEAT_RESOURCE_NOT_FOUND, 5000)
    assert registry.clients.get(CID) is None
    beat = InstanceInfo("10.0.0.5", 8080, weight=2.0, cluster="c1", metadata={"v": "1"})
    assert registry.naming.ip_port.beat(SVC, "10.0.0.5", 8080, beat) == (BEAT_OK, 5000)
    [host] = hosts(registry)
    assert (host["clusterName"], host["weight"], host["metadata"]) == ("c1", 2.0, {"v": "1"})


def test_one_ip_port_client_publishes_into_several_services(registry: Registry) -> None:
    other = ServiceKey("public", "G", "other")
    register(registry)
    registry.naming.ip_port.register(other, InstanceInfo("10.0.0.5", 8080))
    client = registry.clients.get(CID)
    assert client is not None and set(client.publications) == {SVC, other}
    registry.naming.ip_port.deregister(SVC, "10.0.0.5", 8080)
    assert hosts(registry) == [] and len(hosts(registry, other)) == 1


def test_repeated_registration_counts_as_a_beat(registry: Registry) -> None:
    register(registry)
    registry.clock.advance(14_000)
    register(registry)
    registry.clock.advance(14_000)
    assert checker(registry).scan()["unhealthy"] == 0


async def test_a_persistent_service_refuses_ip_port_instances_without_creating_a_client(
        cp_registry: Registry) -> None:
    await cp_registry.naming.service_ops.create(SVC, 0.0, {}, ephemeral=False)
    with pytest.raises(InvalidParam, match="persistent service"):
        register(cp_registry)
    assert cp_registry.clients.get(CID) is None


def test_gRPC_subscriber_of_the_service_sees_the_health_flip(registry: Registry) -> None:
    registry.connect("conn-1")
    registry.naming.subscriptions.subscribe("conn-1", SVC, "", "10.0.0.1", "sdk", "app")
    register(registry)
    changes = record(registry, ServiceChanged)
    registry.clock.advance(15_001)
    checker(registry).scan()
    assert [e.service for e in changes] == [SVC]  # the push service schedules on this event
    assert json.loads(registry.naming.reads.push_payload(SVC, ""))["hosts"][0]["healthy"] is False


def test_distro_verify_renews_every_instance_of_a_client(registry: Registry) -> None:
    register(registry)
    registry.clock.advance(14_000)
    assert registry.naming.beats.renew_client(CID, registry.clock.monotonic_ms()) == 1
    registry.clock.advance(14_000)
    assert checker(registry).scan()["unhealthy"] == 0


async def test_an_operator_edit_changes_weight_and_merges_metadata_without_losing_the_beat(
        cp_registry: Registry) -> None:
    register(cp_registry, a="1")
    await cp_registry.naming.instance_ops.update(SVC, "10.0.0.5", 8080, "DEFAULT", ephemeral=True, weight=3.0,
                                                 metadata={"b": "2"})
    [host] = hosts(cp_registry)
    assert host["weight"] == 3.0 and host["metadata"] == {"a": "1", "b": "2"}
    assert (CID, SVC) in cp_registry.naming.beats
