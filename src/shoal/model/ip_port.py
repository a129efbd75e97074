"""Beat state of ip:port clients' instances (Nacos IpPortBasedClient + HealthCheckInstancePublishInfo).

An ip:port client (id ``ip:port#true``: HTTP Open API registrations, 1.x SDKs) publishes at most
one instance per service and lives by heartbeats. Each such publication owns a *slot* in four
parallel columns — last beat (int64 monotonic ms), unhealthy-after and remove-after (int64 ms,
from the preserved metadata keys; ``-1`` = never, for ``enableClientBeat=true``) and a uint8
healthy flag — so the heartbeat checker finds every instance past a deadline with **one** call
of the expiry kernel, like the connection keep-alive scan does for connections.

The table follows the model through events, whoever publishes them (the HTTP service layer,
or Distro applying a peer's sync): ClientRegisteredService (re)tracks the publication with a
fresh beat (a new Nacos publish info starts with ``lastHeartBeatTime = now``),
ClientDeregisteredService and ClientReleased release the slots, InstanceHealthChanged sets the
healthy flag. Health flips and beat expiry go through :meth:`BeatTable.set_health` /
:meth:`BeatTable.expire`, which change the model through the one writer
(:class:`~shoal.model.clients.ClientManager`), so indexes, push, Distro and the change log follow.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Mapping
from typing import Protocol

from shoal.kernels import expiry
from shoal.model.client import Client, ClientKind
from shoal.model.clients import ClientManager
from shoal.model.events import (
    ClientDeregisteredService,
    ClientRegisteredService,
    ClientReleased,
    EventBus,
    InstanceHealthChanged,
)
from shoal.model.instance import (
    DEFAULT_HEART_BEAT_TIMEOUT,
    DEFAULT_IP_DELETE_TIMEOUT,
    HEART_BEAT_TIMEOUT_KEY,
    IP_DELETE_TIMEOUT_KEY,
    InstanceInfo,
    metadata_millis,
)
from shoal.model.keys import ServiceKey

#: Instance or service metadata key that turns the server-side beat check off (Nacos
#: ``UtilsAndCommons.ENABLE_CLIENT_BEAT``; the check is skipped when its value is ``true``).
ENABLE_CLIENT_BEAT_KEY = "enableClientBeat"

BeatKey = tuple[str, ServiceKey]


class Responsibility(Protocol):
    """Which node handles an ``ip:port`` tag (Nacos DistroMapper.responsible / mapSrv):
    None when this node does, else the responsible node's HTTP address ``ip:port``."""

    def owner_of(self, tag: str) -> str | None: ...


class Standalone:
    """Standalone responsibility: this node handles every ip:port."""

    def owner_of(self, tag: str) -> str | None:
        return None


def ip_port_client_id(ip: str, port: int, ephemeral: bool = True) -> str:
    """Nacos ``IpPortBasedClient.getClientId``: ``ip:port#true`` (ephemeral) / ``#false``."""
    return f"{ip}:{port}#{'true' if ephemeral else 'false'}"


def responsible_tag(client_id: str) -> str:
    """The Distro responsibility tag of an ip:port client: ``ip:port`` (before ``#``)."""
    return client_id.partition("#")[0]


def client_beat_disabled(metadata: Mapping[str, str]) -> bool:
    """True when ``enableClientBeat=true`` (case-insensitive) switches the beat check off."""
    value = metadata.get(ENABLE_CLIENT_BEAT_KEY)
    return value is not None and value.strip().lower() == "true"


class BeatTable:
    """Per-instance beat state of every ip:port publication on this node, in slot columns."""

    def __init__(self, bus: EventBus, clients: ClientManager, monotonic_ms: Callable[[], int],
                 now_ms: Callable[[], int]) -> None:
        self._bus = bus
        self._clients = clients
        self._monotonic_ms = monotonic_ms
        self._now_ms = now_ms
        self.last_beat = array("q")
        self.unhealthy_after = array("q")
        self.remove_after = array("q")
        self.healthy = array("B")
        self._owner: list[BeatKey | None] = []
        self._slots: dict[BeatKey, int] = {}
        self._free: list[int] = []
        bus.subscribe(ClientRegisteredService, self._on_register)
        bus.subscribe(ClientDeregisteredService, self._on_deregister)
        bus.subscribe(InstanceHealthChanged, self._on_health)
        bus.subscribe(ClientReleased, self._on_release)

    def __len__(self) -> int:
        return len(self._slots)

    def __contains__(self, key: object) -> bool:
        return key in self._slots

    # --- tracking -----------------------------------------------------------------------
    def track(self, client_id: str, service: ServiceKey, inst: InstanceInfo, beat_ms: int) -> None:
        """(Re)start tracking one publication with its deadlines from the instance metadata."""
        key = (client_id, service)
        slot = self._slots.get(key)
        if slot is None:
            slot = self._take_slot()
            self._slots[key] = slot
            self._owner[slot] = key
        md = inst.metadata
        if client_beat_disabled(md):
            unhealthy, remove = -1, -1
        else:
            unhealthy = metadata_millis(md, HEART_BEAT_TIMEOUT_KEY, DEFAULT_HEART_BEAT_TIMEOUT)
            remove = metadata_millis(md, IP_DELETE_TIMEOUT_KEY, DEFAULT_IP_DELETE_TIMEOUT)
        self.last_beat[slot] = beat_ms
        self.unhealthy_after[slot] = unhealthy
        self.remove_after[slot] = remove
        self.healthy[slot] = 1 if inst.healthy else 0

    def untrack(self, client_id: str, service: ServiceKey) -> bool:
        slot = self._slots.pop((client_id, service), None)
        if slot is None:
            return False
        self.last_beat[slot] = -1
        self._owner[slot] = None
        self._free.append(slot)
        return True

    def renew(self, client_id: str, service: ServiceKey, beat_ms: int) -> bool:
        """A beat (or a repeated registration) for one publication; False if not tracked."""
        slot = self._slots.get((client_id, service))
        if slot is None:
            return False
        self.last_beat[slot] = beat_ms
        return True

    def renew_all(self, beat_ms: int) -> int:
        """Restart every tracked publication's beat window (after this node was not running)."""
        for slot in self._slots.values():
            self.last_beat[slot] = beat_ms
        return len(self._slots)

    def renew_client(self, client_id: str, beat_ms: int) -> int:
        """Renew every publication of a client (Distro verify of an ip:port client, docs/protocol.md §6.5)."""
        client = self._clients.get(client_id)
        if client is None:
            return 0
        return sum(self.renew(client_id, service, beat_ms) for service in client.publications)

    def last_beat_ms(self, client_id: str, service: ServiceKey) -> int | None:
        slot = self._slots.get((client_id, service))
        return None if slot is None else self.last_beat[slot]

    # --- the scan -------------------------------------------------------------------------
    def due(self, now_ms: int) -> tuple[list[BeatKey], list[BeatKey]]:
        """``(to_unhealthy, to_remove)`` publications past their deadlines: one kernel call."""
        to_unhealthy, to_remove = expiry.beat_deadlines(
            self.last_beat, self.unhealthy_after, self.remove_after, self.healthy, now_ms)
        owner = self._owner
        return ([k for k in (owner[s] for s in to_unhealthy) if k is not None],
                [k for k in (owner[s] for s in to_remove) if k is not None])

    # --- changes (through the model writer, which publishes the events) ----------------
    def set_health(self, client: Client, service: ServiceKey, healthy: bool, reason: str = "") -> bool:
        """Flip the health of the client's instance for the service (beat checker / beat).

        :meth:`ClientManager.set_health` publishes InstanceHealthChanged (this table's healthy
        flag follows it), ServiceChanged and ClientChanged. False if unchanged.
        """
        return self._clients.set_health(client, service, healthy, self._now_ms(), reason)

    def expire(self, client: Client, service: ServiceKey, reason: str = "") -> bool:
        """Remove the client's instance for the service (ExpiredInstanceChecker → deleteIp).

        :meth:`ClientManager.unpublish` publishes ClientDeregisteredService with the removed
        instance (so the change log records its address) and ClientChanged.
        """
        if self._clients.unpublish(client, service, self._monotonic_ms(), reason) is None:
            self.untrack(client.client_id, service)
            return False
        return True

    # --- event handlers ---------------------------------------------------------------------
    def _on_register(self, event: ClientRegisteredService) -> None:
        client = self._clients.get(event.client_id)
        if client is None or client.kind is not ClientKind.IP_PORT:
            return
        publication = client.publications.get(event.service)
        if publication is None or not publication.instances:
            self.untrack(event.client_id, event.service)
            return
        self.track(event.client_id, event.service, publication.instances[0], self._monotonic_ms())

    def _on_deregister(self, event: ClientDeregisteredService) -> None:
        self.untrack(event.client_id, event.service)

    def _on_health(self, event: InstanceHealthChanged) -> None:
        slot = self._slots.get((event.client_id, event.service))
        if slot is not None:
            self.healthy[slot] = 1 if event.healthy else 0

    def _on_release(self, event: ClientReleased) -> None:
        client = event.client
        if client.kind is ClientKind.IP_PORT:
            for service in client.publications:
                self.untrack(client.client_id, service)

    def _take_slot(self) -> int:
        if self._free:
            return self._free.pop()
        self.last_beat.append(-1)
        self.unhealthy_after.append(-1)
        self.remove_after.append(-1)
        self.healthy.append(0)
        self._owner.append(None)
        return len(self._owner) - 1
