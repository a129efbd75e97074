"""The CP store interface: typed keyspaces, revisioned writes, resumable watches, local views.

The CP half of Shoal (persistent instances, service and cluster metadata, operators' edits of
ephemeral instances, namespaces, users, roles, permissions, the cluster's token key) lives in a
linearizable key-value store with a single global revision counter, modelled on etcd v3:

* every successful write returns the store's **revision** after it; revisions only grow;
* :meth:`CpStore.compare_and_put` is the conditional write of one key: ``expected_mod_revision=0``
  means *create if absent* (the cluster-wide token key, a namespace id), a positive value
  means *replace only if nobody wrote it since I read it* (optimistic updates of metadata);
* :meth:`CpStore.txn` writes several keys all or none: every compare holds and every put and
  delete is applied in one step, or nothing is (etcd's ``Txn``; at most :data:`MAX_TXN_OPS`
  compares and as many writes, etcd's default ``--max-txn-ops``);
* :meth:`CpStore.watch` streams every change under a prefix from a revision on. It resumes
  by itself after a lost connection (from the last revision it delivered) and, when the
  history it needs was compacted away, re-reads the prefix and yields one :class:`Resync`
  carrying the whole current content before it continues with ordinary events;
* a :class:`CpView` keeps an in-memory dict of one keyspace fed by such a watch, so reads
  are local (and keep working when the store is unreachable) while writes go to the store.

Writes raise :class:`shoal.errors.CpUnavailable` when the store has no quorum or no
reachable endpoint; views go on answering from memory meanwhile.

Keys are ``/shoal/v1/<keyspace>/<name>`` (see :class:`Keyspace`); values are bytes, by
convention UTF-8 JSON documents (:func:`json_codec`). Implementations: ``embedded.py``
(SQLite, standalone node) and ``etcd.py`` (an etcd v3 cluster).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import weakref
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Generic, Protocol, TypeVar

from shoal.errors import CpUnavailable, NacosError

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Every key of the store starts with this; the version lets a later layout live beside it.
ROOT = "/shoal/v1/"

#: The most compares, and the most writes, one :meth:`CpStore.txn` may hold: etcd's default
#: ``--max-txn-ops``, which an external cluster may keep, so both stores take no more.
MAX_TXN_OPS = 128


class Keyspace(StrEnum):
    """The typed keyspaces of the CP store; each is one key prefix."""

    INSTANCES = "instances"      # persistent instances: <namespace>/<group>@@<service>/<cluster>/<ip>:<port>
    SERVICES = "services"        # service and cluster metadata: <namespace>/<group>@@<service>
    NAMESPACES = "namespaces"    # <namespace id>
    USERS = "users"              # <username>
    ROLES = "roles"              # <role>/<username>
    PERMISSIONS = "permissions"  # <role>/<resource>/<action>
    META = "meta"                # cluster-wide singletons (e.g. token-secret-key)
    LOCKS = "locks"              # the lock module's locks: <lockType>/<key> (service_layer/lock.py)
    #: operators' edits of ephemeral instances (service_layer/overlays.py):
    #: <namespace>/<group>@@<service>/<cluster>/<ip>:<port>
    INSTANCE_EDITS = "instance-edits"

    @property
    def prefix(self) -> str:
        """The key prefix of this keyspace, ending in ``/``."""
        return f"{ROOT}{self.value}/"

    def key(self, name: str) -> str:
        """The full key of ``name`` in this keyspace."""
        if not name:
            raise ValueError("a CP key name must not be empty")
        return self.prefix + name

    def name_of(self, key: str) -> str:
        """The name part of a full key of this keyspace."""
        if not key.startswith(self.prefix):
            raise ValueError(f"{key!r} is not in keyspace {self.value}")
        return key[len(self.prefix):]


@dataclass(frozen=True, slots=True)
class KeyValue:
    """One stored key with its revisions (etcd's mvccpb.KeyValue)."""

    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int


@dataclass(frozen=True, slots=True)
class RangeResult:
    """A consistent read of a prefix: its keys at ``revision``."""

    revision: int
    items: tuple[KeyValue, ...]


@dataclass(frozen=True, slots=True)
class CasResult:
    """The outcome of :meth:`CpStore.compare_and_put`.

    ``succeeded``: the value was written; ``revision``: the store revision after the call;
    ``current``: the key as it now is (the caller's value on success, the winner's otherwise;
    None if the key is absent).
    """

    succeeded: bool
    revision: int
    current: KeyValue | None


@dataclass(frozen=True, slots=True)
class TxnCompare:
    """A condition of :meth:`CpStore.txn`: ``key``'s mod revision is ``mod_revision`` (0 = absent)."""

    key: str
    mod_revision: int


@dataclass(frozen=True, slots=True)
class TxnWrite:
    """A write of :meth:`CpStore.txn`: put ``value``, or delete the key when ``value`` is None."""

    key: str
    value: bytes | None


@dataclass(frozen=True, slots=True)
class TxnResult:
    """The outcome of :meth:`CpStore.txn`.

    ``succeeded``: every compare held and every write was applied (else none was);
    ``changed``: the writes changed something (a delete of an absent key changes nothing), so
    watchers see them at or before ``revision``, the store revision after the call;
    ``current``: when it failed, each compared key as it now is (None if absent), in the
    order of the compares; empty on success.
    """

    succeeded: bool
    changed: bool
    revision: int
    current: tuple[KeyValue | None, ...] = ()


def check_txn(compares: Sequence[TxnCompare], writes: Sequence[TxnWrite]) -> None:
    """The rules both stores apply to a txn (etcd's): at most :data:`MAX_TXN_OPS` compares and
    writes, no key written twice. A breach is the caller's bug: ValueError."""
    if len(compares) > MAX_TXN_OPS or len(writes) > MAX_TXN_OPS:
        raise ValueError(f"a CP txn holds at most {MAX_TXN_OPS} compares and {MAX_TXN_OPS} writes "
                         f"(got {len(compares)} and {len(writes)})")
    if len({w.key for w in writes}) != len(writes):
        raise ValueError("a CP txn writes each key at most once")


class EventKind(StrEnum):
    """What happened to a key."""

    PUT = "PUT"
    DELETE = "DELETE"


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One change of one key; ``value`` is empty for a delete."""

    kind: EventKind
    key: str
    value: bytes
    mod_revision: int


@dataclass(frozen=True, slots=True)
class Resync:
    """The watched history was compacted (or could not be resumed): here is the whole prefix
    at ``revision``; the consumer replaces what it holds and goes on from there."""

    revision: int
    items: tuple[KeyValue, ...]


#: What a watch yields.
WatchItem = WatchEvent | Resync


class SiblingViews(Protocol):
    """What a CP write waits for once this process's view shows it: on a worker of a node of several
    (docs/workers.md), until every sibling worker's view of ``keyspace`` reached ``revision``
    (``shoal.distro.barrier.SiblingCatchUp``, set on the store by ``app.py``). Something to await,
    or None to answer at once; the wait never raises and is bounded."""

    def __call__(self, keyspace: Keyspace, revision: int) -> Awaitable[None] | None: ...


class CpStore(ABC):
    """A linearizable, revisioned key-value store (the CP store of a node).

    Every coroutine may raise :class:`~shoal.errors.CpUnavailable` (no quorum, no endpoint, timed out);
    :meth:`watch` never does: it retries with back-off until cancelled.
    """

    #: A short name for logs and metrics (``embedded``, ``etcd``).
    kind: str = "cp"

    def __init__(self, siblings: SiblingViews | None = None) -> None:
        #: the views of this process over this store (:meth:`catch_up` waits for them)
        self.views: list[CpView[Any]] = []
        #: what a write of one of them waits for after the view shows it (None: nothing)
        self.siblings = siblings

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Open connections/files; called once before any other call."""

    async def refresh(self) -> None:  # noqa: B027 - optional hook
        """Hand the watchers what other processes wrote, now (the embedded store polls its file; a
        store whose watches are pushed has nothing to do)."""

    async def catch_up(self, keyspace: Keyspace, revision: int, timeout_s: float) -> bool:
        """Wait until every started view of ``keyspace`` in this process reflects ``revision`` (a
        sibling worker's write: :data:`shoal.distro.barrier.CP_CATCH_UP_REQUEST`); False when one
        has not within ``timeout_s``."""
        views = [v for v in self.views if v.keyspace is keyspace and v.started and v.revision < revision]
        if not views:
            return True
        try:
            async with asyncio.timeout(timeout_s):
                with contextlib.suppress(CpUnavailable):  # the views may still get there by their watch
                    await self.refresh()
                for view in views:
                    await view.wait_revision(revision)
        except TimeoutError:
            return False
        return True

    @abstractmethod
    async def close(self) -> None:
        """Release everything; running watches end."""

    @abstractmethod
    async def get(self, key: str) -> KeyValue | None:
        """The current value of ``key`` (a linearizable read), or None."""

    @abstractmethod
    async def range(self, prefix: str) -> RangeResult:
        """Every key starting with ``prefix`` and the revision they were read at."""

    @abstractmethod
    async def put(self, key: str, value: bytes) -> int:
        """Write ``key``; returns the revision of the write."""

    @abstractmethod
    async def delete(self, key: str) -> int | None:
        """Delete ``key``; returns the revision of the delete, or None if it did not exist."""

    @abstractmethod
    async def compare_and_put(self, key: str, value: bytes, expected_mod_revision: int) -> CasResult:
        """Write ``key`` only if its mod revision is ``expected_mod_revision`` (0 = absent)."""

    async def create(self, key: str, value: bytes) -> CasResult:
        """Create ``key`` if absent (``compare_and_put(key, value, 0)``)."""
        return await self.compare_and_put(key, value, 0)

    @abstractmethod
    async def txn(self, compares: Sequence[TxnCompare], writes: Sequence[TxnWrite]) -> TxnResult:
        """Apply every write if every compare holds, as one change no reader or watcher sees
        half of; else write nothing and report the compared keys as they are (see
        :func:`check_txn` for the limits). An error (CpUnavailable) means nothing was written,
        or, when it says so, that the whole txn may or may not have been applied: never part."""

    @abstractmethod
    async def compact(self, revision: int) -> None:
        """Drop the history before ``revision``; watches needing it get a :class:`Resync`."""

    @abstractmethod
    def watch(self, prefix: str, from_revision: int) -> AsyncIterator[WatchItem]:
        """Every change under ``prefix`` with revision >= ``from_revision``, in order, forever.

        Resumes after reconnects from the last delivered revision + 1; if that history was
        compacted, yields a :class:`Resync` of the prefix and continues after it.
        """


@dataclass(frozen=True, slots=True)
class ViewTxnOutcome(Generic[T]):
    """The outcome of :meth:`CpView.transact`: ``succeeded``, and when it did not, each compared
    name's ``(mod revision, value)`` as the store now has it (``(0, None)``: absent)."""

    succeeded: bool
    current: Mapping[str, tuple[int, T | None]]


#: A CP store the views cannot reach for this long is worth a WARNING; shorter (a managed etcd
#: member starting with its node) it is said once at INFO.
OUTAGE_WARN_AFTER_S = 10.0


class _Outage:
    """What the views of one store say while it cannot be reached: the first failure once at INFO
    (a node's eight views all fail together while its etcd member starts), a WARNING once if it
    lasts :data:`OUTAGE_WARN_AFTER_S`, the rest at DEBUG, and an INFO when every view reads again."""

    _of: weakref.WeakKeyDictionary[CpStore, _Outage] = weakref.WeakKeyDictionary()

    def __init__(self) -> None:
        self.since: float | None = None
        self.warned = False
        self.waiting: set[str] = set()

    @classmethod
    def of(cls, store: CpStore) -> _Outage:
        outage = cls._of.get(store)
        if outage is None:
            outage = cls._of[store] = cls()
        return outage

    def failed(self, view: str, exc: NacosError, retry_s: float) -> None:
        now = asyncio.get_running_loop().time()
        self.waiting.add(view)
        if self.since is None:
            self.since = now
            log.info("CP store not readable yet (%s); the CP views retry every %.1f s", exc, retry_s)
        elif not self.warned and now - self.since >= OUTAGE_WARN_AFTER_S:
            self.warned = True
            log.warning("CP store not readable for %.0f s (%s); waiting: %s", now - self.since, exc,
                        ", ".join(sorted(self.waiting)))
        else:
            log.debug("CP view %s: %s; retrying in %.1f s", view, exc, retry_s)

    def recovered(self, view: str) -> None:
        self.waiting.discard(view)
        if self.since is not None and not self.waiting:
            log.info("CP store readable after %.1f s", asyncio.get_running_loop().time() - self.since)
            self.since, self.warned = None, False


class CpView(Generic[T]):
    """The in-memory view of one keyspace: reads are local dict lookups, fed by a watch.

    ``decode`` turns stored bytes into ``T`` (a bad value is logged and skipped, never fatal).
    Listeners registered with :meth:`subscribe` are called on the loop with
    ``(name, old, new)`` for every change (``None`` for absent), after the dict is updated;
    a :class:`Resync` calls them for each name whose value actually changed.
    Writes go through the store; :meth:`put`/:meth:`delete`/:meth:`create` wait until the
    view has caught up with their revision, so a caller reads its own writes (for at most
    ``catch_up_timeout_ms``: past it the write, already stored, returns and the view lags).
    """

    def __init__(self, store: CpStore, keyspace: Keyspace, decode: Callable[[bytes], T],
                 encode: Callable[[T], bytes], retry_delay_ms: int = 500, catch_up_timeout_ms: int = 15_000) -> None:
        self.store = store
        self.keyspace = keyspace
        self._decode = decode
        self._encode = encode
        self._retry_delay_s = retry_delay_ms / 1000
        self._catch_up_timeout_s = catch_up_timeout_ms / 1000
        self._items: dict[str, T] = {}
        self._mod: dict[str, int] = {}
        self._revision = 0
        self._revision_changed = asyncio.Event()
        self._ready = asyncio.Event()
        self._listeners: list[Callable[[str, T | None, T | None], None]] = []
        self._task: asyncio.Task[None] | None = None
        store.views.append(self)

    # --- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Start filling the view in the background (see :meth:`wait_ready`)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"cp-view-{self.keyspace.value}")

    async def wait_ready(self, timeout_s: float | None = None) -> None:
        """Wait until the first full read has been applied."""
        async with asyncio.timeout(timeout_s):
            await self._ready.wait()

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    # --- local reads -------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    @property
    def started(self) -> bool:
        """Whether the view is being fed (a view never started serves no reads)."""
        return self._task is not None

    @property
    def revision(self) -> int:
        """The store revision this view reflects."""
        return self._revision

    def get(self, name: str) -> T | None:
        return self._items.get(name)

    def mod_revision(self, name: str) -> int:
        """The mod revision of ``name`` as the view knows it (0 = absent): the CAS token."""
        return self._mod.get(name, 0)

    def items(self) -> Iterator[tuple[str, T]]:
        return iter(list(self._items.items()))

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def subscribe(self, listener: Callable[[str, T | None, T | None], None]) -> None:
        self._listeners.append(listener)

    async def wait_revision(self, revision: int, timeout_s: float | None = None) -> None:
        """Wait until the view reflects at least ``revision``."""
        async with asyncio.timeout(timeout_s):
            while self._revision < revision:
                self._revision_changed.clear()
                await self._revision_changed.wait()

    # --- writes (to the store; read-your-writes through the view) ---------------------------
    async def put(self, name: str, value: T) -> int:
        revision = await self.store.put(self.keyspace.key(name), self._encode(value))
        await self._catch_up(revision)
        return revision

    async def create(self, name: str, value: T) -> bool:
        """Create ``name`` if absent; True if this call created it."""
        return await self.compare_and_put(name, value, 0)

    async def compare_and_put(self, name: str, value: T, expected_mod_revision: int) -> bool:
        result = await self.store.compare_and_put(self.keyspace.key(name), self._encode(value),
                                                  expected_mod_revision)
        # On failure the store's revision may come from another keyspace, which this view never
        # sees: wait for the winning write instead.
        if result.current is not None:
            await self._catch_up(result.current.mod_revision)
        return result.succeeded

    async def delete(self, name: str) -> bool:
        revision = await self.store.delete(self.keyspace.key(name))
        if revision is None:
            return False
        await self._catch_up(revision)
        return True

    async def transact(self, compares: Mapping[str, int], writes: Mapping[str, T | None]) -> ViewTxnOutcome[T]:
        """Write every name of ``writes`` (a value, or None to delete it) if every name of
        ``compares`` still has that mod revision (0 = absent): all or nothing, one
        :meth:`CpStore.txn`. On success the view has caught up with the writes (as :meth:`put`)."""
        names = list(compares)
        result = await self.store.txn(
            [TxnCompare(self.keyspace.key(name), compares[name]) for name in names],
            [TxnWrite(self.keyspace.key(name), None if value is None else self._encode(value))
             for name, value in writes.items()])
        if result.succeeded:
            if result.changed:
                await self._catch_up(result.revision)
            return ViewTxnOutcome(True, {})
        current: dict[str, tuple[int, T | None]] = {}
        for name, kv in zip(names, result.current, strict=True):
            current[name] = (0, None) if kv is None else (kv.mod_revision, self._decoded(kv.key, kv.value))
        return ViewTxnOutcome(False, current)

    async def _catch_up(self, revision: int) -> None:
        """Wait for the view to show a write of this node, bounded: the write is in the store
        either way, so a view held up (its watch re-homing) must not hold the caller forever.
        Then, on a worker, for the sibling workers' views (:class:`SiblingViews`, bounded too)."""
        if self._task is None:
            return
        try:
            await self.wait_revision(revision, self._catch_up_timeout_s)
        except TimeoutError:
            log.warning("CP view %s: revision %d not seen within %g s (the write is stored; the view lags)",
                        self.keyspace.value, revision, self._catch_up_timeout_s)
        siblings = self.store.siblings
        wait = siblings(self.keyspace, revision) if siblings is not None else None
        if wait is not None:
            await wait

    # --- feeding ---------------------------------------------------------------------------
    async def _run(self) -> None:
        outage = _Outage.of(self.store)
        while True:
            try:
                if not self._ready.is_set():
                    snapshot = await self.store.range(self.keyspace.prefix)
                    self._apply_resync(Resync(snapshot.revision, snapshot.items))
                    self._ready.set()
                    outage.recovered(self.keyspace.value)
                async for item in self.store.watch(self.keyspace.prefix, self._revision + 1):
                    outage.recovered(self.keyspace.value)  # read again after a failed watch
                    if isinstance(item, Resync):
                        self._apply_resync(item)
                    else:
                        self._apply_event(item)
                return  # the store was closed
            except NacosError as exc:  # CpUnavailable, or a refusal such as bad credentials
                outage.failed(self.keyspace.value, exc, self._retry_delay_s)
                await asyncio.sleep(self._retry_delay_s)

    def _decoded(self, key: str, raw: bytes) -> T | None:
        try:
            return self._decode(raw)
        except Exception:
            log.error("CP view %s: undecodable value at %s; ignored", self.keyspace.value, key)
            return None

    def _apply_event(self, event: WatchEvent) -> None:
        name = self.keyspace.name_of(event.key)
        old = self._items.get(name)
        new: T | None = None
        if event.kind is EventKind.PUT:
            new = self._decoded(event.key, event.value)
        if new is None:
            self._items.pop(name, None)
            self._mod.pop(name, None)
        else:
            self._items[name] = new
            self._mod[name] = event.mod_revision
        self._set_revision(event.mod_revision)
        if old is not None or new is not None:
            self._notify(name, old, new)

    def _apply_resync(self, resync: Resync) -> None:
        fresh: dict[str, T] = {}
        mods: dict[str, int] = {}
        for kv in resync.items:
            value = self._decoded(kv.key, kv.value)
            if value is not None:
                name = self.keyspace.name_of(kv.key)
                fresh[name] = value
                mods[name] = kv.mod_revision
        old_items, old_mods = self._items, self._mod
        self._items, self._mod = fresh, mods
        self._set_revision(resync.revision)
        for name in old_items.keys() | fresh.keys():
            if old_mods.get(name) != mods.get(name):
                self._notify(name, old_items.get(name), fresh.get(name))

    def _set_revision(self, revision: int) -> None:
        if revision > self._revision:
            self._revision = revision
            self._revision_changed.set()

    def _notify(self, name: str, old: T | None, new: T | None) -> None:
        for listener in self._listeners:
            try:
                listener(name, old, new)
            except Exception:
                log.exception("CP view %s: a listener failed on %s", self.keyspace.value, name)


def json_codec() -> tuple[Callable[[bytes], Any], Callable[[Any], bytes]]:
    """(decode, encode) for UTF-8 JSON documents, the values' usual format."""

    def decode(raw: bytes) -> Any:
        return json.loads(raw)

    def encode(value: Any) -> bytes:
        return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()

    return decode, encode


def json_view(store: CpStore, keyspace: Keyspace) -> CpView[Any]:
    """A view of ``keyspace`` whose values are JSON documents."""
    decode, encode = json_codec()
    return CpView(store, keyspace, decode, encode)


def prefix_end(prefix: bytes) -> bytes:
    """The smallest key greater than every key starting with ``prefix`` (etcd's range_end)."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"  # every key
