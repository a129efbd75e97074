"""The client manager (Nacos ClientManagerDelegate) and the model's one write path.

Every change of a client — added, released, a publication stored / removed / replaced, a
health flip, a subscription, who holds it (``native``, ``owner``) — goes through a method
here, which changes the client *and* publishes the matching model event. Nothing else edits
``Client.publications``, ``Client.subscriptions``, ``native``, ``owner`` or ``last_renew_ms``
or publishes client events, so the indexes, push, the beat table, Distro and the change log
always see a write, and always with what it removed.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from shoal.model.client import Client, ClientKind, Publication, Subscriber
from shoal.model.events import (
    REASON_REPLACED,
    ClientChanged,
    ClientConnected,
    ClientDeregisteredService,
    ClientOwnershipChanged,
    ClientRegisteredService,
    ClientReleased,
    ClientSubscribedService,
    ClientUnsubscribedService,
    EventBus,
    InstanceHealthChanged,
    ServiceChanged,
)
from shoal.model.keys import ServiceKey


class ClientManager:
    """All clients of this node, native and synced, keyed by client id — and their only writer.

    Times passed in: ``now_ms`` is the monotonic clock (the client's ``last_updated_ms``),
    ``wall_ms`` the wall clock (``ServiceChanged.changed_at_ms``).
    """

    def __init__(self, bus: EventBus) -> None:
        self._bus = bus
        self.clients: dict[str, Client] = {}

    def __len__(self) -> int:
        return len(self.clients)

    def __iter__(self) -> Iterator[Client]:
        return iter(self.clients.values())

    def get(self, client_id: str) -> Client | None:
        return self.clients.get(client_id)

    def count(self, kind: ClientKind | None = None) -> int:
        if kind is None:
            return len(self.clients)
        return sum(1 for c in self.clients.values() if c.kind is kind)

    # --- clients ------------------------------------------------------------------------
    def add(self, client: Client) -> None:
        """Add a new client; a client with the same id is released first."""
        existing = self.clients.get(client.client_id)
        if existing is not None:
            self.remove(existing.client_id, REASON_REPLACED)
        self.clients[client.client_id] = client
        self._bus.publish(ClientConnected(client))

    def remove(self, client_id: str, reason: str) -> Client | None:
        """Release a client: its instances and subscriptions go with it (indexes follow)."""
        client = self.clients.pop(client_id, None)
        if client is not None:
            self._bus.publish(ClientReleased(client, reason))
        return client

    # --- who holds a client --------------------------------------------------------------
    def set_native(self, client: Client, native: bool) -> bool:
        """Make this node hold the client's authoritative state (True) or a copy of it (False);
        False when unchanged. Publishes ClientOwnershipChanged (the verify digests regroup it)."""
        if client.native == native:
            return False
        client.native = native
        self._bus.publish(ClientOwnershipChanged(client))
        return True

    def set_owner(self, client: Client, owner: str) -> bool:
        """Record the node a synced copy comes from; False when unchanged. Publishes
        ClientOwnershipChanged."""
        if client.owner == owner:
            return False
        client.owner = owner
        self._bus.publish(ClientOwnershipChanged(client))
        return True

    def renew(self, client: Client, now_mono_ms: int) -> None:
        """A synced copy's owner vouched for it now (a sync record or a verify round). No event:
        nothing indexes the renewal time; the expiry scan reads it."""
        client.last_renew_ms = now_mono_ms

    # --- publications -------------------------------------------------------------------
    def publish(self, client: Client, service: ServiceKey, publication: Publication, now_ms: int,
                reason: str = "") -> bool:
        """Store the client's publication for the service, replacing any previous one.

        Publishes ClientRegisteredService then ClientChanged; a publication equal to the
        stored one (a redo after reconnect, a repeated call) changes nothing: False.
        """
        if client.publications.get(service) == publication:
            return False
        client.publications[service] = publication
        _bump(client, now_ms)
        self._bus.publish(ClientRegisteredService(service, client.client_id, reason))
        self._bus.publish(ClientChanged(client))
        return True

    def unpublish(self, client: Client, service: ServiceKey, now_ms: int, reason: str = "") -> Publication | None:
        """Remove the client's publication for the service; returns it (None: there was none).

        Publishes ClientDeregisteredService carrying the removed instances, then ClientChanged.
        """
        removed = client.publications.pop(service, None)
        if removed is None:
            return None
        _bump(client, now_ms)
        self._bus.publish(ClientDeregisteredService(service, client.client_id, removed.instances, reason))
        self._bus.publish(ClientChanged(client))
        return removed

    def replace(self, client: Client, publications: Mapping[ServiceKey, Publication], now_ms: int,
                revision: int | None = None) -> bool:
        """Make the client publish exactly ``publications`` (Nacos ``upgradeClient``).

        Changed or new services are re-published (ClientRegisteredService), vanished ones
        removed (ClientDeregisteredService with their instances), then one ClientChanged.
        ``revision`` sets the client's revision (a peer's record carries its owner's);
        without it the revision moves by one when anything changed. True when anything —
        publications or the given revision — changed.
        """
        held = client.publications
        registered = [s for s, p in publications.items() if (h := held.get(s)) is not p and h != p]
        vanished = [s for s in client.publications if s not in publications]
        if not registered and not vanished and (revision is None or revision == client.revision):
            return False
        for service in registered:
            client.publications[service] = publications[service]
        removed = [(service, client.publications.pop(service)) for service in vanished]
        if revision is None:
            client.revision += 1
        else:
            client.revision = revision
        client.last_updated_ms = now_ms
        for service in registered:
            self._bus.publish(ClientRegisteredService(service, client.client_id))
        for service, publication in removed:
            self._bus.publish(ClientDeregisteredService(service, client.client_id, publication.instances))
        if registered or removed:
            self._bus.publish(ClientChanged(client))
        return True

    def set_health(self, client: Client, service: ServiceKey, healthy: bool, wall_ms: int, reason: str = "") -> bool:
        """Flip the health of the client's instances of the service; False if unchanged.

        Publishes InstanceHealthChanged, ServiceChanged (views drop, subscribers are pushed,
        gRPC ones included) and ClientChanged (Distro syncs it).
        """
        publication = client.publications.get(service)
        if publication is None or all(i.healthy == healthy for i in publication.instances):
            return False
        client.publications[service] = Publication(
            tuple(i.with_health(healthy) for i in publication.instances), publication.batch)
        client.revision += 1  # a health flip does not count as activity (last_updated_ms stays)
        self._bus.publish(InstanceHealthChanged(service, client.client_id, healthy, reason))
        self._bus.publish(ServiceChanged(service, wall_ms))
        self._bus.publish(ClientChanged(client))
        return True

    # --- subscriptions ------------------------------------------------------------------
    def subscribe(self, client: Client, subscriber: Subscriber, now_ms: int) -> bool:
        """Add or replace the client's subscription; True when it is the first for the service.

        Publishes ClientSubscribedService (push sends the first ServiceInfo when ``first``).
        """
        service = subscriber.service
        first = service not in client.subscriptions
        client.subscriptions[service] = subscriber
        client.last_updated_ms = now_ms
        self._bus.publish(ClientSubscribedService(service, client.client_id, subscriber, first))
        return first

    def unsubscribe(self, client: Client, service: ServiceKey, now_ms: int) -> bool:
        """Drop the client's subscription; publishes ClientUnsubscribedService if it had one."""
        client.last_updated_ms = now_ms
        if client.subscriptions.pop(service, None) is None:
            return False
        self._bus.publish(ClientUnsubscribedService(service, client.client_id))
        return True


def _bump(client: Client, now_ms: int) -> None:
    # Nacos connection clients count revisions up from 0 on every publish change.
    client.revision += 1
    client.last_updated_ms = now_ms
