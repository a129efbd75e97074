"""Verify removes the copies a peer holds of clients their owner no longer has (docs/protocol.md
§6.5) — and nothing else: not while the owner loads or rebuilds its digests, not a client the
owner still holds in any form, not a copy that changed or changed hands since it was named."""

from __future__ import annotations

import pytest

from shoal.distro.verify import REMOVE_REQUEST
from shoal.distro.verify.wire import parse_remove_answer, remove_request
from shoal.model.client import Client, ClientKind
from shoal.model.instance import InstanceInfo
from shoal.testing import SVC, SimCluster

GONE = "client went away"


async def _with_ghosts(cluster: SimCluster, kept: int, gone: int) -> tuple[list[str], list[str]]:
    """Node 0 registers ``kept + gone`` clients, every node gets them, then the ``gone`` ones
    disconnect while their DELETE is lost on its way to node 2 (the peer that was away)."""
    a = cluster[0]
    live = [f"live-{i}" for i in range(kept)]
    ghosts = [f"ghost-{i}" for i in range(gone)]
    for i, cid in enumerate(live + ghosts):
        a.register(cid, 1 + i % 60000)
    await cluster.flush()
    cluster[2].distro.sync_receiver.drop_count = 1_000  # every batch to node 2 is lost from here on
    for cid in ghosts:
        a.clients.remove(cid, GONE)
    await cluster.flush()
    cluster[2].distro.sync_receiver.drop_count = 0
    assert all(cluster[2].clients.get(cid) is not None for cid in ghosts)  # the ghosts
    assert all(cluster[1].clients.get(cid) is None for cid in ghosts)
    return live, ghosts


@pytest.mark.parametrize(("kept", "gone"), [(20, 3), (0, 4), (30_000, 120)],
                         ids=["some-gone", "all-gone", "large-with-sub-digests"])
async def test_a_copy_the_owner_no_longer_has_is_removed_in_one_round(kept: int, gone: int) -> None:
    cluster = SimCluster(3)
    live, ghosts = await _with_ghosts(cluster, kept, gone)
    c = cluster[2]
    await cluster[0].distro.verify_round()
    assert [cid for cid in ghosts if c.clients.get(cid) is not None] == []
    assert all(c.clients.get(cid) is not None for cid in live)
    assert sorted(c.ports()) == sorted(cluster[0].ports())
    outcome = cluster[0].distro.verify_stats.last_outcome[cluster.addresses[2]]
    assert (outcome.result, outcome.removed, outcome.resynced) == ("repaired", gone, 0)
    assert cluster[0].distro.verify_stats.last_outcome[cluster.addresses[1]].result == "ok"
    cluster.network.calls.clear()
    await cluster[0].distro.verify_round()  # in agreement again: one digest request per peer
    assert [call[2] for call in cluster.network.calls] == ["DistroVerifyRequest"] * 2


async def test_a_stale_copy_is_re_sent_and_a_ghost_beside_it_removed() -> None:
    cluster = SimCluster(2)
    a, b = cluster[0], cluster[1]
    a.register("stale", 1)
    a.register("ghost", 2)
    await cluster.flush()
    b.distro.sync_receiver.drop_count = 10
    a.register("stale", 3)  # a new revision b never gets
    a.clients.remove("ghost", GONE)
    await cluster.flush()
    b.distro.sync_receiver.drop_count = 0
    await a.distro.verify_round()
    await cluster.flush()
    assert b.clients.get("ghost") is None
    assert b.ports() == [3] and b.clients.get("stale").revision == a.clients.get("stale").revision  # type: ignore[union-attr]


@pytest.mark.parametrize("how", ["loading", "rebuilding its digests"])
async def test_an_owner_still_loading_or_rebuilding_makes_no_peer_delete(how: str) -> None:
    cluster = SimCluster(3)
    live, ghosts = await _with_ghosts(cluster, 5, 2)
    a, c = cluster[0], cluster[2]
    if how == "loading":
        a.distro.loaded = False  # e.g. restarted and loading its snapshot
    else:
        a.distro.index.reset()  # a rebuild in chunks (a million clients) is under way
    await a.distro.verify_round()
    assert not cluster.calls(REMOVE_REQUEST)
    assert all(c.clients.get(cid) is not None for cid in live + ghosts)
    if how == "loading":
        a.distro.loaded = True  # the load is done: its digests are rebuilt
    else:
        a.distro.index.rebuild_now()
    await a.distro.verify_round()
    assert [cid for cid in ghosts if c.clients.get(cid) is not None] == []


async def test_a_peer_still_loading_removes_nothing() -> None:
    cluster = SimCluster(3)
    _, ghosts = await _with_ghosts(cluster, 5, 2)
    c = cluster[2]
    c.distro.loaded = False
    answer = await c.distro.dispatch(cluster.addresses[0], REMOVE_REQUEST,
                                     remove_request([(cid, c.clients.get(cid).revision) for cid in ghosts]))  # type: ignore[union-attr]
    assert parse_remove_answer(answer[1]) == 0
    assert all(c.clients.get(cid) is not None for cid in ghosts)


async def test_a_client_the_owner_holds_as_another_members_copy_is_kept() -> None:
    # c's copy names a as its owner, but a holds the client as b's copy (ownership moved to b and
    # b's CHANGE has not reached c yet): live, so a's verify must not have c remove it
    cluster = SimCluster(3)
    a = cluster.addresses[0]
    cluster[1].register("moved", 7)
    await cluster.flush()
    record = cluster[2].distro.processor.record_of("moved", 0)
    assert record is not None
    cluster[2].distro._apply(a, [record])  # as a batch from a is applied
    assert cluster[2].clients.get("moved").owner == a  # type: ignore[union-attr]
    await cluster[0].distro.verify_round()
    assert cluster.calls("DistroVerifyDetailRequest")  # the difference was looked at
    assert not cluster.calls(REMOVE_REQUEST)
    assert cluster[2].clients.get("moved") is not None and cluster[2].ports() == [7]


async def test_a_pending_handoff_client_of_the_owner_is_kept_on_peers() -> None:
    # a holds an ip:port client natively that b is responsible for (pending handoff): a's digests
    # leave it out, but its copies on peers name a as owner; they are live and must stay
    cluster = SimCluster(3)
    a = cluster.addresses[0]
    node = cluster[0]
    cid = next(f"10.8.0.{i}:80#true" for i in range(1, 200)
               if not node.distro.mapper.responsible_client(Client(f"10.8.0.{i}:80#true", ClientKind.IP_PORT, True, 0)))
    cluster.network.cut.add((a, node.distro.mapper.owner_of(cid.split("#")[0])))  # the handoff cannot complete
    node.clients.add(Client(cid, ClientKind.IP_PORT, native=True, created_ms=0))
    node.naming.ephemeral.register_instance(cid, SVC, InstanceInfo("10.8.0.1", 80))
    await cluster.flush()
    holder = next(n for n in (cluster[1], cluster[2]) if n.clients.get(cid) is not None)
    assert holder.clients.get(cid).owner == a  # type: ignore[union-attr]
    await node.distro.verify_round()
    assert holder.clients.get(cid) is not None and holder.ports() == [80]


async def test_a_removal_only_takes_the_senders_copy_at_the_named_revision() -> None:
    cluster = SimCluster(3)
    a, b = cluster.addresses[:2]
    cluster[1].register("bs", 1)  # c holds b's copy
    cluster[0].register("as", 2)
    await cluster.flush()
    node = cluster[2]
    revision = node.clients.get("as").revision  # type: ignore[union-attr]
    requests = [
        (a, [("bs", node.clients.get("bs").revision)]),  # type: ignore[union-attr]  # not a's copy
        (a, [("as", revision + 1)]),  # changed since it was named
        (b, [("as", revision)]),  # another member's copy
    ]
    for sender, copies in requests:
        _, answer = await node.distro.dispatch(sender, REMOVE_REQUEST, remove_request(copies))
        assert parse_remove_answer(answer) == 0
    assert node.clients.get("as") is not None and node.clients.get("bs") is not None
    _, answer = await node.distro.dispatch(a, REMOVE_REQUEST, remove_request([("as", revision)]))
    assert parse_remove_answer(answer) == 1 and node.clients.get("as") is None
