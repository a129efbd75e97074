"""The CP store contract, run against both implementations (embedded SQLite, a real etcd)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from shoal.cp.store import (
    MAX_TXN_OPS,
    CpStore,
    CpView,
    EventKind,
    Keyspace,
    Resync,
    TxnCompare,
    TxnWrite,
    WatchEvent,
    WatchItem,
    json_view,
)
from shoal.testing.wait import wait_until

USERS = Keyspace.USERS


class Collector:
    """Consumes a watch in the background and keeps what it yielded."""

    def __init__(self, store: CpStore, prefix: str, from_revision: int) -> None:
        self.items: list[WatchItem] = []
        self._iterator: AsyncIterator[WatchItem] = store.watch(prefix, from_revision)
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        async for item in self._iterator:
            self.items.append(item)

    def events(self) -> list[tuple[EventKind, str, bytes, int]]:
        return [(i.kind, i.key, i.value, i.mod_revision) for i in self.items if isinstance(i, WatchEvent)]

    async def stop(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


async def test_put_get_delete_return_growing_revisions(store: CpStore) -> None:
    key = USERS.key("nacos")
    assert await store.get(key) is None
    r1 = await store.put(key, b"v1")
    r2 = await store.put(key, b"v2")
    assert 0 < r1 < r2
    kv = await store.get(key)
    assert kv is not None
    assert (kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version) == (key, b"v2", r1, r2, 2)
    r3 = await store.delete(key)
    assert r3 is not None and r3 > r2
    assert await store.get(key) is None
    assert await store.delete(key) is None  # nothing to delete: no revision


async def test_range_is_exactly_the_prefix(store: CpStore) -> None:
    await store.put(USERS.key("a"), b"1")
    await store.put(USERS.key("b/c"), b"2")
    await store.put(Keyspace.ROLES.key("a"), b"3")
    await store.put("/shoal/v1/usersX/a", b"4")  # shares the text but not the keyspace
    last = await store.put("/shoal/v1/user", b"5")
    result = await store.range(USERS.prefix)
    assert [(kv.key, kv.value) for kv in result.items] == [(USERS.key("a"), b"1"), (USERS.key("b/c"), b"2")]
    assert result.revision >= last


async def test_create_if_absent_and_compare_and_put(store: CpStore) -> None:
    key = Keyspace.META.key("token-secret-key")
    first = await store.create(key, b"k1")
    assert first.succeeded and first.current is not None and first.current.value == b"k1"
    second = await store.create(key, b"k2")
    assert not second.succeeded
    assert second.current is not None and second.current.value == b"k1"
    assert second.current.mod_revision == first.revision
    stale = await store.compare_and_put(key, b"k3", first.revision - 1)
    assert not stale.succeeded
    fresh = await store.compare_and_put(key, b"k3", first.revision)
    assert fresh.succeeded and fresh.revision > first.revision
    assert fresh.current is not None and (fresh.current.version, fresh.current.create_revision) == (2, first.revision)
    kv = await store.get(key)
    assert kv is not None and kv.value == b"k3"


async def test_concurrent_creates_have_exactly_one_winner(store: CpStore) -> None:
    key = Keyspace.NAMESPACES.key("dev")
    results = await asyncio.gather(*(store.create(key, f"node{i}".encode()) for i in range(16)))
    winners = [i for i, r in enumerate(results) if r.succeeded]
    assert len(winners) == 1
    expected = f"node{winners[0]}".encode()
    assert all(r.current is not None and r.current.value == expected for r in results)
    kv = await store.get(key)
    assert kv is not None and kv.value == expected and kv.version == 1


async def test_watch_replays_history_then_follows_live_writes(store: CpStore) -> None:
    a, b = USERS.key("a"), USERS.key("b")
    start = await store.put(a, b"1")
    await store.put(Keyspace.ROLES.key("x"), b"elsewhere")
    watcher = Collector(store, USERS.prefix, start)
    try:
        r2 = await store.put(b, b"2")
        r3 = await store.delete(a)
        expected = [(EventKind.PUT, a, b"1", start), (EventKind.PUT, b, b"2", r2), (EventKind.DELETE, a, b"", r3)]
        await wait_until(lambda: watcher.events() == expected, timeout=15.0,
                         what=f"events {expected}, got {watcher.events()}")
    finally:
        await watcher.stop()


async def test_watch_from_a_compacted_revision_resyncs_then_continues(store: CpStore) -> None:
    a, b = USERS.key("a"), USERS.key("b")
    first = await store.put(a, b"1")
    await store.put(b, b"2")
    deleted = await store.delete(a)
    assert deleted is not None
    await store.compact(deleted)
    watcher = Collector(store, USERS.prefix, first)
    try:
        await wait_until(lambda: watcher.items, timeout=15.0, what="a resync")
        resync = watcher.items[0]
        assert isinstance(resync, Resync)
        assert [(kv.key, kv.value) for kv in resync.items] == [(b, b"2")]
        assert resync.revision >= deleted
        after = await store.put(a, b"3")
        await wait_until(lambda: watcher.events() == [(EventKind.PUT, a, b"3", after)], timeout=15.0,
                         what="the next event")
    finally:
        await watcher.stop()


async def test_view_reads_locally_and_reads_its_own_writes(store: CpStore) -> None:
    await store.put(USERS.key("before"), json.dumps({"n": 0}).encode())
    view = json_view(store, USERS)
    changes: list[tuple[str, Any, Any]] = []
    view.subscribe(lambda name, old, new: changes.append((name, old, new)))
    view.start()
    try:
        await view.wait_ready(15)
        assert view.get("before") == {"n": 0}
        await view.put("alice", {"n": 1})
        assert view.get("alice") == {"n": 1}  # no wait: put returns once the view has it
        assert await view.create("alice", {"n": 2}) is False
        assert await view.compare_and_put("alice", {"n": 3}, view.mod_revision("alice")) is True
        assert view.get("alice") == {"n": 3}
        await store.put(USERS.key("bob"), b'{"n":4}')  # written by "another node"
        await wait_until(lambda: view.get("bob") == {"n": 4}, timeout=15.0, what="a foreign write in the view")
        assert await view.delete("alice") is True
        assert "alice" not in view and await view.delete("alice") is False
        assert ("alice", None, {"n": 1}) in changes and ("alice", {"n": 3}, None) in changes
        assert dict(view.items()) == {"before": {"n": 0}, "bob": {"n": 4}}
    finally:
        await view.stop()


async def test_view_skips_undecodable_values(store: CpStore) -> None:
    view: CpView[Any] = json_view(store, USERS)
    view.start()
    try:
        await view.wait_ready(15)
        await store.put(USERS.key("broken"), b"{not json")
        revision = await store.put(USERS.key("ok"), b"1")
        await view.wait_revision(revision, 15)
        assert view.get("ok") == 1 and "broken" not in view
    finally:
        await view.stop()


async def test_closing_the_store_ends_its_watches(store: CpStore) -> None:
    revision = await store.put(USERS.key("a"), b"1")
    watcher = Collector(store, USERS.prefix, revision)
    await wait_until(lambda: watcher.events(), timeout=15.0, what="the first event")
    await store.close()
    async with asyncio.timeout(15):
        await watcher._task  # ends by itself, no error
    assert [e[3] for e in watcher.events()] == [revision]


async def test_a_txn_whose_compare_fails_for_one_key_writes_nothing(store: CpStore) -> None:
    a, b, c, gone = USERS.key("a"), USERS.key("b"), USERS.key("c"), USERS.key("gone")
    ra = await store.put(a, b"a1")
    rc = await store.put(c, b"c1")
    rg = await store.put(gone, b"g1")
    before = (await store.range(USERS.prefix)).items
    writes = [TxnWrite(a, b"a2"), TxnWrite(b, b"b1"), TxnWrite(c, b"c2"), TxnWrite(gone, None)]
    # every compare holds but c's (someone wrote c since it was read at rc - 1)
    failed = await store.txn([TxnCompare(a, ra), TxnCompare(b, 0), TxnCompare(c, rc - 1)], writes)
    assert not failed.succeeded and not failed.changed
    assert [kv.value if kv else None for kv in failed.current] == [b"a1", None, b"c1"]
    assert [kv.mod_revision if kv else 0 for kv in failed.current] == [ra, 0, rc]
    assert (await store.range(USERS.prefix)).items == before  # not one of the four writes
    done = await store.txn([TxnCompare(a, ra), TxnCompare(b, 0), TxnCompare(c, rc)], writes)
    assert done.succeeded and done.changed and done.revision > rg and done.current == ()
    now = {kv.key: kv for kv in (await store.range(USERS.prefix)).items}
    assert {k: kv.value for k, kv in now.items()} == {a: b"a2", b: b"b1", c: b"c2"}
    assert all(rg < kv.mod_revision <= done.revision for kv in now.values())
    assert (now[a].version, now[a].create_revision, now[b].version) == (2, ra, 1)
    # a txn that changes nothing (deleting an absent key) succeeds without a revision of its own
    idle = await store.txn([], [TxnWrite(gone, None)])
    assert idle.succeeded and not idle.changed and idle.revision == done.revision


async def test_a_watcher_sees_a_txn_whole_in_order(store: CpStore) -> None:
    start = await store.put(USERS.key("old"), b"0")
    watcher = Collector(store, USERS.prefix, start + 1)
    try:
        writes = [TxnWrite(USERS.key(f"u{i:03}"), str(i).encode()) for i in range(MAX_TXN_OPS - 1)]
        done = await store.txn([TxnCompare(USERS.key("old"), start)], [*writes, TxnWrite(USERS.key("old"), None)])
        assert done.succeeded
        expected = [(EventKind.PUT, w.key, w.value) for w in writes] + [(EventKind.DELETE, USERS.key("old"), b"")]
        await wait_until(lambda: len(watcher.events()) >= len(expected), timeout=15.0, what="the txn's events")
        assert [e[:3] for e in watcher.events()] == expected
        assert all(start < e[3] <= done.revision for e in watcher.events())
    finally:
        await watcher.stop()


async def test_a_txn_holds_at_most_max_txn_ops_and_each_key_once(store: CpStore) -> None:
    too_many = [TxnWrite(USERS.key(f"u{i}"), b"1") for i in range(MAX_TXN_OPS + 1)]
    with pytest.raises(ValueError, match="at most"):
        await store.txn([], too_many)
    with pytest.raises(ValueError, match="at most"):
        await store.txn([TxnCompare(w.key, 0) for w in too_many], too_many[:1])
    with pytest.raises(ValueError, match="once"):
        await store.txn([], [TxnWrite(USERS.key("x"), b"1"), TxnWrite(USERS.key("x"), None)])
    assert (await store.range(USERS.prefix)).items == ()


async def test_view_transact_reads_its_own_writes_or_reports_the_winners(store: CpStore) -> None:
    view: CpView[Any] = json_view(store, USERS)
    view.start()
    try:
        await view.wait_ready(15)
        await view.put("alice", {"n": 1})
        done = await view.transact({"alice": view.mod_revision("alice"), "bob": 0},
                                   {"alice": {"n": 2}, "bob": {"n": 3}})
        assert done.succeeded
        assert (view.get("alice"), view.get("bob")) == ({"n": 2}, {"n": 3})  # no wait: caught up
        stale = view.mod_revision("bob")
        await store.put(USERS.key("bob"), b'{"n":4}')  # written by "another node"
        lost = await view.transact({"alice": view.mod_revision("alice"), "bob": stale, "carol": 0},
                                   {"alice": None, "carol": {"n": 5}})
        assert not lost.succeeded
        assert lost.current["bob"][1] == {"n": 4} and lost.current["bob"][0] > stale
        assert lost.current["carol"] == (0, None) and lost.current["alice"][1] == {"n": 2}
        assert (await store.get(USERS.key("carol"))) is None and (await store.get(USERS.key("alice"))) is not None
    finally:
        await view.stop()
