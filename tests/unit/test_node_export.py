"""The node's model exported as Arrow snapshot files and read back with pyarrow."""

from __future__ import annotations

import asyncio
from pathlib import Path

from shoal.export.eventlog import ChangeLog
from shoal.export.node_export import NodeExporter, export_and_rotate
from shoal.export.reader import read_snapshot
from shoal.model.client import Client, ClientKind
from shoal.model.instance import InstanceInfo
from shoal.model.keys import ServiceKey
from shoal.testing import make_registry

SVC = ServiceKey("public", "G", "orders")


async def test_export_writes_every_table_from_the_model(tmp_path: Path) -> None:
    r = make_registry()
    log = ChangeLog(r.bus, r.clock, r.clients, capacity=100)
    r.connect("conn-1", ip="10.0.0.9")
    r.naming.ephemeral.register_instance("conn-1", SVC, InstanceInfo("10.1.0.1", 80, weight=2.0, metadata={"v": "1"}))
    synced = Client("conn-2", ClientKind.CONNECTION, native=False, created_ms=r.clock.now_ms(), owner="10.9.9.9:8848",
                    last_renew_ms=r.clock.monotonic_ms())
    r.clients.add(synced)
    r.naming.ephemeral.batch_register_instances("conn-1", ServiceKey("public", "G", "pay"),
                                      [InstanceInfo("10.1.0.2", 1), InstanceInfo("10.1.0.3", 2, healthy=False)])
    r.naming.subscriptions.subscribe("conn-1", SVC, "", "10.0.0.9", "agent", "app")
    r.naming.ephemeral.deregister_instance("conn-1", ServiceKey("public", "G", "pay"))
    exporter = NodeExporter("10.0.0.1:8848", r.clock, r.clients, r.services, r.index, r.storage, log,
                            lambda c: "10.0.0.1:8848" if c.native else c.owner)
    info = await export_and_rotate(exporter, tmp_path, keep=5)
    tables = read_snapshot(info.path)
    instances = tables["instances"].to_pylist()
    assert [(row["service"], row["ip"], row["weight"], row["client_id"], row["owner_node"], row["node"])
            for row in instances] == [("orders", "10.1.0.1", 2.0, "conn-1", "10.0.0.1:8848", "10.0.0.1:8848")]
    assert dict(instances[0]["metadata"]) == {"v": "1"}
    clients = {row["client_id"]: row for row in tables["clients"].to_pylist()}
    assert clients["conn-1"]["native"] and clients["conn-1"]["subscribed_services"] == 1
    assert clients["conn-2"]["owner_node"] == "10.9.9.9:8848" and clients["conn-2"]["last_renew_ms"] is not None
    services = {row["service"]: row for row in tables["services"].to_pylist()}
    assert services["orders"]["instance_count"] == 1 and services["orders"]["subscriber_count"] == 1
    assert services["pay"]["instance_count"] == 0
    kinds = [(row["kind"], row["ip"]) for row in tables["events"].to_pylist() if row["kind"] in ("register",
                                                                                                   "deregister")]
    assert kinds == [("register", "10.1.0.1"), ("register", "10.1.0.2"), ("register", "10.1.0.3"),
                     ("deregister", "10.1.0.2"), ("deregister", "10.1.0.3")]


async def test_rotation_keeps_the_newest(tmp_path: Path) -> None:
    r = make_registry()
    log = ChangeLog(r.bus, r.clock, r.clients, capacity=10)
    exporter = NodeExporter("n:1", r.clock, r.clients, r.services, r.index, r.storage, log, lambda c: None)
    paths = []
    for _ in range(4):
        paths.append((await export_and_rotate(exporter, tmp_path, keep=2)).path)
        r.clock.advance(1000)
    left = await asyncio.to_thread(lambda: sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")))
    assert left == sorted(p.name for p in paths[-2:])


def test_event_log_is_bounded() -> None:
    r = make_registry()
    log = ChangeLog(r.bus, r.clock, r.clients, capacity=3)
    r.connect("c")
    for port in range(5):
        r.naming.ephemeral.register_instance("c", SVC, InstanceInfo("10.0.0.1", port))
    assert len(log.snapshot()) == 3 and log.dropped > 0


def test_event_log_tells_expiry_from_disconnect() -> None:
    from shoal.model.events import REASON_EXPIRED

    r = make_registry()
    log = ChangeLog(r.bus, r.clock, r.clients, capacity=10)
    r.connect("gone")
    r.connect("stale")
    r.clients.remove("gone", "stream closed by client")
    r.clients.remove("stale", REASON_EXPIRED)
    kinds = {row[5]: row[1] for row in log.snapshot() if row[1] != "client_connected"}
    assert kinds == {"gone": "client_disconnected", "stale": "client_expired"}
