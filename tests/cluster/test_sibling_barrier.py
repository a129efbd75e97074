"""A worker's ephemeral write waits, bounded, until its sibling workers applied it (distro/barrier.py,
SyncEngine.delivery), on the in-memory network: siblings synced at once, other nodes neither waited
for nor hurried, and a failing or silent sibling never holding a write past the bound."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

from shoal.distro.barrier import ACKED, FAILED, TIMEOUT, SiblingBarrier
from shoal.distro.sync import SYNC_REQUEST
from shoal.model.instance import InstanceInfo
from shoal.testing import SimCluster
from shoal.testing.cluster import SVC, SimNode


def _register(node: SimNode, client_id: str, port: int) -> Awaitable[None] | None:
    """A write of ``client_id`` applied here, then what its answer waits for (the façade awaits the
    barrier so after an ip:port write; None: nothing to wait for)."""
    if node.clients.get(client_id) is None:
        node.connect(client_id)
    node.naming.ephemeral.register_instance(client_id, SVC, InstanceInfo("10.0.0.1", port))
    barrier = node.distro.barrier
    return barrier(client_id) if barrier is not None else None


def _barrier(node: SimNode) -> SiblingBarrier:
    barrier = node.distro.barrier
    assert barrier is not None
    return barrier


async def _flush(node: SimNode, target: str) -> int:
    return await node.distro.engine.flush(target)


async def test_a_write_waits_until_its_sibling_applied_it_and_siblings_need_no_delay() -> None:
    cluster = SimCluster.of_workers([2, 0])  # node 1: two workers; node 2: one process
    await cluster.report_rounds()  # the nodes learn each other's layout
    w0, w1, other = cluster[0], cluster[1], cluster[2]
    wait = _register(w0, "c1", 80)
    assert wait is not None
    answered = asyncio.ensure_future(wait)
    await asyncio.sleep(0)
    assert not answered.done()  # not before the sibling holds it
    assert await _flush(w0, other.address) == 0  # another node: the usual sync delay, unchanged
    assert await _flush(w0, w1.address) == 1  # the sibling: at once, the clock never moved
    await asyncio.wait_for(answered, 1)
    assert w1.ports() == [80] and other.ports() == []
    assert _barrier(w0).outcomes == {ACKED: 1}
    await cluster.flush()
    assert other.ports() == [80]  # the other node is synced after the delay, never waited for


async def test_a_repeated_write_waits_for_the_batch_in_flight() -> None:
    cluster = SimCluster.of_workers([2])
    w0, w1 = cluster[0], cluster[1]
    release = asyncio.Event()
    dispatch = cluster.network.handlers[w1.address]

    async def slow(source: str, type_name: str, body: bytes) -> tuple[str, bytes]:
        if type_name == SYNC_REQUEST:
            await release.wait()
        return await dispatch(source, type_name, body)

    cluster.network.attach(w1.address, slow)
    first = _register(w0, "c1", 80)
    assert first is not None
    sending = asyncio.ensure_future(_flush(w0, w1.address))
    await asyncio.sleep(0)
    again = _register(w0, "c1", 80)  # identical: nothing new queued, but the batch carrying it is still out
    assert again is not None
    waits = asyncio.gather(first, again)
    await asyncio.sleep(0)
    assert not waits.done()
    release.set()
    assert await sending == 1
    await asyncio.wait_for(waits, 1)
    assert w1.ports() == [80]
    assert _register(w0, "c1", 80) is None  # delivered: nothing to wait for


async def test_a_failed_batch_ends_the_wait_and_a_backing_off_sibling_is_not_waited_for() -> None:
    cluster = SimCluster.of_workers([2])
    w0, w1 = cluster[0], cluster[1]
    cluster.network.partition(w0.address, w1.address)  # its calls time out
    wait = _register(w0, "c1", 80)
    assert wait is not None
    answered = asyncio.ensure_future(wait)
    assert await _flush(w0, w1.address) == 0
    await asyncio.wait_for(answered, 1)  # ended by the failure, as a success: the write stands here
    assert w0.ports() == [80] and w1.ports() == []
    assert _barrier(w0).outcomes == {FAILED: 1}
    assert _register(w0, "c2", 81) is None  # the sibling backs off: no wait at all
    cluster.network.heal()
    cluster.clock.advance(cluster.config.sync_retry_delay_ms)
    await cluster.flush()
    assert w1.ports() == [80, 81]  # sync's retry repairs it


async def test_a_back_off_left_from_an_old_failure_does_not_skip_the_wait() -> None:
    # a worker that started before its sibling listened: its first batch failed and nothing
    # succeeded since, so the queue still carries that back-off; a later write must still wait
    cluster = SimCluster.of_workers([2])
    w0, w1 = cluster[0], cluster[1]
    cluster.network.partition(w0.address, w1.address)
    early = _register(w0, "c0", 79)
    assert early is not None
    assert await _flush(w0, w1.address) == 0  # fails: the queue backs off
    await asyncio.wait_for(early, 1)
    cluster.network.heal()
    cluster.clock.advance(cluster.config.sync_retry_delay_ms)
    queue = w0.distro.engine.queues[w1.address]
    queue.pending.clear()  # (the retry was superseded: only the back-off is left)
    assert queue.backoff_ms
    wait = _register(w0, "c1", 80)
    assert wait is not None  # the back-off's window passed: the write waits again
    answered = asyncio.ensure_future(wait)
    assert await _flush(w0, w1.address) == 1
    await asyncio.wait_for(answered, 1)
    assert w1.ports() == [80]
    assert queue.backoff_ms == 0


async def test_a_silent_sibling_holds_a_write_no_longer_than_the_bound() -> None:
    cluster = SimCluster.of_workers([2], workers_write_wait_ms=50)
    w0, w1 = cluster[0], cluster[1]
    never = asyncio.Event()

    async def stopped(source: str, type_name: str, body: bytes) -> tuple[str, bytes]:
        await never.wait()  # a SIGSTOPped worker: the connection is open, nothing answers
        raise AssertionError("unreachable")

    cluster.network.attach(w1.address, stopped)
    wait = _register(w0, "c1", 80)
    assert wait is not None
    sending = asyncio.ensure_future(_flush(w0, w1.address))
    try:
        await asyncio.wait_for(wait, 5)  # ends after the 50 ms bound, long before any sync timeout
        assert _barrier(w0).outcomes == {TIMEOUT: 1}
        cluster.clock.advance(51)  # the batch has been out longer than the bound: later writes do not wait
        assert _register(w0, "c2", 81) is None
    finally:
        sending.cancel()


def test_a_single_process_node_has_no_barrier() -> None:
    cluster = SimCluster(2)  # single-process nodes of a cluster: other nodes are never waited for
    assert cluster[0].distro.barrier is None
    assert _register(cluster[0], "c1", 80) is None
    workers = SimCluster.of_workers([2], workers_write_wait_ms=0)  # the wait turned off
    assert workers[0].distro.barrier is None and _register(workers[0], "c1", 80) is None
