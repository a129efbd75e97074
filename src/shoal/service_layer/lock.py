"""The lock module's use cases: Nacos 3.x distributed locks on the CP store (docs/protocol.md §9).

A lock is one document in the CP store's ``locks`` keyspace, named ``<lockType>/<key>`` (Nacos's
``LockKey`` is the pair, so two types never share a lock)::

    {"type": ..., "owner": ..., "holder": ..., "count": n, "expiresAt": <epoch ms>}

Every change is one :meth:`CpStore.txn` that compares the document's mod revision as it was read
(0: absent), so two nodes contending for one lock cannot both win: the loser's compare fails, it
reads again and finds the lock held. That is linearizable on both stores (etcd in a cluster, the
embedded SQLite store standalone).

**Expiry** is Nacos's: the acquire stamps ``expiresAt`` = now + ``expiredTime`` (negative:
``nacos.lock.default_expire_time``; capped by ``nacos.lock.max_expire_time``), and a lock whose
stamp has passed is free: the next acquire overwrites it, a release finds nothing to release.
Nacos's ``MutexAtomicLock`` decides the same way on the node that applies the raft log, with its
wall clock; here the node that serves the request decides, so the members' clocks must agree to
well within the expiries used (NTP). :meth:`LockService.sweep` deletes expired documents nobody
touched again.

**Holders.** Each lock records the node-qualified id of the connection that took it. When that
connection closes, this node releases every lock it still holds (:meth:`release_holder`), so a
crashed client does not keep its locks until they expire; a crashed node's locks expire.

**Types** (Nacos 3.3, issue alibaba/nacos#15279):

* ``NACOS_LOCK`` — Nacos's mutex (``MutexAtomicLock``): not re-entrant; any caller's release
  frees it, as in Nacos, where the mutex tracks no owner.
* ``NON_REENTRANT`` — one owner; a second acquire, even by the owner, fails; only the owner
  releases it.
* ``REENTRANT`` — one owner, who may acquire it again (each acquire counts and renews the
  expiry) and must release it as many times.

The owner is ``params.owner`` (the 3.3 SDK's ``clientId:threadId``), or ``owner`` beside
``key``, else the connection.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shoal.cp.store import CpStore, Keyspace, KeyValue, TxnCompare, TxnWrite
from shoal.errors import CpUnavailable, InvalidParam

log = logging.getLogger(__name__)

#: Nacos's mutex type (``LockConstants.NACOS_LOCK_TYPE``) and the two 3.3 types.
NACOS_LOCK = "NACOS_LOCK"
REENTRANT = "REENTRANT"
NON_REENTRANT = "NON_REENTRANT"
LOCK_TYPES = (NACOS_LOCK, REENTRANT, NON_REENTRANT)

#: The longest lock key accepted (bytes of UTF-8), far above any real one; bounds the store key.
MAX_KEY_BYTES = 1024
#: How often one acquire or release re-reads after losing a compare to a concurrent writer.
_ATTEMPTS = 5


@dataclass(frozen=True, slots=True)
class LockRequest:
    """One ``LockInstance`` of a request, checked: Nacos's ``LockInfo`` before its end time."""

    key: str
    lock_type: str
    expire_ms: int  # as sent: negative means the default
    owner: str  # empty: the holder (the connection) owns it

    @property
    def name(self) -> str:
        """The document's name in :attr:`Keyspace.LOCKS`."""
        return f"{self.lock_type}/{self.key}"


def check_lock(key: Any, lock_type: Any, expire_ms: Any, owner: Any) -> LockRequest:
    """The rules of a ``LockInstance`` (Nacos refuses a null key or type and unknown types)."""
    if not isinstance(key, str) or not key:
        raise InvalidParam("lockInstance.key must be a non-empty string")
    if len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
        raise InvalidParam(f"lockInstance.key is longer than {MAX_KEY_BYTES} bytes")
    if not isinstance(lock_type, str) or not lock_type:
        raise InvalidParam("lockInstance.lockType must be a non-empty string")
    if lock_type not in LOCK_TYPES:
        raise InvalidParam(f"lockType: {lock_type} is not exist.")
    if expire_ms is None:
        expire_ms = -1
    if isinstance(expire_ms, bool) or not isinstance(expire_ms, int):
        raise InvalidParam("lockInstance.expiredTime must be an integer (ms)")
    if owner is None:
        owner = ""
    if not isinstance(owner, str):
        raise InvalidParam("lockInstance owner must be a string")
    return LockRequest(key, lock_type, expire_ms, owner)


class LockService:
    """Acquire and release Nacos locks in the CP store (Nacos ``LockOperationServiceImpl`` with
    its ``LockManager``); see the module docstring for the rules."""

    def __init__(self, store: CpStore, node: str, now_ms: Callable[[], int], default_expire_ms: int,
                 max_expire_ms: int) -> None:
        self.store = store
        self.node = node
        self.now_ms = now_ms
        self.default_expire_ms = default_expire_ms
        self.max_expire_ms = max_expire_ms
        #: holder → names of the locks it took through this node and may still hold
        self.held: dict[str, set[str]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def holder_of(self, connection_id: str) -> str:
        """The holder id of a connection of this node (unique across the cluster)."""
        return f"{self.node}/{connection_id}"

    # --- use cases ------------------------------------------------------------------------
    async def acquire(self, req: LockRequest, holder: str) -> bool:
        """Take the lock (True) or find it held by someone else (False)."""
        owner = req.owner or holder
        key = Keyspace.LOCKS.key(req.name)
        for _ in range(_ATTEMPTS):
            kv = await self.store.get(key)
            doc = self._live(kv)
            now = self.now_ms()
            if doc is None:
                new = {"type": req.lock_type, "owner": owner, "holder": holder, "count": 1,
                       "expiresAt": now + self._expiry(req.expire_ms)}
            elif req.lock_type == REENTRANT and doc.get("owner") == owner:
                new = dict(doc, count=int(doc.get("count", 1)) + 1, holder=holder,
                           expiresAt=now + self._expiry(req.expire_ms))
            else:
                return False
            if await self._swap(key, kv, new):
                self.held.setdefault(holder, set()).add(req.name)
                return True
        return False

    async def release(self, req: LockRequest, holder: str) -> bool:
        """Release the lock: True when this call released (or, re-entrant, counted down) a live
        lock the caller may release; False when it was free, expired or someone else's."""
        owner = req.owner or holder
        key = Keyspace.LOCKS.key(req.name)
        for _ in range(_ATTEMPTS):
            kv = await self.store.get(key)
            doc = self._live(kv)
            if kv is None:
                return False
            if doc is None:  # expired: nothing to release; drop the stale document
                await self._swap(key, kv, None)
                return False
            if req.lock_type != NACOS_LOCK and doc.get("owner") != owner:
                return False
            count = int(doc.get("count", 1))
            new = dict(doc, count=count - 1) if req.lock_type == REENTRANT and count > 1 else None
            if await self._swap(key, kv, new):
                if new is None:
                    self._forget(str(doc.get("holder", "")), req.name)
                return True
        return False

    def connection_closed(self, connection_id: str) -> None:
        """A connection of this node closed: release what it holds, in the background."""
        holder = self.holder_of(connection_id)
        names = self.held.pop(holder, None)
        if not names:
            return
        task = asyncio.get_running_loop().create_task(self.release_holder(holder, names),
                                                      name="lock-release-holder")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def release_holder(self, holder: str, names: set[str]) -> None:
        """Delete each of ``names`` still held by ``holder`` (compared: a lock taken over since
        stays with its new holder). The store being down leaves them to expire."""
        for name in sorted(names):
            key = Keyspace.LOCKS.key(name)
            try:
                kv = await self.store.get(key)
                if kv is not None and _decode(kv).get("holder") == holder:
                    await self._swap(key, kv, None)
            except Exception as exc:  # CpUnavailable and the like: the expiry releases it instead
                log.warning("lock %s of closed connection %s not released (%s); it expires instead",
                            name, holder, exc)

    async def sweep(self) -> None:
        """Delete expired lock documents (each compared, so a lock re-taken meanwhile stays)."""
        now = self.now_ms()
        try:
            result = await self.store.range(Keyspace.LOCKS.prefix)
            for kv in result.items:
                if int(_decode(kv).get("expiresAt", 0)) <= now:
                    await self._swap(kv.key, kv, None)
        except CpUnavailable as exc:
            log.warning("lock sweep skipped: %s", exc)

    async def stop(self, grace_s: float = 2.0) -> None:
        """Let the releases of connections closed by the shutdown finish (bounded), then cancel
        what is left: those locks expire instead."""
        tasks, self._tasks = set(self._tasks), set()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=grace_s)
            for task in pending:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    # --- helpers --------------------------------------------------------------------------
    def _expiry(self, expire_ms: int) -> int:
        """Nacos: a negative expiredTime takes the default, any other is capped by the maximum."""
        return self.default_expire_ms if expire_ms < 0 else min(self.max_expire_ms, expire_ms)

    def _live(self, kv: KeyValue | None) -> dict[str, Any] | None:
        """The lock document if the lock is held and not expired."""
        if kv is None:
            return None
        doc = _decode(kv)
        return doc if int(doc.get("expiresAt", 0)) > self.now_ms() else None

    async def _swap(self, key: str, kv: KeyValue | None, new: dict[str, Any] | None) -> bool:
        """Write (or, ``new`` None, delete) ``key`` if it is still as read: one compared txn."""
        result = await self.store.txn(
            [TxnCompare(key, kv.mod_revision if kv is not None else 0)],
            [TxnWrite(key, None if new is None else json.dumps(new, separators=(",", ":")).encode())])
        return result.succeeded

    def _forget(self, holder: str, name: str) -> None:
        names = self.held.get(holder)
        if names is not None:
            names.discard(name)
            if not names:
                del self.held[holder]


def _decode(kv: KeyValue) -> dict[str, Any]:
    """A stored lock document; one that is not a JSON object counts as expired (free)."""
    try:
        doc = json.loads(kv.value)
    except ValueError:
        doc = None
    return doc if isinstance(doc, dict) else {}
