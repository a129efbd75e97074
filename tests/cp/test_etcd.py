"""The etcd store beyond the shared contract, against a real etcd process: resume after the
connection is cut, resume after compaction, unavailability, auth."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from shoal.cp.etcd import EtcdError, EtcdStore
from shoal.cp.store import CpView, EventKind, Keyspace, Resync, json_codec, json_view
from shoal.cp.supervisor import EtcdSupervisor
from shoal.errors import CpUnavailable
from shoal.testing.proxy import TcpProxy
from shoal.testing.wait import wait_until

from .test_contract import Collector

USERS = Keyspace.USERS


async def test_watch_resumes_without_gaps_or_repeats_after_etcd_restarts(
        etcd: EtcdSupervisor, etcd_store: EtcdStore) -> None:
    a, b = USERS.key("a"), USERS.key("b")
    start = await etcd_store.put(a, b"1")
    watcher = Collector(etcd_store, USERS.prefix, start)
    try:
        await wait_until(lambda: len(watcher.events()) == 1, timeout=15.0, what="the first event")
        await etcd.stop()  # the client's stream is cut
        await etcd.start()
        await etcd.wait_listening(30)
        later = await wait_until(lambda: _try_put(etcd_store, b, b"2"), timeout=15.0, what="a write after the restart")
        await wait_until(lambda: len(watcher.events()) == 2, timeout=15.0, what="the event after the restart")
        assert watcher.events() == [(EventKind.PUT, a, b"1", start), (EventKind.PUT, b, b"2", later)]
    finally:
        await watcher.stop()


async def _try_put(store: EtcdStore, key: str, value: bytes) -> int | None:
    try:
        return await store.put(key, value)
    except CpUnavailable:
        return None


async def test_view_resyncs_when_history_was_compacted_while_it_was_cut_off(
        etcd: EtcdSupervisor, etcd_store: EtcdStore) -> None:
    proxy = TcpProxy(etcd.me.client_port)
    await proxy.open()
    behind = EtcdStore([f"127.0.0.1:{proxy.port}"], request_timeout_ms=2000, backoff_max_ms=300)
    await behind.start()
    view = json_view(behind, USERS)
    changes: list[tuple[str, Any, Any]] = []
    view.subscribe(lambda name, old, new: changes.append((name, old, new)))
    view.start()
    try:
        await etcd_store.put(USERS.key("gone"), b'"x"')
        await etcd_store.put(USERS.key("kept"), b'"y"')
        await view.wait_ready(15)
        await wait_until(lambda: len(view) == 2, timeout=15.0, what="the view filled")
        await proxy.cut()
        await etcd_store.delete(USERS.key("gone"))
        await etcd_store.put(USERS.key("new"), b'"z"')
        last = await etcd_store.put(Keyspace.ROLES.key("r"), b'"r"')
        await etcd_store.compact(last)
        await proxy.open()
        await wait_until(lambda: dict(view.items()) == {"kept": "y", "new": "z"}, timeout=15.0, what="the view re-read")
        assert ("gone", "x", None) in changes and ("new", None, "z") in changes
        assert ("kept", "y", "y") not in changes  # an unchanged key is not reported by the re-read
        after = await etcd_store.put(USERS.key("after"), b'"w"')
        await view.wait_revision(after, 15)
        assert view.get("after") == "w"
    finally:
        await view.stop()
        await behind.close()
        await proxy.cut()


async def test_writes_fail_clearly_when_etcd_is_gone_and_the_view_still_reads(
        etcd: EtcdSupervisor, etcd_store: EtcdStore) -> None:
    view = json_view(etcd_store, USERS)
    view.start()
    try:
        await view.put("alice", {"role": "admin"})
        await etcd.stop()
        async with asyncio.timeout(10):  # bounded by the request timeout, never hangs
            with pytest.raises(CpUnavailable) as raised:
                await view.put("bob", {"role": "user"})
            with pytest.raises(CpUnavailable):
                await etcd_store.create(Keyspace.META.key("k"), b"1")
        assert raised.value.http_status == 503 and raised.value.code == 503
        assert view.get("alice") == {"role": "admin"} and view.get("bob") is None
    finally:
        await view.stop()


async def test_a_resync_item_when_watching_from_a_compacted_revision(etcd_store: EtcdStore) -> None:
    first = await etcd_store.put(USERS.key("a"), b"1")
    last = await etcd_store.put(USERS.key("a"), b"2")
    await etcd_store.compact(last)
    await etcd_store.compact(last)  # compacting twice is not an error
    async with asyncio.timeout(15):
        async for item in etcd_store.watch(USERS.prefix, first):
            assert isinstance(item, Resync)
            assert [(kv.value, kv.version) for kv in item.items] == [(b"2", 2)]
            break


async def _gateway(session: aiohttp.ClientSession, url: str, path: str, body: dict[str, Any],
                   token: str = "") -> dict[str, Any]:
    headers = {"Authorization": token} if token else {}
    async with session.post(url + path, json=body, headers=headers) as resp:
        answer: dict[str, Any] = await resp.json(content_type=None)
        assert "error" not in answer, answer
        return answer


async def test_auth_user_and_password_get_a_token(etcd: EtcdSupervisor) -> None:
    url = etcd.me.client_url
    async with aiohttp.ClientSession() as session:
        await _gateway(session, url, "/v3/auth/user/add", {"name": "root", "password": "s3cret"})
        await _gateway(session, url, "/v3/auth/user/grant", {"user": "root", "role": "root"})
        await _gateway(session, url, "/v3/auth/enable", {})
        token = (await _gateway(session, url, "/v3/auth/authenticate",
                                {"name": "root", "password": "s3cret"}))["token"]
        try:
            store = EtcdStore(etcd.endpoints, user="root", password="s3cret", request_timeout_ms=3000)
            anonymous = EtcdStore(etcd.endpoints, request_timeout_ms=3000)
            wrong = EtcdStore(etcd.endpoints, user="root", password="nope", request_timeout_ms=3000)
            for s in (store, anonymous, wrong):
                await s.start()
            try:
                revision = await store.put(USERS.key("a"), b"1")
                kv = await store.get(USERS.key("a"))
                assert kv is not None and kv.mod_revision == revision
                with pytest.raises(EtcdError):
                    await anonymous.get(USERS.key("a"))
                with pytest.raises(EtcdError):
                    await wrong.get(USERS.key("a"))
                store._token = "expired"  # an invalid token is renewed once, transparently
                assert (await store.get(USERS.key("a"))) is not None
            finally:
                for s in (store, anonymous, wrong):
                    await s.close()
        finally:
            await _gateway(session, url, "/v3/auth/disable", {}, token)


def test_endpoints_take_host_port_or_urls() -> None:
    assert EtcdStore(["127.0.0.1:2379", "http://h:1/"]).endpoints == ["http://127.0.0.1:2379", "http://h:1"]
    assert EtcdStore(["h:2379"], ca_file="/ca.pem").endpoints == ["https://h:2379"]
    with pytest.raises(ValueError):
        EtcdStore([])


async def test_a_view_started_while_etcd_is_down_fills_once_it_is_up(
        etcd: EtcdSupervisor, etcd_store: EtcdStore) -> None:
    revision = await etcd_store.put(USERS.key("a"), b'"1"')
    await etcd.stop()
    decode, encode = json_codec()
    view = CpView(etcd_store, USERS, decode, encode, retry_delay_ms=100)
    view.start()
    try:
        assert not view.ready
        await etcd.start()
        await view.wait_ready(30)
        assert view.get("a") == "1" and view.revision >= revision
    finally:
        await view.stop()


async def test_a_view_stops_promptly_while_its_watch_keeps_receiving(etcd_store: EtcdStore) -> None:
    # A cancellation arriving just as a read of the stream completes must not be lost (the
    # `shoal users` command hung on stopping its views that way).
    writing = True

    async def writer() -> None:
        n = 0
        while writing:
            n += 1
            await etcd_store.put(USERS.key(f"w{n % 5}"), b'"x"')

    task = asyncio.create_task(writer())
    try:
        for _ in range(80):
            view = json_view(etcd_store, USERS)
            view.start()
            try:
                await view.wait_ready(15)
                await wait_until(lambda v=view: len(v) > 0, timeout=15.0, what="events flowing")  # type: ignore[misc]
            finally:
                async with asyncio.timeout(10):
                    await view.stop()
    finally:
        writing = False
        await task
