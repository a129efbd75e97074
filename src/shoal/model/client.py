"""Clients: who publishes and who subscribes (Nacos ``Client`` / ``AbstractClient``).

A *connection* client's id is its gRPC connection id and it lives exactly as long as the
connection (on its own node) or until its owner stops renewing it (on peers). An *ip:port*
client (HTTP Open API, ``ip:port#true``) lives by heartbeats. Either way the client holds at
most one publication per service (a single instance or a batch) and one subscription per
service, and carries a revision that moves on every change (Distro verify compares it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from shoal.model.instance import InstanceInfo
from shoal.model.keys import ServiceKey


class ClientKind(StrEnum):
    CONNECTION = "connection"
    IP_PORT = "ip_port"


@dataclass(frozen=True, slots=True)
class Subscriber:
    """A subscription record (Nacos ``Subscriber``): who to push to, and with which clusters."""

    ip: str
    agent: str
    app: str
    service: ServiceKey
    clusters: str = ""


@dataclass(slots=True)
class Publication:
    """What a client publishes for one service: one instance, or a batch that replaced it."""

    instances: tuple[InstanceInfo, ...]
    batch: bool = False


@dataclass(eq=False, slots=True)
class Client:
    """Publications and subscriptions of one client, with its revision.

    ``native`` is true when this node is responsible for the client (its connection is here,
    or the Distro hash maps its ip:port here); synced copies from peers are not native.
    """

    client_id: str
    kind: ClientKind
    native: bool
    created_ms: int
    client_ip: str = ""
    app: str = "-"
    agent: str = ""
    revision: int = 0
    owner: str = ""  # for synced clients: the address of the node that replicated it here
    last_updated_ms: int = 0
    last_renew_ms: int = 0
    publications: dict[ServiceKey, Publication] = field(default_factory=dict)
    subscriptions: dict[ServiceKey, Subscriber] = field(default_factory=dict)

    def publish(self, service: ServiceKey, publication: Publication, now_ms: int) -> Publication | None:
        """Store the publication (replacing any previous one); return the replaced one."""
        previous = self.publications.get(service)
        self.publications[service] = publication
        self._changed(now_ms)
        return previous

    def unpublish(self, service: ServiceKey, now_ms: int) -> Publication | None:
        removed = self.publications.pop(service, None)
        if removed is not None:
            self._changed(now_ms)
        return removed

    def subscribe(self, subscriber: Subscriber, now_ms: int) -> bool:
        """Add or replace the subscription; True when it is the first for the service."""
        first = subscriber.service not in self.subscriptions
        self.subscriptions[subscriber.service] = subscriber
        self.last_updated_ms = now_ms
        return first

    def unsubscribe(self, service: ServiceKey, now_ms: int) -> bool:
        self.last_updated_ms = now_ms
        return self.subscriptions.pop(service, None) is not None

    def instance_count(self) -> int:
        return sum(len(p.instances) for p in self.publications.values())

    def _changed(self, now_ms: int) -> None:
        # Nacos connection clients count revisions up from 0 on every publish change.
        self.revision += 1
        self.last_updated_ms = now_ms
