"""Typed in-loop events between the model, its indexes, push and (next) Distro.

The structure mirrors Nacos's NotifyCenter events: ClientEvent.ClientChangedEvent,
ClientDisconnectEvent (here ``ClientReleased``), ClientOperationEvent.ClientRegisterServiceEvent /
ClientDeregisterServiceEvent / ClientSubscribeServiceEvent / ClientUnsubscribeServiceEvent and
ServiceEvent.ServiceChangedEvent. Dispatch is synchronous on the one event loop: a publisher
returns only after every subscriber has run, so indexes are consistent before a request is
answered. Subscribers must be quick and must not await; slow work is queued by them.

Who publishes what: every client event (connected / released, register / deregister, health,
subscribe / unsubscribe, changed, ownership) comes from the one model writer,
:class:`shoal.model.clients.ClientManager`; ``ServiceChanged`` comes from the model's own
reactions (the service index), from service-record updates (``ServiceManager.update``), from
operators' edits of instances (``InstanceOverlays.set``) and from the service layer; ``DistroSyncApplied`` from the
Distro processor.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from shoal.model.client import Client, Subscriber
from shoal.model.instance import InstanceInfo
from shoal.model.keys import ServiceKey

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ClientChanged:
    """A client's publications changed (Distro syncs it if this node is responsible)."""

    client: Client


@dataclass(frozen=True, slots=True)
class ClientConnected:
    """A client was added to the client manager (a connection, an ip:port or a synced copy)."""

    client: Client


@dataclass(frozen=True, slots=True)
class ClientOwnershipChanged:
    """Who holds a client changed: ``native`` flipped (a handoff) or a copy's ``owner`` moved."""

    client: Client


#: Reasons of a ClientReleased that other parts act on (any other text is just logged).
REASON_REPLACED = "replaced"  # a client with the same id took its place
REASON_DELETED_BY_OWNER = "deleted by owner"  # Distro DELETE from the owning node
REASON_EXPIRED = "expired: not renewed by its owner"  # a synced copy nobody renews

#: Reasons carried by instance events (the history log shows them; nothing else acts on them).
REASON_BY_CLIENT = "deregistered by its client"
REASON_BEAT = "beat received"


def no_beat_for(idle_ms: int) -> str:
    """The reason of a beat-check expiry or health flip: ``no beat for N s``."""
    return f"no beat for {max(idle_ms, 0) // 1000} s"


@dataclass(frozen=True, slots=True)
class ClientReleased:
    """A client was released: its connection closed, it expired, or its owner deleted it."""

    client: Client
    reason: str

    @property
    def expired(self) -> bool:
        """True when a synced copy was released because its owner stopped renewing it."""
        return self.reason == REASON_EXPIRED


@dataclass(frozen=True, slots=True)
class ClientRegisteredService:
    """A client published (or re-published) its instances of a service."""

    service: ServiceKey
    client_id: str
    #: why, when the writer knows more than "registered" (a beat: :data:`REASON_BEAT`); an operator's
    #: edit is not a client write and comes as :class:`InstanceEdited`
    reason: str = ""


@dataclass(frozen=True, slots=True)
class ClientDeregisteredService:
    """A client's publication of a service was removed; ``instances`` are what it held."""

    service: ServiceKey
    client_id: str
    instances: tuple[InstanceInfo, ...]
    #: who decided it: the client, the beat check (``no beat for N s``), a moved client's return;
    #: empty when a whole-client write (a Distro apply, a persistent rebuild) removed it
    reason: str = ""


@dataclass(frozen=True, slots=True)
class ClientSubscribedService:
    """A client subscribed to a service; ``first`` when it had no subscription to it before."""

    service: ServiceKey
    client_id: str
    subscriber: Subscriber
    first: bool


@dataclass(frozen=True, slots=True)
class ClientUnsubscribedService:
    """A client dropped its subscription to a service."""

    service: ServiceKey
    client_id: str


@dataclass(frozen=True, slots=True)
class ServiceChanged:
    """The instances of a service changed: caches drop it and subscribers are pushed."""

    service: ServiceKey
    changed_at_ms: int


@dataclass(frozen=True, slots=True)
class InstanceEdited:
    """An operator's edit of one ephemeral instance was set or removed (shoal/model/overlays.py):
    ``edit`` says what it lays over the published instance now ("" when it was removed)."""

    service: ServiceKey
    ip: str
    port: int
    cluster: str
    edit: str
    changed_at_ms: int


@dataclass(frozen=True, slots=True)
class InstanceHealthChanged:
    """The health of a client's instances of a service flipped (beat check or a beat)."""

    service: ServiceKey
    client_id: str
    healthy: bool
    reason: str = ""


@dataclass(frozen=True, slots=True)
class DistroSyncApplied:
    """A peer's sync record changed this node's copy of one of its clients."""

    sender: str
    client_id: str
    op: str


E = TypeVar("E")


class EventBus:
    """Synchronous typed publish/subscribe. A failing subscriber is logged and skipped."""

    def __init__(self) -> None:
        self._subscribers: dict[type[Any], list[Callable[[Any], None]]] = defaultdict(list)

    def subscribe(self, event_type: type[E], handler: Callable[[E], None]) -> None:
        self._subscribers[event_type].append(handler)

    def publish(self, event: object) -> None:
        for handler in self._subscribers.get(type(event), ()):
            try:
                handler(event)
            except Exception:
                log.exception("event subscriber %r failed on %s", handler, type(event).__name__)
