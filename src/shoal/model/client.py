"""Clients: who publishes and who subscribes (Nacos ``Client`` / ``AbstractClient``).

A *connection* client's id is its gRPC connection id and it lives exactly as long as the
connection (on its own node) or until its owner stops renewing it (on peers). An *ip:port*
client (HTTP Open API, ``ip:port#true``) lives by heartbeats. Either way the client holds at
most one publication per service (a single instance or a batch) and one subscription per
service, and carries a revision that moves on every change (Distro verify compares it).
Writes go through :class:`shoal.model.clients.ClientManager`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from shoal.model.instance import InstanceInfo
from shoal.model.keys import ServiceKey


class ClientKind(StrEnum):
    """How a client lives: by its gRPC connection, or by heartbeats of its ``ip:port``."""

    CONNECTION = "connection"
    IP_PORT = "ip_port"
    #: The synthetic publisher of one service's persistent instances, built on every node from
    #: the CP store's view (shoal.service_layer.persistent); never replicated by Distro.
    PERSISTENT = "persistent"


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
    """What a client publishes for one service: one instance, or a batch that replaced it.

    Publications are replaced, never changed. ``sync_wire`` memoises the publication's encoding
    in Distro's sync records under the service it is published for
    (:func:`shoal.distro.records.service_bytes`): the record of a client with 100 publications
    is sent again for every change of one of them, and with the memo an unchanged publication is
    neither encoded again on the owner nor decoded again on a copy. Not part of the value
    (equality, repr) and never passed in.
    """

    instances: tuple[InstanceInfo, ...]
    batch: bool = False
    sync_wire: tuple[ServiceKey, bytes] | None = field(default=None, init=False, compare=False, repr=False)


@dataclass(eq=False, slots=True)
class Client:
    """Publications and subscriptions of one client, with its revision.

    ``native`` is true when this node holds the client's authoritative state: its connection is
    here, or the Distro hash maps its ip:port here, or (ip:port only) it holds the client until
    the responsible node takes it over (pending handoff, docs/protocol.md §6.3); synced copies
    from peers are not native.

    Plain data: publications, subscriptions, health and revision are changed only through
    :class:`shoal.model.clients.ClientManager`, which also publishes the model events.
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

    @property
    def replicated(self) -> bool:
        """Whether Distro replicates this client (persistent ones come from the CP store)."""
        return self.kind is not ClientKind.PERSISTENT

    def instance_count(self) -> int:
        return sum(len(p.instances) for p in self.publications.values())

