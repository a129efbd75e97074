"""Persistent instances and service metadata in process: a real embedded CP store (SQLite in a
temporary dir), the model fed only by the views' watch, and the health checker probing real
loopback listeners."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from shoal.config import Config, LiveConfig
from shoal.cp.embedded import EmbeddedStore
from shoal.cp.store import Keyspace
from shoal.distro.mapper import DistroMapper
from shoal.errors import InvalidParam, ServiceNotEmpty
from shoal.export.eventlog import ChangeLog
from shoal.export.node_export import NodeExporter, export_and_rotate
from shoal.export.reader import read_snapshot
from shoal.health.checker import CheckSettings, PersistentHealthChecker, http_check, tcp_check
from shoal.model.client import ClientKind
from shoal.model.instance import InstanceInfo
from shoal.model.keys import ServiceKey
from shoal.service_layer.ephemeral import with_instance_id
from shoal.service_layer.persistent import (
    MAX_BATCH,
    ClusterSettings,
    PersistentNaming,
    instance_doc,
    instance_name,
    persistent_client_id,
    service_name,
)
from shoal.testing import Registry, make_registry, wait_until

SVC = ServiceKey("public", "DEFAULT_GROUP", "db")


@dataclass
class Cp:
    registry: Registry
    persistent: PersistentNaming
    store: EmbeddedStore


@pytest.fixture
async def cp(tmp_path: Path) -> AsyncIterator[Cp]:
    store = EmbeddedStore.in_data_dir(tmp_path)
    registry = make_registry(store=store)
    await registry.start_cp()
    try:
        yield Cp(registry, registry.naming.persistent, store)
    finally:
        await registry.stop_cp()


def hosts(registry: Registry, service: ServiceKey = SVC) -> list[dict[str, object]]:
    return list(json.loads(registry.naming.reads.query(service))["hosts"])


async def test_a_persistent_instance_reaches_the_model_through_the_watch(cp: Cp) -> None:
    await cp.persistent.register(SVC, InstanceInfo("10.0.0.1", 3306, metadata={"k": "v"}))
    [host] = hosts(cp.registry)
    assert (host["ip"], host["ephemeral"], host["metadata"]) == ("10.0.0.1", False, {"k": "v"})
    client = cp.registry.clients.get(persistent_client_id(SVC))
    assert client is not None and client.kind is ClientKind.PERSISTENT and not client.replicated
    record = cp.registry.services.get(SVC)
    assert record is not None and record.ephemeral is False
    assert DistroMapper(None).responsible_client(client) is False  # Distro never sends it
    await cp.persistent.deregister(SVC, "10.0.0.1", 3306)
    assert hosts(cp.registry) == [] and cp.registry.clients.get(persistent_client_id(SVC)) is None


async def test_kinds_do_not_mix_in_one_service(cp: Cp) -> None:
    await cp.persistent.register(SVC, InstanceInfo("10.0.0.1", 3306))
    with pytest.raises(InvalidParam, match="persistent service"):
        cp.registry.naming.ip_port.register(SVC, InstanceInfo("10.0.0.2", 1))
    eph = ServiceKey("public", "DEFAULT_GROUP", "eph")
    cp.registry.naming.ip_port.register(eph, InstanceInfo("10.0.0.3", 1))
    with pytest.raises(InvalidParam, match="ephemeral service"):
        await cp.persistent.register(eph, InstanceInfo("10.0.0.4", 1))


async def test_service_metadata_is_applied_from_the_store(cp: Cp) -> None:
    made = ServiceKey("public", "DEFAULT_GROUP", "made")
    await cp.persistent.create_service(made, 0.8, {"team": "core"}, ephemeral=False)
    record = cp.registry.services.get(made)
    assert record is not None and not record.ephemeral and record.has_metadata
    assert (record.protect_threshold, record.metadata) == (0.8, {"team": "core"})
    await cp.persistent.register(made, InstanceInfo("10.0.0.1", 1, healthy=False))
    await cp.persistent.register(made, InstanceInfo("10.0.0.2", 1))
    info = json.loads(cp.registry.naming.reads.query(made))
    assert info["reachProtectionThreshold"] is True  # 1/2 healthy <= 0.8: all shown healthy
    await cp.persistent.update_service(made, 0.1, None)
    assert json.loads(cp.registry.naming.reads.query(made))["reachProtectionThreshold"] is False
    with pytest.raises(ServiceNotEmpty):
        await cp.persistent.delete_service(made)


async def test_a_persistent_batch_registers_and_removes_several_instances(cp: Cp) -> None:
    views = cp.persistent.instances
    await cp.persistent.batch_register(SVC, [InstanceInfo("10.0.0.1", 1),
                                             InstanceInfo("10.0.0.2", 2, cluster="c2", metadata={"k": "v"})])
    assert sorted((h["ip"], h["clusterName"], h["ephemeral"]) for h in hosts(cp.registry)) == [
        ("10.0.0.1", "DEFAULT", False), ("10.0.0.2", "c2", False)]
    revision = views.revision
    await cp.persistent.batch_register(SVC, [InstanceInfo("10.0.0.1", 1)])  # a redo: nothing to write
    assert views.revision == revision
    # every instance is checked before anything is written
    with pytest.raises(InvalidParam, match="cluster"):
        await cp.persistent.batch_register(SVC, [InstanceInfo("10.0.0.3", 3),
                                                 InstanceInfo("10.0.0.4", 4, cluster="b@d")])
    assert views.revision == revision and len(hosts(cp.registry)) == 2
    # removal by ip:port whatever the cluster; an unknown one is a no-op
    await cp.persistent.batch_deregister(SVC, [InstanceInfo("10.0.0.2", 2), InstanceInfo("10.0.0.9", 9)])
    assert [h["ip"] for h in hosts(cp.registry)] == ["10.0.0.1"]
    eph = ServiceKey("public", "DEFAULT_GROUP", "eph")
    cp.registry.naming.ip_port.register(eph, InstanceInfo("10.0.0.5", 1))
    with pytest.raises(InvalidParam, match="ephemeral service"):
        await cp.persistent.batch_register(eph, [InstanceInfo("10.0.0.6", 1)])


async def test_deleting_a_service_reaches_every_node_with_or_without_a_document(cp: Cp) -> None:
    other = make_registry(store=cp.store)  # a second node on the same store
    await other.start_cp(start_store=False)
    views = other.instance_view, other.service_view
    try:
        # a service made by registrations (Distro gives every node its record), now empty: no document
        made_by_use = ServiceKey("public", "DEFAULT_GROUP", "used")
        for registry in (cp.registry, other):
            registry.naming.ip_port.register(made_by_use, InstanceInfo("10.0.0.7", 1))
            registry.naming.ip_port.deregister(made_by_use, "10.0.0.7", 1)
            assert registry.services.get(made_by_use) is not None
        await cp.persistent.delete_service(made_by_use)
        await wait_until(lambda: other.services.get(made_by_use) is None, 5, "the other node dropping the service")
        assert cp.registry.services.get(made_by_use) is None and cp.persistent.service_doc(made_by_use) is None
        assert views[1].get(service_name(made_by_use)) is None  # the marker is gone from the store
        # a node that still sees an instance (its Distro copy lags) keeps the service until it goes
        lagging = ServiceKey("public", "DEFAULT_GROUP", "lagging")
        cp.registry.naming.ip_port.register(lagging, InstanceInfo("10.0.0.7", 1))
        cp.registry.naming.ip_port.deregister(lagging, "10.0.0.7", 1)
        other.naming.ip_port.register(lagging, InstanceInfo("10.0.0.7", 1))
        await cp.persistent.delete_service(lagging)
        await wait_until(lambda: views[1].revision == cp.persistent.service_docs.revision, 5, "the other view")
        assert [h["ip"] for h in hosts(other, lagging)] == ["10.0.0.7"]
        other.naming.ip_port.deregister(lagging, "10.0.0.7", 1)
        assert other.services.get(lagging) is None
        # a created one (with a document)
        made = ServiceKey("public", "DEFAULT_GROUP", "made")
        await cp.persistent.create_service(made, 0.0, {}, ephemeral=False)
        await wait_until(lambda: other.services.get(made) is not None, 5, "the other node seeing the service")
        await cp.persistent.delete_service(made)
        await wait_until(lambda: other.services.get(made) is None, 5, "the other node dropping it")
        # still refused while it has instances, whichever node holds them
        await cp.persistent.register(made, InstanceInfo("10.0.0.8", 1))
        with pytest.raises(ServiceNotEmpty, match="is not empty"):
            await cp.persistent.delete_service(made)
    finally:
        await other.stop_cp(stop_store=False)


async def test_a_persistent_batch_is_one_transaction_all_or_nothing(cp: Cp) -> None:
    """The batch is one CP txn under compares of every key it read: worked out from a lagging view
    (one instance changed since), its first txn fails and writes nothing, the next stores all of
    it; a batch over the txn limit is refused before any write (docs/protocol.md §3.5)."""
    views = cp.persistent.instances
    x, y = InstanceInfo("10.0.1.1", 1), InstanceInfo("10.0.1.2", 2)
    await cp.persistent.batch_register(SVC, [x])
    await views.stop()  # this node's view lags from here on
    name_x = instance_name(SVC, "DEFAULT", x.ip, x.port)
    await cp.store.put(Keyspace.INSTANCES.key(name_x), json.dumps({**views.get(name_x), "weight": 5.0}).encode())
    await cp.persistent.batch_register(SVC, [x, y])
    stored = {Keyspace.INSTANCES.name_of(kv.key): json.loads(kv.value)
              for kv in (await cp.store.range(Keyspace.INSTANCES.prefix)).items}
    assert stored == {instance_name(SVC, "DEFAULT", i.ip, i.port): instance_doc(SVC, with_instance_id(SVC, i))
                      for i in (x, y)}
    revision = (await cp.store.range("")).revision
    with pytest.raises(InvalidParam, match=f"at most {MAX_BATCH}"):
        await cp.persistent.batch_register(SVC, [InstanceInfo(f"10.0.2.{i}", 1) for i in range(1, MAX_BATCH + 2)])
    assert (await cp.store.range("")).revision == revision


async def test_restart_on_the_same_store_brings_instances_back(tmp_path: Path) -> None:
    first = make_registry(store=EmbeddedStore.in_data_dir(tmp_path))
    await first.start_cp()
    await first.naming.persistent.register(SVC, InstanceInfo("10.0.0.9", 9))
    await first.stop_cp()

    registry = make_registry(store=EmbeddedStore.in_data_dir(tmp_path))
    await registry.start_cp()
    try:
        assert [h["ip"] for h in hosts(registry)] == ["10.0.0.9"]
    finally:
        await registry.stop_cp()


def _listener(port: int = 0) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(8)
    return sock


async def test_checker_flips_health_when_the_port_closes_and_reopens(cp: Cp) -> None:
    sock = _listener()
    port = int(sock.getsockname()[1])
    await cp.persistent.register(SVC, InstanceInfo("127.0.0.1", port))
    checks: list[str] = []
    checker = PersistentHealthChecker(cp.persistent, lambda _name: True, cp.registry.clock.monotonic_ms,
                                      CheckSettings(interval_ms=100, jitter_ms=0, timeout_ms=500), live(check_times=2),
                                      checks.append)

    try:
        sock.close()
        await drive(cp, checker, lambda: hosts(cp.registry)[0]["healthy"] is False, "the instance unhealthy")
        assert len(checks) >= 2 and set(checks) == {"TCP"}  # check_times=2: two failures first
        sock = _listener(port)
        await drive(cp, checker, lambda: hosts(cp.registry)[0]["healthy"] is True, "the instance healthy again")
    finally:
        sock.close()
        await checker.stop()


def live(check_times: int = 3, auto_change: bool = True) -> LiveConfig:
    return LiveConfig(dataclasses.replace(Config(), health_check_times=check_times,
                                          health_check_auto_change=auto_change))


async def test_checker_probes_but_never_flips_while_auto_change_is_off(cp: Cp) -> None:
    """autoChangeHealthCheckEnabled=false (a naming switch, read live): probes go on, health stays."""
    sock = _listener()
    port = int(sock.getsockname()[1])
    sock.close()  # nothing listens: every probe fails
    await cp.persistent.register(SVC, InstanceInfo("127.0.0.1", port))
    checks: list[str] = []
    settings = live(check_times=1, auto_change=False)
    checker = PersistentHealthChecker(cp.persistent, lambda _name: True, cp.registry.clock.monotonic_ms,
                                      CheckSettings(interval_ms=100, jitter_ms=0), settings, checks.append)
    try:
        # one probe of an instance at a time: by the third, the first two results were recorded
        await drive(cp, checker, lambda: len(checks) >= 3, "three failed probes")
        assert hosts(cp.registry)[0]["healthy"] is True
        settings.reload(dataclasses.replace(settings.current, health_check_auto_change=True))
        await drive(cp, checker, lambda: hosts(cp.registry)[0]["healthy"] is False, "the instance unhealthy")
    finally:
        await checker.stop()


async def test_checker_runs_only_services_it_is_responsible_for(cp: Cp) -> None:
    await cp.persistent.register(SVC, InstanceInfo("127.0.0.1", 1))
    checks: list[str] = []
    checker = PersistentHealthChecker(cp.persistent, lambda _name: False, cp.registry.clock.monotonic_ms,
                                      CheckSettings(interval_ms=100, jitter_ms=0), live(), checks.append)
    for _ in range(5):
        await checker.tick()
        cp.registry.clock.advance(200)
    await asyncio.sleep(0.05)
    assert checks == [] and checker.checks == 0


async def test_http_check_follows_the_cluster_settings(cp: Cp) -> None:
    statuses = {"/up": b"200 OK", "/teapot": b"418 I'm a teapot"}
    seen_headers: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        seen_headers.append(head)
        path = head.split(b" ")[1].decode()
        writer.write(b"HTTP/1.1 " + statuses.get(path, b"404 Not Found") + b"\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = int(server.sockets[0].getsockname()[1])
    try:
        assert await http_check("127.0.0.1", port, "/up", {"X-Probe": "1"}, 200, 1.0)
        assert b"X-Probe: 1" in seen_headers[-1]
        assert not await http_check("127.0.0.1", port, "/teapot", {}, 200, 1.0)
        assert await http_check("127.0.0.1", port, "/teapot", {}, 418, 1.0)
        assert await tcp_check("127.0.0.1", port, 1.0)
        # the cluster's checker (HTTP, a check port instead of the instance's) is used by the checker
        await cp.persistent.register(SVC, InstanceInfo("127.0.0.1", 1))
        await cp.persistent.update_cluster(SVC, "DEFAULT", ClusterSettings(
            {"type": "HTTP", "path": "/teapot", "expectedResponseCode": 418}, port, False))
        assert cp.persistent.cluster_settings(SVC, "DEFAULT").check_port == port
        checks: list[str] = []
        checker = PersistentHealthChecker(cp.persistent, lambda _name: True, cp.registry.clock.monotonic_ms,
                                          CheckSettings(interval_ms=100, jitter_ms=0), live(check_times=1),
                                          checks.append)
        await drive(cp, checker, lambda: bool(checks), "an HTTP check")
        assert checks[0] == "HTTP" and hosts(cp.registry)[0]["healthy"] is True
        await checker.stop()
    finally:
        server.close()
        await server.wait_closed()


async def drive(cp: Cp, checker: PersistentHealthChecker, done: Callable[[], bool], what: str) -> None:
    """Tick the checker and step the manual clock past each interval until ``done`` (5 s deadline)."""
    async with asyncio.timeout(5):
        while not done():
            await checker.tick()
            cp.registry.clock.advance(100)
            await asyncio.sleep(0.01)  # let the probes (real sockets) run
    assert done(), what


async def test_persistent_instances_are_exported_and_listed_like_ephemeral_ones(cp: Cp, tmp_path: Path) -> None:
    log = ChangeLog(cp.registry.bus, cp.registry.clock, cp.registry.clients, capacity=100)
    await cp.persistent.register(SVC, InstanceInfo("10.0.0.7", 5432))
    assert cp.registry.naming.reads.list_services("public", "DEFAULT_GROUP", 1, 10).names == ["db"]
    exporter = NodeExporter("10.0.0.1:8848", cp.registry.clock, cp.registry.clients, cp.registry.services,
                            cp.registry.index, cp.registry.storage, log, lambda c: "10.0.0.1:8848")
    tables = read_snapshot((await export_and_rotate(exporter, tmp_path / "export", keep=1)).path)
    [row] = tables["instances"].to_pylist()
    assert (row["ip"], row["ephemeral"], row["client_id"]) == ("10.0.0.7", False, persistent_client_id(SVC))
    [client] = tables["clients"].to_pylist()
    assert client["kind"] == "persistent"
    [service] = tables["services"].to_pylist()
    assert service["ephemeral"] is False and service["instance_count"] == 1
