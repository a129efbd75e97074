"""Revision verify with digests, both sides (Nacos DistroVerifyTimedTask, redesigned on the wire).

Nacos sends one VERIFY request per client per peer every 5 s. Here the owner sends each peer
one request carrying a 64-bit digest per bucket of its clients (verify kernel: FNV-1a bucket of
the id, order-independent sum of mixed (id, revision)), about 256 clients per bucket. The peer
compares with the digests of the copies it holds from that owner, renews every client in the
agreeing buckets and names the others. A round in which everything agrees is one small request
per peer whatever the client count. Semantics are Nacos's: same revision renews, missing or
different fails and is repaired; a copy the owner no longer has is left to expire.

**Digests are kept, not recomputed** (:class:`DigestIndex`): each client's digest term is added
to its group's bucket sums when it appears or changes and subtracted when it changes again or
is released, so a round costs O(buckets), not O(clients). A group is this node's own
responsible clients (the sender side) or the copies held for one owner (the receiver side).
Sums are kept at :data:`MAX_BUCKETS` and folded to the round's bucket count, a power of two.
Renewal is lazy as well: the receiver stamps each agreeing bucket with the round's time and
expiry reads a copy's renewal as the later of its own stamp and its bucket's.

**Detail phase** (mismatched buckets only), wire version :data:`VERSION`:

1. When the mismatched buckets hold many clients, the owner first sends ``k`` 32-bit
   sub-digests per mismatched bucket (sub-bucket ``(fnv // n) % k``; ``k`` from the estimated
   differences per bucket) and the peer names the mismatched sub-buckets;
2. the owner sends, per named (sub-)bucket, the 32-bit values of its clients; the peer builds
   sorted 64-bit keys ``sub-bucket << 32 | value`` (:func:`shoal.kernels.verify.sub_keys`) for
   both sides and diffs them with the verify kernel (:func:`shoal.kernels.verify.diff_sorted`).
   It renews the clients that match and answers the owner's keys it lacks; the owner re-sends
   exactly those clients (ADD, no delay).

Sub-digests and values are salted per round, so a 32-bit collision can hide a difference for
one round at most. Heavy steps yield to the event loop
every :data:`CHUNK` clients.

:class:`VerifySender` is the owner's side (one round every ``verify.intervalMs``, repairs go
through the sync engine); :class:`VerifyReceiver` is the peer's side.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import random
import struct
from array import array
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from shoal.clock import Clock
from shoal.config import Config
from shoal.distro import records
from shoal.distro.members import MemberManager, failure_text
from shoal.distro.sync import SyncEngine
from shoal.distro.transport import PeerError, PeerTransport, PeerUnavailable
from shoal.kernels import verify as kernel
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

log = logging.getLogger(__name__)

#: Wire version of every verify request; all nodes of a cluster run the same one.
VERSION = 2
CLIENTS_PER_BUCKET = 256
#: Bucket counts are powers of two up to this, so the kept sums fold to any of them.
MAX_BUCKETS = 4096
#: At most this many sub-buckets per mismatched bucket.
MAX_SUB_BUCKETS = 256
#: The sub-digest step is skipped while the values of the mismatched buckets fit in this.
DIRECT_DETAIL_BYTES = 64 * 1024
#: Clients handled between two yields to the event loop in the detail phase.
CHUNK = 20_000
DIGEST_REQUEST = "DistroVerifyRequest"
DIGEST_RESPONSE = "DistroVerifyResponse"
SUB_REQUEST = "DistroVerifySubDigestRequest"
SUB_RESPONSE = "DistroVerifySubDigestResponse"
DETAIL_REQUEST = "DistroVerifyDetailRequest"
DETAIL_RESPONSE = "DistroVerifyDetailResponse"
#: The digest answer of a peer that is still loading its snapshot.
LOADING_ANSWER = b'{"v":%d,"loading":true}\n' % VERSION
#: The group of this node's own responsible clients in a :class:`DigestIndex`.
SELF = ""

_MASK64 = 0xFFFFFFFFFFFFFFFF
_MASK32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B97F4A7C15


def bucket_count(n_clients: int) -> int:
    """Buckets for ``n_clients``: the power of two nearest above n / CLIENTS_PER_BUCKET, 1..MAX_BUCKETS."""
    want = -(-n_clients // CLIENTS_PER_BUCKET)
    n = 1
    while n < want and n < MAX_BUCKETS:
        n *= 2
    return n


def digest_term(fnv: int, revision: int) -> int:
    """One client's contribution to its bucket digest (the verify kernel's contract)."""
    return kernel.splitmix64(fnv ^ ((revision * _GOLDEN) & _MASK64))


def _header(body: bytes, what: str) -> tuple[dict[str, object], bytes]:
    head, sep, rest = body.partition(b"\n")
    if not sep:
        raise ValueError(f"{what} has no header line")
    header = json.loads(head)
    if not isinstance(header, dict) or header.get("v") != VERSION:
        raise ValueError(f"{what} has verify wire version {header.get('v') if isinstance(header, dict) else None}, "
                         f"this node speaks {VERSION}")
    return header, rest


def _packed(header: dict[str, object], fmt: str, values: Collection[int]) -> bytes:
    return (json.dumps({"v": VERSION, **header}, separators=(",", ":")).encode() + b"\n"
            + struct.pack(f"<{len(values)}{fmt}", *values))


def _unpack(fmt: str, packed: bytes, count: int, what: str) -> tuple[int, ...]:
    if len(packed) != struct.calcsize(fmt) * count:
        raise ValueError(f"{what}: {len(packed)} bytes do not hold {count} values")
    return struct.unpack(f"<{count}{fmt}", packed)


def _power_of_two(n: object, limit: int, what: str) -> int:
    if not isinstance(n, int) or n < 1 or n > limit or n & (n - 1):
        raise ValueError(f"{what} must be a power of two in 1..{limit}, got {n!r}")
    return n


def bitmap(flags: list[bool]) -> bytes:
    """Little-endian bit order: flag i is bit i % 8 of byte i // 8."""
    out = bytearray((len(flags) + 7) // 8)
    for i, flag in enumerate(flags):
        if flag:
            out[i >> 3] |= 1 << (i & 7)
    return bytes(out)


def bits_set(data: bytes, size: int) -> list[int]:
    """Positions below ``size`` whose bit is set in a :func:`bitmap`; ValueError on a wrong length."""
    if len(data) != (size + 7) // 8:
        raise ValueError(f"bitmap of {len(data)} bytes for {size} flags")
    return [i for i in range(size) if data[i >> 3] >> (i & 7) & 1]


def digest_body(digests: list[int], count: int) -> bytes:
    """JSON header line, then the bucket digests as little-endian uint64 (8 bytes each: at most
    32 KiB whatever the client count)."""
    return _packed({"buckets": len(digests), "count": count}, "Q", digests)


def digest_request(ids: list[str], revisions: list[int]) -> bytes:
    """The digest request of ``ids`` at ``revisions``, computed from scratch."""
    return digest_body(kernel.bucket_digests(ids, revisions, bucket_count(len(ids))), len(ids))


def parse_digest_request(body: bytes) -> tuple[int, list[int]]:
    """(bucket count, digests) of a digest request; ValueError when malformed or of another version."""
    header, packed = _header(body, "digest request")
    n = _power_of_two(header.get("buckets"), MAX_BUCKETS, "bucket count")
    return n, list(_unpack("Q", packed, n, "digest request"))


def sub_buckets_for(mismatched: int, n: int, count: int) -> int:
    """Sub-buckets per mismatched bucket: 1 (no sub-digest step) while the direct detail is small,
    else the power of two that minimises the estimated bytes of both steps — 4 per sub-digest,
    plus 6 per named sub-bucket and 4 per client in one, with the differences per bucket
    estimated from the share of mismatched buckets (Poisson)."""
    per_bucket = count / n
    if mismatched * per_bucket * 4 <= DIRECT_DETAIL_BYTES:
        return 1
    share = min(mismatched, n - 0.5) / n
    differences = max(-math.log(1 - share), 1.0)  # per mismatched-ish bucket

    def cost(k: int) -> float:
        named = mismatched * k * (1 - math.exp(-differences / k))
        return 4 * mismatched * k + named * (6 + 4 * per_bucket / k) + 4 * mismatched * differences

    best, k = 1, 2
    while k <= MAX_SUB_BUCKETS:
        if cost(k) < cost(best):
            best = k
        k *= 2
    return best


def sub_of(fnv: int, n: int, k: int) -> int:
    """Sub-bucket id ``bucket * k + (fnv // n) % k`` of a client hash (n, k powers of two)."""
    return (fnv % n) * k + (fnv // n) % k


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


def _selected(keys: list[int], subs: Collection[int]) -> list[int]:
    """Positions of the keys that fall in ``subs``."""
    wanted = set(subs)
    return [i for i, key in enumerate(keys) if key >> 32 in wanted]


class VerifyReceiver:
    """The peer side: compare, renew, name what must be re-sent.

    ``index`` is the node's :class:`DigestIndex`; without one the receiver keeps a private index
    rebuilt every round (O(clients), for tests and tools). ``renew_kinds`` limits the
    ``on_renew`` hook to those client kinds (None: every kind).
    """

    def __init__(self, clock: Clock, clients: ClientManager,
                 on_renew: Callable[[Client, int], object] | None = None,
                 is_loaded: Callable[[], bool] = lambda: True, index: DigestIndex | None = None,
                 renew_kinds: frozenset[ClientKind] | None = None) -> None:
        self.clock = clock
        self.clients = clients
        self.is_loaded = is_loaded
        self.on_renew = on_renew  # e.g. refresh an ip:port client's beat stamps, as Nacos does
        self.renew_kinds = renew_kinds
        self._private = index is None
        self.index = index if index is not None else DigestIndex(clients, lambda c: c.native)

    async def handle_digest(self, sender: str, body: bytes) -> tuple[str, bytes]:
        """Answer a DistroVerifyRequest."""
        return DIGEST_RESPONSE, self.on_digest(sender, body)

    async def handle_sub(self, sender: str, body: bytes) -> tuple[str, bytes]:
        """Answer a DistroVerifySubDigestRequest."""
        return SUB_RESPONSE, await self.on_sub(sender, body)

    async def handle_detail(self, sender: str, body: bytes) -> tuple[str, bytes]:
        """Answer a DistroVerifyDetailRequest."""
        return DETAIL_RESPONSE, await self.on_detail(sender, body)

    def on_digest(self, sender: str, body: bytes) -> bytes:
        """Renew the copies in agreeing buckets; name the mismatched buckets."""
        if not self.is_loaded() or not self.index.ready:  # half a snapshot would fail every bucket
            return LOADING_ANSWER
        n, theirs = parse_digest_request(body)
        if self._private:
            self.index.rebuild_now()
        mine = self.index.digests(sender, n)
        mismatched = [i for i in range(n) if mine[i] != theirs[i]]
        now = self.clock.monotonic_ms()
        self.index.stamp(sender, n, mismatched, now)
        if self.on_renew is not None:
            self._renew_hooked(sender, n, set(mismatched), now)
        bad = set(mismatched)
        return b'{"v":%d}\n' % VERSION + bitmap([i in bad for i in range(n)])

    def _renew_hooked(self, sender: str, n: int, mismatched: set[int], now: int) -> None:
        if self.renew_kinds == frozenset({ClientKind.IP_PORT}):
            candidates = self.index.ip_port_members(sender)
        else:
            candidates = [(c, e[1]) for c, e in self.index._entries.items() if e[0] == sender]
        for cid, fnv in candidates:
            client = self.clients.get(cid)
            if client is not None and fnv % n not in mismatched and (
                    self.renew_kinds is None or client.kind in self.renew_kinds):
                self._renew(client, now)

    async def on_sub(self, sender: str, body: bytes) -> bytes:
        """Our sub-digests of the named buckets against the owner's: the mismatched sub-bucket ids
        (packed uint32); the agreeing sub-buckets are stamped as renewed."""
        header, packed = _header(body, "sub-digest request")
        n = _power_of_two(header.get("buckets"), MAX_BUCKETS, "bucket count")
        k = _power_of_two(header.get("k"), MAX_SUB_BUCKETS, "sub-bucket count")
        buckets = sorted({int(b) for b in header["list"]})  # type: ignore[attr-defined]
        if any(not 0 <= b < n for b in buckets):
            raise ValueError("sub-digest request names a bucket out of range")
        salt = int(header["salt"])  # type: ignore[call-overload]
        theirs = _unpack("I", packed, len(buckets) * k, "sub-digest request")
        _, fnvs, terms = self.index.members(sender, buckets, n)
        mine = sub_digests(await detail_keys(fnvs, terms, n, k, salt), buckets, n, k)
        flags = [mine[i] != theirs[i] for i in range(len(mine))]
        mismatched = [buckets[i // k] * k + i % k for i, bad in enumerate(flags) if bad]
        self.index.stamp_subs(sender, n, k, buckets, mismatched, self.clock.monotonic_ms())
        return bitmap(flags)

    async def on_detail(self, sender: str, body: bytes) -> bytes:
        """The owner's keys of the named sub-buckets against ours: renew what matches, answer the
        positions (in the owner's order) of the keys we lack (missing here or another revision)."""
        header, packed = _header(body, "detail request")
        n = _power_of_two(header.get("buckets"), MAX_BUCKETS, "bucket count")
        k = _power_of_two(header.get("k"), MAX_SUB_BUCKETS, "sub-bucket count")
        count = int(header["subs"])  # type: ignore[call-overload]
        salt = int(header["salt"])  # type: ignore[call-overload]
        width = header.get("counts")
        if width not in ("H", "I"):
            raise ValueError(f"detail request counts of unknown width {width!r}")
        end = 4 * count + struct.calcsize(str(width)) * count
        subs = _unpack("I", packed[:4 * count], count, "detail request sub-buckets")
        counts = _unpack(str(width), packed[4 * count:end], count, "detail request counts")
        values = _unpack("I", packed[end:], sum(counts), "detail request values")
        if any(not 0 <= sub < n * k for sub in subs):
            raise ValueError("detail request names a sub-bucket out of range")
        theirs: array[int] = array("Q")
        at = 0
        for sub, held in zip(subs, counts, strict=True):
            high = sub << 32
            theirs.extend(high | v for v in values[at:at + held])
            at += held
        ids, fnvs, terms = self.index.members(sender, {sub // k for sub in subs}, n)
        keys = await detail_keys(fnvs, terms, n, k, salt)
        chosen = _selected(keys, subs)
        mine = array("Q", sorted(keys[i] for i in chosen))
        lacking, extra = kernel.diff_sorted(theirs, mine)  # ValueError if the owner's keys are unsorted
        unmatched = set(extra)
        now = self.clock.monotonic_ms()
        for i in chosen:
            if keys[i] not in unmatched:
                self._renew_id(ids[i], now)
        if extra:  # copies the owner no longer has (or holds at another revision): never deleted here
            log.debug("%d copies from %s differ from its clients; they are renewed only once re-sent",
                      len(extra), sender)
        wanted = set(lacking)
        positions = [p for p, key in enumerate(theirs) if key in wanted]  # theirs is in the owner's order
        return struct.pack(f"<{len(positions)}I", *positions)

    def _renew_id(self, client_id: str, now: int) -> None:
        client = self.clients.get(client_id)
        if client is not None:
            self.clients.renew(client, now)
            if self.on_renew is not None and (self.renew_kinds is None or client.kind in self.renew_kinds):
                self.on_renew(client, now)

    def _renew(self, client: Client, now: int) -> None:
        self.clients.renew(client, now)
        if self.on_renew is not None:
            self.on_renew(client, now)


@dataclass(frozen=True, slots=True)
class VerifyOutcome:
    """How the last verify with one peer ended, at ``time_ms`` (wall): ``ok`` (nothing differed),
    ``repaired`` (``resynced`` clients re-queued), ``partial`` (more differed than the queue had
    room for), ``skipped`` (the peer is still loading) or ``failed`` (``detail`` says why)."""

    time_ms: int
    result: str
    detail: str = ""
    mismatched: int = 0
    resynced: int = 0


class VerifyStats:
    """Counters of the owner's verify rounds (for describe(), metrics and tests)."""

    def __init__(self) -> None:
        self.rounds = 0
        self.requests = 0
        self.bytes_sent = 0
        self.resynced = 0
        self.last_round: dict[str, dict[str, int]] = {}
        #: The last verify with each peer (the cluster page's "last verify").
        self.last_outcome: dict[str, VerifyOutcome] = {}


@dataclass
class _PeerRound:
    """What one round did with one peer."""

    requests: int = 1
    bytes: int = 0
    answer_bytes: int = 0
    mismatched: int = 0
    sub_buckets: int = 1
    detail_clients: int = 0
    resynced: int = 0
    complete: bool = False
    skipped: bool = False
    failure: str = ""

    def outcome(self, time_ms: int) -> VerifyOutcome:
        """What the cluster page shows of this round with the peer."""
        if self.failure:
            result = "failed"
        elif self.skipped:
            result = "skipped"
        elif not self.complete:
            result = "partial"
        else:
            result = "repaired" if self.resynced else "ok"
        detail = self.failure or ("the peer is still loading its snapshot" if self.skipped else "")
        return VerifyOutcome(time_ms, result, detail, self.mismatched, self.resynced)

    def as_dict(self) -> dict[str, int]:
        return {"requests": self.requests, "bytes": self.bytes, "answer_bytes": self.answer_bytes,
                "mismatched": self.mismatched, "sub_buckets": self.sub_buckets,
                "detail_clients": self.detail_clients, "resynced": self.resynced}


class VerifySender:
    """The owner side: one verify round to every UP/SUSPICIOUS peer, repairs through the sync engine.

    A round with a peer that ends with every difference re-queued clears that peer's "needs
    full verify" mark (set while it was DOWN or its queue collapsed). Without an ``index`` the
    sender keeps a private one rebuilt every round (O(clients), for tests and tools).
    """

    def __init__(self, config: Config, clients: ClientManager, members: MemberManager,
                 responsible: Callable[[Client], bool], transport: PeerTransport, engine: SyncEngine,
                 is_loaded: Callable[[], bool], index: DigestIndex | None = None) -> None:
        self.config = config
        self.clients = clients
        self.members = members
        self.responsible = responsible
        self.transport = transport
        self.engine = engine
        self.is_loaded = is_loaded
        self._private = index is None
        self.index = index if index is not None else DigestIndex(clients, responsible)
        self.stats = VerifyStats()

    async def round(self) -> None:
        """One verify round to every UP/SUSPICIOUS peer (only after the initial load)."""
        if not self.is_loaded() or not self.members.is_clustered() or not self.index.ready:
            return
        if self._private:
            self.index.rebuild_now()
        count = self.index.count(SELF)
        n = bucket_count(count)
        body = digest_body(self.index.digests(SELF, n), count)
        healthy = set(self.members.healthy_addresses())
        peers = [m.address for m in self.members.peer_list() if m.address in healthy]
        self.stats.rounds += 1
        await asyncio.gather(*(self._verify_peer(p, n, count, body) for p in peers))

    async def _verify_peer(self, target: str, n: int, count: int, body: bytes) -> None:
        done = _PeerRound(bytes=len(body))
        attempt = self.members.attempt(target)
        try:
            await self._exchange(target, n, count, body, done)
        except (PeerUnavailable, TimeoutError) as exc:  # the transport logs the peer's state once
            log.debug("verify with %s failed: %s", target, exc)
            done.failure = failure_text("verify", exc)
            self.members.report_failed(target, refused=isinstance(exc, PeerUnavailable) and exc.refused,
                                       attempt=attempt, reason=done.failure)
        except (PeerError, ValueError, KeyError, struct.error) as exc:
            log.warning("verify with %s failed: %s", target, exc)
            done.failure = failure_text("verify", exc)
        if done.complete:
            queue = self.engine.queues.get(target)
            if queue is not None:
                queue.needs_full_verify = False
        self.stats.requests += done.requests
        self.stats.bytes_sent += done.bytes
        self.stats.resynced += done.resynced
        self.stats.last_round[target] = done.as_dict()
        self.stats.last_outcome[target] = done.outcome(self.members.now_ms())

    async def _call(self, target: str, kind: str, expect: str, body: bytes, done: _PeerRound) -> bytes:
        kind_back, answer = await self.transport.call(target, kind, body, self.config.verify_timeout_ms)
        if kind_back != expect:
            raise PeerError(f"{target} answered {kind_back}")
        done.answer_bytes += len(answer)
        return answer

    async def _exchange(self, target: str, n: int, count: int, body: bytes, done: _PeerRound) -> None:
        reply, flags = _header(await self._call(target, DIGEST_REQUEST, DIGEST_RESPONSE, body, done),
                               "digest answer")
        if reply.get("loading"):
            log.info("verify with %s skipped: it is still loading its snapshot", target)
            done.skipped = True
            return
        mismatched = bits_set(flags, n)
        if mismatched:
            resync = await self._detail(target, n, count, mismatched, done)
            # verify failed for these: ADD to that peer, no delay — at most what its queue has
            # room for, so a huge repair cannot collapse the queue it is feeding; the rest
            # is found again by the next round.
            queue = self.engine.queues.get(target)
            room = max(self.config.sync_queue_max - (len(queue.pending) if queue is not None else 0), 0)
            for client_id in resync[:room]:
                self.engine.enqueue(client_id, records.OP_CHANGE, [target], delay_ms=0)
            done.resynced = min(len(resync), room)
            if resync:
                log.info("verify with %s: %d clients missing or stale there, re-sending %d", target,
                         len(resync), done.resynced)
            if len(resync) > room:
                return
        done.complete = True

    async def _detail(self, target: str, n: int, count: int, mismatched: list[int], done: _PeerRound) -> list[str]:
        """Sub-digests (when worth it), then the keys of the mismatched (sub-)buckets; returns the
        ids the peer lacks."""
        done.mismatched = len(mismatched)
        salt = random.getrandbits(64)
        k = sub_buckets_for(len(mismatched), n, count)
        done.sub_buckets = k
        ids, fnvs, terms = self.index.members(SELF, mismatched, n)
        keys = await detail_keys(fnvs, terms, n, k, salt)
        subs: Collection[int] = mismatched
        if k > 1:
            sums = sub_digests(keys, mismatched, n, k)
            request = _packed({"buckets": n, "k": k, "salt": salt, "list": mismatched}, "I", sums)
            done.requests += 1
            done.bytes += len(request)
            answer = await self._call(target, SUB_REQUEST, SUB_RESPONSE, request, done)
            subs = [mismatched[i // k] * k + i % k for i in bits_set(answer, len(mismatched) * k)]
            if not subs:
                return []
        chosen = sorted(_selected(keys, subs), key=keys.__getitem__)
        done.detail_clients = len(chosen)
        named: list[int] = []
        counts: list[int] = []
        for i in chosen:
            sub = keys[i] >> 32
            if not named or named[-1] != sub:
                named.append(sub)
                counts.append(0)
            counts[-1] += 1
        width = "H" if max(counts, default=0) <= 0xFFFF else "I"
        head = json.dumps({"v": VERSION, "buckets": n, "k": k, "salt": salt, "subs": len(named), "counts": width},
                          separators=(",", ":")).encode()
        request = (head + b"\n" + struct.pack(f"<{len(named)}I", *named)
                   + struct.pack(f"<{len(counts)}{width}", *counts)
                   + struct.pack(f"<{len(chosen)}I", *(keys[i] & _MASK32 for i in chosen)))
        done.requests += 1
        done.bytes += len(request)
        answer = await self._call(target, DETAIL_REQUEST, DETAIL_RESPONSE, request, done)
        positions = _unpack("I", answer, len(answer) // 4, "detail answer")
        if any(p >= len(chosen) for p in positions):
            raise ValueError(f"{target} named a client position out of range")
        return [ids[chosen[p]] for p in positions]


def responsible_revisions(clients: ClientManager, responsible: Callable[[Client], bool]) -> tuple[list[str], list[int]]:
    """(ids, revisions) of the clients this node owns and is responsible for."""
    ids: list[str] = []
    revisions: list[int] = []
    for client in clients:
        if client.native and responsible(client):
            ids.append(client.client_id)
            revisions.append(client.revision)
    return ids, revisions
