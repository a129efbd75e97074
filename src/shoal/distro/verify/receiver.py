"""The peer's side of verify: compare the owner's digests with the copies held from it, renew
what agrees, name what differs, and remove the copies the owner confirms it no longer has."""

from __future__ import annotations

import logging
from array import array
from collections.abc import Callable

from shoal.clock import Clock
from shoal.distro.verify import wire
from shoal.distro.verify.index import DigestIndex, detail_keys, selected, sub_digests
from shoal.errors import BadVerifyMessage
from shoal.kernels import verify as kernel
from shoal.kernels.verify_layout import MAX_EXTRA
from shoal.model.client import Client, ClientKind
from shoal.model.clients import ClientManager

log = logging.getLogger(__name__)

#: Removes the copy ``client_id`` held from ``owner`` if it is still at ``revision``; True if removed.
RemoveCopy = Callable[[str, str, int], bool]


class VerifyReceiver:
    """The peer side (Nacos DistroVerifyRequestHandler, redesigned): compare, renew, name what
    must be re-sent or removed.

    ``index`` is the node's :class:`DigestIndex`; without one the receiver keeps a private index
    rebuilt every round (O(clients), for tests and tools). ``renew_kinds`` limits the
    ``on_renew`` hook to those client kinds (None: every kind). ``remove_copy`` applies the
    owner's removals (None: nothing is removed).
    """

    def __init__(self, clock: Clock, clients: ClientManager,
                 on_renew: Callable[[Client, int], object] | None = None,
                 is_loaded: Callable[[], bool] = lambda: True, index: DigestIndex | None = None,
                 renew_kinds: frozenset[ClientKind] | None = None, remove_copy: RemoveCopy | None = None) -> None:
        self.clock = clock
        self.clients = clients
        self.is_loaded = is_loaded
        self.on_renew = on_renew  # e.g. refresh an ip:port client's beat stamps, as Nacos does
        self.renew_kinds = renew_kinds
        self.remove_copy = remove_copy
        self._private = index is None
        self.index = index if index is not None else DigestIndex(clients, lambda c: c.native)

    def _ready(self) -> bool:
        return self.is_loaded() and self.index.ready

    async def handle_digest(self, sender: str, body: bytes) -> tuple[str, bytes]:
        """Answer a DistroVerifyRequest."""
        return wire.DIGEST_RESPONSE, self.on_digest(sender, body)

    async def handle_sub(self, sender: str, body: bytes) -> tuple[str, bytes]:
        """Answer a DistroVerifySubDigestRequest."""
        return wire.SUB_RESPONSE, await self.on_sub(sender, body)

    async def handle_detail(self, sender: str, body: bytes) -> tuple[str, bytes]:
        """Answer a DistroVerifyDetailRequest."""
        return wire.DETAIL_RESPONSE, await self.on_detail(sender, body)

    async def handle_remove(self, sender: str, body: bytes) -> tuple[str, bytes]:
        """Answer a DistroVerifyRemoveRequest."""
        return wire.REMOVE_RESPONSE, self.on_remove(sender, body)

    def on_digest(self, sender: str, body: bytes) -> bytes:
        """Renew the copies in agreeing buckets; name the mismatched buckets."""
        n, theirs = wire.parse_digest_request(body)
        if not self._ready():  # half a snapshot would fail every bucket
            return wire.LOADING_ANSWER
        if self._private:
            self.index.rebuild_now()
        mine = self.index.digests(sender, n)
        mismatched = [i for i in range(n) if mine[i] != theirs[i]]
        now = self.clock.monotonic_ms()
        self.index.stamp(sender, n, mismatched, now)
        if self.on_renew is not None:
            self._renew_hooked(sender, n, set(mismatched), now)
        return wire.digest_answer(mismatched, n)

    def _renew_hooked(self, sender: str, n: int, mismatched: set[int], now: int) -> None:
        if self.renew_kinds == frozenset({ClientKind.IP_PORT}):
            candidates = self.index.ip_port_members(sender)
        else:
            candidates = self.index.group_members(sender)
        for cid, fnv in candidates:
            client = self.clients.get(cid)
            if client is not None and fnv % n not in mismatched and (
                    self.renew_kinds is None or client.kind in self.renew_kinds):
                self._renew(client, now)

    async def on_sub(self, sender: str, body: bytes) -> bytes:
        """Our sub-digests of the named buckets against the owner's: a bitmap of the mismatched
        sub-buckets; the agreeing sub-buckets are stamped as renewed."""
        request = wire.parse_sub_request(body)
        n, k, buckets = request.n, request.k, request.buckets
        _, fnvs, terms = self.index.members(sender, buckets, n)
        mine = sub_digests(await detail_keys(fnvs, terms, n, k, request.salt), buckets, n, k)
        flags = [mine[i] != request.sums[i] for i in range(len(mine))]
        mismatched = [buckets[i // k] * k + i % k for i, bad in enumerate(flags) if bad]
        self.index.stamp_subs(sender, n, k, buckets, mismatched, self.clock.monotonic_ms())
        return wire.bitmap(flags)

    async def on_detail(self, sender: str, body: bytes) -> bytes:
        """The owner's keys of the named sub-buckets against ours: renew what matches; answer the
        positions (in the owner's order) of the keys we lack (missing here or another revision)
        and the copies we hold there that match none of the owner's keys (held at another
        revision, or a client the owner no longer has)."""
        request = wire.parse_detail_request(body)
        n, k = request.n, request.k
        theirs = array("Q", request.keys())
        ids, fnvs, terms = self.index.members(sender, {sub // k for sub in request.subs}, n)
        keys = await detail_keys(fnvs, terms, n, k, request.salt)
        chosen = selected(keys, request.subs)
        mine = array("Q", sorted(keys[i] for i in chosen))
        try:
            lacking, extra = kernel.diff_sorted(theirs, mine)
        except ValueError:
            raise BadVerifyMessage(f"{wire.DETAIL_REQUEST}: the owner's values are not sorted") from None
        unmatched = set(extra)
        now = self.clock.monotonic_ms()
        excess: list[tuple[str, int]] = []
        for i in chosen:
            if keys[i] not in unmatched:
                self._renew_id(ids[i], now)
            elif len(excess) < MAX_EXTRA:
                client = self.clients.get(ids[i])
                if client is not None:
                    excess.append((client.client_id, client.revision))
        wanted = set(lacking)
        positions = [p for p, key in enumerate(theirs) if key in wanted]  # theirs is in the owner's order
        return wire.detail_answer(positions, excess)

    def on_remove(self, sender: str, body: bytes) -> bytes:
        """Remove the copies the owner confirmed it no longer has, each only if it is still the
        sender's copy at the revision we named (a newer CHANGE, or another owner, keeps it)."""
        copies = wire.parse_remove_request(body)
        removed = 0
        if self.remove_copy is not None and self._ready():
            for client_id, revision in copies:
                removed += self.remove_copy(sender, client_id, revision)
        if removed:
            log.info("verify: removed %d copies that %s no longer has", removed, sender)
        return wire.remove_answer(removed)

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
