"""Subscriptions of connection-based clients (Nacos SubscribeServiceRequestHandler): the answer
is the ServiceInfo the subscriber starts from; pushes follow (:mod:`shoal.push.service`)."""

from __future__ import annotations

from shoal.clock import Clock
from shoal.model.client import Subscriber
from shoal.model.clients import ClientManager
from shoal.model.keys import ServiceKey
from shoal.service_layer.ephemeral import EphemeralInstances
from shoal.service_layer.reads import NamingReads
from shoal.service_layer.validation import InstanceValidator


class Subscriptions:
    """Subscribe and unsubscribe, each answering the service's current ServiceInfo."""

    def __init__(self, clock: Clock, clients: ClientManager, validator: InstanceValidator,
                 ephemeral: EphemeralInstances, reads: NamingReads) -> None:
        self.clock = clock
        self.clients = clients
        self.validator = validator
        self.ephemeral = ephemeral
        self.reads = reads

    def subscribe(self, client_id: str, service: ServiceKey, clusters: str, subscriber_ip: str,
                  agent: str, app: str) -> str:
        self.validator.check_params(service, clusters=clusters)
        client = self.ephemeral.require_client(client_id)
        subscriber = Subscriber(subscriber_ip, agent, app, service, clusters)
        self.clients.subscribe(client, subscriber, self.clock.monotonic_ms())
        return self.reads.service_info(service, clusters, healthy_only=False)

    def unsubscribe(self, client_id: str, service: ServiceKey, clusters: str) -> str:
        self.validator.check_params(service, clusters=clusters)
        client = self.clients.get(client_id)
        if client is not None:
            self.clients.unsubscribe(client, service, self.clock.monotonic_ms())
        return self.reads.service_info(service, clusters, healthy_only=False)
