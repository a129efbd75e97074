"""A worker's CP write waits, bounded, until its sibling workers' views reached its revision
(distro/barrier.py: SiblingCatchUp, CpCatchUpRequest), on the in-memory network with the workers'
embedded stores sharing one file, as a node's workers do: the sibling polls the file at once when
asked, not on its next poll."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator
from typing import Any

import pytest

from shoal.cp.store import CpView, Keyspace, json_view
from shoal.distro.barrier import ACKED, CP_CATCH_UP_REQUEST, FAILED, SiblingCatchUp
from shoal.errors import BadRequestBody
from shoal.testing import SimCluster
from shoal.testing.cluster import SimNode

#: Far longer than any test: only the catch-up request makes a sibling look at the file.
NEVER_POLL_S = 3600.0


def _catch_up(node: SimNode) -> SiblingCatchUp:
    siblings = node.distro.cp_siblings
    assert siblings is not None
    return siblings


@pytest.fixture
async def workers() -> AsyncIterator[tuple[SimCluster, list[CpView[Any]]]]:
    """Two workers of one node, their CP stores started on the shared file, each with a view of
    the namespaces."""
    cluster = SimCluster.of_workers([2])
    views: list[CpView[Any]] = []
    for node in (cluster[0], cluster[1]):
        node.cp_store.poll_interval_s = NEVER_POLL_S
        await node.cp_store.start()
        view = json_view(node.cp_store, Keyspace.NAMESPACES)
        view.start()
        await view.wait_ready(5)
        views.append(view)
    try:
        yield cluster, views
    finally:
        for view in views:
            await view.stop()
        for node in (cluster[0], cluster[1]):
            await node.cp_store.close()
        shutil.rmtree(cluster[0].cp_store.path.parent, ignore_errors=True)


async def test_a_cp_write_is_answered_once_the_sibling_view_holds_it(
        workers: tuple[SimCluster, list[CpView[Any]]]) -> None:
    cluster, (mine, sibling) = workers
    await mine.put("dev", {"name": "dev"})
    assert sibling.get("dev") == {"name": "dev"}  # the sibling polled the file when asked
    assert sibling.revision == mine.revision
    assert _catch_up(cluster[0]).outcomes == {ACKED: 1}
    assert await mine.delete("dev")
    assert sibling.get("dev") is None
    asked = [c for c in cluster.network.calls if c[2] == CP_CATCH_UP_REQUEST]
    assert [(source, target) for source, target, _, _ in asked] == [(cluster[0].address, cluster[1].address)] * 2


async def test_an_unreachable_sibling_does_not_fail_the_write(
        workers: tuple[SimCluster, list[CpView[Any]]]) -> None:
    cluster, (mine, sibling) = workers
    cluster.network.down.add(cluster[1].address)
    await asyncio.wait_for(mine.put("dev", {"name": "dev"}), 5)  # answered, as a success: it is stored
    assert mine.get("dev") == {"name": "dev"} and sibling.get("dev") is None
    assert _catch_up(cluster[0]).outcomes == {FAILED: 1}
    await cluster[1].cp_store.refresh()  # what the sibling's next poll does
    await sibling.wait_revision(mine.revision, 5)
    assert sibling.get("dev") == {"name": "dev"}


async def test_the_request_is_checked_and_answers_at_once_when_nothing_is_behind(
        workers: tuple[SimCluster, list[CpView[Any]]]) -> None:
    cluster, (mine, _sibling) = workers
    dispatch = cluster[1].distro.dispatch
    with pytest.raises(BadRequestBody, match="keyspace"):
        await dispatch(cluster[0].address, CP_CATCH_UP_REQUEST, b'{"keyspace": "nope", "revision": 1}')
    with pytest.raises(BadRequestBody, match="revision"):
        await dispatch(cluster[0].address, CP_CATCH_UP_REQUEST, b'{"keyspace": "namespaces"}')
    body = json.dumps({"keyspace": Keyspace.NAMESPACES.value, "revision": mine.revision}).encode()
    assert await dispatch(cluster[0].address, CP_CATCH_UP_REQUEST, body) == ("CpCatchUpResponse",
                                                                              b'{"caughtUp":true}')


def test_a_single_process_node_asks_no_sibling() -> None:
    cluster = SimCluster(2)  # single-process nodes: other nodes' views are never waited for
    assert cluster[0].distro.cp_siblings is None and cluster[0].cp_store.siblings is None
    workers = SimCluster.of_workers([2], workers_write_wait_ms=0)  # the wait turned off
    assert workers[0].distro.cp_siblings is None and workers[0].cp_store.siblings is None
    assert SimCluster.of_workers([2])[0].cp_store.siblings is not None
