"""A member that stops answering (blackholed, frozen, cut off) must cost a node a status probe,
not a request timeout: a write goes to another member when the preferred one fails its probe, a
write already in flight on a member that goes silent fails at once (it cannot be retried: it may
have been applied) and the next goes elsewhere, and a watch on such a member moves to another
and resumes where it stopped. Found by the CP partition test in tests/faults.

The request timeouts here are long on purpose: each test's own deadline is far shorter, so it
fails if the store waits out a request timeout on the silent member."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from shoal.cp.etcd import EtcdStore
from shoal.cp.store import CpView, Keyspace, json_codec, json_view
from shoal.cp.supervisor import EtcdSupervisor
from shoal.errors import CpUnavailable
from shoal.testing.procs import free_port_blocks
from shoal.testing.proxy import TcpProxy
from shoal.testing.wait import wait_until

LONG_TIMEOUT_MS = 60_000
DEADLINE_S = 20  # generous, and a third of the request timeout


@pytest.fixture
async def silent_endpoint() -> AsyncIterator[str]:
    """``host:port`` of a server that accepts connections and never answers."""
    held: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # read nothing, answer nothing

    port = free_port_blocks(1, (0,))[0]
    server = await asyncio.start_server(silent, "127.0.0.1", port)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        for writer in held:
            writer.transport.abort()
        server.close()
        with contextlib.suppress(Exception):
            await server.wait_closed()


@pytest.fixture
async def proxy(etcd: EtcdSupervisor) -> AsyncIterator[TcpProxy]:
    """A proxy in front of the etcd member, to be frozen by the test."""
    found = TcpProxy(etcd.me.client_port)
    await found.open()
    try:
        yield found
    finally:
        found.thaw()
        await found.cut()


async def test_a_write_skips_a_preferred_member_that_never_answers(
        etcd: EtcdSupervisor, silent_endpoint: str) -> None:
    store = EtcdStore([silent_endpoint, *etcd.endpoints], request_timeout_ms=LONG_TIMEOUT_MS)
    await store.start()
    try:
        async with asyncio.timeout(DEADLINE_S):
            assert await store.put("/hung/first", b"1") > 0  # the silent one failed its probe
            got = await store.get("/hung/first")
        assert got is not None and got.value == b"1"
    finally:
        await store.close()


async def test_a_write_in_flight_on_a_member_gone_silent_fails_at_once_and_the_next_goes_elsewhere(
        etcd: EtcdSupervisor, proxy: TcpProxy) -> None:
    store = EtcdStore([f"127.0.0.1:{proxy.port}", *etcd.endpoints], request_timeout_ms=LONG_TIMEOUT_MS)
    await store.start()
    try:
        assert await store.put("/hung/before", b"0") > 0  # through the proxy: it answered last
        proxy.freeze()
        async with asyncio.timeout(DEADLINE_S):
            with pytest.raises(CpUnavailable) as raised:
                await store.put("/hung/first", b"1")
            assert raised.value.http_status == 503
            assert await store.put("/hung/second", b"2") > 0
            got = await store.get("/hung/second")
        assert got is not None and got.value == b"2"
    finally:
        await store.close()


async def test_a_watch_on_a_member_gone_silent_moves_to_another_and_resumes(
        etcd: EtcdSupervisor, etcd_store: EtcdStore, proxy: TcpProxy) -> None:
    behind = EtcdStore([f"127.0.0.1:{proxy.port}", *etcd.endpoints], request_timeout_ms=LONG_TIMEOUT_MS)
    await behind.start()
    view = json_view(behind, Keyspace.USERS)
    view.start()
    try:
        await view.wait_ready(DEADLINE_S)
        first = await etcd_store.put(Keyspace.USERS.key("a"), b'"1"')
        await view.wait_revision(first, DEADLINE_S)  # the watch is up, on the proxy's member
        proxy.freeze()
        second = await etcd_store.put(Keyspace.USERS.key("b"), b'"2"')
        third = await etcd_store.put(Keyspace.USERS.key("a"), b'"3"')
        # Without re-homing, the stream sits on the frozen connection until its reopen bound (60 s).
        await view.wait_revision(third, DEADLINE_S)
        assert dict(view.items()) == {"a": "3", "b": "2"} and view.mod_revision("b") == second
    finally:
        await view.stop()
        await behind.close()


async def test_a_write_returns_while_its_view_lags_and_the_view_catches_up_later(
        etcd: EtcdSupervisor, proxy: TcpProxy) -> None:
    # The watch stays on the frozen proxy (no idle re-homing here); writes find the other member.
    behind = EtcdStore([f"127.0.0.1:{proxy.port}", *etcd.endpoints], request_timeout_ms=LONG_TIMEOUT_MS,
                       watch_idle_s=600)
    await behind.start()
    decode, encode = json_codec()
    view = CpView(behind, Keyspace.USERS, decode, encode, catch_up_timeout_ms=300)
    view.start()
    try:
        await view.wait_ready(DEADLINE_S)
        proxy.freeze()

        async def written() -> int | None:
            try:
                return await view.put("a", "1")
            except CpUnavailable:  # the write that found the proxy frozen
                return None

        revision = await wait_until(written, DEADLINE_S, "a write returning although its view cannot see it")
        assert view.get("a") is None
        proxy.thaw()
        await view.wait_revision(revision, DEADLINE_S)
        assert view.get("a") == "1"
    finally:
        await view.stop()
        await behind.close()
