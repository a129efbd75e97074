"""The lock module (Nacos 3.x ``LockOperationRequest``; docs/protocol.md §9) over raw gRPC against
real nodes: a standalone node (embedded CP store) and a 3-node cluster (managed etcd)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from shoal.testing import OPEN, ServerProcess, free_port_blocks, kill, start_server, wait_until
from shoal.testing.rawclient import RawClient

LOCK_LABELS = {"source": "sdk", "module": "lock"}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Any:
    server = start_server(tmp_path_factory.mktemp("lock"), auth=OPEN)
    yield server
    kill(server)


@pytest.fixture
async def connect() -> AsyncIterator[Callable[..., Any]]:
    """Opens lock connections (closed at teardown unless a test closed them)."""
    clients: list[RawClient] = []

    async def factory(server: ServerProcess) -> RawClient:
        client = RawClient(server.grpc_port)
        clients.append(client)
        await client.connect(labels=LOCK_LABELS)
        return client

    yield factory
    for client in clients:
        await client.close()


def lock_body(key: str, operation: str, lock_type: str = "NACOS_LOCK", expired_ms: int | None = 60_000,
              owner: str | None = None) -> dict[str, Any]:
    instance: dict[str, Any] = {"key": key, "expiredTime": expired_ms, "lockType": lock_type, "params": {}}
    if owner is not None:
        instance["params"] = {"owner": owner}
    return {"headers": {}, "module": "lock", "lockInstance": instance, "lockOperationEnum": operation}


async def op(client: RawClient, key: str, operation: str, **kw: Any) -> bool:
    kind, reply = await client.call("LockOperationRequest", lock_body(key, operation, **kw))
    assert kind == "LockOperationResponse" and reply["resultCode"] == 200, (kind, reply)
    assert isinstance(reply["result"], bool), reply
    return bool(reply["result"])


async def acquire(client: RawClient, key: str, **kw: Any) -> bool:
    return await op(client, key, "ACQUIRE", **kw)


async def release(client: RawClient, key: str, **kw: Any) -> bool:
    return await op(client, key, "RELEASE", **kw)


async def test_acquire_release_and_contention(node: ServerProcess, connect: Callable[..., Any]) -> None:
    a, b = await connect(node), await connect(node)
    assert await acquire(a, "orders")
    assert not await acquire(b, "orders")
    assert not await acquire(a, "orders")  # Nacos's mutex is not re-entrant
    assert await acquire(b, "orders", lock_type="REENTRANT")  # another type is another lock (LockKey)
    assert await release(a, "orders")
    assert not await release(a, "orders")  # nothing left to release
    assert await acquire(b, "orders")


async def test_non_reentrant_and_reentrant_owners(node: ServerProcess, connect: Callable[..., Any]) -> None:
    a, b = await connect(node), await connect(node)
    # NON_REENTRANT: one owner, no second acquire, only the owner releases
    assert await acquire(a, "nr", lock_type="NON_REENTRANT", owner="a:1")
    assert not await acquire(a, "nr", lock_type="NON_REENTRANT", owner="a:1")
    assert not await release(b, "nr", lock_type="NON_REENTRANT", owner="b:1")
    assert await release(a, "nr", lock_type="NON_REENTRANT", owner="a:1")
    # REENTRANT: the owner takes it twice and must release it twice
    assert await acquire(a, "re", lock_type="REENTRANT", owner="a:7")
    assert await acquire(a, "re", lock_type="REENTRANT", owner="a:7")
    assert not await acquire(b, "re", lock_type="REENTRANT", owner="b:7")
    assert await release(a, "re", lock_type="REENTRANT", owner="a:7")
    assert not await acquire(b, "re", lock_type="REENTRANT", owner="b:7")
    assert await release(a, "re", lock_type="REENTRANT", owner="a:7")
    assert await acquire(b, "re", lock_type="REENTRANT", owner="b:7")
    # without params.owner the connection owns it
    assert await acquire(a, "conn-owned", lock_type="REENTRANT")
    assert await acquire(a, "conn-owned", lock_type="REENTRANT")
    assert not await acquire(b, "conn-owned", lock_type="REENTRANT")


async def test_expiry_frees_the_lock(node: ServerProcess, connect: Callable[..., Any]) -> None:
    a, b = await connect(node), await connect(node)
    # long enough for the second attempt to come first on a loaded machine, short for the test
    assert await acquire(a, "short", expired_ms=1500)
    assert not await acquire(b, "short", expired_ms=1500)
    await wait_until(lambda: acquire(b, "short"), 10, "the expired lock taken by another client")
    assert not await release(a, "short", lock_type="NON_REENTRANT", owner="x")


async def test_closed_connection_releases_its_locks(node: ServerProcess, connect: Callable[..., Any]) -> None:
    a, b = await connect(node), await connect(node)
    assert await acquire(a, "held-by-a", expired_ms=600_000)
    assert await acquire(a, "held-too", lock_type="REENTRANT", expired_ms=600_000)
    assert not await acquire(b, "held-by-a")
    await a.close()
    await wait_until(lambda: acquire(b, "held-by-a"), 10, "a closed holder's lock released")
    assert await acquire(b, "held-too", lock_type="REENTRANT")


async def test_bad_lock_requests_get_error_codes(node: ServerProcess, connect: Callable[..., Any]) -> None:
    a = await connect(node)
    for body in (
        {"headers": {}, "lockOperationEnum": "ACQUIRE"},  # no lockInstance
        lock_body("", "ACQUIRE"),
        lock_body("k", "ACQUIRE", lock_type="NO_SUCH_TYPE"),
        lock_body("k", "EXPIRE"),
        {**lock_body("k", "ACQUIRE"), "lockInstance": {"key": "k", "lockType": "NACOS_LOCK", "expiredTime": "soon"}},
        {**lock_body("k", "ACQUIRE"), "lockInstance": ["k"]},
    ):
        kind, reply = await a.call("LockOperationRequest", body)
        assert kind == "ErrorResponse" and reply["errorCode"] == 400, (body, reply)
    assert await acquire(a, "after-garbage")
    assert "Traceback" not in node.log()


async def test_two_nodes_contend_for_one_lock(tmp_path: Path, connect: Callable[..., Any]) -> None:
    """Three nodes on managed etcd: a lock taken through one node is held for the others; a
    release or an expiry on one is seen by the next acquire on another."""
    ports = free_port_blocks(3)
    members = ",".join(f"127.0.0.1:{p}" for p in ports)
    nodes = [start_server(tmp_path, ["--members", members, "-D", "shoal.member.report-interval-ms=300"],
                          port=p, wait=False, auth=OPEN) for p in ports]
    try:
        for n in nodes:
            n.wait_ready(timeout=60)
        a, b, c = await connect(nodes[0]), await connect(nodes[1]), await connect(nodes[2])
        # both try at once: exactly one wins
        results = await asyncio.gather(acquire(a, "leader"), acquire(b, "leader"))
        assert sorted(results) == [False, True], results
        winner, loser = (a, b) if results[0] else (b, a)
        assert not await acquire(c, "leader")
        assert await release(winner, "leader")
        assert await acquire(loser, "leader", expired_ms=2000)
        assert not await acquire(c, "leader")
        await wait_until(lambda: acquire(c, "leader"), 15, "the lock expired on another node")
        # a holder's connection closing on node 3 frees the lock for node 1
        await c.close()
        await wait_until(lambda: acquire(a, "leader"), 15, "node 3's closed holder released")
        # a node shutting down releases what its connections hold, long before their expiry
        d = await connect(nodes[2])
        assert await acquire(d, "shutdown", expired_ms=600_000)
        assert not await acquire(b, "shutdown")
        await asyncio.to_thread(nodes[2].stop)
        assert await acquire(b, "shutdown")
    finally:
        for n in nodes:
            kill(n)
