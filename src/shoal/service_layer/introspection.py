"""What an operator asks about this node's naming clients and counts (Nacos
ClientInfoControllerV2 and OperatorController.metrics)."""

from __future__ import annotations

import os
from collections.abc import Callable

from shoal.errors import NotFound
from shoal.model.client import Client, ClientKind, Subscriber
from shoal.model.clients import ClientManager
from shoal.model.instance import InstanceInfo
from shoal.model.ip_port import responsible_tag
from shoal.model.keys import ServiceKey
from shoal.model.services import ServiceIndex, ServiceManager, ServiceStorage
from shoal.service_layer.views import ClientDetail, OperatorMetrics, load_and_mem
from shoal.tasks import run_blocking


class Introspection:
    """Client lists and details, and the operator metrics."""

    def __init__(self, clients: ClientManager, services: ServiceManager, index: ServiceIndex,
                 storage: ServiceStorage) -> None:
        self.clients = clients
        self.services = services
        self.index = index
        self.storage = storage

    def client_ids(self) -> list[str]:
        """Every naming client of this node (own and replicated), sorted."""
        return sorted(c.client_id for c in self.clients)

    def _client(self, client_id: str) -> Client:
        client = self.clients.get(client_id)
        if client is None:
            raise NotFound(f"clientId {client_id} not exist")
        return client

    def client_detail(self, client_id: str) -> ClientDetail:
        """One client: connection-based (ip, port from its id, app, agent) or ip:port."""
        client = self._client(client_id)
        if client.kind is ClientKind.CONNECTION:
            return ClientDetail(client.client_id, True, client.last_updated_ms, client.client_ip,
                                client.client_id.rpartition("_")[2], client.app, client.agent)
        ip, _, port = responsible_tag(client.client_id).rpartition(":")
        return ClientDetail(client.client_id, False, client.last_updated_ms, ip, port, "", "")

    def client_publications(self, client_id: str) -> list[tuple[ServiceKey, InstanceInfo]]:
        """Every instance the client publishes, by service (sorted)."""
        client = self._client(client_id)
        return [(key, inst) for key, publication in sorted(client.publications.items())
                for inst in publication.instances]

    def client_subscriptions(self, client_id: str) -> list[tuple[ServiceKey, Subscriber]]:
        """Every service the client subscribes to, with its subscriber (sorted)."""
        client = self._client(client_id)
        return sorted(client.subscriptions.items())

    async def operator_metrics(self, owner_of: Callable[[str], str | None]) -> OperatorMetrics:
        """OperatorController.metrics; ``owner_of`` says who handles an ``ip:port`` (None: this node)."""
        clients = list(self.clients)
        responsible = [c for c in clients if (c.native if c.kind is ClientKind.CONNECTION
                                              else owner_of(responsible_tag(c.client_id)) is None)]
        load, mem = await run_blocking(load_and_mem)
        return OperatorMetrics(
            service_count=len(self.services),
            instance_count=self.storage.instance_count(),
            subscribe_count=sum(len(s) for s in self.index.subscribers.values()),
            responsible_instance_count=sum(c.instance_count() for c in responsible),
            client_count=len(clients),
            connection_based_client_count=sum(1 for c in clients if c.kind is ClientKind.CONNECTION),
            ephemeral_ip_port_client_count=sum(1 for c in clients if c.kind is ClientKind.IP_PORT),
            responsible_client_count=len(responsible),
            cpu=min(load / (os.cpu_count() or 1), 1.0),
            load=load,
            mem=mem,
        )
