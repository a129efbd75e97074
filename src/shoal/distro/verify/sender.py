"""The owner's side of verify: one round every ``verify.intervalMs`` to each healthy peer, repairs
through the sync engine, removals of copies it no longer has, and the counters of it all."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Collection
from dataclasses import dataclass

from shoal.config import Config
from shoal.distro import records
from shoal.distro.members import MemberManager, failure_text
from shoal.distro.sync import SyncEngine
from shoal.distro.transport import PeerError, PeerTransport, PeerUnavailable
from shoal.distro.verify import wire
from shoal.distro.verify.index import SELF, DigestIndex, detail_keys, selected, sub_digests
from shoal.errors import BadVerifyMessage
from shoal.kernels.verify_layout import bucket_count, sub_buckets_for
from shoal.model.client import Client
from shoal.model.clients import ClientManager

log = logging.getLogger(__name__)

_MASK32 = 0xFFFFFFFF


@dataclass(frozen=True, slots=True)
class VerifyOutcome:
    """How the last verify with one peer ended, at ``time_ms`` (wall): ``ok`` (nothing differed),
    ``repaired`` (``resynced`` clients re-queued, ``removed`` copies removed there), ``partial``
    (more differed than the queue had room for), ``skipped`` (the peer is still loading) or
    ``failed`` (``detail`` says why)."""

    time_ms: int
    result: str
    detail: str = ""
    mismatched: int = 0
    resynced: int = 0
    removed: int = 0


class VerifyStats:
    """Counters of the owner's verify rounds (for describe(), metrics and tests)."""

    def __init__(self) -> None:
        self.rounds = 0
        self.requests = 0
        self.bytes_sent = 0
        self.resynced = 0
        self.removed = 0
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
    removed: int = 0
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
            result = "repaired" if self.resynced or self.removed else "ok"
        detail = self.failure or ("the peer is still loading its snapshot" if self.skipped else "")
        return VerifyOutcome(time_ms, result, detail, self.mismatched, self.resynced, self.removed)

    def as_dict(self) -> dict[str, int]:
        return {"requests": self.requests, "bytes": self.bytes, "answer_bytes": self.answer_bytes,
                "mismatched": self.mismatched, "sub_buckets": self.sub_buckets,
                "detail_clients": self.detail_clients, "resynced": self.resynced, "removed": self.removed}


class VerifySender:
    """The owner side (Nacos DistroVerifyTimedTask, redesigned): one verify round to every
    UP/SUSPICIOUS peer; what the peer lacks is re-sent through the sync engine, and the copies it
    holds that this node does not hold at all are removed there (docs/protocol.md §6.5).

    Only a node that has finished its own snapshot load and whose digests are complete verifies:
    a node still loading, or rebuilding its digests, never makes a peer delete anything.

    A round with a peer that ends with every difference handled clears that peer's "needs full
    verify" mark (set while it was DOWN or its queue collapsed). Without an ``index`` the sender
    keeps a private one rebuilt every round (O(clients), for tests and tools).
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

    def _ready(self) -> bool:
        return self.is_loaded() and self.index.ready

    async def round(self) -> None:
        """One verify round to every UP/SUSPICIOUS peer (only after the initial load)."""
        if not self.members.is_clustered() or not self._ready():
            return
        if self._private:
            self.index.rebuild_now()
        count = self.index.count(SELF)
        n = bucket_count(count)
        body = wire.digest_body(self.index.digests(SELF, n), count)
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
        except (PeerError, BadVerifyMessage) as exc:
            log.warning("verify with %s failed: %s", target, exc)
            done.failure = failure_text("verify", exc)
        if done.complete:
            queue = self.engine.queues.get(target)
            if queue is not None:
                queue.needs_full_verify = False
        self.stats.requests += done.requests
        self.stats.bytes_sent += done.bytes
        self.stats.resynced += done.resynced
        self.stats.removed += done.removed
        self.stats.last_round[target] = done.as_dict()
        self.stats.last_outcome[target] = done.outcome(self.members.now_ms())

    async def _call(self, target: str, kind: str, expect: str, body: bytes, done: _PeerRound) -> bytes:
        kind_back, answer = await self.transport.call(target, kind, body, self.config.verify_timeout_ms)
        if kind_back != expect:
            raise PeerError(f"{target} answered {kind_back}")
        done.answer_bytes += len(answer)
        return answer

    async def _exchange(self, target: str, n: int, count: int, body: bytes, done: _PeerRound) -> None:
        mismatched = wire.parse_digest_answer(
            await self._call(target, wire.DIGEST_REQUEST, wire.DIGEST_RESPONSE, body, done), n)
        if mismatched is None:
            log.info("verify with %s skipped: it is still loading its snapshot", target)
            done.skipped = True
            return
        if mismatched:
            resync, excess = await self._detail(target, n, count, mismatched, done)
            if excess:
                await self._remove(target, excess, done)
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

    async def _remove(self, target: str, excess: list[tuple[str, int]], done: _PeerRound) -> None:
        """Of the copies the peer holds in excess, have it remove those this node does not hold at
        all: a client it removed while the peer was away (DOWN, paused, cut off), whose DELETE
        never reached it. A client held here — natively (at another revision: re-sent) or as a
        copy of another member's (ownership moved) — is live and stays."""
        gone = [(cid, revision) for cid, revision in excess if self.clients.get(cid) is None]
        if not gone:
            return
        request = wire.remove_request(gone)
        done.requests += 1
        done.bytes += len(request)
        answer = await self._call(target, wire.REMOVE_REQUEST, wire.REMOVE_RESPONSE, request, done)
        done.removed = wire.parse_remove_answer(answer)
        log.info("verify with %s: %d copies there of clients this node no longer has, %d removed", target,
                 len(gone), done.removed)

    async def _detail(self, target: str, n: int, count: int, mismatched: list[int],
                      done: _PeerRound) -> tuple[list[str], list[tuple[str, int]]]:
        """Sub-digests (when worth it), then the keys of the mismatched (sub-)buckets; returns the
        ids the peer lacks and the copies (id, revision) it holds that match none of ours."""
        done.mismatched = len(mismatched)
        salt = random.getrandbits(64)
        k = sub_buckets_for(len(mismatched), n, count)
        done.sub_buckets = k
        ids, fnvs, terms = self.index.members(SELF, mismatched, n)
        keys = await detail_keys(fnvs, terms, n, k, salt)
        subs: Collection[int] = mismatched
        if k > 1:
            request = wire.SubRequest(n, k, salt, mismatched, tuple(sub_digests(keys, mismatched, n, k))).encode()
            done.requests += 1
            done.bytes += len(request)
            answer = await self._call(target, wire.SUB_REQUEST, wire.SUB_RESPONSE, request, done)
            subs = [mismatched[i // k] * k + i % k for i in wire.parse_sub_answer(answer, len(mismatched) * k)]
            if not subs:
                return [], []
        named = sorted(subs)
        chosen = sorted(selected(keys, named), key=keys.__getitem__)
        done.detail_clients = len(chosen)
        held = dict.fromkeys(named, 0)  # every named sub-bucket, even one where this node holds nothing
        for i in chosen:
            held[keys[i] >> 32] += 1
        detail = wire.DetailRequest(n, k, salt, tuple(named), tuple(held[s] for s in named),
                                    tuple(keys[i] & _MASK32 for i in chosen))
        request = detail.encode()
        done.requests += 1
        done.bytes += len(request)
        answer = await self._call(target, wire.DETAIL_REQUEST, wire.DETAIL_RESPONSE, request, done)
        positions, excess = wire.parse_detail_answer(answer, len(chosen))
        return [ids[chosen[p]] for p in positions], excess


def responsible_revisions(clients: ClientManager, responsible: Callable[[Client], bool]) -> tuple[list[str], list[int]]:
    """(ids, revisions) of the clients this node owns and is responsible for."""
    ids: list[str] = []
    revisions: list[int] = []
    for client in clients:
        if client.native and responsible(client):
            ids.append(client.client_id)
            revisions.append(client.revision)
    return ids, revisions
