"""DistroProtocol: membership, responsibility, sync, verify, snapshot and expiry of one node.

Everything network-facing goes through a PeerTransport (gRPC between processes, an in-memory
twin in cluster tests); everything periodic is a Periodic owned here and started by app.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shoal.clock import Clock
from shoal.config import Config
from shoal.distro import records
from shoal.distro.mapper import DistroMapper, responsible_id
from shoal.distro.members import MemberManager, read_cluster_conf
from shoal.distro.processor import DistroProcessor
from shoal.distro.snapshot import SNAPSHOT_REQUEST, SnapshotServer, split_page
from shoal.distro.sync import SYNC_REQUEST, SyncEngine
from shoal.distro.transport import PeerError, PeerTransport, PeerUnavailable
from shoal.distro.verify import (
    DETAIL_REQUEST,
    DIGEST_REQUEST,
    VerifyReceiver,
    VerifyStats,
    bucket_count,
    detail_request,
    digest_request,
    responsible_revisions,
)
from shoal.errors import Forbidden, NoHandler
from shoal.kernels import ownership
from shoal.model.client import Client, ClientKind
from shoal.model.clients import ClientManager
from shoal.model.events import EventBus
from shoal.model.services import ServiceManager
from shoal.tasks import Periodic, run_blocking

log = logging.getLogger(__name__)

REPORT_REQUEST = "MemberReportRequest"


class _PeerLoading(Exception):
    """The peer is itself still loading its snapshot."""
EXPIRY_CHECK_MS = 5000


class DistroProtocol:
    def __init__(self, config: Config, clock: Clock, bus: EventBus, clients: ClientManager,
                 services: ServiceManager, members: MemberManager, transport: PeerTransport,
                 on_renew: Callable[[Client, int], object] | None = None) -> None:
        self.config = config
        self.clock = clock
        self.clients = clients
        self.members = members
        self.transport = transport
        self.mapper = DistroMapper(members)
        self.engine = SyncEngine(config, clock, members, transport, self._record_of)
        self.processor = DistroProcessor(clock, bus, clients, services, self.mapper, self.engine)
        self.receiver = VerifyReceiver(clock, clients, on_renew, lambda: self.loaded)
        self.snapshots = SnapshotServer(clock, clients, members.self_address, config.snapshot_chunk_bytes,
                                        lambda: self.loaded)
        self.verify_stats = VerifyStats()
        self.loaded = not members.is_clustered()
        self.test_drop_sync = 0  # TEST HOOK (shoal.config.TestHooks.drop_incoming_sync), set by the node
        self._conf_mtime: int | None = None
        self._load_task: asyncio.Task[None] | None = None
        self._verify_task: asyncio.Task[None] | None = None
        self._last_healthy: list[str] | None = list(members.healthy_addresses())
        members.listeners.append(self._on_members_changed)
        self.periodics = [
            Periodic("distro-verify", config.verify_interval_ms, self.verify_round),
            Periodic("distro-expiry", EXPIRY_CHECK_MS, self._expire),
            Periodic("member-report", config.member_report_interval_ms, self.report_round,
                     initial_delay_ms=0),
        ]
        if config.cluster_conf:
            self.periodics.append(Periodic("cluster-conf-reload", 5000, self.reload_cluster_conf))

    # --- lifecycle --------------------------------------------------------------------------
    async def start(self) -> None:
        self.engine.start()
        for periodic in self.periodics:
            periodic.start()
        if not self.loaded:
            self._load_task = asyncio.get_running_loop().create_task(self.load_snapshot(), name="distro-load")

    async def stop(self) -> None:
        for task in (self._load_task, self._verify_task):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        for periodic in self.periodics:
            await periodic.stop()
        await self.engine.stop()
        await self.transport.close()

    async def wait_loaded(self, timeout_s: float) -> bool:
        if self.loaded or self._load_task is None:
            return True
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.shield(self._load_task)
        except TimeoutError:
            log.warning("no snapshot loaded within %.0f s; serving with what this node has", timeout_s)
            return False
        return self.loaded

    # --- the cluster port's handlers ---------------------------------------------------------
    async def dispatch(self, sender: str, type_name: str, body: bytes) -> tuple[str, bytes]:
        """Handle one cluster request from the peer at ``sender``."""
        if sender and sender != self.members.self_address and sender not in self.members.peers:
            raise Forbidden(f"{sender} is not a member of this cluster")
        if type_name == SYNC_REQUEST:
            if self.test_drop_sync > 0:  # test hook: lose this batch on purpose
                self.test_drop_sync -= 1
                log.warning("TEST HOOK: dropped a sync batch from %s", sender)
                return "DistroSyncResponse", b'{"applied":0}'
            batch = records.decode(body)
            applied = self.processor.apply(sender, batch)
            return "DistroSyncResponse", json.dumps({"applied": applied}).encode()
        if type_name == DIGEST_REQUEST:
            return "DistroVerifyResponse", self.receiver.on_digest(sender, body)
        if type_name == DETAIL_REQUEST:
            return "DistroVerifyDetailResponse", self.receiver.on_detail(sender, body)
        if type_name == SNAPSHOT_REQUEST:
            return "DistroSnapshotResponse", await self.snapshots.page(body)
        if type_name == REPORT_REQUEST:
            self.members.report_succeeded(sender)
            return "MemberReportResponse", json.dumps({"node": self.members.self_member.to_nacos()}).encode()
        raise NoHandler()

    # --- sync -------------------------------------------------------------------------------
    def _record_of(self, client_id: str, op: int) -> records.ClientRecord | None:
        return self.processor.record_of(client_id, op)

    # --- verify -----------------------------------------------------------------------------
    async def verify_round(self) -> None:
        """One verify round to every UP/SUSPICIOUS peer (only after the initial load)."""
        if not self.loaded or not self.members.is_clustered():
            return
        ids, revisions = responsible_revisions(self.clients, self.mapper.responsible_client)
        body = digest_request(ids, revisions)
        healthy = set(self.members.healthy_addresses())
        peers = [m.address for m in self.members.peer_list() if m.address in healthy]
        self.verify_stats.rounds += 1
        await asyncio.gather(*(self._verify_peer(p, ids, revisions, body) for p in peers))

    async def _verify_peer(self, target: str, ids: list[str], revisions: list[int], body: bytes) -> None:
        stats = {"requests": 1, "bytes": len(body), "mismatched": 0, "resynced": 0}
        try:
            kind, answer = await self.transport.call(target, DIGEST_REQUEST, body, self.config.verify_timeout_ms)
            if kind != "DistroVerifyResponse":
                raise PeerError(f"{target} answered {kind}")
            reply = json.loads(answer)
            if reply.get("loading"):
                log.info("verify with %s skipped: it is still loading its snapshot", target)
                self._record_verify(target, stats)
                return
            mismatched = set(reply["mismatched"])
            if mismatched:
                n = bucket_count(len(ids))
                detail = detail_request(ids, revisions, n, mismatched)
                stats["requests"] += 1
                stats["bytes"] += len(detail)
                stats["mismatched"] = len(mismatched)
                kind, answer = await self.transport.call(target, DETAIL_REQUEST, detail,
                                                         self.config.verify_timeout_ms)
                if kind != "DistroVerifyDetailResponse":
                    raise PeerError(f"{target} answered {kind}")
                resync = json.loads(answer)["resync"]
                # verify failed for these: ADD to that peer, no delay — at most what its queue has
                # room for, so a huge repair cannot collapse the queue it is feeding; the rest
                # is found again by the next round.
                queue = self.engine.queues.get(target)
                room = self.config.sync_queue_max - (len(queue.pending) if queue is not None else 0)
                for client_id in resync[:max(room, 0)]:
                    self.engine.enqueue(client_id, records.OP_CHANGE, [target], delay_ms=0)
                stats["resynced"] = min(len(resync), max(room, 0))
                if resync:
                    log.info("verify with %s: %d clients missing or stale there, re-sending %d", target,
                             len(resync), stats["resynced"])
                if len(resync) > room:
                    return self._record_verify(target, stats)
            queue = self.engine.queues.get(target)
            if queue is not None:
                queue.needs_full_verify = False
        except (PeerUnavailable, PeerError, TimeoutError, ValueError, KeyError) as exc:
            log.warning("verify with %s failed: %s", target, exc)
        self._record_verify(target, stats)

    def _record_verify(self, target: str, stats: dict[str, int]) -> None:
        self.verify_stats.requests += stats["requests"]
        self.verify_stats.bytes_sent += stats["bytes"]
        self.verify_stats.resynced += stats["resynced"]
        self.verify_stats.last_round[target] = stats

    async def _expire(self) -> None:
        self.processor.expire(self.config.client_expired_time_ms)

    # --- snapshot load ----------------------------------------------------------------------
    async def load_snapshot(self) -> None:
        """Load every client from the first peer that answers, preferring peers that finished
        their own load; when every reachable peer is itself loading (a cluster starting cold)
        take one of those. Retry until a load succeeds."""
        while not self.loaded:
            loading_peers: list[str] = []
            for accept_loading in (False, True):
                candidates = loading_peers if accept_loading else [m.address for m in self.members.peer_list()]
                for address in candidates:
                    try:
                        count = await self._load_from(address, accept_loading)
                    except _PeerLoading:
                        loading_peers.append(address)
                        continue
                    except (PeerUnavailable, PeerError, TimeoutError, ValueError) as exc:
                        log.warning("snapshot load from %s failed: %s", address, exc)
                        continue
                    self._loaded_from(address, count)
                    return
            await asyncio.sleep(self.config.load_retry_delay_ms / 1000)

    def _loaded_from(self, address: str, count: int) -> None:
        log.info("loaded a snapshot of %d clients from %s", count, address)
        self.loaded = True
        self._last_healthy = None  # every loaded ip:port client is evaluated
        self._refresh_native()

    async def _load_from(self, target: str, accept_loading: bool = True) -> int:
        session: object = ""
        offset: object = 0
        total = 0
        while True:
            request = json.dumps({"session": session, "offset": offset}).encode()
            kind, body = await self.transport.call(target, SNAPSHOT_REQUEST, request, self.config.load_timeout_ms)
            if kind != "DistroSnapshotResponse":
                raise PeerError(f"{target} answered {kind}: {body[:200]!r}")
            header, groups = split_page(body)
            if header.get("loading") and not accept_loading:
                raise _PeerLoading(target)
            for owner, batch in groups:
                decoded = await run_blocking(records.decode, batch)
                if owner == self.members.self_address:
                    decoded = self._forget_previous_life(decoded)
                self.processor.apply(owner, decoded)
                total += len(decoded)
                await asyncio.sleep(0)  # let the loop breathe between groups
            if header.get("done"):
                return total
            session, offset = header["session"], header["next"]

    def _forget_previous_life(self, batch: list[records.ClientRecord]) -> list[records.ClientRecord]:
        """Peers' copies of connection clients we owned before a restart: those connections died
        with the old process, so, as their owner, send the DELETE; ip:port clients are kept."""
        kept = []
        for record in batch:
            live = self.clients.get(record[1])
            if live is not None and live.native:
                continue  # ours and alive (this node served before its load finished): keep it
            if records.kind_of(record[1]) is ClientKind.CONNECTION:
                self.engine.enqueue(record[1], records.OP_DELETE)
            else:
                kept.append(record)
        dropped = len(batch) - len(kept)
        if dropped:
            log.info("deleting %d connection clients of this node's previous run from its peers", dropped)
        return kept

    # --- membership -------------------------------------------------------------------------
    async def report_round(self) -> None:
        """Report to every peer; the answer (or its absence) drives the peer's state."""
        body = json.dumps({"node": self.members.self_member.to_nacos()}).encode()

        async def report(address: str) -> None:
            try:
                kind, _ = await self.transport.call(address, REPORT_REQUEST, body, 3000)
            except PeerUnavailable as exc:
                self.members.report_failed(address, refused=exc.refused)
                return
            except TimeoutError:
                self.members.report_failed(address)
                return
            if kind == "MemberReportResponse":
                self.members.report_succeeded(address)
            else:
                self.members.report_failed(address)

        await asyncio.gather(*(report(m.address) for m in self.members.peer_list()))

    async def reload_cluster_conf(self) -> None:
        path = Path(self.config.cluster_conf)
        try:
            mtime = (await run_blocking(path.stat)).st_mtime_ns
        except OSError as exc:
            log.warning("cannot read cluster.conf %s: %s", path, exc)
            return
        if mtime == self._conf_mtime:
            return
        self._conf_mtime = mtime
        try:
            members = await run_blocking(read_cluster_conf, path)
        except (OSError, ValueError) as exc:
            log.error("cluster.conf %s is invalid, keeping the current members: %s", path, exc)
            return
        if self.members.set_members(members):
            log.info("cluster.conf reloaded: %s", [a for a, _ in members])

    def _on_members_changed(self) -> None:
        log.info("healthy members now %s", self.members.healthy_addresses())
        self._refresh_native()
        # A peer that is back may have missed changes while DOWN (its queue collapsed to
        # "needs full verify"): verify now rather than at the next 5 s tick.
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

    def _refresh_native(self) -> None:
        """ip:port clients follow the hash: the new owner takes over, the old one keeps a copy
        (nothing is deleted because ownership moved; expiry or the owner's DELETE does that).

        Between two healthy lists only the clients the ownership kernel reports as moved are
        looked at; after a snapshot load (no previous list) every ip:port client is."""
        healthy = list(self.members.healthy_addresses())
        previous, self._last_healthy = self._last_healthy, healthy
        ip_port = [c for c in self.clients if c.kind is ClientKind.IP_PORT]
        if not ip_port:
            return
        tags = [responsible_id(c.client_id) for c in ip_port]
        if previous is not None and previous and healthy:
            moved = ownership.moved_keys(tags, previous, healthy)
            ip_port = [ip_port[i] for i in moved]
            tags = [tags[i] for i in moved]
        owners = self.mapper.owners_of(tags)
        me = self.members.self_address
        for client, owner in zip(ip_port, owners, strict=True):
            mine = owner == me
            if mine and not client.native:
                client.native = True
                self.engine.enqueue(client.client_id, records.OP_CHANGE)
            elif not mine and client.native:
                client.native = False
                client.owner = owner
                client.last_renew_ms = self.clock.monotonic_ms()

    def describe(self) -> dict[str, Any]:
        return {
            "self": self.members.self_address,
            "members": [m.to_nacos() for m in self.members.all_members()],
            "loaded": self.loaded,
            "sync_pending": self.engine.pending_count(),
            "verify_rounds": self.verify_stats.rounds,
        }
