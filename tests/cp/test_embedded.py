"""The embedded store beyond the shared contract: durability across reopen, history bounds."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from shoal.cp.embedded import EmbeddedStore
from shoal.cp.store import EventKind, Keyspace, Resync, WatchEvent, WatchItem
from shoal.errors import CpUnavailable

USERS = Keyspace.USERS


async def _first_items(store: EmbeddedStore, prefix: str, from_revision: int, count: int) -> list[WatchItem]:
    items: list[WatchItem] = []
    async with asyncio.timeout(15):
        async for item in store.watch(prefix, from_revision):
            items.append(item)
            if len(items) == count:
                break
    return items


async def test_data_and_revisions_survive_a_restart(tmp_path: Path) -> None:
    first = EmbeddedStore.in_data_dir(tmp_path)
    await first.start()
    await first.put(USERS.key("nacos"), b"admin")
    created = await first.create(Keyspace.META.key("token-secret-key"), b"k")
    deleted_at = await first.delete(USERS.key("nacos"))
    kept = await first.put(USERS.key("alice"), b"user")
    await first.close()
    assert deleted_at is not None

    second = EmbeddedStore.in_data_dir(tmp_path)
    await second.start()
    try:
        assert (tmp_path / "cp" / "store.sqlite3").exists()
        assert await second.get(USERS.key("nacos")) is None
        alice = await second.get(USERS.key("alice"))
        assert alice is not None and (alice.value, alice.mod_revision) == (b"user", kept)
        assert not (await second.create(Keyspace.META.key("token-secret-key"), b"other")).succeeded
        assert created.succeeded
        assert await second.put(USERS.key("bob"), b"x") == kept + 1  # revisions go on, never reused
        # the history survives too: a watcher that saw up to `created` resumes across the restart
        items = await _first_items(second, USERS.prefix, created.revision + 1, 3)
        assert [(i.kind, i.key) for i in items if isinstance(i, WatchEvent)] == [
            (EventKind.DELETE, USERS.key("nacos")), (EventKind.PUT, USERS.key("alice")),
            (EventKind.PUT, USERS.key("bob"))]
    finally:
        await second.close()


async def test_history_is_bounded_and_older_watches_resync(tmp_path: Path) -> None:
    store = EmbeddedStore(tmp_path / "s.sqlite3", history=500)
    await store.start()
    try:
        for i in range(1000):  # the automatic compaction runs at every 1000th revision
            await store.put(USERS.key(f"u{i % 10}"), str(i).encode())
        items = await _first_items(store, USERS.prefix, 1, 1)
        assert isinstance(items[0], Resync) and len(items[0].items) == 10
        recent = await _first_items(store, USERS.prefix, 600, 1)
        assert isinstance(recent[0], WatchEvent) and recent[0].mod_revision == 600
    finally:
        await store.close()


async def test_calls_run_off_the_event_loop_thread(tmp_path: Path) -> None:
    store = EmbeddedStore(tmp_path / "s.sqlite3")
    await store.start()
    loop_thread = threading.get_ident()
    seen: list[int] = []
    try:
        await store._call(lambda: seen.append(threading.get_ident()))  # the path every call takes
        assert seen and seen[0] != loop_thread
    finally:
        await store.close()


async def test_a_closed_store_is_unavailable_and_ends_its_watches(tmp_path: Path) -> None:
    store = EmbeddedStore(tmp_path / "s.sqlite3")
    await store.start()
    revision = await store.put(USERS.key("a"), b"1")

    items: list[WatchItem] = []
    first = asyncio.Event()

    async def drain() -> None:
        async for item in store.watch(USERS.prefix, revision):
            items.append(item)
            first.set()

    task = asyncio.create_task(drain())
    async with asyncio.timeout(15):
        await first.wait()
        await store.close()
        await task  # the watch ends by itself
    assert [i.mod_revision for i in items if isinstance(i, WatchEvent)] == [revision]
    try:
        await store.put(USERS.key("b"), b"2")
    except CpUnavailable as exc:
        assert exc.http_status == 503
    else:
        raise AssertionError("a closed store took a write")


async def test_writes_by_another_process_on_the_file_reach_the_watchers(tmp_path: Path) -> None:
    path = tmp_path / "shared.sqlite3"
    node = EmbeddedStore(path, poll_interval_s=3600)  # only its own writes publish here
    polled = EmbeddedStore(path, poll_interval_s=0.05)
    other = EmbeddedStore(path)  # the `shoal users` process
    for store in (node, polled, other):
        await store.start()
    try:
        watched = asyncio.ensure_future(_first_items(node, USERS.prefix, 1, 3))
        seen = asyncio.ensure_future(_first_items(polled, USERS.prefix, 1, 2))
        await asyncio.sleep(0)  # the watches are registered before the writes
        first = await other.put(USERS.key("from-cli"), b"1")
        second = await other.delete(USERS.key("from-cli"))
        # the node's next own write publishes the other process's changes first, in order
        own = await node.put(USERS.key("own"), b"2")
        assert [(i.key, i.mod_revision) for i in await watched if isinstance(i, WatchEvent)] == [
            (USERS.key("from-cli"), first), (USERS.key("from-cli"), second), (USERS.key("own"), own)]
        # a store that writes nothing sees them through its poll
        assert [(i.kind, i.mod_revision) for i in await seen if isinstance(i, WatchEvent)] == [
            (EventKind.PUT, first), (EventKind.DELETE, second)]
    finally:
        for store in (node, polled, other):
            await store.close()
