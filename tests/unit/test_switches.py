"""Naming switches over a real (embedded) CP store: typed parsing, cluster-wide application
through the watched document, debug-only changes, and a hostile document."""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal.config import Config
from shoal.cp.embedded import EmbeddedStore
from shoal.cp.store import Keyspace, json_view
from shoal.errors import InvalidParam
from shoal.service_layer.switches import SWITCHES_DOC, Switches, parse_entry
from shoal.testing import wait_until


def test_entries_are_parsed_as_nacos_types_and_bad_ones_refused() -> None:
    assert parse_entry("clientBeatInterval", " 7000 ") == 7000
    assert parse_entry("pushEnabled", "FALSE") is False
    assert parse_entry("distroThreshold", "0.5") == 0.5
    assert parse_entry("overriddenServerStatus", "down") == "DOWN"
    with pytest.raises(InvalidParam, match="update entry not found: nope"):
        parse_entry("nope", "1")
    for entry, value in (("clientBeatInterval", "1.5"), ("clientBeatInterval", "0"), ("checkTimes", "x"),
                         ("healthCheckEnabled", "yes"), ("distroThreshold", "2"), ("pushJavaVersion", "")):
        with pytest.raises(InvalidParam):
            parse_entry(entry, value)


async def test_a_change_through_one_view_reaches_the_other_and_its_listeners(tmp_path: Path) -> None:
    store = EmbeddedStore(tmp_path / "cp.sqlite3", poll_interval_s=0.05)
    await store.start()
    views = [json_view(store, Keyspace.META) for _ in range(2)]
    base = Config()
    a, b = (Switches(base, view) for view in views)
    seen: list[Config] = []
    b.subscribe(seen.append)
    for view in views:
        view.start()
        await view.wait_ready(10)
    try:
        assert b.value("clientBeatInterval") == base.client_beat_interval_ms
        await a.update("clientBeatInterval", "7000")
        await a.update("pushEnabled", "false")  # a second entry keeps the first
        await wait_until(lambda: b.config.push_enabled is False, 10)
        assert (b.config.client_beat_interval_ms, seen[-1].push_enabled) == (7000, False)
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
