"""Verify's bucket digests, kept up to date on change instead of recomputed each round.

Each client's digest term (:func:`digest_term`) is added to its group's bucket sums when it
appears or changes and subtracted when it changes again or is released, so a round costs
O(buckets), not O(clients). A group is this node's own responsible clients (:data:`SELF`, the
owner's side) or the copies held for one owner (the receiver's side). Sums are kept at
:data:`~shoal.kernels.verify_layout.MAX_BUCKETS` and folded to the round's bucket count, a power
of two. Renewal is lazy as well: the receiver stamps each agreeing (sub-)bucket with the round's
time and expiry reads a copy's renewal as the later of its own stamp and its bucket's.
"""

from __future__ import annotations

import asyncio
from array import array
from collections.abc import Callable, Collection, Iterable

from shoal.kernels import verify as kernel
from shoal.kernels.verify_layout import MAX_BUCKETS
from shoal.model.client import Client, ClientKind
from shoal.model.clients import ClientManager
from shoal.model.events import (
    ClientChanged,
    ClientConnected,
    ClientOwnershipChanged,
    ClientReleased,
    DistroSyncApplied,
    EventBus,
)

#: The group of this node's own responsible clients in a :class:`DigestIndex`.
SELF = ""
#: Clients handled between two yields to the event loop in the heavy steps.
CHUNK = 20_000

_MASK64 = 0xFFFFFFFFFFFFFFFF
_MASK32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B97F4A7C15


def digest_term(fnv: int, revision: int) -> int:
    """One client's contribution to its bucket digest (the verify kernel's contract)."""
    return kernel.splitmix64(fnv ^ ((revision * _GOLDEN) & _MASK64))


class _Slot:
    """The clients of one group in one of the MAX_BUCKETS slots, as parallel arrays."""

    __slots__ = ("fnvs", "ids", "terms")

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.fnvs: array[int] = array("Q")
        self.terms: array[int] = array("Q")


class DigestIndex:
    """Bucket digest sums of every group, kept up to date on change (see the module docstring).

    :meth:`subscribe` follows the model events; :meth:`touch` re-reads one client (Distro calls
    it where it changes ``owner`` or ``native`` itself), :meth:`touch_ip_port` re-reads every
    ip:port client (their responsibility moves with the member list). While :attr:`ready` is
    false (the snapshot load, a rebuild) the sums are incomplete and verify waits.
    """

    def __init__(self, clients: ClientManager, responsible: Callable[[Client], bool]) -> None:
        self.clients = clients
        self.responsible = responsible
        self.active = True
        self.ready = True
        self._entries: dict[str, tuple[str, int, int, int, int]] = {}  # id → (group, fnv, term, revision, position)
        self._sums: dict[str, list[int]] = {}
        self._slots: dict[str, list[_Slot]] = {}
        self._sub_stamps: dict[str, tuple[int, int, dict[int, list[int]]]] = {}  # group → (n, k, bucket → stamps)
        self._counts: dict[str, int] = {}
        self._ip_port: set[str] = set()
        self._stamps: dict[str, tuple[int, list[int]]] = {}  # group → (bucket count, renewed at)

    def subscribe(self, bus: EventBus) -> None:
        """Follow the model's client events."""
        bus.subscribe(ClientConnected, lambda e: self.touch(e.client))
        bus.subscribe(ClientChanged, lambda e: self.touch(e.client))
        bus.subscribe(ClientOwnershipChanged, lambda e: self.touch(e.client))
        bus.subscribe(ClientReleased, lambda e: self.drop(e.client.client_id))
        bus.subscribe(DistroSyncApplied, lambda e: self.touch_id(e.client_id))

    # --- upkeep ---------------------------------------------------------------------------
    def group_of(self, client: Client) -> str | None:
        """SELF for a client this node verifies to peers, the owner for a copy, else None."""
        if client.native:
            return SELF if self.responsible(client) else None
        return client.owner or None

    def touch(self, client: Client) -> None:
        """Bring one client's term up to date (O(1))."""
        if not self.active:
            return
        cid = client.client_id
        if client.kind is ClientKind.IP_PORT:
            self._ip_port.add(cid)
        group = self.group_of(client)
        old = self._entries.get(cid)
        if group is None:
            if old is not None:
                self._subtract(cid, old)
            return
        revision = client.revision
        if old is not None:
            if old[0] == group:
                if old[3] == revision:
                    return
                _, fnv, before, _, position = old  # same group, same slot: replace the term in place
                term = digest_term(fnv, revision)
                sums = self._sums[group]
                slot = fnv & (MAX_BUCKETS - 1)
                sums[slot] = (sums[slot] - before + term) & _MASK64
                self._slots[group][slot].terms[position] = term
                self._entries[cid] = (group, fnv, term, revision, position)
                return
            self._subtract(cid, old)
            fnv = old[1]
        else:
            fnv = kernel.fnv1a64(cid)
        term = digest_term(fnv, revision)
        if group not in self._sums:
            self._sums[group] = [0] * MAX_BUCKETS
            self._slots[group] = [_Slot() for _ in range(MAX_BUCKETS)]
            self._counts[group] = 0
        group_sums = self._sums[group]
        slot = fnv & (MAX_BUCKETS - 1)
        group_sums[slot] = (group_sums[slot] + term) & _MASK64
        held = self._slots[group][slot]
        self._entries[cid] = (group, fnv, term, revision, len(held.ids))
        held.ids.append(cid)
        held.fnvs.append(fnv)
        held.terms.append(term)
        self._counts[group] += 1

    def touch_id(self, client_id: str) -> None:
        """:meth:`touch` the client with this id, or :meth:`drop` it when it is gone."""
        client = self.clients.get(client_id)
        if client is None:
            self.drop(client_id)
        else:
            self.touch(client)

    def touch_ip_port(self) -> None:
        """Re-read every ip:port client (after the member list or the handoff moved them)."""
        for cid in list(self._ip_port):
            self.touch_id(cid)

    def drop(self, client_id: str) -> None:
        """Forget a released client."""
        self._ip_port.discard(client_id)
        old = self._entries.get(client_id)
        if old is not None:
            self._subtract(client_id, old)

    def _subtract(self, cid: str, old: tuple[str, int, int, int, int]) -> None:
        del self._entries[cid]
        group, fnv, term, _, position = old
        sums = self._sums[group]
        slot = fnv & (MAX_BUCKETS - 1)
        sums[slot] = (sums[slot] - term) & _MASK64
        held = self._slots[group][slot]
        last = len(held.ids) - 1
        if position != last:  # the last one takes the freed position
            moved = held.ids[position] = held.ids[last]
            held.fnvs[position] = held.fnvs[last]
            held.terms[position] = held.terms[last]
            self._entries[moved] = (*self._entries[moved][:4], position)
        held.ids.pop()
        held.fnvs.pop()
        held.terms.pop()
        self._counts[group] -= 1
        if not self._counts[group]:
            del self._sums[group], self._counts[group], self._slots[group]

    async def rebuild(self, chunk: int = CHUNK) -> None:
        """Recompute everything from the client manager, yielding to the loop between chunks.

        Changes made meanwhile are applied as they happen (touch is idempotent), so the result
        is exact; :attr:`ready` is false until it is done.
        """
        self.reset()
        try:
            ids = list(self.clients.clients)
            for start in range(0, len(ids), chunk):
                for cid in ids[start:start + chunk]:
                    self.touch_id(cid)
                await asyncio.sleep(0)
        finally:
            self.ready = True

    def reset(self) -> None:
        """Forget everything and start following changes again; not :attr:`ready` until rebuilt."""
        self.active = True
        self.ready = False
        self._entries.clear()
        self._sums.clear()
        self._counts.clear()
        self._slots.clear()
        self._ip_port.clear()
        self._stamps.clear()
        self._sub_stamps.clear()

    def rebuild_now(self) -> None:
        """:meth:`rebuild` without yielding (small managers, tests)."""
        self.reset()
        for client in list(self.clients):
            self.touch(client)
        self.ready = True

    # --- reading --------------------------------------------------------------------------
    def count(self, group: str) -> int:
        """Clients in ``group``."""
        return self._counts.get(group, 0)

    def digests(self, group: str, n: int) -> list[int]:
        """The group's ``n`` bucket digests (``n`` a power of two up to MAX_BUCKETS): O(MAX_BUCKETS)."""
        sums = self._sums.get(group)
        if sums is None:
            return [0] * n
        if n == MAX_BUCKETS:
            return list(sums)
        out = [0] * n
        mask = n - 1
        for slot, value in enumerate(sums):
            out[slot & mask] += value
        return [v & _MASK64 for v in out]

    def members(self, group: str, buckets: Iterable[int], n: int) -> tuple[list[str], array[int], array[int]]:
        """(ids, fnvs, terms) of the group's clients in ``buckets`` of ``n`` (a power of two):
        copied from the slots of those buckets, no scan of the others."""
        ids: list[str] = []
        fnvs: array[int] = array("Q")
        terms: array[int] = array("Q")
        slots = self._slots.get(group)
        if slots is not None:
            for b in buckets:
                for slot in range(b, MAX_BUCKETS, n):
                    held = slots[slot]
                    ids.extend(held.ids)
                    fnvs.extend(held.fnvs)
                    terms.extend(held.terms)
        return ids, fnvs, terms

    def group_members(self, group: str) -> list[tuple[str, int]]:
        """(id, fnv) of every client of ``group``."""
        return [(cid, e[1]) for cid, e in self._entries.items() if e[0] == group]

    def ip_port_members(self, group: str) -> list[tuple[str, int]]:
        """(id, fnv) of the group's ip:port clients."""
        out = []
        for cid in self._ip_port:
            entry = self._entries.get(cid)
            if entry is not None and entry[0] == group:
                out.append((cid, entry[1]))
        return out

    # --- lazy renewal ---------------------------------------------------------------------
    def stamp(self, group: str, n: int, mismatched: Collection[int], now_ms: int) -> None:
        """Every bucket of ``group`` but ``mismatched`` was verified at ``now_ms``."""
        current = self._stamps.get(group)
        stamps = current[1] if current is not None and current[0] == n else [0] * n
        skip = set(mismatched)
        for b in range(n):
            if b not in skip:
                stamps[b] = now_ms
        self._stamps[group] = (n, stamps)

    def stamp_subs(self, group: str, n: int, k: int, buckets: Iterable[int], mismatched: Collection[int],
                   now_ms: int) -> None:
        """Every sub-bucket of ``buckets`` but ``mismatched`` (sub ids) was verified at ``now_ms``."""
        bad = set(mismatched)
        per_bucket = {b: [0 if b * k + j in bad else now_ms for j in range(k)] for b in buckets}
        self._sub_stamps[group] = (n, k, per_bucket)

    def renewed_at(self, client: Client) -> int:
        """When the copy was last renewed: its own stamp, its verified bucket's or sub-bucket's."""
        own = client.last_renew_ms
        entry = self._entries.get(client.client_id)
        if client.native or entry is None or entry[0] != client.owner:
            return own
        fnv = entry[1]
        stamped = self._stamps.get(client.owner)
        if stamped is not None:
            own = max(own, stamped[1][fnv % stamped[0]])
        subs = self._sub_stamps.get(client.owner)
        if subs is not None:
            n, k, per_bucket = subs
            stamps = per_bucket.get(fnv % n)
            if stamps is not None:
                own = max(own, stamps[(fnv // n) % k])
        return own


async def detail_keys(fnvs: array[int], terms: array[int], n: int, k: int, salt: int) -> list[int]:
    """``sub << 32 | salted32(term)`` per client (verify kernel), in chunks between loop yields."""
    out: list[int] = []
    for start in range(0, len(fnvs), CHUNK * 5):
        out.extend(kernel.sub_keys(fnvs[start:start + CHUNK * 5], terms[start:start + CHUNK * 5], n, k, salt))
        await asyncio.sleep(0)
    return out


def sub_digests(keys: list[int], buckets: list[int], n: int, k: int) -> list[int]:
    """32-bit sums of the keys' values per sub-bucket, ``k`` per bucket in the order of ``buckets``."""
    sums = [0] * (n * k)
    for key in keys:
        sums[key >> 32] += key & _MASK32
    return [sums[b * k + j] & _MASK32 for b in buckets for j in range(k)]


def selected(keys: list[int], subs: Collection[int]) -> list[int]:
    """Positions of the keys that fall in ``subs``."""
    wanted = set(subs)
    return [i for i, key in enumerate(keys) if key >> 32 in wanted]
