"""The embedded CP store of a standalone node: one SQLite file in the data dir.

Durable (WAL journal, ``synchronous=FULL``: a write is on disk before its revision is
returned) and race-free: every SQLite call runs on the store's single worker thread, so
calls are serialised without any lock on the loop, and the event loop never blocks on disk.

Tables: ``kv`` (the current keys with etcd's create/mod revision and version), ``log`` (one
row per change since the compaction revision, what :meth:`watch` replays) and ``meta``
(the current and the compacted revision). Revisions increase by one per write that changes
something, as in etcd; a delete of an absent key changes nothing. A txn is one SQL transaction
whose changes take consecutive revisions and reach the watchers together. The log keeps the last
``history`` revisions (older rows are compacted automatically); a watch that starts before
the compacted revision gets a :class:`~shoal.cp.store.Resync` of its prefix instead.

Watches are fed from the store's own writes: the worker thread hands each committed batch of
events to the loop (in commit order) and every watcher's queue receives those under its prefix.
Writes by another process on the same file (``shoal users`` next to a running node) are picked up
from the log: by the next own write (which publishes every revision before its own, in order) or
by a poll of the revision every ``poll_interval_s`` while anything is watched.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from shoal.cp.store import (
    CasResult,
    CpStore,
    EventKind,
    KeyValue,
    RangeResult,
    Resync,
    SiblingViews,
    TxnCompare,
    TxnResult,
    TxnWrite,
    WatchEvent,
    WatchItem,
    check_txn,
    prefix_end,
)
from shoal.errors import CpUnavailable

log = logging.getLogger(__name__)
R = TypeVar("R")
#: How long a write waits for another process's write transaction on the same file.
BUSY_TIMEOUT_S = 5.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS kv (
    key TEXT PRIMARY KEY, value BLOB NOT NULL,
    create_revision INTEGER NOT NULL, mod_revision INTEGER NOT NULL, version INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS log (
    revision INTEGER PRIMARY KEY, kind TEXT NOT NULL, key TEXT NOT NULL, value BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
INSERT OR IGNORE INTO meta VALUES ('revision', 0), ('compacted', 0);
"""


def path_in(data_dir: str | Path) -> Path:
    """The store's file in a node's data dir."""
    return Path(data_dir) / "cp" / "store.sqlite3"


class EmbeddedStore(CpStore):
    """A durable single-node :class:`CpStore` in ``<data_dir>/cp/store.sqlite3``."""

    kind = "embedded"

    def __init__(self, path: str | Path, history: int = 100_000, poll_interval_s: float = 1.0,
                 siblings: SiblingViews | None = None) -> None:
        super().__init__(siblings)
        self.path = Path(path)
        self.history = history
        self.poll_interval_s = poll_interval_s
        self._published = 0  # the newest revision handed to the watchers (worker thread only)
        self._poller: asyncio.Task[None] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._db: sqlite3.Connection | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watchers: set[_Watcher] = set()
        self._closed = False

    @classmethod
    def in_data_dir(cls, data_dir: str | Path, history: int = 100_000, poll_interval_s: float = 1.0,
                    siblings: SiblingViews | None = None) -> EmbeddedStore:
        return cls(path_in(data_dir), history, poll_interval_s, siblings)

    # --- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cp-sqlite")
        await self._call(self._open)
        self._poller = self._loop.create_task(self._poll_forever(), name="cp-sqlite-poll")

    async def _poll_forever(self) -> None:
        """Publish what other processes wrote to the file (only while something is watched)."""
        while True:
            await asyncio.sleep(self.poll_interval_s)
            try:
                await self.refresh()
            except CpUnavailable:
                continue

    async def refresh(self) -> None:
        """Publish what other processes wrote to the file since the last look, now (a sibling
        worker's write its writer waits for: :meth:`CpStore.catch_up`)."""
        if self._watchers:
            events = await self._call(self._poll)
            if events:
                self._publish_all(events)

    def _open(self) -> None:
        # Private: the store holds password hashes and the cluster's token key. SQLite gives its
        # -wal and -shm files the main file's mode.
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600))
        for path in (self.path, self.path.with_name(self.path.name + "-wal"),
                     self.path.with_name(self.path.name + "-shm")):
            with contextlib.suppress(FileNotFoundError):
                os.chmod(path, 0o600)
        # Other processes write the file too (the workers of one node, `shoal users`): a write waits
        # up to BUSY_TIMEOUT_S for theirs (BEGIN IMMEDIATE takes the write lock at once, so no
        # deadlock between upgrading readers); reads never wait in WAL mode.
        db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.executescript(_SCHEMA)
        self._db = db
        self._published = self._meta("revision")

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        poller, self._poller = self._poller, None
        if poller is not None:
            poller.cancel()
            await asyncio.gather(poller, return_exceptions=True)
        for watcher in list(self._watchers):
            watcher.close()
        executor, self._executor = self._executor, None
        if executor is not None:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(executor, self._close_db)
            executor.shutdown(wait=False)

    def _close_db(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            db.close()

    async def _call(self, fn: Callable[[], R]) -> R:
        if self._closed or self._executor is None:
            raise CpUnavailable("CP store unavailable: the embedded store is closed")
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn)
        except sqlite3.Error as exc:
            raise CpUnavailable(f"CP store unavailable: embedded store error: {exc}") from exc

    # --- helpers on the worker thread -------------------------------------------------------------
    @property
    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise sqlite3.ProgrammingError("store is closed")
        return self._db

    def _meta(self, name: str) -> int:
        row = self._conn.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()
        return int(row[0])

    def _row(self, key: str) -> KeyValue | None:
        row = self._conn.execute(
            "SELECT key, value, create_revision, mod_revision, version FROM kv WHERE key = ?", (key,)
        ).fetchone()
        return None if row is None else KeyValue(row[0], bytes(row[1]), row[2], row[3], row[4])

    def _write(self, key: str, value: bytes | None, expected: int | None) -> tuple[bool, int, KeyValue | None]:
        """One transaction: (changed, revision after, key now). ``value`` None = delete;
        ``expected`` None = unconditional, else the required mod revision (0 = absent)."""
        db = self._conn
        db.execute("BEGIN IMMEDIATE")
        try:
            current = self._row(key)
            revision = self._meta("revision")
            if expected is not None and (current.mod_revision if current else 0) != expected:
                db.execute("ROLLBACK")
                return False, revision, current
            if value is None and current is None:
                db.execute("ROLLBACK")
                return False, revision, None
            now, event = self._apply(key, value, current, revision + 1)
            self._commit_revision(revision, revision + 1)
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        self._publish_threadsafe(self._unpublished([event]))
        return True, revision + 1, now

    def _txn(self, compares: Sequence[TxnCompare], writes: Sequence[TxnWrite]) -> TxnResult:
        """Every write if every compare holds, in one SQL transaction: nothing of it is on disk,
        or published to a watcher, unless all of it is. Each change takes the next revision
        (etcd gives a txn's changes one revision; nothing here relies on either)."""
        db = self._conn
        db.execute("BEGIN IMMEDIATE")
        events: list[WatchEvent] = []
        try:
            start = self._meta("revision")
            rows = tuple(self._row(c.key) for c in compares)
            if any((row.mod_revision if row else 0) != c.mod_revision for row, c in zip(rows, compares, strict=True)):
                db.execute("ROLLBACK")
                return TxnResult(False, False, start, rows)
            revision = start
            for write in writes:
                current = self._row(write.key)
                if write.value is None and current is None:
                    continue  # deleting an absent key changes nothing
                revision += 1
                events.append(self._apply(write.key, write.value, current, revision)[1])
            if revision == start:
                db.execute("ROLLBACK")
                return TxnResult(True, False, start)
            self._commit_revision(start, revision)
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        self._publish_threadsafe(self._unpublished(events))
        return TxnResult(True, True, revision)

    def _apply(self, key: str, value: bytes | None, current: KeyValue | None,
               revision: int) -> tuple[KeyValue | None, WatchEvent]:
        """Write one change at ``revision`` inside the open transaction: (key now, its event)."""
        db = self._conn
        if value is None:
            db.execute("DELETE FROM kv WHERE key = ?", (key,))
            db.execute("INSERT INTO log VALUES (?, ?, ?, ?)", (revision, EventKind.DELETE.value, key, b""))
            return None, WatchEvent(EventKind.DELETE, key, b"", revision)
        created = current.create_revision if current else revision
        version = current.version + 1 if current else 1
        db.execute("INSERT OR REPLACE INTO kv VALUES (?, ?, ?, ?, ?)", (key, value, created, revision, version))
        db.execute("INSERT INTO log VALUES (?, ?, ?, ?)", (revision, EventKind.PUT.value, key, value))
        return KeyValue(key, value, created, revision, version), WatchEvent(EventKind.PUT, key, value, revision)

    def _commit_revision(self, before: int, after: int) -> None:
        """Record the new revision (compacting the log each time it passes a thousand) and commit."""
        self._conn.execute("UPDATE meta SET value = ? WHERE name = 'revision'", (after,))
        if self.history and after // 1000 > before // 1000:
            self._compact_locked(after - self.history)
        self._conn.execute("COMMIT")

    def _compact_locked(self, revision: int) -> None:
        if revision <= self._meta("compacted"):
            return
        self._conn.execute("DELETE FROM log WHERE revision < ?", (revision,))
        self._conn.execute("UPDATE meta SET value = ? WHERE name = 'compacted'", (revision,))

    def _compact(self, revision: int) -> None:
        db = self._conn
        db.execute("BEGIN IMMEDIATE")
        try:
            self._compact_locked(min(revision, self._meta("revision") + 1))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def _range(self, prefix: str) -> RangeResult:
        db = self._conn
        db.execute("BEGIN")
        try:
            select = "SELECT key, value, create_revision, mod_revision, version FROM kv"
            if prefix:
                end = prefix_end(prefix.encode()).decode("utf-8", "surrogateescape")
                rows = db.execute(select + " WHERE key >= ? AND key < ? ORDER BY key", (prefix, end)).fetchall()
            else:
                rows = db.execute(select + " ORDER BY key").fetchall()
            revision = self._meta("revision")
        finally:
            db.execute("COMMIT")
        items = tuple(KeyValue(r[0], bytes(r[1]), r[2], r[3], r[4]) for r in rows if r[0].startswith(prefix))
        return RangeResult(revision, items)

    def _history(self, prefix: str, from_revision: int) -> tuple[list[WatchEvent], int, int]:
        """(events >= from_revision under prefix, current revision, compacted revision)."""
        db = self._conn
        db.execute("BEGIN")
        try:
            compacted = self._meta("compacted")
            revision = self._meta("revision")
            rows = [] if from_revision < compacted else db.execute(
                "SELECT revision, kind, key, value FROM log WHERE revision >= ? ORDER BY revision",
                (from_revision,)).fetchall()
        finally:
            db.execute("COMMIT")
        events = [WatchEvent(EventKind(r[1]), r[2], bytes(r[3]), r[0]) for r in rows if r[2].startswith(prefix)]
        return events, revision, compacted

    def _unpublished(self, own: list[WatchEvent]) -> list[WatchEvent]:
        """The events up to this process's own write (its consecutive events ``own``): just
        them, unless another process wrote since the last publication (then its changes come
        first, from the log)."""
        if own[0].mod_revision == self._published + 1:
            self._published = own[-1].mod_revision
            return own
        return self._log_since(own[-1].mod_revision)

    def _poll(self) -> list[WatchEvent]:
        revision = self._meta("revision")
        return self._log_since(revision) if revision > self._published else []

    def _log_since(self, upto: int) -> list[WatchEvent]:
        rows = self._conn.execute(
            "SELECT revision, kind, key, value FROM log WHERE revision > ? AND revision <= ? ORDER BY revision",
            (self._published, upto)).fetchall()
        if rows and rows[0][0] > self._published + 1:
            log.warning("embedded CP store: revisions %d-%d written by another process were compacted before this "
                        "one saw them; watchers of their keys are stale until restart", self._published + 1,
                        rows[0][0] - 1)
        self._published = max(self._published, upto)
        return [WatchEvent(EventKind(r[1]), r[2], bytes(r[3]), r[0]) for r in rows]

    def _publish_threadsafe(self, events: list[WatchEvent]) -> None:
        loop = self._loop
        if loop is not None and self._watchers and events:
            loop.call_soon_threadsafe(self._publish_all, events)

    def _publish_all(self, events: list[WatchEvent]) -> None:
        for event in events:
            for watcher in list(self._watchers):
                if event.key.startswith(watcher.prefix):
                    watcher.queue.put_nowait(event)

    # --- the interface -------------------------------------------------------------------------
    async def get(self, key: str) -> KeyValue | None:
        return await self._call(lambda: self._row(key))

    async def range(self, prefix: str) -> RangeResult:
        return await self._call(lambda: self._range(prefix))

    async def put(self, key: str, value: bytes) -> int:
        _, revision, _ = await self._call(lambda: self._write(key, value, None))
        return revision

    async def delete(self, key: str) -> int | None:
        changed, revision, _ = await self._call(lambda: self._write(key, None, None))
        return revision if changed else None

    async def compare_and_put(self, key: str, value: bytes, expected_mod_revision: int) -> CasResult:
        changed, revision, current = await self._call(lambda: self._write(key, value, expected_mod_revision))
        return CasResult(changed, revision, current)

    async def txn(self, compares: Sequence[TxnCompare], writes: Sequence[TxnWrite]) -> TxnResult:
        check_txn(compares, writes)
        compares, writes = tuple(compares), tuple(writes)
        return await self._call(lambda: self._txn(compares, writes))

    async def compact(self, revision: int) -> None:
        await self._call(lambda: self._compact(revision))

    async def watch(self, prefix: str, from_revision: int) -> AsyncIterator[WatchItem]:
        watcher = _Watcher(prefix)
        self._watchers.add(watcher)  # before reading the history: nothing committed meanwhile is lost
        try:
            events, revision, compacted = await self._call(lambda: self._history(prefix, from_revision))
            last = from_revision - 1
            if from_revision < compacted:
                snapshot = await self._call(lambda: self._range(prefix))
                yield Resync(snapshot.revision, snapshot.items)
                last = snapshot.revision
            else:
                for event in events:
                    yield event
                last = max(last, revision)
            while True:
                item = await watcher.queue.get()
                if item is None:
                    return
                if item.mod_revision > last:
                    last = item.mod_revision
                    yield item
        finally:
            self._watchers.discard(watcher)


class _Watcher:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.queue: asyncio.Queue[WatchEvent | None] = asyncio.Queue()

    def close(self) -> None:
        self.queue.put_nowait(None)
