"""The grace period of clients moved by rebalancing, across a simulated Distro cluster.

A moved connection's client is kept (listed, replicated) until the same instances are
published by a live client on any node, or ``rebalance_grace_ms`` passes; a client that simply
disconnects is released at once, as in Nacos.
"""

from __future__ import annotations

from shoal.service_layer.moved import MIN_SETTLE_MS
from shoal.testing import SVC, SimCluster

GRACE_MS = 45_000


def everyone_lists(cluster: SimCluster, port: int) -> bool:
    return all(port in cluster[i].ports() for i in range(3))


async def test_a_moved_client_stays_listed_until_it_registers_again_on_another_node() -> None:
    cluster = SimCluster(3, rebalance_grace_ms=GRACE_MS)
    a, b, c = cluster[0], cluster[1], cluster[2]
    a.register("old", 7001)
    a.naming.subscriptions.subscribe("old", SVC, "", "10.0.0.1", "agent", "app")
    await cluster.flush()
    assert everyone_lists(cluster, 7001)

    a.naming.moved.mark("old")
    a.naming.connections.release_client("old", "moved to another server (rebalancing)")
    await cluster.flush()
    kept = a.clients.get("old")
    assert kept is not None and kept.native and not kept.subscriptions  # kept, nobody to push to
    assert everyone_lists(cluster, 7001)
    a.naming.moved.tick()
    assert everyone_lists(cluster, 7001)

    # It comes back on b; a learns it by Distro, keeps the old copy a moment longer, then drops it.
    b.register("new", 7001)
    await cluster.flush()
    a.naming.moved.tick()
    assert a.clients.get("old") is not None and everyone_lists(cluster, 7001)
    cluster.clock.advance(MIN_SETTLE_MS)
    assert a.naming.moved.tick() == 1
    await cluster.flush()
    for node in (a, b, c):
        assert node.clients.get("old") is None
        assert node.ports() == [7001]
    assert a.naming.moved.returned == 1 and not a.naming.moved.kept


async def test_a_moved_client_that_never_comes_back_is_removed_everywhere_after_the_grace_period() -> None:
    cluster = SimCluster(3, rebalance_grace_ms=GRACE_MS)
    a = cluster[0]
    a.register("gone", 7002)
    await cluster.flush()
    a.naming.moved.mark("gone")
    a.naming.connections.release_client("gone", "moved to another server (rebalancing)")
    cluster.clock.advance(GRACE_MS - 1)
    a.naming.moved.tick()
    await cluster.flush()
    assert everyone_lists(cluster, 7002)

    cluster.clock.advance(1)
    assert a.naming.moved.tick() == 1
    await cluster.flush()
    for i in range(3):
        assert cluster[i].clients.get("gone") is None and cluster[i].ports() == []
    # nothing brings it back: later rounds, verify and more ticks
    cluster.clock.advance(GRACE_MS)
    a.naming.moved.tick()
    await cluster.flush()
    assert all(cluster[i].ports() == [] for i in range(3))
    assert a.naming.moved.expired == 1


async def test_a_client_that_simply_disconnects_is_removed_at_once() -> None:
    cluster = SimCluster(3, rebalance_grace_ms=GRACE_MS)
    a = cluster[0]
    a.register("plain", 7003)
    await cluster.flush()
    a.naming.connections.release_client("plain", "stream closed by client")
    await cluster.flush()
    assert all(cluster[i].ports() == [] for i in range(3))
    assert not a.naming.moved.kept


async def test_only_instances_of_all_kept_services_are_released_when_they_are_back() -> None:
    other = SVC.__class__(SVC.namespace, SVC.group, "other")
    cluster = SimCluster(3, rebalance_grace_ms=GRACE_MS)
    a, b = cluster[0], cluster[1]
    a.register("old", 7004)
    a.register("old", 7005, service=other)
    await cluster.flush()
    a.naming.moved.mark("old")
    a.naming.connections.release_client("old", "moved")
    b.register("new", 7004)  # only one of its two services is back
    await cluster.flush()
    a.naming.moved.tick()
    cluster.clock.advance(MIN_SETTLE_MS)
    assert a.naming.moved.tick() == 0
    await cluster.flush()
    kept = a.clients.get("old")
    assert kept is not None and list(kept.publications) == [other]
    assert all(cluster[i].ports(other) == [7005] for i in range(3))
    assert all(cluster[i].ports() == [7004] for i in range(3))


async def test_without_a_grace_period_or_publications_a_moved_client_goes_at_once() -> None:
    cluster = SimCluster(2, rebalance_grace_ms=0)
    a = cluster[0]
    a.register("c0", 7006)
    a.naming.moved.mark("c0")
    a.naming.connections.release_client("c0", "moved")
    assert a.clients.get("c0") is None

    cluster = SimCluster(2, rebalance_grace_ms=GRACE_MS)
    a = cluster[0]
    a.connect("subscriber-only")
    a.naming.moved.mark("subscriber-only")
    a.naming.connections.release_client("subscriber-only", "moved")
    assert a.clients.get("subscriber-only") is None and not a.naming.moved.kept


async def test_a_stale_mark_does_not_keep_a_later_ordinary_disconnect() -> None:
    cluster = SimCluster(2, rebalance_grace_ms=GRACE_MS)
    a = cluster[0]
    a.register("ignores-reset", 7007)
    a.naming.moved.mark("ignores-reset")
    cluster.clock.advance(GRACE_MS + 1)
    a.naming.moved.tick()
    a.naming.connections.release_client("ignores-reset", "stream closed by client")
    assert a.clients.get("ignores-reset") is None



async def test_a_stopping_node_releases_the_clients_it_keeps() -> None:
    cluster = SimCluster(2, rebalance_grace_ms=GRACE_MS)
    a = cluster[0]
    a.register("kept", 7009)
    await cluster.flush()
    a.naming.moved.mark("kept")
    a.naming.connections.release_client("kept", "moved")
    assert a.naming.moved.release_all() == 1
    await cluster.flush()
    assert cluster[1].ports() == [] and a.clients.get("kept") is None
