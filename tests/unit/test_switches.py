"""Naming switches over a real (embedded) CP store: typed parsing, cluster-wide application
through the watched document, debug-only changes, and a hostile document."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shoal.config import Config, LiveConfig
from shoal.cp.embedded import EmbeddedStore
from shoal.cp.store import Keyspace, json_view
from shoal.errors import InvalidParam
from shoal.service_layer.switches import ENTRIES, LIVE_SETTINGS, REFUSED, SWITCHES_DOC, Switches, parse_entry
from shoal.testing import wait_until


def test_entries_are_parsed_as_nacos_types_and_bad_ones_refused() -> None:
    assert parse_entry("clientBeatInterval", " 7000 ") == 7000
    assert parse_entry("pushEnabled", "FALSE") is False
    assert parse_entry("autoChangeHealthCheckEnabled", "false") is False
    with pytest.raises(InvalidParam, match="update entry not found: nope"):
        parse_entry("nope", "1")
    for entry, value in (("clientBeatInterval", "1.5"), ("clientBeatInterval", "0"), ("checkTimes", "x"),
                         ("healthCheckEnabled", "yes"), ("defaultPushCacheMillis", "-1")):
        with pytest.raises(InvalidParam):
            parse_entry(entry, value)


async def test_a_change_through_one_view_reaches_the_other_and_its_listeners(tmp_path: Path) -> None:
    store = EmbeddedStore(tmp_path / "cp.sqlite3", poll_interval_s=0.05)
    await store.start()
    views = [json_view(store, Keyspace.META) for _ in range(2)]
    base = Config()
    a, b = (Switches(LiveConfig(base), view) for view in views)
    for view in views:
        view.start()
        await view.wait_ready(10)
    try:
        assert b.value("clientBeatInterval") == base.client_beat_interval_ms
        await a.update("clientBeatInterval", "7000")
        await a.update("pushEnabled", "false")  # a second entry keeps the first
        await wait_until(lambda: b.config.push_enabled is False, 10)
        assert (b.config.client_beat_interval_ms, b.live.current.push_enabled) == (7000, False)
        assert b.domain()["clientBeatInterval"] == 7000 and b.domain()["name"].endswith("SWITCH_DOMAIN-000---00-00")
        await a.update("checkTimes", "7", debug=True)  # this node only
        assert a.config.health_check_times == 7 and b.config.health_check_times == base.health_check_times
        # a wrongly typed or unknown entry written by hand is ignored, the rest applies
        await views[0].put(SWITCHES_DOC, {"clientBeatInterval": "fast", "healthCheckEnabled": False, "x": 1})
        await wait_until(lambda: b.config.health_check_enabled is False, 10)
        assert b.config.client_beat_interval_ms == base.client_beat_interval_ms
        await views[0].delete(SWITCHES_DOC)  # gone: back to the node's settings
        await wait_until(lambda: b.config is base, 10)
    finally:
        for view in views:
            await view.stop()
        await store.close()


def test_every_entry_either_changes_a_live_setting_or_is_refused_by_name() -> None:
    assert set(LIVE_SETTINGS) | set(REFUSED) == set(ENTRIES) and not set(LIVE_SETTINGS) & set(REFUSED)
    for entry, field in LIVE_SETTINGS.items():
        assert hasattr(Config(), field), entry
    for entry in REFUSED:
        with pytest.raises(InvalidParam, match=f"switch {entry} is not supported"):
            parse_entry(entry, str(ENTRIES[entry].default).lower())


async def test_a_refused_entry_is_never_stored_and_a_stored_one_is_ignored(tmp_path: Path) -> None:
    store = EmbeddedStore(tmp_path / "cp.sqlite3", poll_interval_s=0.05)
    await store.start()
    view = json_view(store, Keyspace.META)
    switches = Switches(LiveConfig(Config()), view)
    view.start()
    await view.wait_ready(10)
    try:
        with pytest.raises(InvalidParam, match="distroThreshold"):
            await switches.update("distroThreshold", "0.5")
        assert view.get(SWITCHES_DOC) is None
        # a document written by an earlier release keeps only the entries that work
        await view.put(SWITCHES_DOC, {"distroThreshold": 0.5, "autoChangeHealthCheckEnabled": False})
        await wait_until(lambda: switches.live.current.health_check_auto_change is False, 10)
        assert switches.overrides == {"autoChangeHealthCheckEnabled": False}
        assert switches.domain()["distroThreshold"] == 0.7  # shown at Nacos's fixed value
    finally:
        await view.stop()
        await store.close()


async def test_each_live_switch_changes_its_consumer_while_the_node_runs() -> None:
    """Through the switches, the node's LiveConfig reaches the consumer built before the change."""
    from shoal.health.heartbeat import HeartbeatChecker
    from shoal.model.instance import InstanceInfo
    from shoal.model.ip_port import Standalone
    from shoal.model.keys import ServiceKey
    from shoal.push.service import PushService
    from shoal.testing import make_registry

    registry = make_registry(push_task_delay_ms=0)
    switches = Switches(registry.live)  # no CP view: applied on this node at once, as with debug=true
    svc = ServiceKey("public", "DEFAULT_GROUP", "svc")
    push = PushService(registry.live, registry.clock, registry.bus, _NoSender(), registry.index.subscribers_of,
                       lambda client_id, service: None)
    beats = HeartbeatChecker(registry.live, registry.clock, registry.clients, registry.services,
                             registry.naming.beats, Standalone())
    registry.connect("sub")
    registry.naming.subscriptions.subscribe("sub", svc, "", "10.9.9.9", "a", "b")
    registry.naming.ip_port.register(svc, InstanceInfo("10.0.0.5", 8080))

    await switches.update("clientBeatInterval", "7000")
    assert registry.naming.ip_port.beat(svc, "10.0.0.5", 8080, None)[1] == 7000
    await switches.update("defaultPushCacheMillis", "1234")
    assert json.loads(registry.naming.reads.query(svc))["cacheMillis"] == 1234
    assert svc in push.pending  # the registration above scheduled a push
    push.pending.clear()
    await switches.update("pushEnabled", "false")
    registry.naming.ip_port.register(svc, InstanceInfo("10.0.0.6", 8080))
    assert push.pending == {}  # a change, a subscriber, and no push scheduled
    await switches.update("healthCheckEnabled", "false")
    registry.clock.advance(100_000)
    assert beats.scan()["removed"] == 0 and len(json.loads(registry.naming.reads.query(svc))["hosts"]) == 2
    await switches.update("healthCheckEnabled", "true")
    assert beats.scan()["removed"] == 2


class _NoSender:
    async def send_push(self, client_id: str, service_info_json: str, timeout_ms: int) -> bool:
        return True
