"""Distro protocol logic on an in-memory network with a manual clock (docs/protocol.md §6)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal.distro import records
from shoal.distro.members import MemberState
from shoal.distro.records import OP_CHANGE
from shoal.model.client import Client, ClientKind
from shoal.model.instance import InstanceInfo
from shoal.model.keys import ServiceKey
from shoal.testing import OPEN_SETTINGS, SVC, SimCluster


async def test_register_on_a_reaches_every_peer() -> None:
    cluster = SimCluster(3)
    cluster[0].register("c1", 8080, metadata={"k": "v"})
    await cluster.flush()
    for node in (cluster[1], cluster[2]):
        [inst] = node.storage.view(SVC).instances
        assert (inst.port, dict(inst.metadata)) == (8080, {"k": "v"})
        copy = node.clients.get("c1")
        assert copy is not None and not copy.native and copy.owner == cluster.addresses[0]
        assert copy.revision == cluster[0].clients.get("c1").revision  # type: ignore[union-attr]


async def test_changes_of_one_client_within_the_delay_merge_into_one_record() -> None:
    cluster = SimCluster(2, sync_delay_ms=100)
    for port in range(1, 6):
        cluster[0].register("c1", port)
        cluster.clock.advance(10)
    assert len(cluster[0].distro.engine.queues[cluster.addresses[1]].pending) == 1
    await cluster.flush()
    assert len(cluster.calls("DistroSyncRequest")) == 1
    assert cluster[1].ports() == [5]


async def test_many_clients_travel_in_one_request() -> None:
    cluster = SimCluster(2)
    for i in range(50):
        cluster[0].register(f"c{i}", 1000 + i)
    await cluster.flush()
    assert len(cluster.calls("DistroSyncRequest")) == 1
    assert len(cluster[1].ports()) == 50


async def test_sync_counts_records_sent_received_and_applied() -> None:
    cluster = SimCluster(2)
    a, b = cluster.addresses
    for i in range(7):
        cluster[0].register(f"c{i}", 1000 + i)
    await cluster.flush()
    queue = cluster[0].distro.engine.queues[b]
    assert (queue.sent_batches, queue.sent_records) == (1, 7)
    got = cluster[1].distro.sync_receiver.received[a]
    assert (got.batches, got.records, got.applied) == (1, 7, 7)
    # the same state sent again (a verify-style re-send) arrives but changes nothing
    cluster[0].distro.engine.enqueue("c0", OP_CHANGE, delay_ms=0)
    await cluster.flush()
    assert (got.batches, got.records, got.applied) == (2, 8, 7)
    assert queue.sent_records == 8


async def test_delete_on_disconnect_and_no_echo_back() -> None:
    cluster = SimCluster(3)
    cluster[0].register("c1", 1)
    await cluster.flush()
    cluster[0].clients.remove("c1", "stream closed by client")
    await cluster.flush()
    assert all(node.ports() == [] for node in (cluster[1], cluster[2]))
    # peers applied the DELETE without syncing anything themselves
    senders = {c[0] for c in cluster.calls("DistroSyncRequest")}
    assert senders == {cluster.addresses[0]}


async def test_a_dead_peer_does_not_delay_the_healthy_ones() -> None:
    cluster = SimCluster(3)
    dead = cluster.addresses[2]
    cluster.network.down.add(dead)
    cluster[0].register("c1", 1)
    await cluster.flush(rounds=1)
    assert cluster[1].ports() == [1]
    queue = cluster[0].distro.engine.queues[dead]
    assert queue.failed_batches == 1 and queue.pending  # re-queued with back-off
    cluster[0].members.report_failed(dead, refused=True)
    assert cluster[0].members.peers[dead].state is MemberState.DOWN
    for i in range(10):  # while DOWN nothing more is queued for it: it needs a full verify instead
        cluster[0].register(f"x{i}", i)
    assert queue.needs_full_verify and len(queue.pending) == 1


async def test_failed_sync_retries_with_backoff_until_it_lands() -> None:
    cluster = SimCluster(2)
    a, b = cluster.addresses
    cluster.network.partition(a, b)
    cluster[0].register("c1", 1)
    await cluster.flush(rounds=1)
    queue = cluster[0].distro.engine.queues[b]
    assert queue.backoff_ms == 100
    cluster.clock.advance(100)
    await cluster[0].distro.engine.flush(b)
    assert queue.backoff_ms == 200  # doubled
    cluster.network.heal()
    cluster.clock.advance(199)
    assert await cluster[0].distro.engine.flush(b) == 0  # not yet
    cluster.clock.advance(1)
    assert await cluster[0].distro.engine.flush(b) == 1
    assert cluster[1].ports() == [1] and queue.backoff_ms == 0


async def test_queue_collapses_to_full_verify_when_it_passes_the_bound() -> None:
    cluster = SimCluster(2, sync_queue_max=20)
    for i in range(25):
        cluster[0].register(f"c{i}", i)
    queue = cluster[0].distro.engine.queues[cluster.addresses[1]]
    assert queue.needs_full_verify and len(queue.pending) < 20
    await cluster.flush()
    for _ in range(2):  # a repair larger than the queue bound takes two rounds
        await cluster[0].distro.verify_round()
        await cluster.flush()
    assert len(cluster[1].ports()) == 25 and not queue.needs_full_verify


async def test_agreeing_verify_round_is_one_small_request_per_peer() -> None:
    cluster = SimCluster(3)
    for i in range(2000):
        cluster[0].register(f"c{i}", i)
    await cluster.flush()
    cluster.network.calls.clear()
    await cluster[0].distro.verify_round()
    digests = cluster.calls("DistroVerifyRequest")
    assert len(digests) == 2 and not cluster.calls("DistroVerifyDetailRequest")
    assert all(size < 2048 for *_, size in digests)


async def test_verify_repairs_a_divergence_by_resending_only_what_differs() -> None:
    cluster = SimCluster(2)
    for i in range(600):
        cluster[0].register(f"c{i}", i)
    await cluster.flush()
    b = cluster[1]
    b.clients.remove("c7", "lost in a test")  # lost on B
    op, cid, _, services = records.client_record(b.clients.get("c8"))  # type: ignore[arg-type]
    b.distro.processor.apply(cluster.addresses[0], [(op, cid, 0, services)])  # stale on B: an old record
    cluster.network.calls.clear()
    await cluster[0].distro.verify_round()
    assert len(cluster.calls("DistroVerifyDetailRequest")) == 1
    await cluster.flush()
    [sync] = cluster.calls("DistroSyncRequest")
    assert sync[3] < 400  # two clients re-sent, not six hundred
    assert len(b.ports()) == 600
    assert b.clients.get("c8").revision == cluster[0].clients.get("c8").revision  # type: ignore[union-attr]


async def test_synced_clients_expire_only_when_no_longer_renewed() -> None:
    cluster = SimCluster(2)
    cluster[0].register("c1", 1)
    await cluster.flush()
    expired_after = cluster.config.client_expired_time_ms
    for _ in range(3):  # renewed by verify every round: survives well past the expiry time
        cluster.clock.advance(expired_after // 2)
        await cluster[0].distro.verify_round()
        assert cluster[1].distro.processor.expire(expired_after) == 0
    cluster.network.down.add(cluster.addresses[0])  # the owner dies: nobody renews
    cluster.clock.advance(expired_after)
    assert cluster[1].distro.processor.expire(expired_after) == 0  # not yet (strictly greater)
    cluster.clock.advance(1)
    assert cluster[1].distro.processor.expire(expired_after) == 1
    assert cluster[1].ports() == []


async def test_starting_node_loads_a_paged_snapshot_with_owners() -> None:
    cluster = SimCluster(2, snapshot_chunk_bytes=20_000)
    for i in range(1500):
        cluster[i % 2].register(f"c{i}", i, service=ServiceKey("public", "G", f"s{i % 7}"))
    await cluster.flush()
    newcomer = "10.9.0.9:8848"
    for node in cluster.nodes.values():
        node.members.set_members([(a.split(":")[0], 8848) for a in [*cluster.addresses, newcomer]])
    node = cluster.add_node(newcomer, [*cluster.addresses, newcomer], loaded=False)
    cluster.network.down.add(cluster.addresses[0])  # the first peer is down: the load moves on
    await node.distro.load_snapshot()
    assert node.distro.loaded
    pages = cluster.calls("DistroSnapshotRequest")
    assert len([p for p in pages if p[1] == cluster.addresses[1]]) > 3  # several pages
    assert len(node.clients) == 1500
    assert node.clients.get("c0").owner == cluster.addresses[0]  # type: ignore[union-attr]
    assert node.clients.get("c1").owner == cluster.addresses[1]  # type: ignore[union-attr]
    assert sum(len(node.storage.view(ServiceKey("public", "G", f"s{k}")).instances) for k in range(7)) == 1500


async def test_malformed_sync_batch_is_refused_without_damage() -> None:
    cluster = SimCluster(2)
    cluster[0].register("c1", 1)
    await cluster.flush()
    with pytest.raises(ValueError):
        await cluster[1].distro.dispatch(cluster.addresses[0], "DistroSyncRequest", b"SHSY\x01\xff\xff")
    assert cluster[1].ports() == [1]


async def test_partitioned_member_converges_after_heal() -> None:
    cluster = SimCluster(3)
    a, b, _ = cluster.addresses
    cluster.network.partition(a, b)
    cluster[0].register("c1", 1)
    await cluster.flush(rounds=1)
    assert cluster[2].ports() == [1] and cluster[1].ports() == []
    cluster.network.heal()
    cluster.clock.advance(cluster.config.sync_retry_delay_ms)
    await cluster.flush()
    assert cluster[1].ports() == [1]


async def test_ownership_move_never_deletes_ip_port_data() -> None:
    cluster = SimCluster(3)
    owners = {}
    for port in range(40):
        tag = f"10.1.0.1:{port}"
        owner = cluster[0].distro.mapper.owner_of(tag)
        node = cluster.nodes[owner]
        client = Client(f"{tag}#true", ClientKind.IP_PORT, native=True, created_ms=0)
        node.clients.add(client)
        node.naming.ephemeral.register_instance(client.client_id, SVC, InstanceInfo("10.1.0.1", port))
        owners[tag] = owner
    await cluster.flush()
    assert all(len(n.storage.view(SVC).instances) == 40 for n in cluster.nodes.values())
    dead = cluster.addresses[2]
    for node in (cluster[0], cluster[1]):
        node.members.report_failed(dead, refused=True)  # a member leaves the healthy list
    await cluster.flush()
    for node in (cluster[0], cluster[1]):
        assert len(node.storage.view(SVC).instances) == 40  # nothing deleted by the move
    moved = [t for t, o in owners.items() if o == dead]
    assert moved
    for tag in moved:  # the survivors now own the dead node's ip:port clients
        new_owner = cluster[0].distro.mapper.owner_of(tag)
        assert new_owner != dead and cluster.nodes[new_owner].clients.get(f"{tag}#true").native  # type: ignore[union-attr]


async def test_members_reports_drive_states() -> None:
    cluster = SimCluster(3, member_fail_access_cnt=2)
    target = cluster.addresses[1]
    cluster.network.partition(cluster.addresses[0], target)
    members = cluster[0].members
    await cluster[0].distro.report_round()
    assert members.peers[target].state is MemberState.SUSPICIOUS  # suspicion before death
    assert target in members.healthy_addresses()
    await cluster[0].distro.report_round()
    await cluster[0].distro.report_round()
    assert members.peers[target].state is MemberState.DOWN
    assert target not in members.healthy_addresses()
    cluster.network.heal()
    await cluster[0].distro.report_round()
    assert members.peers[target].state is MemberState.UP


async def test_non_member_sender_is_refused() -> None:
    cluster = SimCluster(2)
    from shoal.errors import Forbidden
    with pytest.raises(Forbidden):
        await cluster[0].distro.dispatch("10.66.0.1:8848", "DistroSyncRequest", b"")


def test_verify_ops_are_the_kernel_contract() -> None:
    assert OP_CHANGE == 0


async def test_peer_back_up_is_verified_at_once() -> None:
    cluster = SimCluster(2)
    peer = cluster.addresses[1]
    cluster.network.down.add(peer)
    cluster[0].members.report_failed(peer, refused=True)
    cluster[0].register("c1", 1)  # missed while DOWN: nothing queued, a full verify needed
    assert cluster[0].distro.engine.queues[peer].needs_full_verify
    cluster.network.down.discard(peer)
    cluster[0].members.report_succeeded(peer)  # back UP: a verify round starts by itself
    task = cluster[0].distro._verify_task
    assert task is not None
    await task
    await cluster.flush()
    assert cluster[1].ports() == [1]


async def test_verify_renewal_reaches_the_renew_hook() -> None:
    """Nacos resets a verified ip:port copy's beat time; the node wires this hook to its beat table."""
    from shoal.distro.verify import VerifyReceiver

    cluster = SimCluster(2)
    cluster[0].register("c1", 1)
    await cluster.flush()
    renewed: list[tuple[str, int]] = []
    b = cluster[1]
    b.distro.receiver = VerifyReceiver(cluster.clock, b.clients, lambda c, now: renewed.append((c.client_id, now)))
    cluster.clock.advance(1234)
    await cluster[0].distro.verify_round()
    assert renewed == [("c1", cluster.clock.monotonic_ms())]


async def test_a_late_load_never_deletes_this_nodes_live_clients() -> None:
    """A node served before its load finished (its peers were down); when a peer that holds
    copies of its live clients comes back, loading that peer's snapshot must keep them."""
    cluster = SimCluster(2)
    a, b = cluster[0], cluster[1]
    a.register("live", 1)
    await cluster.flush()
    assert b.clients.get("live") is not None
    a.distro.loaded = False
    await a.distro.load_snapshot()
    await cluster.flush()
    assert a.clients.get("live").native and a.ports() == [1]  # type: ignore[union-attr]
    assert b.ports() == [1]  # no DELETE went out for it


async def test_loader_prefers_a_peer_that_finished_loading() -> None:
    cluster = SimCluster(3)
    cluster[1].register("c1", 1)
    await cluster.flush()
    loading, loaded = cluster.addresses[1], cluster.addresses[2]
    cluster.nodes[loading].distro.loaded = False
    newcomer = cluster.add_node("10.9.0.9:8848", [*cluster.addresses, "10.9.0.9:8848"], loaded=False)
    for node in cluster.nodes.values():
        node.members.set_members([(a.split(":")[0], 8848) for a in [*cluster.addresses, "10.9.0.9:8848"]])
    cluster.network.down.add(cluster.addresses[0])
    await newcomer.distro.load_snapshot()
    pages = [c for c in cluster.calls("DistroSnapshotRequest") if c[0] == "10.9.0.9:8848"]
    assert pages[-1][1] == loaded and newcomer.ports() == [1]


async def test_a_cold_cluster_loads_from_loading_peers() -> None:
    cluster = SimCluster(2)
    for node in cluster.nodes.values():
        node.distro.loaded = False
    await cluster[0].distro.load_snapshot()  # every peer is loading: take one anyway
    assert cluster[0].distro.loaded


async def test_verify_skips_a_peer_that_is_still_loading() -> None:
    cluster = SimCluster(2)
    cluster[0].register("c1", 1)  # not synced yet: B lacks it
    cluster[1].distro.loaded = False
    before = dict(cluster[0].distro.engine.queues[cluster.addresses[1]].pending)
    cluster.network.calls.clear()
    await cluster[0].distro.verify_round()
    assert not cluster.calls("DistroVerifyDetailRequest")
    assert cluster[0].distro.engine.queues[cluster.addresses[1]].pending == before  # no re-send queued


async def test_sync_batches_are_bounded_in_bytes() -> None:
    cluster = SimCluster(2, snapshot_chunk_bytes=20_000)
    for i in range(6):  # six clients of 100 instances: about 8 KB each
        cluster[0].connect(f"big{i}")
        cluster[0].naming.ephemeral.batch_register_instances(
            f"big{i}", ServiceKey("public", "G", f"s{i}"), [InstanceInfo("10.2.0.1", p) for p in range(100)])
    await cluster.flush()
    syncs = cluster.calls("DistroSyncRequest")
    assert len(syncs) >= 2 and all(size <= 20_000 for *_, size in syncs)
    assert sum(len(cluster[1].storage.view(ServiceKey("public", "G", f"s{i}")).instances) for i in range(6)) == 600


def test_digest_requests_stay_small_at_any_client_count() -> None:
    from shoal.distro.verify import MAX_BUCKETS, digest_request, parse_digest_request

    body = digest_request([f"c{i}" for i in range(1000)], list(range(1000)))
    n, digests = parse_digest_request(body)
    assert n == 4 and len(digests) == 4
    assert len(body) < 100 + 8 * 4 and 8 * MAX_BUCKETS + 100 < 64 * 1024


async def test_a_replaced_client_is_not_deleted_on_peers() -> None:
    cluster = SimCluster(2)
    cluster[0].register("c1", 1)
    await cluster.flush()
    cluster[0].connect("c1")  # same id again (e.g. a re-created client): the old one is replaced
    cluster[0].register("c1", 2)
    cluster.network.calls.clear()
    await cluster.flush()
    assert cluster[1].ports() == [2] and cluster[1].clients.get("c1") is not None
    assert len(cluster.calls("DistroSyncRequest")) == 1  # one CHANGE, no DELETE before it


# --- timings come from the config ------------------------------------------------------------
class _RecordingTransport:
    """Forwards to the node's in-memory transport and records each request's timeout."""

    def __init__(self, inner: object) -> None:
        self.inner = inner
        self.timeouts: dict[str, int] = {}

    async def call(self, target: str, type_name: str, body: bytes, timeout_ms: int) -> tuple[str, bytes]:
        self.timeouts[type_name] = timeout_ms
        return await self.inner.call(target, type_name, body, timeout_ms)  # type: ignore[attr-defined,no-any-return]

    async def close(self) -> None:
        return None


async def test_member_report_timeout_and_periodic_intervals_come_from_the_config(tmp_path: Path) -> None:
    from shoal.distro.members import REPORT_REQUEST

    conf = str(tmp_path / "cluster.conf")
    cluster = SimCluster(2, member_report_timeout_ms=1234, client_expire_check_interval_ms=777,
                         cluster_conf_reload_interval_ms=888, cluster_conf=conf, **OPEN_SETTINGS)
    distro = cluster[0].distro
    recording = _RecordingTransport(distro.transport)
    distro.reporter.transport = recording
    await distro.report_round()
    assert recording.timeouts == {REPORT_REQUEST: 1234}
    assert cluster[0].members.peers[cluster.addresses[1]].state is MemberState.UP
    intervals = {p.name: p.interval_ms for p in distro.periodics}
    assert (intervals["distro-expiry"], intervals["cluster-conf-reload"]) == (777, 888)


async def test_first_sync_backoff_comes_from_the_config() -> None:
    cluster = SimCluster(2, sync_initial_backoff_ms=250)
    a, b = cluster.addresses
    cluster.network.partition(a, b)
    cluster[0].register("c1", 1)
    cluster.clock.advance(cluster.config.sync_delay_ms)
    assert await cluster[0].distro.engine.flush(b) == 0
    queue = cluster[0].distro.engine.queues[b]
    assert (queue.failed_batches, queue.backoff_ms) == (1, 250)
    assert await cluster[0].distro.engine.flush(b) == 0  # not due yet: nothing was sent
    cluster.clock.advance(250)
    assert await cluster[0].distro.engine.flush(b) == 0
    assert (queue.failed_batches, queue.backoff_ms) == (2, 500)


async def test_snapshot_sessions_expire_after_the_configured_ttl() -> None:
    import json

    cluster = SimCluster(2, snapshot_chunk_bytes=1, snapshot_session_ttl_ms=500)
    for i in range(3):
        cluster[0].register(f"c{i}", i + 1)
    server = cluster[0].distro.snapshots

    async def page(session: str, offset: int) -> dict[str, object]:
        body = await server.page(json.dumps({"session": session, "offset": offset}).encode())
        header: dict[str, object] = json.loads(body.partition(b"\n")[0])
        return header

    first = await page("", 0)
    assert (first["next"], first["done"]) == (1, False)
    cluster.clock.advance(499)
    second = await page(str(first["session"]), 1)
    assert second["session"] == first["session"]  # still alive: each request renews it
    cluster.clock.advance(500)
    third = await page(str(second["session"]), 2)
    assert third["session"] != second["session"]  # expired: a new session was opened


async def test_unknown_cluster_request_types_have_no_handler() -> None:
    from shoal.errors import NoHandler

    cluster = SimCluster(2)
    with pytest.raises(NoHandler):
        await cluster[0].distro.dispatch(cluster.addresses[1], "NoSuchRequest", b"")


async def test_the_loader_bounds_each_page_request_and_skips_down_peers() -> None:
    """A hung peer costs one ``snapshot.request-timeout-ms`` (not the whole load timeout), and a
    peer known DOWN is not asked at all."""
    from shoal.distro.snapshot import SNAPSHOT_REQUEST

    cluster = SimCluster(3, snapshot_request_timeout_ms=432)
    cluster[2].register("c1", 1)
    await cluster.flush()
    a, down, healthy = cluster[0], cluster.addresses[1], cluster.addresses[2]
    a.distro.loaded = False
    a.members.report_failed(down, refused=True)
    recording = _RecordingTransport(a.distro.loader.transport)
    a.distro.loader.transport = recording
    await a.distro.load_snapshot()
    assert recording.timeouts == {SNAPSHOT_REQUEST: 432}
    asked = {c[1] for c in cluster.calls("DistroSnapshotRequest") if c[0] == a.address}
    assert asked == {healthy} and a.ports() == [1]


async def test_a_snapshot_peer_that_does_not_answer_counts_against_it() -> None:
    cluster = SimCluster(3)
    a, hung = cluster[0], cluster.addresses[1]
    cluster[2].register("c1", 1)
    await cluster.flush()
    a.distro.loaded = False
    cluster.network.partition(a.address, hung)  # its page request times out: the next peer is asked
    await a.distro.load_snapshot()
    assert a.members.peers[hung].state is MemberState.SUSPICIOUS and a.ports() == [1]


# --- verify at scale: kept digests, hashed detail phase ---------------------------------------
def _digests_from_scratch(node: object, group: str, n: int) -> list[int]:
    from shoal.distro.verify import SELF
    from shoal.kernels import verify as kernel

    distro = node.distro  # type: ignore[attr-defined]
    members = [c for c in node.clients  # type: ignore[attr-defined]
               if distro.index.group_of(c) == group]
    assert group != SELF or all(c.native for c in members)
    return kernel.bucket_digests([c.client_id for c in members], [c.revision for c in members], n)


async def test_kept_digests_follow_changes_and_releases() -> None:
    from shoal.distro.verify import SELF

    cluster = SimCluster(2)
    a, b = cluster[0], cluster[1]
    for i in range(300):
        a.register(f"c{i}", i)
    await cluster.flush()
    owner = cluster.addresses[0]
    bucket = __import__("shoal.kernels.verify", fromlist=["bucket_of"]).bucket_of(["c5"], 4)[0]
    before_a, before_b = a.distro.index.digests(SELF, 4), b.distro.index.digests(owner, 4)
    assert before_a == before_b == _digests_from_scratch(a, SELF, 4)
    a.register("c5", 9999)  # a change: only c5's bucket moves, on the owner and, once synced, on the peer
    changed = a.distro.index.digests(SELF, 4)
    assert [i for i in range(4) if changed[i] != before_a[i]] == [bucket]
    assert changed == _digests_from_scratch(a, SELF, 4)
    await cluster.flush()
    assert b.distro.index.digests(owner, 4) == changed == _digests_from_scratch(b, owner, 4)
    a.clients.remove("c5", "stream closed by client")  # a release: its term leaves the bucket
    await cluster.flush()
    released = a.distro.index.digests(SELF, 4)
    assert released[bucket] != changed[bucket] and released == _digests_from_scratch(a, SELF, 4)
    assert b.distro.index.digests(owner, 4) == released
    assert a.distro.index.count(SELF) == b.distro.index.count(owner) == 299


async def test_kept_digests_equal_recomputed_ones_after_mixed_operations() -> None:
    import random

    from shoal.distro.verify import SELF

    rng = random.Random(7)
    cluster = SimCluster(3)
    for step in range(1500):
        node = cluster[rng.randrange(3)]
        cid = f"c{rng.randrange(400)}"
        roll = rng.random()
        existing = node.clients.get(cid)
        if roll < 0.6 and (existing is None or existing.native):
            node.register(cid, rng.randrange(1, 100))
        elif roll < 0.8 and existing is not None and existing.native:
            node.clients.remove(cid, "stream closed by client")
        elif roll < 0.9 and existing is not None and existing.native:
            node.register(cid, rng.randrange(1, 100), service=ServiceKey("public", "G", "other"))
        if step % 100 == 0:
            await cluster.flush()
    await cluster.flush()
    for node in cluster.nodes.values():
        for group in [SELF, *cluster.addresses]:
            for n in (1, 2, 64, 4096):
                assert node.distro.index.digests(group, n) == _digests_from_scratch(node, group, n)


async def test_one_percent_divergence_at_scale_is_repaired_with_hashed_detail() -> None:
    import random

    from shoal.distro import verify

    cluster = SimCluster(2)
    a, b = cluster[0], cluster[1]
    total = 30_000
    for i in range(total):
        a.register(f"client-{i}", 1 + i % 60000)
    await cluster.flush()
    victims = random.Random(3).sample(range(total), total // 100)
    for i in victims[:150]:
        b.clients.remove(f"client-{i}", "lost in a test")
    for i in victims[150:]:
        op, cid, revision, services = records.client_record(b.clients.get(f"client-{i}"))  # type: ignore[arg-type]
        b.distro.processor.apply(cluster.addresses[0], [(op, cid, revision - 1, services)])
    cluster.network.calls.clear()
    await a.distro.verify_round()
    stats = a.distro.verify_stats.last_round[cluster.addresses[1]]
    assert stats["sub_buckets"] > 1 and len(cluster.calls(verify.SUB_REQUEST)) == 1
    assert stats["resynced"] == 300  # exactly the diverged clients, nothing else
    verify_bytes = sum(size for *_, size in cluster.network.calls) + stats["answer_bytes"]
    assert verify_bytes < 4 * total  # under 4 bytes per client; ids and revisions alone are ~20
    await cluster.flush()
    assert all(b.clients.get(f"client-{i}").revision == a.clients.get(f"client-{i}").revision  # type: ignore[union-attr]
               for i in victims)
    cluster.network.calls.clear()
    await a.distro.verify_round()
    assert [c[2] for c in cluster.network.calls] == [verify.DIGEST_REQUEST]  # in sync again: one request


@pytest.mark.parametrize("version", [None, 2])
async def test_verify_requests_of_another_wire_version_are_refused(version: int | None) -> None:
    import json

    from shoal.distro.verify import DIGEST_REQUEST
    from shoal.errors import BadVerifyMessage

    cluster = SimCluster(2)
    header = {"buckets": 1, "count": 0} if version is None else {"v": version, "buckets": 1, "count": 0}
    body = json.dumps(header).encode() + b"\n" + b"\0" * 8  # version 1 had no "v"
    with pytest.raises(BadVerifyMessage):  # one error code for every verify message out of shape
        await cluster[1].distro.dispatch(cluster.addresses[0], DIGEST_REQUEST, body)


async def test_copies_of_agreeing_buckets_are_renewed_without_touching_each_copy() -> None:
    cluster = SimCluster(2)
    for i in range(50):
        cluster[0].register(f"c{i}", i)
    await cluster.flush()
    b = cluster[1]
    loaded_at = b.clients.get("c1").last_renew_ms  # type: ignore[union-attr]
    expired_after = cluster.config.client_expired_time_ms
    for _ in range(3):
        cluster.clock.advance(expired_after // 2)
        await cluster[0].distro.verify_round()
    assert b.clients.get("c1").last_renew_ms == loaded_at  # type: ignore[union-attr]  # lazily renewed
    assert b.distro.index.renewed_at(b.clients.get("c1")) == cluster.clock.monotonic_ms()  # type: ignore[arg-type]
    assert b.distro.processor.expire(expired_after) == 0


# --- body shapes: a body without its type's shape is a 502 before any handler ---
DEEP = b'{"a":' * 50_000 + b"1" + b"}" * 50_000
BAD_BODIES = [
    ("DistroSnapshotRequest", b"[1, 2, 3]"),
    ("DistroSnapshotRequest", DEEP),
    ("DistroSnapshotRequest", b"\xff\xfe"),
    ("DistroSnapshotRequest", b'{"session": {"x": 1}}'),
    ("DistroSnapshotRequest", b'{"offset": "10"}'),
    ("DistroSnapshotRequest", b'{"offset": -1}'),
    ("DistroVerifyRequest", b"no header line"),
    ("DistroVerifyRequest", b"[1]\n"),
    ("DistroVerifyRequest", b'{"buckets": 0}\n'),
    ("DistroVerifyRequest", b'{"buckets": 2}\n' + b"\x00" * 15),
    ("DistroVerifySubDigestRequest", b'{"v": 2, "buckets": 1, "k": 2, "salt": 1}\n'),
    ("DistroVerifySubDigestRequest", b'{"v": 2, "buckets": 1, "k": 2, "salt": 1, "list": [[0]]}\n'),
    ("DistroVerifySubDigestRequest", b'{"v": 2, "buckets": 1, "k": 2, "salt": {"a": 1}, "list": [0]}\n'),
    ("DistroVerifySubDigestRequest", DEEP + b"\n"),
    ("DistroVerifyDetailRequest", b'{"v": 2, "buckets": 1, "k": 1, "salt": 1, "subs": 1}\n'),
    ("DistroVerifyDetailRequest", b'{"v": 2, "buckets": 1, "k": 1, "salt": 1, "subs": [1], "counts": "H"}\n'),
    ("DistroVerifyDetailRequest", b'{"v": 2, "buckets": "1", "k": 1, "salt": 1, "subs": 1, "counts": "H"}\n'),
    ("DistroVerifyDetailRequest", b"[]\n"),
    ("DistroVerifyDetailRequest", DEEP),
    ("DistroVerifyDetailRequest", b'{"v": 3, "buckets": 4, "k": 1, "salt": 1, "subs": 2, "counts": "H"}\n'
                                  + b"\x02\0\0\0\x01\0\0\0" + b"\0" * 4),  # sub-buckets not increasing
    ("DistroVerifyDetailRequest", b'{"v": 3, "buckets": 4, "k": 1, "salt": 1, "subs": 1, "counts": "H"}\n'
                                  + b"\x01\0\0\0\x02\0" + b"\x02\0\0\0\x01\0\0\0"),  # values unsorted
    ("DistroVerifyRemoveRequest", b'{"v": 3, "copies": [["c1"]]}\n'),
    ("DistroVerifyRemoveRequest", b'{"v": 3, "copies": [["c1", -1]]}\n'),
    ("DistroVerifyRemoveRequest", b'{"v": 3, "copies": {}}\n'),
    ("DistroVerifyRemoveRequest", b'{"v": 3, "copies": []}\ntrailing'),
    ("DistroVerifyRemoveRequest", b'{"v": 2, "copies": []}\n'),
]


@pytest.mark.parametrize(("type_name", "body"), BAD_BODIES, ids=[f"{t}-{i}" for i, (t, _) in enumerate(BAD_BODIES)])
async def test_cluster_bodies_without_their_shape_are_bad_request_bodies(type_name: str, body: bytes) -> None:
    from shoal.errors import BadRequestBody

    cluster = SimCluster(2)
    cluster[0].register("c1", 1)
    await cluster.flush()
    with pytest.raises(BadRequestBody):
        await cluster[1].distro.dispatch(cluster.addresses[0], type_name, body)
    assert cluster[1].ports() == [1]


async def test_well_formed_bodies_pass_their_shape_checks() -> None:
    # every body a node sends goes through the checks in the other cluster tests too (the in-memory
    # network calls dispatch): these are the ones a test builds by hand
    from shoal.distro.protocol import BODY_CHECKS
    from shoal.distro.verify import wire

    BODY_CHECKS["DistroSnapshotRequest"](b"")
    BODY_CHECKS["DistroSnapshotRequest"](b'{"session": "3", "offset": 10}')
    # the verify messages are parsed once, by their handler's parser: it is their check
    assert wire.parse_digest_request(wire.digest_request(["a", "b"], [1, 2]))[0] == 1
    sub = wire.parse_sub_request(b'{"v":3,"buckets":4,"k":2,"salt":7,"list":[1,3]}\n' + b"\0" * 16)
    assert (sub.buckets, sub.sums) == ([1, 3], (0, 0, 0, 0))
    detail = wire.parse_detail_request(wire.DetailRequest(4, 2, 7, (1, 5), (0, 2), (9, 11)).encode())
    assert detail.keys() == [5 << 32 | 9, 5 << 32 | 11]
    assert wire.parse_remove_request(wire.remove_request([("c1", 3)])) == [("c1", 3)]


def test_every_cluster_route_has_a_body_check() -> None:
    from shoal.distro.protocol import BODY_CHECKS

    cluster = SimCluster(2)
    assert set(cluster[0].distro._routes) == set(BODY_CHECKS)


async def test_member_figures_show_queues_verify_outcomes_and_last_failures() -> None:
    cluster = SimCluster(3)
    a, b, c = cluster.addresses
    cluster[0].register("c1", 1)
    cluster[1].register("c2", 2)
    await cluster.flush()
    await cluster[0].distro.verify_round()
    rows = {f.address: f for f in cluster[0].distro.member_figures()}
    assert [f.address for f in cluster[0].distro.member_figures()] == sorted([a, b, c])
    assert rows[a].is_self and rows[a].clients_owned == 1 and rows[a].sync_queue is None
    assert rows[b].clients_owned == 1 and rows[c].clients_owned == 0  # c2 is b's, replicated here
    for peer in (b, c):
        row = rows[peer]
        assert (row.sync_queue, row.last_sync_failure, row.last_failure) == (0, None, None)
        assert row.sent_batches == 1 and row.last_sync_ms is not None and row.last_sync_ms <= cluster.clock.now_ms()
        assert row.last_verify is not None and row.last_verify.result == "ok"

    # c stops answering: the queue towards it fills, and the failed batch says when and why
    cluster.network.cut.add((a, c))
    cluster[0].register("c3", 3)
    await cluster.flush(rounds=1)
    row = {f.address: f for f in cluster[0].distro.member_figures()}[c]
    assert row.sync_queue == 1 and row.failed_batches == 1
    assert row.last_sync_failure is not None and "unreachable" in row.last_sync_failure[1]
    assert row.last_failure is not None and row.last_failure[0] == cluster.clock.now_ms()
    await cluster[0].distro.verify_round()
    row = {f.address: f for f in cluster[0].distro.member_figures()}[c]
    assert row.last_verify is not None and row.last_verify.result == "failed" and row.last_verify.detail

    # b lost a sync batch: the next verify finds the difference and repairs it
    cluster[1].distro.sync_receiver.drop_count = 1
    cluster[0].register("c4", 4)
    await cluster.flush()
    await cluster[0].distro.verify_round()
    row = {f.address: f for f in cluster[0].distro.member_figures()}[b]
    assert row.last_verify is not None and (row.last_verify.result, row.last_verify.resynced) == ("repaired", 1)


async def test_a_delete_that_overtakes_a_snapshot_page_is_not_undone_by_it() -> None:
    # Two nodes restart together: the first one's DELETEs of its previous run's clients reach the
    # second before the snapshot page (from a node that has not had them yet) that still holds them.
    cluster = SimCluster(2)
    a, b = cluster.addresses
    cluster[1].register("previous-run", 7008)
    await cluster.flush()
    newcomer = "10.9.0.9:8848"
    for node in cluster.nodes.values():
        node.members.set_members([(x.split(":")[0], 8848) for x in [a, b, newcomer]])
    loading = cluster.add_node(newcomer, [a, b, newcomer], loaded=False)
    cluster.network.partition(a, b)  # a keeps its copy a while longer
    cluster[1].clients.remove("previous-run", "connection of a previous run")
    await cluster.flush()
    assert loading.clients.get("previous-run") is None
    cluster.network.down.add(b)  # the page comes from a, which still holds the copy
    await loading.distro.load_snapshot()
    assert loading.distro.loaded
    assert loading.clients.get("previous-run") is None and loading.ports() == []
