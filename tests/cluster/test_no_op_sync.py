"""A write that changes nothing sends nothing to peers (issue 23, item 1): an identical re-register
and a beat of a healthy instance enqueue no Distro sync; a real change syncs once. (An operator's
edit is no Distro write at all: it is kept in the CP store, service_layer/overlays.py.)"""

from __future__ import annotations

from shoal.model.instance import InstanceInfo
from shoal.testing import SVC, SimCluster


async def test_writes_that_change_nothing_send_no_distro_sync() -> None:
    cluster = SimCluster(2)
    cluster[0].register("grpc-client", 8080, metadata={"k": "v"})
    http_id = cluster[0].naming.ip_port.register(SVC, InstanceInfo("10.0.0.2", 9090, metadata={"k": "v"}))
    await cluster.flush()  # the ip:port client settles on the node responsible for it
    assert cluster[0].ports() == cluster[1].ports() == [8080, 9090]
    a = next(node for node in cluster.nodes.values() if node.clients.get(http_id).native)  # type: ignore[union-attr]
    peer = next(node for node in cluster.nodes.values() if node is not a)
    sent = len(cluster.calls("DistroSyncRequest"))

    cluster[0].register("grpc-client", 8080, metadata={"k": "v"})  # the SDK's redo: identical
    a.naming.ip_port.register(SVC, InstanceInfo("10.0.0.2", 9090, metadata={"k": "v"}))
    assert a.naming.ip_port.beat(SVC, "10.0.0.2", 9090, None)[0] == 10200  # healthy already: a renewal only
    await cluster.flush()
    assert len(cluster.calls("DistroSyncRequest")) == sent
    assert not any(q.pending for node in cluster.nodes.values() for q in node.distro.engine.queues.values())

    a.naming.ip_port.register(SVC, InstanceInfo("10.0.0.2", 9090, metadata={"k": "w"}))  # a real change
    await cluster.flush()
    assert len(cluster.calls("DistroSyncRequest")) == sent + 1
    copy = peer.clients.get(http_id)
    assert copy is not None and dict(copy.publications[SVC].instances[0].metadata) == {"k": "w"}
