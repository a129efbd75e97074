"""The naming clients of SDK connections (Nacos ConnectionBasedClientManager): created when a
naming connection is set up, released when it goes."""

from __future__ import annotations

from shoal.clock import Clock
from shoal.model.client import Client, ClientKind
from shoal.model.clients import ClientManager
from shoal.service_layer.moved import MovedClients


class ConnectionClients:
    """Connection clients: connect and release (a moved connection's client is kept a while)."""

    def __init__(self, clock: Clock, clients: ClientManager, moved: MovedClients) -> None:
        self.clock = clock
        self.clients = clients
        self.moved = moved

    def connect_client(self, client_id: str, client_ip: str, app: str, agent: str) -> None:
        """Create the naming client of a new SDK connection (clientConnected)."""
        mono = self.clock.monotonic_ms()
        self.clients.add(Client(client_id, ClientKind.CONNECTION, native=True, created_ms=self.clock.now_ms(),
                                client_ip=client_ip, app=app, agent=agent, last_updated_ms=mono,
                                last_renew_ms=mono))

    def release_client(self, client_id: str, reason: str) -> None:
        """Remove the naming client of a closed connection and everything it published
        (clientDisconnected); an unknown id is a no-op. A client whose connection was moved by
        rebalancing is kept for its grace period instead (:class:`MovedClients`)."""
        if self.moved.keep(client_id):
            return
        self.clients.remove(client_id, reason)
