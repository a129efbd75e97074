"""Incremental sync, both sides: a delay-task engine with one bounded queue and one worker per
peer sends; :class:`SyncReceiver` applies what a peer sent.

Mirrors Nacos's DistroDelayTaskExecuteEngine: a task is keyed by (client id, target peer);
adding a task for a key already pending merges it — the *older* due time is kept (the delay is
not extended) and the *newer* action wins. When a key is due, CHANGE/ADD reads the client's
current state (a client gone meanwhile is skipped) and DELETE sends a delete. Unlike Nacos:

* many keys for one peer travel in one request (up to ``sync.batch-max``), syncser-encoded;
* each peer has its own queue and worker, so a dead or slow peer never delays the others;
* a failed batch is re-queued with exponential back-off (``sync.initial-backoff-ms``, 100 ms,
  doubling up to ``sync.retryDelayMs``) instead of a fixed 3 s;
* the queue is bounded: a DOWN peer gets nothing queued, and a queue that passes
  ``sync.queue-max`` collapses to "needs full verify" — the next verify round finds every
  difference by digest and re-sends only those clients;
* a sibling worker of this node (docs/workers.md) gets a change at once (delay 0: what piles up while
  a batch is in flight goes in the next), and :meth:`SyncEngine.delivery` lets a write wait until
  the sibling acknowledged the batch carrying it (:mod:`shoal.distro.barrier`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from shoal.clock import Clock
from shoal.config import Config
from shoal.distro import records
from shoal.distro.members import MemberManager, MemberState, failure_text
from shoal.distro.records import OP_DELETE, ClientRecord
from shoal.distro.transport import PeerError, PeerTransport, PeerUnavailable
from shoal.tasks import wait_until_due

log = logging.getLogger(__name__)

SYNC_REQUEST = "DistroSyncRequest"
SYNC_RESPONSE = "DistroSyncResponse"

#: Applies a decoded batch as the copies held for ``sender``; returns how many clients changed.
ApplyBatch = Callable[[str, list[ClientRecord]], int]


@dataclass
class PeerQueue:
    """The pending sync keys of one peer, its back-off and its worker task."""

    target: str
    pending: dict[str, tuple[int, int]] = field(default_factory=dict)  # client id → (op, due ms)
    backoff_ms: int = 0
    needs_full_verify: bool = False
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    sent_batches: int = 0
    failed_batches: int = 0
    #: Wall time of the last batch the peer acknowledged (0 = none yet).
    last_sent_ms: int = 0
    #: The last failed batch: wall time (0 = none) and why.
    last_failure_ms: int = 0
    last_failure: str = ""
    #: Client records carried by the batches the peer acknowledged (``/ sent_batches`` = mean batch size).
    sent_records: int = 0
    #: Writes waiting for a pending key to be delivered (:meth:`SyncEngine.delivery`): client id →
    #: resolved True when the batch carrying it is acknowledged, False when it fails or is dropped.
    waiters: dict[str, asyncio.Future[bool]] = field(default_factory=dict)
    #: The keys of the batch being sent, since when (monotonic ms), and its waiters' future (made on demand).
    in_flight: dict[str, tuple[int, int]] = field(default_factory=dict)
    in_flight_since: int = 0
    in_flight_done: asyncio.Future[bool] | None = None

    def next_due(self) -> int | None:
        """The earliest due time of the pending keys (None when nothing is pending)."""
        return min((due for _, due in self.pending.values()), default=None)


class SyncEngine:
    """Queues and sends client changes to peers. ``flush`` steps one peer by hand in tests."""

    def __init__(self, config: Config, clock: Clock, members: MemberManager, transport: PeerTransport,
                 build: Callable[[str, int], ClientRecord | None]) -> None:
        self.config = config
        self.clock = clock
        self.members = members
        self.transport = transport
        self.build = build
        self.queues: dict[str, PeerQueue] = {}
        self._running = False
        #: this worker's sibling workers: a change reaches them at once, not after ``sync.delayMs``
        self.siblings = frozenset(members.sibling_addresses())

    # --- enqueue ----------------------------------------------------------------------------
    def enqueue(self, client_id: str, op: int, targets: Iterable[str] | None = None,
                delay_ms: int | None = None) -> None:
        """Queue ``op`` for ``client_id`` to ``targets`` (every peer by default) after ``delay_ms``
        (``sync.delayMs`` by default), merging with a pending task for the same key."""
        now = self.clock.monotonic_ms()
        due = now + (self.config.sync_delay_ms if delay_ms is None else delay_ms)
        siblings = self.siblings if delay_ms is None else ()
        addresses = [m.address for m in self.members.peer_list()] if targets is None else list(targets)
        for target in addresses:
            member = self.members.peers.get(target)
            if member is None:
                continue  # no longer a member: dropped, as Nacos does
            queue = self._queue(target)
            if member.state is MemberState.DOWN:
                queue.needs_full_verify = True  # verify repairs it when the peer is back
                continue
            at = now if target in siblings else due
            existing = queue.pending.get(client_id)
            if existing is None:
                queue.pending[client_id] = (op, at)
            else:  # the delay is never extended; the newer op wins
                _older_op, existing_due = existing
                queue.pending[client_id] = (op, min(existing_due, at))
            if len(queue.pending) > self.config.sync_queue_max:
                log.warning("sync queue to %s passed %d keys: collapsing to a full verify", target,
                            self.config.sync_queue_max)
                queue.pending.clear()
                queue.needs_full_verify = True
                _resolve(queue.waiters.values(), False)
                queue.waiters.clear()
            queue.wake.set()

    def _queue(self, target: str) -> PeerQueue:
        queue = self.queues.get(target)
        if queue is None:
            queue = self.queues[target] = PeerQueue(target)
            if self._running:
                queue.task = asyncio.get_running_loop().create_task(self._worker(queue), name=f"distro-sync-{target}")
        return queue

    # --- sending ----------------------------------------------------------------------------
    async def flush(self, target: str) -> int:
        """Send one batch of due keys to ``target``; returns how many keys were sent."""
        queue = self.queues.get(target)
        if queue is None:
            return 0
        now = self.clock.monotonic_ms()
        due = [cid for cid, (_, at) in queue.pending.items() if at <= now][: self.config.sync_batch_max]
        if not due:
            return 0
        taken: dict[str, tuple[int, int]] = {}
        batch: list[ClientRecord] = []
        size = 0
        for cid in due:  # bounded by count and by bytes; one huge client still goes alone
            op, at = queue.pending.pop(cid)
            record = records.delete_record(cid) if op == OP_DELETE else self.build(cid, op)
            taken[cid] = (op, at)
            if record is None:
                continue
            batch.append(record)
            size += records.estimated_size(record)
            if size >= self.config.snapshot_chunk_bytes:
                break
        waiting = [queue.waiters.pop(cid) for cid in taken if cid in queue.waiters] if queue.waiters else []
        if not batch:
            _resolve(waiting, True)  # nothing left to send for them
            return 0
        attempt = self.members.attempt(target)
        queue.in_flight, queue.in_flight_since = taken, self.clock.monotonic_ms()
        try:
            try:
                kind, body = await self.transport.call(target, SYNC_REQUEST, records.encode(batch),
                                                       self.config.sync_timeout_ms)
            finally:
                if queue.in_flight_done is not None:
                    waiting.append(queue.in_flight_done)
                queue.in_flight, queue.in_flight_done = {}, None
            if kind != SYNC_RESPONSE:
                raise PeerError(f"{target} answered {kind}: {body[:200]!r}")
        except (PeerUnavailable, PeerError, TimeoutError) as exc:
            _resolve(waiting, False)  # (any other exception: the waits end at their bound)
            queue.failed_batches += 1
            queue.last_failure_ms = self.clock.now_ms()
            queue.last_failure = failure_text(f"sync of {len(batch)} clients", exc)
            queue.backoff_ms = min(max(queue.backoff_ms * 2, self.config.sync_initial_backoff_ms),
                                   self.config.sync_retry_delay_ms)
            retry_at = self.clock.monotonic_ms() + queue.backoff_ms
            for cid, (op, _) in taken.items():
                if cid not in queue.pending:  # a newer task for the key supersedes the retry
                    queue.pending[cid] = (op, retry_at)
            if isinstance(exc, PeerError):
                log.warning("sync of %d clients to %s failed (%s); retrying in %d ms", len(batch), target, exc,
                            queue.backoff_ms)
            else:  # unreachable or silent: the transport logs the peer's state, once
                log.debug("sync of %d clients to %s failed (%s); retrying in %d ms", len(batch), target, exc,
                          queue.backoff_ms)
                # our own calls to a peer decide its state (docs/protocol.md §6.2)
                self.members.report_failed(target, refused=isinstance(exc, PeerUnavailable) and exc.refused,
                                           attempt=attempt, reason=queue.last_failure)
            return 0
        _resolve(waiting, True)
        queue.backoff_ms = 0
        queue.sent_batches += 1
        queue.last_sent_ms = self.clock.now_ms()
        queue.sent_records += len(batch)
        self.members.report_succeeded(target)
        return len(batch)

    def delivery(self, target: str, client_id: str) -> asyncio.Future[bool] | None:
        """What a write of ``client_id`` just applied here waits on until ``target`` holds it: the
        batch that will carry it (the key is pending) or the one carrying it now (in flight). None:
        nothing to wait for — nothing queued, or ``target`` is failing (a batch failed within the
        current back-off, or a batch is unanswered for longer than ``shoal.server.workers.write-wait-ms``):
        a write never waits for a peer that does not answer. A back-off left over from an old failure
        (a sibling that was not listening yet when this worker started) does not count: only a
        batch's success resets it, and a write must not skip its wait until the next one."""
        queue = self.queues.get(target)
        if queue is None:
            return None
        if queue.backoff_ms and self.clock.now_ms() - queue.last_failure_ms <= queue.backoff_ms:
            return None
        if queue.in_flight and self.clock.monotonic_ms() - queue.in_flight_since > self.config.workers_write_wait_ms:
            return None
        if client_id in queue.pending:
            waiter = queue.waiters.get(client_id)
            if waiter is None:
                waiter = queue.waiters[client_id] = asyncio.get_running_loop().create_future()
            return waiter
        if client_id in queue.in_flight:
            if queue.in_flight_done is None:
                queue.in_flight_done = asyncio.get_running_loop().create_future()
            return queue.in_flight_done
        return None

    def pending_count(self) -> int:
        """Keys pending over every peer's queue."""
        return sum(len(q.pending) for q in self.queues.values())

    # --- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        """Start one worker per peer queue (and for queues created later)."""
        self._running = True
        for queue in self.queues.values():
            if queue.task is None:
                queue.task = asyncio.get_running_loop().create_task(self._worker(queue))

    async def stop(self) -> None:
        """Cancel every worker and wait for them."""
        self._running = False
        tasks = [q.task for q in self.queues.values() if q.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for queue in self.queues.values():
            queue.task = None
            _resolve(queue.waiters.values(), False)
            queue.waiters.clear()

    async def _worker(self, queue: PeerQueue) -> None:
        while True:
            try:
                while await self.flush(queue.target):
                    pass
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("sync worker for %s failed; continuing", queue.target)
            queue.wake.clear()
            await wait_until_due(queue.wake, queue.next_due(), self.clock.monotonic_ms())


def _resolve(waiters: Iterable[asyncio.Future[bool]], delivered: bool) -> None:
    for waiter in waiters:
        if not waiter.done():
            waiter.set_result(delivered)


@dataclass
class ReceivedSync:
    """What one sender's sync batches brought: batches, the records in them, and how many of those
    records changed a client here (a record equal to the copy already held changes nothing)."""

    batches: int = 0
    records: int = 0
    applied: int = 0


class SyncReceiver:
    """The receiving side: decode a peer's batch and apply it as that peer's copies.

    ``received`` counts, per sender, what arrived and what was applied (the cluster port admits only
    members, so it holds at most one entry per member). ``drop_count`` is the ``drop_incoming_sync``
    test hook (``shoal.config.TestHooks``): that many batches are acknowledged and silently lost, so
    verify has something to repair; they are not counted.
    """

    def __init__(self, apply: ApplyBatch, drop_count: int = 0) -> None:
        self.apply = apply
        self.drop_count = drop_count
        self.received: dict[str, ReceivedSync] = {}

    async def handle(self, sender: str, body: bytes) -> tuple[str, bytes]:
        """Answer one DistroSyncRequest with the number of clients applied."""
        if self.drop_count > 0:  # test hook: lose this batch on purpose
            self.drop_count -= 1
            log.warning("TEST HOOK: dropped a sync batch from %s", sender)
            return SYNC_RESPONSE, b'{"applied":0}'
        batch = records.split(body)  # each service checked in full when it is decoded, before any is applied
        applied = self.apply(sender, batch)
        stats = self.received.get(sender)
        if stats is None:
            stats = self.received[sender] = ReceivedSync()
        stats.batches += 1
        stats.records += len(batch)
        stats.applied += applied
        return SYNC_RESPONSE, json.dumps({"applied": applied}).encode()
