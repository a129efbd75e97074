"""Applying what peers send (Nacos DistroClientDataProcessor) and emitting what we own.

Outgoing: a ClientChanged of a client this node is responsible for → CHANGE to every peer; a
ClientReleased of one → DELETE to every peer. Synced (non-native) clients are never
re-synced. Incoming CHANGE upserts a synced client and reconciles its publications the way
``upgradeClient`` does — changed services are re-published, vanished ones removed — through the
model writer (:meth:`ClientManager.replace`), so the same model events as local writes reach
indexes and push. DELETE releases the synced client. A client this node owns is never
overwritten by a peer's copy.
"""

from __future__ import annotations

import logging

from shoal.clock import Clock
from shoal.distro import records
from shoal.distro.mapper import DistroMapper
from shoal.distro.records import OP_CHANGE, OP_DELETE, ClientRecord
from shoal.distro.sync import SyncEngine
from shoal.model.client import Client
from shoal.model.clients import ClientManager
from shoal.model.events import (
    REASON_DELETED_BY_OWNER,
    REASON_EXPIRED,
    ClientChanged,
    ClientReleased,
    DistroSyncApplied,
    EventBus,
)
from shoal.model.services import ServiceManager

log = logging.getLogger(__name__)


class DistroProcessor:
    """Turns model changes of this node's clients into sync tasks, and applies peers' records."""

    def __init__(self, clock: Clock, bus: EventBus, clients: ClientManager, services: ServiceManager,
                 mapper: DistroMapper, engine: SyncEngine) -> None:
        self.clock = clock
        self.bus = bus
        self.clients = clients
        self.services = services
        self.mapper = mapper
        self.engine = engine
        self.applied = 0
        bus.subscribe(ClientChanged, self._on_changed)
        bus.subscribe(ClientReleased, self._on_released)

    # --- outgoing ---------------------------------------------------------------------------
    def _on_changed(self, event: ClientChanged) -> None:
        client = event.client
        if client.native and self.mapper.responsible_client(client):
            self.engine.enqueue(client.client_id, OP_CHANGE)

    def _on_released(self, event: ClientReleased) -> None:
        client = event.client
        # Only this node's own clients are deleted on peers (copies are never echoed back). A
        # replaced client's DELETE merges with its successor's CHANGE (same key, newer wins).
        if client.native and client.replicated:
            self.engine.enqueue(client.client_id, OP_DELETE)

    def record_of(self, client_id: str, op: int) -> ClientRecord | None:
        """The current state of a client for a CHANGE/ADD (None if it is gone)."""
        client = self.clients.get(client_id)
        return records.client_record(client) if client is not None else None

    # --- incoming ---------------------------------------------------------------------------
    def apply(self, sender: str, batch: list[ClientRecord]) -> int:
        """Apply one decoded batch from ``sender``; returns how many records changed anything."""
        changed = 0
        for record in batch:
            op, client_id, _, _ = record
            if op == OP_DELETE:
                changed += self._delete(client_id)
            elif op == OP_CHANGE:
                changed += self._upsert(sender, record)
            else:
                log.warning("ignoring sync record with unknown op %d from %s", op, sender)
        self.applied += changed
        return changed

    def _upsert(self, sender: str, record: ClientRecord) -> int:
        _, client_id, revision, _ = record
        now_mono = self.clock.monotonic_ms()
        client = self.clients.get(client_id)
        if client is not None and client.native:
            return 0  # ours: a peer's copy never overwrites it
        if client is None:
            client = Client(client_id, records.kind_of(client_id), native=False, created_ms=self.clock.now_ms(),
                            owner=sender, last_renew_ms=now_mono, last_updated_ms=now_mono)
            self.clients.add(client)
        client.owner = sender
        client.last_renew_ms = now_mono
        wanted = records.publications_of(record)
        now_wall = self.clock.now_ms()
        for service in wanted:
            self.services.get_or_create(service, now_wall)
        if self.clients.replace(client, wanted, now_mono, revision=revision):
            self.bus.publish(DistroSyncApplied(sender, client_id, "change"))
            return 1
        return 0

    def _delete(self, client_id: str) -> int:
        client = self.clients.get(client_id)
        if client is None or client.native:
            return 0
        self.clients.remove(client_id, REASON_DELETED_BY_OWNER)
        self.bus.publish(DistroSyncApplied(client.owner, client_id, "delete"))
        return 1

    def expire(self, expired_after_ms: int) -> int:
        """Release synced clients their owner stopped renewing (ConnectionBasedClient.isExpire)."""
        now = self.clock.monotonic_ms()
        stale = [c.client_id for c in self.clients if not c.native and now - c.last_renew_ms > expired_after_ms]
        for client_id in stale:
            self.clients.remove(client_id, REASON_EXPIRED)
        if stale:
            log.info("expired %d synced clients not renewed for %d ms", len(stale), expired_after_ms)
        return len(stale)
