"""The instance history on two Distro nodes (issue 23 item 5): the owner logs what its client did
and why; the peer logs the copy with the owner's address, and its removal as a Distro one."""

from __future__ import annotations

from pathlib import Path

from shoal.export.history import HistoryLog
from shoal.testing import SimCluster


async def test_the_peer_logs_the_owners_client_and_its_distro_removal(tmp_path: Path) -> None:
    cluster = SimCluster(2)
    a, b = cluster[0], cluster[1]
    logs = {node.address: HistoryLog(node.bus, cluster.clock, node.clients, node.address, tmp_path / str(i),
                                      1_000_000, 100_000, 1000)
            for i, node in enumerate((a, b))}
    a.register("c1", 8080)
    await cluster.flush()
    assert b.ports() == [8080]
    a.clients.remove("c1", "stream closed by client")
    await cluster.flush()
    assert b.ports() == []

    service = ("public", "DEFAULT_GROUP", "svc")
    on_a = await logs[a.address].instance_rows(service, "", 0, 100)
    on_b = await logs[b.address].instance_rows(service, "", 0, 100)
    assert [(r["kind"], r["source"], r["owner"], r["reason"]) for r in on_a] == [
        ("register", "grpc", a.address, ""),
        ("deregister", "grpc", a.address, "connection closed: stream closed by client")]
    assert [(r["kind"], r["source"], r["owner"], r["reason"]) for r in on_b] == [
        ("register", "distro", a.address, "synced from its owner"),
        ("deregister", "distro", a.address, "Distro: its owner node dropped it")]
    assert all(r["node"] == b.address and r["client"] == "c1" for r in on_b)
