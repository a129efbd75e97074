"""The node's bounded change-event log (the ``events`` table of a snapshot).

It listens to the model's events — register, deregister (with the removed instances, expiry
included), health flip, Distro sync applied, client connected / released / expired — and keeps
the newest ``capacity`` rows in memory, in the EVENTS column order (without ``node``).
Instance-level rows are written for this node's own clients only (a peer's copy is logged by
its owner; here it shows as ``sync_applied``), which also keeps a million-instance snapshot
load from flooding the log. Appending is one deque append per instance, so it can stay on in
production; the churn job reads it from exports.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any

from shoal.clock import Clock
from shoal.model.client import Client, ClientKind
from shoal.model.clients import ClientManager
from shoal.model.events import (
    ClientConnected,
    ClientDeregisteredService,
    ClientRegisteredService,
    ClientReleased,
    DistroSyncApplied,
    EventBus,
    InstanceHealthChanged,
)
from shoal.model.instance import InstanceInfo
from shoal.model.keys import ServiceKey

#: (ts_ms, kind, namespace, group, service, client_id, ip, port, healthy, detail)
EventRow = tuple[int, str, str | None, str | None, str | None, str | None, str | None, int | None, bool | None,
                 str | None]


class ChangeLog:
    """The newest ``capacity`` change rows of this node, fed by the model's events."""

    def __init__(self, bus: EventBus, clock: Clock, clients: ClientManager, capacity: int) -> None:
        self.clock = clock
        self.clients = clients
        self.rows: deque[EventRow] = deque(maxlen=capacity)
        self.dropped = 0
        bus.subscribe(ClientRegisteredService, self._on_register)
        bus.subscribe(ClientDeregisteredService, self._on_deregister)
        bus.subscribe(InstanceHealthChanged, self._on_health)
        bus.subscribe(DistroSyncApplied, self._on_sync)
        bus.subscribe(ClientConnected, self._on_connected)
        bus.subscribe(ClientReleased, self._on_released)

    def snapshot(self) -> list[EventRow]:
        return list(self.rows)

    def _add(self, row: EventRow) -> None:
        if len(self.rows) == self.rows.maxlen:
            self.dropped += 1
        self.rows.append(row)

    def _instances(self, kind: str, service: ServiceKey, client_id: str, instances: Iterable[InstanceInfo],
                   detail: str | None = None) -> None:
        now = self.clock.now_ms()
        added = False
        for inst in instances:
            self._add((now, kind, service.namespace, service.group, service.name, client_id, inst.ip, inst.port,
                       inst.healthy, detail))
            added = True
        if not added:
            self._add((now, kind, service.namespace, service.group, service.name, client_id, None, None, None,
                       detail))

    def _on_register(self, event: ClientRegisteredService) -> None:
        client = self.clients.get(event.client_id)
        if client is None or not client.native:
            return  # a peer's copy: its owner logs the instances, this node logs sync_applied
        publication = client.publications.get(event.service)
        self._instances("register", event.service, event.client_id,
                        publication.instances if publication is not None else ())

    def _on_deregister(self, event: ClientDeregisteredService) -> None:
        client = self.clients.get(event.client_id)
        if client is not None and not client.native:
            return
        self._instances("deregister", event.service, event.client_id, event.instances)

    def _on_health(self, event: InstanceHealthChanged) -> None:
        ip, port = _address_of(event.client_id)
        s = event.service
        self._add((self.clock.now_ms(), "health_flip", s.namespace, s.group, s.name, event.client_id, ip, port,
                   event.healthy, None))

    def _on_sync(self, event: DistroSyncApplied) -> None:
        self._add((self.clock.now_ms(), "sync_applied", None, None, None, event.client_id, None, None, None,
                   f"{event.op} from {event.sender}"))

    def _on_connected(self, event: ClientConnected) -> None:
        self._client_row("client_connected", event.client, None)

    def _on_released(self, event: ClientReleased) -> None:
        kind = "client_expired" if event.expired else "client_disconnected"
        self._client_row(kind, event.client, event.reason)
        if not event.client.native:
            return
        for service, publication in event.client.publications.items():
            self._instances("deregister", service, event.client.client_id, publication.instances, event.reason)

    def _client_row(self, kind: str, client: Client, detail: str | None) -> None:
        ip, port = _address_of(client.client_id) if client.kind is ClientKind.IP_PORT else (client.client_ip or None,
                                                                                              None)
        self._add((self.clock.now_ms(), kind, None, None, None, client.client_id, ip, port, None, detail))


def _address_of(client_id: str) -> tuple[str | None, int | None]:
    """``ip:port#true`` → (ip, port); connection ids → (None, None)."""
    head = client_id.partition("#")[0]
    ip, sep, port = head.rpartition(":")
    if "#" in client_id and sep and port.isdigit():
        return ip, int(port)
    return None, None


def as_dicts(rows: Iterable[EventRow]) -> list[dict[str, Any]]:
    keys = ("ts_ms", "kind", "namespace", "group", "service", "client_id", "ip", "port", "healthy", "detail")
    return [dict(zip(keys, row, strict=True)) for row in rows]
