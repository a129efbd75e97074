"""Applying what peers send (Nacos DistroClientDataProcessor) and emitting what we own.

Outgoing: a ClientChanged of a client this node holds natively → CHANGE to every peer; a
ClientReleased of one → DELETE to every peer. Synced (non-native) clients are never
re-synced. Incoming CHANGE upserts a synced client and reconciles its publications the way
``upgradeClient`` does — changed services are re-published, vanished ones removed — through the
model writer (:meth:`ClientManager.replace`), so the same model events as local writes reach
indexes and push. DELETE releases the synced client.

A client this node owns is never overwritten by a peer's copy, with the ip:port handoff's two
exceptions (docs/protocol.md §6.3, :class:`~shoal.distro.mapper.IpPortHandoff`): an ip:port
client received from a peer that this node is responsible for is taken over (held natively and
sent to every peer), and one this node holds natively *without* being responsible for it (pending
handoff) yields to the copy — CHANGE or DELETE — of the node responsible for it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from shoal.clock import Clock
from shoal.distro import records
from shoal.distro.mapper import DistroMapper, IpPortHandoff, responsible_id
from shoal.distro.records import OP_CHANGE, OP_DELETE, ClientRecord
from shoal.distro.sync import SyncEngine
from shoal.model.client import Client, ClientKind, Publication
from shoal.model.clients import ClientManager
from shoal.model.events import (
    REASON_DELETED_BY_OWNER,
    REASON_EXPIRED,
    ClientChanged,
    ClientReleased,
    DistroSyncApplied,
    EventBus,
)
from shoal.model.keys import ServiceKey
from shoal.model.services import ServiceManager

log = logging.getLogger(__name__)


class DistroProcessor:
    """Turns model changes of this node's clients into sync tasks, and applies peers' records."""

    def __init__(self, clock: Clock, bus: EventBus, clients: ClientManager, services: ServiceManager,
                 mapper: DistroMapper, engine: SyncEngine, handoff: IpPortHandoff) -> None:
        self.clock = clock
        self.bus = bus
        self.clients = clients
        self.services = services
        self.mapper = mapper
        self.engine = engine
        self.handoff = handoff
        self.applied = 0
        #: When a synced copy was last renewed (Distro verify may renew whole buckets lazily).
        self.renewed_at: Callable[[Client], int] = _own_renewal
        bus.subscribe(ClientChanged, self._on_changed)
        bus.subscribe(ClientReleased, self._on_released)

    # --- outgoing ---------------------------------------------------------------------------
    def _on_changed(self, event: ClientChanged) -> None:
        client = event.client
        if client.native:  # responsible for it, or holding it until its responsible node takes it
            self.engine.enqueue(client.client_id, OP_CHANGE)
            self.handoff.note(client)

    def _on_released(self, event: ClientReleased) -> None:
        client = event.client
        # Only this node's own clients are deleted on peers (copies are never echoed back). A
        # replaced client's DELETE merges with its successor's CHANGE (same key, newer wins).
        if client.native and client.replicated:
            self.engine.enqueue(client.client_id, OP_DELETE)

    def record_of(self, client_id: str, op: int) -> ClientRecord | None:
        """The current state of a client for a CHANGE/ADD (None if it is gone)."""
        client = self.clients.get(client_id)
        return records.wire_record(client) if client is not None else None

    # --- incoming ---------------------------------------------------------------------------
    def apply(self, sender: str, batch: list[ClientRecord]) -> int:
        """Apply one batch from ``sender``; returns how many records changed anything.

        Every CHANGE's publications are made first, so a service that does not decode
        (:class:`~shoal.kernels.syncser.SyncDecodeError`) refuses the whole batch before any of it
        is applied, as a batch decoded in full up front does."""
        wanted = [self._wanted(record) if record[0] == OP_CHANGE else None for record in batch]
        changed = 0
        for record, publications in zip(batch, wanted, strict=True):
            op, client_id, _, _ = record
            if op == OP_DELETE:
                changed += self._delete(sender, client_id)
            elif publications is not None:
                changed += self._upsert(sender, record, publications)
            else:
                log.warning("ignoring sync record with unknown op %d from %s", op, sender)
        self.applied += changed
        return changed

    def _wanted(self, record: ClientRecord) -> dict[ServiceKey, Publication]:
        """The publications a CHANGE carries, reusing those the copy held already holds unchanged
        (one client's record comes once per batch; a repeat would still be read right, just
        without the reuse)."""
        held = self.clients.get(record[1])
        return records.publications_of(record, held.publications if held is not None else None)

    def _upsert(self, sender: str, record: ClientRecord, wanted: dict[ServiceKey, Publication]) -> int:
        _, client_id, revision, _ = record
        now_mono = self.clock.monotonic_ms()
        client = self.clients.get(client_id)
        if client is not None and client.native:
            if not self._yields_to(client, sender):
                return 0  # ours: a peer's copy never overwrites it
            self.clients.set_native(client, False)  # pending handoff confirmed: ours is a copy of the responsible's
            self.handoff.confirmed(client_id)
        if client is None:
            client = Client(client_id, records.kind_of(client_id), native=False, created_ms=self.clock.now_ms(),
                            owner=sender, last_renew_ms=now_mono, last_updated_ms=now_mono)
            self.clients.add(client)
        self.clients.set_owner(client, sender)
        self.clients.renew(client, now_mono)
        held = client.publications
        now_wall = self.clock.now_ms()
        for service, publication in wanted.items():
            if held.get(service) is not publication:  # a service this copy publishes exists already
                self.services.get_or_create(service, now_wall)
        replaced = self.clients.replace(client, wanted, now_mono, revision=revision)
        self.handoff.take_over(client)  # an ip:port client this node is responsible for
        if replaced:
            self.bus.publish(DistroSyncApplied(sender, client_id, "change"))
            return 1
        return 0

    def _yields_to(self, client: Client, sender: str) -> bool:
        """True when ``client`` is an ip:port client held here pending handoff and ``sender`` is
        the node responsible for it."""
        return (client.kind is ClientKind.IP_PORT and not self.mapper.responsible_client(client)
                and self.mapper.owner_of(responsible_id(client.client_id)) == sender)

    def _delete(self, sender: str, client_id: str) -> int:
        client = self.clients.get(client_id)
        if client is None or (client.native and not self._yields_to(client, sender)):
            return 0
        if client.native:
            self.clients.set_native(client, False)
            self.handoff.confirmed(client_id)
        self.clients.remove(client_id, REASON_DELETED_BY_OWNER)
        self.bus.publish(DistroSyncApplied(client.owner, client_id, "delete"))
        return 1

    def remove_copy(self, owner: str, client_id: str, revision: int) -> bool:
        """Remove a copy its owner confirmed (by verify) it no longer has: only a copy still held
        from ``owner`` at ``revision`` — a newer CHANGE, another owner's copy or a native client
        stays."""
        client = self.clients.get(client_id)
        if client is None or client.native or client.owner != owner or client.revision != revision:
            return False
        self.clients.remove(client_id, REASON_DELETED_BY_OWNER)
        self.bus.publish(DistroSyncApplied(owner, client_id, "delete"))
        return True

    def expire(self, expired_after_ms: int) -> int:
        """Release synced clients their owner stopped renewing (ConnectionBasedClient.isExpire)."""
        now = self.clock.monotonic_ms()
        renewed_at = self.renewed_at
        stale = [c.client_id for c in self.clients if not c.native and now - renewed_at(c) > expired_after_ms]
        for client_id in stale:
            self.clients.remove(client_id, REASON_EXPIRED)
        if stale:
            log.info("expired %d synced clients not renewed for %d ms", len(stale), expired_after_ms)
        return len(stale)


def _own_renewal(client: Client) -> int:
    return client.last_renew_ms
