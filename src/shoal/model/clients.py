"""The client manager (Nacos ClientManagerDelegate): every client, connection or ip:port."""

from __future__ import annotations

from collections.abc import Iterator

from shoal.model.client import Client, ClientKind
from shoal.model.events import REASON_REPLACED, ClientConnected, ClientReleased, EventBus


class ClientManager:
    """All clients of this node, native and synced, keyed by client id."""

    def __init__(self, bus: EventBus) -> None:
        self._bus = bus
        self.clients: dict[str, Client] = {}

    def __len__(self) -> int:
        return len(self.clients)

    def __iter__(self) -> Iterator[Client]:
        return iter(self.clients.values())

    def get(self, client_id: str) -> Client | None:
        return self.clients.get(client_id)

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

    def count(self, kind: ClientKind | None = None) -> int:
        if kind is None:
            return len(self.clients)
        return sum(1 for c in self.clients.values() if c.kind is kind)
