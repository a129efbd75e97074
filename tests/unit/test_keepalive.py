"""Connection table and keep-alive scan with Nacos's defaults on a manual clock."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import pytest

from shoal.clock import ManualClock
from shoal.config import Config
from shoal.health.keepalive import ConnectionKeepAlive
from shoal.model.clients import ClientManager
from shoal.stack import ModelStack
from shoal.testing.model import scratch_store
from shoal.transport.grpc.connections import Connection, ConnectionManager
from shoal.transport.grpc.limits import ConnectionLimitRule, LimitRuleFile
from shoal.transport.grpc.naming_handlers import NamingConnectionListener


class FakeProber:
    def __init__(self) -> None:
        self.alive: set[str] = set()
        self.probed: list[str] = []
        self.resets: list[tuple[str, str]] = []

    async def probe(self, conn: Connection, timeout_ms: int) -> bool:
        self.probed.append(conn.connection_id)
        return conn.connection_id in self.alive

    async def reset(self, conn: Connection, redirect: str) -> None:
        self.resets.append((conn.connection_id, redirect))


def setup(tmp_path: Path, **overrides: object) -> tuple[ManualClock, ConnectionManager, ClientManager,
                                                         FakeProber, ConnectionKeepAlive, LimitRuleFile]:
    config = dataclasses.replace(Config(), data_dir=str(tmp_path), **overrides).validate()
    clock = ManualClock()
    limits = LimitRuleFile(config.limit_rule_path)
    manager = ConnectionManager(config, clock, limits)
    model = ModelStack.build(config, clock, scratch_store())  # the AP half only: its CP store never starts
    clients = model.clients
    manager.listeners.append(NamingConnectionListener(model.naming))
    prober = FakeProber()
    return clock, manager, clients, prober, ConnectionKeepAlive(config, manager, prober, limits), limits


def connect(manager: ConnectionManager, port: int, ip: str = "10.0.0.1", app: str = "-") -> Connection:
    conn = manager.ensure(f"ipv4:{ip}:{port}")
    conn.labels, conn.client_ip, conn.app = {"module": "naming"}, ip, app
    manager.register(conn)
    return conn


def test_connection_id_and_peer_identity(tmp_path: Path) -> None:
    clock, manager, clients, *_ = setup(tmp_path)
    conn = manager.ensure("ipv4:10.1.2.3:4567")
    assert conn.connection_id == f"{clock.now_ms()}_10.1.2.3_4567"
    assert manager.ensure("ipv4:10.1.2.3:4567") is conn  # ServerCheck then stream: same connection
    assert not conn.registered and len(clients) == 0
    manager.register(conn)
    v6 = manager.ensure("ipv6:[::1]:99")
    assert (v6.remote_ip, v6.remote_port) == ("::1", 99)


def test_naming_client_exists_only_for_naming_module(tmp_path: Path) -> None:
    _, manager, clients, *_ = setup(tmp_path)
    conn = manager.ensure("ipv4:10.0.0.1:1")
    conn.labels = {"source": "sdk", "module": "config"}
    manager.register(conn)
    assert len(clients) == 0
    naming = connect(manager, 2)
    assert clients.get(naming.connection_id) is not None
    manager.unregister(naming.connection_id, "test")
    assert clients.get(naming.connection_id) is None


async def test_idle_connections_are_probed_after_20s_and_dead_ones_unregistered(tmp_path: Path) -> None:
    clock, manager, clients, prober, keepalive, _ = setup(tmp_path)
    alive, dead, busy = connect(manager, 1), connect(manager, 2), connect(manager, 3)
    prober.alive = {alive.connection_id}
    clock.advance(19_999)
    manager.touch(busy)
    assert (await keepalive.scan())["probed"] == 0
    clock.advance(1)
    stats = await keepalive.scan()
    assert sorted(prober.probed) == sorted([alive.connection_id, dead.connection_id])
    assert stats["probe_failed"] == 1
    assert manager.get(dead.connection_id) is None and clients.get(dead.connection_id) is None
    assert manager.get(alive.connection_id) is alive and manager.get(busy.connection_id) is busy
    prober.probed.clear()
    clock.advance(3_000)  # the answered probe refreshed its activity: not probed again yet
    await keepalive.scan()
    assert prober.probed == []


async def test_slots_are_reused_after_unregister(tmp_path: Path) -> None:
    _, manager, *_ = setup(tmp_path)
    first = connect(manager, 1)
    slot = first.slot
    manager.unregister(first.connection_id, "test")
    assert connect(manager, 2).slot == slot


async def test_transport_without_setup_is_forgotten(tmp_path: Path) -> None:
    clock, manager, _, prober, keepalive, _ = setup(tmp_path)
    pending = manager.ensure("ipv4:10.0.0.9:9")
    clock.advance(20_000)
    stats = await keepalive.scan()
    assert stats["unset_dropped"] == 1 and manager.for_peer(pending.peer) is None
    assert prober.probed == []


def test_limit_rule_parsing_and_precedence() -> None:
    rule = ConnectionLimitRule.parse(json.dumps({
        "countLimit": 10, "countLimitPerClientIpDefault": 3,
        "countLimitPerClientIp": {"10.0.0.1": 5}, "countLimitPerClientApp": {"shop": 1},
    }))
    assert rule.limit_for("10.0.0.1", "shop") == 5  # ip rule first
    assert rule.limit_for("10.0.0.2", "shop") == 1  # then app
    assert rule.limit_for("10.0.0.2", "other") == 3  # then default
    with pytest.raises(ValueError, match="countLimit"):
        ConnectionLimitRule.parse('{"countLimit": "many"}')


async def test_limits_refuse_new_connections_and_expel_over_limit_ones(tmp_path: Path) -> None:
    clock, manager, _, prober, keepalive, limits = setup(
        tmp_path, connection_redirect_address="10.0.0.100:8848")
    conns = [connect(manager, port) for port in range(1, 5)]
    limits.path.parent.mkdir(parents=True)
    limits.path.write_text(json.dumps({"countLimitPerClientIpDefault": 2}))
    await keepalive.scan()  # rule loaded: 4 connections from one ip, limit 2 → reset the 2 newest
    assert sorted(cid for cid, _ in prober.resets) == sorted(c.connection_id for c in conns[2:])
    assert {redirect for _, redirect in prober.resets} == {"10.0.0.100:8848"}
    assert manager.check_limit("10.0.0.1", "-") is not None
    assert manager.check_limit("10.0.0.2", "-") is None
    clock.advance(3000)
    stats = await keepalive.scan()  # they did not leave by themselves: unregistered now
    assert stats["expelled"] == 2
    assert sorted(manager.by_id) == sorted(c.connection_id for c in conns[:2])


async def test_bad_rule_file_keeps_the_previous_rule(tmp_path: Path) -> None:
    _, _, _, _, keepalive, limits = setup(tmp_path)
    limits.path.parent.mkdir(parents=True)
    limits.path.write_text('{"countLimit": 5}')
    await keepalive.scan()
    assert limits.rule.count_limit == 5
    limits.path.write_text("{not json")
    import os
    os.utime(limits.path, ns=(1, 1))
    await keepalive.scan()
    assert limits.rule.count_limit == 5


async def test_probes_go_out_in_bounded_waves(tmp_path: Path) -> None:
    from shoal.health import keepalive as module

    clock, manager, _, prober, keepalive, _ = setup(tmp_path)
    conns = [connect(manager, port) for port in range(1, 2 * module.PROBE_WAVE + 11)]
    prober.alive = {c.connection_id for c in conns[::2]}
    in_flight = 0
    peak = 0
    original = prober.probe

    async def counting(conn: Connection, timeout_ms: int) -> bool:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0)
        in_flight -= 1
        return await original(conn, timeout_ms)

    prober.probe = counting  # type: ignore[method-assign]
    clock.advance(20_000)
    stats = await keepalive.scan()
    assert stats["probed"] == len(conns) and peak <= module.PROBE_WAVE
    assert stats["probe_failed"] == len(conns) // 2 and len(manager) == len(conns) - len(conns) // 2


async def test_a_workers_limits_count_its_siblings_connections(tmp_path: Path) -> None:
    """A worker of a node of workers enforces the node's rule: its siblings' last reported
    connections count, and it expels its share of the node's excess."""
    from shoal.transport.grpc.limits import SiblingConnections

    clock, manager, _, prober, keepalive, limits = setup(tmp_path)
    siblings = SiblingConnections(manager.own_counts, lambda: limits.rule, clock.monotonic_ms, 5000)
    manager.siblings = siblings
    conns = [connect(manager, port) for port in range(1, 4)]  # 3 here
    limits.path.parent.mkdir(parents=True)
    limits.path.write_text(json.dumps({"countLimit": 6, "countLimitPerClientIpDefault": 4}))
    await keepalive.scan()
    assert manager.check_limit("10.0.0.9", "-") is None
    assert siblings.outgoing() == {"total": 3, "perIp": {"10.0.0.1": 3}}
    siblings.received("sibling", {"total": 3, "perIp": {"10.0.0.2": 3}})  # the node holds 6: full
    assert "total connection limit 6" in (manager.check_limit("10.0.0.9", "-") or "")
    siblings.received("sibling", {"total": 2, "perIp": {"10.0.0.1": 1}})  # 5: ip 10.0.0.1 holds 4 on the node
    assert manager.check_limit("10.0.0.9", "-") is None
    assert "client ip 10.0.0.1" in (manager.check_limit("10.0.0.1", "-") or "")
    siblings.received("sibling", {"total": 6, "perIp": {"10.0.0.2": 6}})  # the node holds 9: 3 too many
    await keepalive.scan()  # this worker holds a third of them: it resets one, its newest
    assert [cid for cid, _ in prober.resets] == [conns[2].connection_id]
