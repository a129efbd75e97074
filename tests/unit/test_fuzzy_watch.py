"""Fuzzy-watch patterns and context in process: matching, syncs, changes, limits, release."""

from __future__ import annotations

from typing import Any

import pytest

from shoal.errors import FuzzyWatchMatchOverLimit, FuzzyWatchPatternOverLimit, InvalidParam
from shoal.model.instance import InstanceInfo
from shoal.model.keys import ServiceKey
from shoal.service_layer.fuzzy import FuzzyWatchContext, item_matches, parse_pattern, pattern_matches
from shoal.testing import Registry, make_registry


@pytest.mark.parametrize(("pattern", "value", "matches"), [
    ("order", "order", True), ("order", "orders", False), ("*", "x", True),
    ("ord*", "order", True), ("ord*", "xorder", False), ("*der", "order", True), ("*der", "orders", False),
    ("*rd*", "order", True), ("*zz*", "order", False),
])
def test_item_matching_follows_fuzzy_group_key_pattern(pattern: str, value: str, matches: bool) -> None:
    assert item_matches(pattern, value) is matches


def test_pattern_namespace_is_exact_and_blank_means_public() -> None:
    assert pattern_matches(parse_pattern(">>G>>*"), ServiceKey("public", "G", "s"))
    assert not pattern_matches(parse_pattern("dev>>G>>*"), ServiceKey("public", "G", "s"))
    with pytest.raises(InvalidParam):
        parse_pattern("public>>only-two")


def _setup(**overrides: Any) -> tuple[Registry, FuzzyWatchContext, list[tuple[str, str, dict[str, Any]]]]:
    registry = make_registry(**overrides)
    sent: list[tuple[str, str, dict[str, Any]]] = []
    context = FuzzyWatchContext(registry.config, registry.bus, registry.services, registry.index,
                                lambda c, t, f: sent.append((c, t, f)))
    return registry, context, sent


def _register(registry: Registry, client: str, name: str) -> None:
    if registry.clients.get(client) is None:
        registry.connect(client)
    registry.naming.ephemeral.register_instance(client, ServiceKey("public", "DEFAULT_GROUP", name),
                                                InstanceInfo("10.0.0.1", 80))


def test_watch_syncs_then_reports_adds_and_removals_until_released() -> None:
    registry, context, sent = _setup(fuzzy_watch_batch_size=1)
    _register(registry, "pub", "a1")
    _register(registry, "pub", "b1")
    registry.connect("w")
    context.watch("w", "public>>DEFAULT_GROUP>>a*", [], initializing=True)
    assert [(f["syncType"], f["currentBatch"], f["totalBatch"]) for _, _, f in sent] == [
        ("FUZZY_WATCH_INIT_NOTIFY", 1, 1), ("FINISH_FUZZY_WATCH_INIT_NOTIFY", 0, 0)]
    sent.clear()
    _register(registry, "pub", "a2")
    _register(registry, "pub", "a2")  # a re-registration is no new service
    assert [(t, f["serviceKey"], f["changedType"]) for _, t, f in sent] == [
        ("NamingFuzzyWatchChangeNotifyRequest", "public@@DEFAULT_GROUP@@a2", "ADD_SERVICE")]
    sent.clear()
    registry.naming.connections.release_client("pub", "closed")
    assert sorted(f["serviceKey"] for _, _, f in sent) == ["public@@DEFAULT_GROUP@@a1", "public@@DEFAULT_GROUP@@a2"]
    registry.naming.connections.release_client("w", "closed")
    assert context.patterns == {}


def test_limits_raise_nacos_errors() -> None:
    registry, context, _ = _setup(fuzzy_watch_max_pattern_count=1, fuzzy_watch_max_match_count=1)
    _register(registry, "pub", "a1")
    _register(registry, "pub", "a2")
    with pytest.raises(FuzzyWatchMatchOverLimit):
        context.watch("w", "public>>DEFAULT_GROUP>>a*", [], initializing=True)
    assert context.watched_by("w") == ["public>>DEFAULT_GROUP>>a*"]
    with pytest.raises(FuzzyWatchPatternOverLimit) as exc:
        context.watch("w", "public>>DEFAULT_GROUP>>b*", [], initializing=True)
    assert exc.value.code == 50310
