"""The cluster port's service in front of a real DistroProtocol (SimCluster): what a transport
gets back from ``ClusterServer.unary``, and what happens when it stops waiting for it."""

from __future__ import annotations

import asyncio
import gc
import warnings
from collections.abc import Awaitable

import pytest

from shoal.distro.transport import MEMBER_HEADER
from shoal.kernels.payload import PayloadDecodeError, decode, encode
from shoal.metrics import Metrics
from shoal.testing import SimCluster
from shoal.transport.grpc.cluster_server import ClusterServer


def _server(cluster: SimCluster) -> ClusterServer:
    return ClusterServer(cluster.config, cluster[1].distro.dispatch, Metrics())


def _report(cluster: SimCluster) -> bytes:
    return encode("MemberReportRequest", b"{}", {MEMBER_HEADER: cluster.addresses[0]})


async def test_an_answer_the_transport_stops_waiting_for_leaves_no_coroutine_unawaited() -> None:
    # What the native transport does when a call's stream is reset (or its deadline passes) in the
    # same batch of events that opened it, as a paused node reads after SIGCONT: it wraps the
    # answer in a task and cancels that task before it ever ran.
    cluster = SimCluster(2)
    server = _server(cluster)

    async def answer_later(reply: Awaitable[bytes]) -> bytes:
        return await reply

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        task = asyncio.get_running_loop().create_task(answer_later(server.unary(_report(cluster), "peer")))
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.gather(*server._tasks, return_exceptions=True)  # the request itself still completes
        del task
        gc.collect()
    assert [str(w.message) for w in caught if "never awaited" in str(w.message)] == []
    assert not server._tasks


async def test_a_request_is_answered_and_bytes_that_are_no_payload_are_refused_at_once() -> None:
    cluster = SimCluster(2)
    server = _server(cluster)
    reply_type, _, _, body = decode(await server.unary(_report(cluster), "peer"))
    assert reply_type == "MemberReportResponse" and body
    with pytest.raises(PayloadDecodeError):
        server.unary(b"\x0a\xff\xff\xff\xff\xff\x0fnot a payload", "peer")
