"""DistroProtocol: wires one node's Distro concerns together and routes cluster requests to them.

Each concern keeps both of its sides in its own module: incremental sync (:mod:`.sync`),
revision verify (:mod:`.verify`), snapshot serving and loading (:mod:`.snapshot`), member
reports and cluster.conf (:mod:`.members`), responsibility and the ip:port handoff
(:mod:`.mapper`). This module builds them, owns their Periodics (started by app.py), tracks
whether the initial load is done, and maps each request type to the concern that answers it.

Everything network-facing goes through a PeerTransport (gRPC between processes, wired by
app.py; an in-memory twin in cluster tests).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shoal.clock import Clock
from shoal.config import Config
from shoal.cp.store import CpStore
from shoal.distro import bodies, records
from shoal.distro.barrier import (
    CP_CATCH_UP_REQUEST,
    CpCatchUpReceiver,
    SiblingBarrier,
    SiblingCatchUp,
    waits_for_siblings,
)
from shoal.distro.mapper import DistroMapper, IpPortHandoff
from shoal.distro.members import (
    REPORT_REQUEST,
    ClusterConfWatcher,
    MemberManager,
    MemberReporter,
    NodeLayout,
    SiblingExchange,
)
from shoal.distro.processor import DistroProcessor
from shoal.distro.snapshot import SNAPSHOT_REQUEST, SnapshotLoader, SnapshotServer
from shoal.distro.sync import SYNC_REQUEST, SyncEngine, SyncReceiver
from shoal.distro.transport import PeerTransport
from shoal.distro.verify import (
    DETAIL_REQUEST,
    DIGEST_REQUEST,
    REMOVE_REQUEST,
    SUB_REQUEST,
    DigestIndex,
    VerifyOutcome,
    VerifyReceiver,
    VerifySender,
    VerifyStats,
)
from shoal.errors import Forbidden, NoHandler
from shoal.model.client import Client, ClientKind
from shoal.model.clients import ClientManager
from shoal.model.events import EventBus
from shoal.model.services import ServiceManager
from shoal.tasks import Periodic

log = logging.getLogger(__name__)

#: Up to this many clients the digests are rebuilt in one go; above, in chunks off the critical path.
INDEX_REBUILD_INLINE = 50_000

#: How long one count of clients by owner serves the cluster page (it is one pass over every client).
OWNED_COUNT_TTL_MS = 2000

#: Answers one cluster request: (sender address, body) → (response type, response body).
Handler = Callable[[str, bytes], Awaitable[tuple[str, bytes]]]

#: The shape check of each routed request type's body, run before its handler: a body without
#: its type's shape is a BadRequestBody (502), as on the SDK port. Every route needs one.
BODY_CHECKS: dict[str, bodies.BodyCheck] = {
    SYNC_REQUEST: bodies.binary,  # the batch decoder checks it (SyncDecodeError, a ValueError)
    DIGEST_REQUEST: bodies.verify_message,
    SUB_REQUEST: bodies.verify_message,
    DETAIL_REQUEST: bodies.verify_message,
    REMOVE_REQUEST: bodies.verify_message,
    SNAPSHOT_REQUEST: bodies.snapshot_request,
    REPORT_REQUEST: bodies.report_request,
    CP_CATCH_UP_REQUEST: bodies.cp_catch_up_request,
}


@dataclass(frozen=True, slots=True)
class MemberFigures:
    """One member as this node sees it, for the console's cluster page (read on demand).

    ``clients_owned``: clients this node holds that the member owns (for this node: its own
    clients; for a peer: the copies it replicated here). The sync and verify fields are None
    for this node itself: it has no queue towards itself and does not verify itself."""

    address: str
    state: str
    is_self: bool
    fail_count: int
    last_seen_ms: int
    clients_owned: int
    sync_queue: int | None = None
    needs_full_verify: bool | None = None
    sent_batches: int | None = None
    failed_batches: int | None = None
    last_sync_ms: int | None = None
    last_sync_failure: tuple[int, str] | None = None
    last_verify: VerifyOutcome | None = None
    last_failure: tuple[int, str] | None = None


class DistroProtocol:
    """One node's Distro (AP) replication: membership, responsibility, sync, verify, snapshot
    and expiry, behind :meth:`dispatch` (the cluster port's handler) and the Periodics in
    :attr:`periodics`."""

    def __init__(self, config: Config, clock: Clock, bus: EventBus, clients: ClientManager,
                 services: ServiceManager, members: MemberManager, transport: PeerTransport,
                 on_renew: Callable[[Client, int], object] | None = None,
                 renew_kinds: frozenset[ClientKind] | None = frozenset({ClientKind.IP_PORT}),
                 drop_incoming_sync: int = 0, siblings: SiblingExchange | None = None,
                 cp_store: CpStore | None = None) -> None:
        """``siblings``: what a worker tells its sibling workers in its member reports; ``cp_store``:
        the store whose views a sibling's ``CpCatchUpRequest`` waits on."""
        self.config = config
        self.clock = clock
        self.clients = clients
        self.members = members
        self.transport = transport
        self.mapper = DistroMapper(members)
        # Verify's bucket digests, kept up to date on change; while not loaded it waits.
        self.index = DigestIndex(clients, self.mapper.responsible_client)
        self.index.subscribe(bus)
        #: Client ids a peer deleted while this node was loading its snapshot (see _apply_sync).
        self._deleted_while_loading: set[str] = set()
        self._index_task: asyncio.Task[None] | None = None
        self.loaded = not members.is_clustered()
        self.engine = SyncEngine(config, clock, members, transport, self._record_of)
        #: what a worker's ephemeral writes wait for before they are answered (None: a single process)
        self.barrier = (SiblingBarrier(self.engine, members.sibling_addresses(), config.workers_write_wait_ms)
                        if waits_for_siblings(config, members) else None)
        #: what a worker's CP writes wait for (the store's SiblingViews, set by app.py; None: a single process)
        self.cp_siblings = (SiblingCatchUp(transport, members, members.sibling_addresses(),
                                           config.workers_write_wait_ms)
                            if cp_store is not None and waits_for_siblings(config, members) else None)
        #: a sibling's CP write: answered once this process's views hold it (None: no CP store here)
        self.cp_receiver = (CpCatchUpReceiver(cp_store, config.workers_write_wait_ms)
                            if cp_store is not None else None)
        self.handoff = IpPortHandoff(clock, clients, members, self.mapper, self.engine.enqueue)
        self.processor = DistroProcessor(clock, bus, clients, services, self.mapper, self.engine, self.handoff)
        self.processor.renewed_at = self.index.renewed_at
        self.sync_receiver = SyncReceiver(self._apply_sync, drop_incoming_sync)  # a test hook (0: none)
        self.verifier = VerifySender(config, clients, members, self.mapper.responsible_client, transport,
                                     self.engine, self._is_loaded, self.index)
        self.snapshots = SnapshotServer(clock, clients, members.self_address, config.snapshot_chunk_bytes,
                                        config.snapshot_session_ttl_ms, self._is_loaded)
        self.loader = SnapshotLoader(config, clients, members, transport, self._apply_snapshot,
                                     self.engine.enqueue, self._is_loaded, self._loaded_from)
        self.reporter = MemberReporter(members, transport, config.member_report_timeout_ms, siblings)
        self.conf_watcher = ClusterConfWatcher(Path(config.cluster_conf), members) if config.cluster_conf else None
        self._routes: dict[str, Handler] = {}
        self.receiver = VerifyReceiver(clock, clients, on_renew, self._is_loaded, self.index,
                                       renew_kinds, self.processor.remove_copy)  # also builds the routes
        self._owned: tuple[int, Counter[str]] | None = None  # (monotonic ms, clients by owner)
        self._load_task: asyncio.Task[None] | None = None
        self._verify_task: asyncio.Task[None] | None = None
        members.listeners.append(self._on_members_changed)
        self.periodics = [
            Periodic("distro-verify", config.verify_interval_ms, self.verify_round),
            Periodic("distro-expiry", config.client_expire_check_interval_ms, self._expire),
            Periodic("member-report", config.member_report_interval_ms, self.reporter.report_tick,
                     initial_delay_ms=0),
        ]
        if self.conf_watcher is not None:
            self.periodics.append(Periodic("cluster-conf-reload", config.cluster_conf_reload_interval_ms,
                                           self.conf_watcher.reload))

    # --- routing ----------------------------------------------------------------------------
    @property
    def receiver(self) -> VerifyReceiver:
        """The answering side of verify (replaceable, e.g. to observe renewals in a test)."""
        return self._receiver

    @receiver.setter
    def receiver(self, receiver: VerifyReceiver) -> None:
        self._receiver = receiver
        self._routes = {
            SYNC_REQUEST: self.sync_receiver.handle,
            DIGEST_REQUEST: receiver.handle_digest,
            SUB_REQUEST: receiver.handle_sub,
            DETAIL_REQUEST: receiver.handle_detail,
            REMOVE_REQUEST: receiver.handle_remove,
            SNAPSHOT_REQUEST: self.snapshots.handle,
            REPORT_REQUEST: self.reporter.handle,
        }
        if self.cp_receiver is not None:
            self._routes[CP_CATCH_UP_REQUEST] = self.cp_receiver.handle

    async def dispatch(self, sender: str, type_name: str, body: bytes,
                       introduced: NodeLayout | None = None) -> tuple[str, bytes]:
        """Handle one cluster request from the peer at ``sender`` (``introduced``: the sender's
        node and workers as its request named them, :func:`~shoal.distro.members.introduced_by`).

        Raises Forbidden (not a member), NoHandler (unknown type), BadRequestBody (the body does
        not have its type's shape) or ValueError (a binary part does not decode, e.g. a sync
        batch's SyncDecodeError: answered 500, as before)."""
        # a worker of a listed node is not known before its node's first report: learnt there, or
        # from the request itself (a worker's names its node and workers), as a report would
        if sender and introduced is not None and not self.members.is_member(sender):
            self.members.learn(introduced)
        if sender and not self.members.is_member(sender) and (
                type_name != REPORT_REQUEST or not self.reporter.admit(sender, body)):
            raise Forbidden(f"{sender} is not a member of this cluster")
        handler = self._routes.get(type_name)
        if handler is None:
            raise NoHandler()
        check = BODY_CHECKS.get(type_name)
        if check is not None:
            check(body)
        return await handler(sender, body)

    # --- lifecycle --------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the sync workers and the Periodics; a clustered node starts loading a snapshot."""
        self.engine.start()
        for periodic in self.periodics:
            periodic.start()
        if not self.loaded:
            self._load_task = asyncio.get_running_loop().create_task(self.load_snapshot(), name="distro-load")

    async def stop(self) -> None:
        """Cancel the load and every loop, then close the transport."""
        for task in (self._load_task, self._verify_task, self._index_task):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        for periodic in self.periodics:
            await periodic.stop()
        await self.reporter.stop()
        await self.engine.stop()
        await self.transport.close()

    async def wait_loaded(self, timeout_s: float) -> bool:
        """Wait for the initial snapshot load; False when it did not finish in ``timeout_s``."""
        if self.loaded or self._load_task is None:
            return True
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.shield(self._load_task)
        except TimeoutError:
            log.warning("no snapshot loaded within %.0f s; serving with what this node has", timeout_s)
            return False
        return self.loaded

    def _is_loaded(self) -> bool:
        return self.loaded

    @property
    def loaded(self) -> bool:
        """True once the initial snapshot load is done (or none was needed)."""
        return self._loaded

    @loaded.setter
    def loaded(self, value: bool) -> None:
        was = getattr(self, "_loaded", None)
        self._loaded = value
        if value:
            self._deleted_while_loading.clear()
        if not value:
            # While loading, thousands of copies arrive per page: the digests are rebuilt once
            # the load is done instead of being kept up to date one client at a time.
            self.index.active = self.index.ready = False
        elif was is not True:
            self._rebuild_index()

    def _rebuild_index(self) -> None:
        if self._index_task is not None and not self._index_task.done():
            self._index_task.cancel()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None or len(self.clients) <= INDEX_REBUILD_INLINE:
            self.index.rebuild_now()
        else:  # a million clients take about a second: in chunks, verify waits until it is done
            self.index.reset()
            self._index_task = loop.create_task(self.index.rebuild(), name="distro-digest-rebuild")

    def _apply(self, sender: str, batch: list[records.ClientRecord]) -> int:
        """Apply a peer's batch, then re-read its clients into the digests (an owner may change
        without any model event)."""
        changed = self.processor.apply(sender, batch)
        if self.index.active:
            for record in batch:
                self.index.touch_id(record[1])
        return changed

    def _apply_sync(self, sender: str, batch: list[records.ClientRecord]) -> int:
        """A peer's sync batch. While loading, the ids it deletes are remembered: a snapshot page
        built before that DELETE reached the page's server must not bring the client back here
        (two nodes restarting together: the first one's DELETEs of its previous run's clients
        reach the second before the snapshot page that still holds them)."""
        if not self.loaded:
            for op, client_id, _, _ in batch:
                if op == records.OP_DELETE:
                    self._deleted_while_loading.add(client_id)
                else:
                    self._deleted_while_loading.discard(client_id)
        return self._apply(sender, batch)

    def _apply_snapshot(self, owner: str, batch: list[records.ClientRecord]) -> int:
        """A snapshot page's copies of ``owner``'s clients, less those deleted since the load began."""
        if self._deleted_while_loading:
            batch = [r for r in batch if r[1] not in self._deleted_while_loading]
        return self._apply(owner, batch)

    # --- the concerns' entry points (Periodics, tests) ----------------------------------------
    async def verify_round(self) -> None:
        """One verify round to every UP/SUSPICIOUS peer (only after the initial load), and the
        ip:port clients held pending handoff sent to their responsible nodes again."""
        if self.loaded:
            self.handoff.retry()
        await self.verifier.round()

    @property
    def verify_stats(self) -> VerifyStats:
        """Counters of this node's verify rounds."""
        return self.verifier.stats

    async def load_snapshot(self) -> None:
        """Load every client from a peer, retrying until a load succeeds."""
        await self.loader.load()

    async def report_round(self) -> None:
        """Report to every peer; the answer (or its absence) drives the peer's state."""
        await self.reporter.report_round()

    async def reload_cluster_conf(self) -> None:
        """Re-read cluster.conf if it changed (nothing without one)."""
        if self.conf_watcher is not None:
            await self.conf_watcher.reload()

    def _record_of(self, client_id: str, op: int) -> records.ClientRecord | None:
        return self.processor.record_of(client_id, op)

    async def _expire(self) -> None:
        self.processor.expire(self.config.client_expired_time_ms)

    def _loaded_from(self, address: str, count: int) -> None:
        log.info("loaded a snapshot of %d clients from %s", count, address)
        self.loaded = True
        self.handoff.reset()  # every loaded ip:port client is evaluated
        self.handoff.refresh()
        self.index.touch_ip_port()

    def _on_members_changed(self) -> None:
        log.info("healthy members now %s", self.members.healthy_addresses())
        self.handoff.refresh()
        self.index.touch_ip_port()  # responsibility for ip:port clients follows the member list
        # A peer that is back may have missed changes while DOWN (its queue collapsed to
        # "needs full verify"): verify now rather than at the next periodic round.
        if self.loaded and any(q.needs_full_verify for q in self.engine.queues.values()):
            self._verify_soon()

    def _verify_soon(self) -> None:
        if self._verify_task is not None and not self._verify_task.done():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # not running (a unit test stepping by hand): the periodic round covers it
        self._verify_task = loop.create_task(self.verify_round(), name="distro-verify-now")

    def member_figures(self) -> list[MemberFigures]:
        """Every member (this node included) with its Distro figures as this node sees them:
        state, clients owned, the sync queue towards it, the last verify and the last failures.
        The clients are counted by owner in one pass, reused for :data:`OWNED_COUNT_TTL_MS` (so
        open consoles cost one pass per interval); everything else is the engines' own counters."""
        now = self.clock.monotonic_ms()
        if self._owned is None or now - self._owned[0] >= OWNED_COUNT_TTL_MS or now < self._owned[0]:
            self._owned = (now, Counter(client.owner for client in self.clients))
        owned = self._owned[1]
        out: list[MemberFigures] = []
        for member in self.members.all_members():
            if member.address == self.members.self_address:
                out.append(MemberFigures(member.address, member.state.value, True, 0, member.last_seen_ms,
                                         owned.get("", 0) + owned.get(member.address, 0)))
                continue
            queue = self.engine.queues.get(member.address)
            out.append(MemberFigures(
                member.address, member.state.value, False, member.fail_count, member.last_seen_ms,
                owned.get(member.address, 0),
                sync_queue=len(queue.pending) if queue is not None else 0,
                needs_full_verify=queue.needs_full_verify if queue is not None else False,
                sent_batches=queue.sent_batches if queue is not None else 0,
                failed_batches=queue.failed_batches if queue is not None else 0,
                last_sync_ms=queue.last_sent_ms or None if queue is not None else None,
                last_sync_failure=((queue.last_failure_ms, queue.last_failure)
                                   if queue is not None and queue.last_failure_ms else None),
                last_verify=self.verify_stats.last_outcome.get(member.address),
                last_failure=(member.last_failure_ms, member.last_failure) if member.last_failure_ms else None))
        return out

    def describe(self) -> dict[str, Any]:
        """This node's view of the cluster (admin endpoints, logs)."""
        return {
            "self": self.members.self_address,
            "members": [m.to_nacos() for m in self.members.all_members()],
            "nodes": [m.to_nacos() for m in self.members.nodes()],
            "loaded": self.loaded,
            "sync_pending": self.engine.pending_count(),
            "verify_rounds": self.verify_stats.rounds,
        }
